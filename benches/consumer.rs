//! Idempotent consumer throughput: N messages through the consumer runtime into a business
//! table (inbox mark + insert per message), at concurrency 1 and 16 — with commit groups (the
//! default) and with a transaction per message — and with a batched handler (many messages per
//! transaction) → msgs/s, each next to pgbench's single-insert commit rate from 16 clients
//! against the same Postgres in the same run.
//!
//! Then the batched handler over the same messages as plain JSON, Avro and Protobuf
//! (`consumer_formats`: each format's rate as a ratio to JSON's, in the same run).
//!
//! Then strict per-key order (`consumer_strict_order`): the per-message consumer at concurrency
//! 16 with and without it over the same backlog at 0 % poison (throughput ratio, alternated
//! twice), and under a paced load the handle latency of the keys that are not held, with 3 %
//! of the keys failing a message (their later messages held) against the same load without
//! poison (p99 ratio).
//!
//! `cargo bench --bench consumer` (env: ROWS=200000, ROWS_C1=20000, MAX_BATCH=500;
//! ONLY_FORMATS=1 runs just the formats, three rounds; ONLY_STRICT=1 just strict order).
//!
//! Then tracing's cost (`consumer_tracing`): the per-message consumer over messages a traced
//! service wrote, with no tracer provider and exporting to Jaeger at 1 % and 100 % sampling,
//! as ratios to off; ONLY_TRACING=1 runs ROUNDS=3 rounds of just that.

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox::consumer::{
    BatchHandler, BoxFuture, Consumer, ConsumerConfig, ConsumerStats, Delivered, Handler,
    HandlerError,
};
use support::*;

struct Charge(String);

impl Handler for Charge {
    fn handle<'a>(
        &'a self,
        m: &'a Delivered,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let b = m.json();
            let order = b["order_number"]
                .as_str()
                .ok_or_else(|| HandlerError::permanent("no order"))?;
            let cents = b["total_cents"]
                .as_i64()
                .ok_or_else(|| HandlerError::permanent("no total"))?;
            tx.execute(
                &format!(
                    "INSERT INTO {} (order_number, amount_cents, message_id) VALUES ($1, $2, $3)",
                    self.0
                ),
                &[&order, &cents, &m.message_id],
            )
            .await?;
            Ok(())
        })
    }
}

impl BatchHandler for Charge {
    fn handle_batch<'a>(
        &'a self,
        ms: &'a [&'a Delivered],
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let mut orders = Vec::with_capacity(ms.len());
            let mut cents = Vec::with_capacity(ms.len());
            let mut ids = Vec::with_capacity(ms.len());
            for m in ms {
                let b = m.json();
                orders.push(
                    b["order_number"]
                        .as_str()
                        .ok_or_else(|| HandlerError::permanent("no order"))?
                        .to_owned(),
                );
                cents.push(
                    b["total_cents"]
                        .as_i64()
                        .ok_or_else(|| HandlerError::permanent("no total"))?,
                );
                ids.push(m.message_id.as_str());
            }
            tx.execute(
                &format!("INSERT INTO {} (order_number, amount_cents, message_id) SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[])", self.0),
                &[&orders, &cents, &ids],
            )
            .await?;
            Ok(())
        })
    }
}

/// The per-message handler of the latency runs: refuses an event whose body says `poison`,
/// and records how long after it was produced each event of a key that is never held was
/// handled.
struct Timed {
    table: String,
    latencies: Arc<std::sync::Mutex<Vec<f64>>>,
}

impl Handler for Timed {
    fn handle<'a>(
        &'a self,
        m: &'a Delivered,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let b = m.json();
            if b["poison"].as_bool() == Some(true) {
                return Err(HandlerError::permanent("rule 7 rejects the event"));
            }
            tx.execute(
                &format!(
                    "INSERT INTO {} (order_number, amount_cents, message_id) VALUES ($1, 100, $2)",
                    self.table
                ),
                &[&b["order_number"].as_str().unwrap_or("-"), &m.message_id],
            )
            .await?;
            if b["held_key"].as_bool() != Some(true) {
                let sent = b["sent_us"].as_i64().unwrap_or_default();
                self.latencies
                    .lock()
                    .unwrap()
                    .push((now_us() - sent) as f64 / 1000.0);
            }
            Ok(())
        })
    }
}

