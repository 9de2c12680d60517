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

mod dead_letter;
mod handler;
mod inbox;
mod offsets;
mod retry;

pub use dead_letter::*;
pub use handler::{BatchHandler, BoxFuture, Delivered, ErrorKind, Handler, HandlerError};
pub use inbox::{Inbox, InboxOutcome};
pub use retry::{
    retry_suffix, RetryStrategy, DEFAULT_IN_PLACE_ATTEMPTS, DEFAULT_IN_PLACE_BASE,
    DEFAULT_IN_PLACE_MAX, DEFAULT_RETRY_DELAYS,
};

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_postgres::Pool;
use futures::FutureExt;
use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message as _};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::backoff::Backoff;
use crate::config::{DbConfig, KafkaConfig};
use crate::message::{HEADER_MESSAGE_ID, HEADER_MESSAGE_TYPE};
use offsets::OffsetTracker;

/// Default handler concurrency.
pub const DEFAULT_CONCURRENCY: usize = 16;
/// Default bound on accepted-but-unfinished messages before partitions are paused.
pub const DEFAULT_MAX_BUFFERED: usize = 4096;
/// Default dead-letter suffix.
pub const DEFAULT_DLQ_SUFFIX: &str = "dlq";
/// Longest accepted `message_id`.
const MAX_MESSAGE_ID_LEN: usize = 200;

/// Consumer settings. `group` must be given explicitly: a group derived from a host name
/// changes with every deployment and silently re-reads or skips the topic.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// The consumer group, e.g. `billing-service`.
    pub group: String,
    /// Topics to consume (their retry topics are added for [`RetryStrategy::Topics`]).
    pub topics: Vec<String>,
    /// Handlers running at once (default [`DEFAULT_CONCURRENCY`]).
    pub concurrency: usize,
    /// Accepted-but-unfinished messages before partitions are paused (default
    /// [`DEFAULT_MAX_BUFFERED`]).
    pub max_buffered: usize,
    /// How transient failures are retried.
    pub retry: RetryStrategy,
    /// Dead-letter topic suffix: `<topic>.<suffix>` (default `dlq`).
    pub dlq_suffix: String,
    /// librdkafka `message.timeout.ms` for retry/DLQ writes (default 30 s).
    pub delivery_timeout: Duration,
    /// How long shutdown waits for running handlers (default 30 s).
    pub shutdown_timeout: Duration,
    /// At `max_buffered` with no handler finishing for this long, every partition is paused
    /// (default [`DEFAULT_PAUSE_AFTER`]).
    pub pause_after: Duration,
}

impl ConsumerConfig {
    /// Settings for `group` reading `topics`, with the defaults.
    pub fn new(
        group: impl Into<String>,
        topics: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            group: group.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            concurrency: DEFAULT_CONCURRENCY,
            max_buffered: DEFAULT_MAX_BUFFERED,
            retry: RetryStrategy::default(),
            dlq_suffix: DEFAULT_DLQ_SUFFIX.into(),
            delivery_timeout: Duration::from_secs(30),
            shutdown_timeout: Duration::from_secs(30),
            pause_after: DEFAULT_PAUSE_AFTER,
        }
    }

    fn validate(&self) -> Result<(), ConsumerError> {
        let bad = |m: String| Err(ConsumerError::Config(m));
        if self.group.trim().is_empty()
            || self.group.len() > 255
            || self.group.chars().any(char::is_control)
        {
            return bad(format!(
                "invalid consumer group {:?}: give an explicit, printable name",
                self.group
            ));
        }
        if self.topics.is_empty() {
            return bad("no topics to consume".into());
        }
        for t in &self.topics {
            crate::topic::validate_topic(t).map_err(|e| ConsumerError::Config(e.to_string()))?;
        }
        if self.concurrency == 0 || self.max_buffered == 0 {
            return bad("concurrency and max_buffered must be at least 1".into());
        }
        match &self.retry {
            RetryStrategy::InPlace { attempts, .. } if *attempts == 0 => {
                bad("in-place attempts must be at least 1".into())
            }
            RetryStrategy::Topics { delays } => {
                for d in delays {
                    retry_suffix(*d).map_err(ConsumerError::Config)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn dlq_topic(&self, topic: &str) -> String {
        format!("{topic}.{}", self.dlq_suffix)
    }

    /// Every retry topic, mapped to (original topic, hop index).
    fn retry_topics(&self) -> HashMap<String, (String, usize)> {
        let mut m = HashMap::new();
        if let RetryStrategy::Topics { delays } = &self.retry {
            for t in &self.topics {
                for (i, d) in delays.iter().enumerate() {
                    if let Ok(s) = retry_suffix(*d) {
                        m.insert(format!("{t}.{s}"), (t.clone(), i));
                    }
                }
            }
        }
        m
    }
}

/// Why the consumer could not start or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// Invalid settings.
    #[error("invalid consumer configuration: {0}")]
    Config(String),
    /// Topics (main, retry or dead-letter) missing on the broker.
    #[error("missing topics: {} (create them with `outbox topics apply`; they are never auto-created)", .0.join(", "))]
    MissingTopics(Vec<String>),
    /// Kafka refused a setting or could not be reached at startup.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
}

/// Counters of what the consumer did, readable while it runs.
#[derive(Debug, Default)]
pub struct ConsumerStats {
    /// Handled and committed.
    pub handled: AtomicU64,
    /// Skipped as already processed.
    pub duplicates: AtomicU64,
    /// Skipped because no handler is registered for the `message_type`.
    pub skipped_unknown: AtomicU64,
    /// Written to a dead-letter topic (acknowledged).
    pub dead_lettered: AtomicU64,
    /// Forwarded to a retry topic (acknowledged).
    pub forwarded_to_retry: AtomicU64,
    /// In-place retries performed.
    pub in_place_retries: AtomicU64,
    /// Messages that failed decoding.
    pub decode_errors: AtomicU64,
    /// Handler panics caught.
    pub panics: AtomicU64,
    /// Failed attempts to write a retry or dead-letter record (retried).
    pub forward_failures: AtomicU64,
    /// Times all partitions were paused for backpressure.
    pub backpressure_pauses: AtomicU64,
    /// Waits for the consumer's database to come back (no retry budget spent).
    pub outage_waits: AtomicU64,
}

impl ConsumerStats {
    fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads one counter.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

type Tp = (String, i32);

/// Shared with the rebalance callback: which partitions we own and their offset trackers.
#[derive(Default)]
struct Partitions {
    trackers: HashMap<Tp, OffsetTracker>,
    next_epoch: u64,
    revoked: Vec<Tp>,
}

struct Ctx {
    partitions: Arc<Mutex<Partitions>>,
    /// Mirrors the runtime's backpressure pause, so partitions assigned meanwhile start paused.
    backpressure: Arc<std::sync::atomic::AtomicBool>,
}

impl ClientContext for Ctx {}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                // A pause set by us survives revoke and re-assign in librdkafka: lift it, or a
                // retry partition held until due (its queue is dropped below) would stay paused.
                let _ = c.resume(tpl);
                // librdkafka commits the stored offsets (final messages only) right after this.
                // Forget the trackers so late outcomes of revoked partitions store nothing.
                let mut p = self.partitions.lock().expect("partitions lock");
                for e in tpl.elements() {
                    let k = (e.topic().to_owned(), e.partition());
                    p.trackers.remove(&k);
                    p.revoked.push(k);
                }
                info!(partitions = tpl.count(), "partitions revoked");
            }
            Rebalance::Assign(tpl) => info!(partitions = tpl.count(), "partitions assigned"),
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
        }
    }

    fn post_rebalance(&self, c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            if self.backpressure.load(Ordering::SeqCst) {
                // Backpressure is on: new partitions must not flow in unbounded.
                let _ = c.pause(tpl);
            }
        }
    }
}

