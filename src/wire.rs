//! The wire format every part agrees on: the headers the framework adds to retry records,
//! dead letters and replays, why a letter was dead-lettered, the names of retry topics, and how
//! the archive stores a record's headers. Below both the consumer (which writes these records)
//! and the DLQ tools (which read them back), so that neither depends on the other for it.
//!
//! Key and body of a retried, dead-lettered or replayed record are byte-identical to the
//! original; only headers are added or removed.

use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

/// Header naming the kind of event; consumers dispatch on it.
pub const HEADER_MESSAGE_TYPE: &str = "message_type";
/// Header carrying the entity id (also the Kafka key).
pub const HEADER_ENTITY_ID: &str = "entity_id";
/// Header carrying the UUIDv7 assigned once at enqueue; consumers dedupe on it.
pub const HEADER_MESSAGE_ID: &str = "message_id";
/// Header carrying the enqueue time, RFC 3339 UTC with `Z`.
pub const HEADER_TIMESTAMP: &str = "timestamp";

/// The headers the library sets itself; users may not override them.
pub const STANDARD_HEADERS: [&str; 4] = [
    HEADER_MESSAGE_TYPE,
    HEADER_ENTITY_ID,
    HEADER_MESSAGE_ID,
    HEADER_TIMESTAMP,
];

/// The `message_type` of a tombstone made by [`crate::Message::tombstone`].
pub const TOMBSTONE_TYPE: &str = "tombstone";
pub use crate::topic::{validate_topic, InvalidTopic, MAX_TOPIC_LEN};

/// Retry hop counter on retry topics.
pub const X_RETRY_ATTEMPT: &str = "x-retry-attempt";
/// The topic the event was first published to.
pub const X_ORIGINAL_TOPIC: &str = "x-original-topic";
/// Partition of the original record.
pub const X_ORIGINAL_PARTITION: &str = "x-original-partition";
/// Offset of the original record.
pub const X_ORIGINAL_OFFSET: &str = "x-original-offset";
/// The consumer group that gave up.
pub const X_CONSUMER_GROUP: &str = "x-consumer-group";
/// Handler attempts made before dead-lettering.
pub const X_ATTEMPTS: &str = "x-attempts";
/// The last error, at most 500 characters.
pub const X_ERROR: &str = "x-error";
/// `transient-exhausted`, `permanent`, `decode`, `panic` or `unavailable`.
pub const X_ERROR_KIND: &str = "x-error-kind";
/// When the message was dead-lettered (RFC 3339).
pub const X_FAILED_AT: &str = "x-failed-at";
/// DLQ re-processing envelope: times this message has been dead-lettered before.
pub const X_DLQ_RETRIES: &str = "x-dlq-retries";
/// DLQ re-processing envelope: when it was first dead-lettered; kept across hops.
pub const X_FIRST_FAILED_AT: &str = "x-first-failed-at";

/// On a replayed record: the replay job that sent it. Kept by the consumer on the dead letter
/// it writes if the record fails again, so the comeback is matched to its job.
pub const X_REPLAY_JOB: &str = "x-replay-job";
/// On a replayed record: the archive id of the letter it replays.
pub const X_REPLAY_OF: &str = "x-replay-of";
/// On a message an operator edited and retried from the dashboard: the message id of the
/// original (the edited one has a new id). The retry's `x-replay-job`/`x-replay-of` name the
/// letter it was edited from.
pub const X_EDITED_FROM: &str = "x-edited-from";

/// The event's sequence in its source: the outbox row's id, added by the relay to every record
/// it publishes (unless the row's own headers already carry one, which is kept as written).
/// Per key it increases in publication order, and a retry, a dead letter and a replay keep it:
/// a handler compares it with what it has applied for the entity to ignore an older delivery
/// (`Delivered::newer_than_applied`). Not a service header: a replay keeps it.
pub const X_OUTBOX_SEQ: &str = "x-outbox-seq";

/// The tenant whose outbox a record came from, added by a fleet's relay (`outbox relay
/// --tenants`) unless the row carries it. Ids (and so [`X_OUTBOX_SEQ`]) are per outbox: a
/// handler comparing sequences of entities that several tenants share scopes them by it.
pub const X_TENANT: &str = "x-tenant";

