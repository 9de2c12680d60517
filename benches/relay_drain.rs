//! Relay throughput: N pending rows (≈200-byte payloads, 1,000 keys, a 6-partition topic)
//! drained to empty by one relay, then by two relays side by side → msgs/s.
//!
//! `cargo bench --bench relay_drain` (env: ROWS=200000, BATCH=…); smoke size under cargo test.

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Instant;

use support::*;

async fn drain_with(relays: usize, rows: usize, batch: usize, analyze: bool) -> serde_json::Value {
    let db = fresh_db().await;
    let topic = format!("bench.{}.created", rand_name(8));
    create_topic(&topic, 6).await;
    fill_outbox_stats(&db, &topic, rows, 1000, analyze).await;
    let cfg = outbox::RelayConfig {
        batch_size: batch,
        cleanup: outbox::CleanupConfig {
            interval: None,
            ..Default::default()
        },
        ..Default::default()
    };
    let rs: Vec<Arc<outbox::Relay>> = (0..relays)
        .map(|_| Arc::new(outbox::Relay::new(&db, &kafka(), cfg.clone()).unwrap()))
        .collect();
    // Converge the ordering lanes (each relay its share) before the clock starts.
    for _ in 0..2 {
        for r in &rs {
            r.rebalance().await;
        }
    }
    let started = Instant::now();
    let tasks: Vec<_> = rs
        .iter()
        .map(|r| {
            let r = r.clone();
            tokio::spawn(async move {
                let mut sent = 0usize;
                while let outbox::Outcome::Published(b) = r.run_once().await.unwrap() {
                    sent += b.sent;
                }
                sent
            })
        })
        .collect();
    let mut sent = 0;
    for t in tasks {
        sent += t.await.unwrap();
    }
    // A relay stops at its first empty pass; whatever is left (rare) is finished by relay 0
    // once the others are gone and their lanes are free.
    let first = rs[0].clone();
    drop(rs);
    let c = outbox::connect(&db).await.unwrap();
    let pending = format!(
        "SELECT count(*) FROM {}.outbox WHERE status = 'pending'",
        db.schema.quoted()
    );
    while c.query_one(&pending, &[]).await.unwrap().get::<_, i64>(0) > 0 {
        first.rebalance().await;
        while let outbox::Outcome::Published(b) = first.run_once().await.unwrap() {
            sent += b.sent;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(sent, rows, "every row sent");
    drop_schema(&db).await;
    delete_topic(&topic).await;
    serde_json::json!({"relays": relays, "rows": rows, "statistics": if analyze { "analyzed" } else { "never analyzed" }, "seconds": round2(secs), "msgs_per_sec": (rows as f64 / secs).round()})
}

#[tokio::main]
async fn main() {
    let rows = param("ROWS", if full() { 200_000 } else { 2_000 });
    let batch = param("BATCH", outbox::DEFAULT_BATCH_SIZE);
    for relays in [1, 2] {
        let r = drain_with(relays, rows, batch, true).await;
        emit(
            "relay_drain",
            serde_json::json!({"rows": rows, "keys": 1000, "partitions": 6, "batch": batch, "relays": relays}),
            r,
        );
    }
    // The user's situation after an outage or a bulk import: a backlog the planner has no
    // statistics for, next to the same backlog analyzed, measured in the same run.
    let analyzed = drain_with(1, rows, batch, true).await;
    let stale = drain_with(1, rows, batch, false).await;
    let ratio =
        stale["msgs_per_sec"].as_f64().unwrap() / analyzed["msgs_per_sec"].as_f64().unwrap();
    emit(
        "relay_drain_stale_statistics",
        serde_json::json!({"rows": rows, "keys": 1000, "partitions": 6, "batch": batch, "relays": 1}),
        serde_json::json!({"analyzed_msgs_per_sec": analyzed["msgs_per_sec"], "never_analyzed_msgs_per_sec": stale["msgs_per_sec"], "stale_to_analyzed": round2(ratio)}),
    );
}
