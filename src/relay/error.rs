//! What ends a pass ([`RelayError`]) and what a pass did ([`Outcome`], [`BatchReport`]).

use super::*;

/// A relay failure that ended a pass (the pass changed nothing that was not rolled back).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// Invalid configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Postgres was unreachable or refused a statement.
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// No pooled connection could be had (Postgres down or overloaded).
    #[error("postgres pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// The Kafka producer could not be created (bad property, bad credentials file, …).
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
}

impl RelayError {
    /// True when waiting and retrying may help (outages), false for configuration mistakes.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Config(_) | Self::Kafka(_) => false,
            Self::Postgres(e) => crate::classify::postgres_is_transient(e),
            Self::Pool(_) => true,
        }
    }
}

/// The result of one pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing was due.
    Empty,
    /// A batch was claimed and settled.
    Published(BatchReport),
}

/// What happened to the rows of one claimed batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows acknowledged by the broker and marked `sent`.
    pub sent: usize,
    /// Rows refused (bad topic, too large, …): attempt spent, backed off or `failed`.
    pub backed_off: usize,
    /// Rows left `pending` untouched: no report in time, or the cluster was unreachable.
    pub deferred: usize,
    /// Rows left `pending` because an earlier row of their key failed in the same batch.
    pub held_back: usize,
}

impl BatchReport {
    /// Adds `other`'s counts to these.
    pub(crate) fn add(&mut self, other: &BatchReport) {
        self.claimed += other.claimed;
        self.sent += other.sent;
        self.backed_off += other.backed_off;
        self.deferred += other.deferred;
        self.held_back += other.held_back;
    }
}
