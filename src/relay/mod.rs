//! `outbox relay`: the publisher — take → send → mark — done batch-wise.
//!
//! One pass ([`Relay::run_once`]):
//! 1. **take**: open a transaction and claim up to `batch_size` due rows with
//!    `FOR UPDATE SKIP LOCKED` (other relays skip them while this transaction is open), starting
//!    at the relay's claim floor (`floor.rs`) rather than at the head of the pending index;
//! 2. **send**: produce the whole batch with an idempotent producer (`acks=all`,
//!    `enable.idempotence=true`) and wait — bounded by the delivery timeout — for every report;
//! 3. **mark**: one `UPDATE` sets the acknowledged rows `sent`; one `UPDATE` backs off the rows
//!    Kafka refused (`attempts + 1`, `last_error`, capped exponential `available_at` with jitter,
//!    `failed` at `max_attempts`); then commit.
//!
//! Rows without a report in time, or refused only because the cluster is unreachable, stay
//! `pending` without spending an attempt; the relay backs off as a whole instead. A crash between
//! the broker's ack and the commit re-sends those rows later: at-least-once, absorbed by the
//! idempotent consumer. Marking before sending would lose them instead.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::util::Timeout;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use self::floor::{ClaimFloor, Sample};
use crate::backoff::Backoff;
use crate::cleanup;
use crate::config::{ConfigError, DbConfig, KafkaConfig};
use crate::kafka::RefusalReason;
use crate::outage::Outage;
use crate::schema::REWIND_PAYLOAD;
use crate::sql::Statements;
use crate::topic::validate_topic;
use tracing::Instrument as _;

mod batch;
mod config;
mod error;
mod exactly_once;
mod floor;
pub(crate) mod gate;
mod lanes;
mod pipeline;
mod poll_thread;
mod producer;
mod progress;
mod reports;
mod ring;
#[cfg(feature = "schemas")]
mod schemas;
mod send;
mod tasks;

use batch::*;
pub use config::*;
pub use error::{BatchReport, Outcome, RelayError};
pub(crate) use lanes::{LockSession, LANES};
use producer::*;
pub(crate) use tasks::refresh_outbox_gauges;
use tasks::*;

use reports::{RelayContext, RelayProducer, Reports};

/// `last_error` is cut to this many characters, as the `x-error` header is.
pub const MAX_ERROR_LEN: usize = crate::wire::MAX_ERROR_HEADER_LEN;
/// Margin added to the delivery timeout before unreported rows are given up for this pass.
const REPORT_MARGIN: Duration = Duration::from_secs(5);
/// A topic seen in the broker's metadata is trusted for this long before it is checked again.
const TOPIC_CACHE_TTL: Duration = Duration::from_secs(60);
/// Budget for one metadata lookup of a topic.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);
/// The publisher. Cheap to share: all state is behind `Arc`s.
pub struct Relay {
    lanes: tokio::sync::Mutex<self::lanes::Lanes>,
    pool: Pool,
    /// Replaced when librdkafka reports a fatal error (an idempotent producer that lost its
    /// sequence state cannot be used again).
    producer: Arc<std::sync::RwLock<RelayProducer>>,
    /// Where the producer's delivery reports go, batch by batch.
    reports: Arc<Reports>,
    outages: Arc<Outages>,
    kafka: KafkaConfig,
    stmts: Arc<Statements>,
    db: DbConfig,
    config: RelayConfig,
    /// Topics seen to exist, and when: a fleet's relays share one map with their producer
    /// (a topic is the cluster's, not a tenant's), so 200 tenants of one topic look it up once
    /// instead of each on its first pass.
    known_topics: KnownTopics,
    /// Where claims start (see `floor.rs`); shared with the sweep and the LISTEN task.
    floor: Arc<Mutex<ClaimFloor>>,
    /// Held for the length of a pass.
    pass: tokio::sync::Mutex<()>,
    /// Whether the schema is on ring storage, as last seen (`ring.rs`).
    layout: ring::Layout,
    /// Exactly-once mode: each slot's transactional producer and claim floor.
    slots: Option<exactly_once::Slots>,
    /// The progress topic was found (or created) with a partition per slot.
    progress_ready: tokio::sync::OnceCell<()>,
    /// Test hook: the probability (as `f64` bits) that a row is refused with "injected produce
    /// failure" instead of being produced. Set only through `outbox::testing`.
    inject_refusals: std::sync::atomic::AtomicU64,
    /// Test hook: how many rows were refused that way (`outbox::testing::injected_refusals`).
    injected: Arc<std::sync::atomic::AtomicU64>,
    /// Liveness (the pass loop beats) and readiness (Postgres and Kafka looked at by a prober
    /// while [`Relay::run`] runs), for probes.
    health: crate::health::Health,
    /// In a fleet: the gate it asks before each pass and the tenant it publishes.
    seat: Option<gate::Seat>,
    /// Wakes the pass loop: the LISTEN task's (its own, or a fleet's shared one).
    wake: Arc<tokio::sync::Notify>,
    /// The last claim's sample saw pending rows that are not due yet (backed off): an idle
    /// fleet relay then keeps polling at `poll_interval`, so they go when due, instead of
    /// at its seat's longer idle poll (`gate::Seat::idle_poll`).
    rows_waiting: std::sync::atomic::AtomicBool,
}

