//! Consumer settings ([`ConsumerConfig`]) with named defaults, validated before anything
//! connects, and the errors that stop a consumer from starting ([`ConsumerError`]).

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::error::KafkaError;

use super::retry::RetryStrategy;
use crate::wire::retry_topic;

/// Default handler concurrency: messages in work at once. Call handlers (an external API,
/// ~100 ms) reach 64 / RTT ≈ 640 msg/s with it; handlers holding a transaction are bounded by
/// [`DEFAULT_TRANSACTIONS`] as well.
pub const DEFAULT_CONCURRENCY: usize = 64;
/// Default bound on handlers holding a Postgres transaction at once (per-message and batch
/// handlers, commit groups): each holds a pooled connection for as long as it runs.
pub const DEFAULT_TRANSACTIONS: usize = 16;
/// Default bound on accepted-but-unfinished messages before partitions are paused.
pub const DEFAULT_MAX_BUFFERED: usize = 4096;
pub(crate) use crate::wire::DEFAULT_DLQ_SUFFIX;

/// Default for [`ConsumerConfig::pause_after`]: how long the runtime may sit at
/// `max_buffered` with no handler finishing before it pauses every partition. A full buffer
/// that keeps draining costs nothing: librdkafka's bounded prefetch queue absorbs it, whereas a
/// pause discards the prefetched data and refetches it on resume (measured: pausing at every
/// saturation capped a 16-way consumer at ~1,000 msg/s).
pub const DEFAULT_PAUSE_AFTER: Duration = Duration::from_secs(2);

/// Consumer settings. `group` must be given explicitly: a group derived from a host name
/// changes with every deployment and silently re-reads or skips the topic.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConsumerConfig {
    /// The consumer group, e.g. `billing-service`.
    pub group: String,
    /// Topics to consume (their retry topics are added for [`RetryStrategy::Topics`]).
    pub topics: Vec<String>,
    /// Messages in work at once, whatever their handler (default [`ConsumerConfig::DEFAULT_CONCURRENCY`]).
    pub concurrency: usize,
    /// Of those, handlers that hold a Postgres transaction while they run ([`super::Handler`],
    /// [`super::BatchHandler`], commit groups; default [`ConsumerConfig::DEFAULT_TRANSACTIONS`], never more
    /// than `concurrency`). [`super::CallHandler`]s hold none during their call and are bounded
    /// by `concurrency` alone. The consumer's pool is sized from both: `transactions` when a
    /// transaction-holding handler is registered, plus the call handlers' mark writers (2, or
    /// one per 64 of `concurrency`), plus 2.
    pub transactions: usize,
    /// Accepted-but-unfinished messages before partitions are paused (default
    /// [`ConsumerConfig::DEFAULT_MAX_BUFFERED`]).
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
    /// (default [`ConsumerConfig::DEFAULT_PAUSE_AFTER`]).
    pub pause_after: Duration,
    /// Serve Prometheus `/metrics` on this address while the consumer runs (needs the
    /// `prometheus` feature; `None`: the application installs the recorder and mounts the
    /// route itself, or does without).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Host names `/metrics` on [`Self::metrics_addr`] also answers to, besides IP literals and
    /// `localhost` (see [`crate::metrics::serve_with_hosts`]; empty by default).
    pub metrics_allowed_hosts: Vec<String>,
    /// The circuit breaker shared by the group's replicas, for handlers that report
    /// [`super::HandlerError::unavailable`]. `None` (the default): such errors are transient.
    pub breaker: Option<super::BreakerConfig>,
    /// Static group membership (KIP-345, `group.instance.id`): a replica restarted with the
    /// same id (a StatefulSet's pod name, a host name) gets its partitions back at once
    /// instead of waiting for its dead predecessor's session to time out. Unique per replica.
    pub instance_id: Option<String>,
    /// How long the broker waits for a silent member before giving its partitions to the
    /// others (default [`ConsumerConfig::DEFAULT_SESSION_TIMEOUT`]; `session.timeout.ms`). Heartbeats go every
    /// third of it from librdkafka's own thread, so slow handlers do not count against it.
    pub session_timeout: Duration,
    /// Most messages of per-message handlers that share one transaction when more are ready
    /// than there are free handler slots (default [`ConsumerConfig::DEFAULT_COMMIT_GROUP`], at most
    /// [`ConsumerConfig::MAX_COMMIT_GROUP`]; 1 = a transaction per message). Each message keeps its own
    /// savepoint: a handler that fails rolls back only its own work and mark, and is retried
    /// alone; the others commit together. Groups form only from messages already waiting, so
    /// at low load nothing waits for company. See `consumer/commit_group.rs`.
    pub commit_group: usize,
    /// The consumer's own cleanup of its group's old processed marks and dead-letter records
    /// (on by default: 35 days, batches of 5,000, hourly; `None` turns it off, e.g. when
    /// `outbox cleanup` runs from cron). The `outbox_marks_overdue` gauge is exported either way.
    pub cleanup: Option<super::MarksCleanup>,
    /// Strict per-key order on some topics (off by default): a keyed message that is
    /// dead-lettered or sent to a retry topic holds its key, and the key's later messages wait
    /// behind it (durably, in order, the partition flowing) until it is resolved. See
    /// [`super::StrictOrder`] and RELIABILITY.md.
    pub strict_order: Option<super::StrictOrder>,
    /// Which driver runs the handlers' transactions: set by the constructor
    /// ([`super::Consumer::new`] for tokio-postgres, `Consumer::sqlx` for sqlx), which makes
    /// it the consumer's type. Left at its default here; a configuration naming a pool is
    /// refused by both.
    #[deprecated(
        note = "the driver is the consumer's type: build with `Consumer::sqlx(db, kafka, config, pool)`"
    )]
    pub driver: Driver,
    /// Route each message carrying `x-tenant` (a fleet relay's) to its tenant's database and
    /// schema: its handler's transaction and inbox mark run there (see
    /// [`super::TenantRouting`]; off by default: every message is handled in this consumer's
    /// database). Needs the tokio-postgres driver.
    pub tenants: Option<super::TenantRouting>,
    /// How each delivery's `process` span (feature `otel`, with a tracer provider installed)
    /// relates to the producer's context: a link (default, as the messaging conventions
    /// advise) or its child, so that one trace holds the event's whole journey.
    pub trace_parenting: crate::otel::TraceParenting,
    /// The schema registry, for topics whose records are framed (Avro, Protobuf, JSON Schema
    /// in the Confluent wire format): each is decoded before dispatch. A record whose schema
    /// the registry does not have, or that does not decode, is a decode dead letter naming
    /// why; while the registry is unreachable records are held (no attempt spent), never
    /// dead-lettered. Without it a framed record is a decode dead letter.
    #[cfg(feature = "schemas")]
    pub schemas: Option<crate::schemas::Schemas>,
}

