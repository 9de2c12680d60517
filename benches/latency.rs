//! End-to-end latency at a steady rate: each message enqueued in its own transaction at
//! RATE msg/s for SECS seconds while the relay runs (woken by NOTIFY). Reports
//! commit→broker-ack (the topic uses LogAppendTime, so the record timestamp is the broker's
//! append time, ms resolution) and commit→consumer-receive, p50 / p99 / max in ms.
//!
//! Then the same at EO_RATE msg/s (500) twice, in one run: the idempotent relay and the
//! exactly-once relay (`--exactly-once`), read by a `read_committed` consumer — a batch becomes
//! visible to it only when its transaction commits.
//!
//! `cargo bench --bench latency` (env: RATE=1000, SECS=30, EO_RATE=500).

#[path = "support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::time::Duration;

use support::*;

#[tokio::main]
async fn main() {
    let rate = param("RATE", if full() { 1000 } else { 200 });
    let secs = param("SECS", if full() { 30 } else { 1 });
    if std::env::var("ONLY_EXACTLY_ONCE").is_err() {
        let (ack, recv) = measure(rate, secs, false).await;
        emit(
            "latency",
            serde_json::json!({"rate_per_sec": rate, "seconds": secs, "tx_per_message": 1, "wake": "notify"}),
            serde_json::json!({"messages": rate * secs, "commit_to_ack": ack, "commit_to_receive": recv}),
        );
    }
    let eo_rate = param("EO_RATE", if full() { 500 } else { 100 });
    let (_, idempotent) = measure(eo_rate, secs, false).await;
    let (_, exactly) = measure(eo_rate, secs, true).await;
    emit(
        "latency_exactly_once",
        serde_json::json!({"rate_per_sec": eo_rate, "seconds": secs, "reader": "read_committed"}),
        serde_json::json!({
            "idempotent_commit_to_receive": idempotent,
            "exactly_once_commit_to_receive": exactly,
            "p99_exactly_once_to_idempotent": round2(
                exactly["p99_ms"].as_f64().unwrap() / idempotent["p99_ms"].as_f64().unwrap().max(0.01)
            ),
        }),
    );
}

/// Enqueues `rate` msg/s for `secs` s while a relay runs; (commit→ack, commit→receive)
/// percentiles in ms.
async fn measure(
    rate: usize,
    secs: usize,
    exactly_once: bool,
) -> (serde_json::Value, serde_json::Value) {
    let db = fresh_db().await;
    let topic = format!("bench.{}.created", rand_name(8));
    create_append_time_topic(&topic, &[]).await;
    let receiver = Receiver::start(&topic);

    let cfg = {
        let mut c = outbox::RelayConfig::default();
        c.cleanup = {
            let mut cc = outbox::CleanupConfig::default();
            cc.interval = None;
            cc
        };
        if exactly_once {
            let mut eo = outbox::ExactlyOnce::default();
            eo.progress_topic = format!("{topic}.progress");
            c.exactly_once = Some(eo);
        }
        c
    };
    let relay = outbox::Relay::new(&db, &kafka(), cfg).unwrap();
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    let relay_task = tokio::spawn(relay.run(async move {
        let _ = relay_stopped.await;
    }));
    // The relay LISTENing (and, exactly-once, its slots fenced in), the consumer assigned.
    tokio::time::sleep(Duration::from_millis(if exactly_once { 3000 } else { 500 })).await;
    let mut c = outbox::connect(&db).await.unwrap();
    let enq = outbox::Enqueuer::new(&db.schema);
    let mut committed: HashMap<String, i64> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate as u64));
    let total = rate * secs;
    for i in 0..total {
        tick.tick().await;
        let m = outbox::Message::new(
            &topic,
            "order_created",
            format!("key-{}", i % 1000),
            serde_json::json!({"n": i, "pad": "x".repeat(150)}),
        );
        let tx = c.transaction().await.unwrap();
        enq.enqueue(&tx, &m).await.unwrap();
        tx.commit().await.unwrap();
        committed.insert(m.message_id().to_string(), now_us());
    }
    receiver.wait_for(total, Duration::from_secs(60)).await;
    let got = receiver.stop();
    stop_relay.send(()).unwrap();
    relay_task.await.unwrap().unwrap();

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
    let stats = |v: &[f64]| serde_json::json!({"p50_ms": round2(percentile(v, 50.0)), "p99_ms": round2(percentile(v, 99.0)), "max_ms": round2(*v.last().unwrap())});
    drop_schema(&db).await;
    delete_topic(&topic).await;
    if exactly_once {
        delete_topic(&format!("{topic}.progress")).await;
    }
    (stats(&ack), stats(&recv))
}
