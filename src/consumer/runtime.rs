//! The poll loop: partitions and their offset trackers, per-key lanes (dispatched to bounded
//! handler tasks by `dispatch.rs`), retry-topic delays, backpressure, and the shutdown commit.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::breaker::{BreakerMode, DrainPacer};
pub(super) use super::context::*;
use super::envelope::{now_ms, Done, DoneItem, Envelope, Fate, LaneId, LaneKey, Tp};
use super::offsets::OffsetTracker;
use super::record::{decode, origin, Raw};
use super::retry::RetryStrategy;
use super::stats::ConsumerStats;
use super::Shared;
use crate::kafka::tpl_of;

#[derive(Default)]
pub(super) struct Lane {
    pub(super) queue: VecDeque<Envelope>,
    pub(super) busy: bool,
}

/// Where a drain of one DLQ partition starts for this replica and the end it must reach.
pub(super) struct DrainTarget {
    pub(super) tp: Tp,
    pub(super) from: i64,
    pub(super) end: i64,
}

/// The poll loop's state: partitions, lanes, what is running and what waits.
pub(super) struct Runtime {
    /// Shared with the blocking drain-target lookups, which never run on the poll loop.
    pub(super) consumer: Arc<StreamConsumer<Ctx>>,
    pub(super) partitions: Arc<Mutex<Partitions>>,
    pub(super) shared: Arc<Shared>,
    pub(super) lanes: HashMap<LaneKey, Lane>,
    pub(super) ready: VecDeque<LaneKey>,
    pub(super) running: usize,
    /// Running tasks that hold a transaction (in-transaction handlers, batches, groups).
    pub(super) running_tx: usize,
    /// Lanes whose head needs a transaction slot while all are taken (only when call handlers
    /// could use the free slots meanwhile); back to the front of `ready` when one frees.
    pub(super) waiting_tx: VecDeque<LaneKey>,
    pub(super) buffered: usize,
    pub(super) delayed: HashMap<Tp, VecDeque<Envelope>>,
    pub(super) bp_paused: bool,
    pub(super) backpressure: Arc<std::sync::atomic::AtomicBool>,
    pub(super) saturated_since: Option<Instant>,
    pub(super) last_progress: Instant,
    pub(super) last_final: Arc<Mutex<HashMap<Tp, i64>>>,
    pub(super) gauges_at: Instant,
    /// Lanes whose head the current mode does not allow (main topics while paused or
    /// draining, parked letters outside a drain); back to `ready` at the next transition.
    pub(super) held: VecDeque<LaneKey>,
    /// During a drain: per DLQ partition, the end seen when the drain started, and how far
    /// this replica has settled it.
    pub(super) drain_target: HashMap<Tp, i64>,
    pub(super) drain_done: HashMap<Tp, i64>,
    /// The broker lookup of missing drain targets, in flight on a blocking thread (its
    /// answers can take seconds during a rebalance; the poll loop must not wait for them).
    pub(super) drain_lookup: Option<tokio::task::JoinHandle<Option<Vec<DrainTarget>>>>,
    pub(super) drain_pacer: DrainPacer,
    pub(super) steer_at: Instant,
    pub(super) assigned: Arc<std::sync::atomic::AtomicBool>,
    pub(super) kafka_outage: Arc<crate::outage::Outage>,
}

impl Runtime {
    /// A runtime over `consumer` with nothing in flight: every lane empty, no partition paused,
    /// the breaker's drain pacer at its configured rate.
    pub(super) fn new(
        consumer: Arc<StreamConsumer<Ctx>>,
        partitions: Arc<Mutex<Partitions>>,
        shared: Arc<Shared>,
        backpressure: Arc<std::sync::atomic::AtomicBool>,
        last_final: Arc<Mutex<HashMap<Tp, i64>>>,
        assigned: Arc<std::sync::atomic::AtomicBool>,
        kafka_outage: Arc<crate::outage::Outage>,
    ) -> Self {
        let drain_rate = shared.breakers.config.drain_rate;
        Self {
            consumer,
            partitions,
            shared,
            lanes: HashMap::new(),
            ready: VecDeque::new(),
            running: 0,
            running_tx: 0,
            waiting_tx: VecDeque::new(),
            buffered: 0,
            delayed: HashMap::new(),
            bp_paused: false,
            backpressure,
            saturated_since: None,
            last_progress: Instant::now(),
            last_final,
            gauges_at: Instant::now(),
            held: VecDeque::new(),
            drain_target: HashMap::new(),
            drain_done: HashMap::new(),
            drain_lookup: None,
            drain_pacer: super::breaker::DrainPacer::new(drain_rate),
            steer_at: Instant::now(),
            assigned,
            kafka_outage,
        }
    }
}

