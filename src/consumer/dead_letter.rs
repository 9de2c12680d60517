//! Headers the framework adds on the way to a retry topic or the dead-letter topic
//! (DESIGN §3.4). Key and body are always forwarded byte-identical.

use rdkafka::message::{Header, OwnedHeaders};

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
/// DLQ re-processing envelope (seed 000): times this message has been dead-lettered before.
pub const X_DLQ_RETRIES: &str = "x-dlq-retries";
/// DLQ re-processing envelope (seed 000): when it was first dead-lettered; kept across hops.
pub const X_FIRST_FAILED_AT: &str = "x-first-failed-at";

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
        }
    }
}

/// Cuts an error to the 500 characters the headers allow.
pub(crate) fn cut(s: &str) -> String {
    s.chars().take(500).collect()
}

/// The original headers without the service headers named in `replace`, then `extra`.
pub(crate) fn rebuild(
    original: &[(String, Option<Vec<u8>>)],
    replace: &[&str],
    extra: &[(&str, String)],
) -> OwnedHeaders {
    let mut h = OwnedHeaders::new_with_capacity(original.len() + extra.len());
    for (k, v) in original {
        // The unreadable-headers marker is internal, never forwarded.
        if replace.contains(&k.as_str()) || k.starts_with('\u{0}') {
            continue;
        }
        h = h.insert(Header {
            key: k,
            value: v.as_deref(),
        });
    }
    for (k, v) in extra {
        h = h.insert(Header {
            key: k,
            value: Some(v.as_bytes()),
        });
    }
    h
}

/// The consumer's record of the records it dead-lettered (`dead_lettered`), so that a record
/// redelivered after a crash is not dead-lettered a second time.
#[derive(Debug, Clone)]
pub(super) struct DeadLetterLog {
    check: String,
    mark: String,
    group: String,
}

impl DeadLetterLog {
    pub(super) fn new(schema: &crate::schema::Schema, group: &str) -> Self {
        let t = format!("{}.dead_lettered", schema.quoted());
        Self {
            check: format!(
                "SELECT 1 FROM {t} WHERE consumer_group = $1 AND topic = $2 AND \"partition\" = $3 AND \"offset\" = $4"
            ),
            mark: format!(
                "INSERT INTO {t} (consumer_group, topic, \"partition\", \"offset\") VALUES ($1, $2, $3, $4)
                 ON CONFLICT DO NOTHING"
            ),
            group: group.to_owned(),
        }
    }

    /// Whether this record was dead-lettered before (false when Postgres cannot tell: at worst
    /// a duplicate dead letter, never a lost one).
    pub(super) async fn seen(
        &self,
        pool: &deadpool_postgres::Pool,
        raw: &super::record::Raw,
    ) -> bool {
        let Ok(c) = pool.get().await else {
            return false;
        };
        c.query_opt(
            &self.check,
            &[&self.group, &raw.topic, &raw.partition, &raw.offset],
        )
        .await
        .ok()
        .flatten()
        .is_some()
    }

    /// Records an acknowledged dead letter, retrying through a Postgres outage (until shutdown).
    pub(super) async fn record(
        &self,
        pool: &deadpool_postgres::Pool,
        raw: &super::record::Raw,
        cancel: &tokio_util::sync::CancellationToken,
    ) {
        let mut backoff = crate::backoff::Backoff::default();
        loop {
            let r = match pool.get().await {
                Ok(c) => c
                    .execute(
                        &self.mark,
                        &[&self.group, &raw.topic, &raw.partition, &raw.offset],
                    )
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match r {
                Ok(()) => return,
                Err(e) => {
                    if backoff.failures() == 0 {
                        tracing::warn!(error = %e, "cannot record a dead letter as written; retrying (a crash meanwhile may duplicate it)");
                    }
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        }
    }
}
