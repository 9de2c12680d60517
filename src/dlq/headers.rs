//! Headers in the archive and on the way back.
//!
//! The archive keeps every header of a dead letter in record order as JSON: UTF-8 values as
//! text, other values as base64, null values as null, so a replay can restore them byte for
//! byte. A replay strips every framework header (DESIGN §3.4), carries the seed-000 envelope
//! (`x-dlq-retries`, `x-first-failed-at`) and adds `x-replayed-at`.

use base64::Engine as _;
use rdkafka::message::{Header, OwnedHeaders};
use serde_json::{json, Value};

use crate::consumer::{SERVICE_HEADERS, X_DLQ_RETRIES, X_FIRST_FAILED_AT};

/// Added to every replayed record: when it was replayed (RFC 3339).
pub const X_REPLAYED_AT: &str = "x-replayed-at";

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

/// The headers of a replayed record: the originals without framework headers, then the
/// carried envelope and `x-replayed-at`.
pub(crate) fn for_replay(
    original: &[(String, HeaderValue)],
    dlq_retries: i64,
    first_failed_at: Option<&str>,
    replayed_at: &str,
) -> OwnedHeaders {
    let mut h = OwnedHeaders::new_with_capacity(original.len() + 3);
    for (k, v) in original {
        if SERVICE_HEADERS.contains(&k.as_str()) || k == X_REPLAYED_AT || k.starts_with('\u{0}') {
            continue;
        }
        h = h.insert(Header {
            key: k,
            value: match v {
                HeaderValue::Null => None,
                HeaderValue::Bytes(b) => Some(b.as_slice()),
            },
        });
    }
    let retries = dlq_retries.to_string();
    h = h.insert(Header {
        key: X_DLQ_RETRIES,
        value: Some(retries.as_bytes()),
    });
    if let Some(f) = first_failed_at {
        h = h.insert(Header {
            key: X_FIRST_FAILED_AT,
            value: Some(f.as_bytes()),
        });
    }
    h.insert(Header {
        key: X_REPLAYED_AT,
        value: Some(replayed_at.as_bytes()),
    })
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
    use rdkafka::message::Headers;

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

    #[test]
    fn replay_headers_strip_framework_headers_and_carry_the_envelope() {
        let orig = vec![
            ("message_id".to_owned(), HeaderValue::Bytes(b"m1".to_vec())),
            (
                "traceparent".to_owned(),
                HeaderValue::Bytes(b"00-ab".to_vec()),
            ),
            ("x-error".to_owned(), HeaderValue::Bytes(b"boom".to_vec())),
            (
                "x-original-topic".to_owned(),
                HeaderValue::Bytes(b"t".to_vec()),
            ),
            (
                "x-retry-attempt".to_owned(),
                HeaderValue::Bytes(b"2".to_vec()),
            ),
            (
                "x-dlq-retries".to_owned(),
                HeaderValue::Bytes(b"1".to_vec()),
            ),
            (
                "x-replayed-at".to_owned(),
                HeaderValue::Bytes(b"old".to_vec()),
            ),
        ];
        let h = for_replay(&orig, 1, Some("2026-01-01T00:00:00Z"), "now");
        let names: Vec<(String, Vec<u8>)> = h
            .iter()
            .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
            .collect();
        assert_eq!(
            names,
            vec![
                ("message_id".into(), b"m1".to_vec()),
                ("traceparent".into(), b"00-ab".to_vec()),
                ("x-dlq-retries".into(), b"1".to_vec()),
                ("x-first-failed-at".into(), b"2026-01-01T00:00:00Z".to_vec()),
                ("x-replayed-at".into(), b"now".to_vec()),
            ]
        );
    }
}