/// Produces `n` events over 1,000 keys at `rate`/s; with `poison`, 3 % of the keys (k % 33 ==
/// 5) fail their second event, so their later events are held in strict order. Then waits
/// until every event that is not held is handled and returns the latencies (ms) of the keys
/// never held.
async fn paced(db: &outbox::DbConfig, n: usize, rate: f64, poison: bool) -> Vec<f64> {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let topic = format!("bench.{}.created", rand_name(8));
    create_topic(&topic, 6).await;
    create_topic(&format!("{topic}.dlq"), 6).await;
    let table = format!("charges_{}", rand_name(6));
    let c = outbox::connect(db).await.unwrap();
    c.batch_execute(&format!(
        "CREATE TABLE {}.{table} (order_number text, amount_cents bigint, message_id text)",
        db.schema.quoted()
    ))
    .await
    .unwrap();
    let mut cfg = ConsumerConfig::new(format!("bench-{}", rand_name(8)), [&topic]);
    cfg.retry = outbox::consumer::RetryStrategy::InPlace {
        attempts: 1,
        base: Duration::from_millis(1),
        max: Duration::from_millis(1),
    };
    cfg.strict_order = Some(outbox::consumer::StrictOrder::new([&topic]));
    let latencies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let consumer = Consumer::new(db, &kafka(), cfg).unwrap().handler(
        "order_created",
        Timed {
            table: format!("{}.{table}", db.schema.quoted()),
            latencies: latencies.clone(),
        },
    );
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let h = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    // The consumer is assigned before the load starts: the first events do not wait for it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("linger.ms", "1")
        .create()
        .unwrap();
    let held = |k: usize| poison && k % 33 == 5;
    let mut waits = Vec::new();
    let started = Instant::now();
    let mut expected = 0u64;
    for i in 0..n {
        let (k, round) = (i % 1000, i / 1000);
        let due = started + Duration::from_secs_f64(i as f64 / rate);
        if let Some(d) = due.checked_duration_since(Instant::now()) {
            tokio::time::sleep(d).await;
        }
        let body = serde_json::json!({
            "order_number": format!("c{k}-{round}"), "poison": held(k) && round == 1,
            "held_key": held(k), "sent_us": now_us(),
        })
        .to_string();
        let id = uuid::Uuid::now_v7().to_string();
        let key = format!("c{k}");
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "message_type",
                value: Some("order_created"),
            })
            .insert(Header {
                key: "message_id",
                value: Some(id.as_str()),
            });
        waits.push(
            producer
                .send_result(
                    FutureRecord::to(&topic)
                        .key(&key)
                        .payload(&body)
                        .headers(headers),
                )
                .unwrap(),
        );
        if !(held(k) && round >= 1) {
            expected += 1;
        }
    }
    for w in waits {
        w.await.unwrap().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    while ConsumerStats::get(&stats.handled) < expected {
        assert!(Instant::now() < deadline, "strict order bench timed out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).unwrap();
    h.await.unwrap().unwrap();
    delete_topic(&topic).await;
    delete_topic(&format!("{topic}.dlq")).await;
    let mut l = latencies.lock().unwrap().clone();
    l.sort_by(f64::total_cmp);
    l
}

/// Strict per-key order's cost: throughput at 0 % poison against the same consumer without
/// it, and the latency of the keys that are not held under 3 % poison against none.
async fn strict_order(db: &outbox::DbConfig, topic: &str, rows: usize) {
    let mut with = Vec::new();
    let mut without = Vec::new();
    for _ in 0..2 {
        for strict in [false, true] {
            let r = run_strict(db, topic, rows, strict).await;
            let rate = r["msgs_per_sec"].as_f64().unwrap();
            if strict {
                with.push(rate)
            } else {
                without.push(rate)
            }
        }
    }
    let (w, wo) = (
        with.iter().sum::<f64>() / 2.0,
        without.iter().sum::<f64>() / 2.0,
    );
    emit(
        "consumer_strict_order",
        serde_json::json!({"messages": rows, "partitions": 6, "keys": 1000, "mode": "per-message", "concurrency": 16, "poison": 0.0, "runs": 2}),
        serde_json::json!({"strict_msgs_per_sec": w.round(), "plain_msgs_per_sec": wo.round(), "strict_to_plain": round2(w / wo)}),
    );
    let n = param("STRICT_LATENCY_ROWS", if full() { 30_000 } else { 3_000 });
    let rate = param("STRICT_LATENCY_RATE", if full() { 1_000 } else { 500 }) as f64;
    let clean = paced(db, n, rate, false).await;
    let poisoned = paced(db, n, rate, true).await;
    let p = |l: &[f64], q| round2(percentile(l, q));
    emit(
        "consumer_strict_order_latency",
        serde_json::json!({"messages": n, "rate_per_sec": rate, "partitions": 6, "keys": 1000, "poison_keys": 0.03, "concurrency": 64}),
        serde_json::json!({
            "clean_p50_ms": p(&clean, 50.0), "clean_p99_ms": p(&clean, 99.0),
            "poisoned_p50_ms": p(&poisoned, 50.0), "poisoned_p99_ms": p(&poisoned, 99.0),
            "p99_poisoned_to_clean": round2(percentile(&poisoned, 99.0) / percentile(&clean, 99.0)),
            "samples": [clean.len(), poisoned.len()],
        }),
    );
}

/// [`run`] per message at concurrency 16, with strict order on the topic or not.
async fn run_strict(
    db: &outbox::DbConfig,
    topic: &str,
    rows: usize,
    strict: bool,
) -> serde_json::Value {
    STRICT.store(strict, std::sync::atomic::Ordering::SeqCst);
    let r = run(
        db,
        topic,
        rows,
        "per-message",
        16,
        1,
        ConsumerConfig::DEFAULT_COMMIT_GROUP,
    )
    .await;
    STRICT.store(false, std::sync::atomic::Ordering::SeqCst);
    r
}

/// Set while [`run_strict`] runs a strict consumer.
static STRICT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

async fn run(
    db: &outbox::DbConfig,
    topic: &str,
    rows: usize,
    mode: &str,
    concurrency: usize,
    max_batch: usize,
    commit_group: usize,
) -> serde_json::Value {
    run_with(
        db,
        topic,
        rows,
        mode,
        concurrency,
        max_batch,
        commit_group,
        None,
    )
    .await
}

/// [`run`], decoding framed records through `schemas`.
#[allow(clippy::too_many_arguments)]
async fn run_with(
    db: &outbox::DbConfig,
    topic: &str,
    rows: usize,
    mode: &str,
    concurrency: usize,
    max_batch: usize,
    commit_group: usize,
    schemas: Option<outbox::schemas::Schemas>,
) -> serde_json::Value {
    let table = format!("charges_{}", rand_name(6));
    let c = outbox::connect(db).await.unwrap();
    c.batch_execute(&format!(
        "CREATE TABLE {}.{table} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, order_number text NOT NULL, amount_cents bigint NOT NULL, message_id text NOT NULL)",
        db.schema.quoted()
    ))
    .await
    .unwrap();
    let mut cfg = ConsumerConfig::new(format!("bench-{}", rand_name(8)), [topic]);
    cfg.concurrency = concurrency;
    cfg.commit_group = commit_group;
    cfg.max_buffered = param("MAX_BUFFERED", cfg.max_buffered);
    cfg.schemas = schemas;
    if STRICT.load(std::sync::atomic::Ordering::SeqCst) {
        cfg.strict_order = Some(outbox::consumer::StrictOrder::new([topic]));
    }
    let consumer = Consumer::new(db, &kafka(), cfg).unwrap();
    let consumer = if max_batch > 1 {
        consumer.batch_handler("order_created", max_batch, Charge(table.clone()))
    } else {
        consumer.handler("order_created", Charge(table.clone()))
    };
    let stats: Arc<ConsumerStats> = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    let h = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    let deadline = Instant::now() + Duration::from_secs(900);
    while ConsumerStats::get(&stats.handled) < rows as u64 {
        assert!(Instant::now() < deadline, "consumer bench timed out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    stop.send(()).unwrap();
    h.await.unwrap().unwrap();
    let n: i64 = c
        .query_one(
            &format!("SELECT count(*) FROM {}.{table}", db.schema.quoted()),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // The run stops once `rows` are handled; a few more may have been handled by then.
    assert_eq!(
        n as u64,
        ConsumerStats::get(&stats.handled),
        "each handled message's effect exactly once"
    );
    assert!(n as usize >= rows);
    serde_json::json!({"mode": mode, "concurrency": concurrency, "max_batch": max_batch, "commit_group": commit_group, "messages": rows,
                       "seconds": round2(secs), "msgs_per_sec": (rows as f64 / secs).round()})
}

#[tokio::main]
async fn main() {
    let rows = param("ROWS", if full() { 200_000 } else { 2_000 });
    let rows_c1 = param("ROWS_C1", if full() { 20_000 } else { 500 }).min(rows);
    let max_batch = param("MAX_BATCH", 500);
    if std::env::var("ONLY_STRICT").is_ok() {
        let db = fresh_db().await;
        let topic = format!("bench.{}.created", rand_name(8));
        create_topic(&topic, 6).await;
        create_topic(&format!("{topic}.dlq"), 6).await;
        fill_outbox(&db, &topic, rows, 1000).await;
        let relay = outbox::Relay::new(&db, &kafka(), outbox::RelayConfig::default()).unwrap();
        while let outbox::Outcome::Published(_) = relay.run_once().await.unwrap() {}
        strict_order(&db, &topic, rows).await;
        drop_schema(&db).await;
        return;
    }
    if std::env::var("ONLY_FORMATS").is_ok() {
        for _ in 0..3 {
            formats(rows, max_batch).await;
        }
        return;
    }
    if std::env::var("ONLY_TRACING").is_ok() {
        tracing_cost(param("ROUNDS", 3), rows).await;
        return;
    }
    let db = fresh_db().await;
    let topic = format!("bench.{}.created", rand_name(8));
    create_topic(&topic, 6).await;
    create_topic(&format!("{topic}.dlq"), 6).await;
    fill_outbox(&db, &topic, rows, 1000).await;
    let relay = outbox::Relay::new(&db, &kafka(), outbox::RelayConfig::default()).unwrap();
    while let outbox::Outcome::Published(_) = relay.run_once().await.unwrap() {}

    // The peer measured in the same run: pgbench's rate of single-insert commits from 16
    // clients against the same Postgres (what a per-message handler is made of).
    let pgbench = pgbench_single_insert_tps(&db, if full() { 15 } else { 2 });
    let group = outbox::consumer::ConsumerConfig::DEFAULT_COMMIT_GROUP;
    for (mode, conc, batch, cg, n) in [
        ("per-message", 1, 1, group, rows_c1),
        ("per-message", 16, 1, group, rows),
        // The same without commit groups: a transaction per message.
        ("per-message", 16, 1, 1, rows),
        ("batched", 16, max_batch, group, rows),
    ] {
        // A topic prefix of n messages: the first n of the topic are consumed by a fresh group.
        let mut r = run(&db, &topic, n, mode, conc, batch, cg).await;
        if let (Some(tps), Some(rate)) = (pgbench, r["msgs_per_sec"].as_f64()) {
            r["pgbench_single_insert_tps_c16"] = serde_json::json!(tps.round());
            r["ratio_to_pgbench"] = serde_json::json!(round2(rate / tps));
        }
        emit(
            "consumer",
            serde_json::json!({"messages": n, "partitions": 6, "keys": 1000, "mode": mode, "concurrency": conc, "max_batch": batch, "commit_group": cg}),
            r,
        );
    }
    strict_order(&db, &topic, rows).await;
    drop_schema(&db).await;
    delete_topic(&topic).await;
    delete_topic(&format!("{topic}.dlq")).await;
    formats(rows, max_batch).await;
    tracing_cost(1, rows).await;
}

/// What tracing costs the consumer: the per-message consumer at concurrency 16 over messages a
/// traced service wrote (each with a `traceparent`), with no tracer provider (compiled in,
/// off), and exporting to Jaeger at 1 % and 100 % sampling; `rounds` rounds, the order
/// rotating.
async fn tracing_cost(rounds: usize, rows: usize) {
    let db = fresh_db().await;
    let topic = format!("bench.{}.created", rand_name(8));
    create_topic(&topic, 6).await;
    create_topic(&format!("{topic}.dlq"), 6).await;
    fill_outbox_traced(&db, &topic, rows, 1000, true, Some(1.0)).await;
    let relay = outbox::Relay::new(&db, &kafka(), outbox::RelayConfig::default()).unwrap();
    while let outbox::Outcome::Published(_) = relay.run_once().await.unwrap() {}
    drop(relay);
    let group = ConsumerConfig::DEFAULT_COMMIT_GROUP;
    let modes = TRACING_MODES;
    for round in 0..rounds {
        let mut got = std::collections::HashMap::new();
        for i in 0..3 {
            let (name, ratio) = modes[(round + i) % 3];
            let guard = tracing_at(ratio);
            let r = run(&db, &topic, rows, "per-message", 16, 1, group).await;
            let spans = tracing_off(guard);
            got.insert(name, (r["msgs_per_sec"].as_f64().unwrap(), spans));
        }
        emit(
            "consumer_tracing",
            serde_json::json!({"messages": rows, "partitions": 6, "keys": 1000, "mode": "per-message", "concurrency": 16}),
            serde_json::json!({
                "off_msgs_per_sec": got["off"].0,
                "sampled_1pct_msgs_per_sec": got["1%"].0,
                "sampled_100pct_msgs_per_sec": got["100%"].0,
                "ratio_1pct_to_off": round2(got["1%"].0 / got["off"].0),
                "ratio_100pct_to_off": round2(got["100%"].0 / got["off"].0),
                // Spans recorded and accepted by Jaeger (a full queue drops spans, never waits).
                "spans_1pct_100pct": [got["1%"].1, got["100%"].1],
                "first": modes[round % 3].0,
                "exporter": "OTLP/HTTP to Jaeger (dev/jaeger.sh)",
            }),
        );
    }
    drop_schema(&db).await;
    delete_topic(&topic).await;
    delete_topic(&format!("{topic}.dlq")).await;
}

/// The batched handler (the fastest path, where decoding weighs most) over the same messages
/// published as plain JSON, Avro and Protobuf: each schema format's rate as a ratio to JSON's,
/// measured in the same run.
async fn formats(rows: usize, max_batch: usize) {
    let group = outbox::consumer::ConsumerConfig::DEFAULT_COMMIT_GROUP;
    let mut rates = Vec::new();
    for f in FORMATS {
        let db = fresh_db().await;
        let topic = format!("bench.{}.created", rand_name(8));
        create_topic(&topic, 6).await;
        create_topic(&format!("{topic}.dlq"), 6).await;
        let schemas = bench_schemas(&topic, f).await;
        fill_outbox(&db, &topic, rows, 1000).await;
        let mut rc = outbox::RelayConfig::default();
        rc.schemas = schemas.clone();
        let relay = outbox::Relay::new(&db, &kafka(), rc).unwrap();
        while let outbox::Outcome::Published(_) = relay.run_once().await.unwrap() {}
        let r = run_with(&db, &topic, rows, "batched", 16, max_batch, group, schemas).await;
        rates.push(r["msgs_per_sec"].as_f64().unwrap());
        drop_schema(&db).await;
        delete_topic(&topic).await;
        delete_topic(&format!("{topic}.dlq")).await;
    }
    emit(
        "consumer_formats",
        serde_json::json!({"messages": rows, "partitions": 6, "keys": 1000, "mode": "batched", "concurrency": 16, "max_batch": max_batch}),
        serde_json::json!({
            "json_msgs_per_sec": rates[0], "avro_msgs_per_sec": rates[1], "protobuf_msgs_per_sec": rates[2],
            "avro_to_json": round2(rates[1] / rates[0]), "protobuf_to_json": round2(rates[2] / rates[0]),
        }),
    );
}

/// pgbench, 16 clients, each transaction one INSERT into a fresh table, for `secs` seconds:
/// transactions per second (None when pgbench is missing). Same database as the bench, also
/// when `DATABASE_URL` is not set.
fn pgbench_single_insert_tps(db: &outbox::DbConfig, secs: u32) -> Option<f64> {
    let url = database_url();
    let table = format!("{}.pgbench_sink", db.schema.quoted());
    let script = std::env::temp_dir().join(format!("outbox-pgbench-{}.sql", rand_name(6)));
    std::fs::write(
        &script,
        format!("INSERT INTO {table} (order_number, amount_cents, message_id) VALUES ('A-' || :client_id, 100, md5(random()::text));\n"),
    )
    .ok()?;
    let setup = std::process::Command::new("psql")
        .args([&url, "-qc", &format!("CREATE TABLE IF NOT EXISTS {table} (order_number text, amount_cents bigint, message_id text)")])
        .status()
        .ok()?;
    if !setup.success() {
        return None;
    }
    let out = std::process::Command::new("pgbench")
        .args(["-n", "-c", "16", "-j", "2", "-T", &secs.to_string(), "-f"])
        .arg(&script)
        .arg(&url)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| l.trim_start_matches("tps = ").split_whitespace().next())
        .and_then(|v| v.parse().ok())
}
