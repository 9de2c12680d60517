//! Cleanup throughput: N sent rows past retention (plus rows that must survive: recent sent,
//! old pending, old failed, and processed_messages marks) deleted by `outbox::cleanup` in
//! bounded batches → rows/s and the longest single statement.
//!
//! `cargo bench --bench cleanup` (env: ROWS=1000000, BATCH=5000).

#[path = "support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::*;

#[tokio::main]
async fn main() {
    let rows = param("ROWS", if full() { 1_000_000 } else { 10_000 });
    let batch = param("BATCH", outbox::CleanupConfig::DEFAULT_BATCH_SIZE);
    let keep = rows / 10;
    let db = fresh_db().await;
    let c = outbox::connect(&db).await.unwrap();
    let s = db.schema.quoted();
    c.batch_execute(&format!(
        "INSERT INTO {s}.outbox (topic, message_key, headers, payload, status, attempts, created_at, available_at, sent_at)
           SELECT 'bench.cleanup', 'k' || (g % 1000), '{{\"message_type\":\"t\"}}', jsonb_build_object('n', g, 'pad', repeat('x', 150)),
                  'sent', 1, now() - interval '9 days', now() - interval '9 days', now() - interval '8 days'
             FROM generate_series(1, {rows}) g;
         INSERT INTO {s}.outbox (topic, payload, status, sent_at)
           SELECT 'bench.cleanup', '{{}}', 'sent', now() - interval '1 day' FROM generate_series(1, {keep});
         INSERT INTO {s}.outbox (topic, payload, status, created_at) VALUES
           ('bench.cleanup', '{{}}', 'pending', now() - interval '30 days'),
           ('bench.cleanup', '{{}}', 'failed', now() - interval '30 days');
         INSERT INTO {s}.processed_messages (consumer_group, topic, message_id, processed_at)
           SELECT 'g', 'bench.cleanup', 'm' || g, now() - interval '36 days' FROM generate_series(1, {keep}) g;"
    ))
    .await
    .unwrap();
    c.batch_execute(&format!("VACUUM ANALYZE {s}.outbox"))
        .await
        .unwrap();
    c.batch_execute(&format!("VACUUM ANALYZE {s}.processed_messages"))
        .await
        .unwrap();
    let cfg = {
        let mut c = outbox::CleanupConfig::default();
        c.batch_size = batch;
        c.interval = None;
        c
    };
    let started = Instant::now();
    let r = outbox::cleanup(&db, &cfg).await.unwrap();
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(r.outbox_deleted as usize, rows);
    assert_eq!(r.processed_deleted as usize, keep);
    let left: i64 = c
        .query_one(&format!("SELECT count(*) FROM {s}.outbox"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left as usize, keep + 2, "only rows past retention deleted");
    let total = r.outbox_deleted + r.processed_deleted;
    emit(
        "cleanup",
        serde_json::json!({"sent_rows_past_retention": rows, "rows_kept": keep + 2, "processed_marks_past_retention": keep, "batch": batch}),
        serde_json::json!({"deleted": total, "seconds": round2(secs), "rows_per_sec": (total as f64 / secs).round(),
                           "statements": r.statements, "longest_statement_ms": round2(r.longest_statement.as_secs_f64() * 1000.0)}),
    );
    let _ = Duration::ZERO;
    drop_schema(&db).await;
}
