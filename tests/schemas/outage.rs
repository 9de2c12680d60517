//! The registry down and back (a private instance on its own ports, started and killed by
//! `dev/registry.sh`): the relay leaves rows pending with no attempt spent, the consumer
//! holds framed records (never a dead letter), and both go on when it is back.

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use outbox::schemas::{Format, RegistryClient};
use outbox::Message;
use serde_json::json;

use super::*;

const SCHEMA: &str = r#"{"type": "record", "name": "Paid", "namespace": "com.acme",
  "fields": [{"name": "order_id", "type": "string"}]}"#;

/// A registry of this test's own (schemas in memory: a restart forgets them).
struct Private {
    port: u16,
    mgmt: u16,
}

impl Private {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/apis/ccompat/v7", self.port)
    }
    fn run(&self, verb: &str) {
        let dev = concat!(env!("CARGO_MANIFEST_DIR"), "/dev/registry.sh");
        let ok = Command::new("bash")
            .arg(dev)
            .arg(verb)
            .env("REGISTRY_PORT", self.port.to_string())
            .env("REGISTRY_MGMT_PORT", self.mgmt.to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "dev/registry.sh {verb}");
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        self.run("kill");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_outage_loses_nothing_and_spends_nothing() {
    let private = Private {
        port: free_port(),
        mgmt: free_port(),
    };
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    create_topic(&format!("{topic}.dlq"), 1).await;
    let schemas = schemas_for(&private.url(), &[(topic.as_str(), Format::Avro)]);
    let c = client(&db).await;
    for i in 0..3 {
        outbox::Enqueuer::new(&db.schema)
            .enqueue(
                &c,
                &Message::new(
                    &topic,
                    "paid",
                    format!("P-{i}"),
                    json!({"order_id": format!("P-{i}")}),
                ),
            )
            .await
            .unwrap();
    }

    // Relay time, registry down (nothing listens): rows stay pending, attempts untouched.
    let mut cfg = relay_config();
    cfg.schemas = Some(schemas.clone());
    let relay = outbox::Relay::new(&db, &kafka(), cfg).unwrap();
    for _ in 0..3 {
        let _ = relay.run_once().await.unwrap();
    }
    let row = c
        .query_one(
            &format!(
                "SELECT count(*) FILTER (WHERE status = 'pending'), max(attempts) FROM {}.outbox",
                db.schema.quoted()
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 3, "every row still pending");
    assert_eq!(row.get::<_, Option<i32>>(1), Some(0), "no attempt spent");
    assert_eq!(topic_len(&topic).await, 0, "nothing sent as plain JSON");

    // Back (started by the dev script), the schema registered: the rows go, framed.
    private.run("start");
    let id = RegistryClient::new(&private.url())
        .unwrap()
        .register(&format!("{topic}-value"), Format::Avro, SCHEMA)
        .await
        .unwrap();
    assert_eq!(drain(&relay).await, 3);
    let records = read_all(&topic).await;
    assert_eq!(records.len(), 3);
    assert!(records.iter().all(|r| r.payload[..5]
        == [
            0,
            (id >> 24) as u8,
            (id >> 16) as u8,
            (id >> 8) as u8,
            id as u8
        ]));

    // Consume time, the registry cut off (a proxy between the consumer and the registry that
    // refuses and drops connections: the registry keeps its schemas, as a real one's storage
    // would): a consumer that never saw the id holds the records, spending nothing.
    let proxy = Proxy::start(private.port).await;
    proxy.cut.store(true, Ordering::SeqCst);
    let url = format!("http://127.0.0.1:{}/apis/ccompat/v7", proxy.port);
    let (seen, stats, stop, h) = run_consumer(&db, &topic, "paid", Some(schemas_for(&url, &[])));
    wait_until(
        Duration::from_secs(60),
        "framed records held for the registry",
        || async { stats.registry_waits.load(Ordering::Relaxed) >= 2 },
    )
    .await;
    assert_eq!(stats.handled.load(Ordering::Relaxed), 0);
    assert_eq!(stats.dead_lettered.load(Ordering::Relaxed), 0);
    assert_eq!(stats.decode_errors.load(Ordering::Relaxed), 0);

    // Reachable again: handled, none dead-lettered.
    proxy.cut.store(false, Ordering::SeqCst);
    handled(&stats, 3).await;
    stop.send(()).unwrap();
    h.await.unwrap().unwrap();
    assert_eq!(
        stats.dead_lettered.load(Ordering::Relaxed),
        0,
        "never a dead letter"
    );
    assert_eq!(topic_len(&format!("{topic}.dlq")).await, 0);
    let mut ids: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.1["order_id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    assert_eq!(ids, ["P-0", "P-1", "P-2"]);
}

/// A TCP proxy to the registry that can be cut: while cut it refuses new connections and
/// drops open ones.
struct Proxy {
    port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    async fn start(upstream: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = cut.clone();
        tokio::spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                if flag.load(Ordering::SeqCst) {
                    continue;
                }
                let flag = flag.clone();
                tokio::spawn(async move {
                    let Ok(mut up) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    let copy = tokio::io::copy_bidirectional(&mut down, &mut up);
                    let watch = async {
                        while !flag.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    };
                    tokio::select! {
                        _ = copy => {}
                        () = watch => {}
                    }
                });
            }
        });
        Self { port, cut }
    }
}

