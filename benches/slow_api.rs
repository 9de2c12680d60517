//! Seed 000's consumer: every message is a call to an external API that answers in RTT
//! (100 ms), then one row is written. Measured for both handler shapes — a `CallHandler`
//! (the call outside any transaction, then a short mark transaction) and the in-transaction
//! `Handler` (the call inside the transaction that records the mark) — at concurrency 16, 64
//! and 256 over a backlog on 6 partitions and 1,000 keys:
//!
//! - `msgs_per_sec` and `ratio_to_limit`, the limit being concurrency / RTT (what the API's
//!   latency allows; nothing else should bind first);
//! - `peak_sessions`, `peak_idle_in_tx` and `longest_tx_ms` of the consumer's own Postgres
//!   sessions (its `application_name`), sampled every 10 ms from `pg_stat_activity`.
//!
//! Then the degradation run (`scenario: degradation`, call handlers at the default
//! concurrency): the API slows from RTT to 2 s for 20 s and comes back; every message must be
//! written exactly once, memory (peak RSS, messages in flight against `max_buffered`) stays
//! bounded, and no transaction lasts longer than a mark. And a stall (`scenario: stall`): calls
//! of 6 s, longer than the 2 s after which a consumer whose handlers all stopped finishing
//! pauses its partitions.
//!
//! A short backlog (`scenario: short_backlog`, 3,000 messages at the highest concurrency, the
//! issue's own run) shows what capped the in-transaction shape: a session per handler slot,
//! opened while the backlog drains.
//!
//! `cargo bench --bench slow_api` (env: RTT_MS=100, CONCURRENCY=16,64,256, ROUNDS=40,
//! SHORT_MESSAGES=3000, SLOW_MS=2000, SLOW_SECS=20, DEGRADE_MESSAGES=20000, STALL_MS=6000).

#[path = "support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox::consumer::{
    BoxFuture, CallHandler, Consumer, ConsumerConfig, ConsumerStats, Delivered, Handler,
    HandlerError,
};
use support::*;

/// The external API: answers after the current latency.
#[derive(Clone)]
struct Api(Arc<AtomicU64>);

impl Api {
    async fn call(&self) {
        tokio::time::sleep(Duration::from_millis(self.0.load(Ordering::Relaxed))).await;
    }
}

/// The call handler: the API call outside, the row with the mark.
struct Notify {
    api: Api,
    table: String,
}

impl CallHandler for Notify {
    type Reply = ();
    fn call<'a>(&'a self, _m: &'a Delivered) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            self.api.call().await;
            Ok(())
        })
    }
    fn record<'a>(
        &'a self,
        m: &'a Delivered,
        _r: &'a (),
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            tx.execute(
                &format!("INSERT INTO {} (message_id) VALUES ($1)", self.table),
                &[&m.message_id],
            )
            .await?;
            Ok(())
        })
    }
}

/// The in-transaction handler: the call inside the transaction that holds the mark.
struct NotifyInTx(Notify);

impl Handler for NotifyInTx {
    fn handle<'a>(
        &'a self,
        m: &'a Delivered,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            self.0.api.call().await;
            self.0.record(m, &(), tx).await
        })
    }
}

/// Peaks of the consumer's sessions, sampled until stopped.
#[derive(Default, Debug, Clone, Copy)]
struct Peaks {
    sessions: i64,
    idle_in_tx: i64,
    /// Sessions idle in a transaction older than half the RTT: a transaction held over a call.
    idle_in_tx_over_call: i64,
    longest_tx_ms: f64,
}

struct Sampler {
    peaks: Arc<Mutex<Peaks>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    async fn start(db: &outbox::DbConfig, app: &str, half_rtt_ms: f64) -> Self {
        let c = outbox::connect(db).await.unwrap();
        let (peaks, stop) = (
            Arc::<Mutex<Peaks>>::default(),
            Arc::new(AtomicBool::new(false)),
        );
        let (p, s, app) = (peaks.clone(), stop.clone(), app.to_owned());
        let task = tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                let r = c
                    .query_one(
                        "SELECT count(*), count(*) FILTER (WHERE state LIKE 'idle in transaction%'),
                                coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)) * 1000, 0)::float8,
                                count(*) FILTER (WHERE state LIKE 'idle in transaction%'
                                   AND extract(epoch FROM clock_timestamp() - xact_start) * 1000 > $2::float8)
                           FROM pg_stat_activity WHERE application_name = $1",
                        &[&app, &half_rtt_ms],
                    )
                    .await
                    .unwrap();
                {
                    let mut p = p.lock().unwrap();
                    p.sessions = p.sessions.max(r.get(0));
                    p.idle_in_tx = p.idle_in_tx.max(r.get(1));
                    p.longest_tx_ms = p.longest_tx_ms.max(r.get(2));
                    p.idle_in_tx_over_call = p.idle_in_tx_over_call.max(r.get(3));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        Self { peaks, stop, task }
    }

    async fn finish(self) -> Peaks {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        *self.peaks.lock().unwrap()
    }
}

