//! The pipelined relay: the claim and the marks of one batch overlap the produce/ack wait of
//! another, so Postgres and Kafka work at the same time instead of taking turns.
//!
//! Up to [`RelayConfig::in_flight_batches`](crate::RelayConfig::in_flight_batches) claim
//! transactions are open at once, each a pass of [`Relay::claim`] → [`Relay::produce`] →
//! [`Relay::settle`]. Claims run one after another, so each skips (`SKIP LOCKED`) the rows
//! of the batches before it. Every guarantee of the serial pass is kept by three rules:
//!
//! - **Per-key order.** A batch produces only after the batch before it has every delivery
//!   report, so across batches records reach each partition in claim order. The earlier batch
//!   hands over the keys whose row did not reach Kafka (refused, deferred, held back): the
//!   later batch holds back its rows of those keys. A batch's per-key check
//!   (`sql::FIRST_PENDING`) starts after the rows of its keys in the batches in flight, since
//!   those are ordered by this rule, not by that check.
//! - **Ack before mark.** Each batch marks only its acknowledged rows, in its own transaction,
//!   as the serial pass does; a `kill -9` loses every open transaction and their rows are
//!   claimed and sent again (at-least-once).
//! - **Claim floor.** Batches commit in claim order, and a batch's floor probe
//!   (`sql::LEFT_BEHIND`) runs after the batch before it committed or rolled back, so the floor
//!   moves exactly as a series of serial passes would move it. A batch whose predecessor never
//!   produced (it failed) sends nothing and rolls back.
//!
//! Lanes are rebalanced only when no batch is in flight, as in the serial pass.
//!
//! On the table, a batch that comes back short ends the pass. On ring storage only a batch
//! that read nothing does (see `pump`).

use std::collections::{BTreeMap, HashMap, HashSet};

use futures::stream::{FuturesUnordered, StreamExt as _};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{BatchReport, Claimed, Outcome, Relay, RelayError};

/// What a batch hands to the next once its delivery reports are in: the keys whose later rows
/// must not be sent, each with the claim number of the batch whose row did not reach Kafka.
/// A batch ignores entries of batches that had already committed when it was claimed: their
/// rows are pending again, and its own per-key check sees them.
type Blocked = HashMap<String, u64>;

/// The links between a batch and the one claimed before it.
struct Links {
    /// Resolves when the earlier batch has its delivery reports (dropped: it never produced).
    produced: oneshot::Receiver<Blocked>,
    /// Resolves (or is dropped) when the earlier batch committed or rolled back.
    settled: oneshot::Receiver<()>,
}

/// The sum of the batches settled so far, and whether to claim more.
struct Tally {
    total: Option<BatchReport>,
    error: Option<RelayError>,
    more: bool,
}

impl Tally {
    fn add(&mut self, done: Result<BatchReport, RelayError>) {
        match done {
            Ok(r) => {
                // Kafka unreachable: stop claiming, let the caller back off. Nothing in the
                // batch could move: let the caller wait instead of spinning.
                if r.deferred > 0 || (r.claimed > 0 && r.held_back == r.claimed) {
                    self.more = false;
                }
                let t = self.total.get_or_insert_with(BatchReport::default);
                t.claimed += r.claimed;
                t.sent += r.sent;
                t.backed_off += r.backed_off;
                t.deferred += r.deferred;
                t.held_back += r.held_back;
            }
            Err(e) => {
                self.more = false;
                self.error.get_or_insert(e);
            }
        }
    }
}

impl Relay {
    /// Claims, produces and settles batches back to back, with up to
    /// [`RelayConfig::in_flight_batches`](crate::RelayConfig::in_flight_batches) open at once
    /// (see `relay/pipeline.rs`), until a batch comes back short; returns their sum, or
    /// [`Outcome::Empty`] when nothing was due. [`Relay::run`] calls it on every wake-up;
    /// tests and benchmarks drain with it.
    ///
    /// # Errors
    /// The first [`RelayError`]; every batch already in flight is finished first.
    pub async fn run_pipeline(&self) -> Result<Outcome, RelayError> {
        self.pump(&CancellationToken::new(), None)
            .await
            .map(|(outcome, _)| outcome)
    }