/// A received record, owned.
#[derive(Debug, Clone)]
struct Raw {
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp_ms: Option<i64>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum LaneId {
    Key(Vec<u8>),
    Offset(i64),
}
type LaneKey = (String, i32, LaneId);

struct Envelope {
    raw: Raw,
    epoch: u64,
    due: Option<Instant>,
    origin: Origin,
    /// Decoded before dispatch: a decode error never reaches a handler or spends retries.
    decoded: Result<Delivered, String>,
}

/// A registered handler.
#[derive(Clone)]
enum HandlerRef {
    Single(Arc<dyn Handler>),
    Batch(Arc<dyn BatchHandler>, usize),
}

#[derive(Default)]
struct Lane {
    queue: VecDeque<Envelope>,
    busy: bool,
}

/// How processing of one message ended.
#[derive(Clone, Copy)]
enum Fate {
    /// Handled, duplicate, skipped, forwarded or dead-lettered with the broker's ack.
    Final,
    /// Given up at shutdown: not final, the offset stays before it.
    Abandoned,
}

/// The outcome of one task (one message, or a batch of messages from different lanes).
struct Done {
    items: Vec<DoneItem>,
}

struct DoneItem {
    lane: LaneKey,
    tp: Tp,
    offset: i64,
    epoch: u64,
    fate: Fate,
}

/// Where a record originally came from (survives retry hops).
#[derive(Debug, Clone)]
struct Origin {
    topic: String,
    partition: i32,
    offset: i64,
    hop: u32,
}

struct Shared {
    pool: Pool,
    producer: FutureProducer,
    handlers: HashMap<String, HandlerRef>,
    config: ConsumerConfig,
    retry_topics: HashMap<String, (String, usize)>,
    inbox: Inbox,
    stats: Arc<ConsumerStats>,
    cancel: CancellationToken,
}

/// The consumer runtime. Register handlers with [`Consumer::handler`], then [`Consumer::run`].
pub struct Consumer {
    db: DbConfig,
    kafka: KafkaConfig,
    config: ConsumerConfig,
    handlers: HashMap<String, HandlerRef>,
    stats: Arc<ConsumerStats>,
}

impl Consumer {
    /// A consumer over `db` (for `processed_messages` and handler transactions) and `kafka`.
    ///
    /// # Errors
    /// [`ConsumerError::Config`] for invalid settings.
    pub fn new(
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
        Ok(Self {
            db: db.clone(),
            kafka: kafka.clone(),
            config,
            handlers: HashMap::new(),
            stats: Arc::default(),
        })
    }

