//! The consumer's probes: `/healthz` and `/readyz` beside `/metrics` on
//! `ConsumerConfig::metrics_addr`, and `Consumer::health` for a service that mounts them on its
//! own server. Outages of the shared services are in `tests/faults.rs`.

use std::time::Duration;

use outbox::consumer::{BoxFuture, Consumer, ConsumerConfig, Delivered, Handler, HandlerError};
use outbox_testkit::*;

struct Nothing;
impl Handler for Nothing {
    fn handle<'a>(
        &'a self,
        _m: &'a Delivered,
        _tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async { Ok(()) })
    }
}

async fn get(port: u16, path: &str) -> Option<(u16, serde_json::Value)> {
    let r = reqwest::get(format!("http://127.0.0.1:{port}{path}"))
        .await
        .ok()?;
    let code = r.status().as_u16();
    Some((code, r.json().await.ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_consumer_stays_live_and_ready_and_is_unready_once_it_stops() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let port = free_port();
    let mut config = ConsumerConfig::new(format!("it-{}", hex(6)), [topic.clone()]);
    config.metrics_addr = Some(format!("127.0.0.1:{port}").parse().unwrap());
    let consumer = Consumer::new(&db, &kafka(), config)
        .unwrap()
        .handler("t", Nothing);
    let health = consumer.health();
    assert!(!health.ready().ok, "not ready before it runs");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    wait_until(Duration::from_secs(30), "/readyz answers 200", || async {
        matches!(get(port, "/readyz").await, Some((200, _)))
    })
    .await;
    let (_, ready) = get(port, "/readyz").await.unwrap();
    assert_eq!(ready["dependencies"]["postgres"], "ok", "{ready}");
    assert_eq!(ready["dependencies"]["kafka"], "ok", "{ready}");
    // Idle (no message at all) for longer than the loop's tick: still live.
    tokio::time::sleep(Duration::from_secs(7)).await; // idleness itself is what is tested
    let (code, live) = get(port, "/healthz").await.unwrap();
    assert_eq!(code, 200, "{live}");
    assert!(
        live["loops"]["consumer"]["silent_secs"].as_f64().unwrap() < 6.0,
        "the idle loop still beats: {live}"
    );
    let _ = stop.send(());
    task.await.unwrap().unwrap();
    let r = health.ready();
    assert!(!r.ok && r.detail["stopping"] == true, "{}", r.detail);
}
