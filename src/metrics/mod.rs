//! Prometheus metrics: names, bounded labels, the recorder and the `/metrics` endpoint.
//!
//! The library records through the `metrics` facade everywhere; nothing is kept unless a
//! recorder is installed ([`install`]), which `outbox relay --metrics-addr`, `outbox admin`,
//! `outbox dlq archive --metrics-addr` and [`crate::consumer::ConsumerConfig::metrics_addr`]
//! do. An application that already serves HTTP mounts [`router`] instead.
//!
//! Labels are bounded: topic, consumer group, partition, status, outcome, reason — never a
//! message id, key or free text.

#[cfg(feature = "prometheus")]
mod exporter;

/// Distinct values a label may take in one process; past this, new values are recorded as
/// `other`. Label values that come from message headers (a DLQ letter's topic, group, kind)
/// are chosen by whoever produced the record: without a cap, a hostile or broken producer
/// makes one series per value and the exporter's memory grows without end.
pub const MAX_LABEL_VALUES: usize = 200;
/// The longest label value kept as it is; longer ones are recorded as `other`.
const MAX_LABEL_CHARS: usize = 255;

/// `value` as a value of label `label`: itself while the label has had fewer than
/// [`MAX_LABEL_VALUES`] distinct values and it is short and printable, else `other`.
pub fn bounded(label: &'static str, value: &str) -> String {
    use std::collections::{HashMap, HashSet};
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<HashMap<&'static str, HashSet<String>>>> = OnceLock::new();
    if value.chars().count() > MAX_LABEL_CHARS || value.chars().any(char::is_control) {
        return "other".into();
    }
    let mut seen = SEEN
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let set = seen.entry(label).or_default();
    if set.contains(value) {
        return value.to_owned();
    }
    if set.len() >= MAX_LABEL_VALUES {
        return "other".into();
    }
    set.insert(value.to_owned());
    value.to_owned()
}
#[cfg(feature = "prometheus")]
pub use exporter::{
    health_router, install, router, serve, serve_with_health, serve_with_hosts, InstallError,
};

/// Tenants that get a label of their own on a per-tenant DLQ series; the rest are summed
/// under `tenant="other"` (1,000 tenants cost 21 series per status).
pub const TENANT_LABELS: usize = 20;

/// `outbox_dlq_tenant_messages{tenant,status}`: archived dead letters per tenant (their
/// message's `x-tenant` header), the busiest [`TENANT_LABELS`] tenants labelled, the rest
/// under `other`.
pub const DLQ_TENANT_MESSAGES: &str = "outbox_dlq_tenant_messages";

/// `outbox_rows{status}`: outbox rows by status (`sent` is an estimate on large tables).
pub const OUTBOX_ROWS: &str = "outbox_rows";
/// Age of the oldest pending outbox row, seconds (0 when none).
pub const OUTBOX_OLDEST_PENDING_AGE: &str = "outbox_oldest_pending_age_seconds";
/// `outbox_published_total{topic}`: rows acknowledged by the broker and marked sent.
pub const OUTBOX_PUBLISHED: &str = "outbox_published_total";
/// `outbox_publish_failures_total{reason}`: sends that did not succeed (`unknown_topic`,
/// `message_too_large`, `refused`, `no_report`).
pub const OUTBOX_PUBLISH_FAILURES: &str = "outbox_publish_failures_total";
/// Histogram: a row's `created_at` to the broker's ack, seconds.
pub const OUTBOX_COMMIT_TO_ACK: &str = "outbox_commit_to_ack_seconds";
/// Histogram: rows per claimed batch.
pub const OUTBOX_BATCH_SIZE: &str = "outbox_batch_size";
/// Histogram: the claim statement's duration, seconds.
pub const OUTBOX_CLAIM_SECONDS: &str = "outbox_claim_seconds";
/// Ordering lanes this relay owns (of 64).
pub const OUTBOX_LANES_OWNED: &str = "outbox_relay_lanes_owned";
/// Metadata lookups the relay made to see that a topic exists before sending to it (once per
/// topic a minute; a fleet's relays share what one of them saw).
pub const OUTBOX_TOPIC_LOOKUPS: &str = "outbox_topic_lookups_total";
/// Bytes on disk of the outbox's storage, indexes included: the `outbox` table, or on ring
/// storage its leaves, retry table, lanes and the table it moved from.
pub const OUTBOX_STORAGE_BYTES: &str = "outbox_storage_bytes";
/// Ring storage: leaves of the ring (of 8) holding rows, the current one included. About 7 in
/// steady state (the generation moves every `sent_retention / 6`); 8 means the leaf after the
/// current one is not reclaimed and the generation cannot move on.
pub const OUTBOX_RING_GENERATIONS: &str = "outbox_ring_generations";
/// Ring storage: seconds since the newest row of the oldest leaf that is not current was
/// written (0 when none): how long it has waited; it is reclaimed once this passes
/// `sent_retention` and the relays have read it.
pub const OUTBOX_RING_OLDEST_GENERATION_AGE: &str = "outbox_ring_oldest_generation_age_seconds";
/// `outbox_ring_rotations_total{result}`: the relay's scheduled rotations on ring storage:
/// `reclaimed` (a leaf truncated), `busy` (a leaf's lock was held: tried again next time),
/// `advanced` (the generation moved to the next leaf).
pub const OUTBOX_RING_ROTATIONS: &str = "outbox_ring_rotations_total";
/// Scheduled cleanups (row deletes, or rotation on ring storage) that failed; each is retried
/// at the next tick.
pub const OUTBOX_CLEANUP_FAILURES: &str = "outbox_cleanup_failures_total";

