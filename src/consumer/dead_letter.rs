//! Dead letters on the way out: the headers of a retry or dead-letter record rebuilt from the
//! original (names in [`crate::wire`]), and the consumer's record of what it dead-lettered.
//! Key and body are always forwarded byte-identical.

use rdkafka::message::{Header, OwnedHeaders};

pub(crate) use crate::wire::cut;
pub(crate) use crate::wire::{
    DeadLetterKind, SERVICE_HEADERS, X_ATTEMPTS, X_CONSUMER_GROUP, X_DLQ_RETRIES, X_ERROR,
    X_ERROR_KIND, X_FAILED_AT, X_FIRST_FAILED_AT, X_ORIGINAL_OFFSET, X_ORIGINAL_PARTITION,
    X_ORIGINAL_TOPIC, X_RETRY_ATTEMPT,
};

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
///
/// Writing to Kafka and to Postgres cannot be one transaction, so the record is kept in two
/// steps around the write: an *intent* (the dead-letter partition and its end offset before
/// the write), then *written* once the broker acknowledged. A crash between the two leaves an
/// intent; the redelivered record is then looked for in that partition from that offset (the
/// `x-original-*` and `x-consumer-group` headers name it). Found: not written again. Not found
/// (the crash came before the append): written. When Postgres or Kafka cannot tell, the letter
/// is written: at worst a duplicate, never a lost dead letter.
pub(super) struct DeadLetterLog {
    check: String,
    intend: String,
    mark: String,
    group: String,
    /// For reading a dead-letter partition back (no group, nothing committed).
    reader: rdkafka::ClientConfig,
    /// Partition count of each dead-letter topic, looked up once.
    partitions: std::sync::Mutex<std::collections::HashMap<String, i32>>,
}

/// What the log knows of a record.
pub(super) enum Logged {
    /// Never dead-lettered by this group.
    No,
    /// Dead-lettered and acknowledged.
    Written,
    /// A write was intended: to `partition`, which ended at `from` before it.
    Intended { partition: i32, from: i64 },
}

