//! [`RelayConfig`]: how the relay claims, produces and backs off, with its named defaults.

use std::time::Duration;

use crate::cleanup::CleanupConfig;
use crate::config::ConfigError;

/// Rows claimed per relay pass.
pub const DEFAULT_BATCH_SIZE: usize = 2000;
/// Largest batch accepted: a claim transaction holds its row locks while the batch is in flight.
pub const MAX_BATCH_SIZE: usize = 50_000;
/// Default [`RelayConfig::in_flight_batches`]: one batch waiting for acks while the next is
/// claimed and the previous marked (measured in `benches/relay_drain.rs`).
pub const DEFAULT_IN_FLIGHT_BATCHES: usize = 2;
/// Upper bound of [`RelayConfig::in_flight_batches`].
pub const MAX_IN_FLIGHT_BATCHES: usize = 8;
/// Produce attempts before a row becomes `failed`.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 10;
/// How often an idle relay looks for due rows when no notification arrives.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);
/// How often the relay sweeps below its claim floor (rows of very long transactions, rows
/// requeued by hand).
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(10);
/// How long a transaction may keep outbox rows uncommitted before the claim floor passes them
/// (they are then published by the sweep).
pub const DEFAULT_LONG_TRANSACTION: Duration = Duration::from_secs(60);
/// How long librdkafka may try to deliver one message (`message.timeout.ms`).
pub const DEFAULT_DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long shutdown waits for in-flight messages to be flushed.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// How the relay claims, produces and backs off.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RelayConfig {
    /// Rows per claim (default [`RelayConfig::DEFAULT_BATCH_SIZE`]).
    pub batch_size: usize,
    /// Attempts before a row becomes `failed` (default [`RelayConfig::DEFAULT_MAX_ATTEMPTS`]).
    pub max_attempts: i32,
    /// Idle poll period when no notification arrives (default [`RelayConfig::DEFAULT_POLL_INTERVAL`]).
    pub poll_interval: Duration,
    /// librdkafka `message.timeout.ms`; the relay waits this plus a margin for delivery reports,
    /// and rows without a report by then stay pending (default [`RelayConfig::DEFAULT_DELIVERY_TIMEOUT`]).
    pub delivery_timeout: Duration,
    /// Flush budget at shutdown (default [`RelayConfig::DEFAULT_SHUTDOWN_TIMEOUT`]).
    pub shutdown_timeout: Duration,
    /// Wake on the `outbox_notify` trigger's notifications (LISTEN); polling runs regardless.
    pub listen: bool,
    /// Cleanup schedule run by the relay.
    pub cleanup: CleanupConfig,
    /// How often the relay re-counts relays and rebalances its ordering lanes.
    pub rebalance_interval: Duration,
    /// How often the relay sweeps below its claim floor for pending rows the floor passed
    /// (default [`RelayConfig::DEFAULT_SWEEP_INTERVAL`]); see [`Relay::sweep`](crate::Relay::sweep).
    pub sweep_interval: Duration,
    /// A transaction still open this long after inserting outbox rows no longer holds the claim
    /// floor back; its rows are published by the next sweep after it commits
    /// (default [`RelayConfig::DEFAULT_LONG_TRANSACTION`]).
    pub long_transaction: Duration,
    /// How often a claim reads the transactions writing the outbox to move its claim floor
    /// (`relay/floor.rs`); the claims in between scan from where the floor is. Zero (the
    /// default): every claim. Reading them copies Postgres's lock table, which a fleet fills
    /// with its tenants' lane locks, so a fleet (`outbox relay --tenants`) reads them at most
    /// every [`RelayConfig::FLEET_FLOOR_SAMPLE_INTERVAL`]. Ring storage reads them every claim
    /// whatever this says (its cursors move only over proven ids).
    pub floor_sample_interval: Duration,
    /// Claim transactions open at once: while one batch waits for Kafka's acks the next is
    /// claimed and the one before is marked (default [`RelayConfig::DEFAULT_IN_FLIGHT_BATCHES`]; 1 = one
    /// batch at a time). Each takes a pooled connection.
    pub in_flight_batches: usize,
    /// Publish each row exactly once to `read_committed` readers (`None`, the default:
    /// at-least-once with the idempotent producer). See [`ExactlyOnce`].
    pub exactly_once: Option<ExactlyOnce>,
    /// Topics with a schema (`format` in the topics file): each row's JSON is encoded into
    /// the topic's format and framed (see [`crate::schemas`]). A registry that cannot be
    /// reached leaves the rows pending (no attempt spent); a payload that no longer matches
    /// its schema fails the row at once with the reason (`outbox requeue` after the fix).
    #[cfg(feature = "schemas")]
    pub schemas: Option<crate::schemas::Schemas>,
}