/// The driver of a [`super::Consumer`] built by [`super::Consumer::new`]: its handlers
/// ([`super::Handler`], [`super::BatchHandler`], [`super::CallHandler`]) run in tokio-postgres
/// transactions from the consumer's own pool (sized by [`ConsumerConfig::transactions`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct PgHandlers;

/// The driver of a [`super::Consumer`] built by `Consumer::sqlx`: its handlers
/// ([`super::SqlxHandler`], [`super::SqlxBatchHandler`], [`super::SqlxCallHandler`]) run in
/// sqlx transactions from the service's own pool.
#[cfg(feature = "sqlx")]
#[derive(Debug, Clone, Copy, Default)]
pub struct SqlxHandlers;

/// The Postgres driver of a consumer's handler transactions.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum Driver {
    /// tokio-postgres, from the consumer's own pool (sized by
    /// [`ConsumerConfig::transactions`]): [`super::Handler`] and [`super::BatchHandler`].
    #[default]
    TokioPostgres,
    /// sqlx, from the service's own `PgPool`: [`super::SqlxHandler`] and
    /// [`super::SqlxBatchHandler`] get the transaction's connection. The pool is the
    /// service's: its `search_path` is what handlers see, and it needs a connection per
    /// [`ConsumerConfig::transactions`]. The runtime's own bookkeeping (dead-letter records,
    /// the breaker's row, heartbeats, marks cleanup) keeps two connections of its own.
    #[cfg(feature = "sqlx")]
    Sqlx(sqlx::PgPool),
}

impl Driver {
    /// `"tokio-postgres"` or `"sqlx"`, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Self::TokioPostgres => "tokio-postgres",
            #[cfg(feature = "sqlx")]
            Self::Sqlx(_) => "sqlx",
        }
    }
}

/// Default [`ConsumerConfig::commit_group`].
pub const DEFAULT_COMMIT_GROUP: usize = 16;
/// Upper bound of [`ConsumerConfig::commit_group`]: each grouped message is a subtransaction,
/// and Postgres tracks at most 64 per transaction in shared memory before every other
/// session's visibility checks slow down (subtransaction overflow).
pub const MAX_COMMIT_GROUP: usize = 32;

/// Default [`ConsumerConfig::session_timeout`]: 6 s, the broker's minimum
/// (`group.min.session.timeout.ms`). A crashed replica's partitions move to the survivors
/// within it (librdkafka's own default is 45 s).
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(6);

