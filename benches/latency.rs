//! End-to-end latency at a steady rate: each message enqueued in its own transaction at
//! RATE msg/s for SECS seconds while the relay runs (woken by NOTIFY). Reports
//! commit→broker-ack (the topic uses LogAppendTime, so the record timestamp is the broker's
//! append time, ms resolution) and commit→consumer-receive, p50 / p99 / max in ms.
//!
//! Then the same at EO_RATE msg/s (500) twice, in one run: the idempotent relay and the
//! exactly-once relay (`--exactly-once`), read by a `read_committed` consumer — a batch becomes
//! visible to it only when its transaction commits.
//!
//! First, what an enqueue costs the service's transaction (`latency_enqueue`): TXS
//! transactions of one message each (`BEGIN`, the INSERT, `COMMIT`), one after another on one
//! connection, in blocks alternating three ways of writing it: `Enqueuer::enqueue` (its INSERT
//! with typed parameters: one round trip), the same INSERT through `execute` (untyped: the
//! statement is described first, a second round trip, as before round 22), and a plain table
//! with the same columns and only a primary key, written by `execute` as a service without an
//! outbox would. Median µs per transaction of each, and ours as a ratio to the other two.
//!
//! `cargo bench --bench latency` (env: RATE=1000, SECS=30, EO_RATE=500, TXS=20000).

#[path = "support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::time::Duration;

use support::*;

#[tokio::main]
async fn main() {
    let rate = param("RATE", if full() { 1000 } else { 200 });
    let secs = param("SECS", if full() { 30 } else { 1 });
    enqueue_cost(param("TXS", if full() { 20_000 } else { 60 })).await;
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

/// `latency_enqueue` (see the module documentation).
async fn enqueue_cost(txs: usize) {
    let db = fresh_db().await;
    let mut c = outbox::connect(&db).await.unwrap();
    let s = &db.schema;
    c.batch_execute(&format!(
        "CREATE TABLE {s}.plain (id bigserial PRIMARY KEY, topic text NOT NULL, message_key text,
                                 headers jsonb NOT NULL, payload jsonb NOT NULL)"
    ))
    .await
    .unwrap();
    let enq = outbox::Enqueuer::new(s);
    let outbox_sql = format!(
        "INSERT INTO {s}.outbox (topic, message_key, headers, payload) VALUES ($1, $2, $3, $4)"
    );
    let plain_sql = format!(
        "INSERT INTO {s}.plain (topic, message_key, headers, payload) VALUES ($1, $2, $3, $4)"
    );
    let ways = ["ours", "described", "plain"];
    let mut took: HashMap<&str, Vec<f64>> = HashMap::new();
    let block = 500.min(txs).max(1);
    let mut i = 0;
    while i < txs {
        for way in ways {
            for _ in 0..block {
                let m = outbox::Message::new(
                    "bench.enqueue",
                    "order_created",
                    format!("key-{}", i % 1000),
                    serde_json::json!({"n": i, "pad": "x".repeat(150)}),
                );
                let headers = serde_json::json!({"message_type": "order_created"});
                let key = format!("key-{}", i % 1000);
                let payload = serde_json::json!({"n": i, "pad": "x".repeat(150)});
                let started = std::time::Instant::now();
                let tx = c.transaction().await.unwrap();
                match way {
                    "ours" => enq.enqueue(&tx, &m).await.unwrap(),
                    _ => {
                        let sql = if way == "plain" {
                            &plain_sql
                        } else {
                            &outbox_sql
                        };
                        tx.execute(sql.as_str(), &[&"bench.enqueue", &key, &headers, &payload])
                            .await
                            .unwrap();
                    }
                }
                tx.commit().await.unwrap();
                took.entry(way)
                    .or_default()
                    .push(started.elapsed().as_secs_f64() * 1e6);
            }
        }
        i += block;
    }
    for v in took.values_mut() {
        v.sort_by(f64::total_cmp);
    }
    let median = |w: &str| percentile(&took[w], 50.0);
    let (ours, described, plain) = (median("ours"), median("described"), median("plain"));
    emit(
        "latency_enqueue",
        serde_json::json!({"transactions_per_way": took["ours"].len(), "block": block}),
        serde_json::json!({
            "ours_us": round2(ours),
            "described_us": round2(described),
            "plain_table_us": round2(plain),
            "ours_to_described": round2(ours / described.max(1e-3)),
            "ours_to_plain_table": round2(ours / plain.max(1e-3)),
        }),
    );
    drop_schema(&db).await;
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
