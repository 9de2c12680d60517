//! Exactly-once publication (`RelayConfig::exactly_once`, docs/EXACTLY_ONCE.md).
//!
//! The unit of ownership is a **slot** of 8 ordering lanes (`lanes.rs` takes and gives them up
//! whole). Each slot has its own transactional producer, `transactional.id =
//! <prefix>-<schema>-<slot>`, the same whichever relay holds the slot, so taking a slot over
//! fences its previous owner (`init_transactions`) and aborts or completes its open
//! transaction. A slot's batch:
//!
//! ```text
//! claim (FOR UPDATE SKIP LOCKED, the Postgres transaction stays open)
//! begin_transaction → the rows → progress record {ids sent} to <progress_topic>[slot] → commit_transaction
//! mark the ids sent, COMMIT
//! ```
//!
//! **Recovery** before a slot's first batch (a new owner, a restart, or after any ambiguous
//! end of a transaction): `init_transactions`, then read partition `slot` of the progress topic
//! `read_committed` to its end, take this schema's last record there and mark its ids sent.
//! Only the last record matters: a slot has one batch in flight, and its next batch is claimed
//! only after the previous one's marks committed. The record names ids, not "up to id N": ids
//! become visible in commit order, not in id order.
//!
//! **Errors**: a row without a report, or refused by the broker, leaves the transaction
//! abortable: it is aborted and every row stays pending (refused rows are backed off as
//! usual). A commit that fails retriably is retried; one that requires an abort is aborted;
//! anything else — fenced, fatal, a timeout — is *unknown*: the producer is destroyed, the
//! claim rolled back, and the slot recovered from its progress record before it produces
//! again. Nothing is ever produced a second time on a guess.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{info, warn};

use super::floor::ClaimFloor;
use super::lanes::{slot_of, SLOTS};
use super::*;

/// What a recovery, a commit or an abort may take before the slot gives up for this pass.
const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How far back from the end of a progress partition the last record is looked for first.
const PROGRESS_TAIL: i64 = 256;

/// `{reason}`: exactly-once transactions committed, aborted, fenced, and slot recoveries.
pub(crate) mod names {
    /// Kafka transactions committed (one per slot batch).
    pub const COMMITTED: &str = "outbox_relay_transactions_committed_total";
    /// `{reason}`: transactions aborted (`undelivered`, `refused`, `commit_failed`).
    pub const ABORTED: &str = "outbox_relay_transactions_aborted_total";
    /// `{reason}`: transactions whose end is unknown (`fenced` by a new owner, `fatal`,
    /// `ambiguous`: a timeout or a failed abort): the producer is destroyed and the slot
    /// recovered.
    pub const UNKNOWN: &str = "outbox_relay_transactions_unknown_total";
    /// `{outcome}`: slot recoveries (`clean`: nothing to mark; `marked`: the last batch's
    /// rows were committed in Kafka but not yet marked).
    pub const RECOVERIES: &str = "outbox_relay_slot_recoveries_total";
    /// 1 while this relay publishes exactly-once.
    pub const MODE: &str = "outbox_relay_exactly_once";
}

/// Per-slot state: the producer once fenced and recovered, and the slot's claim floor.
pub(crate) struct Slots {
    producers: Vec<tokio::sync::Mutex<Option<RelayProducer>>>,
    pub(crate) floors: Vec<Arc<Mutex<ClaimFloor>>>,
}

impl Slots {
    pub(crate) fn new(long_transaction: Duration) -> Self {
        Self {
            producers: (0..SLOTS).map(|_| tokio::sync::Mutex::new(None)).collect(),
            floors: (0..SLOTS)
                .map(|_| Arc::new(Mutex::new(ClaimFloor::new(long_transaction))))
                .collect(),
        }
    }
}

/// A test hook: `OUTBOX_CRASH_AT=<point>[:<n>]` aborts the process (no cleanup, like
/// `kill -9`) the `n`-th time (default 1st) the relay reaches `point`: `after_produce`,
/// `before_commit`, `during_commit`, `after_commit`. Read once; unset in production.
pub(super) fn crash_point(point: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static AT: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static HITS: AtomicU64 = AtomicU64::new(0);
    let at = AT.get_or_init(|| {
        let v = std::env::var("OUTBOX_CRASH_AT").ok()?;
        let (p, n) = v.split_once(':').unwrap_or((&v, "1"));
        Some((p.to_owned(), n.parse().unwrap_or(1)))
    });
    if let Some((p, n)) = at {
        if p == point && HITS.fetch_add(1, Ordering::SeqCst) + 1 == *n {
            eprintln!("OUTBOX_CRASH_AT={point}: aborting");
            std::process::abort();
        }
    }
}

