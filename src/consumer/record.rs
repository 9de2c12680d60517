//! Where it originally came from ([`Origin`], surviving retry
//! hops) and decoding before dispatch: a record that cannot be decoded never reaches a handler.

use super::handler::Delivered;
use super::Shared;
pub(crate) use crate::kafka::Raw;
use crate::wire::{HEADER_MESSAGE_ID, HEADER_MESSAGE_TYPE};
use crate::wire::{UNREADABLE_HEADERS, X_ORIGINAL_OFFSET, X_ORIGINAL_PARTITION};

/// Longest accepted `message_id`.
pub(super) const MAX_MESSAGE_ID_LEN: usize = 200;

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
    let tombstone = raw.payload.is_none();
    let (message_type, message_id, body) = if tombstone {
        // A tombstone: any producer may write one, with or without our headers. Its dedupe
        // key falls back to the record's original coordinates, stable across redeliveries.
        let id = match required(HEADER_MESSAGE_ID) {
            Ok(id) if id.len() <= MAX_MESSAGE_ID_LEN => id,
            _ => format!(
                "tombstone:{}:{}:{}",
                origin.topic, origin.partition, origin.offset
            ),
        };
        let kind =
            required(HEADER_MESSAGE_TYPE).unwrap_or_else(|_| crate::wire::TOMBSTONE_TYPE.into());
        (kind, id, serde_json::Value::Null)
    } else {
        let kind = required(HEADER_MESSAGE_TYPE)?;
        let id = required(HEADER_MESSAGE_ID)?;
        if id.len() > MAX_MESSAGE_ID_LEN {
            return Err(format!(
                "message_id header longer than {MAX_MESSAGE_ID_LEN} bytes"
            ));
        }
        let payload = raw.payload.as_deref().unwrap_or_default();
        if crate::schemas_frame_id(payload).is_some() {
            // Framed (Confluent wire format): decoded through the registry before dispatch
            // (`schemas.rs`), the body filled in there.
            (kind, id, serde_json::Value::Null)
        } else {
            let body = serde_json::from_slice(payload)
                .map_err(|e| format!("body is not valid JSON: {e}"))?;
            (kind, id, body)
        }
    };
    let schema_id = if tombstone {
        None
    } else {
        crate::schemas_frame_id(raw.payload.as_deref().unwrap_or_default())
    };
    Ok(Delivered {
        topic: origin.topic.clone(),
        source_topic: raw.topic.clone(),
        partition: raw.partition,
        offset: raw.offset,
        key: raw.key.clone(),
        headers: raw.headers.clone(),
        payload: raw.payload.clone().unwrap_or_default(),
        message_type,
        message_id,
        body,
        schema_id,
        retry_attempt: origin.hop,
        tombstone,
    })
}