    /// Registers the handler for `message_type` (replacing any earlier one).
    #[must_use]
    pub fn handler(mut self, message_type: impl Into<String>, handler: impl Handler) -> Self {
        self.handlers
            .insert(message_type.into(), HandlerRef::Single(Arc::new(handler)));
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

    /// Counters, shared with the running consumer.
    pub fn stats(&self) -> Arc<ConsumerStats> {
        self.stats.clone()
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
        let partitions = Arc::new(Mutex::new(Partitions::default()));
        let mut cc = self.kafka.client_config();
        cc.set("group.id", &self.config.group)
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "1000")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("allow.auto.create.topics", "false");
        if !self.kafka.properties.contains_key("auto.offset.reset") {
            cc.set("auto.offset.reset", "earliest");
        }
        if !self
            .kafka
            .properties
            .contains_key("queued.max.messages.kbytes")
        {
            // Bounds librdkafka's prefetch buffer (per partition), part of "bounded memory".
            cc.set("queued.max.messages.kbytes", "8192");
        }
        let backpressure = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let consumer: StreamConsumer<Ctx> = cc.create_with_context(Ctx {
            partitions: partitions.clone(),
            backpressure: backpressure.clone(),
        })?;

        let mut pc = self.kafka.client_config();
        pc.set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "2")
            .set("allow.auto.create.topics", "false")
            .set(
                "message.timeout.ms",
                self.config.delivery_timeout.as_millis().to_string(),
            );
        let producer: FutureProducer = pc.create()?;

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
        let retry_topics = self.config.retry_topics();
        let mut subscribe: Vec<String> = self.config.topics.clone();
        subscribe.extend(retry_topics.keys().cloned());
        consumer.subscribe(&subscribe.iter().map(String::as_str).collect::<Vec<_>>())?;

        let mut db = self.db.clone();
        db.pool_size = self.config.concurrency + 2;
        // Handlers see the consumer's schema first, so their business tables (which live next
        // to processed_messages, seed 002) resolve without qualification.
        let opts = format!(
            "{} -c search_path={},public",
            db.pg.get_options().unwrap_or(""),
            db.schema.name()
        );
        db.pg.options(opts.trim());
        let pool = crate::db::pool(&db).map_err(|e| ConsumerError::Config(format!("pool: {e}")))?;
        let cancel = CancellationToken::new();
        {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                shutdown.await;
                cancel.cancel();
            });
        }
        let shared = Arc::new(Shared {
            pool,
            producer,
            handlers: self.handlers,
            inbox: Inbox::new(&self.db.schema, self.config.group.clone()),
            retry_topics,
            config: self.config,
            stats: self.stats,
            cancel: cancel.clone(),
        });
        info!(group = %shared.config.group, topics = ?subscribe, concurrency = shared.config.concurrency, "consumer started");
        let mut rt = Runtime {
            consumer: &consumer,
            partitions,
            shared,
            lanes: HashMap::new(),
            ready: VecDeque::new(),
            running: 0,
            buffered: 0,
            delayed: HashMap::new(),
            bp_paused: false,
            backpressure,
            saturated_since: None,
            last_progress: Instant::now(),
        };
        rt.run(cancel).await;
        Ok(())
    }
}

struct Runtime<'c> {
    consumer: &'c StreamConsumer<Ctx>,
    partitions: Arc<Mutex<Partitions>>,
    shared: Arc<Shared>,
    lanes: HashMap<LaneKey, Lane>,
    ready: VecDeque<LaneKey>,
    running: usize,
    buffered: usize,
    delayed: HashMap<Tp, VecDeque<Envelope>>,
    bp_paused: bool,
    backpressure: Arc<std::sync::atomic::AtomicBool>,
    saturated_since: Option<Instant>,
    last_progress: Instant,
}

/// Default for [`ConsumerConfig::pause_after`]: how long the runtime may sit at
/// `max_buffered` with no handler finishing before it pauses every partition. A full buffer
/// that keeps draining costs nothing: librdkafka's bounded prefetch queue absorbs it, whereas a pause discards the prefetched data and refetches it on resume
/// (measured: pausing at every saturation capped a 16-way consumer at ~1,000 msg/s).
pub const DEFAULT_PAUSE_AFTER: Duration = Duration::from_secs(2);

