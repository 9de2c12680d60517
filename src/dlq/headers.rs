//! Headers on the way back: a replay strips every framework header, carries the re-processing
//! envelope (`x-dlq-retries`, `x-first-failed-at`) and adds `x-replayed-at`. How the archive
//! stores headers is in [`crate::wire`].

use rdkafka::message::{Header, OwnedHeaders};

pub(crate) use crate::wire::{find, from_json, no_nul, to_json};
pub(crate) use crate::wire::{HeaderValue, X_REPLAYED_AT};
use crate::wire::{SERVICE_HEADERS, X_DLQ_RETRIES, X_FIRST_FAILED_AT, X_REPLAY_JOB, X_REPLAY_OF};

/// The headers of a replayed record: the originals without framework headers, then the
/// carried envelope, `x-replayed-at`, and what replays it (`x-replay-job`, `x-replay-of`: job
/// id and letter id) so a comeback is matched to both.
/// A replay's `replay {topic}` span for one letter (a child of its creation context, linked
/// to the delivery that dead-lettered it) and the context the replayed record carries.
pub(crate) fn replay_span(
    topic: &str,
    original: &[(String, HeaderValue)],
) -> (crate::otel::Span, Option<String>) {
    let text = |name: &str| {
        original
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| match v {
                HeaderValue::Bytes(b) => std::str::from_utf8(b).ok(),
                HeaderValue::Null => None,
            })
    };
    let span = crate::otel::replay(
        topic,
        text(crate::wire::HEADER_MESSAGE_ID).unwrap_or_default(),
        (
            text(crate::trace_context::TRACEPARENT),
            text(crate::trace_context::TRACESTATE),
        ),
        text(crate::otel::X_TRACE_LINK),
    );
    let tp = span.traceparent();
    (span, tp)
}

pub(crate) fn for_replay(
    original: &[(String, HeaderValue)],
    dlq_retries: i64,
    first_failed_at: Option<&str>,
    replayed_at: &str,
    replay: Option<(i64, i64)>,
    trace_link: Option<&str>,
) -> OwnedHeaders {
    let mut h = OwnedHeaders::new_with_capacity(original.len() + 6);
    let link_ours = trace_link.is_some();
    for (k, v) in original {
        let ours = [X_REPLAYED_AT, X_REPLAY_JOB, X_REPLAY_OF].contains(&k.as_str())
            || (link_ours && k == crate::otel::X_TRACE_LINK);
        if SERVICE_HEADERS.contains(&k.as_str()) || ours || k.starts_with('\u{0}') {
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
    h = h.insert(Header {
        key: X_REPLAYED_AT,
        value: Some(replayed_at.as_bytes()),
    });
    if let Some(tp) = trace_link {
        h = h.insert(Header {
            key: crate::otel::X_TRACE_LINK,
            value: Some(tp.as_bytes()),
        });
    }
    let Some((job, of)) = replay else {
        return h;
    };
    let (job, of) = (job.to_string(), of.to_string());
    h.insert(Header {
        key: X_REPLAY_JOB,
        value: Some(job.as_bytes()),
    })
    .insert(Header {
        key: X_REPLAY_OF,
        value: Some(of.as_bytes()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::Headers;

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
            // An earlier replay's marks are replaced, never carried.
            ("x-replay-job".to_owned(), HeaderValue::Bytes(b"3".to_vec())),
            ("x-replay-of".to_owned(), HeaderValue::Bytes(b"9".to_vec())),
        ];
        let h = for_replay(
            &orig,
            1,
            Some("2026-01-01T00:00:00Z"),
            "now",
            Some((7, 42)),
            None,
        );
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
                ("x-replay-job".into(), b"7".to_vec()),
                ("x-replay-of".into(), b"42".to_vec()),
            ]
        );
    }
}
