//! Shared by the benchmarks: services from env (loopback defaults), fresh schema and topics,
//! and one JSON line per result. Each bench runs full size under `cargo bench` (which passes
//! `--bench`) and a tiny smoke size otherwise, so `cargo test --all-targets` keeps them alive.
#![allow(dead_code)]

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://outbox:outbox@127.0.0.1:5432/outbox".into())
}

pub fn bootstrap() -> String {
    std::env::var("KAFKA_BOOTSTRAP_SERVERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// True under `cargo bench`; false under `cargo test` (smoke size).
pub fn full() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// `name` from the environment as a number, else `default`.
pub fn param(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

pub fn rand_name(n: usize) -> String {
    (0..n).map(|_| fastrand::alphanumeric().to_ascii_lowercase()).collect()
}

pub async fn fresh_db() -> outbox::DbConfig {
    let db = outbox::DbConfig::new(&database_url(), &format!("bench_{}", rand_name(10))).unwrap();
    outbox::migrate(&db).await.expect("migrate: are dev/up.sh services running?");
    db
}

pub async fn drop_schema(db: &outbox::DbConfig) {
    let c = outbox::connect(db).await.unwrap();
    c.batch_execute(&format!("DROP SCHEMA {} CASCADE", db.schema.quoted())).await.unwrap();
}

/// Kafka settings; extra librdkafka properties from `KAFKA_PROPERTIES` (`name=value;…`).
pub fn kafka() -> outbox::KafkaConfig {
    let mut k = outbox::KafkaConfig::new(&bootstrap()).unwrap();
    for pair in std::env::var("KAFKA_PROPERTIES").unwrap_or_default().split(';').filter(|p| !p.is_empty()) {
        k.set_from_pair(pair).unwrap();
    }
    k
}

pub async fn create_topic(name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> =
        rdkafka::ClientConfig::new().set("bootstrap.servers", bootstrap()).create().unwrap();
    for r in admin
        .create_topics(&[NewTopic::new(name, partitions, TopicReplication::Fixed(1))], &AdminOptions::new())
        .await
        .unwrap()
    {
        r.unwrap();
    }
}

pub async fn delete_topic(name: &str) {
    let admin: AdminClient<DefaultClientContext> =
        rdkafka::ClientConfig::new().set("bootstrap.servers", bootstrap()).create().unwrap();
    let _ = admin.delete_topics(&[name], &AdminOptions::new()).await;
}

/// Inserts `rows` pending rows server-side: ≈200-byte JSON payloads, `keys` distinct keys,
/// the four standard headers.
pub async fn fill_outbox(db: &outbox::DbConfig, topic: &str, rows: usize, keys: usize) {
    let c = outbox::connect(db).await.unwrap();
    let chunk = 50_000;
    let mut done = 0;
    while done < rows {
        let n = chunk.min(rows - done);
        c.execute(
            &format!(
                "INSERT INTO {s}.outbox (topic, message_key, headers, payload)
                 SELECT $1, 'key-' || (g % $3), jsonb_build_object('message_type', 'order_created',
                        'entity_id', 'key-' || (g % $3), 'message_id', {s}.outbox_uuidv7()::text,
                        'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')),
                        jsonb_build_object('order_number', 'A-' || g, 'customer', 'customer-' || (g % 977),
                                           'total_cents', g * 7 % 100000, 'currency', 'EUR',
                                           'note', repeat('x', 90))
                   FROM generate_series($2::bigint, $2::bigint + $4::bigint - 1) g",
                s = db.schema.quoted()
            ),
            &[&topic, &(done as i64), &(keys as i64), &(n as i64)],
        )
        .await
        .unwrap();
        done += n;
    }
    c.batch_execute(&format!("ANALYZE {}.outbox", db.schema.quoted())).await.unwrap();
}

pub fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into())
}

/// Prints one JSON line: `{"bench": name, "params": …, "results": …, "git": …, "smoke": …}`.
pub fn emit(name: &str, params: serde_json::Value, results: serde_json::Value) {
    let line = serde_json::json!({
        "bench": name,
        "params": params,
        "results": results,
        "git": git_commit(),
        "smoke": !full(),
    });
    println!("{line}");
}

/// Percentile of sorted samples (nearest rank).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

pub const MINUTE: Duration = Duration::from_secs(60);