/// With the shared breaker configured, a registry outage opens it for every replica (under
/// `schema-registry`) instead of each message waiting on its own; the held records are not
/// parked (no dead letter), and once the registry answers they are handled and the breaker's
/// probe closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_outage_opens_the_shared_breaker_and_parks_nothing() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    create_topic(&format!("{topic}.dlq"), 1).await;
    let schemas = schemas_for(&registry_url(), &[(topic.as_str(), Format::Avro)]);
    RegistryClient::new(&registry_url())
        .unwrap()
        .register(&format!("{topic}-value"), Format::Avro, SCHEMA)
        .await
        .unwrap();
    let c = client(&db).await;
    for i in 0..3 {
        outbox::Enqueuer::new(&db.schema)
            .enqueue(
                &c,
                &Message::new(
                    &topic,
                    "paid",
                    format!("B-{i}"),
                    json!({"order_id": format!("B-{i}")}),
                ),
            )
            .await
            .unwrap();
    }
    let mut cfg = relay_config();
    cfg.schemas = Some(schemas);
    assert_eq!(
        drain(&outbox::Relay::new(&db, &kafka(), cfg).unwrap()).await,
        3
    );

    let proxy = Proxy::start(
        registry_url()
            .rsplit_once(':')
            .and_then(|(_, p)| p.split('/').next())
            .and_then(|p| p.parse().ok())
            .expect("the registry URL has a port"),
    )
    .await;
    proxy.cut.store(true, Ordering::SeqCst);
    let url = format!("http://127.0.0.1:{}/apis/ccompat/v7", proxy.port);
    let seen: Seen = Default::default();
    let mut cc = outbox::consumer::ConsumerConfig::new(format!("it-schemas-{}", hex(6)), [&topic]);
    cc.schemas = Some(schemas_for(&url, &[]));
    let mut breaker = outbox::consumer::BreakerConfig::default();
    breaker.open_for = Duration::from_secs(1);
    breaker.retry_delay = Duration::from_millis(50);
    cc.breaker = Some(breaker);
    let group = cc.group.clone();
    let consumer = outbox::consumer::Consumer::new(&db, &kafka(), cc)
        .unwrap()
        .handler("paid", Recorder(seen.clone()));
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let h = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    let opened = format!(
        "SELECT count(*) FROM {}.circuit_breakers WHERE consumer_group = '{group}' AND name = '{}'",
        db.schema.quoted(),
        outbox::consumer::REGISTRY_DEPENDENCY
    );
    wait_until(
        Duration::from_secs(60),
        "the breaker opened for the registry",
        || async { count(&c, &opened).await == 1 },
    )
    .await;
    assert_eq!(stats.handled.load(Ordering::Relaxed), 0);
    assert_eq!(stats.dead_lettered.load(Ordering::Relaxed), 0);

    proxy.cut.store(false, Ordering::SeqCst);
    handled(&stats, 3).await;
    stop.send(()).unwrap();
    h.await.unwrap().unwrap();
    assert_eq!(
        stats.dead_lettered.load(Ordering::Relaxed),
        0,
        "nothing parked or dead-lettered"
    );
    assert_eq!(topic_len(&format!("{topic}.dlq")).await, 0);
    assert_eq!(seen.lock().unwrap().len(), 3);
}
