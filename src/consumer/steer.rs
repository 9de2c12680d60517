//! The breaker as the runtime steers by it: the consumer's mode (NORMAL, PAUSED, DRAIN), which
//! partitions flow in each, the transitions between them, and when a drain is complete.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt as _;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::time::Instant;
use tracing::warn;

use crate::consumer::breaker::{next_step, on_assigned, BreakerMode, Breakers, DrainPacer, Step};
use crate::consumer::context::Ctx;
use crate::consumer::envelope::{Envelope, Tp};
use crate::consumer::record::Raw;
use crate::consumer::runtime::*;
use crate::kafka::tpl_of;

impl Runtime {
    pub(in crate::consumer) fn mode(&self) -> BreakerMode {
        self.shared
            .breaker()
            .map_or(BreakerMode::Normal, Breakers::mode)
    }

    fn probe_main(&self) -> bool {
        self.shared
            .breaker()
            .is_some_and(|b| b.probe_main.load(Ordering::SeqCst))
    }

    pub(in crate::consumer) fn allowed(&self, mode: BreakerMode, env: &Envelope) -> bool {
        flows(mode, self.probe_main(), env.drain)
    }

    pub(in crate::consumer) fn mode_allows(&self, topic: &str) -> bool {
        flows(
            self.mode(),
            self.probe_main(),
            self.shared.drain_topics.contains_key(topic),
        )
    }

    /// A parked letter this group drains: written by this group because a dependency was
    /// unavailable or transient retries ran out. Decode, permanent and panic letters never.
    pub(in crate::consumer) fn ours(&self, raw: &Raw) -> bool {
        raw.header(crate::wire::X_CONSUMER_GROUP) == Some(self.shared.config.group.as_str())
            && matches!(
                raw.header(crate::wire::X_ERROR_KIND),
                Some("unavailable" | "transient-exhausted")
            )
    }

    /// Pauses and resumes assigned partitions so that only what the mode allows flows.
    pub(in crate::consumer) fn apply_pauses(&mut self) {
        let Ok(a) = self.consumer.assignment() else {
            return;
        };
        let (mut pause, mut resume) = (TopicPartitionList::new(), TopicPartitionList::new());
        for e in a.elements() {
            let tp = (e.topic().to_owned(), e.partition());
            if self.bp_paused || self.delayed.contains_key(&tp) || !self.mode_allows(&tp.0) {
                pause.add_partition(&tp.0, tp.1);
            } else {
                resume.add_partition(&tp.0, tp.1);
            }
        }
        if let Err(e) = self.consumer.pause(&pause) {
            warn!(error = %e, "pause failed");
        }
        if let Err(e) = self.consumer.resume(&resume) {
            warn!(error = %e, "resume failed");
        }
    }

    pub(in crate::consumer) fn transition(&mut self, to: BreakerMode, why: &str) {
        let Some(b) = self.shared.breaker() else {
            return;
        };
        b.probe_main.store(false, Ordering::SeqCst);
        b.set_mode(to, why);
        self.ready.extend(self.held.drain(..));
        if matches!(to, BreakerMode::Drain | BreakerMode::Probe) {
            self.drain_target.clear();
            self.drain_done.clear();
            // A lookup started for the previous drain answers for its start, not this one's.
            self.drain_lookup = None;
            self.drain_pacer = DrainPacer::new(b.config.drain_rate);
        }
        self.apply_pauses();
    }

    /// NORMAL → PAUSED → DRAIN → NORMAL, from the shared breaker rows (refreshed by a task):
    /// the breaker decides ([`next_step`], [`on_assigned`]), this applies the decision.
    pub(in crate::consumer) fn steer(&mut self) {
        if self.shared.breaker().is_none() {
            return;
        }
        // `shared.breakers` is the Arc behind `breaker()`: held here, it does not borrow self.
        let b = self.shared.breakers.clone();
        self.steer_at = Instant::now();
        // One read of all three: a refresh publishes them together.
        let view = b.view();
        if self.assigned.swap(false, Ordering::SeqCst) {
            match on_assigned(self.mode(), view) {
                Some(Step::Go(to, why)) => return self.transition(to, why),
                Some(_) => {
                    self.drain_target.clear();
                    self.drain_lookup = None;
                    self.apply_pauses();
                }
                None => {}
            }
        }
        let (mode, probe_main) = (self.mode(), self.probe_main());
        match next_step(mode, view, probe_main, || self.drain_complete()) {
            Step::Stay => {}
            Step::Go(to, why) => self.transition(to, why),
            Step::ProbeMain => {
                b.probe_main.store(true, Ordering::SeqCst);
                tracing::info!(group = %b.group, "no parked letter answered the probe: probing with the main topics, one call at a time");
                self.ready.extend(self.held.drain(..));
                self.apply_pauses();
            }
            Step::Drained => {
                self.transition(
                    BreakerMode::Normal,
                    "parked letters drained: main topics resumed",
                );
                tokio::spawn(async move { b.reset_streaks().await });
            }
        }
    }