impl Runtime {
    pub(super) async fn run(&mut self, cancel: CancellationToken) {
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
        // A message borrows the consumer it came from, not the runtime it is handed to.
        let consumer = self.consumer.clone();
        loop {
            self.forget_revoked();
            self.steer();
            // Held keys (strict order) of newly assigned partitions are known before any of
            // their messages is dispatched.
            self.shared.holds.reload(&self.shared).await;
            self.dispatch(&done_tx);
            self.backpressure();
            if self.gauges_at.elapsed() >= Duration::from_secs(1) {
                self.gauges_at = Instant::now();
                // The loop turns at least every 5 s (an idle tick below): a minute of silence
                // is a stuck loop, whatever Postgres or Kafka do.
                self.shared.health.beat("consumer", Duration::from_secs(60));
                let group = self.shared.config.group.clone();
                let paused = if self.bp_paused {
                    self.consumer.assignment().map_or(0, |a| a.count())
                } else {
                    self.delayed.len()
                };
                metrics::gauge!(crate::metrics::CONSUMER_PAUSED, "group" => group.clone())
                    .set(paused as f64);
                let stats = &self.shared.stats;
                stats
                    .paused_partitions
                    .store(paused as u64, Ordering::Relaxed);
                stats
                    .in_flight
                    .store(self.buffered as u64, Ordering::Relaxed);
                metrics::gauge!(crate::metrics::CONSUMER_IN_FLIGHT, "group" => group)
                    .set(self.buffered as f64);
            }
            let next_due = self
                .delayed
                .values()
                .filter_map(|q| q.front())
                .filter_map(|e| e.due)
                .min();
            let pause_at = self
                .saturated_since
                .filter(|_| !self.bp_paused)
                .map(|t| t.max(self.last_progress) + self.shared.config.pause_after);
            let pacer_at = (matches!(self.mode(), BreakerMode::Drain | BreakerMode::Probe)
                && !self.ready.is_empty())
            .then(|| self.drain_pacer.wait().map(Instant::from_std))
            .flatten();
            let steer_at = self
                .shared
                .breaker()
                .map(|b| self.steer_at + b.config.check_interval);
            // Idle, the loop still turns (its gauges and liveness beat) every few seconds.
            let idle_tick = Some(Instant::now() + Duration::from_secs(5));
            let next_wake = [next_due, pause_at, pacer_at, steer_at, idle_tick]
                .into_iter()
                .flatten()
                .min();
            // At the bound, stop pulling from librdkafka (its prefetch queue is bounded too);
            // once paused, keep polling so rebalances are served.
            let accepting = self.buffered < self.shared.config.max_buffered || self.bp_paused;
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                Some(done) = done_rx.recv() => self.on_done(done),
                () = self.shared.breakers.changed.notified(), if self.shared.breaker().is_some() => {}
                () = tokio::time::sleep_until(next_wake.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))), if next_wake.is_some() => {
                    self.release_due();
                }
                m = consumer.recv(), if accepting => match m {
                    Ok(m) => {
                        let _poll = tracing::trace_span!("outbox.poll", topic = m.topic(), partition = m.partition(), offset = m.offset()).entered();
                        self.kafka_outage.ok();
                        self.on_message(&m)
                    }
                    Err(e) => {
                        self.kafka_outage.failed(&format!("kafka consumer error: {e}"));
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }

        // Soft stop: no new handlers; running ones finish or give up their retries.
        info!(running = self.running, "consumer stopping");
        let deadline = Instant::now() + self.shared.config.shutdown_timeout;
        while self.running > 0 {
            match tokio::time::timeout_at(deadline, done_rx.recv()).await {
                Ok(Some(done)) => self.on_done(done),
                _ => {
                    warn!(running = self.running, "handlers still running at the shutdown deadline; their offsets stay uncommitted");
                    break;
                }
            }
        }
        match self
            .consumer
            .commit_consumer_state(rdkafka::consumer::CommitMode::Sync)
        {
            Ok(()) => {}
            Err(KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => {}
            Err(e) => {
                warn!(error = %e, "final offset commit failed; uncommitted messages will be redelivered")
            }
        }
        info!("consumer stopped");
    }

    fn forget_revoked(&mut self) {
        let revoked = std::mem::take(&mut self.partitions.lock().expect("partitions lock").revoked);
        for tp in revoked {
            if let Some(q) = self.delayed.remove(&tp) {
                self.buffered -= q.len();
            }
        }
    }

    pub(super) fn epoch_valid(&self, tp: &Tp, epoch: u64) -> bool {
        self.partitions
            .lock()
            .expect("partitions lock")
            .trackers
            .get(tp)
            .is_some_and(|t| t.epoch == epoch)
    }

    fn on_message(&mut self, m: &rdkafka::message::BorrowedMessage<'_>) {
        let raw = Raw::from_message(m);
        let tp = (raw.topic.clone(), raw.partition);
        let epoch = {
            let mut p = self.partitions.lock().expect("partitions lock");
            let epoch = p.next_epoch;
            let t = p
                .trackers
                .entry(tp.clone())
                .or_insert_with(|| OffsetTracker::new(epoch));
            t.begin(raw.offset);
            let e = t.epoch;
            if e == epoch {
                p.next_epoch += 1;
            }
            e
        };
        self.buffered += 1;
        let due = self.shared.retry_topics.get(&raw.topic).map(|(_, hop)| {
            let RetryStrategy::Topics { delays } = &self.shared.config.retry else {
                unreachable!()
            };
            // A record is due `delay` after it was written; a timestamp from the future (clock
            // skew, a hostile producer) cannot hold the partition longer than `delay`.
            let delay = delays[*hop];
            let written = raw.timestamp_ms.unwrap_or_else(now_ms).min(now_ms());
            let due_ms = written.saturating_add(delay.as_millis() as i64);
            let wait = u64::try_from(due_ms.saturating_sub(now_ms()))
                .unwrap_or(0)
                .min(delay.as_millis() as u64);
            Instant::now() + Duration::from_millis(wait)
        });
        let is_dlq = self.shared.drain_topics.contains_key(&raw.topic);
        // Another group's letter, or one a drain must never take (decode, permanent, panic),
        // and a retry record of another group (written to our retry topic by hand or by a
        // misconfigured service): passed over at once, no handler, no pacing, no waiting.
        let pass_over = (is_dlq && !self.ours(&raw)) || self.foreign_retry(&raw);
        if pass_over {
            self.settle(vec![DoneItem {
                lane: (raw.topic.clone(), raw.partition, LaneId::Offset(raw.offset)),
                tp,
                offset: raw.offset,
                epoch,
                fate: Fate::Final,
                timestamp_ms: raw.timestamp_ms,
            }]);
            return;
        }
        let origin = origin(&raw, &self.shared);
        let decoded = decode(&raw, &origin);
        let env = Envelope {
            raw,
            epoch,
            due,
            origin,
            decoded,
            drain: is_dlq,
        };
        let waiting = self.delayed.get(&tp).is_some_and(|q| !q.is_empty());
        if waiting || env.due.is_some_and(|d| d > Instant::now()) {
            if !waiting {
                // Not due yet: hold the record and pause its retry partition until it is. The
                // poll loop keeps running (other partitions flow; the group stays alive).
                if let Err(e) = self.consumer.pause(&tpl_of([&tp])) {
                    warn!(error = %e, "pause of retry partition failed");
                }
                debug!(topic = %tp.0, partition = tp.1, "retry partition paused until due");
            }
            self.delayed.entry(tp).or_default().push_back(env);
        } else {
            self.enqueue(env);
        }
    }

    /// A retry record of another consumer group on one of our retry topics: counted, logged,
    /// and never ours to handle.
    fn foreign_retry(&self, raw: &Raw) -> bool {
        let Some((main, _)) = self.shared.retry_topics.get(&raw.topic) else {
            return false;
        };
        let Some(other) = raw
            .header(crate::wire::X_CONSUMER_GROUP)
            .filter(|g| *g != self.shared.config.group)
        else {
            return false;
        };
        warn!(topic = %raw.topic, partition = raw.partition, offset = raw.offset, group = %other, "retry record of another consumer group: ignored");
        ConsumerStats::inc(&self.shared.stats.foreign_retries);
        super::tx::count(&self.shared, main, "foreign_retry", 1);
        true
    }

    fn enqueue(&mut self, env: Envelope) {
        let id = match &env.raw.key {
            Some(k) => LaneId::Key(k.clone()),
            None => LaneId::Offset(env.raw.offset),
        };
        let key = (env.raw.topic.clone(), env.raw.partition, id);
        let lane = self.lanes.entry(key.clone()).or_default();
        lane.queue.push_back(env);
        if !lane.busy && lane.queue.len() == 1 {
            self.ready.push_back(key);
        }
    }

    fn release_due(&mut self) {
        let now = Instant::now();
        let tps: Vec<Tp> = self.delayed.keys().cloned().collect();
        for tp in tps {
            let mut released = Vec::new();
            let q = self.delayed.get_mut(&tp).expect("present");
            while q.front().is_some_and(|e| e.due.is_none_or(|d| d <= now)) {
                released.push(q.pop_front().expect("front"));
            }
            let empty = q.is_empty();
            for env in released {
                self.enqueue(env);
            }
            if empty {
                self.delayed.remove(&tp);
                if !self.bp_paused && self.mode_allows(&tp.0) {
                    if let Err(e) = self.consumer.resume(&tpl_of([&tp])) {
                        debug!(error = %e, "resume of retry partition failed");
                    }
                }
            }
        }
    }

    fn on_done(&mut self, done: Done) {
        self.running -= 1;
        if done.tx {
            self.running_tx -= 1;
            // A transaction slot is free: the lanes waiting for one go first.
            while let Some(k) = self.waiting_tx.pop_back() {
                self.ready.push_front(k);
            }
        }
        self.last_progress = Instant::now();
        self.settle(done.items);
    }

    /// Records outcomes: lanes freed, final offsets stored.
    fn settle(&mut self, items: Vec<DoneItem>) {
        let mut stores: HashMap<Tp, i64> = HashMap::new();
        for item in items {
            self.buffered -= 1;
            if let Some(lane) = self.lanes.get_mut(&item.lane) {
                lane.busy = false;
                if lane.queue.is_empty() {
                    self.lanes.remove(&item.lane);
                } else {
                    self.ready.push_back(item.lane);
                }
            }
            if item.fate.is_final() {
                if let Some(ts) = item.timestamp_ms {
                    let mut last = self.last_final.lock().expect("last_final lock");
                    let e = last.entry(item.tp.clone()).or_insert(ts);
                    *e = (*e).max(ts);
                }
                let point = {
                    let mut p = self.partitions.lock().expect("partitions lock");
                    match p.trackers.get_mut(&item.tp) {
                        Some(t) if t.epoch == item.epoch => t.finish(item.offset),
                        _ => None,
                    }
                };
                if let Some(next) = point {
                    if self.shared.drain_topics.contains_key(&item.tp.0) {
                        let d = self.drain_done.entry(item.tp.clone()).or_insert(next);
                        *d = (*d).max(next);
                    }
                    // One entry per partition (librdkafka refuses a store naming a partition
                    // twice): points only grow, so the last is the one to store.
                    stores.insert(item.tp.clone(), next);
                }
            }
        }
        if !stores.is_empty() {
            let mut tpl = TopicPartitionList::with_capacity(stores.len());
            for ((topic, partition), next) in &stores {
                let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*next));
            }
            let _commit = tracing::debug_span!("outbox.commit", partitions = tpl.count()).entered();
            let span = crate::otel::commit(&self.shared.config.group, tpl.count());
            if let Err(e) = self.consumer.store_offsets(&tpl) {
                debug!(error = %e, "offset store refused (partition revoked?)");
                span.failed("store_refused", &e.to_string());
            }
            span.end();
        }
    }

    fn backpressure(&mut self) {
        let max = self.shared.config.max_buffered;
        if self.buffered >= max {
            // Stalled = at the bound and no handler finished for `pause_after`. A full buffer
            // that keeps draining is just a backlog: pulling at the handlers' pace is enough.
            let since = *self.saturated_since.get_or_insert_with(Instant::now);
            let stalled_for = since.max(self.last_progress).elapsed();
            if !self.bp_paused && stalled_for >= self.shared.config.pause_after {
                if let Ok(a) = self.consumer.assignment() {
                    if self.consumer.pause(&a).is_ok() {
                        self.bp_paused = true;
                        self.backpressure.store(true, Ordering::SeqCst);
                        ConsumerStats::inc(&self.shared.stats.backpressure_pauses);
                        info!(
                            buffered = self.buffered,
                            "backpressure: handlers saturated, all partitions paused"
                        );
                    }
                }
            }
        } else {
            self.saturated_since = None;
        }
        if self.bp_paused && self.buffered <= max / 2 {
            if let Ok(a) = self.consumer.assignment() {
                let mut tpl = TopicPartitionList::new();
                for e in a.elements() {
                    let tp = (e.topic().to_owned(), e.partition());
                    if !self.delayed.contains_key(&tp) && self.mode_allows(&tp.0) {
                        tpl.add_partition(e.topic(), e.partition());
                    }
                }
                if self.consumer.resume(&tpl).is_ok() {
                    self.bp_paused = false;
                    self.backpressure.store(false, Ordering::SeqCst);
                    info!(
                        buffered = self.buffered,
                        "backpressure released: partitions resumed"
                    );
                }
            }
        }
    }
}
