//! The consumer runtime: idempotent handlers, offsets that never run ahead of outcomes,
//! bounded concurrency with per-key order, retries that never block a partition, dead letters.
//!
//! # How a message moves
//! 1. **Decode** before dispatch: `message_type` and `message_id` headers and a JSON body are
//!    required. A message that fails is dead-lettered at once (`x-error-kind: decode`) and
//!    spends no retries. A `message_type` without a handler is skipped and counted.
//! 2. **Handle** in a Postgres transaction that first inserts `(group, topic, message_id)` into
//!    `processed_messages` (`ON CONFLICT DO NOTHING`): a duplicate is skipped, otherwise the
//!    handler's changes and the mark commit together.
//! 3. **Fail** by class: `Transient` retries ([`RetryStrategy`]), `Permanent` and panics go to
//!    `<topic>.dlq` at once. A dead letter counts as final only once the broker acknowledged
//!    it; until then the message stays in flight and the write is retried with capped backoff.
//! 4. **Commit**: per partition, the stored offset is the lowest offset not yet final
//!    ([`OffsetTracker`](self)); librdkafka auto-commits stored offsets every second and on
//!    revocation, and shutdown commits synchronously. A crash therefore redelivers only
//!    unfinished messages, and `processed_messages` absorbs any repeat.
//!
//! # Concurrency and order
//! Up to `concurrency` handlers run at once. Messages with the same key in the same partition
//! form a lane and run one after another, so per-key order holds (in-place retries included).
//! At most `max_buffered` messages are accepted but unfinished. At the bound the runtime stops
//! pulling (librdkafka's prefetch queue, `queued.max.messages.kbytes`, is bounded too); if no
//! handler finishes for 2 s meanwhile (a stalled downstream), every assigned partition is paused (backpressure) until the
//! backlog is down to half the bound. Memory stays bounded either way.

mod breaker;
mod call;
mod commit_group;
mod config;
mod context;
mod dead_letter;
mod dispatch;
mod drain;
mod driver;
mod envelope;
mod handler;
mod harness;
mod inbox;
mod letters;
mod offsets;
mod process;
mod record;
mod retry;
mod runtime;
mod schemas;
pub use schemas::REGISTRY_DEPENDENCY;
mod held;
mod holds;
mod setup;
#[cfg(feature = "sqlx")]
mod sqlx;
mod stats;
mod steer;
mod tenants;
mod tx;
mod upkeep;

#[cfg(feature = "sqlx")]
pub use self::sqlx::{
    SqlxBatchHandler, SqlxBatchHandlerFn, SqlxCallHandler, SqlxHandler, SqlxHandlerFn,
};
pub use breaker::{
    BreakerConfig, BreakerMode, ConsumerState, FailureRate, OpenBreaker, StateHandle,
};
/// Renamed [`BreakerMode`] (the breaker's mode, not the consumer's).
#[deprecated(since = "0.2.0", note = "renamed `BreakerMode`")]
pub type Mode = BreakerMode;
#[cfg(feature = "sqlx")]
pub use config::SqlxHandlers;
pub use config::{ConsumerConfig, ConsumerError, Driver, PgHandlers};
pub(crate) use dead_letter::*;
pub use handler::{
    BatchHandler, BatchHandlerFn, BoxFuture, CallHandler, Delivered, ErrorKind, Freshness,
    FreshnessCheck, FreshnessFn, Handler, HandlerError, HandlerFn,
};
pub use harness::{Harness, Verdict, Written};
pub use inbox::{Inbox, InboxOutcome};
pub use retry::RetryStrategy;
mod moved;
pub use holds::{OnHoldExpiry, StrictOrder};
#[allow(deprecated)]
pub use moved::*;
pub use stats::ConsumerStats;
pub use tenants::TenantRouting;
pub use upkeep::{cleanup_marks, MarksCleaned, MarksCleanup};

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::producer::FutureProducer;
use rdkafka::util::Timeout;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::config::{DbConfig, KafkaConfig};
use breaker::Breakers;
use runtime::{Ctx, Partitions, Runtime};