/// Default [`ExactlyOnce::progress_topic`].
pub const DEFAULT_PROGRESS_TOPIC: &str = "outbox-progress";
/// Default [`ExactlyOnce::transaction_timeout`].
pub const DEFAULT_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);

/// Exactly-once publication (`outbox relay --exactly-once`, docs/EXACTLY_ONCE.md).
///
/// The 64 ordering lanes are owned in 4 slots of 16 ([`SLOTS`](crate::ExactlyOnce::SLOTS)); each slot
/// has its own transactional producer (`transactional.id` = `<prefix>-<schema>-<slot>`), so
/// whoever takes a slot over fences the previous owner. Each batch of a slot is produced in
/// one Kafka transaction that also writes a progress record naming the ids it published, to
/// partition `slot` of `progress_topic`; a new owner reads that record back `read_committed`
/// and marks those rows sent before producing anything.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ExactlyOnce {
    /// The compacted topic of progress records, one partition per slot (created by the relay
    /// when missing: a partition per slot, `cleanup.policy=compact`).
    pub progress_topic: String,
    /// The start of every slot's `transactional.id` (default `outbox`).
    pub transactional_id_prefix: String,
    /// librdkafka `transaction.timeout.ms`: an owner that dies mid-transaction holds back
    /// `read_committed` readers of its partitions at most this long, unless a new owner fences
    /// it sooner (default [`ExactlyOnce::DEFAULT_TRANSACTION_TIMEOUT`]).
    pub transaction_timeout: Duration,
}

impl Default for ExactlyOnce {
    fn default() -> Self {
        Self {
            progress_topic: DEFAULT_PROGRESS_TOPIC.into(),
            transactional_id_prefix: "outbox".into(),
            transaction_timeout: DEFAULT_TRANSACTION_TIMEOUT,
        }
    }
}

impl RelayConfig {
    /// Default [`RelayConfig::batch_size`].
    pub const DEFAULT_BATCH_SIZE: usize = DEFAULT_BATCH_SIZE;
    /// Largest [`RelayConfig::batch_size`] accepted.
    pub const MAX_BATCH_SIZE: usize = MAX_BATCH_SIZE;
    /// Default [`RelayConfig::in_flight_batches`].
    pub const DEFAULT_IN_FLIGHT_BATCHES: usize = DEFAULT_IN_FLIGHT_BATCHES;
    /// Largest [`RelayConfig::in_flight_batches`] accepted.
    pub const MAX_IN_FLIGHT_BATCHES: usize = MAX_IN_FLIGHT_BATCHES;
    /// Default [`RelayConfig::max_attempts`].
    pub const DEFAULT_MAX_ATTEMPTS: i32 = DEFAULT_MAX_ATTEMPTS;
    /// Default [`RelayConfig::poll_interval`].
    pub const DEFAULT_POLL_INTERVAL: Duration = DEFAULT_POLL_INTERVAL;
    /// Default [`RelayConfig::sweep_interval`].
    pub const DEFAULT_SWEEP_INTERVAL: Duration = DEFAULT_SWEEP_INTERVAL;
    /// [`RelayConfig::floor_sample_interval`] in a fleet unless set: a tenant's pass of a few
    /// batches reads no lock table, and a floor under a held snapshot lags at most this.
    pub const FLEET_FLOOR_SAMPLE_INTERVAL: Duration = Duration::from_millis(250);
    /// Default [`RelayConfig::long_transaction`].
    pub const DEFAULT_LONG_TRANSACTION: Duration = DEFAULT_LONG_TRANSACTION;
    /// Default [`RelayConfig::delivery_timeout`].
    pub const DEFAULT_DELIVERY_TIMEOUT: Duration = DEFAULT_DELIVERY_TIMEOUT;
    /// Default [`RelayConfig::shutdown_timeout`].
    pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = DEFAULT_SHUTDOWN_TIMEOUT;
}

