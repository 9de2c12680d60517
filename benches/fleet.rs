//! One relay for many outboxes (`outbox::fleet`): T tenants holding R rows each drained by one
//! fleet, against one schema holding the same T × R rows drained by one plain relay in the same
//! run → the fleet's throughput as a ratio to the plain relay's, and the most Postgres sessions
//! the fleet held (its budget is the ceiling it must stay under).
//!
//! `cargo bench --bench fleet` (env: TENANTS=200, ROWS=500 per tenant, BUDGET=32, PASSES=4
//! (`--fleet-passes`), LINGER_MS (both sides' producers; unset: each side's default, a relay's
//! 0 ms and a fleet's 1), FLEET_LINGER_MS (the fleet's alone), PLAIN_BATCH (the plain relay's
//! batch size), PAIRS=2:
//! fleet and plain relay alternate which goes first (FIRST=plain: the plain relay in the first
//! pair), SIDE=fleet|plain: that side alone, no
//! line printed, for a profiler to watch (`<side>: drain starts` and `<side>: drained` on
//! stderr bracket the drain, e.g. to reset and read `pg_stat_statements` around it), EXACTLY_ONCE=1: both sides in exactly-once mode,
//! where each tenant's relay has a transactional producer per slot it owns); smoke size
//! under cargo test. The threads and resident memory each side added to this process (the
//! relays) by the end of its drain are printed too, and the cores each side keeps busy in
//! Postgres and in this process while it then sits idle for IDLE_SECS (10) with nothing to
//! send (`idle_cores`: its polls, gauges and heartbeats). Then the same rows again, written in
//! one transaction while the side runs (`burst_fleet_to_plain`): the throughput of a fleet
//! already running, whose sessions have met every tenant, beside the drain after its start.
//! `autovacuum_runs`: the autovacuums and autoanalyzes that ran beside each side's drain
//! (the database is vacuumed and analyzed before each side, so these are the drain's own).

#[path = "support/mod.rs"]
mod support;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use support::*;

/// Sessions the server holds to the dev database, except this bench's own observer.
async fn sessions(c: &tokio_postgres::Client) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

fn relay_config(exactly_once: Option<&str>) -> outbox::RelayConfig {
    let mut c = outbox::RelayConfig::default();
    c.cleanup.interval = None;
    if let Some(topic) = exactly_once {
        let mut eo = outbox::ExactlyOnce::default();
        eo.progress_topic = format!("{topic}.progress");
        eo.transactional_id_prefix = format!("bench-{}", rand_name(8));
        c.exactly_once = Some(eo);
    }
    c
}

/// This process's threads and resident MiB.
fn process_size() -> (i64, f64) {
    let field = |name| proc_status("self", name).unwrap_or(0);
    (field("Threads:") as i64, field("VmRSS:") as f64 / 1024.0)
}

/// What a drain took.
struct Drained {
    /// From start to the last record.
    secs: f64,
    /// From start to the first record: the relay (or the fleet and its relays) starting.
    first_secs: f64,
    /// The most sessions seen meanwhile.
    peak: i64,
    /// CPU used meanwhile by Postgres, Kafka and this process (the relays).
    cpu: Cpu,
    /// Threads this process gained from the side's start to the end of its drain (librdkafka
    /// runs threads per client), and resident MiB it gained.
    threads: i64,
    rss_mib: f64,
    /// Advisory locks held on the server at the end (lane and member locks: the lock table
    /// every look at `pg_locks` copies and every commit on the lock session walks).
    locks: i64,
    /// Autovacuums and autoanalyzes of the database's tables that ran during the drain.
    autovacuums: i64,
    /// CPU used while the side sat idle after its drain (nothing to send): what its polling,
    /// gauges and heartbeats cost.
    idle: Cpu,
    /// Seconds from the commit of a second backlog of the same rows, written in one
    /// transaction once the side had drained and sat idle, to its last record: the side's
    /// throughput once running (sessions, statements and plans warm), beside the cold drain.
    burst_secs: f64,
}

/// Lets the drained side sit idle for `secs` and returns the CPU used meanwhile.
async fn idle_cost(secs: u64) -> Cpu {
    let before = cpu_seconds();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    cpu_seconds().since(&before)
}

