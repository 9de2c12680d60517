//! Handlers run through the runtime's real path — inbox, classification, in-place retries,
//! the retry-topic decision, dead letters, the breaker — on messages built in a test, with
//! real Postgres and no broker: the records the runtime would write to retry and dead-letter
//! topics are kept and returned instead.
//!
//! ```no_run
//! # async fn demo(db: outbox::DbConfig, kafka: outbox::KafkaConfig) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox::consumer::{Consumer, ConsumerConfig, Delivered, HandlerError, Verdict};
//! use outbox::Message;
//! async fn charge(msg: &Delivered, _tx: &tokio_postgres::Transaction<'_>) -> Result<(), HandlerError> {
//!     match msg.json()["total_cents"].as_i64() {
//!         Some(c) if c > 0 => Ok(()),
//!         _ => Err(HandlerError::permanent("refusing to charge")),
//!     }
//! }
//! let harness = Consumer::new(&db, &kafka, ConsumerConfig::new("billing", ["orders"]))?
//!     .handler("order_created", charge)
//!     .harness()
//!     .await?;
//! let bad = Message::new("orders", "order_created", "A-1", serde_json::json!({"total_cents": -5}));
//! match harness.deliver(Delivered::from_message(&bad)).await {
//!     Verdict::DeadLettered { error, .. } => assert!(error.contains("refusing")),
//!     other => panic!("{other:?}"),
//! }
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::envelope::Envelope;
use super::envelope::Fate;
use super::handler::Delivered;
use super::process::process;
use super::record::{decode, origin, Raw};
use super::stats::ConsumerStats;
use super::{call, Consumer, ConsumerError, DeadLetterKind, Shared, Sink};
use crate::message::Message;

/// A record the runtime wrote (a retry hop or a dead letter), kept by a [`Harness`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The retry or dead-letter topic.
    pub topic: String,
    /// The key, byte-identical to the message's.
    pub key: Option<Vec<u8>>,
    /// Every header, as the runtime set them (the message's, then `x-…`).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The body, byte-identical to the message's.
    pub payload: Option<Vec<u8>>,
}

impl Written {
    /// The last header named `name`, when it is valid UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// How the runtime ended with one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// The handler's transaction committed with the message's mark, after `attempts` tries.
    Handled {
        /// Tries, the successful one included (in-place retries before it).
        attempts: u32,
    },
    /// The group had processed this `message_id` already: the handler did not run.
    Duplicate,
    /// No handler for its `message_type` (or a tombstone without one): skipped, counted.
    Skipped,
    /// A transient failure forwarded to the next retry topic (`RetryStrategy::Topics`); hand
    /// `record` to [`Harness::redeliver`] to play the next hop.
    Retried {
        /// What went to the retry topic.
        record: Written,
    },
    /// Written to the dead-letter topic.
    DeadLettered {
        /// Why (`x-error-kind`).
        kind: DeadLetterKind,
        /// The error text (`x-error`).
        error: String,
        /// Handler calls spent (`x-attempts`).
        attempts: u32,
        /// The letter as written.
        record: Written,
    },
    /// Not final: the harness was stopped while the message waited (for a retry, a database
    /// outage); the broker would redeliver it.
    Abandoned,
}

/// A consumer's handlers, configuration and database with no broker: see the module docs.
/// Built by [`Consumer::harness`]; deliveries are processed one at a time, in call order.
pub struct Harness {
    shared: Arc<Shared>,
    /// One delivery at a time, so each outcome is read from its own effects.
    turn: tokio::sync::Mutex<()>,
    /// Each delivery gets its own offset (the dead-letter record is keyed by it).
    next_offset: AtomicI64,
    stop: CancellationToken,
}

impl<D> Consumer<D> {
    /// This consumer as a [`Harness`]: the same handlers, configuration, database and
    /// schema, no Kafka client. For tests of a service's handlers.
    ///
    /// # Errors
    /// [`ConsumerError::Config`] for an unusable pool or tenant routing that does not fit the driver.
    pub async fn harness(self) -> Result<Harness, ConsumerError> {
        let pool = self.pool()?;
        let tx = self.transactions(&pool)?;
        let cancel = CancellationToken::new();
        let retry_topics = self.config.retry_topics();
        let drain_topics = self.drain_topics();
        let with_breaker = self.config.breaker.is_some();
        let shared = Arc::new(self.into_shared(
            tx,
            pool,
            Sink::Recorded(Mutex::default()),
            cancel.clone(),
            retry_topics,
            drain_topics,
        )?);
        if with_breaker {
            shared.breakers.refresh().await;
        }
        if shared.has_calls {
            for _ in 0..call::writers(shared.config.concurrency) {
                tokio::spawn(call::write_marks(shared.clone(), cancel.clone()));
            }
        }
        // Offsets no earlier harness of this schema and group used (dead letters are recorded
        // by offset).
        let base = i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_micros(),
        )
        .unwrap_or(0);
        Ok(Harness {
            shared,
            turn: tokio::sync::Mutex::new(()),
            next_offset: AtomicI64::new(base),
            stop: cancel,
        })
    }
}

