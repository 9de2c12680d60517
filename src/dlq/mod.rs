//! Dead letters an operator can work with: the archive of `<topic>.dlq` in Postgres, a summary
//! by cause, inspection, replay jobs back to the original topic, drop, and the audit of it all.
//!
//! One library, three faces: the `outbox dlq` CLI, the admin HTTP API and the dashboard call
//! these functions and nothing else.
//!
//! | file | concept |
//! |---|---|
//! | `archive` | [`Archiver`]: consume `*.dlq` into `dead_letters`, offsets committed after the insert |
//! | `filter` | [`Filter`]: the selection shared by list, replay and drop, rendered as SQL |
//! | `normalize` | [`normalize_error`]: the same defect groups together whatever ids it names |
//! | `headers` | headers as JSON (non-UTF-8 kept losslessly) and the replay header rules |
//! | `query` | [`Dlq::summary`], [`Dlq::list`], [`Dlq::show`], [`Dlq::audit`] |
//! | `replay` | replay jobs: frozen selection, canary, throttle, refail stop, pause/resume/cancel |
//! | `from_topic` | [`replay_from_topic`]: replay straight from a DLQ topic, without the archive |
//! | `drop` | [`Dlq::drop_letters`] and the retention purge |

mod archive;
mod drop;
mod filter;
mod from_topic;
mod headers;
mod holds;
mod normalize;
mod query;
mod replay;

pub(crate) use archive::Row;
pub use archive::{ArchiveReport, Archiver, ARCHIVE_GROUP};
pub use drop::{DropReport, PurgeReport, RestoreReport};
pub use filter::{Filter, Status};
pub use from_topic::{replay_from_topic, FromTopicOptions, FromTopicReport, REPLAY_GROUP};
pub(crate) use headers::HeaderValue;
pub use holds::{HeldKey, MAX_HOLDS_LISTED};
pub use normalize::normalize_error;
pub use query::{AuditEntry, CauseGroup, DeadLetter, LetterRow, Order, Summary, TopicSummary};
pub(crate) use replay::{check_reason, framework_header, Start};
pub use replay::{
    DryRun, Edit, EditedRetry, Job, JobEvent, JobItem, JobStatus, Progress, ReplayOptions,
    RunOutcome, DEFAULT_CANARY, DEFAULT_CANARY_WAIT, DEFAULT_LOOP_GUARD, DEFAULT_MAX_REFAIL,
    DEFAULT_RATE, DEFAULT_WATCH, MAX_EDITED_BODY, MAX_JOB_REASON, MAX_RATE, MIN_RATE,
};

use deadpool_postgres::Pool;

use crate::config::DbConfig;
use crate::schema::Schema;

/// Why a DLQ operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DlqError {
    /// The request is wrong (empty filter, bad field, bad state change): fix it and retry.
    #[error("{0}")]
    Invalid(String),
    /// What the request names does not exist: no letter or job with that id, no letter
    /// matching the filter.
    #[error("{0}")]
    NotFound(String),
    /// What the request names exists but its state refuses the change (an ended job paused,
    /// cancelled or run; a job another process runs): look at it again before retrying.
    #[error("{0}")]
    Conflict(String),
    /// Postgres refused a statement or went away.
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// No connection could be had.
    #[error("postgres pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// Kafka refused a setting or an operation.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
}

impl From<crate::cleanup::CleanupError> for DlqError {
    fn from(e: crate::cleanup::CleanupError) -> Self {
        match e {
            crate::cleanup::CleanupError::Postgres(e) => Self::Postgres(e),
            crate::cleanup::CleanupError::Pool(e) => Self::Pool(e),
        }
    }
}

impl DlqError {
    /// True when the caller asked for something invalid, absent or refused by its state (a
    /// CLI exits 2, an API answers 4xx); false for a failure of Postgres or Kafka.
    pub fn is_invalid(&self) -> bool {
        matches!(
            self,
            Self::Invalid(_) | Self::NotFound(_) | Self::Conflict(_)
        )
    }

    /// True when what the request names is in a state that refuses it (an API answers 409).
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Conflict(_))
    }

    /// True when what the request names does not exist (an API answers 404).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound(_))
    }
}

fn invalid<T>(msg: impl Into<String>) -> Result<T, DlqError> {
    Err(DlqError::Invalid(msg.into()))
}

fn conflict<T>(msg: impl Into<String>) -> Result<T, DlqError> {
    Err(DlqError::Conflict(msg.into()))
}

fn not_found<T>(msg: impl Into<String>) -> Result<T, DlqError> {
    Err(DlqError::NotFound(msg.into()))
}

/// A handle on the DLQ tables of one schema: everything but archiving and running replay jobs
/// needs only Postgres.
#[derive(Clone)]
pub struct Dlq {
    pool: Pool,
    schema: Schema,
    /// Gauge series set so far (reset to 0 when their rows are gone).
    gauges_seen: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<GaugeSeries>>>,
    /// Tenants that have a label of their own on the per-tenant DLQ gauge.
    tenant_labels: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

/// The labels of one DLQ gauge series.
type GaugeSeries = (String, String, String, String);

impl Dlq {
    /// A handle over `db` (pool made lazily: this succeeds while Postgres is down).
    pub fn new(db: &DbConfig) -> Self {
        Self {
            pool: crate::db::pool(db).expect("pool configuration is static"),
            schema: db.schema.clone(),
            gauges_seen: std::sync::Arc::default(),
            tenant_labels: std::sync::Arc::default(),
        }
    }

    /// A handle sharing an existing pool.
    pub fn with_pool(pool: Pool, schema: Schema) -> Self {
        Self {
            pool,
            schema,
            gauges_seen: std::sync::Arc::default(),
            tenant_labels: std::sync::Arc::default(),
        }
    }

    /// `schema.table`, quoted.
    /// A statement of [`crate::sql`] for this schema.
    fn sql(&self, template: &str) -> String {
        crate::sql::render(template, &self.schema)
    }
}

/// The actor recorded when none is given: the OS user.
pub fn default_actor() -> String {
    crate::config::os_user()
}

/// Checks an operator name for the audit log: printable, at most 200 characters.
pub(crate) fn check_actor(actor: &str) -> Result<(), DlqError> {
    if actor.trim().is_empty() || actor.chars().count() > 200 || actor.chars().any(char::is_control)
    {
        return invalid(format!(
            "invalid actor {actor:?}: give a printable name of at most 200 characters"
        ));
    }
    Ok(())
}

/// The archive row of a letter on `<topic>.dlq` carrying `headers`.
#[cfg(test)]
pub(crate) fn archive_row_for_tests(
    topic: &str,
    headers: &[(String, Option<Vec<u8>>)],
) -> archive::Row {
    archive::Row::from_parts(
        &format!("{topic}.dlq"),
        0,
        0,
        None,
        None,
        headers,
        None,
        crate::wire::DEFAULT_DLQ_SUFFIX,
    )
}

/// Whether the archive may record `kind` as a letter's kind.
#[cfg(test)]
pub(crate) fn is_known_kind(kind: &str) -> bool {
    filter::KINDS.contains(&kind) || kind == "unknown"
}