fn tpl_of<'a>(tps: impl IntoIterator<Item = &'a Tp>) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (t, p) in tps {
        tpl.add_partition(t, *p);
    }
    tpl
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Runtime<'_> {
    async fn run(&mut self, cancel: CancellationToken) {
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
        loop {
            self.forget_revoked();
            self.dispatch(&done_tx);
            self.backpressure();
            let next_due = self
                .delayed
                .values()
                .filter_map(|q| q.front())
                .filter_map(|e| e.due)
                .min();
            let pause_at = self
                .saturated_since
                .filter(|_| !self.bp_paused)
                .map(|t| t.max(self.last_progress) + self.shared.config.pause_after);
            let next_wake = [next_due, pause_at].into_iter().flatten().min();
            // At the bound, stop pulling from librdkafka (its prefetch queue is bounded too);
            // once paused, keep polling so rebalances are served.
            let accepting = self.buffered < self.shared.config.max_buffered || self.bp_paused;
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                Some(done) = done_rx.recv() => self.on_done(done),
                () = tokio::time::sleep_until(next_wake.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))), if next_wake.is_some() => {
                    self.release_due();
                }
                m = self.consumer.recv(), if accepting => match m {
                    Ok(m) => self.on_message(&m),
                    Err(e) => {
                        warn!(error = %e, "kafka consumer error");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }

        // Soft stop: no new handlers; running ones finish or give up their retries.
        info!(running = self.running, "consumer stopping");
        let deadline = Instant::now() + self.shared.config.shutdown_timeout;
        while self.running > 0 {
            match tokio::time::timeout_at(deadline, done_rx.recv()).await {
                Ok(Some(done)) => self.on_done(done),
                _ => {
                    warn!(running = self.running, "handlers still running at the shutdown deadline; their offsets stay uncommitted");
                    break;
                }
            }
        }
        match self
            .consumer
            .commit_consumer_state(rdkafka::consumer::CommitMode::Sync)
        {
            Ok(()) => {}
            Err(KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => {}
            Err(e) => {
                warn!(error = %e, "final offset commit failed; uncommitted messages will be redelivered")
            }
        }
        info!("consumer stopped");
    }

    fn forget_revoked(&mut self) {
        let revoked = std::mem::take(&mut self.partitions.lock().expect("partitions lock").revoked);
        for tp in revoked {
            if let Some(q) = self.delayed.remove(&tp) {
                self.buffered -= q.len();
            }
        }
    }

    fn epoch_valid(&self, tp: &Tp, epoch: u64) -> bool {
        self.partitions
            .lock()
            .expect("partitions lock")
            .trackers
            .get(tp)
            .is_some_and(|t| t.epoch == epoch)
    }

    fn on_message(&mut self, m: &rdkafka::message::BorrowedMessage<'_>) {
        let raw = Raw {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().map(<[u8]>::to_vec),
            // rdkafka's header iterator panics on a header *name* that is not UTF-8; such a
            // record is unreadable and goes to the DLQ as a decode error (key and body intact).
            headers: match std::panic::catch_unwind(AssertUnwindSafe(|| {
                m.headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default()
            })) {
                Ok(h) => h,
                Err(_) => vec![(UNREADABLE_HEADERS.to_owned(), None)],
            },
            timestamp_ms: m.timestamp().to_millis(),
        };
        let tp = (raw.topic.clone(), raw.partition);
        let epoch = {
            let mut p = self.partitions.lock().expect("partitions lock");
            let epoch = p.next_epoch;
            let t = p
                .trackers
                .entry(tp.clone())
                .or_insert_with(|| OffsetTracker::new(epoch));
            t.begin(raw.offset);
            let e = t.epoch;
            if e == epoch {
                p.next_epoch += 1;
            }
            e
        };
        self.buffered += 1;
        let due = self.shared.retry_topics.get(&raw.topic).map(|(_, hop)| {
            let RetryStrategy::Topics { delays } = &self.shared.config.retry else {
                unreachable!()
            };
            // A record is due `delay` after it was written; a timestamp from the future (clock
            // skew, a hostile producer) cannot hold the partition longer than `delay`.
            let delay = delays[*hop];
            let written = raw.timestamp_ms.unwrap_or_else(now_ms).min(now_ms());
            let due_ms = written.saturating_add(delay.as_millis() as i64);
            let wait = u64::try_from(due_ms.saturating_sub(now_ms()))
                .unwrap_or(0)
                .min(delay.as_millis() as u64);
            Instant::now() + Duration::from_millis(wait)
        });
        let origin = origin(&raw, &self.shared);
        let decoded = decode(&raw, &origin);
        let env = Envelope {
            raw,
            epoch,
            due,
            origin,
            decoded,
        };
        let waiting = self.delayed.get(&tp).is_some_and(|q| !q.is_empty());
        if waiting || env.due.is_some_and(|d| d > Instant::now()) {
            if !waiting {
                // Not due yet: hold the record and pause its retry partition until it is. The
                // poll loop keeps running (other partitions flow; the group stays alive).
                if let Err(e) = self.consumer.pause(&tpl_of([&tp])) {
                    warn!(error = %e, "pause of retry partition failed");
                }
                debug!(topic = %tp.0, partition = tp.1, "retry partition paused until due");
            }
            self.delayed.entry(tp).or_default().push_back(env);
        } else {
            self.enqueue(env);
        }
    }

    fn enqueue(&mut self, env: Envelope) {
        let id = match &env.raw.key {
            Some(k) => LaneId::Key(k.clone()),
            None => LaneId::Offset(env.raw.offset),
        };
        let key = (env.raw.topic.clone(), env.raw.partition, id);
        let lane = self.lanes.entry(key.clone()).or_default();
        lane.queue.push_back(env);
        if !lane.busy && lane.queue.len() == 1 {
            self.ready.push_back(key);
        }
    }

    fn release_due(&mut self) {
        let now = Instant::now();
        let tps: Vec<Tp> = self.delayed.keys().cloned().collect();
        for tp in tps {
            let mut released = Vec::new();
            let q = self.delayed.get_mut(&tp).expect("present");
            while q.front().is_some_and(|e| e.due.is_none_or(|d| d <= now)) {
                released.push(q.pop_front().expect("front"));
            }
            let empty = q.is_empty();
            for env in released {
                self.enqueue(env);
            }
            if empty {
                self.delayed.remove(&tp);
                if !self.bp_paused {
                    if let Err(e) = self.consumer.resume(&tpl_of([&tp])) {
                        debug!(error = %e, "resume of retry partition failed");
                    }
                }
            }
        }
    }

    /// Pops the head of the next ready lane, or `None` when no lane is ready. Heads of
    /// revoked partitions are dropped (the new owner redelivers them).
    fn next_head(&mut self) -> Option<(LaneKey, Envelope)> {
        loop {
            let key = self.ready.pop_front()?;
            let Some(lane) = self.lanes.get_mut(&key) else {
                continue;
            };
            let Some(env) = lane.queue.pop_front() else {
                self.lanes.remove(&key);
                continue;
            };
            let tp = (env.raw.topic.clone(), env.raw.partition);
            if self.epoch_valid(&tp, env.epoch) {
                self.lanes.get_mut(&key).expect("lane").busy = true;
                return Some((key, env));
            }
            self.buffered -= 1;
            let lane = self.lanes.get_mut(&key).expect("lane");
            if lane.queue.is_empty() {
                self.lanes.remove(&key);
            } else {
                self.ready.push_back(key);
            }
        }
    }

    /// The batch handler and bound for an envelope, if its type has one.
    fn batch_of(&self, env: &Envelope) -> Option<(String, usize)> {
        let d = env.decoded.as_ref().ok()?;
        match self.shared.handlers.get(&d.message_type)? {
            HandlerRef::Batch(_, max) => Some((d.message_type.clone(), *max)),
            HandlerRef::Single(_) => None,
        }
    }

    fn dispatch(&mut self, done_tx: &mpsc::UnboundedSender<Done>) {
        while self.running < self.shared.config.concurrency {
            let Some((key, env)) = self.next_head() else {
                return;
            };
            let mut batch = vec![(key, env)];
            if let Some((ty, max)) = self.batch_of(&batch[0].1) {
                // Gather following ready heads of the same type: different lanes, so per-key
                // order is unaffected.
                while batch.len() < max {
                    let same = self
                        .ready
                        .front()
                        .and_then(|k| self.lanes.get(k))
                        .and_then(|l| l.queue.front())
                        .is_some_and(|e| self.batch_of(e).is_some_and(|(t, _)| t == ty));
                    if !same {
                        break;
                    }
                    match self.next_head() {
                        // next_head may have skipped revoked heads and returned another lane's
                        // head: take it only if it is of the same batch type.
                        Some(item) if self.batch_of(&item.1).is_some_and(|(t, _)| t == ty) => {
                            batch.push(item)
                        }
                        Some((k, env)) => {
                            let lane = self.lanes.get_mut(&k).expect("lane");
                            lane.queue.push_front(env);
                            lane.busy = false;
                            self.ready.push_front(k);
                            break;
                        }
                        None => break,
                    }
                }
            }
            self.running += 1;
            let shared = self.shared.clone();
            let tx = done_tx.clone();
            tokio::spawn(async move {
                let envs: Vec<&Envelope> = batch.iter().map(|(_, e)| e).collect();
                let work = async {
                    if envs.len() == 1 {
                        vec![process(envs[0], &shared).await]
                    } else {
                        process_batch(&envs, &shared).await
                    }
                };
                // Whatever happens, the slot and the lanes come back; a bug here abandons the
                // messages (offsets stay before them) instead of wedging the consumer.
                let fates = AssertUnwindSafe(work)
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|_| {
                        warn!("message task panicked: its messages stay uncommitted");
                        vec![Fate::Abandoned; envs.len()]
                    });
                let items = batch
                    .iter()
                    .zip(fates)
                    .map(|((lane, env), fate)| DoneItem {
                        lane: lane.clone(),
                        tp: (env.raw.topic.clone(), env.raw.partition),
                        offset: env.raw.offset,
                        epoch: env.epoch,
                        fate,
                    })
                    .collect();
                let _ = tx.send(Done { items });
            });
        }
    }

    fn on_done(&mut self, done: Done) {
        self.running -= 1;
        self.last_progress = Instant::now();
        let mut stores = TopicPartitionList::new();
        for item in done.items {
            self.buffered -= 1;
            if let Some(lane) = self.lanes.get_mut(&item.lane) {
                lane.busy = false;
                if lane.queue.is_empty() {
                    self.lanes.remove(&item.lane);
                } else {
                    self.ready.push_back(item.lane);
                }
            }
            if let Fate::Final = item.fate {
                let point = {
                    let mut p = self.partitions.lock().expect("partitions lock");
                    match p.trackers.get_mut(&item.tp) {
                        Some(t) if t.epoch == item.epoch => t.finish(item.offset),
                        _ => None,
                    }
                };
                if let Some(next) = point {
                    // A later item of the same partition overrides an earlier one: both are
                    // commit points and offsets only grow.
                    let _ =
                        stores.add_partition_offset(&item.tp.0, item.tp.1, Offset::Offset(next));
                }
            }
        }
        if stores.count() > 0 {
            if let Err(e) = self.consumer.store_offsets(&stores) {
                debug!(error = %e, "offset store refused (partition revoked?)");
            }
        }
    }

    fn backpressure(&mut self) {
        let max = self.shared.config.max_buffered;
        if self.buffered >= max {
            // Stalled = at the bound and no handler finished for `pause_after`. A full buffer
            // that keeps draining is just a backlog: pulling at the handlers' pace is enough.
            let since = *self.saturated_since.get_or_insert_with(Instant::now);
            let stalled_for = since.max(self.last_progress).elapsed();
            if !self.bp_paused && stalled_for >= self.shared.config.pause_after {
                if let Ok(a) = self.consumer.assignment() {
                    if self.consumer.pause(&a).is_ok() {
                        self.bp_paused = true;
                        self.backpressure.store(true, Ordering::SeqCst);
                        ConsumerStats::inc(&self.shared.stats.backpressure_pauses);
                        info!(
                            buffered = self.buffered,
                            "backpressure: handlers saturated, all partitions paused"
                        );
                    }
                }
            }
        } else {
            self.saturated_since = None;
        }
        if self.bp_paused && self.buffered <= max / 2 {
            if let Ok(a) = self.consumer.assignment() {
                let mut tpl = TopicPartitionList::new();
                for e in a.elements() {
                    let tp = (e.topic().to_owned(), e.partition());
                    if !self.delayed.contains_key(&tp) {
                        tpl.add_partition(e.topic(), e.partition());
                    }
                }
                if self.consumer.resume(&tpl).is_ok() {
                    self.bp_paused = false;
                    self.backpressure.store(false, Ordering::SeqCst);
                    info!(
                        buffered = self.buffered,
                        "backpressure released: partitions resumed"
                    );
                }
            }
        }
    }
}