/// Wakes one relay from outside it: a fleet's LISTEN session, shared by the relays of one
/// database, hands each its schema's notifications.
#[derive(Clone)]
pub(crate) struct Waker {
    wake: Arc<tokio::sync::Notify>,
    floor: Arc<Mutex<ClaimFloor>>,
}

impl Waker {
    /// A notification on the relay's channel: wake it; a rewind also sends its next claim
    /// back to the head (as its own LISTEN task does).
    pub(crate) fn notified(&self, payload: &str) {
        if payload == REWIND_PAYLOAD {
            self.floor.lock().expect("floor lock").rewind_to(0);
        }
        self.wake.notify_one();
    }
}

impl Relay {
    /// Longest error text kept in `last_error`.
    pub const MAX_ERROR_LEN: usize = MAX_ERROR_LEN;
}

/// What a fleet's relays share (`Relay::with_shared`); each part missing is the relay's own.
#[derive(Default, Clone)]
pub(crate) struct Shared {
    /// The pool of their database.
    pub(crate) pool: Option<Pool>,
    /// The session their database's lane locks are held on.
    pub(crate) locks: Option<Arc<self::lanes::LockSession>>,
    /// One idempotent producer for every tenant.
    pub(crate) producer: Option<SharedProducer>,
}

/// A producer and the reports it files, shared by a fleet's relays.
#[derive(Clone)]
pub(crate) struct SharedProducer {
    producer: Arc<std::sync::RwLock<RelayProducer>>,
    reports: Arc<Reports>,
    known_topics: KnownTopics,
}

/// Topics seen to exist on the cluster, each with when it was last seen (see
/// `TOPIC_CACHE_TTL`).
type KnownTopics = Arc<Mutex<HashMap<String, Instant>>>;

impl SharedProducer {
    pub(crate) fn new(kafka: &KafkaConfig, config: &RelayConfig) -> Result<Self, RelayError> {
        let reports = Arc::new(Reports::default());
        let producer = producer_for(kafka, config.delivery_timeout, &Outages::new(), &reports)?;
        Ok(Self {
            producer: Arc::new(std::sync::RwLock::new(producer)),
            reports,
            known_topics: KnownTopics::default(),
        })
    }

    /// Flushes what was handed to it (a fleet's last step at shutdown).
    pub(crate) fn flush(&self, budget: Duration) -> Result<(), rdkafka::error::KafkaError> {
        let p = self.producer.read().expect("producer lock").clone();
        p.flush(Timeout::After(budget))
    }
}

