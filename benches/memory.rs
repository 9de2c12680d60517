//! Relay memory: the `outbox relay` binary (a separate process) drains a backlog while its
//! resident set is sampled from /proc → peak RSS (VmHWM) and RSS at 25/50/75 % drained, for a
//! small and a large backlog, to show memory is flat whatever the backlog.
//!
//! `cargo bench --bench memory` (env: ROWS=1000000).

#[path = "support/mod.rs"]
mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

async fn measure(rows: usize) -> serde_json::Value {
    let db = fresh_db().await;
    let topic = format!("bench.{}.created", rand_name(8));
    create_topic(&topic, 6).await;
    fill_outbox(&db, &topic, rows, 1000).await;
    let c = outbox::connect(&db).await.unwrap();
    let pending_sql = format!(
        "SELECT count(*) FROM {}.outbox WHERE status = 'pending'",
        db.schema.quoted()
    );
    let mut child = Command::new(support::outbox_bin())
        .args(["relay", "--cleanup-interval", "off"])
        .env("DATABASE_URL", database_url())
        .env("OUTBOX_SCHEMA", db.schema.name())
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let started = Instant::now();
    let mut marks = serde_json::Map::new();
    let mut max_rss = 0u64;
    loop {
        let rss = proc_status(&pid.to_string(), "VmRSS:").unwrap_or(0);
        max_rss = max_rss.max(rss);
        let pending: i64 = c.query_one(&pending_sql, &[]).await.unwrap().get(0);
        let drained = 100 - (pending as usize * 100 / rows);
        for q in [25, 50, 75] {
            let k = format!("rss_mib_at_{q}pct");
            if drained >= q && !marks.contains_key(&k) {
                marks.insert(k, serde_json::json!(round2(rss as f64 / 1024.0)));
            }
        }
        if pending == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "drain timed out"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    let hwm = proc_status(&pid.to_string(), "VmHWM:").unwrap_or(max_rss);
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(child.wait().unwrap().success());
    drop_schema(&db).await;
    delete_topic(&topic).await;
    let mut r = serde_json::json!({"rows": rows, "seconds": round2(secs), "peak_rss_mib": round2(hwm as f64 / 1024.0)});
    r.as_object_mut().unwrap().extend(marks);
    r
}

#[tokio::main]
async fn main() {
    let big = param("ROWS", if full() { 1_000_000 } else { 3_000 });
    for rows in [big / 10, big] {
        let r = measure(rows).await;
        emit(
            "memory",
            serde_json::json!({"rows": rows, "batch": outbox::RelayConfig::DEFAULT_BATCH_SIZE, "process": "outbox relay"}),
            r,
        );
    }
}
