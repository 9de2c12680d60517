//! Exactly-once publication (`RelayConfig::exactly_once`, docs/EXACTLY_ONCE.md).
//!
//! The unit of ownership is a **slot** of 16 ordering lanes, [`SLOTS`] of them (`lanes.rs`
//! takes and gives them up whole). Each slot has its own transactional producer,
//! `transactional.id = <prefix>-<schema>-<slot>`, the same whichever relay holds the slot,
//! so taking a slot over fences its previous owner (`init_transactions`) and aborts or
//! completes its open transaction. A slot's batch:
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
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::util::Timeout;
use tracing::warn;

use std::collections::HashMap;

use super::lanes::{slot_of, SLOTS};
use super::progress::{ProgressRecord, TXN_CALL_TIMEOUT};
use super::*;

/// How long a commit waits for librdkafka to count no message in flight (see `commit`).
const FLUSH_WAIT: Duration = Duration::from_millis(50);
/// The most rows one exactly-once claim takes. A slot's progress record names its batch's ids
/// and the previous batch's (while their marks are unconfirmed): with every row in one slot
/// and 13-digit ids, 2 × 32,000 ids make ~0.9 MB, within the producer's 1 MB
/// `message.max.bytes`. (A record that does not fit is refused, its transaction aborted, and
/// its rows go again as the first batch of the next pass, with no ids before them.)
pub(super) const MAX_CLAIM: usize = 32_000;
const _: () = assert!(MAX_CLAIM <= MAX_BATCH_SIZE);

/// Per-slot state: the producer once fenced in and recovered (`None`: it must be, before the
/// slot produces).
pub(crate) struct Slots {
    producers: Vec<tokio::sync::Mutex<Option<RelayProducer>>>,
}

impl Slots {
    pub(crate) fn new() -> Self {
        Self {
            producers: (0..SLOTS).map(|_| tokio::sync::Mutex::new(None)).collect(),
        }
    }
}

use crate::crash::at as crash_at;
pub(super) use crate::crash::point as crash_point;