/// Every header the framework manages; replays strip them all.
pub const SERVICE_HEADERS: [&str; 11] = [
    X_RETRY_ATTEMPT,
    X_ORIGINAL_TOPIC,
    X_ORIGINAL_PARTITION,
    X_ORIGINAL_OFFSET,
    X_CONSUMER_GROUP,
    X_ATTEMPTS,
    X_ERROR,
    X_ERROR_KIND,
    X_FAILED_AT,
    X_DLQ_RETRIES,
    X_FIRST_FAILED_AT,
];

/// Why a message was dead-lettered (`x-error-kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterKind {
    /// Transient failures outlasted the retry budget.
    TransientExhausted,
    /// The handler returned a permanent error.
    Permanent,
    /// The message could not be decoded or validated (no retries spent).
    Decode,
    /// The handler panicked.
    Panic,
    /// A downstream dependency was unavailable: parked by the circuit breaker, drained later.
    Unavailable,
    /// Held behind a failed message of its key (strict per-key order) past the group's hold
    /// expiry, with `OnHoldExpiry::DeadLetter`: it follows its head to the DLQ, in order.
    HeldExpired,
}

impl DeadLetterKind {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TransientExhausted => "transient-exhausted",
            Self::Permanent => "permanent",
            Self::Decode => "decode",
            Self::Panic => "panic",
            Self::Unavailable => "unavailable",
            Self::HeldExpired => "held-expired",
        }
    }
}

/// Added to every replayed record: when it was replayed (RFC 3339).
pub const X_REPLAYED_AT: &str = "x-replayed-at";

/// The longest `x-error` value, in characters: longer errors are cut.
pub const MAX_ERROR_HEADER_LEN: usize = 500;

/// Cuts an error to the 500 characters the headers allow.
pub(crate) fn cut(s: &str) -> String {
    s.chars().take(MAX_ERROR_HEADER_LEN).collect()
}

/// Marks a record whose headers could not be read (a header name that is not UTF-8).
pub(crate) const UNREADABLE_HEADERS: &str = "\u{0}outbox-unreadable-headers";

/// The suffix of a topic's dead-letter topic: `<topic>.dlq`.
pub const DEFAULT_DLQ_SUFFIX: &str = "dlq";

/// Default retry-topic schedule: `.retry-5s`, `.retry-30s`, `.retry-5m`.
pub const DEFAULT_RETRY_DELAYS: [Duration; 3] = [
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(300),
];

/// A retry topic that cannot be named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryTopicError {
    /// A delay below 1 s or not a whole number of seconds.
    #[error("retry delay {0:?} must be a whole number of seconds, at least 1 s")]
    Delay(Duration),
    /// The group's name makes the retry topic's name break the naming rules.
    #[error("consumer group {group:?} cannot name a retry topic of {topic:?} ({reason}); use a group name of [a-zA-Z0-9-] (and '.' or '_' only as the topic uses them)")]
    GroupName {
        /// The main topic.
        topic: String,
        /// The consumer group.
        group: String,
        /// The rule the name breaks.
        reason: crate::topic::InvalidTopic,
    },
}

/// The suffix of a retry topic for `delay`: `retry-5s`, `retry-30s`, `retry-5m`, `retry-1h`.
///
/// # Errors
/// [`RetryTopicError::Delay`] when the delay is below 1 s or not a whole number of seconds.
pub fn retry_suffix(delay: Duration) -> Result<String, RetryTopicError> {
    if delay < Duration::from_secs(1) || delay.subsec_nanos() != 0 {
        return Err(RetryTopicError::Delay(delay));
    }
    let s = delay.as_secs();
    Ok(if s % 3600 == 0 {
        format!("retry-{}h", s / 3600)
    } else if s % 60 == 0 {
        format!("retry-{}m", s / 60)
    } else {
        format!("retry-{s}s")
    })
}

/// The retry topic of `group` for `topic` and `delay`: `<topic>.<group>.retry-5s`. Retry topics
/// belong to one consumer group: a group's retries are never read by another group that shares
/// the main topic.
///
/// # Errors
/// [`RetryTopicError::Delay`] when the delay is not whole seconds,
/// [`RetryTopicError::GroupName`] when the name breaks the topic naming rules (a group with
/// characters outside `[a-zA-Z0-9._-]`, `.` and `_` mixed, longer than 249).
pub fn retry_topic(topic: &str, group: &str, delay: Duration) -> Result<String, RetryTopicError> {
    let name = format!("{topic}.{group}.{}", retry_suffix(delay)?);
    crate::topic::validate_topic(&name).map_err(|reason| RetryTopicError::GroupName {
        topic: topic.to_owned(),
        group: group.to_owned(),
        reason,
    })?;
    Ok(name)
}