fn origin(raw: &Raw, shared: &Shared) -> Origin {
    match shared.retry_topics.get(&raw.topic) {
        Some((orig, hop)) => Origin {
            topic: orig.clone(),
            partition: raw
                .header(X_ORIGINAL_PARTITION)
                .and_then(|v| v.parse().ok())
                .unwrap_or(raw.partition),
            offset: raw
                .header(X_ORIGINAL_OFFSET)
                .and_then(|v| v.parse().ok())
                .unwrap_or(raw.offset),
            hop: *hop as u32 + 1,
        },
        None => Origin {
            topic: raw.topic.clone(),
            partition: raw.partition,
            offset: raw.offset,
            hop: 0,
        },
    }
}

/// Marks a record whose headers could not be read (a header name that is not UTF-8).
const UNREADABLE_HEADERS: &str = "\u{0}outbox-unreadable-headers";

/// Validates a record into a [`Delivered`], or says why it cannot be handled.
fn decode(raw: &Raw, origin: &Origin) -> Result<Delivered, String> {
    if raw.headers.iter().any(|(k, _)| k == UNREADABLE_HEADERS) {
        return Err("a header name is not valid UTF-8".into());
    }
    let required = |name: &str| -> Result<String, String> {
        let mut values = raw
            .headers
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_deref());
        let first = values
            .next()
            .ok_or_else(|| format!("missing {name} header"))?;
        let text = first
            .and_then(|v| std::str::from_utf8(v).ok())
            .ok_or_else(|| format!("{name} header is empty or not UTF-8"))?;
        if text.trim().is_empty() {
            return Err(format!("{name} header is empty"));
        }
        if values.any(|v| v != Some(text.as_bytes())) {
            return Err(format!("contradictory duplicate {name} headers"));
        }
        Ok(text.to_owned())
    };
    let message_type = required(HEADER_MESSAGE_TYPE)?;
    let message_id = required(HEADER_MESSAGE_ID)?;
    if message_id.len() > MAX_MESSAGE_ID_LEN {
        return Err(format!(
            "message_id header longer than {MAX_MESSAGE_ID_LEN} bytes"
        ));
    }
    let payload = raw.payload.as_deref().ok_or("no body (null value)")?;
    let body: serde_json::Value =
        serde_json::from_slice(payload).map_err(|e| format!("body is not valid JSON: {e}"))?;
    Ok(Delivered {
        topic: origin.topic.clone(),
        source_topic: raw.topic.clone(),
        partition: raw.partition,
        offset: raw.offset,
        key: raw.key.clone(),
        headers: raw.headers.clone(),
        payload: payload.to_vec(),
        message_type,
        message_id,
        body,
        retry_attempt: origin.hop,
    })
}