/// A registered handler, before the consumer starts and sorts it into its driver's table
/// (`driver::Routes`).
#[derive(Clone)]
enum HandlerRef {
    Single(Arc<dyn Handler>),
    Batch(Arc<dyn BatchHandler>, usize),
    /// A call handler: no transaction during its call (`call.rs`).
    Call(Arc<dyn driver::PgCall>),
    /// A per-message handler in an sqlx transaction.
    #[cfg(feature = "sqlx")]
    SqlxSingle(Arc<dyn SqlxHandler>),
    /// A batch handler in an sqlx transaction.
    #[cfg(feature = "sqlx")]
    SqlxBatch(Arc<dyn SqlxBatchHandler>, usize),
    /// A call handler recording through sqlx.
    #[cfg(feature = "sqlx")]
    SqlxCall(Arc<dyn driver::SqlxCall>),
}

impl HandlerRef {
    /// The driver whose transaction the handler takes.
    fn driver(&self) -> Option<&'static str> {
        match self {
            HandlerRef::Single(_) | HandlerRef::Batch(..) | HandlerRef::Call(_) => {
                Some("tokio-postgres")
            }
            #[cfg(feature = "sqlx")]
            HandlerRef::SqlxSingle(_) | HandlerRef::SqlxBatch(..) | HandlerRef::SqlxCall(_) => {
                Some("sqlx")
            }
        }
    }

    /// Holds a pooled connection (and a transaction) for as long as the handler runs.
    fn holds_transaction(&self) -> bool {
        match self {
            HandlerRef::Call(_) => false,
            #[cfg(feature = "sqlx")]
            HandlerRef::SqlxCall(_) => false,
            _ => true,
        }
    }
}

struct Shared {
    pool: Pool,
    /// The consumer's health: the runtime's loop beats it.
    health: crate::health::Health,
    /// Where retry and dead-letter records go: the broker, or a test's record (`harness.rs`).
    producer: Sink,
    /// The handlers in their driver's table, and every transaction recipe over it.
    tx: Box<dyn driver::Transactions>,
    config: ConsumerConfig,
    retry_topics: HashMap<String, (String, usize)>,
    /// With a breaker: each DLQ topic read during drains → its main topic.
    drain_topics: HashMap<String, String>,
    inbox: Inbox,
    stats: Arc<ConsumerStats>,
    cancel: CancellationToken,
    breakers: Arc<Breakers>,
    freshness: Option<Arc<dyn FreshnessCheck>>,
    /// For recording drained and dropped letters in the archive.
    dlq: crate::dlq::Dlq,
    /// Records already dead-lettered (not written twice after a crash).
    dead_lettered: DeadLetterLog,
    /// One log line per outage of the consumer's database.
    pg_outage: crate::outage::Outage,
    /// One log line per outage of the schema registry.
    #[cfg_attr(not(feature = "schemas"), allow(dead_code))]
    registry_outage: crate::outage::Outage,
    /// Answered calls of call handlers waiting for their marks.
    marks: call::Marks,
    /// A call handler is registered (fixed at start: it sizes the pool, starts the mark
    /// writers, and lets call lanes pass in-transaction ones waiting for a slot).
    has_calls: bool,
    /// The outbox schema, for the statements rendered where they are used.
    db_schema: crate::schema::Schema,
    /// Strict per-key order: which keys are held (`holds.rs`).
    holds: holds::Holds,
    /// Routing by tenant, when configured (`tenants.rs`).
    tenants: Option<tenants::Router>,
}

/// Where the runtime's own records (retry hops, dead letters) are written.
enum Sink {
    /// The broker.
    Kafka(FutureProducer<crate::kafka::KafkaQuiet>),
    /// A [`Harness`]'s list, in order of writing: nothing leaves the process.
    Recorded(Mutex<Vec<Written>>),
}

impl Shared {
    /// The breaker, when one is configured.
    fn breaker(&self) -> Option<&Breakers> {
        self.config.breaker.as_ref().map(|_| &*self.breakers)
    }
}

/// The consumer runtime. Register handlers with [`Consumer::handler`], then [`Consumer::run`].
///
/// The type parameter is the driver of the handlers' transactions, fixed when the consumer is
/// built: [`Consumer::new`] gives a `Consumer<PgHandlers>` (tokio-postgres, the default),
/// `Consumer::sqlx` (feature `sqlx`) a `Consumer<SqlxHandlers>` over the service's own sqlx pool. Each offers
/// only its driver's registration methods, so a handler of the other driver does not compile.
pub struct Consumer<D = PgHandlers> {
    db: DbConfig,
    kafka: KafkaConfig,
    config: ConsumerConfig,
    handlers: HashMap<String, HandlerRef>,
    stats: Arc<ConsumerStats>,
    breakers: Arc<Breakers>,
    freshness: Option<Arc<dyn FreshnessCheck>>,
    /// Set by the rebalance callback, read by the runtime: reload the held keys.
    holds_stale: Arc<std::sync::atomic::AtomicBool>,
    /// Liveness (the poll loop beats) and readiness (Postgres and Kafka looked at while it
    /// runs), for probes.
    health: crate::health::Health,
    /// The handlers' driver, as a type: which registration methods exist.
    handlers_of: PhantomData<fn() -> D>,
}