/// How long reading a dead-letter partition back may take before the letter is written anyway.
const CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl DeadLetterLog {
    pub(super) fn new(
        schema: &crate::schema::Schema,
        group: &str,
        kafka: &crate::config::KafkaConfig,
    ) -> Self {
        let mut reader = kafka.client_config();
        reader
            .set("group.id", format!("{group}.dead-letter-check"))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false");
        Self {
            check: crate::sql::render(crate::sql::marks::DEAD_LETTERED_CHECK, schema),
            intend: crate::sql::render(crate::sql::marks::DEAD_LETTERED_INTEND, schema),
            mark: crate::sql::render(crate::sql::marks::DEAD_LETTERED_WRITTEN, schema),
            group: group.to_owned(),
            reader,
            partitions: std::sync::Mutex::default(),
        }
    }

    /// What the log says of this record ([`Logged::No`] when Postgres cannot tell: at worst a
    /// duplicate dead letter, never a lost one).
    pub(super) async fn logged(
        &self,
        pool: &deadpool_postgres::Pool,
        raw: &super::record::Raw,
    ) -> Logged {
        let Ok(c) = pool.get().await else {
            return Logged::No;
        };
        match c
            .query_opt(
                &self.check,
                &[&self.group, &raw.topic, &raw.partition, &raw.offset],
            )
            .await
        {
            Ok(Some(row)) => match (row.get(0), row.get(1), row.get(2)) {
                (true, _, _) => Logged::Written,
                (false, Some(partition), Some(from)) => Logged::Intended { partition, from },
                _ => Logged::No,
            },
            _ => Logged::No,
        }
    }

    /// Records the intent to write this record's dead letter to `partition`, which ends at
    /// `from`. Returns false when Postgres is unreachable (the write then goes ahead unrecorded).
    pub(super) async fn intend(
        &self,
        pool: &deadpool_postgres::Pool,
        raw: &super::record::Raw,
        partition: i32,
        from: i64,
    ) -> bool {
        let Ok(c) = pool.get().await else {
            return false;
        };
        c.execute(
            &self.intend,
            &[
                &self.group,
                &raw.topic,
                &raw.partition,
                &raw.offset,
                &partition,
                &from,
            ],
        )
        .await
        .is_ok()
    }

    /// The dead-letter partition for a record (same original partition, same dead-letter
    /// partition: per-key order in the DLQ as in the topic) and that partition's end offset now.
    /// `None` when the broker cannot tell.
    pub(super) async fn target<C: rdkafka::ClientContext + 'static>(
        &self,
        producer: &rdkafka::producer::FutureProducer<C>,
        dlq_topic: &str,
        original_partition: i32,
    ) -> Option<(i32, i64)> {
        use rdkafka::producer::Producer as _;
        let known = self
            .partitions
            .lock()
            .expect("partitions lock")
            .get(dlq_topic)
            .copied();
        let client = producer.clone();
        let topic = dlq_topic.to_owned();
        let (count, target) = tokio::task::spawn_blocking(move || {
            let count = match known {
                Some(n) => n,
                None => {
                    let md = client
                        .client()
                        .fetch_metadata(Some(&topic), CHECK_TIMEOUT)
                        .ok()?;
                    let n = md.topics().first()?.partitions().len();
                    i32::try_from(n).ok().filter(|n| *n > 0)?
                }
            };
            let partition = original_partition.rem_euclid(count);
            let (_, high) = client
                .client()
                .fetch_watermarks(&topic, partition, CHECK_TIMEOUT)
                .ok()?;
            Some((count, (partition, high)))
        })
        .await
        .ok()
        .flatten()?;
        if known.is_none() {
            self.partitions
                .lock()
                .expect("partitions lock")
                .insert(dlq_topic.to_owned(), count);
        }
        Some(target)
    }

    /// Whether `partition` of `dlq_topic` holds, at or after `from`, this group's dead letter
    /// of `origin`. `None` when Kafka cannot tell in time.
    pub(super) async fn written_since(
        &self,
        dlq_topic: &str,
        partition: i32,
        from: i64,
        origin: &super::record::Origin,
    ) -> Option<bool> {
        use rdkafka::consumer::{BaseConsumer, Consumer as _};
        use rdkafka::message::{Headers as _, Message as _};
        let reader = self.reader.clone();
        let (topic, group) = (dlq_topic.to_owned(), self.group.clone());
        let want = [
            (X_ORIGINAL_TOPIC, origin.topic.clone()),
            (X_ORIGINAL_PARTITION, origin.partition.to_string()),
            (X_ORIGINAL_OFFSET, origin.offset.to_string()),
            (X_CONSUMER_GROUP, group),
        ];
        tokio::task::spawn_blocking(move || {
            let c: BaseConsumer = reader.create().ok()?;
            let (_, high) = c.fetch_watermarks(&topic, partition, CHECK_TIMEOUT).ok()?;
            if high <= from {
                return Some(false);
            }
            let mut tpl = rdkafka::TopicPartitionList::new();
            tpl.add_partition_offset(&topic, partition, rdkafka::Offset::Offset(from))
                .ok()?;
            c.assign(&tpl).ok()?;
            let deadline = std::time::Instant::now() + CHECK_TIMEOUT;
            while std::time::Instant::now() < deadline {
                let Some(m) = c.poll(std::time::Duration::from_millis(200)) else {
                    continue;
                };
                let m = m.ok()?;
                let matches = m.headers().is_some_and(|h| {
                    want.iter().all(|(k, v)| {
                        h.iter()
                            .any(|x| x.key == *k && x.value == Some(v.as_bytes()))
                    })
                });
                if matches {
                    return Some(true);
                }
                if m.offset() + 1 >= high {
                    return Some(false);
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
    }

    /// Records an acknowledged dead letter, retrying through a Postgres outage (until shutdown).
    pub(super) async fn record(
        &self,
        pool: &deadpool_postgres::Pool,
        raw: &super::record::Raw,
        cancel: &tokio_util::sync::CancellationToken,
    ) {
        crate::backoff::until_ok(
            cancel,
            "cannot record a dead letter as written (a crash meanwhile may duplicate it)",
            || async {
                let c = pool.get().await.map_err(|e| e.to_string())?;
                c.execute(
                    &self.mark,
                    &[&self.group, &raw.topic, &raw.partition, &raw.offset],
                )
                .await
                .map_err(|e| e.to_string())
            },
        )
        .await;
    }
}