/// `outbox_consumer_messages_total{topic,group,outcome}`: `handled`, `duplicate`, `retried`,
/// `dead_lettered`, `skipped`, `dropped`, `foreign_retry` (another group's retry record, ignored),
/// `tombstone_skipped` (no tombstone handler), `held` (strict order: written behind its key's
/// failed head), `released` (let through after the head was resolved).
pub const CONSUMER_MESSAGES: &str = "outbox_consumer_messages_total";
/// Histogram `{topic,group}`: handler transaction duration, seconds.
pub const CONSUMER_HANDLER_SECONDS: &str = "outbox_handler_seconds";
/// `{topic,partition,group}`: messages behind the end of the partition (librdkafka's view).
pub const CONSUMER_LAG: &str = "outbox_consumer_lag";
/// `{topic,partition,group}`: while behind, the age of the last message finished on the
/// partition, an upper bound of the oldest unconsumed message's age; 0 when caught up.
pub const CONSUMER_LAG_SECONDS: &str = "outbox_consumer_lag_seconds";
/// `{group}`: partitions paused (backpressure, retry delays).
pub const CONSUMER_PAUSED: &str = "outbox_consumer_paused_partitions";
/// `{group}`: messages accepted and not yet final.
pub const CONSUMER_IN_FLIGHT: &str = "outbox_consumer_in_flight";
/// `{topic,group}`: keys held behind a failed head (strict per-key order).
pub const CONSUMER_HELD_KEYS: &str = "outbox_consumer_held_keys";
/// `{topic,group}`: messages waiting behind held keys' heads.
pub const CONSUMER_HELD_MESSAGES: &str = "outbox_consumer_held_messages";
/// `{topic,group}`: age in seconds of the oldest hold (0 with none).
pub const CONSUMER_OLDEST_HOLD_SECONDS: &str = "outbox_consumer_oldest_hold_seconds";

/// `{topic,group}`: failed writes to a retry or dead-letter topic (`topic` is the target); each
/// is retried, the offset held meanwhile.
pub const CONSUMER_DLQ_WRITE_FAILURES: &str = "outbox_consumer_dlq_write_failures_total";
/// `{group}`: records whose retry or dead-letter write has failed and is being retried: above
/// 0, those partitions cannot move on (a stalled consumer, not ordinary lag).
pub const CONSUMER_DLQ_BLOCKED: &str = "outbox_consumer_dlq_blocked";
/// `{group}`: processed marks older than the cleanup retention (cleanup behind, or off).
pub const MARKS_OVERDUE: &str = "outbox_marks_overdue";

/// `{group,dependency}`: 1 while the group's shared circuit breaker for the dependency is open.
pub const BREAKER_OPEN: &str = "outbox_breaker_open";
/// `{group}`: 0 normal, 1 paused (a breaker is open), 2 draining parked letters, 3 probing a
/// dependency whose breaker expired.
pub const CONSUMER_MODE: &str = "outbox_consumer_mode";