    /// Every assigned DLQ partition settled up to the end it had when the drain started, and
    /// no parked letter buffered or in flight.
    pub(in crate::consumer) fn drain_complete(&mut self) -> bool {
        let Ok(a) = self.consumer.assignment() else {
            return false;
        };
        if a.count() == 0 {
            return false; // not assigned yet (startup): wait
        }
        let dlq: Vec<Tp> = a
            .elements()
            .iter()
            .filter(|e| self.shared.drain_topics.contains_key(e.topic()))
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect();
        let missing: Vec<Tp> = dlq
            .iter()
            .filter(|tp| !self.drain_target.contains_key(*tp))
            .cloned()
            .collect();
        if !missing.is_empty() && !self.look_up_targets(missing) {
            return false;
        }
        let busy = self
            .lanes
            .keys()
            .any(|k| self.shared.drain_topics.contains_key(&k.0));
        !busy
            && dlq.iter().all(|tp| {
                self.drain_done.get(tp).copied().unwrap_or(0)
                    >= self.drain_target.get(tp).copied().unwrap_or(0)
            })
    }

    /// Knows the drain target of every partition in `missing` (true), or has a lookup of them
    /// running on a blocking thread (false; it wakes the loop when it answers). The broker's
    /// answers take up to seconds while the group rebalances: asked on the poll loop, they
    /// kept a replica from seeing an open breaker for 10 s.
    fn look_up_targets(&mut self, missing: Vec<Tp>) -> bool {
        if self
            .drain_lookup
            .as_ref()
            .is_some_and(tokio::task::JoinHandle::is_finished)
        {
            let found = self.drain_lookup.take().and_then(|t| t.now_or_never());
            // Partitions revoked meanwhile are not targets any more.
            for t in found
                .and_then(Result::ok)
                .flatten()
                .unwrap_or_default()
                .into_iter()
                .filter(|t| missing.contains(&t.tp))
            {
                self.drain_target.insert(t.tp.clone(), t.end);
                let d = self.drain_done.entry(t.tp).or_insert(t.from);
                *d = (*d).max(t.from);
            }
        }
        let missing: Vec<Tp> = missing
            .into_iter()
            .filter(|tp| !self.drain_target.contains_key(tp))
            .collect();
        if missing.is_empty() {
            return true;
        }
        if self.drain_lookup.is_none() {
            let (consumer, breakers) = (self.consumer.clone(), self.shared.breakers.clone());
            self.drain_lookup = Some(tokio::task::spawn_blocking(move || {
                let found = drain_targets(&consumer, &missing);
                breakers.changed.notify_one();
                found
            }));
        }
        false
    }
}

/// Blocking: the group's committed offset (or, never committed, the fetch position) and the
/// high watermark of each partition; `None` when the broker does not answer in time (asked
/// again at the next check rather than guessed).
fn drain_targets(consumer: &StreamConsumer<Ctx>, tps: &[Tp]) -> Option<Vec<DrainTarget>> {
    let timeout = rdkafka::util::Timeout::After(Duration::from_secs(5));
    let committed = consumer
        .committed_offsets(tpl_of(tps.iter()), timeout)
        .ok()?;
    let position = consumer.position().ok();
    let offset_of = |tpl: Option<&TopicPartitionList>, tp: &Tp| {
        tpl.and_then(|c| c.find_partition(&tp.0, tp.1))
            .and_then(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            })
    };
    tps.iter()
        .map(|tp| {
            let (lo, hi) = consumer.fetch_watermarks(&tp.0, tp.1, timeout).ok()?;
            let from = offset_of(Some(&committed), tp)
                .into_iter()
                .chain(offset_of(position.as_ref(), tp))
                .max()
                .unwrap_or(lo)
                .max(lo);
            Some(DrainTarget {
                tp: tp.clone(),
                from,
                end: hi,
            })
        })
        .collect()
}
