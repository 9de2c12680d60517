//! End-to-end latency at a steady rate: each message enqueued in its own transaction at
//! RATE msg/s for SECS seconds while the relay runs (woken by NOTIFY). Reports
//! commit→broker-ack (the topic uses LogAppendTime, so the record timestamp is the broker's
//! append time, ms resolution) and commit→consumer-receive, p50 / p99 / max in ms.
//!
//! `cargo bench --bench latency` (env: RATE=1000, SECS=30).

#[path = "support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use support::*;

fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as i64
}

#[tokio::main]
async fn main() {
    let rate = param("RATE", if full() { 1000 } else { 200 });
    let secs = param("SECS", if full() { 30 } else { 1 });
    let db = fresh_db().await;
    let topic = format!("bench.{}.created", rand_name(8));
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        rdkafka::ClientConfig::new().set("bootstrap.servers", bootstrap()).create().unwrap();
    admin
        .create_topics(
            &[NewTopic::new(&topic, 6, TopicReplication::Fixed(1)).set("message.timestamp.type", "LogAppendTime")],
            &AdminOptions::new(),
        )
        .await
        .unwrap()[0]
        .as_ref()
        .unwrap();

    // Receiver: assigned to every partition from the start, records (receive time, append time).
    let received: Arc<Mutex<HashMap<String, (i64, i64)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rx_thread = {
        let (received, stop, topic) = (received.clone(), stop.clone(), topic.clone());
        std::thread::spawn(move || {
            let c: BaseConsumer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", bootstrap())
                .set("group.id", format!("bench-{}", rand_name(6)))
                .set("enable.auto.commit", "false")
                .set("fetch.wait.max.ms", "5")
                .create()
                .unwrap();
            let mut tpl = TopicPartitionList::new();
            for p in 0..6 {
                tpl.add_partition_offset(&topic, p, Offset::Beginning).unwrap();
            }
            c.assign(&tpl).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(Ok(m)) = c.poll(Duration::from_millis(50)) {
                    let at = now_us();
                    let id = m
                        .headers()
                        .and_then(|h| h.iter().find(|h| h.key == "message_id").and_then(|h| h.value.map(|v| String::from_utf8_lossy(v).into_owned())))
                        .unwrap_or_default();
                    let append_ms = m.timestamp().to_millis().unwrap_or(0);
                    received.lock().unwrap().insert(id, (at, append_ms));
                }
            }
        })
    };

    let cfg = outbox::RelayConfig { cleanup: outbox::CleanupConfig { interval: None, ..Default::default() }, ..Default::default() };
    let relay = outbox::Relay::new(&db, &kafka(), cfg).unwrap();
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    let relay_task = tokio::spawn(relay.run(async move {
        let _ = relay_stopped.await;
    }));
    tokio::time::sleep(Duration::from_millis(500)).await; // relay LISTENing, consumer assigned

    let mut c = outbox::connect(&db).await.unwrap();
    let enq = outbox::Enqueuer::new(&db.schema);
    let mut committed: HashMap<String, i64> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate as u64));
    let total = rate * secs;
    for i in 0..total {
        tick.tick().await;
        let m = outbox::Message::new(&topic, "order_created", format!("key-{}", i % 1000), serde_json::json!({"n": i, "pad": "x".repeat(150)}));
        let tx = c.transaction().await.unwrap();
        enq.enqueue(&tx, &m).await.unwrap();
        tx.commit().await.unwrap();
        committed.insert(m.message_id().to_string(), now_us());
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while received.lock().unwrap().len() < total && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    rx_thread.join().unwrap();
    stop_relay.send(()).unwrap();
    relay_task.await.unwrap().unwrap();

    let got = received.lock().unwrap();
    assert_eq!(got.len(), total, "every message received");
    let mut ack: Vec<f64> = Vec::with_capacity(total);
    let mut recv: Vec<f64> = Vec::with_capacity(total);
    for (id, commit_us) in &committed {
        let (at_us, append_ms) = got[id];
        // Append time has ms resolution; clamp the sub-ms negative artefacts at 0.
        ack.push(((append_ms * 1000 - commit_us) as f64 / 1000.0).max(0.0));
        recv.push((at_us - commit_us) as f64 / 1000.0);
    }
    ack.sort_by(f64::total_cmp);
    recv.sort_by(f64::total_cmp);
    let stats = |v: &[f64]| {
        serde_json::json!({"p50_ms": round2(percentile(v, 50.0)), "p99_ms": round2(percentile(v, 99.0)), "max_ms": round2(*v.last().unwrap())})
    };
    emit(
        "latency",
        serde_json::json!({"rate_per_sec": rate, "seconds": secs, "tx_per_message": 1, "wake": "notify"}),
        serde_json::json!({"messages": total, "commit_to_ack": stats(&ack), "commit_to_receive": stats(&recv)}),
    );
    drop(got);
    drop_schema(&db).await;
    delete_topic(&topic).await;
}