/// Writes `rows` more rows into each of `schemas` (a tenant's, or the one schema) in one
/// transaction, after the `total` already sent, and returns how long after its commit `topic`
/// held them all.
async fn burst(
    schemas: &[&outbox::DbConfig],
    topic: &str,
    rows: usize,
    total: i64,
    observer: &tokio_postgres::Client,
) -> f64 {
    // Each side's drain left its rows marked sent: vacuumed and analyzed now on both sides,
    // so an autovacuum of them does not fall into one side's burst and not the other's. The
    // burst then meets statistics of an idle outbox (nothing pending), as after an
    // autovacuum in production: the plain relay's per-key check misplanned in that state,
    // 12,000 – 16,000 msg/s instead of 36,000 – 43,000 (BENCHMARKS_HISTORY round 26).
    settle(observer).await;
    let mut c = outbox::connect(schemas[0]).await.unwrap();
    let tx = c.transaction().await.unwrap();
    for db in schemas {
        insert_rows(
            &tx,
            &db.schema.quoted(),
            topic,
            rows,
            rows,
            1000usize.min(rows),
            "",
        )
        .await;
    }
    let before = autovacuum_runs(observer).await;
    tx.commit().await.unwrap();
    let added = (rows * schemas.len()) as i64;
    let start = Started {
        at: Instant::now(),
        size: process_size(),
        autovacuums: before,
    };
    drained(topic, total + added, observer, start).await.secs
}

/// Vacuums the database (catalogs included) and checkpoints before a side starts, so no
/// autovacuum of what its setup created (a tenant's schema is some 40 catalog rows) runs
/// beside its drain, and a checkpoint the fills asked for (gigabytes of WAL) falls on
/// neither side's drain; after it, both sides pay the same full-page writes.
/// (Full size only: the smoke run shares the database with the test suite's schemas.)
async fn settle(observer: &tokio_postgres::Client) {
    if full() {
        // Two statements: a multi-statement string is one implicit transaction, and VACUUM
        // refuses to run inside one. ANALYZE too: the fill left every outbox it wrote due
        // for an autoanalyze (200 on the fleet's side, one on the plain relay's), and the
        // side before left its drained outboxes due for both; the autovacuum launcher
        // visits the database once a minute, so without this they fell at random into one
        // side's drain or the other's (`autovacuum_runs`: 243 beside a fleet's drain, 203
        // beside a plain relay's, 0 in other pairs; BENCHMARKS_HISTORY round 25).
        observer.batch_execute("VACUUM ANALYZE").await.unwrap();
        observer.batch_execute("CHECKPOINT").await.unwrap();
    }
}

/// What a side's clock starts from: when, this process's size, and each table's autovacuums.
struct Started {
    at: Instant,
    size: (i64, f64),
    autovacuums: HashMap<u32, i64>,
}

/// Starts a side's clock. The autovacuum counts are read first: a look at every table's
/// statistics takes a while on a database holding hundreds of schemas.
async fn started(observer: &tokio_postgres::Client, size: (i64, f64)) -> Started {
    let autovacuums = autovacuum_runs(observer).await;
    Started {
        at: Instant::now(),
        size,
        autovacuums,
    }
}

