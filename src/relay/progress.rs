//! The exactly-once relay's progress records and recovery (`exactly_once.rs`): a slot fenced in
//! (`init_transactions`), its partition of the progress topic read `read_committed` to the
//! end, and the rows of its last committed transaction marked sent if their marks were lost.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::producer::Producer;
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{info, warn};

use super::lanes::SLOTS;
use super::*;

impl Relay {
    /// The slot's transactional producer: created, fenced in (`init_transactions`), and the
    /// last batch's rows marked sent from the progress record.
    pub(super) async fn fence_and_recover(&self, slot: i32) -> Result<RelayProducer, RelayError> {
        let eo = self
            .config
            .exactly_once
            .as_ref()
            .expect("exactly-once mode");
        let mut kafka = self.kafka.clone();
        kafka.properties.insert(
            "transactional.id".into(),
            format!(
                "{}-{}-{slot}",
                eo.transactional_id_prefix,
                self.db.schema.name()
            ),
        );
        kafka.properties.insert(
            "transaction.timeout.ms".into(),
            eo.transaction_timeout.as_millis().to_string(),
        );
        self.progress_ready
            .get_or_try_init(|| self.ensure_progress_topic(&eo.progress_topic))
            .await?;
        let producer = producer_for(
            &kafka,
            self.config.delivery_timeout,
            &self.outages,
            &self.reports,
        )?;
        let p = producer.clone();
        tokio::task::spawn_blocking(move || p.init_transactions(Timeout::After(TXN_CALL_TIMEOUT)))
            .await
            .map_err(|e| {
                RelayError::Config(ConfigError::Value {
                    name: "exactly-once",
                    reason: format!("init_transactions task: {e}"),
                })
            })??;
        let ids = self.read_progress(&eo.progress_topic, slot).await?;
        let marked = if ids.is_empty() {
            0
        } else {
            let mut c = self.pool.get().await?;
            let ring = self.on_ring(&c).await?;
            // A zombie still holding these rows locked (its session alive, its process
            // frozen) makes this wait: bounded, and retried at the next pass, so the slot
            // never produces before its last batch is marked.
            let tx = c.transaction().await?;
            tx.batch_execute(crate::sql::RECOVER_LOCK_TIMEOUT).await?;
            let n = if ring {
                // Ring storage: the lanes' cursors moved past the ids, the retry rows among
                // them removed (`sql::ring::RECOVER`); the writers open now are listed as
                // passed in the lanes it moves (one may hold rows the moves step over).
                let writers: Vec<String> =
                    tx.query_one(&self.stmts.ring_writers, &[]).await?.get(0);
                let recover = tx.prepare_cached(&self.stmts.ring_recover).await?;
                let r = tx.query_one(&recover, &[&ids, &writers]).await?;
                let (gone, moved, copied): (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
                if copied > 0 {
                    info!(
                        slot,
                        copied, "slot recovery copied parked rows into the retry table"
                    );
                }
                u64::try_from(gone + moved).unwrap_or_default()
            } else {
                let recover = tx.prepare_cached(&self.stmts.recover_sent).await?;
                tx.execute(&recover, &[&ids]).await?
            };
            tx.commit().await?;
            n
        };
        let outcome = if marked > 0 {
            info!(
                slot,
                rows = ids.len(),
                marked,
                "slot recovered: its last transaction was committed in Kafka but not marked; its rows are marked sent now"
            );
            "marked"
        } else {
            "clean"
        };
        metrics::counter!(crate::metrics::RELAY_SLOT_RECOVERIES, "outcome" => outcome).increment(1);
        Ok(producer)
    }

    /// Finds the progress topic with a partition per slot, or creates it: compacted (only
    /// each slot's last record is ever read), replicated like the cluster allows (3 at most,
    /// `min.insync.replicas` one less).
    async fn ensure_progress_topic(&self, topic: &str) -> Result<(), RelayError> {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        use rdkafka::client::DefaultClientContext;
        let admin: AdminClient<DefaultClientContext> = self.kafka.client_config().create()?;
        let name = topic.to_owned();
        let (partitions, brokers) = {
            let md = admin
                .inner()
                .fetch_metadata(Some(&name), Timeout::After(TXN_CALL_TIMEOUT))?;
            let n = md
                .topics()
                .iter()
                .find(|t| t.name() == name && t.error().is_none())
                .map_or(0, |t| t.partitions().len());
            (n, md.brokers().len())
        };
        if partitions >= SLOTS as usize {
            return Ok(());
        }
        if partitions > 0 {
            return Err(RelayError::Config(ConfigError::Value {
                name: "progress topic",
                reason: format!(
                    "{topic} has {partitions} partitions; exactly-once needs {SLOTS} (one per slot)"
                ),
            }));
        }
        let rf = brokers.clamp(1, 3) as i32;
        let isr = (rf - 1).max(1).to_string();
        let new = NewTopic::new(topic, SLOTS, TopicReplication::Fixed(rf))
            .set("cleanup.policy", "compact")
            .set("min.insync.replicas", &isr);
        for r in admin.create_topics([&new], &AdminOptions::new()).await? {
            match r {
                Ok(_) => {
                    info!(%topic, partitions = SLOTS, replication = rf, "created the exactly-once progress topic")
                }
                Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((t, code)) => {
                    return Err(RelayError::Config(ConfigError::Value {
                        name: "progress topic",
                        reason: format!("cannot create {t}: {code}"),
                    }))
                }
            }
        }
        Ok(())
    }

    /// The ids of this schema's last progress record in partition `slot`, read
    /// `read_committed` to the partition's end (empty when there is none).
    async fn read_progress(&self, topic: &str, slot: i32) -> Result<Vec<i64>, RelayError> {
        let mut cc = self.kafka.client_config();
        cc.set(
            "group.id",
            format!("outbox-progress-reader-{}", fastrand::u64(..)),
        )
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed");
        let consumer: BaseConsumer<EofQuiet> = cc.create_with_context(EofQuiet)?;
        let key = ProgressRecord::key(self.db.schema.name(), slot);
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || -> Result<Vec<i64>, RelayError> {
            let (low, high) =
                consumer.fetch_watermarks(&topic, slot, Timeout::After(TXN_CALL_TIMEOUT))?;
            let mut from = (high - PROGRESS_TAIL).max(low);
            loop {
                let found = read_tail(&consumer, &topic, slot, from, &key)?;
                if found.is_some() || from == low {
                    return Ok(found.unwrap_or_default());
                }
                from = low;
            }
        })
        .await
        .map_err(|e| {
            RelayError::Config(ConfigError::Value {
                name: "exactly-once",
                reason: format!("progress reader task: {e}"),
            })
        })?
    }
}

