//! What every Kafka client of the library shares: the idempotent producer preset, librdkafka's
//! callbacks folded into outage lines, and the typed reasons a record is refused.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use rdkafka::TopicPartitionList;

use crate::config::KafkaConfig;
use crate::outage::Outage;
use crate::wire::UNREADABLE_HEADERS;

/// The producer settings every lossless producer of the library uses (the relay, dead letters,
/// retries, replays): idempotence and `acks=all` so an acknowledged record is on every in-sync
/// replica and a retried send is never written twice, no topic auto-creation (topics are made
/// by `outbox topics apply`), and `message.timeout.ms` from `delivery_timeout`.
///
/// The pass-through properties come first; these settings are applied after them, so a user
/// property cannot weaken them. `linger_ms` is the one knob that differs: the relay hands over
/// whole batches and waits for them (0 ms is best there, and the relay lets a user's
/// `linger.ms` through); one-at-a-time producers gain from a short linger.
pub(crate) fn idempotent_producer(
    kafka: &KafkaConfig,
    delivery_timeout: Duration,
    linger_ms: u32,
) -> rdkafka::ClientConfig {
    let mut c = kafka.client_config();
    c.set("linger.ms", linger_ms.to_string())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("allow.auto.create.topics", "false")
        .set(
            "message.timeout.ms",
            delivery_timeout.as_millis().to_string(),
        );
    c
}

/// Why the broker or librdkafka refused one record: a bounded set, used as a metric label and
/// told apart by librdkafka's error code, never by the text of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefusalReason {
    /// The topic or partition does not exist.
    UnknownTopic,
    /// The record is larger than the broker or the producer accepts.
    MessageTooLarge,
    /// Any other refusal.
    Refused,
    /// The topic's schema cannot be had: no such subject, a schema that does not compile or
    /// is of another format (backed off like any refusal until the registry holds it).
    Schema,
    /// The payload breaks the topic's schema: the row fails at once (nothing retried can
    /// change it); `outbox requeue` after the fix.
    Contract,
}

impl RefusalReason {
    /// Classifies a produce error by its librdkafka error code.
    pub fn of(e: &KafkaError) -> Self {
        use RDKafkaErrorCode as C;
        match e.rdkafka_error_code() {
            Some(C::UnknownTopic | C::UnknownTopicOrPartition | C::UnknownTopicId) => {
                Self::UnknownTopic
            }
            Some(C::MessageSizeTooLarge | C::MessageBatchTooLarge) => Self::MessageTooLarge,
            _ => Self::Refused,
        }
    }

    /// The metric label (`reason`) of this refusal.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnknownTopic => "unknown_topic",
            Self::MessageTooLarge => "message_too_large",
            Self::Refused => "refused",
            Self::Schema => "schema",
            Self::Contract => "contract",
        }
    }
}

/// librdkafka's callbacks for a client: "cannot reach the cluster" log lines and error
/// events become the outage's lines; everything else is logged as usual.
pub(crate) struct KafkaQuiet(pub Arc<Outage>);

impl rdkafka::ClientContext for KafkaQuiet {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        if is_transport_noise(log_message) {
            self.0.failed(&format!("{fac}: {log_message}"));
            return;
        }
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                tracing::error!(target: "librdkafka", "{fac}: {log_message}")
            }
            L::Warning => tracing::warn!(target: "librdkafka", "{fac}: {log_message}"),
            L::Notice | L::Info => tracing::info!(target: "librdkafka", "{fac}: {log_message}"),
            L::Debug => tracing::debug!(target: "librdkafka", "{fac}: {log_message}"),
        }
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        let text = format!("{error}: {reason}");
        if is_transport_noise(&text) {
            self.0.failed(&text);
        } else {
            tracing::error!(target: "librdkafka", "{text}");
        }
    }
}

impl rdkafka::producer::ProducerContext for KafkaQuiet {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

/// librdkafka's log lines and error events that only say "the cluster is not reachable".
pub(crate) fn is_transport_noise(text: &str) -> bool {
    const NOISE: [&str; 10] = [
        "not found in cache",
        "Connection refused",
        "AllBrokersDown",
        "all brokers are down",
        "BrokerTransportFailure",
        "Broker transport failure",
        "Disconnected",
        "Connect to ipv",
        "Resolve",
        "timed out",
    ];
    NOISE.iter().any(|n| text.contains(n))
}

/// A received record, owned (what the consumer and the DLQ archiver read).
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

/// A partition list of `(topic, partition)` pairs.
pub(crate) fn tpl_of<'a>(tps: impl IntoIterator<Item = &'a (String, i32)>) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (t, p) in tps {
        tpl.add_partition(t, *p);
    }
    tpl
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_noise_is_told_apart() {
        assert!(is_transport_noise(
            "Connect to ipv4#127.0.0.1:9092 failed: Connection refused"
        ));
        assert!(!is_transport_noise("Topic x.y partition count changed"));
    }

    #[test]
    fn refusals_are_classified_by_code() {
        let e = |c| KafkaError::MessageProduction(c);
        for (code, reason) in [
            (
                RDKafkaErrorCode::UnknownTopicOrPartition,
                RefusalReason::UnknownTopic,
            ),
            (RDKafkaErrorCode::UnknownTopic, RefusalReason::UnknownTopic),
            (
                RDKafkaErrorCode::UnknownTopicId,
                RefusalReason::UnknownTopic,
            ),
            (
                RDKafkaErrorCode::MessageSizeTooLarge,
                RefusalReason::MessageTooLarge,
            ),
            (
                RDKafkaErrorCode::MessageBatchTooLarge,
                RefusalReason::MessageTooLarge,
            ),
            (RDKafkaErrorCode::UnknownPartition, RefusalReason::Refused),
            (RDKafkaErrorCode::InvalidRecord, RefusalReason::Refused),
        ] {
            assert_eq!(RefusalReason::of(&e(code)), reason, "{code:?}");
        }
    }

    #[test]
    fn the_preset_cannot_be_weakened() {
        let mut k = KafkaConfig::new("127.0.0.1:9092").unwrap();
        k.set_from_pair("acks=0").unwrap();
        k.set_from_pair("linger.ms=20").unwrap();
        let c = idempotent_producer(&k, Duration::from_secs(3), 5);
        assert_eq!(c.get("acks"), Some("all"));
        assert_eq!(c.get("enable.idempotence"), Some("true"));
        assert_eq!(c.get("linger.ms"), Some("5"));
        assert_eq!(c.get("message.timeout.ms"), Some("3000"));
    }
}