/// Peak resident memory of this process so far (kB).
fn peak_rss_kb() -> u64 {
    proc_status("self", "VmHWM:").unwrap_or(0)
}

struct Run {
    secs: f64,
    /// Most messages accepted but unfinished (the runtime's buffer, bounded by `max_buffered`).
    peak_in_flight: u64,
    peaks: Peaks,
    rows: i64,
    distinct: i64,
    stats: Arc<ConsumerStats>,
}

/// Consumes the first `n` messages of `topic` with a fresh group and the given handler
/// shape.
async fn run(
    db: &outbox::DbConfig,
    topic: &str,
    n: usize,
    call: bool,
    concurrency: usize,
    api: Api,
    half_rtt_ms: f64,
) -> Run {
    let table = format!("notified_{}", rand_name(6));
    let c = outbox::connect(db).await.unwrap();
    c.batch_execute(&format!(
        "CREATE TABLE {}.{table} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, message_id text NOT NULL)",
        db.schema.quoted()
    ))
    .await
    .unwrap();
    let app = format!("slow-api-{}", rand_name(6));
    let mut db2 = db.clone();
    db2.set_application_name(&app);
    let mut cfg = ConsumerConfig::new(format!("bench-{}", rand_name(8)), [topic]);
    cfg.concurrency = concurrency;
    // The in-transaction shape as it was: one transaction per handler slot.
    cfg.transactions = concurrency;
    let h = Notify {
        api,
        table: table.clone(),
    };
    let consumer = Consumer::new(&db2, &kafka(), cfg).unwrap();
    let consumer = if call {
        consumer.call_handler("order_created", h)
    } else {
        consumer.handler("order_created", NotifyInTx(h))
    };
    let stats = consumer.stats();
    let sampler = Sampler::start(db, &app, half_rtt_ms).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    // The clock starts at the first handled message: joining the group and the first fetch
    // are the same for every shape and not what is measured.
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut started = None;
    let mut first = 0;
    let mut peak_in_flight = 0;
    while ConsumerStats::get(&stats.handled) < n as u64 {
        peak_in_flight = peak_in_flight.max(ConsumerStats::get(&stats.in_flight));
        assert!(Instant::now() < deadline, "slow_api bench timed out");
        let h = ConsumerStats::get(&stats.handled);
        if started.is_none() && h > 0 {
            (started, first) = (Some(Instant::now()), h);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let started = started.unwrap_or_else(Instant::now);
    // Messages handled after the clock started, over the time they took.
    let secs =
        started.elapsed().as_secs_f64() * n as f64 / (n as u64 - first.min(n as u64 - 1)) as f64;
    let peaks = sampler.finish().await;
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
    let r = c
        .query_one(
            &format!(
                "SELECT count(*), count(DISTINCT message_id) FROM {}.{table}",
                db.schema.quoted()
            ),
            &[],
        )
        .await
        .unwrap();
    Run {
        secs,
        peak_in_flight,
        peaks,
        rows: r.get(0),
        distinct: r.get(1),
        stats,
    }
}

#[tokio::main]
async fn main() {
    let rtt_ms = param("RTT_MS", if full() { 100 } else { 20 }) as u64;
    let rounds = param("ROUNDS", if full() { 40 } else { 5 });
    let concurrencies: Vec<usize> = std::env::var("CONCURRENCY")
        .unwrap_or_else(|_| if full() { "16,64,256" } else { "4,16" }.into())
        .split(',')
        .map(|c| c.trim().parse().unwrap())
        .collect();
    let degrade_n = param("DEGRADE_MESSAGES", if full() { 20_000 } else { 300 });
    let slow_ms = param("SLOW_MS", if full() { 2000 } else { 200 }) as u64;
    let slow_secs = param("SLOW_SECS", if full() { 20 } else { 1 }) as u64;
    let max_c = concurrencies.iter().copied().max().unwrap_or(16);
    let total = (max_c * rounds)
        .max(degrade_n)
        .max(param("SHORT_MESSAGES", 3000));

    let db = fresh_db().await;
    let topic = format!("bench.{}.created", rand_name(8));
    create_topic(&topic, 6).await;
    create_topic(&format!("{topic}.dlq"), 6).await;
    fill_outbox(&db, &topic, total, 1000).await;
    let relay = outbox::Relay::new(&db, &kafka(), outbox::RelayConfig::default()).unwrap();
    while let outbox::Outcome::Published(_) = relay.run_once().await.unwrap() {}

    for &conc in &concurrencies {
        for call in [true, false] {
            steady(&db, &topic, "steady", call, conc, conc * rounds, rtt_ms).await;
        }
    }
    // The issue's own run: a short backlog (3,000 messages) at the highest concurrency, where
    // the in-transaction shape opens a session per handler slot while the backlog drains.
    let short = param("SHORT_MESSAGES", if full() { 3000 } else { 50 });
    for call in [true, false] {
        steady(&db, &topic, "short_backlog", call, max_c, short, rtt_ms).await;
    }

    // Degradation: the API slows to `slow_ms` for `slow_secs`, then recovers; then a stall:
    // calls take longer than the runtime's `pause_after` (2 s), so no handler finishes for
    // that long and every partition is paused until the backlog halves.
    let stall_ms = param("STALL_MS", if full() { 6000 } else { 2500 }) as u64;
    for (scenario, slow, secs, n) in [
        ("degradation", slow_ms, slow_secs, degrade_n),
        ("stall", stall_ms, stall_ms / 1000, degrade_n / 4),
    ] {
        degrade(&db, &topic, scenario, rtt_ms, slow, secs, n).await;
    }
    drop_schema(&db).await;
    delete_topic(&topic).await;
    delete_topic(&format!("{topic}.dlq")).await;
}

/// One run at a steady latency of `rtt_ms` over the first `n` messages, printed against the
/// limit concurrency / RTT.
async fn steady(
    db: &outbox::DbConfig,
    topic: &str,
    scenario: &str,
    call: bool,
    conc: usize,
    n: usize,
    rtt_ms: u64,
) {
    let api = Api(Arc::new(AtomicU64::new(rtt_ms)));
    let r = run(db, topic, n, call, conc, api, rtt_ms as f64 / 2.0).await;
    assert_eq!(r.rows, r.distinct, "a message written twice");
    let rate = n as f64 / r.secs;
    let limit = conc as f64 * 1000.0 / rtt_ms as f64;
    emit(
        "slow_api",
        serde_json::json!({"scenario": scenario, "handler": if call { "call" } else { "in_tx" },
            "concurrency": conc, "rtt_ms": rtt_ms, "messages": n, "partitions": 6, "keys": 1000}),
        serde_json::json!({"seconds": round2(r.secs), "msgs_per_sec": rate.round(),
            "limit_msgs_per_sec": limit, "ratio_to_limit": round2(rate / limit),
            "peak_sessions": r.peaks.sessions, "peak_idle_in_tx": r.peaks.idle_in_tx,
            "idle_in_tx_over_half_rtt": r.peaks.idle_in_tx_over_call,
            "longest_tx_ms": r.peaks.longest_tx_ms.round(),
            "sessions_bound": conc / 8 + 2}),
    );
}

/// One degradation run of call handlers at the default concurrency: latency `rtt_ms`, then
/// `slow_ms` for `slow_secs`, then `rtt_ms` again, over the first `n` messages.
async fn degrade(
    db: &outbox::DbConfig,
    topic: &str,
    scenario: &str,
    rtt_ms: u64,
    slow_ms: u64,
    slow_secs: u64,
    n: usize,
) {
    let conc = outbox::consumer::ConsumerConfig::DEFAULT_CONCURRENCY;
    let api = Api(Arc::new(AtomicU64::new(rtt_ms)));
    let clock = {
        let lat = api.0.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(if full() { 3 } else { 1 })).await;
            lat.store(slow_ms, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_secs(slow_secs.max(1))).await;
            lat.store(rtt_ms, Ordering::Relaxed);
        })
    };
    let rss_before = peak_rss_kb();
    let r = run(db, topic, n, true, conc, api, rtt_ms as f64 / 2.0).await;
    clock.abort();
    let lost = n as i64 - r.distinct.min(n as i64);
    assert_eq!(r.rows, r.distinct, "a message written twice");
    assert!(r.distinct >= n as i64, "messages lost");
    emit(
        "slow_api",
        serde_json::json!({"scenario": scenario, "handler": "call", "concurrency": conc,
            "rtt_ms": rtt_ms, "slow_ms": slow_ms, "slow_secs": slow_secs, "messages": n}),
        serde_json::json!({"seconds": round2(r.secs), "lost": lost, "doubled": r.rows - r.distinct,
            "peak_rss_mb": round2(peak_rss_kb() as f64 / 1024.0), "rss_before_mb": round2(rss_before as f64 / 1024.0),
            "backpressure_pauses": ConsumerStats::get(&r.stats.backpressure_pauses),
            "peak_in_flight": r.peak_in_flight, "max_buffered": outbox::consumer::ConsumerConfig::DEFAULT_MAX_BUFFERED,
            "peak_sessions": r.peaks.sessions, "peak_idle_in_tx": r.peaks.idle_in_tx,
            "idle_in_tx_over_half_rtt": r.peaks.idle_in_tx_over_call,
            "longest_tx_ms": r.peaks.longest_tx_ms.round()}),
    );
}