impl Consumer<PgHandlers> {
    /// A consumer over `db` (for `processed_messages` and handler transactions) and `kafka`,
    /// whose handlers run in tokio-postgres transactions from its own pool.
    ///
    /// # Errors
    /// [`ConsumerError::Config`] for invalid settings, and for a configuration naming
    /// `Driver::Sqlx` (build that consumer with `Consumer::sqlx`).
    pub fn new(
        db: &DbConfig,
        kafka: &KafkaConfig,
        config: ConsumerConfig,
    ) -> Result<Self, ConsumerError> {
        #[allow(deprecated)]
        if !matches!(config.driver, Driver::TokioPostgres) {
            return Err(ConsumerError::Config(format!(
                "ConsumerConfig::driver is {}: build a consumer of sqlx handlers with Consumer::sqlx(db, kafka, config, pool)",
                config.driver.name()
            )));
        }
        Self::build(db, kafka, config)
    }
}

impl<D> Consumer<D> {
    /// The shared part of the constructors: settings checked, the breaker's pool made.
    fn build(
        db: &DbConfig,
        kafka: &KafkaConfig,
        config: ConsumerConfig,
    ) -> Result<Self, ConsumerError> {
        config.validate()?;
        if kafka
            .properties
            .get("enable.auto.offset.store")
            .is_some_and(|v| v != "false")
        {
            return Err(ConsumerError::Config(
                "enable.auto.offset.store must stay false: offsets are stored only for final messages".into(),
            ));
        }
        if kafka
            .properties
            .get("isolation.level")
            .is_some_and(|v| v != "read_committed")
        {
            return Err(ConsumerError::Config(
                "isolation.level must stay read_committed: a read_uncommitted consumer would handle records of aborted transactions".into(),
            ));
        }
        let pool = crate::db::pool(db).map_err(|e| ConsumerError::Config(format!("pool: {e}")))?;
        let breakers = Arc::new(Breakers::new(
            pool,
            db.schema.clone(),
            config.group.clone(),
            config.breaker.clone().unwrap_or_default(),
        ));
        Ok(Self {
            db: db.clone(),
            kafka: kafka.clone(),
            config,
            handlers: HashMap::new(),
            stats: Arc::default(),
            breakers,
            freshness: None,
            holds_stale: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            health: crate::health::Health::new(),
            handlers_of: PhantomData,
        })
    }
}

impl Consumer<PgHandlers> {
    /// Registers the handler for `message_type` (replacing any earlier one).
    #[must_use]
    pub fn handler(mut self, message_type: impl Into<String>, handler: impl Handler) -> Self {
        self.handlers
            .insert(message_type.into(), HandlerRef::Single(Arc::new(handler)));
        self
    }

    /// Registers a [`CallHandler`] for `message_type` (replacing any earlier handler): its
    /// call runs outside any transaction, then one short transaction records the mark with
    /// its writes. For handlers that wait on an external API.
    #[must_use]
    pub fn call_handler(
        mut self,
        message_type: impl Into<String>,
        handler: impl CallHandler,
    ) -> Self {
        self.handlers.insert(
            message_type.into(),
            HandlerRef::Call(Arc::new(driver::ErasedPgCall(handler))),
        );
        self
    }

    /// Registers the handler for tombstones (records with a null value: the delete markers of
    /// a compacted topic, e.g. from [`crate::Message::tombstone`]), whatever their
    /// `message_type`. It runs in the inbox transaction like any handler; [`Delivered::tombstone`]
    /// is true, the body `null`. Without one, tombstones are skipped and counted, never
    /// dead-lettered.
    #[must_use]
    pub fn on_tombstone(mut self, handler: impl Handler) -> Self {
        self.handlers.insert(
            handler::TOMBSTONE_ROUTE.to_owned(),
            HandlerRef::Single(Arc::new(handler)),
        );
        self
    }