/// Autovacuums and autoanalyzes each table of the database has had so far.
async fn autovacuum_runs(c: &tokio_postgres::Client) -> HashMap<u32, i64> {
    c.query(
        "SELECT relid, autovacuum_count + autoanalyze_count FROM pg_stat_all_tables",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// Waits until `topic` holds `n` records.
async fn drained(
    topic: &str,
    n: i64,
    observer: &tokio_postgres::Client,
    start: Started,
) -> Drained {
    let Started {
        at: start,
        size: size_before,
        autovacuums: autovacuums_before,
    } = start;
    let mut peak = 0;
    let mut first_secs = None;
    let counter = outbox_testkit::TopicCounter::new(topic).await;
    let cpu_before = cpu_seconds();
    loop {
        peak = peak.max(sessions(observer).await);
        let len = counter.records().await;
        if len > 0 && first_secs.is_none() {
            first_secs = Some(start.elapsed().as_secs_f64());
        }
        if len >= n {
            let secs = start.elapsed().as_secs_f64();
            let cpu = cpu_seconds().since(&cpu_before);
            // Per table: a table dropped meanwhile takes its counts with it.
            let autovacuums = autovacuum_runs(observer)
                .await
                .iter()
                .map(|(t, n)| n - autovacuums_before.get(t).copied().unwrap_or(0))
                .sum();
            let locks = observer
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            let (threads, rss_mib) = process_size();
            let (threads, rss_mib) = (threads - size_before.0, rss_mib - size_before.1);
            return Drained {
                secs,
                first_secs: first_secs.unwrap_or(secs),
                peak,
                cpu,
                threads,
                rss_mib,
                locks,
                autovacuums,
                idle: Cpu::default(),
                burst_secs: 0.0,
            };
        }
        assert!(start.elapsed() < Duration::from_secs(1800), "not drained");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main]
async fn main() {
    let tenants = param("TENANTS", if full() { 200 } else { 5 });
    let rows = param("ROWS", if full() { 500 } else { 50 });
    let budget = param("BUDGET", 32);
    let passes = param("PASSES", outbox::fleet::FleetConfig::DEFAULT_PASSES);
    // linger.ms for both sides' producers; unset: each side's default (a relay's 0, a
    // fleet's `FleetConfig::DEFAULT_LINGER_MS`).
    let optional = |name: &str| {
        std::env::var(name)
            .ok()
            .map(|v| v.parse::<usize>().unwrap())
    };
    let linger = optional("LINGER_MS");
    // linger.ms for the fleet's producer only (FLEET_LINGER_MS), else LINGER_MS.
    let fleet_linger = optional("FLEET_LINGER_MS").or(linger);
    let kafka_with = |linger: Option<usize>| {
        let mut k = kafka();
        if let Some(l) = linger {
            k.set_from_pair(&format!("linger.ms={l}")).unwrap();
        }
        k
    };
    let kafka = || kafka_with(linger);
    let pairs = param("PAIRS", if full() { 2 } else { 1 });
    let exactly_once = param("EXACTLY_ONCE", 0) == 1;
    // Seconds each side then sits idle, its CPU measured (what an idle fleet costs).
    let idle_secs = param("IDLE_SECS", if full() { 10 } else { 1 }) as u64;
    let total = (tenants * rows) as i64;
    let observer = outbox::connect(&fresh_db().await).await.unwrap();
    let baseline = sessions(&observer).await;
    // Schemas are dropped at the end: dropping 200 of them between two sides leaves the
    // catalogs to autovacuum during the next side's run.
    let mut dropped = Vec::new();
    for pair in 0..pairs {
        let mut results = BTreeMap::new();
        // FIRST=plain: the plain relay opens the first pair (the default, the fleet).
        let plain_first = std::env::var("FIRST").is_ok_and(|f| f == "plain");
        let order = if (pair % 2 == 0) != plain_first {
            ["fleet", "plain"]
        } else {
            ["plain", "fleet"]
        };
        let side = std::env::var("SIDE").ok();
        for what in order {
            if side.as_deref().is_some_and(|s| s != what) {
                continue;
            }
            let topic = format!("bench.fleet.{}", rand_name(8));
            create_topic(&topic, 6).await;
            if what == "plain" {
                let db = fresh_db().await;
                fill_outbox(&db, &topic, tenants * rows, 1000).await;
                let size_before = process_size();
                settle(&observer).await;
                let mut plain_config = relay_config(exactly_once.then_some(topic.as_str()));
                if let Some(b) = std::env::var("PLAIN_BATCH")
                    .ok()
                    .and_then(|v| v.parse().ok())
                {
                    plain_config.batch_size = b;
                }
                let relay = outbox::Relay::new(&db, &kafka(), plain_config).unwrap();
                let stop = tokio_util::sync::CancellationToken::new();
                if side.is_some() {
                    eprintln!("plain: drain starts");
                }
                let start = started(&observer, size_before).await;
                let run = tokio::spawn(relay.run(stop.clone().cancelled_owned()));
                let mut d = drained(&topic, total, &observer, start).await;
                if side.is_some() {
                    eprintln!("{what}: drained");
                }
                d.idle = idle_cost(idle_secs).await;
                d.burst_secs = burst(&[&db], &topic, tenants * rows, total, &observer).await;
                stop.cancel();
                run.await.unwrap().unwrap();
                dropped.push(db);
                results.insert(what, d);
            } else {
                let control = fresh_db().await;
                let mut schemas = Vec::new();
                for i in 0..tenants {
                    let db = fresh_db().await;
                    fill_outbox(&db, &topic, rows, 1000usize.min(rows)).await;
                    let t =
                        outbox::fleet::Tenant::new(&format!("t{i}"), db.schema.clone()).unwrap();
                    outbox::fleet::put_tenant(&control, &t).await.unwrap();
                    schemas.push(db);
                }
                let mut config = outbox::fleet::FleetConfig::default();
                config.connection_budget = budget;
                config.passes = passes;
                config.relay = relay_config(exactly_once.then_some(topic.as_str()));
                let size_before = process_size();
                settle(&observer).await;
                let fleet =
                    outbox::fleet::Fleet::new(&control, &kafka_with(fleet_linger), config).unwrap();
                let stop = tokio_util::sync::CancellationToken::new();
                if side.is_some() {
                    eprintln!("fleet: drain starts");
                }
                let start = started(&observer, size_before).await;
                let run = tokio::spawn(fleet.run(stop.clone().cancelled_owned()));
                let mut d = drained(&topic, total, &observer, start).await;
                if side.is_some() {
                    eprintln!("{what}: drained");
                }
                d.idle = idle_cost(idle_secs).await;
                let all: Vec<&outbox::DbConfig> = schemas.iter().collect();
                d.burst_secs = burst(&all, &topic, rows, total, &observer).await;
                stop.cancel();
                run.await.unwrap().unwrap();
                dropped.extend(schemas.into_iter().chain([control]));
                results.insert(what, d);
            }
            delete_topic(&topic).await;
            if exactly_once {
                delete_topic(&format!("{topic}.progress")).await;
            }
        }
        if side.is_some() {
            eprintln!(
                "SIDE={side:?}: drained in {:.2} s",
                results.values().map(|d| d.secs).sum::<f64>()
            );
            continue;
        }
        let (fleet, plain) = (&results["fleet"], &results["plain"]);
        // The drain alone: from the first record to the last (each side's start excluded).
        let drain = |d: &Drained| (d.secs - d.first_secs).max(1e-3);
        let per_msg = |secs: f64| round2(secs * 1e6 / total as f64);
        emit(
            "fleet",
            serde_json::json!({"tenants": tenants, "rows_per_tenant": rows, "budget": budget, "passes": passes, "linger_ms": linger, "fleet_linger_ms": fleet_linger, "exactly_once": exactly_once, "pair": pair, "first": order[0]}),
            serde_json::json!({
                "fleet_msgs_per_sec": round2(total as f64 / fleet.secs),
                "plain_relay_msgs_per_sec": round2(total as f64 / plain.secs),
                "fleet_to_plain": round2(plain.secs / fleet.secs),
                "fleet_start_secs": round2(fleet.first_secs),
                "plain_start_secs": round2(plain.first_secs),
                "fleet_drain_to_plain_drain": round2(drain(plain) / drain(fleet)),
                // Running, warm: the same rows again, committed at once after the idle spell.
                "burst_fleet_to_plain": round2(plain.burst_secs / fleet.burst_secs.max(1e-3)),
                "burst_msgs_per_sec": {"fleet": round2(total as f64 / fleet.burst_secs.max(1e-3)), "plain": round2(total as f64 / plain.burst_secs.max(1e-3))},
                // Where the time goes: CPU per message, each side's over the same rows.
                "cpu_us_per_msg": {
                    "fleet": {"machine": per_msg(fleet.cpu.machine), "kafka": per_msg(fleet.cpu.kafka), "relay": per_msg(fleet.cpu.relay)},
                    "plain": {"machine": per_msg(plain.cpu.machine), "kafka": per_msg(plain.cpu.kafka), "relay": per_msg(plain.cpu.relay)},
                },
                "fleet_cpu_to_plain_cpu": round2(fleet.cpu.machine / plain.cpu.machine.max(1e-3)),
                "fleet_peak_sessions": fleet.peak - baseline,
                "plain_peak_sessions": plain.peak - baseline,
                "sessions_to_budget": round2((fleet.peak - baseline) as f64 / budget as f64),
                "fleet_threads": fleet.threads,
                "plain_threads": plain.threads,
                "fleet_rss_mib": round2(fleet.rss_mib),
                "plain_rss_mib": round2(plain.rss_mib),
                // Idle after the drain: cores busy in Postgres and in this process (the relays).
                "idle_cores": {
                    "fleet": {"postgres": round2(fleet.idle.postgres / fleet.idle.wall.max(1e-3)), "relay": round2(fleet.idle.relay / fleet.idle.wall.max(1e-3))},
                    "plain": {"postgres": round2(plain.idle.postgres / plain.idle.wall.max(1e-3)), "relay": round2(plain.idle.relay / plain.idle.wall.max(1e-3))},
                },
                "fleet_advisory_locks": fleet.locks,
                "autovacuum_runs": {"fleet": fleet.autovacuums, "plain": plain.autovacuums},
                "plain_advisory_locks": plain.locks,
            }),
        );
    }
    for db in &dropped {
        drop_schema(db).await;
    }
}
