//! Soak: a steady RATE msg/s (each in its own transaction) for SECS seconds with the relay's
//! cleanup running every minute (sent retention 60 s, so it really deletes), while another
//! session holds a transaction open for HOLD_SECS (pinning the xmin horizon, as a forgotten
//! `BEGIN` in production does). Prints one JSON line per WINDOW seconds (throughput, p50/p99
//! commit→ack, dead tuples, pending-index size) and a summary line with the drift between the
//! first and last windows, and between the medians of the first and last thirds.
//!
//! Full run (not in CI): `dev/soak.sh` = `cargo bench --bench soak` with RATE=2000 SECS=1800
//! HOLD_SECS=600. Under `cargo test` it runs for a few seconds as a smoke test, on both
//! storages.
//!
//! `PER_TX=n` writes n messages per transaction (the peak run: RATE=20000 PER_TX=50 SECS=300
//! HOLD_SECS=0); the summary's `backlog_drained_secs_after_end` is how long after the writers
//! stopped the last message was acknowledged.
//!
//! `STORAGE=ring` runs it on append-only ring storage (`outbox::storage::use_ring`), with
//! cleanup (rotation) every 10 s: the generation moves every 10 s (a sixth of the 60 s
//! retention) and settled leaves are truncated. Each window then also reports the storage's
//! bytes and generations, and the enqueue p99 of the transactions that overlapped a rotation
//! (a generation moved or a leaf was truncated, seen by a probe every 200 ms) against those
//! that did not. The summary adds storage max/min after the first reclaim and its trend.
//! The held transaction reads `processed_messages`, not the outbox: it pins the xmin horizon
//! like a forgotten `BEGIN` in a service; one that read the outbox itself would hold the
//! ring's leaves (their TRUNCATE waits for it, see docs/RELIABILITY.md).

#[path = "support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;

#[tokio::main]
async fn main() {
    if full() {
        soak(std::env::var("STORAGE").is_ok_and(|s| s == "ring")).await;
    } else {
        soak(false).await;
        soak(true).await;
    }
}

