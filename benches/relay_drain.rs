//! Relay throughput: N pending rows (≈200-byte payloads, 1,000 keys, a 6-partition topic)
//! drained to empty → msgs/s, each figure next to this machine's ceiling measured in the same
//! run:
//!
//! - **Postgres alone**: one connection claiming and marking the same rows with the relay's own
//!   claim and mark statements, nothing else (no Kafka, no per-key check, no floor bookkeeping);
//! - **Kafka alone**: the same records (topic, key, headers, payload read from the outbox)
//!   produced by an idempotent `acks=all` producer configured like the relay's, all in flight.
//!
//! The relay's figure is printed as a ratio to the lower of the two. Then one relay vs two
//! relays side by side (pipelined, and one batch at a time each), pipelined vs one batch at a
//! time, and a never-analyzed backlog vs the same backlog analyzed.
//!
//! With `PG_DELAY_MS=d` every connection to Postgres (the ceiling loop's and the relays') goes
//! through a proxy that delays each direction by d ms: a network between the relay and its
//! database, as in production, where a relay waits on round trips and a second relay has free
//! cores to use.
//!
//! `cargo bench --bench relay_drain` (env: ROWS=200000, BATCH=…, IN_FLIGHT=…, KEYS=1000,
//! PG_DELAY_MS=0; ONLY_RELAYS=N runs just the N-relay drain three times, to compare two
//! builds; ONLY_EXACTLY_ONCE=1 runs idempotent and exactly-once drains in PAIRS=3 pairs);
//! smoke size under cargo test (through a 1 ms proxy). The full run also prints the
//! exactly-once relay (`relay_drain_exactly_once`) next to the idempotent one, and Avro and
//! Protobuf topics (`relay_drain_formats`, rows encoded through the schema registry) next to
//! plain JSON; ONLY_FORMATS=1 runs just those, three rounds. The full run and ONLY_EXACTLY_ONCE
//! end with what an idle relay costs (`relay_idle_cpu`), idempotent and exactly-once. Ring
//! storage (`relay_drain_ring`) is drained next to the table in the full run; ONLY_RING=1
//! runs PAIRS=3 pairs of the two, with Kafka alone measured once before them. Tracing's cost
//! (`relay_drain_tracing`): rows written by a traced service drained with no tracer provider,
//! and exporting to Jaeger (`dev/jaeger.sh`) at 1 % and 100 % sampling, as ratios to off; in
//! the full run once, ONLY_TRACING=1 runs ROUNDS=3 rounds of just that.

#[path = "support/mod.rs"]
mod support;

#[path = "support/delay.rs"]
mod delay;

use std::sync::Arc;
use std::time::Instant;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use support::*;

/// One relay setup to measure.
#[derive(Clone, Copy)]
struct Setup {
    relays: usize,
    in_flight: usize,
    analyze: bool,
    exactly_once: bool,
    /// The topic's payload format (rows encoded through the registry unless plain JSON).
    format: outbox::schemas::Format,
    /// Append-only ring storage (`outbox::storage::use_ring`) instead of the table.
    ring: bool,
    /// Rows carry a `traceparent`, sampled on this fraction of them (a traced service wrote
    /// them); the spans' cost is measured with it.
    traced: Option<f64>,
}