/// The handler's transaction: mark first, then the handler; both commit or neither.
async fn run_in_tx(
    shared: &Shared,
    handler: &HandlerRef,
    d: &Delivered,
) -> Result<InboxOutcome, HandlerError> {
    let mut conn = shared
        .pool
        .get()
        .await
        .map_err(|e| HandlerError::unavailable(format!("postgres pool: {e}")))?;
    let tx = conn.transaction().await?;
    if !shared.inbox.mark(&*tx, &d.topic, &d.message_id).await? {
        tx.rollback().await?;
        return Ok(InboxOutcome::Duplicate);
    }
    match handler {
        HandlerRef::Single(h) => h.handle(d, &tx).await?,
        HandlerRef::Batch(h, _) => h.handle_batch(&[d], &tx).await?,
    }
    tx.commit().await?;
    Ok(InboxOutcome::Processed)
}

/// One transaction for many messages: one multi-row mark, the batch handler on the first
/// deliveries, one commit. Returns (handled, duplicates).
async fn run_batch_in_tx(
    shared: &Shared,
    handler: &dyn BatchHandler,
    ds: &[&Delivered],
) -> Result<(usize, usize), HandlerError> {
    let mut conn = shared
        .pool
        .get()
        .await
        .map_err(|e| HandlerError::unavailable(format!("postgres pool: {e}")))?;
    let tx = conn.transaction().await?;
    let keys: Vec<(&str, &str)> = ds
        .iter()
        .map(|d| (d.topic.as_str(), d.message_id.as_str()))
        .collect();
    let mut fresh = shared.inbox.mark_many(&*tx, &keys).await?;
    // Keep the first occurrence of each new pair, in batch order.
    let first: Vec<&Delivered> = ds
        .iter()
        .copied()
        .filter(|d| fresh.remove(&(d.topic.clone(), d.message_id.clone())))
        .collect();
    if !first.is_empty() {
        handler.handle_batch(&first, &tx).await?;
    }
    tx.commit().await?;
    Ok((first.len(), ds.len() - first.len()))
}