/// One soak, on the table or on ring storage.
async fn soak(ring: bool) {
    let rate = param("RATE", if full() { 2000 } else { 200 });
    let secs = param("SECS", if full() { 1800 } else { 4 });
    let hold = param("HOLD_SECS", if full() { 600 } else { 2 });
    let window = param("WINDOW", if full() { 60 } else { 1 }) as i64;
    // Messages per writer transaction (the peak run: PER_TX=50 at RATE=20000).
    let per_tx = param("PER_TX", 1).max(1);
    let db = fresh_db().await;
    if ring {
        outbox::storage::use_ring(&db, outbox::storage::MoveOptions::default())
            .await
            .unwrap();
    }
    let topic = format!("bench.{}.created", rand_name(8));
    create_append_time_topic(&topic, &[("retention.ms", "600000")]).await;
    let receiver = Receiver::start(&topic);

    let cleanup = {
        let mut c = outbox::CleanupConfig::default();
        c.sent_retention = Duration::from_secs(60);
        c.interval = Some(Duration::from_secs(match (full(), ring) {
            (false, _) => 1,
            (true, true) => 10,
            (true, false) => 60,
        }));
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
            let read = if ring { "processed_messages" } else { "outbox" };
            tx.query_one(
                &format!("SELECT count(*) FROM {}.{read}", db.schema.quoted()),
                &[],
            )
            .await
            .unwrap();
            tokio::time::sleep(Duration::from_secs(hold as u64)).await;
            tx.commit().await.unwrap();
        })
    };

    // Writers: WRITERS connections sharing the rate (default one per 250 transactions a
    // second, at least two: a connection commits one transaction at a time, and each commit
    // waits for its WAL flush, so two could not keep 2,000 single-row transactions a second).
    let writers_n = param("WRITERS", (rate / per_tx / 250).max(2));
    let committed: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    // Each transaction's start and end (µs): its enqueue latency, and whether a rotation
    // happened while it ran.
    let enqueues: Arc<Mutex<Vec<(i64, i64)>>> = Arc::default();
    let t0 = now_us();
    let mut writers = Vec::new();
    for w in 0..writers_n {
        let (db, topic, committed, enqueues) = (
            db.clone(),
            topic.clone(),
            committed.clone(),
            enqueues.clone(),
        );
        writers.push(tokio::spawn(async move {
            let mut c = outbox::connect(&db).await.unwrap();
            let enq = outbox::Enqueuer::new(&db.schema);
            let per = rate / writers_n;
            let mut tick = tokio::time::interval(Duration::from_micros(
                1_000_000 * per_tx as u64 / per as u64,
            ));
            for t in 0..per * secs / per_tx {
                tick.tick().await;
                let msgs: Vec<outbox::Message> = (t * per_tx..(t + 1) * per_tx)
                    .map(|i| {
                        outbox::Message::new(
                            &topic,
                            "order_created",
                            format!("key-{}", (i * writers_n + w) % 1000),
                            serde_json::json!({"n": i, "pad": "x".repeat(150)}),
                        )
                    })
                    .collect();
                let began = now_us();
                let tx = c.transaction().await.unwrap();
                if let [m] = msgs.as_slice() {
                    enq.enqueue(&tx, m).await.unwrap();
                } else {
                    enq.enqueue_batch(&tx, &msgs).await.unwrap();
                }
                tx.commit().await.unwrap();
                let done = now_us();
                enqueues.lock().unwrap().push((began, done));
                let mut committed = committed.lock().unwrap();
                for m in &msgs {
                    committed.push((m.message_id().to_string(), done));
                }
            }
        }));
    }
    // Ring: when rotations happen (the generation moved, or a leaf was truncated), from a
    // probe of the rotation state every 200 ms.
    let rotations: Arc<Mutex<Vec<i64>>> = Arc::default();
    let stop_watch = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = ring.then(|| {
        let (db, rotations, stop) = (db.clone(), rotations.clone(), stop_watch.clone());
        tokio::spawn(async move {
            let c = outbox::connect(&db).await.unwrap();
            let s = db.schema.quoted();
            let sql = format!(
                "SELECT g.gen::int, array(SELECT relfilenode::bigint FROM pg_class
                                           WHERE relname LIKE 'outbox\\_ring\\_%'
                                             AND relnamespace = '{s}'::regnamespace
                                           ORDER BY relname)
                   FROM {s}.outbox_generation AS g"
            );
            let mut last: Option<(i32, Vec<i64>)> = None;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = c.query_one(&sql, &[]).await.unwrap();
                let now: (i32, Vec<i64>) = (r.get(0), r.get(1));
                if last.as_ref().is_some_and(|l| *l != now) {
                    rotations.lock().unwrap().push(now_us());
                }
                last = Some(now);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    });
    // Sample table health once per window.
    let probe = outbox::connect(&db).await.unwrap();
    let s = db.schema.quoted();
    // (dead tuples, pending index bytes, both pending indexes; ring: the leaves' dead tuples,
    // 0, 0). Dead tuples are summed over every table the outbox writes.
    let mut health: Vec<(i64, i64, i64)> = Vec::new();
    // Ring: (storage bytes, generations holding rows) per window.
    let mut storage: Vec<(i64, u32)> = Vec::new();
    let windows = (secs as i64 + window - 1) / window;
    for _ in 0..windows {
        tokio::time::sleep(Duration::from_secs(window as u64)).await;
        let sql = if ring {
            format!(
                "SELECT coalesce((SELECT sum(n_dead_tup)::bigint FROM pg_stat_user_tables
                                   WHERE schemaname = '{}' AND relname LIKE 'outbox%'), 0),
                        0::bigint, 0::bigint",
                db.schema.name()
            )
        } else {
            format!(
                "SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = '{s}.outbox'::regclass), 0),
                        pg_relation_size('{s}.outbox_pending_idx'), pg_relation_size('{s}.outbox_pending_id_idx')"
            )
        };
        let r = probe.query_one(&sql, &[]).await.unwrap();
        health.push((r.get(0), r.get(1), r.get(2)));
        if ring {
            let st = outbox::storage::state(&db).await.unwrap();
            storage.push((st.bytes, st.generations.unwrap_or(0)));
        }
        // Progress as it goes (the windows' latencies are known only at the end): what was
        // committed and acknowledged so far, so a run cut short still says how far it got.
        let committed_so_far = committed.lock().unwrap().len();
        let acked_so_far = receiver.seen.lock().unwrap().len();
        eprintln!(
            "{}",
            serde_json::json!({"soak_progress": health.len(), "seconds": (now_us() - t0) / 1_000_000,
                "committed": committed_so_far, "acked": acked_so_far,
                "dead_tuples": health.last().map(|h| h.0),
                "storage_kib": storage.last().map(|s| s.0 / 1024),
                "generations": storage.last().map(|s| s.1)})
        );
    }
    stop_watch.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(w) = watcher {
        w.await.unwrap();
    }
    for w in writers {
        w.await.unwrap();
    }
    let writers_done = now_us();
    let total = committed.lock().unwrap().len();
    receiver.wait_for(total, Duration::from_secs(120)).await;
    // How long the backlog took to reach 0 (every message acknowledged) after the writers
    // stopped.
    let drained_after_end = (now_us() - writers_done) as f64 / 1e6;
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
    // Enqueue latency per window, split by whether a rotation happened while it ran (within
    // 200 ms of the probe that saw it: the probe's period).
    let rotated = std::mem::take(&mut *rotations.lock().unwrap());
    let mut enq_during: Vec<Vec<f64>> = vec![Vec::new(); windows as usize];
    let mut enq_outside: Vec<Vec<f64>> = vec![Vec::new(); windows as usize];
    for (began, done) in enqueues.lock().unwrap().iter() {
        let wi = (((done - t0) / 1_000_000) / window).clamp(0, windows - 1) as usize;
        let ms = (done - began) as f64 / 1000.0;
        if rotated
            .iter()
            .any(|r| *r >= *began - 200_000 && *r <= *done + 200_000)
        {
            enq_during[wi].push(ms);
        } else {
            enq_outside[wi].push(ms);
        }
    }
    let mut all_during: Vec<f64> = enq_during.iter().flatten().copied().collect();
    let mut all_outside: Vec<f64> = enq_outside.iter().flatten().copied().collect();
    all_during.sort_by(f64::total_cmp);
    all_outside.sort_by(f64::total_cmp);
    let mut rows = Vec::new();
    for (i, mut lat) in per_window.into_iter().enumerate() {
        lat.sort_by(f64::total_cmp);
        let (dead, idx1, idx2) = health.get(i).copied().unwrap_or_default();
        let mut row = serde_json::json!({"window": i, "msgs_per_sec": round2(lat.len() as f64 / window as f64),
            "p50_ms": round2(percentile(&lat, 50.0)), "p99_ms": round2(percentile(&lat, 99.0)),
            "dead_tuples": dead, "pending_idx_kib": idx1 / 1024, "pending_id_idx_kib": idx2 / 1024});
        if ring {
            let (bytes, gens) = storage.get(i).copied().unwrap_or_default();
            enq_during[i].sort_by(f64::total_cmp);
            enq_outside[i].sort_by(f64::total_cmp);
            row["storage_kib"] = (bytes / 1024).into();
            row["generations"] = gens.into();
            row["enqueue_p99_ms"] = round2(percentile(&enq_outside[i], 99.0)).into();
            row["enqueue_p99_during_rotation_ms"] = if enq_during[i].is_empty() {
                serde_json::Value::Null
            } else {
                round2(percentile(&enq_during[i], 99.0)).into()
            };
        }
        emit(
            "soak_window",
            serde_json::json!({"rate": rate, "seconds": secs, "hold_secs": hold, "window_secs": window, "storage": if ring { "ring" } else { "table" }}),
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
        median(rs.iter().map(|r| r[k].as_f64().unwrap()).collect())
    };
    let head = &rows[usize::from(rows.len() > 2).min(rows.len() - 1)..third.max(2).min(rows.len())];
    let tail = &rows[rows.len() - third..];
    let median_drift = |k: &str| {
        let (a, b) = (median_of(head, k), median_of(tail, k));
        round2((b - a) / a * 100.0)
    };
    let mut summary = serde_json::json!({"messages": total, "backlog_drained_secs_after_end": round2(drained_after_end), "throughput_drift_pct": drift("msgs_per_sec"), "p99_drift_pct": drift("p99_ms"),
        "throughput_median_drift_pct": median_drift("msgs_per_sec"), "p99_median_drift_pct": median_drift("p99_ms"),
        // (A window with no message has no p99: null.)
        "max_p99_ms": rows.iter().filter_map(|r| r["p99_ms"].as_f64()).fold(0.0, f64::max),
        "max_dead_tuples": rows.iter().map(|r| r["dead_tuples"].as_i64().unwrap()).max(),
        "final_dead_tuples": last["dead_tuples"], "max_pending_id_idx_kib": rows.iter().map(|r| r["pending_id_idx_kib"].as_i64().unwrap()).max()});
    if ring {
        // Storage after the first reclaim (the ring full once: windows from the first whose
        // size is below the one before it), its max/min, and its trend: the mean of the last
        // third against the mean of the first third of those windows.
        let first_drop = storage
            .windows(2)
            .position(|w| w[1].0 < w[0].0)
            .map_or(storage.len(), |p| p + 1);
        let after: Vec<f64> = storage[first_drop..].iter().map(|s| s.0 as f64).collect();
        let (max, min) = after
            .iter()
            .fold((0.0f64, f64::MAX), |(a, b), v| (a.max(*v), b.min(*v)));
        let third = (after.len() / 3).max(1);
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        summary["rotations"] = rotated.len().into();
        summary["windows_after_first_reclaim"] = after.len().into();
        summary["storage_max_to_min"] = if after.is_empty() {
            serde_json::Value::Null
        } else {
            round2(max / min).into()
        };
        summary["storage_trend_last_to_first_third"] = if after.len() >= 3 {
            round2(mean(&after[after.len() - third..]) / mean(&after[..third])).into()
        } else {
            serde_json::Value::Null
        };
        summary["enqueue_p99_during_rotation_ms"] = round2(percentile(&all_during, 99.0)).into();
        summary["enqueue_p99_outside_rotation_ms"] = round2(percentile(&all_outside, 99.0)).into();
        summary["enqueue_p99_during_to_outside"] = if all_during.is_empty() {
            serde_json::Value::Null
        } else {
            round2(percentile(&all_during, 99.0) / percentile(&all_outside, 99.0)).into()
        };
    }
    emit(
        "soak",
        serde_json::json!({"rate": rate, "seconds": secs, "hold_secs": hold, "window_secs": window, "per_tx": per_tx, "storage": if ring { "ring" } else { "table" }}),
        summary,
    );
    drop(committed);
    drop_schema(&db).await;
    delete_topic(&topic).await;
}