async fn drain_with(s: Setup, rows: usize, batch: usize, keys: usize) -> serde_json::Value {
    let db = fresh_db().await;
    if s.ring {
        outbox::storage::use_ring(&db, outbox::storage::MoveOptions::default())
            .await
            .unwrap();
    }
    let topic = format!("bench.{}.created", rand_name(8));
    create_topic(&topic, 6).await;
    let schemas = bench_schemas(&topic, s.format).await;
    let cfg = {
        let mut c = outbox::RelayConfig::default();
        c.schemas = schemas;
        c.batch_size = batch;
        c.in_flight_batches = s.in_flight;
        if s.exactly_once {
            let mut eo = outbox::ExactlyOnce::default();
            eo.progress_topic = format!("{topic}.progress");
            c.exactly_once = Some(eo);
        }
        c.cleanup = {
            let mut cc = outbox::CleanupConfig::default();
            cc.interval = None;
            cc
        };
        c
    };
    let rs: Vec<Arc<outbox::Relay>> = (0..s.relays)
        .map(|_| Arc::new(outbox::Relay::new(&db, &kafka(), cfg.clone()).unwrap()))
        .collect();
    if s.exactly_once {
        // The broker's transaction coordinator and the progress topic exist before the clock
        // starts (a throwaway relay's first pass on an empty schema creates them); the
        // measured relay still fences its own slots in at its first pass.
        let warm = fresh_db().await;
        let w = outbox::Relay::new(&warm, &kafka(), cfg.clone()).unwrap();
        w.run_once().await.unwrap();
        drop(w);
        drop_schema(&warm).await;
    }
    // Converge the ordering lanes (each relay its share) before the clock starts, and let
    // each relay make its first pass on the empty outbox: its producer's id is fetched (and,
    // exactly-once, its slots fenced in and recovered), once per process, not per row.
    for _ in 0..2 {
        for r in &rs {
            r.rebalance().await;
        }
    }
    for r in &rs {
        r.run_once().await.unwrap();
    }
    fill_outbox_traced(&db, &topic, rows, keys, s.analyze, s.traced).await;
    // The filling connection's backend exits after its client is dropped; counted before
    // that, its CPU time would leave the sum between the two readings.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let tasks: Vec<_> = rs
        .iter()
        .map(|r| {
            let r = r.clone();
            tokio::spawn(async move {
                let mut sent = 0usize;
                while let outbox::Outcome::Published(b) = r.run_pipeline().await.unwrap() {
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
    // Read before any relay is dropped: a closed connection's backend takes its CPU time along.
    let cpu = cpu_seconds().since(&cpu_before);
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
        while let outbox::Outcome::Published(b) = first.run_pipeline().await.unwrap() {
            sent += b.sent;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(sent, rows, "every row sent");
    drop_schema(&db).await;
    delete_topic(&topic).await;
    if s.exactly_once {
        delete_topic(&format!("{topic}.progress")).await;
    }
    serde_json::json!({
        "relays": s.relays,
        "storage": if s.ring { "ring" } else { "table" },
        "exactly_once": s.exactly_once,
        "format": format_name(s.format),
        "in_flight_batches": s.in_flight,
        "rows": rows,
        "statistics": if s.analyze { "analyzed" } else { "never analyzed" },
        "seconds": round2(secs),
        "msgs_per_sec": (rows as f64 / secs).round(),
        // Where the machine's CPU went during the drain, and how busy its cores were.
        // `proxy`: the delaying proxy (PG_DELAY_MS), counted in cores_busy (the machine did
        // that work) but not in the relays' CPU per message.
        "cpu_seconds": {"postgres": round2(cpu.postgres), "kafka": round2(cpu.kafka), "relay": round2(cpu.relay), "proxy": round2(cpu.proxy), "jaeger": round2(cpu.jaeger)},
        "cores_busy": round2((cpu.postgres + cpu.kafka + cpu.relay + cpu.proxy + cpu.jaeger) / cpu.wall),
        "cpu_us_per_msg": round2((cpu.postgres + cpu.kafka + cpu.relay) * 1e6 / rows as f64),
    })
}

/// The delaying proxy's thread (`PG_DELAY_MS`), whose CPU time is not the relay's.
static PROXY_THREAD: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// [`support::cpu_seconds`], with the delaying proxy's thread (in this process) counted apart
/// from the relays.
fn cpu_seconds() -> Cpu {
    let mut cpu = support::cpu_seconds();
    let ticks = |stat: &str| -> Option<f64> {
        let (_, tail) = stat.rsplit_once(')')?;
        let f: Vec<&str> = tail.split_whitespace().collect();
        Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / 100.0)
    };
    if let Some(tid) = PROXY_THREAD.get() {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok();
        if let Some(secs) = stat.as_deref().and_then(ticks) {
            cpu.proxy = secs;
            cpu.relay -= secs;
        }
    }
    cpu
}

/// Postgres alone: the relay's claim (the plain walk it uses when nothing is backed off) and
/// mark, batch after batch on one connection, from just past the previous batch.
async fn postgres_ceiling(rows: usize, batch: usize, keys: usize) -> f64 {
    let db = fresh_db().await;
    fill_outbox_stats(&db, "bench.ceiling", rows, keys, true).await;
    let stmts: std::collections::HashMap<_, _> = outbox::testing::hot_statements(&db.schema)
        .into_iter()
        .collect();
    let mut c = outbox::connect(&db).await.unwrap();
    let claim = c.prepare(&stmts["claim_free"]).await.unwrap();
    let mark = c.prepare(&stmts["mark_sent"]).await.unwrap();
    let lanes: Vec<i32> = (0..outbox::testing::LANES).collect();
    let (mut from, mut done) = (0i64, 0usize);
    let started = Instant::now();
    loop {
        let tx = c.transaction().await.unwrap();
        let claimed = tx
            .query(&claim, &[&(batch as i64), &lanes, &from])
            .await
            .unwrap();
        if claimed.is_empty() {
            break;
        }
        // Decoded as the relay decodes them.
        let ids: Vec<i64> = claimed
            .iter()
            .map(|r| {
                let _: (String, Option<String>, String, String, f64) =
                    (r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
                r.get(0)
            })
            .collect();
        tx.execute(&mark, &[&ids]).await.unwrap();
        tx.commit().await.unwrap();
        from = ids.last().unwrap() + 1;
        done += ids.len();
    }
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(done, rows);
    drop_schema(&db).await;
    rows as f64 / secs
}

/// Kafka alone: the same records, produced all at once by a producer set up like the relay's.
async fn kafka_ceiling(rows: usize, keys: usize) -> f64 {
    let db = fresh_db().await;
    let topic = format!("bench.{}.created", rand_name(8));
    create_topic(&topic, 6).await;
    fill_outbox_stats(&db, &topic, rows, keys, true).await;
    let c = outbox::connect(&db).await.unwrap();
    let records: Vec<(String, String, String)> = c
        .query(
            &format!(
                "SELECT message_key, headers::text, payload::text FROM {}.outbox ORDER BY id",
                db.schema.quoted()
            ),
            &[],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "0")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "200000")
        .create()
        .unwrap();
    let started = Instant::now();
    let mut deliveries = Vec::with_capacity(rows);
    for (key, headers, payload) in &records {
        let map: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(headers).unwrap();
        let mut h = OwnedHeaders::new_with_capacity(map.len());
        for (k, v) in &map {
            h = h.insert(Header {
                key: k,
                value: Some(v.as_str().unwrap_or_default().as_bytes()),
            });
        }
        let mut record = FutureRecord::to(&topic)
            .key(key.as_bytes())
            .payload(payload.as_bytes())
            .headers(h);
        loop {
            match producer.send_result(record) {
                Ok(d) => {
                    deliveries.push(d);
                    break;
                }
                Err((_, back)) => {
                    record = back;
                    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                }
            }
        }
    }
    for d in futures::future::join_all(deliveries).await {
        d.unwrap().unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    drop_schema(&db).await;
    delete_topic(&topic).await;
    rows as f64 / secs
}

/// What one relay costs while nothing is pending: this process's CPU (the relay's tasks and
/// its producers' threads) and Postgres's, over `secs` of `Relay::run` on an empty outbox after
/// its first passes, as a share of one core. Exactly-once keeps a producer per slot (four).
async fn idle_cpu(exactly_once: bool, secs: f64) -> serde_json::Value {
    let db = fresh_db().await;
    let topic = format!("bench.{}.idle", rand_name(8));
    let cfg = {
        let mut c = outbox::RelayConfig::default();
        if exactly_once {
            let mut eo = outbox::ExactlyOnce::default();
            eo.progress_topic = format!("{topic}.progress");
            c.exactly_once = Some(eo);
        }
        c
    };
    let relay = outbox::Relay::new(&db, &kafka(), cfg).unwrap();
    // Its slots fenced in and recovered, its lanes taken: what it costs from then on.
    for _ in 0..2 {
        relay.rebalance().await;
    }
    relay.run_once().await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(async move {
        let _ = stopped.await;
    }));
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let before = cpu_seconds();
    tokio::time::sleep(std::time::Duration::from_secs_f64(secs)).await;
    let cpu = cpu_seconds().since(&before);
    let _ = stop.send(());
    running.await.unwrap().unwrap();
    drop_schema(&db).await;
    if exactly_once {
        delete_topic(&format!("{topic}.progress")).await;
    }
    serde_json::json!({
        "relay_percent_of_a_core": round2(cpu.relay * 100.0 / cpu.wall),
        "postgres_percent_of_a_core": round2(cpu.postgres * 100.0 / cpu.wall),
    })
}

/// Idle cost of an idempotent and an exactly-once relay, side by side.
async fn idle_pair(params: &serde_json::Value) {
    let secs = if full() { 10.0 } else { 1.0 };
    let one = idle_cpu(false, secs).await;
    let eo = idle_cpu(true, secs).await;
    emit(
        "relay_idle_cpu",
        params.clone(),
        serde_json::json!({"seconds": secs, "idempotent": one, "exactly_once": eo}),
    );
}

/// An unmeasured idempotent and exactly-once drain of a fifth of the backlog each, before the
/// measured ones: a broker that has served no transactions yet spends the first exactly-once
/// drains JIT-compiling its transaction paths (seen as ~100 new C2 compilations and 0.4 s of
/// compiler-thread CPU per drain, new methods each time, on a broker that had already served
/// thousands of idempotent batches), a cost a broker in service has long paid.
async fn warm_up(depth: usize, rows: usize, batch: usize, keys: usize) {
    let rows = (rows / 5).max(1);
    for exactly_once in [false, true] {
        let setup = Setup {
            exactly_once,
            ..analyzed_setup(1, depth)
        };
        drain_with(setup, rows, batch, keys).await;
    }
}

/// The machine's cores.
fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

/// `relays` relays, `in_flight` batches each, on an analyzed backlog.
fn analyzed_setup(relays: usize, in_flight: usize) -> Setup {
    Setup {
        relays,
        in_flight,
        analyze: true,
        exactly_once: false,
        format: outbox::schemas::Format::Json,
        ring: false,
        traced: None,
    }
}

/// What tracing costs the drain: rows written by a traced service (each with a
/// `traceparent`), drained with no tracer provider (tracing compiled in, off), and exporting
/// to Jaeger at 1 % and at 100 % sampling, `rounds` times, the order rotating each round.
async fn tracing_cost(
    rounds: usize,
    depth: usize,
    rows: usize,
    batch: usize,
    keys: usize,
    params: &serde_json::Value,
) {
    let modes = TRACING_MODES;
    // Each mode's rate in every round: the summary's medians damp the shared machine's swings
    // (one round's ratio moves ±10 % with whatever else ran meanwhile).
    let mut rates: std::collections::HashMap<&str, Vec<f64>> = std::collections::HashMap::new();
    for round in 0..rounds {
        let mut got = std::collections::HashMap::new();
        for i in 0..3 {
            let (name, ratio) = modes[(round + i) % 3];
            let setup = Setup {
                traced: Some(ratio.unwrap_or(1.0)),
                ..analyzed_setup(1, depth)
            };
            let guard = tracing_at(ratio);
            let r = drain_with(setup, rows, batch, keys).await;
            // The flush of what is queued is part of the cost, not of the next drain.
            let spans = tracing_off(guard);
            rates.entry(name).or_default().push(rate(&r));
            got.insert(
                name,
                (
                    rate(&r),
                    r["cpu_seconds"].clone(),
                    r["cores_busy"].clone(),
                    spans,
                ),
            );
        }
        emit(
            "relay_drain_tracing",
            params.clone(),
            serde_json::json!({
                "off_msgs_per_sec": got["off"].0,
                "sampled_1pct_msgs_per_sec": got["1%"].0,
                "sampled_100pct_msgs_per_sec": got["100%"].0,
                "ratio_1pct_to_off": round2(got["1%"].0 / got["off"].0),
                "ratio_100pct_to_off": round2(got["100%"].0 / got["off"].0),
                "first": modes[round % 3].0,
                "exporter": "OTLP/HTTP to Jaeger (dev/jaeger.sh), on the same 2 cores",
                // Where the machine's CPU went in each mode, Jaeger's ingestion included.
                "cpu_seconds_off_1pct_100pct": [got["off"].1, got["1%"].1, got["100%"].1],
                "cores_busy_off_1pct_100pct": [got["off"].2, got["1%"].2, got["100%"].2],
                // Spans recorded and accepted by Jaeger (a full queue drops spans, never waits).
                "spans_1pct_100pct": [got["1%"].3, got["100%"].3],
            }),
        );
    }
    if rounds > 1 {
        let of = |mode: &str| median(rates[mode].clone());
        let off = of("off");
        emit(
            "relay_drain_tracing_medians",
            params.clone(),
            serde_json::json!({
                "rounds": rounds,
                "off_msgs_per_sec": off,
                "ratio_1pct_to_off": round2(of("1%") / off),
                "ratio_100pct_to_off": round2(of("100%") / off),
            }),
        );
    }
}

/// Plain JSON, Avro and Protobuf drains of the same backlog, one after another, `rounds`
/// times: each schema format's throughput as a ratio to JSON's in the same round.
async fn formats(
    rounds: usize,
    depth: usize,
    rows: usize,
    batch: usize,
    keys: usize,
    params: &serde_json::Value,
) {
    for round in 0..rounds {
        // Each round starts with another format: whatever the drains before leave behind
        // (WAL to checkpoint, dead tuples to vacuum) does not always land on the same one.
        let mut by: Vec<(&str, serde_json::Value)> = FORMATS
            .iter()
            .map(|f| (format_name(*f), serde_json::Value::Null))
            .collect();
        for i in 0..FORMATS.len() {
            let k = (round + i) % FORMATS.len();
            let r = drain_with(
                Setup {
                    format: FORMATS[k],
                    ..analyzed_setup(1, depth)
                },
                rows,
                batch,
                keys,
            )
            .await;
            emit("relay_drain", params.clone(), r.clone());
            by[k].1 = r;
        }
        let json = rate(&by[0].1);
        emit(
            "relay_drain_formats",
            params.clone(),
            serde_json::json!({
                "json_msgs_per_sec": json,
                "avro_msgs_per_sec": rate(&by[1].1),
                "protobuf_msgs_per_sec": rate(&by[2].1),
                "avro_to_json": round2(rate(&by[1].1) / json),
                "protobuf_to_json": round2(rate(&by[2].1) / json),
                "cpu_us_per_msg_json_avro_protobuf": [by[0].1["cpu_us_per_msg"], by[1].1["cpu_us_per_msg"], by[2].1["cpu_us_per_msg"]],
            }),
        );
    }
}

fn rate(v: &serde_json::Value) -> f64 {
    v["msgs_per_sec"].as_f64().unwrap()
}

#[tokio::main]
async fn main() {
    let rows = param("ROWS", if full() { 200_000 } else { 2_000 });
    let batch = param("BATCH", outbox::RelayConfig::DEFAULT_BATCH_SIZE);
    let depth = param("IN_FLIGHT", outbox::RelayConfig::DEFAULT_IN_FLIGHT_BATCHES);
    // Distinct keys: the per-key check costs one index probe per distinct key in a batch, so
    // KEYS=ROWS (a key per message, e.g. entity ids) is its worst case.
    let keys = param("KEYS", 1000);
    // A network between the relay and Postgres: PG_DELAY_MS each way, through a delaying proxy
    // (the smoke run goes through it, so the proxy is exercised too).
    let pg_delay_ms = param("PG_DELAY_MS", if full() { 0 } else { 1 });
    if pg_delay_ms > 0 {
        let url = database_url();
        let (head, rest) = url
            .rsplit_once('@')
            .expect("DATABASE_URL has user@host:port");
        let (hostport, tail) = rest.split_once('/').expect("DATABASE_URL has /database");
        let upstream = std::net::ToSocketAddrs::to_socket_addrs(hostport)
            .expect("DATABASE_URL's host:port resolves")
            .find(std::net::SocketAddr::is_ipv4)
            .expect(
                "DATABASE_URL's host has an IPv4 address (dev/postgres.sh listens on 127.0.0.1)",
            );
        let (proxy, tid) = delay::start(
            upstream,
            std::time::Duration::from_millis(pg_delay_ms as u64),
        );
        if let Some(tid) = tid {
            PROXY_THREAD.set(tid).unwrap();
        }
        // Set before any other thread reads the environment.
        std::env::set_var("DATABASE_URL", format!("{head}@{proxy}/{tail}"));
    }
    let params = serde_json::json!({"rows": rows, "keys": keys, "partitions": 6, "batch": batch, "pg_delay_ms": pg_delay_ms});

    // A/B between two builds: only the drain of N relays, three times (each line one drain).
    if let Some(n) = std::env::var("ONLY_RELAYS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        assert!(n > 0, "ONLY_RELAYS must be at least 1");
        for _ in 0..3 {
            let setup = analyzed_setup(n, depth);
            emit(
                "relay_drain",
                params.clone(),
                drain_with(setup, rows, batch, keys).await,
            );
        }
        return;
    }
    // Ring storage against the table, PAIRS (default 3) pairs, alternating which goes first,
    // with Kafka alone (the same records, all in flight) measured once before them: the ring
    // drops the per-row lock and UPDATE, and this shows how near that leaves it to producing.
    if std::env::var("ONLY_RING").is_ok() {
        let kafka = kafka_ceiling(rows, keys).await;
        let ring_setup = Setup {
            ring: true,
            ..analyzed_setup(1, depth)
        };
        for pair in 0..param("PAIRS", 3) {
            let (table, ring) = if pair % 2 == 0 {
                let t = drain_with(analyzed_setup(1, depth), rows, batch, keys).await;
                (t, drain_with(ring_setup, rows, batch, keys).await)
            } else {
                let r = drain_with(ring_setup, rows, batch, keys).await;
                (
                    drain_with(analyzed_setup(1, depth), rows, batch, keys).await,
                    r,
                )
            };
            emit(
                "relay_drain_ring",
                params.clone(),
                serde_json::json!({
                    "table_msgs_per_sec": rate(&table),
                    "ring_msgs_per_sec": rate(&ring),
                    "ring_to_table": round2(rate(&ring) / rate(&table)),
                    "kafka_alone_msgs_per_sec": kafka.round(),
                    "ring_to_kafka_alone": round2(rate(&ring) / kafka),
                    "table_to_kafka_alone": round2(rate(&table) / kafka),
                    "first": if pair % 2 == 0 { "table" } else { "ring" },
                    "cpu_seconds_table_ring": [table["cpu_seconds"], ring["cpu_seconds"]],
                    "cores_busy_table_ring": [table["cores_busy"], ring["cores_busy"]],
                }),
            );
        }
        return;
    }
    // Tracing's cost only: off, 1 % and 100 % sampling exporting to Jaeger, ROUNDS rounds.
    if std::env::var("ONLY_TRACING").is_ok() {
        tracing_cost(param("ROUNDS", 3), depth, rows, batch, keys, &params).await;
        return;
    }
    // Schema formats against plain JSON only, three rounds.
    if std::env::var("ONLY_FORMATS").is_ok() {
        formats(3, depth, rows, batch, keys, &params).await;
        return;
    }
    // Exactly-once against idempotent only, PAIRS (default 3) pairs back to back, each pair in
    // one run; the pairs alternate which drain goes first (what the drain before leaves behind
    // — WAL to checkpoint, dead tuples, a topic being deleted — then lands on both alike).
    if std::env::var("ONLY_EXACTLY_ONCE").is_ok() {
        let eo_setup = Setup {
            exactly_once: true,
            ..analyzed_setup(1, depth)
        };
        warm_up(depth, rows, batch, keys).await;
        for pair in 0..param("PAIRS", 3) {
            let (one, eo) = if pair % 2 == 0 {
                let one = drain_with(analyzed_setup(1, depth), rows, batch, keys).await;
                (one, drain_with(eo_setup, rows, batch, keys).await)
            } else {
                let eo = drain_with(eo_setup, rows, batch, keys).await;
                (
                    drain_with(analyzed_setup(1, depth), rows, batch, keys).await,
                    eo,
                )
            };
            emit(
                "relay_drain_exactly_once",
                params.clone(),
                serde_json::json!({
                    "idempotent_msgs_per_sec": rate(&one),
                    "exactly_once_msgs_per_sec": rate(&eo),
                    "exactly_once_to_idempotent": round2(rate(&eo) / rate(&one)),
                    "first": if pair % 2 == 0 { "idempotent" } else { "exactly_once" },
                    "cpu_us_per_msg_idempotent_exactly_once": [one["cpu_us_per_msg"], eo["cpu_us_per_msg"]],
                    "cpu_seconds_idempotent_exactly_once": [one["cpu_seconds"], eo["cpu_seconds"]],
                    "cores_busy_idempotent_exactly_once": [one["cores_busy"], eo["cores_busy"]],
                }),
            );
        }
        idle_pair(&params).await;
        return;
    }
    // The ceilings, then the relay in the same run.
    let pg = postgres_ceiling(rows, batch, keys).await;
    let kafka = kafka_ceiling(rows, keys).await;
    let ceiling = pg.min(kafka);
    let analyzed = analyzed_setup;
    let one = drain_with(analyzed(1, depth), rows, batch, keys).await;
    let serial = drain_with(analyzed(1, 1), rows, batch, keys).await;
    let two = drain_with(analyzed(2, depth), rows, batch, keys).await;
    // Two relays where one leaves cores idle (one batch at a time each): how the work splits
    // when the machine has room, apart from this machine's 2-core cap.
    let two_serial = drain_with(analyzed(2, 1), rows, batch, keys).await;
    emit(
        "relay_drain_ceiling",
        params.clone(),
        serde_json::json!({
            "postgres_alone_rows_per_sec": pg.round(),
            "kafka_alone_msgs_per_sec": kafka.round(),
            "relay_msgs_per_sec": rate(&one),
            "relay_to_ceiling": round2(rate(&one) / ceiling),
            "one_batch_at_a_time_msgs_per_sec": rate(&serial),
            "one_batch_at_a_time_to_ceiling": round2(rate(&serial) / ceiling),
            "pipelined_to_one_batch_at_a_time": round2(rate(&one) / rate(&serial)),
        }),
    );
    for r in [&one, &two, &serial, &two_serial] {
        emit("relay_drain", params.clone(), r.clone());
    }
    emit(
        "relay_drain_two_relays",
        params.clone(),
        serde_json::json!({
            "one_relay_msgs_per_sec": rate(&one),
            "two_relays_msgs_per_sec": rate(&two),
            "two_to_one": round2(rate(&two) / rate(&one)),
            "two_relays_to_ceiling": round2(rate(&two) / ceiling),
            "cores_busy_one_two": [one["cores_busy"], two["cores_busy"]],
            // Machine CPU (Postgres + broker + relays) per message sent, in µs: a second relay
            // adds no work per message, it only adds hands.
            "cpu_us_per_msg_one_two": [one["cpu_us_per_msg"], two["cpu_us_per_msg"]],
            // The most two relays could reach here if they used every core at one relay's CPU
            // per message: cores / the cores one relay keeps busy. Below 1.3 the 1.3× target is
            // out of this machine's reach in this run, whatever the relays do.
            "two_to_one_bound": round2(cores() / one["cores_busy"].as_f64().unwrap()),
            "one_batch_at_a_time_two_to_one": round2(rate(&two_serial) / rate(&serial)),
        }),
    );
    // Ring storage (no per-row lock, UPDATE or DELETE) next to the table, same backlog.
    let ring = drain_with(
        Setup {
            ring: true,
            ..analyzed(1, depth)
        },
        rows,
        batch,
        keys,
    )
    .await;
    emit(
        "relay_drain_ring",
        params.clone(),
        serde_json::json!({
            "table_msgs_per_sec": rate(&one),
            "ring_msgs_per_sec": rate(&ring),
            "ring_to_table": round2(rate(&ring) / rate(&one)),
            "kafka_alone_msgs_per_sec": kafka.round(),
            "ring_to_kafka_alone": round2(rate(&ring) / kafka),
            "table_to_kafka_alone": round2(rate(&one) / kafka),
        }),
    );
    // Exactly-once next to idempotent, same backlog, back to back after a warm-up of both.
    warm_up(depth, rows, batch, keys).await;
    let idempotent = drain_with(analyzed(1, depth), rows, batch, keys).await;
    let exactly = drain_with(
        Setup {
            exactly_once: true,
            ..analyzed(1, depth)
        },
        rows,
        batch,
        keys,
    )
    .await;
    emit("relay_drain", params.clone(), exactly.clone());
    emit(
        "relay_drain_exactly_once",
        params.clone(),
        serde_json::json!({
            "idempotent_msgs_per_sec": rate(&idempotent),
            "exactly_once_msgs_per_sec": rate(&exactly),
            "exactly_once_to_idempotent": round2(rate(&exactly) / rate(&idempotent)),
            "exactly_once_to_ceiling": round2(rate(&exactly) / ceiling),
        }),
    );
    idle_pair(&params).await;
    // Avro and Protobuf (encoded through the registry) next to plain JSON, same backlog.
    formats(1, depth, rows, batch, keys, &params).await;
    // The user's situation after an outage or a bulk import: a backlog the planner has no
    // statistics for, next to the same backlog analyzed, measured in the same run.
    let stale = drain_with(
        Setup {
            analyze: false,
            ..analyzed(1, depth)
        },
        rows,
        batch,
        keys,
    )
    .await;
    tracing_cost(1, depth, rows, batch, keys, &params).await;
    emit(
        "relay_drain_stale_statistics",
        params,
        serde_json::json!({
            "analyzed_msgs_per_sec": rate(&one),
            "never_analyzed_msgs_per_sec": rate(&stale),
            "stale_to_analyzed": round2(rate(&stale) / rate(&one)),
        }),
    );
}
