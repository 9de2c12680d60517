//! The message shape: key = entity id, four standard headers, a JSON body.

use std::collections::BTreeMap;
use std::time::SystemTime;

use uuid::Uuid;

use crate::wire::{
    HEADER_ENTITY_ID, HEADER_MESSAGE_ID, HEADER_MESSAGE_TYPE, HEADER_TIMESTAMP, TOMBSTONE_TYPE,
};

/// One event to publish.
///
/// Built with [`Message::new`] (keyed by the entity id, the normal case) or [`Message::keyless`]
/// (must be asked for explicitly: without a key Kafka spreads one entity's events over
/// partitions and their order is lost). `message_id` (UUIDv7) and `timestamp` are assigned here,
/// once; re-sends and replays never change them.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub(crate) topic: String,
    pub(crate) key: Option<String>,
    pub(crate) message_type: String,
    pub(crate) message_id: Uuid,
    pub(crate) timestamp: SystemTime,
    pub(crate) headers: BTreeMap<String, String>,
    pub(crate) payload: serde_json::Value,
    /// A delete marker: published with a null value (see [`Message::tombstone`]).
    pub(crate) tombstone: bool,
}

impl Message {
    /// An event about `entity_id`, which becomes the Kafka key and the `entity_id` header.
    pub fn new(
        topic: impl Into<String>,
        message_type: impl Into<String>,
        entity_id: impl Into<String>,
        payload: serde_json::Value,
    ) -> Self {
        Self {
            topic: topic.into(),
            key: Some(entity_id.into()),
            message_type: message_type.into(),
            message_id: Uuid::now_v7(),
            timestamp: SystemTime::now(),
            headers: BTreeMap::new(),
            payload,
            tombstone: false,
        }
    }

    /// A tombstone: the delete marker of a compacted topic. Published with `key` and a null
    /// value (no body; the outbox row's `payload` is NULL), so compaction removes every earlier
    /// record of the key. It carries the standard headers, with `message_type` = `tombstone`.
    /// Consumers hand it to the handler registered with `Consumer::on_tombstone`, or skip and
    /// count it; never dead-letter it.
    pub fn tombstone(topic: impl Into<String>, key: impl Into<String>) -> Self {
        Self {
            tombstone: true,
            ..Self::new(topic, TOMBSTONE_TYPE, key, serde_json::Value::Null)
        }
    }

    /// True for a [`Message::tombstone`].
    pub fn is_tombstone(&self) -> bool {
        self.tombstone
    }

    /// The body as stored: `None` for a tombstone.
    pub(crate) fn stored_payload(&self) -> Option<&serde_json::Value> {
        (!self.tombstone).then_some(&self.payload)
    }

    /// An event without a key (and without an `entity_id` header). Kafka then spreads messages
    /// over partitions, so there is no ordering between them.
    pub fn keyless(
        topic: impl Into<String>,
        message_type: impl Into<String>,
        payload: serde_json::Value,
    ) -> Self {
        Self {
            key: None,
            ..Self::new(topic, message_type, String::new(), payload)
        }
    }

    /// Adds a user header, e.g. `traceparent`. The four standard headers cannot be overridden;
    /// trying to is reported by `enqueue` as [`EnqueueError::ReservedHeader`](crate::EnqueueError).
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// The destination topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The Kafka key (the entity id), if any.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The `message_type` header.
    pub fn message_type(&self) -> &str {
        &self.message_type
    }

    /// The UUIDv7 that identifies this message for its whole life.
    pub fn message_id(&self) -> Uuid {
        self.message_id
    }

    /// The JSON body (`null` for a tombstone, which has none).
    pub fn payload(&self) -> &serde_json::Value {
        &self.payload
    }

    /// All headers as they will be stored and published: the standard four plus user headers.
    pub fn all_headers(&self) -> BTreeMap<String, String> {
        let mut h = self.headers.clone();
        h.insert(HEADER_MESSAGE_TYPE.into(), self.message_type.clone());
        if let Some(k) = &self.key {
            h.insert(HEADER_ENTITY_ID.into(), k.clone());
        }
        h.insert(HEADER_MESSAGE_ID.into(), self.message_id.to_string());
        h.insert(HEADER_TIMESTAMP.into(), rfc3339(self.timestamp));
        h
    }
}

/// RFC 3339, UTC, `Z`, millisecond precision, e.g. `2026-01-15T12:34:56.789Z`.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// An instant as operators write it: an RFC 3339 time (`2026-11-30T08:00:00Z`) or a duration ago
/// (`2h`, `7d`).
///
/// # Errors
/// [`InvalidInstant`], naming both accepted forms.
pub fn parse_instant(s: &str) -> Result<SystemTime, InvalidInstant> {
    if let Ok(t) = humantime::parse_rfc3339_weak(s.trim()) {
        return Ok(t);
    }
    if let Ok(d) = humantime::parse_duration(s.trim()) {
        // A duration reaching before 1970 (`10000y`, `99999999h`) means "since the beginning":
        // the platform can represent such an instant, but nothing can format or store it.
        return Ok(SystemTime::now()
            .checked_sub(d)
            .filter(|t| *t >= SystemTime::UNIX_EPOCH)
            .unwrap_or(SystemTime::UNIX_EPOCH));
    }
    Err(InvalidInstant(crate::wire::cut(s)))
}

/// Text that is neither an RFC 3339 time nor a duration ago (its first characters kept).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?}: give an RFC 3339 time (2026-11-30T08:00:00Z) or a duration ago (2h)")]
pub struct InvalidInstant(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_headers_are_set_and_win() {
        let m = Message::new(
            "orders.created",
            "order_created",
            "A-1",
            serde_json::json!({}),
        )
        .with_header("traceparent", "00-abc");
        let h = m.all_headers();
        assert_eq!(h["message_type"], "order_created");
        assert_eq!(h["entity_id"], "A-1");
        assert_eq!(h["traceparent"], "00-abc");
        assert_eq!(
            Uuid::parse_str(&h["message_id"]).unwrap().get_version_num(),
            7
        );
        assert!(h["timestamp"].ends_with('Z'), "{}", h["timestamp"]);
        assert_eq!(m.key(), Some("A-1"));
    }

    #[test]
    fn durations_reaching_before_1970_mean_the_beginning_not_a_panic() {
        for s in ["10000y", "99999999h", "5000000000y"] {
            let t = parse_instant(s).unwrap();
            assert_eq!(t, SystemTime::UNIX_EPOCH, "{s}");
            assert_eq!(rfc3339(t), "1970-01-01T00:00:00.000Z");
        }
        assert!(parse_instant("99999999999999999999y").is_err());
    }

    #[test]
    fn keyless_has_no_key_and_no_entity_header() {
        let m = Message::keyless("orders.created", "t", serde_json::json!(1));
        assert_eq!(m.key(), None);
        assert!(!m.all_headers().contains_key("entity_id"));
    }

    #[test]
    fn ids_are_unique_and_time_ordered() {
        let a = Message::new("t", "x", "1", serde_json::json!(1)).message_id();
        let b = Message::new("t", "x", "1", serde_json::json!(1)).message_id();
        assert!(a < b);
    }
}