/// A batch of heads of different lanes, all of one batch-handled type. On any failure the
/// batch is replayed message by message so each gets its own outcome.
async fn process_batch(envs: &[&Envelope], shared: &Shared) -> Vec<Fate> {
    let ds: Vec<&Delivered> = envs
        .iter()
        .filter_map(|e| e.decoded.as_ref().ok())
        .collect();
    let handler = ds
        .first()
        .and_then(|d| shared.handlers.get(&d.message_type));
    let uniform = ds.len() == envs.len() && ds.iter().all(|d| d.message_type == ds[0].message_type);
    let (Some(HandlerRef::Batch(h, _)), true) = (handler, uniform) else {
        // Defensive: batches are formed only from one batch type; anything else goes one by one.
        let mut fates = Vec::with_capacity(envs.len());
        for env in envs {
            fates.push(process(env, shared).await);
        }
        return fates;
    };
    match AssertUnwindSafe(run_batch_in_tx(shared, h.as_ref(), &ds))
        .catch_unwind()
        .await
    {
        Ok(Ok((handled, dups))) => {
            shared
                .stats
                .handled
                .fetch_add(handled as u64, Ordering::Relaxed);
            shared
                .stats
                .duplicates
                .fetch_add(dups as u64, Ordering::Relaxed);
            envs.iter().map(|_| Fate::Final).collect()
        }
        Ok(Err(e)) => {
            debug!(error = %e, size = envs.len(), "batch failed: retrying its messages one by one");
            let mut fates = Vec::with_capacity(envs.len());
            for env in envs {
                fates.push(process(env, shared).await);
            }
            fates
        }
        Err(_panic) => {
            debug!(
                size = envs.len(),
                "batch handler panicked: retrying its messages one by one"
            );
            let mut fates = Vec::with_capacity(envs.len());
            for env in envs {
                fates.push(process(env, shared).await);
            }
            fates
        }
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "handler panicked".into())
}