impl Delivered {
    /// What the consumer decodes from the record the relay publishes for `msg` (its topic,
    /// key, the four standard headers and any others, the JSON body), at partition 0.
    pub fn from_message(msg: &Message) -> Self {
        let raw = raw_of(msg);
        let origin = super::record::Origin {
            topic: raw.topic.clone(),
            partition: raw.partition,
            offset: raw.offset,
            hop: 0,
        };
        decode(&raw, &origin).expect("a Message always decodes: it carries every required header")
    }
}

fn raw_of(msg: &Message) -> Raw {
    Raw {
        topic: msg.topic.clone(),
        partition: 0,
        offset: 0,
        key: msg.key.as_ref().map(|k| k.as_bytes().to_vec()),
        payload: msg
            .stored_payload()
            .map(|p| serde_json::to_vec(p).expect("a JSON value serializes")),
        headers: msg
            .all_headers()
            .into_iter()
            .map(|(k, v)| (k, Some(v.into_bytes())))
            .collect(),
        timestamp_ms: None,
    }
}

impl Harness {
    /// Runs `d` through the runtime as if read from `d.source_topic` (its own offset; its
    /// key, headers and body as given) and returns how it ended. In-place retries wait their
    /// configured delays.
    pub async fn deliver(&self, d: Delivered) -> Verdict {
        let raw = Raw {
            topic: d.source_topic.clone(),
            partition: d.partition,
            offset: self.next_offset.fetch_add(1, Ordering::Relaxed),
            key: d.key.clone(),
            payload: (!d.tombstone).then(|| d.payload.clone()),
            headers: d.headers.clone(),
            timestamp_ms: None,
        };
        let origin = origin(&raw, &self.shared);
        self.run(raw, origin, Ok(d)).await
    }

    /// Runs a record the runtime wrote — a retry hop from [`Verdict::Retried`] — as the
    /// consumer would read it from that topic: decoded again, its origin from its headers.
    pub async fn redeliver(&self, record: &Written) -> Verdict {
        let raw = Raw {
            topic: record.topic.clone(),
            partition: 0,
            offset: self.next_offset.fetch_add(1, Ordering::Relaxed),
            key: record.key.clone(),
            payload: record.payload.clone(),
            headers: record.headers.clone(),
            timestamp_ms: None,
        };
        let origin = origin(&raw, &self.shared);
        let decoded = decode(&raw, &origin);
        self.run(raw, origin, decoded).await
    }

    /// Every record written so far (retry hops and dead letters), in order.
    pub fn written(&self) -> Vec<Written> {
        match &self.shared.producer {
            Sink::Recorded(w) => w.lock().expect("written lock").clone(),
            Sink::Kafka(_) => Vec::new(),
        }
    }

    /// The counters, as a running consumer keeps them.
    pub fn stats(&self) -> &ConsumerStats {
        &self.shared.stats
    }

    async fn run(
        &self,
        raw: Raw,
        origin: super::record::Origin,
        decoded: Result<Delivered, String>,
    ) -> Verdict {
        let _turn = self.turn.lock().await;
        let before = self.written().len();
        let stats = &self.shared.stats;
        let seen = |c: &std::sync::atomic::AtomicU64| ConsumerStats::get(c);
        let (handled, dups, retries) = (
            seen(&stats.handled),
            seen(&stats.duplicates),
            seen(&stats.in_place_retries),
        );
        let mut env = Envelope {
            raw,
            epoch: 0,
            due: None,
            origin,
            decoded,
            drain: false,
        };
        if !super::schemas::resolve(&mut [&mut env], &self.shared).await {
            return Verdict::Abandoned;
        }
        if let Fate::Abandoned = process(&env, &self.shared).await {
            return Verdict::Abandoned;
        }
        if let Some(w) = self.written().get(before..).and_then(|w| w.last()).cloned() {
            let kind = w.header(crate::wire::X_ERROR_KIND).and_then(kind_of);
            return match kind {
                Some(kind) => Verdict::DeadLettered {
                    kind,
                    error: w
                        .header(crate::wire::X_ERROR)
                        .unwrap_or_default()
                        .to_owned(),
                    attempts: w
                        .header(crate::wire::X_ATTEMPTS)
                        .and_then(|a| a.parse().ok())
                        .unwrap_or(0),
                    record: w,
                },
                None => Verdict::Retried { record: w },
            };
        }
        if seen(&stats.handled) > handled {
            let retried = seen(&stats.in_place_retries) - retries;
            Verdict::Handled {
                attempts: u32::try_from(retried).unwrap_or(u32::MAX).saturating_add(1),
            }
        } else if seen(&stats.duplicates) > dups {
            Verdict::Duplicate
        } else {
            Verdict::Skipped
        }
    }
}

fn kind_of(v: &str) -> Option<DeadLetterKind> {
    [
        DeadLetterKind::TransientExhausted,
        DeadLetterKind::Permanent,
        DeadLetterKind::Decode,
        DeadLetterKind::Panic,
        DeadLetterKind::Unavailable,
    ]
    .into_iter()
    .find(|k| k.as_str() == v)
}

impl Drop for Harness {
    fn drop(&mut self) {
        // Stops the mark writers of call handlers and anything still waiting.
        self.stop.cancel();
    }
}