    /// Registers a [`BatchHandler`] for `message_type`: up to `max_batch` messages per
    /// transaction (replacing any earlier handler for the type).
    #[must_use]
    pub fn batch_handler(
        mut self,
        message_type: impl Into<String>,
        max_batch: usize,
        handler: impl BatchHandler,
    ) -> Self {
        self.handlers.insert(
            message_type.into(),
            HandlerRef::Batch(Arc::new(handler), max_batch.max(1)),
        );
        self
    }
}

#[cfg(feature = "sqlx")]
impl Consumer<SqlxHandlers> {
    /// A consumer whose handlers run in sqlx transactions taken from `pool`, the service's own
    /// `PgPool` (its `search_path` is what handlers see; it needs a connection per
    /// [`ConsumerConfig::transactions`]). The runtime's own bookkeeping (dead-letter records,
    /// the breaker's row, heartbeats, marks cleanup) keeps two connections of its own on `db`.
    ///
    /// Only sqlx handlers can be registered on it:
    ///
    /// ```no_run
    /// # use outbox::consumer::{Consumer, ConsumerConfig, Delivered, HandlerError};
    /// async fn charge(msg: &Delivered, tx: &mut sqlx::PgConnection) -> Result<(), HandlerError> {
    ///     sqlx::query("SELECT 1").execute(&mut *tx).await?;
    ///     Ok(())
    /// }
    /// # fn f(db: &outbox::DbConfig, kafka: &outbox::KafkaConfig, pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// let consumer = Consumer::sqlx(db, kafka, ConsumerConfig::new("payments", ["orders"]), pool)?
    ///     .sqlx_handler("order_created", charge);
    /// # Ok(()) }
    /// ```
    ///
    /// and a tokio-postgres handler given to it does not compile (the same lines, with
    /// `handler`):
    ///
    /// ```compile_fail
    /// # use outbox::consumer::{Consumer, ConsumerConfig, Delivered, HandlerError};
    /// async fn charge(msg: &Delivered, tx: &tokio_postgres::Transaction<'_>) -> Result<(), HandlerError> {
    ///     tx.execute("SELECT 1", &[]).await?;
    ///     Ok(())
    /// }
    /// # fn f(db: &outbox::DbConfig, kafka: &outbox::KafkaConfig, pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// let consumer = Consumer::sqlx(db, kafka, ConsumerConfig::new("payments", ["orders"]), pool)?
    ///     .handler("order_created", charge);
    /// # Ok(()) }
    /// ```
    ///
    /// Nor does an sqlx handler given to a consumer from [`Consumer::new`]:
    ///
    /// ```compile_fail
    /// # use outbox::consumer::{Consumer, ConsumerConfig, Delivered, HandlerError};
    /// async fn charge(msg: &Delivered, tx: &mut sqlx::PgConnection) -> Result<(), HandlerError> {
    ///     sqlx::query("SELECT 1").execute(&mut *tx).await?;
    ///     Ok(())
    /// }
    /// # fn f(db: &outbox::DbConfig, kafka: &outbox::KafkaConfig, pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// let consumer = Consumer::new(db, kafka, ConsumerConfig::new("payments", ["orders"]))?
    ///     .sqlx_handler("order_created", charge);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ConsumerError::Config`] for invalid settings, and for a configuration naming
    /// [`Driver::Sqlx`] already (the pool is this call's argument).
    pub fn sqlx(
        db: &DbConfig,
        kafka: &KafkaConfig,
        mut config: ConsumerConfig,
        pool: ::sqlx::PgPool,
    ) -> Result<Self, ConsumerError> {
        #[allow(deprecated)]
        {
            if !matches!(config.driver, Driver::TokioPostgres) {
                return Err(ConsumerError::Config(
                    "ConsumerConfig::driver names a pool already: Consumer::sqlx takes it as its argument".into(),
                ));
            }
            config.driver = Driver::Sqlx(pool);
        }
        Self::build(db, kafka, config)
    }

    /// Registers an [`SqlxHandler`] for `message_type` (replacing any earlier handler): it runs
    /// in an sqlx transaction from the consumer's pool.
    #[must_use]
    pub fn sqlx_handler(
        mut self,
        message_type: impl Into<String>,
        handler: impl SqlxHandler,
    ) -> Self {
        self.handlers.insert(
            message_type.into(),
            HandlerRef::SqlxSingle(Arc::new(handler)),
        );
        self
    }

