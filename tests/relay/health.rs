//! The relay's probes: `/healthz` (its loop turns) and `/readyz` (Postgres and Kafka answer,
//! not shutting down), as a probe sees them over HTTP and as a service that embeds the relay
//! reads them (`Relay::health`). Outages of the shared services are in `tests/faults.rs`; here
//! a dependency that is not there is a closed loopback port.

use std::process::{Command, Stdio};
use std::time::Duration;

use outbox::Relay;
use outbox_testkit::*;

async fn get(port: u16, path: &str) -> Option<(u16, serde_json::Value)> {
    let r = reqwest::get(format!("http://127.0.0.1:{port}{path}"))
        .await
        .ok()?;
    let code = r.status().as_u16();
    Some((code, r.json().await.ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_healthz_and_readyz_beside_metrics_and_is_unready_while_stopping() {
    let db = fresh_db().await;
    let port = free_port();
    let mut c = outbox_command(&db);
    c.args(["relay", "--metrics-addr", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let relay = Kill(c.spawn().unwrap());
    wait_until(Duration::from_secs(30), "/readyz answers 200", || async {
        matches!(get(port, "/readyz").await, Some((200, _)))
    })
    .await;
    let (code, ready) = get(port, "/readyz").await.unwrap();
    assert_eq!(code, 200);
    assert_eq!(ready["ready"], true);
    assert_eq!(ready["dependencies"]["postgres"], "ok", "{ready}");
    assert_eq!(ready["dependencies"]["kafka"], "ok", "{ready}");
    let (code, live) = get(port, "/healthz").await.unwrap();
    assert_eq!(code, 200, "{live}");
    assert!(
        live["loops"]["relay"]["silent_secs"].as_f64().unwrap() < 5.0,
        "{live}"
    );
    // A stranger: a name this listener does not answer to (DNS rebinding), another method,
    // an absurd path. Each answer costs no look at Postgres or Kafka (the prober's state).
    let http = reqwest::Client::new();
    let url = |p: &str| format!("http://127.0.0.1:{port}{p}");
    let rebound = http
        .get(url("/readyz"))
        .header("Host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status().as_u16(), 403);
    let posted = http.post(url("/healthz")).body("x").send().await.unwrap();
    assert_eq!(posted.status().as_u16(), 405);
    let odd = http
        .get(url(&format!("/readyz/{}", "%00".repeat(2000))))
        .send()
        .await
        .unwrap();
    assert_eq!(odd.status().as_u16(), 404);
    // /metrics is still there.
    let metrics = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap();
    assert_eq!(metrics.status().as_u16(), 200);
    // SIGTERM: it exits 0.
    let ok = Command::new("kill")
        .args(["-TERM", &relay.0.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let mut relay = relay;
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    loop {
        if let Some(s) = relay.0.try_wait().unwrap() {
            assert!(s.success(), "{s}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_kafka_unreachable_the_relay_is_live_but_not_ready_and_says_why() {
    let db = fresh_db().await;
    let dead = outbox::KafkaConfig::new(&format!("127.0.0.1:{}", free_port())).unwrap();
    let relay = Relay::new(&db, &dead, relay_config()).unwrap();
    let health = relay.health();
    assert!(!health.ready().ok, "not ready before it runs");
    let running = spawn_relay(relay);
    wait_until(Duration::from_secs(30), "Kafka looked at", || async {
        health.ready().detail["dependencies"]["kafka"].is_string()
            && health.ready().detail["dependencies"]["kafka"] != "ok"
    })
    .await;
    let r = health.ready();
    assert!(!r.ok, "{}", r.detail);
    assert_eq!(r.detail["dependencies"]["postgres"], "ok", "{}", r.detail);
    assert!(health.live().ok, "an outage is not a liveness failure");
    running.stop().await;
    let r = health.ready();
    assert!(!r.ok && r.detail["stopping"] == true, "{}", r.detail);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_postgres_unreachable_the_relay_is_live_but_not_ready_and_keeps_the_password() {
    let url = format!(
        "postgres://outbox:s3cret-pw@127.0.0.1:{}/outbox",
        free_port()
    );
    let db = outbox::DbConfig::new(&url, "public").unwrap();
    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    let health = relay.health();
    let running = spawn_relay(relay);
    wait_until(Duration::from_secs(30), "Postgres looked at", || async {
        let d = health.ready().detail;
        d["dependencies"]["postgres"].is_string() && d["dependencies"]["postgres"] != "ok"
    })
    .await;
    let r = health.ready();
    assert!(!r.ok, "{}", r.detail);
    assert!(!r.detail.to_string().contains("s3cret-pw"), "{}", r.detail);
    assert!(health.live().ok, "{}", health.live().detail);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_relay_fenced_by_another_producer_is_not_ready_until_it_recovers() {
    use rdkafka::producer::{BaseProducer, Producer as _};
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 2).await;
    let prefix = format!("it-{}", hex(6));
    let mut config = relay_config();
    let mut eo = outbox::ExactlyOnce::default();
    eo.progress_topic = format!("{topic}.progress");
    eo.transactional_id_prefix = prefix.clone();
    config.exactly_once = Some(eo);
    let relay = Relay::new(&db, &kafka(), config).unwrap();
    let health = relay.health();
    let c = client(&db).await;
    let outbox = outbox::Enqueuer::new(&db.schema);
    let enqueue = |from: usize| {
        let (c, outbox, topic) = (&c, &outbox, &topic);
        async move {
            for i in from..from + 40 {
                let m = outbox::Message::new(topic, "t", format!("k{i}"), serde_json::json!({}));
                outbox.enqueue(c, &m).await.unwrap();
            }
        }
    };
    enqueue(0).await;
    assert_eq!(drain(&relay).await, 40);
    assert_eq!(health.ready().detail["conditions"]["exactly_once"], "ok");

    // Another producer takes every slot's transactional id (a zombie's twin, or a second
    // deployment misconfigured with the same prefix): this relay is fenced.
    let zombies: Vec<BaseProducer> = (0..outbox::ExactlyOnce::SLOTS)
        .map(|slot| {
            let p: BaseProducer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", bootstrap())
                .set(
                    "transactional.id",
                    format!("{prefix}-{}-{slot}", db.schema.name()),
                )
                .create()
                .unwrap();
            p.init_transactions(Duration::from_secs(30)).unwrap();
            p
        })
        .collect();
    enqueue(40).await;
    let _ = relay.run_once().await;
    let r = health.ready();
    assert!(!r.ok, "{}", r.detail);
    let why = r.detail["conditions"]["exactly_once"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(why.contains("unknown"), "{}", r.detail);
    // The next passes fence the zombies out, recover the slots and publish the rest.
    drop(zombies);
    assert!(drain(&relay).await <= 40);
    assert_eq!(
        health.ready().detail["conditions"]["exactly_once"],
        "ok",
        "{}",
        health.ready().detail
    );
    let pending: i64 = c
        .query_one("SELECT count(*) FROM outbox WHERE status = 'pending'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(pending, 0);
}