impl Relay {
    /// One exactly-once pass, repeated while its claim comes back full: every owned slot fenced
    /// in and recovered first, then one claim over their lanes (one walk of the pending
    /// index), each slot's rows in that slot's own Kafka transaction (the slots side by side),
    /// and one settle marking the rows of the transactions that committed.
    pub(crate) async fn run_once_exactly(&self) -> Result<Outcome, RelayError> {
        let _pass = self.pass.lock().await;
        let mut total: Option<BatchReport> = None;
        loop {
            let (report, limit) = match self.exactly_pass().await {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) if total.is_none() => return Err(e),
                Err(e) => {
                    debug!(error = %e, "exactly-once pass failed after earlier ones published");
                    break;
                }
            };
            total.get_or_insert_with(BatchReport::default).add(&report);
            if report.claimed < limit || report.deferred > 0 || report.sent == 0 {
                break;
            }
        }
        Ok(match total {
            Some(t) if t.claimed > 0 => Outcome::Published(t),
            _ => Outcome::Empty,
        })
    }

    /// One claim and its transactions; `None` when no slot is owned. Returns the report and
    /// the claim's limit.
    async fn exactly_pass(&self) -> Result<Option<(BatchReport, usize)>, RelayError> {
        let lanes = {
            let mut l = self.lanes.lock().await;
            l.refresh_if_due().await;
            l.owned()
        };
        let slots = self.slots.as_ref().expect("exactly-once mode");
        let owned: std::collections::BTreeSet<i32> = lanes.iter().map(|l| slot_of(*l)).collect();
        let mut held = Vec::new();
        for (slot, producer) in slots.producers.iter().enumerate() {
            let mut p = producer.lock().await;
            if owned.contains(&(slot as i32)) {
                held.push((slot as i32, p));
            } else if let Some(old) = p.take() {
                // Given up (rebalanced away, or its lock session lost): another owner may
                // produce to it meanwhile, so if it comes back it is fenced in again.
                drop(tokio::task::spawn_blocking(move || drop(old)));
            }
        }
        if held.is_empty() {
            return Ok(None);
        }
        // Fenced in and recovered before anything is claimed: recovery marks rows the claim
        // would otherwise take (and lock) and send again.
        let recoveries = held
            .iter_mut()
            .filter(|(_, p)| p.is_none())
            .map(|(slot, p)| async move {
                match self.fence_and_recover(*slot).await {
                    Ok(producer) => {
                        **p = Some(producer);
                        None
                    }
                    Err(e) => Some(e),
                }
            });
        let mut failed = None;
        for e in futures::future::join_all(recoveries)
            .await
            .into_iter()
            .flatten()
        {
            warn!(error = %e, "a slot could not be fenced in and recovered; it waits for the next pass");
            self.health.condition(
                "exactly_once",
                Err(format!(
                    "a slot could not be fenced in and recovered: {}",
                    self.kafka.redact(&e.to_string())
                )),
            );
            failed = Some(e);
        }
        let ready: HashMap<i32, RelayProducer> = held
            .iter()
            .filter_map(|(slot, p)| p.as_ref().map(|p| (*slot, p.clone())))
            .collect();
        if ready.is_empty() {
            return Err(failed.expect("no slot ready means one failed"));
        }
        let lanes: Vec<i32> = lanes
            .into_iter()
            .filter(|l| ready.contains_key(&slot_of(*l)))
            .collect();
        let limit = (self.config.batch_size * ready.len()).min(MAX_CLAIM);
        let result = self.exactly_pipeline(&ready, lanes, limit).await;
        // A slot whose transaction ended unknown, or whose committed rows may be unmarked
        // (a Postgres failure), is fenced in and recovered before it produces again.
        let (report, reset) = match result {
            Ok((report, reset)) => (Ok(report), reset),
            Err((e, reset)) => (Err(e), reset),
        };
        for (slot, p) in &mut held {
            if reset.contains(slot) {
                if let Some(old) = p.take() {
                    drop(tokio::task::spawn_blocking(move || drop(old)));
                }
            }
        }
        report.map(|r| Some((r, limit)))
    }

    /// Claims and publishes batches two deep: while one batch's slot transactions run, the
    /// batch before it is marked and the batch after it claimed (as the at-least-once pipeline
    /// overlaps Postgres and Kafka). What keeps it exactly-once: a slot's progress record names
    /// its batch's ids **and** those of its previous batch while that one's marks are not yet
    /// confirmed, so the last record always covers every published, possibly unmarked row.
    /// Per-key order: a batch produces after the one before has every fate, and holds back the
    /// keys whose row in it did not reach Kafka; batches settle in claim order.
    ///
    /// Returns the slots to fence in again (their transaction ended unknown, or their rows may
    /// be unmarked after a Postgres failure).
    async fn exactly_pipeline(
        &self,
        ready: &HashMap<i32, RelayProducer>,
        lanes: Vec<i32>,
        limit: usize,
    ) -> Result<(BatchReport, HashSet<i32>), (RelayError, HashSet<i32>)> {
        let eo = self
            .config
            .exactly_once
            .as_ref()
            .expect("exactly-once mode");
        let mut reset: HashSet<i32> = HashSet::new();
        let mut total = BatchReport::default();
        // A backlog: each full claim lets the next take twice as many rows, up to MAX_CLAIM.
        // Every claim is a transaction per slot, and a transaction costs the broker the same
        // whatever its size (AddPartitionsToTxn, EndTxn, a marker per partition, the
        // transaction log's writes); the first claim stays at `limit`, so a trickle's
        // transactions stay as small (and as quick to read committed) as before.
        let grow = |l: usize| (l * 2).min(MAX_CLAIM);
        let mut current = match self
            .claim_in(limit, lanes.clone(), &HashMap::new(), None)
            .await
        {
            Ok(c) => c,
            Err(e) => return Err((e, reset)),
        };
        // The batch published and not yet marked: its rows, fates, and ids sent per slot.
        let mut prev: Option<InFlight> = None;
        loop {
            let full = current.rows.len() >= current.limit && !current.rows.is_empty();
            // Keys whose row in the batch before did not reach Kafka: held back here.
            let mut blocked: HashSet<String> = HashSet::new();
            // Keys with rows in batches in flight (and their highest id): the next claim's
            // per-key check starts after them (their order is this pipeline's to keep).
            let mut after: HashMap<String, i64> = HashMap::new();
            let mut unconfirmed: HashMap<i32, Vec<i64>> = HashMap::new();
            if let Some((c, fates, sent)) = &prev {
                // Rows that did not reach Kafka, and on ring storage the keys whose rows were
                // parked behind the retry table: their later rows wait.
                blocked.extend(c.unsent_keys(fates));
                for r in &c.rows {
                    if let Some(k) = r.key() {
                        let e = after.entry(k.to_owned()).or_insert(r.id);
                        *e = (*e).max(r.id);
                    }
                }
                unconfirmed = sent.clone();
            }
            for r in &current.rows {
                if let Some(k) = r.key() {
                    let e = after.entry(k.to_owned()).or_insert(r.id);
                    *e = (*e).max(r.id);
                }
            }
            let out: HashSet<i32> = reset.clone();
            // A full batch: the next claim starts just past it instead of stepping over its
            // locked rows one by one (the same rule as the at-least-once pipeline, `Ahead`).
            let ahead = current.ahead(current.limit);
            let next_limit = grow(current.limit);
            let (published, settled, next) = tokio::join!(
                self.publish_batch(
                    &current,
                    ready,
                    &out,
                    &blocked,
                    &unconfirmed,
                    &eo.progress_topic
                ),
                async {
                    match prev.take() {
                        Some((c, fates, _)) => Some(self.settle(c, fates).await),
                        None => None,
                    }
                },
                async {
                    if full {
                        Some(
                            self.claim_in(next_limit, lanes.clone(), &after, ahead)
                                .await,
                        )
                    } else {
                        None
                    }
                }
            );
            let (fates, sent, unknown) = published;
            reset.extend(unknown);
            match settled {
                Some(Ok(r)) => total.add(&r),
                Some(Err(e)) => {
                    // The batch before may be unmarked; this one's records name its rows too.
                    reset.extend(unconfirmed.keys());
                    reset.extend(sent.keys());
                    return Err((e, reset));
                }
                None => {}
            }
            let deferred = fates.iter().any(|f| matches!(f, Fate::Deferred(_)));
            match next {
                Some(Ok(c)) if !deferred => {
                    prev = Some((current, fates, sent));
                    current = c;
                }
                next => {
                    // The last batch of the pass (a short claim, a failure, or Kafka in
                    // trouble): mark it, and let go of a claim made meanwhile.
                    drop(next);
                    return match self.settle(current, fates).await {
                        Ok(r) => {
                            total.add(&r);
                            Ok((total, reset))
                        }
                        Err(e) => {
                            reset.extend(sent.keys());
                            Err((e, reset))
                        }
                    };
                }
            }
        }
    }

    /// Every slot's rows of `claimed` in that slot's own transaction, side by side. Slots in
    /// `out` (their producer is gone) send nothing. Returns the fates in claim order, the ids
    /// sent (committed) per slot, and the slots whose transaction ended unknown.
    async fn publish_batch(
        &self,
        claimed: &Claimed,
        ready: &HashMap<i32, RelayProducer>,
        out: &HashSet<i32>,
        blocked: &HashSet<String>,
        unconfirmed: &HashMap<i32, Vec<i64>>,
        progress_topic: &str,
    ) -> (Vec<Fate>, HashMap<i32, Vec<i64>>, Vec<i32>) {
        let mut by_slot: HashMap<i32, Vec<usize>> = HashMap::new();
        for (i, row) in claimed.rows.iter().enumerate() {
            by_slot.entry(slot_of(row.lane())).or_default().push(i);
        }
        let txns = by_slot.iter().map(|(slot, idx)| {
            let rows: Vec<&Row> = idx.iter().map(|i| &claimed.rows[*i]).collect();
            let earlier = unconfirmed.get(slot).map_or(&[][..], Vec::as_slice);
            async move {
                let Some(producer) = ready.get(slot).filter(|_| !out.contains(slot)) else {
                    let fates = rows
                        .iter()
                        .map(|_| Fate::Deferred("its slot is being recovered".into()))
                        .collect();
                    return (*slot, fates, Ended::Aborted);
                };
                let (fates, ended) = self
                    .slot_transaction(
                        *slot,
                        producer,
                        progress_topic,
                        SlotRows {
                            rows,
                            waiting: &claimed.waiting,
                            blocked,
                            earlier,
                        },
                    )
                    .await;
                (*slot, fates, ended)
            }
        });
        let mut fates: Vec<Option<Fate>> = (0..claimed.rows.len()).map(|_| None).collect();
        let mut sent: HashMap<i32, Vec<i64>> = HashMap::new();
        let mut unknown = Vec::new();
        let mut committed = false;
        let mut why_unknown = None;
        for (slot, slot_fates, ended) in futures::future::join_all(txns).await {
            match &ended {
                Ended::Unknown(e) => {
                    why_unknown = Some(format!("slot {slot}: {}", unknown_reason(e)));
                    metrics::counter!(crate::metrics::RELAY_TXN_UNKNOWN, "reason" => unknown_reason(e)).increment(1);
                    warn!(slot, error = %e, "the transaction's end is unknown (fenced, fatal or timed out): destroying the producer; the slot is recovered from its progress record before it produces again");
                    unknown.push(slot);
                }
                Ended::Committed => {
                    committed = true;
                    let ids = by_slot[&slot]
                        .iter()
                        .zip(&slot_fates)
                        .filter(|(_, f)| matches!(f, Fate::Sent))
                        .map(|(i, _)| claimed.rows[*i].id)
                        .collect();
                    sent.insert(slot, ids);
                }
                Ended::Aborted => {}
            }
            for (i, fate) in by_slot[&slot].iter().zip(slot_fates) {
                fates[*i] = Some(fate);
            }
        }
        // Readiness: a slot whose transaction ended unknown (fenced by another producer with
        // its transactional id, fatal, timed out) is not ready until a transaction commits.
        match why_unknown {
            Some(why) => self.health.condition(
                "exactly_once",
                Err(format!(
                    "{why}: the transaction's end is unknown (e.g. fenced by another producer with the same transactional id); the slot is being recovered"
                )),
            ),
            None if committed => self.health.condition("exactly_once", Ok(())),
            None => {}
        }
        let fates = fates
            .into_iter()
            .map(|f| f.expect("every claimed row belongs to a slot"))
            .collect();
        (fates, sent, unknown)
    }

    /// One slot's rows in one Kafka transaction, the progress record last. The fates (a
    /// row is `Sent` only if the transaction committed) and how the transaction ended.
    async fn slot_transaction(
        &self,
        slot: i32,
        producer: &RelayProducer,
        progress_topic: &str,
        batch: SlotRows<'_>,
    ) -> (Vec<Fate>, Ended) {
        let SlotRows {
            rows,
            waiting,
            blocked,
            earlier,
        } = batch;
        let rows = rows.as_slice();
        let span = crate::otel::transaction(slot);
        if let Err(e) = producer.begin_transaction() {
            span.failed("begin", &e.to_string());
            let fates = rows
                .iter()
                .map(|_| Fate::Deferred("the transaction could not begin".into()))
                .collect();
            return (fates, Ended::Unknown(e));
        }
        // The rows, then the progress record naming them (and the slot's previous batch while
        // its marks are unconfirmed), all handed over before any report is awaited.
        let key = ProgressRecord::key(self.db.schema.name(), slot);
        let (mut fates, progress) = self
            .produce_rows(
                producer,
                rows,
                waiting,
                blocked,
                Some((progress_topic, slot, &key, earlier)),
                Some(&span),
            )
            .await;
        crash_point("after_produce");
        let refused = fates.iter().any(|f| matches!(f, Fate::Refused(..)));
        let undelivered = fates.iter().any(|f| matches!(f, Fate::Deferred(_)))
            || !matches!(progress, Some(Fate::Sent));
        let ended = if refused {
            // A refused row left the transaction abortable (and is not in the record).
            self.abort_as(producer, "refused").await
        } else if undelivered {
            // A row without a report may still arrive inside the transaction: abort, so
            // nothing of it is visible.
            self.abort_as(producer, "undelivered").await
        } else {
            crash_point("before_commit");
            self.commit(producer).await
        };
        match &ended {
            Ended::Committed => span.set_str(crate::otel::attr::TX_OUTCOME, "commit"),
            Ended::Aborted => {
                span.set_str(crate::otel::attr::TX_OUTCOME, "abort");
                span.failed("aborted", "the transaction was aborted");
            }
            Ended::Unknown(e) => span.failed("unknown", &e.to_string()),
        }
        span.end();
        match ended {
            Ended::Committed => {
                crash_point("after_commit");
                metrics::counter!(crate::metrics::RELAY_TXN_COMMITTED).increment(1);
            }
            Ended::Aborted | Ended::Unknown(_) => {
                // Nothing of the batch is visible to read_committed readers: what was sent
                // stays pending and goes again in a new transaction (after recovery, if the
                // end was unknown: the progress record decides then).
                for f in &mut fates {
                    if matches!(f, Fate::Sent) {
                        *f = Fate::Deferred("not committed with its transaction".into());
                    }
                }
            }
        }
        (fates, ended)
    }

    async fn abort_as(&self, producer: &RelayProducer, why: &'static str) -> Ended {
        match self.abort(producer).await {
            Ok(()) => {
                metrics::counter!(crate::metrics::RELAY_TXN_ABORTED, "reason" => why).increment(1);
                Ended::Aborted
            }
            Err(e) => Ended::Unknown(e),
        }
    }

    async fn commit(&self, producer: &RelayProducer) -> Ended {
        // rust-rdkafka's commit flushes first, and its flush, finding any message still
        // counted by librdkafka, polls for a full 100 ms. Every report of the transaction is
        // in by now; what librdkafka may still count is a report event being freed by the
        // polling thread. Waiting (briefly) for the count to reach zero took 100 ms off about
        // one commit in five at 500 msg/s.
        let settled = tokio::time::Instant::now() + FLUSH_WAIT;
        while producer.in_flight_count() > 0 && tokio::time::Instant::now() < settled {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for _ in 0..3 {
            let p = producer.clone();
            let during = crash_at()
                .as_ref()
                .is_some_and(|(p, _)| p == "during_commit");
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
                            metrics::counter!(crate::metrics::RELAY_TXN_ABORTED, "reason" => "commit_failed")
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

/// A batch published and not yet marked: its claim, its rows' fates, the ids each slot's
/// committed transaction sent.
type InFlight = (Claimed, Vec<Fate>, HashMap<i32, Vec<i64>>);

/// What one slot's transaction carries: its rows, the keys held back (waiting for earlier
/// rows, or behind a failed row of the batch before), and the ids of the slot's previous
/// batch while their marks are unconfirmed.
struct SlotRows<'a> {
    rows: Vec<&'a Row>,
    waiting: &'a HashSet<String>,
    blocked: &'a HashSet<String>,
    earlier: &'a [i64],
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
