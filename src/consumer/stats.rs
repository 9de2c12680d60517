//! [`ConsumerStats`]: counters of what the consumer did, shared with the running runtime.

use std::sync::atomic::{AtomicU64, Ordering};

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
    /// Tombstones skipped because no tombstone handler is registered.
    pub tombstones_skipped: AtomicU64,
    /// Tombstones handed to the tombstone handler and committed (also counted in `handled`).
    pub tombstones_handled: AtomicU64,
    /// Old processed marks and dead-letter records deleted by the consumer's own cleanup.
    pub marks_deleted: AtomicU64,
    /// Partitions paused now (backpressure, retry delays, breaker modes), for the heartbeat.
    pub paused_partitions: AtomicU64,
    /// Messages accepted and not yet final, now.
    pub in_flight: AtomicU64,
    /// Retry records of another consumer group met on our retry topics, ignored.
    pub foreign_retries: AtomicU64,
    /// Waits for the consumer's database to come back (no retry budget spent).
    pub outage_waits: AtomicU64,
    /// Waits for an unreachable schema registry before a framed record could be decoded
    /// (the record held, nothing spent).
    pub registry_waits: AtomicU64,
}

impl ConsumerStats {
    pub(super) fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads one counter.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}