impl ExactlyOnce {
    /// Default [`ExactlyOnce::progress_topic`].
    pub const DEFAULT_PROGRESS_TOPIC: &str = DEFAULT_PROGRESS_TOPIC;
    /// Default [`ExactlyOnce::transaction_timeout`].
    pub const DEFAULT_TRANSACTION_TIMEOUT: Duration = DEFAULT_TRANSACTION_TIMEOUT;
    /// How many Kafka transactional ids (slots) the lanes are spread over: each slot's
    /// lanes commit in one transaction.
    pub const SLOTS: i32 = super::lanes::SLOTS;
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            batch_size: DEFAULT_BATCH_SIZE,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            poll_interval: DEFAULT_POLL_INTERVAL,
            delivery_timeout: DEFAULT_DELIVERY_TIMEOUT,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            listen: true,
            cleanup: CleanupConfig::default(),
            rebalance_interval: super::lanes::DEFAULT_REBALANCE_INTERVAL,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            long_transaction: DEFAULT_LONG_TRANSACTION,
            floor_sample_interval: Duration::ZERO,
            in_flight_batches: DEFAULT_IN_FLIGHT_BATCHES,
            exactly_once: None,
            #[cfg(feature = "schemas")]
            schemas: None,
        }
    }
}

impl RelayConfig {
    /// Checks ranges.
    ///
    /// # Errors
    /// [`ConfigError::Value`] naming the first setting out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |name, reason: &str| {
            Err(ConfigError::Value {
                name,
                reason: reason.into(),
            })
        };
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return bad("batch size", "must be between 1 and 50000");
        }
        if self.in_flight_batches == 0 || self.in_flight_batches > MAX_IN_FLIGHT_BATCHES {
            return bad("in-flight batches", "must be between 1 and 8");
        }
        if self.max_attempts < 1 {
            return bad("max attempts", "must be at least 1");
        }
        if self.poll_interval.is_zero() {
            return bad("poll interval", "must be greater than zero");
        }
        if self.delivery_timeout < Duration::from_millis(100) {
            return bad("delivery timeout", "must be at least 100ms");
        }
        if self.delivery_timeout > Duration::from_secs(3600) {
            return bad("delivery timeout", "must be at most 1h");
        }
        if self.cleanup.batch_size == 0 {
            return bad("cleanup batch size", "must be at least 1");
        }
        if self.rebalance_interval.is_zero() {
            return bad("rebalance interval", "must be greater than zero");
        }
        if self.sweep_interval.is_zero() {
            return bad("sweep interval", "must be greater than zero");
        }
        if self.long_transaction < Duration::from_secs(1) {
            return bad("long transaction", "must be at least 1s");
        }
        if self.cleanup.interval.is_some_and(|d| d.is_zero()) {
            return bad("cleanup interval", "must be greater than zero (or off)");
        }
        if let Some(eo) = &self.exactly_once {
            if crate::topic::validate_topic(&eo.progress_topic).is_err() {
                return bad("progress topic", "is not a valid topic name");
            }
            if eo.transactional_id_prefix.trim().is_empty() {
                return bad("transactional id prefix", "must not be empty");
            }
            if eo.transaction_timeout < Duration::from_secs(1)
                || eo.transaction_timeout > Duration::from_secs(900)
            {
                return bad("transaction timeout", "must be between 1s and 15min");
            }
            if self.delivery_timeout > eo.transaction_timeout {
                return bad(
                    "delivery timeout",
                    "must not exceed the transaction timeout in exactly-once mode",
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_config_ranges() {
        RelayConfig::default().validate().unwrap();
        let c = RelayConfig {
            batch_size: 0,
            ..RelayConfig::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("batch size"));
        let c = RelayConfig {
            max_attempts: 0,
            ..RelayConfig::default()
        };
        assert!(c.validate().is_err());
    }
}