    /// As [`Consumer::on_tombstone`], with an [`SqlxHandler`].
    #[must_use]
    pub fn on_tombstone_sqlx(mut self, handler: impl SqlxHandler) -> Self {
        self.handlers.insert(
            handler::TOMBSTONE_ROUTE.to_owned(),
            HandlerRef::SqlxSingle(Arc::new(handler)),
        );
        self
    }

    /// Registers an [`SqlxBatchHandler`] for `message_type`: up to `max_batch` messages per
    /// sqlx transaction (see [`Consumer::batch_handler`]).
    #[must_use]
    pub fn sqlx_batch_handler(
        mut self,
        message_type: impl Into<String>,
        max_batch: usize,
        handler: impl SqlxBatchHandler,
    ) -> Self {
        self.handlers.insert(
            message_type.into(),
            HandlerRef::SqlxBatch(Arc::new(handler), max_batch.max(1)),
        );
        self
    }

    /// Registers an [`SqlxCallHandler`] for `message_type` (replacing any earlier handler): as
    /// [`Consumer::call_handler`], with its record written through the consumer's sqlx pool.
    #[must_use]
    pub fn sqlx_call_handler(
        mut self,
        message_type: impl Into<String>,
        handler: impl SqlxCallHandler,
    ) -> Self {
        self.handlers.insert(
            message_type.into(),
            HandlerRef::SqlxCall(Arc::new(driver::ErasedSqlxCall(handler))),
        );
        self
    }
}

impl<D> Consumer<D> {
    /// This consumer's health, to answer probes: live while its poll loop turns (an outage
    /// does not make it not live), ready while [`Consumer::run`] runs, not shutting down, and
    /// both Postgres and Kafka answered their last look. Take it before `run`; mount
    /// [`crate::metrics::health_router`] on the service's own server, or set
    /// [`ConsumerConfig::metrics_addr`] to get `/healthz` and `/readyz` beside `/metrics`.
    pub fn health(&self) -> crate::health::Health {
        self.health.clone()
    }

    /// Counters, shared with the running consumer.
    pub fn stats(&self) -> Arc<ConsumerStats> {
        self.stats.clone()
    }

    /// The breaker cycle's state (mode, open breakers, parked/drained/dropped counts), readable
    /// while the consumer runs: `consumer.state().get()`.
    pub fn state(&self) -> StateHandle {
        StateHandle(self.breakers.clone())
    }

    /// A freshness check run before each parked letter is handled during a drain:
    /// `Match` handles it, `Mismatch` drops it as `event_obsolete`, `QueryFailed` parks it
    /// again. A plain `async fn(&Delivered) -> Freshness` works.
    #[must_use]
    pub fn freshness(mut self, check: impl FreshnessCheck) -> Self {
        self.freshness = Some(Arc::new(check));
        self
    }

    /// Every topic the consumer needs: main, retry and dead-letter.
    pub fn required_topics(&self) -> Vec<String> {
        let mut v = self.config.topics.clone();
        let mut retry: Vec<String> = self.config.retry_topics().into_keys().collect();
        retry.sort();
        v.extend(retry);
        v.extend(self.config.topics.iter().map(|t| self.config.dlq_topic(t)));
        v
    }

    /// Handler transactions run with `search_path` set to the outbox schema, then `public`.
    ///
    /// Consumes until `shutdown` resolves, then lets running handlers finish (bounded by
    /// `shutdown_timeout`), commits the offsets of final messages and leaves the group.
    ///
    /// # Errors
    /// [`ConsumerError::MissingTopics`] when a main, retry or dead-letter topic does not exist;
    /// [`ConsumerError::Kafka`] when the clients cannot be created or the broker is unreachable
    /// at startup.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ConsumerError> {
        let pool = self.pool()?;
        let tx = self.transactions(&pool)?;
        // A refused property fails here, by name: librdkafka's own message quotes the value,
        // which may be a secret.
        self.kafka
            .validate()
            .map_err(|e| ConsumerError::Config(e.to_string()))?;
        let partitions = Arc::new(Mutex::new(Partitions::default()));
        let cc = self.client_config();
        let last_final = Arc::new(Mutex::new(HashMap::new()));
        let backpressure = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let assigned = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let kafka_outage = Arc::new(crate::outage::Outage::new("kafka", "consumer"));
        let lag = Arc::new(Mutex::new(std::collections::BTreeMap::new()));
        let consumer: Arc<StreamConsumer<Ctx>> = Arc::new(cc.create_with_context(Ctx {
            holds_stale: self.holds_stale.clone(),
            lag: lag.clone(),
            kafka_outage: kafka_outage.clone(),
            assigned: assigned.clone(),
            breakers: self.config.breaker.as_ref().map(|_| self.breakers.clone()),
            drain_topics: if self.config.breaker.is_some() {
                self.config
                    .topics
                    .iter()
                    .map(|t| self.config.dlq_topic(t))
                    .collect()
            } else {
                HashSet::new()
            },
            group: self.config.group.clone(),
            last_final: last_final.clone(),
            partitions: partitions.clone(),
            backpressure: backpressure.clone(),
        })?);