impl Relay {
    /// One exactly-once pass: every owned slot, concurrently, until its claim comes back
    /// short (one batch in flight per slot).
    pub(crate) async fn run_once_exactly(&self) -> Result<Outcome, RelayError> {
        let _pass = self.pass.lock().await;
        let lanes = {
            let mut l = self.lanes.lock().await;
            l.refresh_if_due().await;
            l.owned()
        };
        let mut by_slot: std::collections::BTreeMap<i32, Vec<i32>> = Default::default();
        for lane in lanes {
            by_slot.entry(slot_of(lane)).or_default().push(lane);
        }
        if by_slot.is_empty() {
            return Ok(Outcome::Empty);
        }
        let passes = by_slot
            .into_iter()
            .map(|(slot, lanes)| self.slot_until_short(slot, lanes));
        let mut total = BatchReport::default();
        let mut error = None;
        for r in futures::future::join_all(passes).await {
            match r {
                Ok(b) => total.add(&b),
                Err(e) => error = Some(e),
            }
        }
        match (total.claimed, error) {
            (0, Some(e)) => Err(e),
            (0, None) => Ok(Outcome::Empty),
            (_, _) => Ok(Outcome::Published(total)),
        }
    }

    async fn slot_until_short(
        &self,
        slot: i32,
        lanes: Vec<i32>,
    ) -> Result<BatchReport, RelayError> {
        let mut total = BatchReport::default();
        loop {
            let b = self.slot_batch(slot, lanes.clone()).await?;
            total.add(&b);
            if b.claimed < self.config.batch_size || b.deferred > 0 || b.sent == 0 {
                return Ok(total);
            }
        }
    }

    /// One batch of one slot in one Kafka transaction.
    async fn slot_batch(&self, slot: i32, lanes: Vec<i32>) -> Result<BatchReport, RelayError> {
        let eo = self
            .config
            .exactly_once
            .as_ref()
            .expect("exactly-once mode");
        let slots = self.slots.as_ref().expect("exactly-once mode");
        let mut held = slots.producers[slot as usize].lock().await;
        if held.is_none() {
            *held = Some(self.fence_and_recover(slot).await?);
        }
        let producer = held.clone().expect("recovered above");
        let floor = slots.floors[slot as usize].clone();
        let claimed = self
            .claim_in(&floor, lanes, &std::collections::HashMap::new(), None)
            .await?;
        if claimed.rows.is_empty() {
            return self.settle(claimed, Vec::new()).await;
        }
        if let Err(e) = producer.begin_transaction() {
            warn!(slot, error = %e, "cannot begin a transaction: recovering the slot");
            *held = None;
            drop(claimed);
            return Err(RelayError::Kafka(e));
        }
        let mut fates = self
            .produce_with(&producer, &claimed, &HashSet::new())
            .await;
        crash_point("after_produce");
        let ids: Vec<i64> = claimed
            .rows
            .iter()
            .zip(&fates)
            .filter(|(_, f)| matches!(f, Fate::Sent))
            .map(|(r, _)| r.id)
            .collect();
        let troubled = fates
            .iter()
            .any(|f| matches!(f, Fate::Deferred(_) | Fate::Refused(..)));
        let progress = if troubled {
            Err("undelivered")
        } else {
            self.send_progress(&producer, &eo.progress_topic, slot, &ids)
                .await
                .map_err(|()| "undelivered")
        };
        let ended = match progress {
            Ok(()) => {
                crash_point("before_commit");
                self.commit(&producer).await
            }
            Err(reason) => {
                let why = if fates.iter().any(|f| matches!(f, Fate::Refused(..))) {
                    "refused"
                } else {
                    reason
                };
                match self.abort(&producer).await {
                    Ok(()) => {
                        metrics::counter!(names::ABORTED, "reason" => why).increment(1);
                        Ended::Aborted
                    }
                    Err(e) => Ended::Unknown(e),
                }
            }
        };
        match ended {
            Ended::Committed => {
                crash_point("after_commit");
                metrics::counter!(names::COMMITTED).increment(1);
                self.settle(claimed, fates).await
            }
            Ended::Aborted => {
                // Nothing of the batch is visible to read_committed readers: what was sent
                // stays pending and goes again in a new transaction.
                for f in &mut fates {
                    if matches!(f, Fate::Sent) {
                        *f = Fate::Deferred("aborted with its transaction".into());
                    }
                }
                self.settle(claimed, fates).await
            }
            Ended::Unknown(e) => {
                metrics::counter!(names::UNKNOWN, "reason" => unknown_reason(&e)).increment(1);
                warn!(slot, error = %e, "the transaction's end is unknown (fenced, fatal or timed out): destroying the producer; the slot is recovered from its progress record before it produces again");
                *held = None;
                // The claim rolls back with its connection; the progress record decides.
                drop(claimed);
                drop(tokio::task::spawn_blocking(move || drop(producer)));
                Err(RelayError::Kafka(e))
            }
        }
    }