impl Relay {
    /// Creates the pool and the producer. Connects lazily: succeeds while Postgres or Kafka is
    /// down, and the first pass reports the outage.
    ///
    /// # Errors
    /// [`RelayError::Config`] for invalid settings, [`RelayError::Kafka`] when librdkafka refuses
    /// a property.
    pub fn new(
        db: &DbConfig,
        kafka: &KafkaConfig,
        config: RelayConfig,
    ) -> Result<Self, RelayError> {
        Self::with_shared(db, kafka, config, Shared::default())
    }

    /// The pool a relay of `db` uses: its connections carry the relay's plan settings.
    pub(crate) fn pool_for(db: &DbConfig) -> Result<Pool, RelayError> {
        let mut planned = db.clone();
        let opts = format!(
            "{} {}",
            planned.pg.get_options().unwrap_or(""),
            crate::sql::PLAN_SETTINGS
        );
        planned.pg.options(opts.trim());
        Ok(crate::db::pool(&planned)
            .map_err(|e| ConfigError::DatabaseUrl(format!("cannot build pool: {e}")))?)
    }

    /// [`Relay::new`] on what a fleet shares between the relays of one database (`shared`):
    /// its pool, its lock session, and the fleet's producer.
    pub(crate) fn with_shared(
        db: &DbConfig,
        kafka: &KafkaConfig,
        config: RelayConfig,
        shared: Shared,
    ) -> Result<Self, RelayError> {
        config.validate()?;
        let pool = match shared.pool {
            Some(p) => p,
            None => Self::pool_for(db)?,
        };
        let outages = Outages::new();
        // What topics exist is the cluster's: every relay of a fleet shares what one saw.
        let known_topics = shared
            .producer
            .as_ref()
            .map(|p| p.known_topics.clone())
            .unwrap_or_default();
        let (producer, reports) = match shared.producer {
            // Exactly-once relays produce through their slots' transactional producers; the
            // shared one is for the idempotent path only.
            Some(p) if config.exactly_once.is_none() => (p.producer, p.reports),
            _ => {
                let reports = Arc::new(Reports::default());
                let producer = producer_for(kafka, config.delivery_timeout, &outages, &reports)?;
                (Arc::new(std::sync::RwLock::new(producer)), reports)
            }
        };
        let session = shared
            .locks
            .unwrap_or_else(|| self::lanes::LockSession::new(db));
        Ok(Self {
            lanes: tokio::sync::Mutex::new(self::lanes::Lanes::new(
                db,
                session,
                config.rebalance_interval,
                outages.clone(),
                config.exactly_once.is_some(),
            )),
            pool,
            producer,
            reports,
            outages,
            kafka: kafka.clone(),
            stmts: Arc::new(Statements::new(&db.schema)),
            db: db.clone(),
            floor: Arc::new(Mutex::new(ClaimFloor::new(config.long_transaction))),
            pass: tokio::sync::Mutex::new(()),
            layout: ring::Layout::default(),
            slots: config
                .exactly_once
                .as_ref()
                .map(|_| exactly_once::Slots::new()),
            progress_ready: tokio::sync::OnceCell::new(),
            config,
            known_topics,
            inject_refusals: std::sync::atomic::AtomicU64::new(0f64.to_bits()),
            injected: Arc::default(),
            health: crate::health::Health::new(),
            seat: None,
            wake: Arc::new(tokio::sync::Notify::new()),
            rows_waiting: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Its waker, for a LISTEN session outside it (set `listen: false` in its config).
    pub(crate) fn waker(&self) -> Waker {
        Waker {
            wake: self.wake.clone(),
            floor: self.floor.clone(),
        }
    }

    /// Seats this relay in a fleet (before `run`): each pass waits for the fleet's gate and
    /// claims at most `seat.quantum` batches; its gauges carry the tenant's label.
    pub(crate) fn seat(&mut self, seat: gate::Seat) {
        self.seat = Some(seat);
    }

    /// Test hook behind `outbox::testing::inject_refusals`.
    pub(crate) fn inject_refusals(&self, probability: f64) {
        self.inject_refusals
            .store(probability.to_bits(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Test hook behind `outbox::testing::injected_refusals`.
    pub(crate) fn injected_refusals(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.injected.clone()
    }

    fn producer(&self) -> RelayProducer {
        self.producer.read().expect("producer lock").clone()
    }

    /// This relay's health, to answer probes: live while its pass loop turns (an outage of
    /// Postgres or Kafka does not make it not live: it waits the outage out), ready while
    /// [`Relay::run`] runs, not shutting down, and both Postgres and Kafka answered their last
    /// look. Take it before `run` (which consumes the relay); `outbox relay --metrics-addr`
    /// serves it as `/healthz` and `/readyz`.
    pub fn health(&self) -> crate::health::Health {
        self.health.clone()
    }

    /// The schema whose outbox this relay publishes.
    pub fn schema(&self) -> &crate::schema::Schema {
        &self.db.schema
    }

    /// The connection pool (shared with cleanup).
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Re-counts live relays and moves this relay's ordering lanes towards its fair share now
    /// (normally done every `rebalance_interval` by [`Relay::run_once`]). Tests call it to
    /// converge several relays deterministically.
    pub async fn rebalance(&self) {
        self.lanes.lock().await.rebalance().await;
    }

    /// The claim floor: the next claim starts at this id (0 = the head of the pending index).
    /// Every row of this relay's lanes below it was settled when it was set, except rows of
    /// transactions open longer than `long_transaction`, which [`Relay::sweep`] finds.
    pub fn claim_floor(&self) -> i64 {
        self.floor.lock().expect("floor lock").get()
    }

    /// A handle reading [`Relay::claim_floor`] after the relay has been moved into
    /// [`Relay::run`] (for tests and monitoring).
    pub(crate) fn floor_probe(&self) -> impl Fn() -> i64 + Send + Sync + 'static {
        let floor = self.floor.clone();
        move || floor.lock().expect("floor lock").get()
    }

    /// One sweep: looks below the claim floor for due pending rows of this relay's lanes — rows
    /// of a transaction that stayed open longer than `long_transaction`, or rows put back to
    /// `pending` by hand — and, if any, makes the next claim start at the lowest. Returns its id.
    /// [`Relay::run`] sweeps every `sweep_interval` on its own connection, off the claim path
    /// (while a snapshot is held open, this walks every row sent since, like the claim used to).
    ///
    /// On ring storage it finds the writers passed while open that have since committed, and
    /// sends their rows below the lanes' cursors through the retry table; it returns `Some(0)`
    /// when it copied any (the next claim finds them), `None` otherwise.
    ///
    /// # Errors
    /// [`RelayError`] when Postgres fails.
    pub async fn sweep(&self) -> Result<Option<i64>, RelayError> {
        if self.on_ring(&self.pool.get().await?).await? {
            let copied = ring::sweep_passed(&self.pool, &self.stmts).await?;
            return Ok((copied > 0).then_some(0));
        }
        sweep_with(&self.pool, &self.stmts, &self.floor).await
    }

    /// The ordering lanes this relay holds (out of the 64 ordering lanes).
    pub async fn owned_lanes(&self) -> Vec<i32> {
        self.lanes.lock().await.owned()
    }

    /// Checks that each topic is valid and exists; returns the reason for each one that is not.
    /// A lookup that fails because the cluster is unreachable is not held against the topic:
    /// producing will then report the outage.
    async fn topic_problems(
        &self,
        topics: HashSet<String>,
    ) -> HashMap<String, (String, RefusalReason)> {
        let mut problems = HashMap::new();
        for t in topics {
            if let Err(e) = validate_topic(&t) {
                problems.insert(
                    t,
                    (crate::wire::cut(&e.to_string()), RefusalReason::Refused),
                );
                continue;
            }
            let fresh = self
                .known_topics
                .lock()
                .expect("topic cache poisoned")
                .get(&t)
                .is_some_and(|seen| seen.elapsed() < TOPIC_CACHE_TTL);
            if fresh {
                continue;
            }
            let producer = self.producer();
            let name = t.clone();
            metrics::counter!(crate::metrics::OUTBOX_TOPIC_LOOKUPS).increment(1);
            let looked_up = tokio::task::spawn_blocking(move || {
                producer
                    .client()
                    .fetch_metadata(Some(&name), Timeout::After(METADATA_TIMEOUT))
            })
            .await;
            match looked_up {
                Ok(Ok(md)) => {
                    let missing = md
                        .topics()
                        .iter()
                        .find(|mt| mt.name() == t)
                        .is_none_or(|mt| mt.error().is_some() || mt.partitions().is_empty());
                    if missing {
                        problems.insert(
                            t.clone(),
                            (
                                crate::wire::cut(&format!(
                                    "topic {t:?} does not exist on the broker (topics are \
                                     never auto-created: create it with `outbox topics apply`)"
                                )),
                                RefusalReason::UnknownTopic,
                            ),
                        );
                    } else {
                        self.known_topics
                            .lock()
                            .expect("topic cache poisoned")
                            .insert(t, Instant::now());
                    }
                }
                Ok(Err(e)) => debug!(topic = %t, error = %e, "topic metadata lookup failed"),
                Err(e) => debug!(error = %e, "metadata task failed"),
            }
        }
        problems
    }

    /// One pass: claim a batch, produce it, wait for the reports, mark, commit.
    /// Returns [`Outcome::Empty`] when nothing is due — tests drain with it deterministically.
    /// [`Relay::run`] overlaps passes instead (see [`Relay::run_pipeline`]).
    ///
    /// # Errors
    /// [`RelayError`] when Postgres fails; the claim transaction is then rolled back (or dies
    /// with the connection) and its rows are claimable again.
    pub async fn run_once(&self) -> Result<Outcome, RelayError> {
        if self.config.exactly_once.is_some() {
            return self.run_once_exactly().await;
        }
        // One pass at a time per relay: the claim floor is moved by what one pass saw.
        let _pass = self.pass.lock().await;
        // Lanes are rebalanced only here, between batches: a lane is never handed over while
        // rows of it are in flight.
        let lanes = {
            let mut l = self.lanes.lock().await;
            l.refresh_if_due().await;
            l.owned()
        };
        if lanes.is_empty() {
            return Ok(Outcome::Empty);
        }
        let claimed = self.claim(lanes, &HashMap::new(), None).await?;
        if claimed.rows.is_empty() {
            self.settle(claimed, Vec::new()).await?;
            return Ok(Outcome::Empty);
        }
        let fates = self.produce(&claimed, &HashSet::new()).await;
        Ok(Outcome::Published(self.settle(claimed, fates).await?))
    }

    /// Claims a batch of `lanes` in a new transaction, left open: the rows stay locked until
    /// [`Relay::settle`] commits. `after` gives, for keys with rows in batches still in flight
    /// (pipelining), the highest such id: those rows precede this claim's and their order is
    /// kept by the pipeline, so the per-key check starts after them. `ahead` is the newest
    /// batch in flight, when it was full: see [`Ahead`].
    pub(crate) async fn claim(
        &self,
        lanes: Vec<i32>,
        after: &HashMap<String, i64>,
        ahead: Option<Ahead>,
    ) -> Result<Claimed, RelayError> {
        self.claim_in(self.config.batch_size, lanes, after, ahead)
            .await
    }

    /// [`Relay::claim`] of at most `limit` rows (exactly-once mode claims for all its slots at once).
    pub(crate) async fn claim_in(
        &self,
        limit: usize,
        lanes: Vec<i32>,
        after: &HashMap<String, i64>,
        ahead: Option<Ahead>,
    ) -> Result<Claimed, RelayError> {
        let tx = OpenTx::connect(&self.pool).await?;
        if self.on_ring(tx.client()).await? {
            return self.claim_ring(tx, limit, lanes, ahead).await;
        }
        let claimed = self.claim_table(tx, limit, lanes, after, ahead).await;
        if claimed.is_err() {
            // The schema may have just moved onto the ring (`storage::use_ring`): the table's
            // statements fail on the view. Look again at the next claim, not in 10 s.
            self.layout.forget();
        }
        claimed
    }

    /// [`Relay::claim_in`] on the `outbox` table: lock the rows.
    async fn claim_table(
        &self,
        tx: OpenTx,
        limit: usize,
        lanes: Vec<i32>,
        after: &HashMap<String, i64>,
        ahead: Option<Ahead>,
    ) -> Result<Claimed, RelayError> {
        let c = tx.client();
        let sampling = self
            .floor
            .lock()
            .expect("floor lock")
            .wants_sample(self.config.floor_sample_interval, Instant::now());
        // The usual claim and the per-key check are prepared with the sample, in one round
        // trip: a fleet's tenant meets a pool session it has not used before on most passes,
        // where three prepares one after the other were three round trips (a statement prepared
        // and not used, as when the claim finds nothing, costs one parse on that session).
        let (sample, claim_free, first_pending) = futures::try_join!(
            c.prepare_cached(if sampling {
                &self.stmts.sample
            } else {
                &self.stmts.sample_lean
            }),
            c.prepare_cached(&self.stmts.claim_free),
            c.prepare_cached(&self.stmts.first_pending),
        )?;
        let ((), sampled) =
            futures::try_join!(c.batch_execute("BEGIN"), c.query_one(&sample, &[]))?;
        let some_not_due: bool = sampled.get(2);
        self.rows_waiting
            .store(some_not_due, std::sync::atomic::Ordering::Relaxed);
        let begin = if sampling {
            let sample = Sample {
                at: Instant::now(),
                max_id: sampled.get(0),
                writers: sampled.get(1),
            };
            self.floor.lock().expect("floor lock").begin(&lanes, sample)
        } else {
            self.floor
                .lock()
                .expect("floor lock")
                .begin_unsampled(&lanes)
        };
        let batch = i64::try_from(limit).unwrap_or(i64::MAX);
        metrics::gauge!(crate::metrics::OUTBOX_LANES_OWNED).set(lanes.len() as f64);
        let claim_started = Instant::now();
        let claim = if some_not_due {
            c.prepare_cached(&self.stmts.claim).await?
        } else {
            claim_free
        };
        // Where the claim statement starts; the per-key check and the floor probe still cover
        // everything from the floor.
        let claim_from = match ahead {
            Some(a) if begin.clean && begin.scan_from >= a.scan_from => a.next.max(begin.scan_from),
            _ => begin.scan_from,
        };
        let rows: Vec<Row> = c
            .query(&claim, &[&batch, &lanes, &claim_from])
            .instrument(tracing::debug_span!(
                "outbox.claim",
                batch,
                lanes = lanes.len(),
                from = begin.scan_from
            ))
            .await?
            .into_iter()
            .map(|r| Row {
                id: r.get(0),
                created: r.get(5),
                raw: r,
                retry: false,
            })
            .collect();
        metrics::histogram!(crate::metrics::OUTBOX_CLAIM_SECONDS)
            .record(claim_started.elapsed().as_secs_f64());

        // Keys with an earlier pending row outside this claim (another relay's batch, or a row
        // backed off after the claim's snapshot) wait: per-key order never rests on lane
        // ownership alone.
        let mut first_of_key: HashMap<&str, i64> = HashMap::new();
        for r in &rows {
            if let Some(k) = r.key() {
                first_of_key.entry(k).or_insert(r.id);
            }
        }
        let mut waiting: HashSet<String> = HashSet::new();
        if !first_of_key.is_empty() {
            // In key order, so the probes walk the key index forward instead of at random.
            let mut firsts: Vec<(&str, i64)> = first_of_key.into_iter().collect();
            firsts.sort_unstable();
            let (mut keys, mut from, mut before) = (Vec::new(), Vec::new(), Vec::new());
            for (k, first) in firsts {
                let past = after.get(k).map_or(i64::MIN, |a| a.saturating_add(1));
                keys.push(k);
                from.push(past.max(begin.scan_from));
                before.push(first);
            }
            for r in c.query(&first_pending, &[&keys, &from, &before]).await? {
                waiting.insert(r.get(0));
            }
        }
        Ok(Claimed {
            tx,
            rows,
            begin,
            lanes,
            waiting,
            limit,
            ring: None,
        })
    }

    /// Marks what `fates` say, moves the claim floor and commits the claim's transaction.
    pub(crate) async fn settle(
        &self,
        claimed: Claimed,
        fates: Vec<Fate>,
    ) -> Result<BatchReport, RelayError> {
        let Claimed {
            tx,
            rows,
            begin,
            lanes,
            limit,
            ring,
            ..
        } = claimed;
        let c = tx.client();
        let acked_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut report = BatchReport {
            claimed: rows.len(),
            ..BatchReport::default()
        };
        let mut sent = Vec::new();
        let mut sent_topics: HashMap<&str, u64> = HashMap::new();
        let mut lags: Vec<f64> = Vec::new();
        let (mut refused_ids, mut refused_errs) = (Vec::new(), Vec::new());
        // Rows whose payload breaks their schema: failed at once, no retries.
        let (mut broken_ids, mut broken_errs) = (Vec::new(), Vec::new());
        let mut deferred_reason = None;
        let mut waiting_reason = None;
        for (row, fate) in rows.iter().zip(&fates) {
            match fate {
                Fate::Sent => {
                    sent.push(row.id);
                    *sent_topics.entry(row.topic()).or_default() += 1;
                    lags.push((acked_at - row.created).max(0.0));
                }
                Fate::Refused(err, reason) => {
                    metrics::counter!(crate::metrics::OUTBOX_PUBLISH_FAILURES,
                        "reason" => reason.as_str())
                    .increment(1);
                    if *reason == RefusalReason::Contract {
                        warn!(id = row.id, topic = %row.topic(), error = %err, "outbox row breaks its topic's schema: failed (requeue it after the fix)");
                        broken_ids.push(row.id);
                        broken_errs.push(err.clone());
                    } else {
                        warn!(id = row.id, topic = %row.topic(), error = %err, "kafka refused outbox row; backing it off");
                        refused_ids.push(row.id);
                        refused_errs.push(err.clone());
                    }
                }
                Fate::Waiting(err) => {
                    report.deferred += 1;
                    waiting_reason.get_or_insert(err.clone());
                }
                Fate::Deferred(err) => {
                    metrics::counter!(crate::metrics::OUTBOX_PUBLISH_FAILURES, "reason" => "no_report")
                        .increment(1);
                    report.deferred += 1;
                    deferred_reason.get_or_insert(err.clone());
                }
                Fate::HeldBack => report.held_back += 1,
            }
        }
        if let Some(read) = ring {
            let marks = Marks {
                sent: &sent,
                refused: (&refused_ids, &refused_errs),
                broken: (&broken_ids, &broken_errs),
            };
            self.settle_ring(tx, &rows, &fates, &lanes, read, &marks)
                .await
                .inspect_err(|_| self.layout.settle_failed())?;
            self.after_settle(sent_topics, lags);
            report.sent = sent.len();
            report.backed_off = refused_ids.len() + broken_ids.len();
            self.report_outcome(&report, waiting_reason, deferred_reason);
            return Ok(report);
        }
        let full_batch_last = (rows.len() >= limit)
            .then(|| rows.last().map(|r| r.id))
            .flatten();
        // (Moving the floor only every few full batches, to spare this probe while a backlog
        // drains, was tried: under a held snapshot the relay then stalled for minutes in the
        // soak. The floor moves after every pass.)
        let bound = begin.bound(full_batch_last);
        // Prepared before anything is sent (a statement prepared inside the pipeline would be
        // executed after the COMMIT), only those this batch runs, in one round trip.
        let failing = !refused_ids.is_empty() || !broken_ids.is_empty();
        let (mark_sent, mark_failed, left_behind) = futures::try_join!(
            prepare_if(c, !sent.is_empty(), &self.stmts.mark_sent),
            prepare_if(c, failing, &self.stmts.mark_failed),
            prepare_if(c, bound.is_some(), &self.stmts.left_behind),
        )?;
        // The marks, the floor probe and COMMIT go out together and are read back in order
        // (one round trip, not four). If a mark fails, Postgres turns the COMMIT into a
        // rollback and the error is returned; the connection is then closed, not reused.
        let mark = mark_unless_empty(c, mark_sent.as_ref(), &sent, [&sent])
            .instrument(tracing::debug_span!("outbox.mark", sent = sent.len()));
        let back_off = mark_unless_empty(
            c,
            mark_failed.as_ref(),
            &refused_ids,
            [&refused_ids, &refused_errs, &self.config.max_attempts],
        );
        let fail_now = mark_unless_empty(
            c,
            mark_failed.as_ref(),
            &broken_ids,
            [&broken_ids, &broken_errs, &1i32],
        );
        let probe = async {
            match (bound, &left_behind) {
                (Some(bound), Some(left_behind)) => Ok(c
                    .query_one(left_behind, &[&begin.scan_from, &bound, &lanes])
                    .await?
                    .get::<_, Option<i64>>(0)),
                _ => Ok(None),
            }
        };
        let ((), (), (), left, ()) =
            futures::try_join!(mark, back_off, fail_now, probe, c.batch_execute("COMMIT"))?;
        tx.committed();
        self.after_settle(sent_topics, lags);
        self.floor.lock().expect("floor lock").finish(bound, left);
        report.sent = sent.len();
        report.backed_off = refused_ids.len() + broken_ids.len();
        self.report_outcome(&report, waiting_reason, deferred_reason);
        Ok(report)
    }

    /// Once a batch's marks are durable: the published counters and the commit→ack lags.
    fn after_settle(&self, sent_topics: HashMap<&str, u64>, lags: Vec<f64>) {
        self.outages.postgres.ok();
        for (topic, n) in sent_topics {
            metrics::counter!(crate::metrics::OUTBOX_PUBLISHED, "topic" => topic.to_owned())
                .increment(n);
        }
        let h = metrics::histogram!(crate::metrics::OUTBOX_COMMIT_TO_ACK);
        for l in lags {
            h.record(l);
        }
    }

    /// Logs a settled batch and tells the Kafka outage tracker how it went.
    fn report_outcome(
        &self,
        report: &BatchReport,
        waiting_reason: Option<String>,
        deferred_reason: Option<String>,
    ) {
        if let Some(reason) = waiting_reason {
            debug!(%reason, "rows left pending while the schema registry is unreachable");
        }
        if let Some(reason) = deferred_reason {
            // Rows stay pending with their attempts: an outage of the cluster, logged once.
            self.outages.kafka.failed(&format!(
                "{} row(s) left pending: {reason}",
                report.deferred
            ));
        } else if report.sent > 0 {
            self.outages.kafka.ok();
        }
        debug!(?report, "batch settled");
    }
}

/// What a batch's fates say to mark, by row id, as [`Relay::settle`] sorted them: sent, refused
/// (backed off, with their errors), broken (a schema refusal: failed at once).
pub(super) struct Marks<'a> {
    pub sent: &'a [i64],
    pub refused: (&'a [i64], &'a [String]),
    pub broken: (&'a [i64], &'a [String]),
}

/// Runs the mark `stmt` with `params` unless `ids` (the rows it marks) is empty. `stmt` is
/// prepared (by [`prepare_if`]) exactly when `ids` is not empty.
pub(super) async fn mark_unless_empty<const N: usize>(
    c: &deadpool_postgres::Object,
    stmt: Option<&tokio_postgres::Statement>,
    ids: &[i64],
    params: [&(dyn tokio_postgres::types::ToSql + Sync); N],
) -> Result<(), tokio_postgres::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    let stmt = stmt.expect("a mark with rows to mark was prepared");
    c.execute(stmt, &params).await?;
    Ok(())
}

/// `sql` prepared on `c` (or taken from its cache) if `needed`.
pub(super) async fn prepare_if(
    c: &deadpool_postgres::Object,
    needed: bool,
    sql: &str,
) -> Result<Option<tokio_postgres::Statement>, tokio_postgres::Error> {
    if !needed {
        return Ok(None);
    }
    c.prepare_cached(sql).await.map(Some)
}