async fn process(env: &Envelope, shared: &Shared) -> Fate {
    let (raw, origin) = (&env.raw, &env.origin);
    let d = match &env.decoded {
        Ok(d) => d,
        Err(reason) => {
            ConsumerStats::inc(&shared.stats.decode_errors);
            warn!(topic = %raw.topic, partition = raw.partition, offset = raw.offset, %reason, "undecodable message: dead-lettering");
            return dead_letter(raw, origin, shared, DeadLetterKind::Decode, reason, 0).await;
        }
    };
    let Some(handler) = shared.handlers.get(&d.message_type) else {
        ConsumerStats::inc(&shared.stats.skipped_unknown);
        debug!(message_type = %d.message_type, "no handler registered: skipped");
        return Fate::Final;
    };
    let mut attempt: u32 = 0;
    let mut outage = Backoff::default();
    loop {
        attempt += 1;
        let result = AssertUnwindSafe(run_in_tx(shared, handler, d))
            .catch_unwind()
            .await;
        let err = match result {
            Ok(Ok(InboxOutcome::Processed)) => {
                ConsumerStats::inc(&shared.stats.handled);
                return Fate::Final;
            }
            Ok(Ok(InboxOutcome::Duplicate)) => {
                ConsumerStats::inc(&shared.stats.duplicates);
                return Fate::Final;
            }
            Err(panic) => {
                ConsumerStats::inc(&shared.stats.panics);
                let text = format!("panic: {}", panic_text(panic.as_ref()));
                warn!(message_id = %d.message_id, error = %text, "handler panicked: dead-lettering");
                return dead_letter(raw, origin, shared, DeadLetterKind::Panic, &text, attempt)
                    .await;
            }
            Ok(Err(e)) => e,
        };
        if err.is_unavailable() {
            // Our database is down: not this message's fault, so no attempt is spent.
            attempt -= 1;
            ConsumerStats::inc(&shared.stats.outage_waits);
            let wait = outage.next_delay();
            if outage.failures() == 1 {
                warn!(error = %err, "database unavailable: holding messages until it is back");
            }
            tokio::select! {
                () = shared.cancel.cancelled() => return Fate::Abandoned,
                () = tokio::time::sleep(wait) => {}
            }
            continue;
        }
        if !err.is_transient() {
            warn!(message_id = %d.message_id, error = %err, "permanent failure: dead-lettering");
            return dead_letter(
                raw,
                origin,
                shared,
                DeadLetterKind::Permanent,
                err.message(),
                attempt,
            )
            .await;
        }
        match &shared.config.retry {
            RetryStrategy::InPlace {
                attempts,
                base,
                max,
            } => {
                if attempt >= *attempts {
                    warn!(message_id = %d.message_id, error = %err, attempt, "retries exhausted: dead-lettering");
                    return dead_letter(
                        raw,
                        origin,
                        shared,
                        DeadLetterKind::TransientExhausted,
                        err.message(),
                        attempt,
                    )
                    .await;
                }
                ConsumerStats::inc(&shared.stats.in_place_retries);
                let wait = RetryStrategy::in_place_delay(*base, *max, attempt);
                debug!(message_id = %d.message_id, error = %err, ?wait, "transient failure: retrying in place");
                tokio::select! {
                    () = shared.cancel.cancelled() => return Fate::Abandoned,
                    () = tokio::time::sleep(wait) => {}
                }
            }
            RetryStrategy::Topics { delays } => {
                let hop = origin.hop as usize;
                if hop >= delays.len() {
                    return dead_letter(
                        raw,
                        origin,
                        shared,
                        DeadLetterKind::TransientExhausted,
                        err.message(),
                        origin.hop + 1,
                    )
                    .await;
                }
                let topic = format!(
                    "{}.{}",
                    origin.topic,
                    retry_suffix(delays[hop]).expect("validated")
                );
                let headers = rebuild(
                    &raw.headers,
                    &[
                        X_RETRY_ATTEMPT,
                        X_ERROR,
                        X_ORIGINAL_TOPIC,
                        X_ORIGINAL_PARTITION,
                        X_ORIGINAL_OFFSET,
                    ],
                    &[
                        (X_RETRY_ATTEMPT, (hop + 1).to_string()),
                        (X_ORIGINAL_TOPIC, origin.topic.clone()),
                        (X_ORIGINAL_PARTITION, origin.partition.to_string()),
                        (X_ORIGINAL_OFFSET, origin.offset.to_string()),
                        (X_ERROR, cut(err.message())),
                    ],
                );
                debug!(message_id = %d.message_id, %topic, "transient failure: forwarding to retry topic");
                return if produce_until_acked(shared, &topic, raw, headers).await {
                    ConsumerStats::inc(&shared.stats.forwarded_to_retry);
                    Fate::Final
                } else {
                    Fate::Abandoned
                };
            }
        }
    }
}

async fn dead_letter(
    raw: &Raw,
    origin: &Origin,
    shared: &Shared,
    kind: DeadLetterKind,
    error: &str,
    attempts: u32,
) -> Fate {
    let now = crate::message::rfc3339(SystemTime::now());
    let dlq_retries = raw
        .header(X_DLQ_RETRIES)
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |n| n.saturating_add(1));
    let first_failed = raw
        .header(X_FIRST_FAILED_AT)
        .map_or_else(|| now.clone(), str::to_owned);
    let headers = rebuild(
        &raw.headers,
        &SERVICE_HEADERS,
        &[
            (X_ORIGINAL_TOPIC, origin.topic.clone()),
            (X_ORIGINAL_PARTITION, origin.partition.to_string()),
            (X_ORIGINAL_OFFSET, origin.offset.to_string()),
            (X_CONSUMER_GROUP, shared.config.group.clone()),
            (X_ATTEMPTS, attempts.to_string()),
            (X_ERROR, cut(error)),
            (X_ERROR_KIND, kind.as_str().to_owned()),
            (X_FAILED_AT, now),
            (X_DLQ_RETRIES, dlq_retries.to_string()),
            (X_FIRST_FAILED_AT, first_failed),
        ],
    );
    let topic = shared.config.dlq_topic(&origin.topic);
    if produce_until_acked(shared, &topic, raw, headers).await {
        ConsumerStats::inc(&shared.stats.dead_lettered);
        Fate::Final
    } else {
        Fate::Abandoned
    }
}

/// Writes key and body byte-identical with `headers` to `topic`, retrying with capped backoff
/// until the broker acknowledges. Returns false only when shutdown interrupts the retries.
async fn produce_until_acked(
    shared: &Shared,
    topic: &str,
    raw: &Raw,
    headers: rdkafka::message::OwnedHeaders,
) -> bool {
    let mut backoff = Backoff::default();
    loop {
        let mut rec: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(topic).headers(headers.clone());
        if let Some(k) = &raw.key {
            rec = rec.key(k.as_slice());
        }
        if let Some(p) = &raw.payload {
            rec = rec.payload(p.as_slice());
        }
        match shared
            .producer
            .send(rec, Timeout::After(shared.config.delivery_timeout))
            .await
        {
            Ok(_) => return true,
            Err((e, _)) => {
                ConsumerStats::inc(&shared.stats.forward_failures);
                let wait = backoff.next_delay();
                warn!(%topic, error = %e, retry_in = ?wait, "write to retry/dead-letter topic failed; the offset stays put and the write is retried");
                tokio::select! {
                    () = shared.cancel.cancelled() => return false,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}
