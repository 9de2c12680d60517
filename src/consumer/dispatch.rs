//! Dispatch: ready lanes' heads to handler tasks within the mode's limit and the transaction
//! slots, forming batches and commit groups from heads of other lanes.

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use tokio::sync::mpsc;
use tracing::warn;

use super::breaker::BreakerMode;
use super::commit_group::process_group;
use super::drain::process_drain;
use super::driver::Kind;
use super::envelope::Fate;
use super::envelope::{Done, DoneItem, Envelope, LaneKey};
use super::handler::Delivered;
use super::held::process_keyed;
use super::process::{process, process_batch};
use super::runtime::Runtime;

impl Runtime {
    /// Pops the head of the next ready lane, or `None` when no lane is ready. Heads of
    /// revoked partitions are dropped (the new owner redelivers them).
    fn next_head(&mut self) -> Option<(LaneKey, Envelope)> {
        loop {
            let key = self.ready.pop_front()?;
            let Some(lane) = self.lanes.get_mut(&key) else {
                continue;
            };
            let Some(env) = lane.queue.pop_front() else {
                self.lanes.remove(&key);
                continue;
            };
            let tp = (env.raw.topic.clone(), env.raw.partition);
            if self.epoch_valid(&tp, env.epoch) {
                self.lanes.get_mut(&key).expect("lane").busy = true;
                return Some((key, env));
            }
            self.buffered -= 1;
            let lane = self.lanes.get_mut(&key).expect("lane");
            if lane.queue.is_empty() {
                self.lanes.remove(&key);
            } else {
                self.ready.push_back(key);
            }
        }
    }

    /// Appends the following ready heads that `fits` — other lanes, so per-key order is
    /// unaffected — until `batch` holds `max`.
    fn gather(
        &mut self,
        batch: &mut Vec<(LaneKey, Envelope)>,
        max: usize,
        fits: impl Fn(&Self, &Envelope) -> bool,
    ) {
        while batch.len() < max {
            let next_fits = self
                .ready
                .front()
                .and_then(|k| self.lanes.get(k))
                .and_then(|l| l.queue.front())
                .is_some_and(|e| fits(self, e));
            if !next_fits {
                break;
            }
            match self.next_head() {
                // next_head may have skipped revoked heads and returned another lane's head:
                // take it only if it fits too.
                Some(item) if fits(self, &item.1) => batch.push(item),
                Some((k, env)) => {
                    let lane = self.lanes.get_mut(&k).expect("lane");
                    lane.queue.push_front(env);
                    lane.busy = false;
                    self.ready.push_front(k);
                    break;
                }
                None => break,
            }
        }
    }

    /// True for a decoded message whose type has a per-message handler.
    fn single(&self, env: &Envelope) -> bool {
        env.decoded
            .as_ref()
            .is_ok_and(|d| self.shared.tx.kind(d.route()) == Some(Kind::One))
    }

    /// The batch handler and bound for an envelope, if its type has one.
    fn batch_of(&self, env: &Envelope) -> Option<(String, usize)> {
        let d = env.decoded.as_ref().ok()?;
        match self.shared.tx.kind(d.route())? {
            Kind::Batch(max) => Some((d.message_type.clone(), max)),
            _ => None,
        }
    }

    /// True when handling `env` holds a transaction for the handler's whole run.
    fn needs_tx(&self, env: &Envelope) -> bool {
        env.decoded.as_ref().is_ok_and(|d| {
            self.shared
                .tx
                .kind(d.route())
                .is_some_and(Kind::holds_transaction)
        })
    }