    /// [`Relay::run_pipeline`], stopping to claim once `cancel` fires or, with `quantum`, once
    /// that many batches were claimed (a fleet's relay giving way to other tenants); the flag
    /// says the pass stopped for the quantum with more to do.
    pub(super) async fn pump(
        &self,
        cancel: &CancellationToken,
        quantum: Option<usize>,
    ) -> Result<(Outcome, bool), RelayError> {
        if self.config.exactly_once.is_some() {
            // One batch in flight per slot, the slots side by side (`exactly_once.rs`): a pass
            // is bounded already.
            return self.run_once_exactly().await.map(|o| (o, false));
        }
        let mut cut = false;
        let _pass = self.pass.lock().await;
        let depth = self.config.in_flight_batches.max(1);
        let mut passes = FuturesUnordered::new();
        // Keys (and their highest id) of each batch in flight, by claim number.
        let mut open: BTreeMap<u64, Vec<(String, i64)>> = BTreeMap::new();
        let mut prev: Option<Links> = None;
        let mut tally = Tally {
            total: None,
            error: None,
            more: true,
        };
        let mut seq = 0u64;
        // The newest batch in flight, if full (see `Ahead`).
        let mut ahead = None;
        let forgot = &self.layout.forgot;
        forgot.store(false, std::sync::atomic::Ordering::Relaxed);
        loop {
            let room = tally.more
                && !forgot.load(std::sync::atomic::Ordering::Relaxed)
                && passes.len() < depth
                && !cancel.is_cancelled();
            let lanes = if room {
                // A lane is never handed over while rows of it are in flight: rebalance only
                // with the pipeline empty, and stop claiming until it is.
                let mut l = self.lanes.lock().await;
                if passes.is_empty() {
                    l.refresh_if_due().await;
                    Some(l.owned())
                } else if l.is_due() {
                    None
                } else {
                    Some(l.owned())
                }
            } else {
                None
            };
            let Some(lanes) = lanes else {
                match passes.next().await {
                    Some((seq, done)) => {
                        open.remove(&seq);
                        tally.add(done);
                    }
                    None => break,
                }
                continue;
            };
            if lanes.is_empty() {
                tally.more = false;
                continue;
            }
            // Batches numbered below this had committed before the claim began (taken now, with
            // `after`: a batch that commits while this one is claimed may or may not be seen by
            // its per-key check, so it still counts as open).
            let oldest_open = open.keys().next().copied().unwrap_or(seq + 1);
            let mut after: HashMap<String, i64> = HashMap::new();
            for (k, id) in open.values().flatten() {
                let e = after.entry(k.clone()).or_insert(*id);
                *e = (*e).max(*id);
            }
            // Keep the batches in flight moving while this one is claimed.
            let claimed = {
                let claim = self.claim(lanes, &after, ahead);
                tokio::pin!(claim);
                loop {
                    tokio::select! {
                        biased;
                        c = &mut claim => break c,
                        Some((seq, done)) = passes.next(), if !passes.is_empty() => {
                            open.remove(&seq);
                            tally.add(done);
                        }
                    }
                }
            };
            let claimed = match claimed {
                Ok(c) => c,
                Err(e) => {
                    tally.add(Err(e));
                    continue;
                }
            };
            let sendable = claimed.sendable();
            // Drained (or nothing here can move): the caller waits. On ring storage a short
            // batch does not end the pass: the next claim overlaps its produce instead of
            // waiting for it (a pass ends once its batches are settled, so ending at each
            // short batch loses the pipeline: at 2,000 events/s p50 commit→ack 8.4 – 11 ms
            // instead of 6.6 – 8.6), and moves the cursors its proof lets; the pass ends at a
            // claim that finds nothing.
            let short = claimed.len() < self.config.batch_size && claimed.ring.is_none();
            if short || sendable == 0 {
                tally.more = false;
            }
            seq += 1;
            if tally.more && quantum.is_some_and(|q| seq >= q as u64) {
                tally.more = false;
                cut = true;
            }
            ahead = claimed.ahead(self.config.batch_size);
            open.insert(
                seq,
                claimed
                    .last_of_keys()
                    .map(|(k, id)| (k.to_owned(), id))
                    .collect(),
            );
            let (produced_tx, produced_rx) = oneshot::channel();
            let (settled_tx, settled_rx) = oneshot::channel();
            let links = prev.replace(Links {
                produced: produced_rx,
                settled: settled_rx,
            });
            passes.push(self.pipelined(seq, oldest_open, claimed, links, produced_tx, settled_tx));
        }
        if let Some(e) = tally.error {
            return Err(e);
        }
        Ok((
            match tally.total {
                Some(t) if t.claimed > 0 => Outcome::Published(t),
                _ => Outcome::Empty,
            },
            cut,
        ))
    }

    /// One batch of the pipeline: waits for the earlier batch's delivery reports, produces,
    /// hands its own over, waits for the earlier batch to settle, settles.
    async fn pipelined(
        &self,
        seq: u64,
        oldest_open: u64,
        claimed: Claimed,
        prev: Option<Links>,
        produced: oneshot::Sender<Blocked>,
        settled: oneshot::Sender<()>,
    ) -> (u64, Result<BatchReport, RelayError>) {
        let (mut blocked, prev_settled) = match prev {
            None => (Blocked::new(), None),
            Some(links) => match links.produced.await {
                Ok(blocked) => (blocked, Some(links.settled)),
                // The earlier batch failed before producing: its rows stay pending, so nothing
                // here may overtake them. Roll back (by dropping the claim); the next pass
                // claims both again.
                Err(_) => {
                    let claimed_rows = claimed.len();
                    if let Some(read) = &claimed.ring {
                        self.layout.forget_ahead(&claimed.rows, read);
                    }
                    drop(claimed);
                    drop(settled);
                    return (
                        seq,
                        Ok(BatchReport {
                            claimed: claimed_rows,
                            held_back: claimed_rows,
                            ..BatchReport::default()
                        }),
                    );
                }
            },
        };
        blocked.retain(|_, from| *from >= oldest_open);
        let held: HashSet<String> = blocked.keys().cloned().collect();
        let fates = self.produce(&claimed, &held).await;
        // Acknowledged, not yet marked: a crash here re-sends the batch (at-least-once).
        super::exactly_once::crash_point("after_produce");
        blocked.extend(claimed.unsent_keys(&fates).map(|k| (k, seq)));
        // The next batch may produce now, while this one marks.
        let _ = produced.send(blocked);
        if let Some(rx) = prev_settled {
            // Ok or dropped: either way the earlier batch's transaction has ended.
            let _ = rx.await;
        }
        let report = self.settle(claimed, fates).await;
        let _ = settled.send(());
        (seq, report)
    }
}