/// One header value as archived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderValue {
    /// No value (a null header).
    Null,
    /// Raw bytes (text when UTF-8).
    Bytes(Vec<u8>),
}

impl HeaderValue {
    /// The value as text when it is UTF-8.
    pub fn text(&self) -> Option<&str> {
        match self {
            Self::Null => None,
            Self::Bytes(b) => std::str::from_utf8(b).ok(),
        }
    }
}

/// Headers as the archive's JSON array.
pub(crate) fn to_json(headers: &[(String, Option<Vec<u8>>)]) -> Value {
    Value::Array(
        headers
            .iter()
            .map(|(k, v)| {
                // jsonb cannot hold NUL: names are made printable, values with a NUL (a
                // big-endian integer, say) go as base64 like any non-UTF-8 value.
                let k = no_nul(k);
                match v {
                    None => json!({"name": k, "value": null}),
                    Some(b) => match std::str::from_utf8(b) {
                        Ok(s) if !s.contains('\0') => json!({"name": k, "value": s}),
                        _ => json!({
                            "name": k,
                            "base64": base64::engine::general_purpose::STANDARD.encode(b)
                        }),
                    },
                }
            })
            .collect(),
    )
}

/// Text Postgres can store: NUL replaced by U+FFFD.
pub(crate) fn no_nul(s: &str) -> String {
    s.replace('\0', "\u{fffd}")
}

/// The archive's JSON array back to headers; entries it cannot read are skipped.
pub(crate) fn from_json(v: &Value) -> Vec<(String, HeaderValue)> {
    let Some(items) = v.as_array() else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|h| {
            let name = h.get("name")?.as_str()?.to_owned();
            let value = if let Some(b) = h.get("base64").and_then(Value::as_str) {
                HeaderValue::Bytes(base64::engine::general_purpose::STANDARD.decode(b).ok()?)
            } else {
                match h.get("value") {
                    Some(Value::String(s)) => HeaderValue::Bytes(s.clone().into_bytes()),
                    _ => HeaderValue::Null,
                }
            };
            Some((name, value))
        })
        .collect()
}

/// The first value of `name` as text.
pub(crate) fn find<'a>(headers: &'a [(String, Option<Vec<u8>>)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.as_deref())
        .and_then(|v| std::str::from_utf8(v).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_follow_seed_001() {
        let names: Vec<_> = DEFAULT_RETRY_DELAYS
            .iter()
            .map(|d| retry_suffix(*d).unwrap())
            .collect();
        assert_eq!(names, ["retry-5s", "retry-30s", "retry-5m"]);
        assert_eq!(retry_suffix(Duration::from_secs(7200)).unwrap(), "retry-2h");
        assert!(retry_suffix(Duration::from_millis(1500)).is_err());
        assert!(retry_suffix(Duration::from_millis(0)).is_err());
        let d = Duration::from_secs(5);
        assert_eq!(
            retry_topic("orders.created", "billing-service", d).unwrap(),
            "orders.created.billing-service.retry-5s"
        );
        // '.' and '_' never mixed; only topic characters; Kafka's length limit.
        assert!(retry_topic("orders.created", "billing_service", d).is_err());
        assert!(retry_topic("orders.created", "billing service", d).is_err());
        assert!(retry_topic("orders.created", &"g".repeat(240), d).is_err());
    }

    #[test]
    fn json_round_trip_is_lossless_for_non_utf8_and_null_values() {
        let h = vec![
            ("int".to_owned(), Some(vec![0, 0, 0, 5])),
            ("a".to_owned(), Some(b"text".to_vec())),
            ("bin".to_owned(), Some(vec![0xff, 0x00, 0xfe])),
            ("none".to_owned(), None),
            ("a".to_owned(), Some(b"second".to_vec())),
        ];
        let json = to_json(&h);
        assert!(!json.to_string().contains("\\u0000"), "{json}");
        let back = from_json(&json);
        let expect: Vec<(String, HeaderValue)> = h
            .into_iter()
            .map(|(k, v)| (k, v.map_or(HeaderValue::Null, HeaderValue::Bytes)))
            .collect();
        assert_eq!(back, expect);
    }
}