    pub(super) fn dispatch(&mut self, done_tx: &mpsc::UnboundedSender<Done>) {
        let mode = self.mode();
        let limit = match (mode, self.shared.breaker()) {
            (BreakerMode::Drain, Some(b)) => b
                .config
                .drain_concurrency
                .min(self.shared.config.concurrency),
            // A probe is one call at a time: a dead dependency sees one call, not a burst.
            (BreakerMode::Probe, Some(_)) => 1,
            _ => self.shared.config.concurrency,
        };
        let tx_limit = self.shared.config.transaction_slots().min(limit);
        while self.running < limit {
            // Heads the mode does not allow wait in `held`.
            while let Some(key) = self.ready.front().cloned() {
                let allowed = self
                    .lanes
                    .get(&key)
                    .and_then(|l| l.queue.front())
                    .is_none_or(|e| self.allowed(mode, e));
                if allowed {
                    break;
                }
                self.ready.pop_front();
                self.held.push_back(key);
            }
            if matches!(mode, BreakerMode::Drain | BreakerMode::Probe) && !self.ready.is_empty() {
                if self.drain_pacer.wait().is_some() {
                    return;
                }
                self.drain_pacer.take();
            }
            let Some((key, env)) = self.next_head() else {
                return;
            };
            if !self.allowed(mode, &env) {
                let lane = self.lanes.get_mut(&key).expect("lane");
                lane.queue.push_front(env);
                lane.busy = false;
                self.held.push_back(key);
                continue;
            }
            let tx = self.needs_tx(&env);
            if tx && self.running_tx >= tx_limit {
                // Every transaction slot is taken: this lane waits for one. Free slots still
                // serve call handlers' lanes behind it (other keys: order is per key).
                let lane = self.lanes.get_mut(&key).expect("lane");
                lane.queue.push_front(env);
                lane.busy = false;
                if self.shared.has_calls {
                    self.waiting_tx.push_back(key);
                    continue;
                }
                self.ready.push_front(key);
                return;
            }
            let drain = env.drain;
            // A key that may be held (strict order) goes alone through its hold's check.
            let keyed = self.shared.holds.may_hold(&env);
            let mut batch = vec![(key, env)];
            // A probe is one message: no batch, no commit group.
            let probe = mode == BreakerMode::Probe;
            if let Some((ty, max)) = (!drain && !probe && !keyed)
                .then(|| self.batch_of(&batch[0].1))
                .flatten()
            {
                let tenant = tenant_of(&batch[0].1).map(str::to_owned);
                self.gather(&mut batch, max, |rt, e| {
                    rt.allowed(mode, e)
                        && !rt.shared.holds.may_hold(e)
                        && rt.batch_of(e).is_some_and(|(t, _)| t == ty)
                        && tenant_of(e) == tenant.as_deref()
                });
            } else if !drain && !probe && !keyed && self.single(&batch[0].1) {
                // A commit group (`commit_group.rs`), only when more heads wait than slots are free:
                // the waiting heads are spread over the free slots, so no slot idles.
                let free = (limit - self.running).min(tx_limit - self.running_tx);
                let waiting = self.ready.len() + 1;
                let size = waiting.div_ceil(free).min(self.shared.config.commit_group);
                if size > 1 {
                    let tenant = tenant_of(&batch[0].1).map(str::to_owned);
                    self.gather(&mut batch, size, |rt, e| {
                        rt.allowed(mode, e)
                            && !e.drain
                            && !rt.shared.holds.may_hold(e)
                            && rt.single(e)
                            && tenant_of(e) == tenant.as_deref()
                    });
                }
            }
            let single = self.single(&batch[0].1);
            self.running += 1;
            self.running_tx += usize::from(tx);
            let shared = self.shared.clone();
            let done = done_tx.clone();
            tokio::spawn(async move {
                let resolved = {
                    let mut envs: Vec<&mut Envelope> = batch.iter_mut().map(|(_, e)| e).collect();
                    super::schemas::resolve(&mut envs, &shared).await
                };
                let envs: Vec<&Envelope> = batch.iter().map(|(_, e)| e).collect();
                let work = async {
                    if !resolved {
                        vec![Fate::Abandoned; envs.len()]
                    } else if drain {
                        vec![process_drain(envs[0], &shared).await]
                    } else if keyed {
                        vec![process_keyed(envs[0], &shared).await]
                    } else if envs.len() == 1 {
                        vec![process(envs[0], &shared).await]
                    } else if single {
                        process_group(&envs, &shared).await
                    } else {
                        process_batch(&envs, &shared).await
                    }
                };
                // Whatever happens, the slot and the lanes come back; a bug here abandons the
                // messages (offsets stay before them) instead of wedging the consumer.
                let fates = AssertUnwindSafe(work)
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|_| {
                        warn!("message task panicked: its messages stay uncommitted");
                        vec![Fate::Abandoned; envs.len()]
                    });
                let items = batch
                    .iter()
                    .zip(fates)
                    .map(|((lane, env), fate)| DoneItem {
                        lane: lane.clone(),
                        tp: (env.raw.topic.clone(), env.raw.partition),
                        offset: env.raw.offset,
                        epoch: env.epoch,
                        fate,
                        timestamp_ms: env.raw.timestamp_ms,
                    })
                    .collect();
                let _ = done.send(Done { items, tx });
            });
        }
    }
}

/// The tenant of a decoded message (`x-tenant`): one transaction never mixes tenants, since
/// with tenant routing each tenant's transactions run in its own database.
fn tenant_of(env: &Envelope) -> Option<&str> {
    env.decoded.as_ref().ok().and_then(Delivered::tenant)
}