/// `outbox_dlq_messages{topic,group,kind,status}`: archived dead letters (`kind` is
/// `x-error-kind`; the per-cause view, by normalised error, is the admin dashboard's).
pub const DLQ_MESSAGES: &str = "outbox_dlq_messages";
/// `{topic}`: age of the oldest new dead letter, seconds.
pub const DLQ_OLDEST_AGE: &str = "outbox_dlq_oldest_age_seconds";
/// `{topic}`: records archived from DLQ topics.
pub const DLQ_ARCHIVED: &str = "outbox_dlq_archived_total";
/// `{topic}`: archived letters whose cause (kind + normalised error) was not seen before.
pub const DLQ_NEW_ERROR_GROUPS: &str = "outbox_dlq_new_error_groups_total";
/// Letters replayed (acknowledged on the target topic).
pub const DLQ_REPLAYED: &str = "outbox_dlq_replayed_total";
/// `{topic}`: replayed letters seen back in the DLQ, counted by the archiver as it archives
/// them (during the job or within its watch window after it).
pub const DLQ_REPLAY_CAME_BACK: &str = "outbox_dlq_replay_came_back_total";
/// `{reason}`: letters dropped (`operator`, or a drain policy's reason).
pub const DLQ_DROPPED: &str = "outbox_dlq_dropped_total";

/// 1 while the relay publishes exactly-once (`--exactly-once`), else 0.
pub const RELAY_EXACTLY_ONCE: &str = "outbox_relay_exactly_once";
/// Exactly-once Kafka transactions committed (one per slot batch).
pub const RELAY_TXN_COMMITTED: &str = "outbox_relay_transactions_committed_total";
/// `{reason}`: exactly-once transactions aborted (`undelivered`, `refused`, `commit_failed`):
/// their rows stay pending and go again.
pub const RELAY_TXN_ABORTED: &str = "outbox_relay_transactions_aborted_total";
/// `{reason}`: exactly-once transactions whose end is unknown (`fenced` by a new owner,
/// `fatal`, `ambiguous`): the producer is destroyed and the slot recovered.
pub const RELAY_TXN_UNKNOWN: &str = "outbox_relay_transactions_unknown_total";
/// `{outcome}`: exactly-once slot recoveries (`clean`; `marked`: the last transaction was
/// committed in Kafka but not marked, and its rows were marked instead of sent again).
pub const RELAY_SLOT_RECOVERIES: &str = "outbox_relay_slot_recoveries_total";

/// Every metric name the code exports, for the dashboard and alert-rule checks.
pub const ALL: [&str; 43] = [
    RELAY_EXACTLY_ONCE,
    RELAY_TXN_COMMITTED,
    RELAY_TXN_ABORTED,
    RELAY_TXN_UNKNOWN,
    RELAY_SLOT_RECOVERIES,
    BREAKER_OPEN,
    CONSUMER_DLQ_WRITE_FAILURES,
    CONSUMER_DLQ_BLOCKED,
    MARKS_OVERDUE,
    CONSUMER_MODE,
    OUTBOX_ROWS,
    OUTBOX_OLDEST_PENDING_AGE,
    OUTBOX_PUBLISHED,
    OUTBOX_PUBLISH_FAILURES,
    OUTBOX_COMMIT_TO_ACK,
    OUTBOX_BATCH_SIZE,
    OUTBOX_CLAIM_SECONDS,
    OUTBOX_LANES_OWNED,
    OUTBOX_TOPIC_LOOKUPS,
    OUTBOX_STORAGE_BYTES,
    OUTBOX_RING_GENERATIONS,
    OUTBOX_RING_OLDEST_GENERATION_AGE,
    OUTBOX_RING_ROTATIONS,
    OUTBOX_CLEANUP_FAILURES,
    CONSUMER_MESSAGES,
    CONSUMER_HANDLER_SECONDS,
    CONSUMER_LAG,
    CONSUMER_LAG_SECONDS,
    CONSUMER_PAUSED,
    CONSUMER_IN_FLIGHT,
    CONSUMER_HELD_KEYS,
    CONSUMER_HELD_MESSAGES,
    CONSUMER_OLDEST_HOLD_SECONDS,
    DLQ_MESSAGES,
    DLQ_OLDEST_AGE,
    DLQ_TENANT_MESSAGES,
    DLQ_ARCHIVED,
    DLQ_NEW_ERROR_GROUPS,
    DLQ_REPLAYED,
    DLQ_REPLAY_CAME_BACK,
    DLQ_DROPPED,
    "outbox_build_info",
    "outbox_up",
];

#[cfg(test)]
mod tests {
    #[test]
    fn label_values_from_headers_are_capped() {
        for i in 0..super::MAX_LABEL_VALUES + 50 {
            let v = super::bounded("test_label", &format!("v{i}"));
            if i < super::MAX_LABEL_VALUES {
                assert_eq!(v, format!("v{i}"));
            } else {
                assert_eq!(v, "other");
            }
        }
        // Values seen before keep their own series.
        assert_eq!(super::bounded("test_label", "v3"), "v3");
        assert_eq!(super::bounded("other_label", "a\nb"), "other");
        assert_eq!(super::bounded("other_label", &"x".repeat(300)), "other");
    }
}
