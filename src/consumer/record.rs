//! A received record ([`Raw`]), where it originally came from ([`Origin`], surviving retry
//! hops) and decoding before dispatch: a record that cannot be decoded never reaches a handler.

use super::dead_letter::{X_ORIGINAL_OFFSET, X_ORIGINAL_PARTITION};
use super::handler::Delivered;
use super::Shared;
use crate::message::{HEADER_MESSAGE_ID, HEADER_MESSAGE_TYPE};

/// Longest accepted `message_id`.
pub(super) const MAX_MESSAGE_ID_LEN: usize = 200;

/// A received record, owned (also what the DLQ archive reads).
#[derive(Debug, Clone)]
pub(crate) struct Raw {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) payload: Option<Vec<u8>>,
    pub(crate) headers: Vec<(String, Option<Vec<u8>>)>,
    pub(crate) timestamp_ms: Option<i64>,
}

impl Raw {
    /// Copies a record out of librdkafka's buffer.
    pub(crate) fn from_message(m: &rdkafka::message::BorrowedMessage<'_>) -> Self {
        use rdkafka::message::{Headers as _, Message as _};
        Self {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().map(<[u8]>::to_vec),
            // rdkafka's header iterator panics on a header *name* that is not UTF-8; such a
            // record is unreadable and goes to the DLQ as a decode error (key and body intact).
            headers: match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
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
        }
    }

    /// The record's timestamp.
    pub(crate) fn time(&self) -> Option<std::time::SystemTime> {
        self.timestamp_ms
            .and_then(|ms| u64::try_from(ms).ok())
            .map(|ms| std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// Where a record originally came from (survives retry hops).
#[derive(Debug, Clone)]
pub(super) struct Origin {
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) offset: i64,
    pub(super) hop: u32,
}

pub(super) fn origin(raw: &Raw, shared: &Shared) -> Origin {
    if let Some(main) = shared.drain_topics.get(&raw.topic) {
        // A parked letter: it belongs to its original topic (and inbox key).
        return Origin {
            topic: raw
                .header(super::X_ORIGINAL_TOPIC)
                .map_or_else(|| main.clone(), str::to_owned),
            partition: raw
                .header(X_ORIGINAL_PARTITION)
                .and_then(|v| v.parse().ok())
                .unwrap_or(raw.partition),
            offset: raw
                .header(X_ORIGINAL_OFFSET)
                .and_then(|v| v.parse().ok())
                .unwrap_or(raw.offset),
            hop: 0,
        };
    }
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
pub(crate) const UNREADABLE_HEADERS: &str = "\u{0}outbox-unreadable-headers";

/// Validates a record into a [`Delivered`], or says why it cannot be handled.
pub(super) fn decode(raw: &Raw, origin: &Origin) -> Result<Delivered, String> {
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
