//! What librdkafka calls back into: which partitions the consumer owns and their offset
//! trackers (rebalance), the lag metrics (statistics), and the outage lines (logs, errors).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::{ClientContext, TopicPartitionList};
use tracing::{info, warn};

use super::breaker::{BreakerMode, Breakers};
use super::offsets::OffsetTracker;

use super::envelope::{now_ms, Tp};

/// Shared with the rebalance callback: which partitions we own and their offset trackers.
#[derive(Default)]
pub(super) struct Partitions {
    pub(super) trackers: HashMap<Tp, OffsetTracker>,
    pub(super) next_epoch: u64,
    pub(super) revoked: Vec<Tp>,
}

pub(super) struct Ctx {
    /// The group, for metric labels.
    pub(super) group: String,
    /// Per partition, the timestamp (ms) of the last message that became final: while the
    /// partition lags, its age bounds the age of the oldest unconsumed message from above.
    pub(super) last_final: Arc<Mutex<HashMap<Tp, i64>>>,
    pub(super) partitions: Arc<Mutex<Partitions>>,
    /// Mirrors the runtime's backpressure pause, so partitions assigned meanwhile start paused.
    pub(super) backpressure: Arc<std::sync::atomic::AtomicBool>,
    /// The breaker cycle (when configured) and the DLQ topics read during drains: partitions
    /// assigned meanwhile start paused or not according to the mode.
    pub(super) breakers: Option<Arc<Breakers>>,
    pub(super) drain_topics: HashSet<String>,
    /// Set on every assignment: partitions taken over from another replica may hold parked
    /// letters, so the runtime drains before consuming their main topics.
    pub(super) assigned: Arc<std::sync::atomic::AtomicBool>,
    /// One log line per Kafka outage (librdkafka's callbacks and poll errors).
    pub(super) kafka_outage: Arc<crate::outage::Outage>,
    /// The last lag per `topic/partition` librdkafka reported, in messages and in seconds
    /// (the age bound of the oldest unconsumed message), for the heartbeat.
    pub(super) lag: Arc<Mutex<std::collections::BTreeMap<String, (i64, f64)>>>,
    /// Set on every assignment: the runtime reloads the held keys (strict order) before it
    /// dispatches a message of the new partitions.
    pub(super) holds_stale: Arc<std::sync::atomic::AtomicBool>,
}

/// Whether partitions of a topic flow in `mode`: DLQ topics only while draining or probing,
/// the others in NORMAL, and in PROBE once the parked letters are done (`probe_main`).
pub(super) fn flows(mode: BreakerMode, probe_main: bool, dlq_topic: bool) -> bool {
    if dlq_topic {
        matches!(mode, BreakerMode::Drain | BreakerMode::Probe)
    } else {
        mode == BreakerMode::Normal || (mode == BreakerMode::Probe && probe_main)
    }
}

impl Ctx {
    fn mode_allows(&self, topic: &str) -> bool {
        let (mode, main) = self
            .breakers
            .as_ref()
            .map_or((BreakerMode::Normal, false), |b| {
                (b.mode(), b.probe_main.load(Ordering::SeqCst))
            });
        flows(mode, main, self.drain_topics.contains(topic))
    }
}

impl ClientContext for Ctx {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        crate::kafka::KafkaQuiet(self.kafka_outage.clone()).log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        crate::kafka::KafkaQuiet(self.kafka_outage.clone()).error(error, reason);
    }

    /// librdkafka's statistics (every `statistics.interval.ms`): per-partition lag as gauges.
    fn stats(&self, stats: rdkafka::Statistics) {
        let now = now_ms();
        let last = self.last_final.lock().expect("last_final lock");
        for (topic, t) in &stats.topics {
            for (p, part) in &t.partitions {
                // Partition -1 is librdkafka's internal "unassigned" queue; -1 lag = unknown.
                if *p < 0 || part.consumer_lag < 0 {
                    continue;
                }
                let labels = [
                    ("topic", topic.clone()),
                    ("partition", p.to_string()),
                    ("group", self.group.clone()),
                ];
                metrics::gauge!(crate::metrics::CONSUMER_LAG, &labels)
                    .set(part.consumer_lag as f64);
                let secs = if part.consumer_lag == 0 {
                    0.0
                } else {
                    last.get(&(topic.clone(), *p))
                        .map_or(0.0, |ts| (now - ts).max(0) as f64 / 1000.0)
                };
                self.lag
                    .lock()
                    .expect("lag lock")
                    .insert(format!("{topic}/{p}"), (part.consumer_lag, secs));
                metrics::gauge!(crate::metrics::CONSUMER_LAG_SECONDS, &labels).set(secs);
            }
        }
    }
}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                // A pause set by us survives revoke and re-assign in librdkafka: lift it, or a
                // retry partition held until due (its queue is dropped below) would stay paused.
                let _ = c.resume(tpl);
                // librdkafka commits the stored offsets (final messages only) right after this.
                // Forget the trackers so late outcomes of revoked partitions store nothing.
                let mut p = self.partitions.lock().expect("partitions lock");
                for e in tpl.elements() {
                    let k = (e.topic().to_owned(), e.partition());
                    p.trackers.remove(&k);
                    p.revoked.push(k);
                }
                info!(partitions = tpl.count(), "partitions revoked");
            }
            Rebalance::Assign(tpl) => info!(partitions = tpl.count(), "partitions assigned"),
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
        }
    }

    fn post_rebalance(&self, c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.holds_stale.store(true, Ordering::SeqCst);
            if self.backpressure.load(Ordering::SeqCst) {
                // Backpressure is on: new partitions must not flow in unbounded.
                let _ = c.pause(tpl);
            } else if self.breakers.is_some() {
                self.assigned.store(true, Ordering::SeqCst);
                let mut held = TopicPartitionList::new();
                for e in tpl.elements() {
                    if !self.mode_allows(e.topic()) {
                        held.add_partition(e.topic(), e.partition());
                    }
                }
                let _ = c.pause(&held);
            }
        }
    }
}