        let pc = crate::kafka::idempotent_producer(&self.kafka, self.config.delivery_timeout, 2);
        let producer: FutureProducer<crate::kafka::KafkaQuiet> =
            pc.create_with_context(crate::kafka::KafkaQuiet(kafka_outage.clone()))?;

        // Missing retry/DLQ topics must stop us now, not at the first failure.
        let required = self.required_topics();
        let md = {
            let probe = consumer
                .client()
                .fetch_metadata(None, Timeout::After(Duration::from_secs(15)))?;
            probe
                .topics()
                .iter()
                .filter(|t| t.error().is_none())
                .map(|t| t.name().to_owned())
                .collect::<HashSet<_>>()
        };
        let missing: Vec<String> = required
            .iter()
            .filter(|t| !md.contains(*t))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(ConsumerError::MissingTopics(missing));
        }
        let dlq_topics: Vec<String> = self
            .config
            .topics
            .iter()
            .map(|t| self.config.dlq_topic(t))
            .collect();
        upkeep::check_retention(&self.kafka, &dlq_topics, self.config.cleanup.as_ref()).await?;
        let retry_topics = self.config.retry_topics();
        let mut subscribe: Vec<String> = self.config.topics.clone();
        subscribe.extend(retry_topics.keys().cloned());
        // With a breaker the group also reads its topics' DLQs, paused except during drains.
        let drain_topics = self.drain_topics();
        subscribe.extend(drain_topics.keys().cloned());
        consumer.subscribe(&subscribe.iter().map(String::as_str).collect::<Vec<_>>())?;

        let cancel = CancellationToken::new();
        if let Some(addr) = self.config.metrics_addr {
            #[cfg(feature = "prometheus")]
            {
                let c = cancel.clone();
                crate::metrics::serve_with_health(
                    addr,
                    self.config.metrics_allowed_hosts.clone(),
                    Some(self.health.clone()),
                    async move { c.cancelled().await },
                )
                .await
                .map_err(|e| ConsumerError::Config(format!("metrics address {addr}: {e}")))?;
            }
            #[cfg(not(feature = "prometheus"))]
            return Err(ConsumerError::Config(format!(
                "metrics address {addr}: outbox was built without its `prometheus` feature"
            )));
        }
        {
            let (cancel, health) = (cancel.clone(), self.health.clone());
            tokio::spawn(async move {
                shutdown.await;
                health.stopping();
                cancel.cancel();
            });
        }
        crate::health::spawn_prober(
            self.health.clone(),
            pool.clone(),
            self.db.clone(),
            self.kafka.clone(),
            cancel.clone(),
        );
        // The DLQ health series exist from the start (at 0), so rates and alerts see them.
        let group = self.config.group.clone();
        metrics::gauge!(crate::metrics::CONSUMER_DLQ_BLOCKED, "group" => group.clone()).set(0.0);
        for t in self
            .config
            .topics
            .iter()
            .map(|t| self.config.dlq_topic(t))
            .chain(retry_topics.keys().cloned())
        {
            metrics::counter!(crate::metrics::CONSUMER_DLQ_WRITE_FAILURES, "topic" => t, "group" => group.clone())
                .increment(0);
        }
        tokio::spawn(upkeep::run(
            pool.clone(),
            self.db.schema.clone(),
            group,
            self.config.cleanup.clone(),
            self.stats.clone(),
            cancel.clone(),
        ));
        {
            // The heartbeat the admin server's overview reads: mode, paused partitions,
            // messages in flight, lag per partition in messages and seconds.
            let beat = crate::instances::Heartbeat::new(
                pool.clone(),
                &self.db.schema,
                "consumer",
                &self.config.group,
            );
            let (stats, breakers, c) = (self.stats.clone(), self.breakers.clone(), cancel.clone());
            let with_breaker = self.config.breaker.is_some();
            let dependencies = self
                .config
                .breaker
                .as_ref()
                .map(|b| b.dependencies.clone())
                .unwrap_or_default();
            tokio::spawn(async move {
                loop {
                    let mode = if with_breaker {
                        breakers.mode()
                    } else {
                        BreakerMode::Normal
                    };
                    let (lag, lag_secs): (serde_json::Map<_, _>, serde_json::Map<_, _>) = lag
                        .lock()
                        .expect("lag lock")
                        .iter()
                        .map(|(k, (n, secs))| {
                            ((k.clone(), (*n).into()), (k.clone(), (*secs).into()))
                        })
                        .unzip();
                    beat.beat(serde_json::json!({
                        "mode": mode,
                        "paused_partitions": ConsumerStats::get(&stats.paused_partitions),
                        "in_flight": ConsumerStats::get(&stats.in_flight),
                        "handled": ConsumerStats::get(&stats.handled),
                        "dead_lettered": ConsumerStats::get(&stats.dead_lettered),
                        "lag": lag,
                        "lag_secs": lag_secs,
                        "dependencies": dependencies,
                    }))
                    .await;
                    tokio::select! {
                        () = c.cancelled() => {
                            beat.stopped().await;
                            return;
                        }
                        () = tokio::time::sleep(crate::instances::HEARTBEAT_EVERY) => {}
                    }
                }
            });
        }
        if self.config.breaker.is_some() {
            // Every replica re-reads the shared breaker rows on its own clock.
            let (b, c, every) = (
                self.breakers.clone(),
                cancel.clone(),
                self.breakers.config.check_interval,
            );
            b.refresh().await;
            tokio::spawn(async move {
                // On a fixed schedule (not "interval after the last refresh"), so the time a
                // refresh takes never pushes the next one back: a re-open is seen within one
                // check, also while draining.
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick.tick().await;
                loop {
                    tokio::select! {
                        () = c.cancelled() => return,
                        _ = tick.tick() => b.refresh().await,
                    }
                }
            });
        }
        let shared = Arc::new(self.into_shared(
            tx,
            pool,
            Sink::Kafka(producer),
            cancel.clone(),
            retry_topics,
            drain_topics,
        )?);
        if shared.holds.enabled() {
            tokio::spawn(held::run(shared.clone()));
        }
        // The mark writers of call handlers, one connection each; they outlive the runtime's
        // shutdown so messages finishing meanwhile still get their marks.
        let writers_stop = CancellationToken::new();
        let shared_marks = shared.clone();
        let writers: Vec<_> = if shared.has_calls {
            (0..call::writers(shared.config.concurrency))
                .map(|_| tokio::spawn(call::write_marks(shared.clone(), writers_stop.clone())))
                .collect()
        } else {
            Vec::new()
        };
        info!(group = %shared.config.group, topics = ?subscribe, concurrency = shared.config.concurrency, "consumer started");
        if shared.breaker().is_some() {
            // A first drain at startup picks up letters parked before a restart.
            shared.breakers.set_mode(
                BreakerMode::Drain,
                "startup: draining letters parked earlier",
            );
        }
        let mut rt = Runtime::new(
            consumer,
            partitions,
            shared,
            backpressure,
            last_final,
            assigned,
            kafka_outage,
        );
        rt.run(cancel).await;
        // The runtime waited for its handlers (bounded by `shutdown_timeout`); the writers
        // finish the group they are writing, bounded too, and then nothing waits on them.
        writers_stop.cancel();
        let aborts: Vec<_> = writers
            .iter()
            .map(tokio::task::JoinHandle::abort_handle)
            .collect();
        if tokio::time::timeout(Duration::from_secs(10), futures::future::join_all(writers))
            .await
            .is_err()
        {
            tracing::warn!("mark writers still busy 10 s after shutdown: their messages stay uncommitted and are redelivered");
            for a in aborts {
                a.abort();
            }
        }
        shared_marks.marks.close();
        Ok(())
    }
}
