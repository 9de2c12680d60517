//! Soak: a steady RATE msg/s (each in its own transaction) for SECS seconds with the relay's
//! cleanup running every minute (sent retention 60 s, so it really deletes), while another
//! session holds a transaction open for HOLD_SECS (pinning the xmin horizon, as a forgotten
//! `BEGIN` in production does). Prints one JSON line per WINDOW seconds (throughput, p50/p99
//! commit→ack, dead tuples, pending-index size) and a summary line with the drift between the
//! first and last windows, and between the medians of the first and last thirds.
//!
//! Full run (not in CI): `dev/soak.sh` = `cargo bench --bench soak` with RATE=2000 SECS=1800
//! HOLD_SECS=600. Under `cargo test` it runs for a few seconds as a smoke test.

#[path = "support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;

#[tokio::main]
async fn main() {
    let rate = param("RATE", if full() { 2000 } else { 200 });
    let secs = param("SECS", if full() { 1800 } else { 4 });
    let hold = param("HOLD_SECS", if full() { 600 } else { 2 });
    let window = param("WINDOW", if full() { 60 } else { 1 }) as i64;
    let db = fresh_db().await;
    let topic = format!("bench.{}.created", rand_name(8));
    create_append_time_topic(&topic, &[("retention.ms", "600000")]).await;
    let receiver = Receiver::start(&topic);

    let cleanup = {
        let mut c = outbox::CleanupConfig::default();
        c.sent_retention = Duration::from_secs(60);
        c.interval = Some(Duration::from_secs(if full() { 60 } else { 1 }));
        c
    };
    let relay = outbox::Relay::new(&db, &kafka(), {
        let mut c = outbox::RelayConfig::default();
        c.cleanup = cleanup;
        c
    })
    .unwrap();
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    let relay_task = tokio::spawn(relay.run(async move {
        let _ = relay_stopped.await;
    }));

    // The long transaction: holds a snapshot (and so the xmin horizon) for HOLD_SECS.
    let holder = {
        let db = db.clone();
        tokio::spawn(async move {
            let mut c = outbox::connect(&db).await.unwrap();
            let tx = c
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .start()
                .await
                .unwrap();
            tx.query_one(
                &format!("SELECT count(*) FROM {}.outbox", db.schema.quoted()),
                &[],
            )
            .await
            .unwrap();
            tokio::time::sleep(Duration::from_secs(hold as u64)).await;
            tx.commit().await.unwrap();
        })
    };

    // Writers: two connections sharing the rate.
    let committed: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let t0 = now_us();
    let mut writers = Vec::new();
    for w in 0..2 {
        let (db, topic, committed) = (db.clone(), topic.clone(), committed.clone());
        writers.push(tokio::spawn(async move {
            let mut c = outbox::connect(&db).await.unwrap();
            let enq = outbox::Enqueuer::new(&db.schema);
            let per = rate / 2;
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per as u64));
            for i in 0..per * secs {
                tick.tick().await;
                let m = outbox::Message::new(
                    &topic,
                    "order_created",
                    format!("key-{}", (i * 2 + w) % 1000),
                    serde_json::json!({"n": i, "pad": "x".repeat(150)}),
                );
                let tx = c.transaction().await.unwrap();
                enq.enqueue(&tx, &m).await.unwrap();
                tx.commit().await.unwrap();
                committed
                    .lock()
                    .unwrap()
                    .push((m.message_id().to_string(), now_us()));
            }
        }));
    }
    // Sample table health once per window.
    let probe = outbox::connect(&db).await.unwrap();
    let s = db.schema.quoted();
    let mut health: Vec<(i64, i64, i64)> = Vec::new(); // (dead tuples, pending index bytes, both pending indexes)
    let windows = (secs as i64 + window - 1) / window;
    for _ in 0..windows {
        tokio::time::sleep(Duration::from_secs(window as u64)).await;
        let r = probe
            .query_one(
                &format!(
                    "SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = '{s}.outbox'::regclass), 0),
                            pg_relation_size('{s}.outbox_pending_idx'), pg_relation_size('{s}.outbox_pending_id_idx')"
                ),
                &[],
            )
            .await
            .unwrap();
        health.push((r.get(0), r.get(1), r.get(2)));
    }
    for w in writers {
        w.await.unwrap();
    }
    let total = committed.lock().unwrap().len();
    receiver.wait_for(total, Duration::from_secs(120)).await;
    let acked: HashMap<String, i64> = receiver
        .stop()
        .into_iter()
        .map(|(id, (_, append))| (id, append))
        .collect();
    stop_relay.send(()).unwrap();
    relay_task.await.unwrap().unwrap();
    holder.await.unwrap();

    let committed = std::mem::take(&mut *committed.lock().unwrap());
    assert_eq!(acked.len(), total, "every message reached Kafka");
    let mut per_window: Vec<Vec<f64>> = vec![Vec::new(); windows as usize];
    for (id, at) in committed.iter() {
        let wi = (((at - t0) / 1_000_000) / window).clamp(0, windows - 1) as usize;
        per_window[wi].push(((acked[id] * 1000 - at) as f64 / 1000.0).max(0.0));
    }
    let mut rows = Vec::new();
    for (i, mut lat) in per_window.into_iter().enumerate() {
        lat.sort_by(f64::total_cmp);
        let (dead, idx1, idx2) = health.get(i).copied().unwrap_or_default();
        let row = serde_json::json!({"window": i, "msgs_per_sec": round2(lat.len() as f64 / window as f64),
            "p50_ms": round2(percentile(&lat, 50.0)), "p99_ms": round2(percentile(&lat, 99.0)),
            "dead_tuples": dead, "pending_idx_kib": idx1 / 1024, "pending_id_idx_kib": idx2 / 1024});
        emit(
            "soak_window",
            serde_json::json!({"rate": rate, "seconds": secs, "hold_secs": hold, "window_secs": window}),
            row.clone(),
        );
        rows.push(row);
    }
    // Drift: last full window vs first full window (the first may include warm-up).
    let first = &rows[usize::from(rows.len() > 2)];
    let last = &rows[rows.len() - 1];
    let drift = |k: &str| {
        round2(
            (last[k].as_f64().unwrap() - first[k].as_f64().unwrap()) / first[k].as_f64().unwrap()
                * 100.0,
        )
    };
    // The same, robust to one noisy window: the median of the windows' figures in the first
    // third of the run (after warm-up) vs the last third.
    let third = (rows.len() / 3).max(1);
    let median_of = |rs: &[serde_json::Value], k: &str| {
        let mut v: Vec<f64> = rs.iter().map(|r| r[k].as_f64().unwrap()).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    let head = &rows[usize::from(rows.len() > 2).min(rows.len() - 1)..third.max(2).min(rows.len())];
    let tail = &rows[rows.len() - third..];
    let median_drift = |k: &str| {
        let (a, b) = (median_of(head, k), median_of(tail, k));
        round2((b - a) / a * 100.0)
    };
    emit(
        "soak",
        serde_json::json!({"rate": rate, "seconds": secs, "hold_secs": hold, "window_secs": window}),
        serde_json::json!({"messages": total, "throughput_drift_pct": drift("msgs_per_sec"), "p99_drift_pct": drift("p99_ms"),
            "throughput_median_drift_pct": median_drift("msgs_per_sec"), "p99_median_drift_pct": median_drift("p99_ms"),
            "max_dead_tuples": rows.iter().map(|r| r["dead_tuples"].as_i64().unwrap()).max(),
            "final_dead_tuples": last["dead_tuples"], "max_pending_id_idx_kib": rows.iter().map(|r| r["pending_id_idx_kib"].as_i64().unwrap()).max()}),
    );
    drop(committed);
    drop_schema(&db).await;
    delete_topic(&topic).await;
}