    /// The slot's transactional producer: created, fenced in (`init_transactions`), and the
    /// last batch's rows marked sent from the progress record.
    async fn fence_and_recover(&self, slot: i32) -> Result<RelayProducer, RelayError> {
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
            let c = self.pool.get().await?;
            let recover = c.prepare_cached(&self.stmts.recover_sent).await?;
            c.execute(&recover, &[&ids]).await?
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
        metrics::counter!(names::RECOVERIES, "outcome" => outcome).increment(1);
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
        let key = progress_key(self.db.schema.name(), slot);
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

    /// Produces the progress record (last in the transaction) and waits for its report.
    async fn send_progress(
        &self,
        producer: &RelayProducer,
        topic: &str,
        slot: i32,
        ids: &[i64],
    ) -> Result<(), ()> {
        let body = serde_json::json!({ "slot": slot, "ids": ids }).to_string();
        let key = progress_key(self.db.schema.name(), slot);
        let batch = self.reports.open(1);
        let record = BaseRecord::with_opaque_to(topic, batch.opaque(0))
            .partition(slot)
            .key(key.as_bytes())
            .payload(body.as_bytes());
        if producer.send(record).is_err() {
            batch.not_sent();
            return Err(());
        }
        batch.sent_all();
        let _ =
            tokio::time::timeout(self.config.delivery_timeout + REPORT_MARGIN, batch.wait()).await;
        match batch.close().into_iter().next() {
            Some((_, Fate::Sent)) => Ok(()),
            _ => Err(()),
        }
    }

    async fn commit(&self, producer: &RelayProducer) -> Ended {
        for _ in 0..3 {
            let p = producer.clone();
            let during =
                std::env::var("OUTBOX_CRASH_AT").is_ok_and(|v| v.starts_with("during_commit"));
            let done = tokio::task::spawn_blocking(move || {
                if during {
                    // The EndTxn request is on its way when the process dies.
                    std::thread::spawn(|| {
                        std::thread::sleep(Duration::from_millis(1));
                        crash_point("during_commit");
                    });
                }
                p.commit_transaction(Timeout::After(TXN_CALL_TIMEOUT))
            })
            .await;
            match done {
                Ok(Ok(())) => return Ended::Committed,
                Ok(Err(KafkaError::Transaction(e))) if e.is_retriable() => continue,
                Ok(Err(KafkaError::Transaction(e))) if e.txn_requires_abort() => {
                    return match self.abort(producer).await {
                        Ok(()) => {
                            metrics::counter!(names::ABORTED, "reason" => "commit_failed")
                                .increment(1);
                            Ended::Aborted
                        }
                        Err(e) => Ended::Unknown(e),
                    };
                }
                Ok(Err(e)) => return Ended::Unknown(e),
                Err(_) => return Ended::Unknown(KafkaError::Canceled),
            }
        }
        Ended::Unknown(KafkaError::Canceled)
    }

    async fn abort(&self, producer: &RelayProducer) -> Result<(), KafkaError> {
        let p = producer.clone();
        tokio::task::spawn_blocking(move || p.abort_transaction(Timeout::After(TXN_CALL_TIMEOUT)))
            .await
            .map_err(|_| KafkaError::Canceled)?
    }
}

/// How a slot's transaction ended.
enum Ended {
    Committed,
    Aborted,
    Unknown(KafkaError),
}

/// The `reason` label of an unknown end.
fn unknown_reason(e: &KafkaError) -> &'static str {
    use rdkafka::types::RDKafkaErrorCode as C;
    match e.rdkafka_error_code() {
        Some(C::Fenced | C::InvalidProducerEpoch | C::ProducerFenced) => "fenced",
        _ if matches!(e, KafkaError::Transaction(t) if t.is_fatal()) => "fatal",
        _ => "ambiguous",
    }
}

fn progress_key(schema: &str, slot: i32) -> String {
    format!("{schema}/{slot}")
}

/// The progress reader's callbacks: reaching the end of the partition is how it knows it is
/// done, not an error worth a log line.
struct EofQuiet;

impl rdkafka::ClientContext for EofQuiet {
    fn error(&self, error: KafkaError, reason: &str) {
        if !matches!(error, KafkaError::PartitionEOF(_)) {
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
                let v: serde_json::Value =
                    serde_json::from_slice(m.payload().unwrap_or_default()).unwrap_or_default();
                last = Some(
                    v["ids"]
                        .as_array()
                        .map(|a| a.iter().filter_map(serde_json::Value::as_i64).collect())
                        .unwrap_or_default(),
                );
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