/// What a recovery, a commit or an abort may take before the slot gives up for this pass.
pub(super) const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How far back from the end of a progress partition the last record is looked for first.
pub(super) const PROGRESS_TAIL: i64 = 256;

/// A slot's progress record, written in each of its transactions: the ids the transaction
/// published (and the previous batch's, while their marks are unconfirmed). The record's
/// format lives here alone: the sender encodes it, the recovery decodes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ProgressRecord {
    /// The slot, which is also the record's partition.
    pub(super) slot: i32,
    /// The outbox ids committed with it.
    pub(super) ids: Vec<i64>,
}

impl ProgressRecord {
    /// The record's key: the schema and the slot (schemas share a progress topic).
    pub(super) fn key(schema: &str, slot: i32) -> String {
        format!("{schema}/{slot}")
    }

    /// The record's value.
    pub(super) fn encode(&self) -> String {
        serde_json::json!({ "slot": self.slot, "ids": self.ids }).to_string()
    }

    /// The ids of a record's value; none for a value that is not one (a record written by
    /// hand, or damaged, names nothing to mark).
    pub(super) fn decode_ids(payload: &[u8]) -> Vec<i64> {
        let v: serde_json::Value = serde_json::from_slice(payload).unwrap_or_default();
        v["ids"]
            .as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_i64).collect())
            .unwrap_or_default()
    }
}

/// The progress reader's callbacks: reaching the end of the partition is how it knows it is
/// done, not an error worth a log line.
struct EofQuiet;

impl rdkafka::ClientContext for EofQuiet {
    fn error(&self, error: KafkaError, reason: &str) {
        // The end of the partition is how a read finishes, not a fault: librdkafka reports
        // it as a partition event and, again, as a global error event.
        let eof = matches!(error, KafkaError::PartitionEOF(_))
            || error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::PartitionEOF);
        if !eof {
            warn!(error = %error, reason, "progress reader");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for EofQuiet {}

/// Reads partition `slot` from `from` to its end (`read_committed`); the ids of the last
/// record keyed `key`, if any.
fn read_tail(
    consumer: &BaseConsumer<EofQuiet>,
    topic: &str,
    slot: i32,
    from: i64,
    key: &str,
) -> Result<Option<Vec<i64>>, RelayError> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, slot, Offset::Offset(from))?;
    consumer.assign(&tpl)?;
    let deadline = std::time::Instant::now() + TXN_CALL_TIMEOUT;
    let mut last = None;
    while std::time::Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) if m.key() == Some(key.as_bytes()) => {
                last = Some(ProgressRecord::decode_ids(m.payload().unwrap_or_default()));
            }
            // Another schema's record in the shared progress partition.
            Some(Ok(_)) => {}
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(last),
            Some(Err(e)) => return Err(RelayError::Kafka(e)),
            None => {}
        }
    }
    Err(RelayError::Kafka(KafkaError::Canceled))
}

#[cfg(test)]
mod tests {
    use super::ProgressRecord;

    #[test]
    fn a_progress_record_decodes_to_the_ids_it_was_encoded_with() {
        let r = ProgressRecord {
            slot: 3,
            ids: vec![7, 9_000_000_000_001, 12],
        };
        assert_eq!(ProgressRecord::decode_ids(r.encode().as_bytes()), r.ids);
        assert_eq!(ProgressRecord::key("billing", 3), "billing/3");
        // Not a record: names nothing to mark.
        for junk in [&b""[..], b"{", b"[1,2]", b"{\"ids\":\"1,2\"}"] {
            assert!(ProgressRecord::decode_ids(junk).is_empty());
        }
    }
}