impl ConsumerConfig {
    /// Default [`ConsumerConfig::concurrency`].
    pub const DEFAULT_CONCURRENCY: usize = DEFAULT_CONCURRENCY;
    /// Default [`ConsumerConfig::transactions`].
    pub const DEFAULT_TRANSACTIONS: usize = DEFAULT_TRANSACTIONS;
    /// Default [`ConsumerConfig::max_buffered`].
    pub const DEFAULT_MAX_BUFFERED: usize = DEFAULT_MAX_BUFFERED;
    /// Default [`ConsumerConfig::pause_after`].
    pub const DEFAULT_PAUSE_AFTER: Duration = DEFAULT_PAUSE_AFTER;
    /// Default [`ConsumerConfig::session_timeout`].
    pub const DEFAULT_SESSION_TIMEOUT: Duration = DEFAULT_SESSION_TIMEOUT;
    /// Default [`ConsumerConfig::commit_group`].
    pub const DEFAULT_COMMIT_GROUP: usize = DEFAULT_COMMIT_GROUP;
    /// Largest [`ConsumerConfig::commit_group`].
    pub const MAX_COMMIT_GROUP: usize = MAX_COMMIT_GROUP;
}

impl ConsumerConfig {
    /// Settings for `group` reading `topics`, with the defaults.
    #[allow(deprecated)] // the driver field stays for today's users, set by the constructor
    pub fn new(
        group: impl Into<String>,
        topics: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            group: group.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            concurrency: DEFAULT_CONCURRENCY,
            transactions: DEFAULT_TRANSACTIONS,
            max_buffered: DEFAULT_MAX_BUFFERED,
            retry: RetryStrategy::default(),
            dlq_suffix: DEFAULT_DLQ_SUFFIX.into(),
            delivery_timeout: Duration::from_secs(30),
            shutdown_timeout: Duration::from_secs(30),
            pause_after: DEFAULT_PAUSE_AFTER,
            metrics_addr: None,
            metrics_allowed_hosts: Vec::new(),
            breaker: None,
            instance_id: None,
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            commit_group: DEFAULT_COMMIT_GROUP,
            cleanup: Some(super::MarksCleanup::default()),
            strict_order: None,
            driver: Driver::TokioPostgres,
            tenants: None,
            trace_parenting: crate::otel::TraceParenting::Link,
            #[cfg(feature = "schemas")]
            schemas: None,
        }
    }

    pub(super) fn validate(&self) -> Result<(), ConsumerError> {
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
        if let Some(id) = &self.instance_id {
            if id.trim().is_empty() || id.len() > 249 || id.chars().any(char::is_control) {
                return bad(format!(
                    "invalid instance id {id:?}: give a printable name, unique per replica"
                ));
            }
        }
        if let Some(c) = &self.cleanup {
            if c.batch == 0 || c.interval < Duration::from_millis(100) {
                return bad(
                    "cleanup batch must be at least 1 and its interval at least 100 ms".into(),
                );
            }
        }
        if self.session_timeout < Duration::from_secs(1) {
            return bad("session timeout must be at least 1 s".into());
        }
        if let Some(b) = &self.breaker {
            b.validate().map_err(ConsumerError::Config)?;
        }
        if let Some(s) = &self.strict_order {
            s.validate(&self.topics).map_err(ConsumerError::Config)?;
        }
        if let Some(t) = &self.tenants {
            if t.pool_size == 0 || t.refresh.is_zero() {
                return bad(
                    "tenant routing: pool_size and refresh must be greater than zero".into(),
                );
            }
        }
        if self.commit_group == 0 || self.commit_group > MAX_COMMIT_GROUP {
            return bad(format!(
                "commit_group must be between 1 and {MAX_COMMIT_GROUP}"
            ));
        }
        if self.concurrency == 0 || self.max_buffered == 0 || self.transactions == 0 {
            return bad("concurrency, transactions and max_buffered must be at least 1".into());
        }
        match &self.retry {
            RetryStrategy::InPlace { attempts, .. } if *attempts == 0 => {
                bad("in-place attempts must be at least 1".into())
            }
            RetryStrategy::Topics { delays } => {
                for t in &self.topics {
                    for d in delays {
                        retry_topic(t, &self.group, *d)
                            .map_err(|e| ConsumerError::Config(e.to_string()))?;
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Handlers holding a transaction at once: `transactions`, never above `concurrency`.
    pub(super) fn transaction_slots(&self) -> usize {
        self.transactions.min(self.concurrency)
    }

    pub(crate) fn dlq_topic(&self, topic: &str) -> String {
        format!("{topic}.{}", self.dlq_suffix)
    }

    /// The group's retry topic of `topic` for hop `hop` (validated at start).
    pub(super) fn retry_topic(&self, topic: &str, delay: Duration) -> String {
        retry_topic(topic, &self.group, delay).expect("validated at start")
    }

    /// Every retry topic of this group, mapped to (original topic, hop index).
    pub(super) fn retry_topics(&self) -> HashMap<String, (String, usize)> {
        let mut m = HashMap::new();
        if let RetryStrategy::Topics { delays } = &self.retry {
            for t in &self.topics {
                for (i, d) in delays.iter().enumerate() {
                    if let Ok(name) = retry_topic(t, &self.group, *d) {
                        m.insert(name, (t.clone(), i));
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
