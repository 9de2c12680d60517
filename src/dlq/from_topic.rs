//! `outbox dlq replay --from-topic T.dlq`: a replay straight from the dead-letter topic, for teams that
//! do not run the archive. Reads the DLQ topic under its own group ([`REPLAY_GROUP`]), sends
//! matching records to their original topic with the replay header rules, and commits the
//! group's offsets only after the broker acknowledged everything before them. Killed midway,
//! a second run resumes after the last committed record: nothing is lost; records acknowledged
//! but not yet committed are sent again (their consumers' inboxes absorb them).
//!
//! Records that do not match the filter are passed over (counted as `skipped`) and the group
//! moves past them: selective, repeatable replays are what the archive is for.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::message::Message as _;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::archive::Row;
use super::filter::Filter;
use super::headers::{for_replay, from_json};
use super::replay::{enqueue, Pacer};
use super::{invalid, DlqError};
use crate::config::KafkaConfig;
use crate::message::rfc3339;
use crate::wire::DEFAULT_DLQ_SUFFIX;

/// The consumer group of `--from-topic` replays.
pub const REPLAY_GROUP: &str = "outbox-dlq-replay";
/// A run gives up waiting for records it was told exist after this long without any.
/// (a restart after a crash first waits out the dead member's 10 s session).
const IDLE: Duration = Duration::from_secs(60);

/// Settings of a replay from a DLQ topic.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FromTopicOptions {
    /// Which records (ids are not allowed: the topic has offsets, not archive ids).
    pub filter: Filter,
    /// Send to this topic instead of each record's `x-original-topic`.
    pub to_topic: Option<String>,
    /// Messages per second.
    pub rate: f64,
    /// Replay at most this many.
    pub limit: Option<u64>,
    /// Count what would go; send and commit nothing.
    pub dry_run: bool,
    /// The consumer group (default [`REPLAY_GROUP`]).
    pub group: String,
}

impl Default for FromTopicOptions {
    fn default() -> Self {
        Self {
            filter: Filter::default(),
            to_topic: None,
            rate: super::DEFAULT_RATE,
            limit: None,
            dry_run: false,
            group: REPLAY_GROUP.into(),
        }
    }
}

/// What a replay from a topic did.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct FromTopicReport {
    /// Records read.
    pub read: u64,
    /// Sent and acknowledged (with `dry_run`: would be sent).
    pub replayed: u64,
    /// Not matching the filter.
    pub skipped: u64,
    /// Could not be sent (the run stops at the first failed chunk; offsets stay before it).
    pub failed: u64,
}

fn matches(f: &Filter, r: &Row) -> bool {
    let time = |s: &Option<String>| {
        s.as_deref()
            .and_then(|s| humantime::parse_rfc3339_weak(s).ok())
    };
    f.topic.as_ref().is_none_or(|t| *t == r.original_topic)
        && f.group.as_ref().is_none_or(|g| r.group.as_ref() == Some(g))
        && f.kind
            .as_ref()
            .is_none_or(|k| r.error_kind.as_ref() == Some(k))
        && f.error_group.as_ref().is_none_or(|g| *g == r.error_group)
        && f.error_contains.as_ref().is_none_or(|s| {
            r.error
                .as_deref()
                .is_some_and(|e| e.to_lowercase().contains(&s.to_lowercase()))
        })
        && time(&f.since).is_none_or(|t| r.failed_at >= t)
        && time(&f.until).is_none_or(|t| r.failed_at < t)
}

/// Replays `dlq_topic`'s records present at the start (see the module docs).
///
/// # Errors
/// [`DlqError::Invalid`] for bad options or a missing topic; Kafka errors otherwise.
pub async fn replay_from_topic(
    kafka: &KafkaConfig,
    dlq_topic: &str,
    opts: &FromTopicOptions,
    stop: &CancellationToken,
    progress: &mut (dyn FnMut(&FromTopicReport, u64) + Send),
) -> Result<FromTopicReport, DlqError> {
    crate::topic::validate_topic(dlq_topic).map_err(|e| DlqError::Invalid(e.to_string()))?;
    if !opts.filter.ids.is_empty() {
        return invalid("--id selects archived letters; --from-topic takes filters only");
    }
    let filter = opts.filter.clone().normalized()?;
    if !(opts.rate.is_finite() && opts.rate > 0.0) {
        return invalid(format!("invalid rate {}", opts.rate));
    }
    if let Some(t) = &opts.to_topic {
        crate::topic::validate_topic(t).map_err(|e| DlqError::Invalid(e.to_string()))?;
    }
    let mut cc = kafka.client_config();
    cc.set("group.id", &opts.group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("allow.auto.create.topics", "false")
        // A tool restarted after a crash waits for its dead predecessor's session to
        // expire before it gets partitions: keep that short.
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "2000");
    let c: StreamConsumer = cc.create()?;
    let md = c
        .client()
        .fetch_metadata(Some(dlq_topic), Timeout::After(Duration::from_secs(15)))?;
    let Some(mt) = md
        .topics()
        .first()
        .filter(|t| t.error().is_none() && !t.partitions().is_empty())
    else {
        return invalid(format!("topic {dlq_topic} does not exist"));
    };
    let mut end: HashMap<i32, (i64, i64)> = HashMap::new();
    for p in mt.partitions() {
        end.insert(
            p.id(),
            c.fetch_watermarks(dlq_topic, p.id(), Timeout::After(Duration::from_secs(15)))?,
        );
    }
    let total: u64 = end.values().map(|(lo, hi)| (hi - lo) as u64).sum();
    let pc = crate::kafka::idempotent_producer(kafka, Duration::from_secs(30), 5);
    let producer: FutureProducer = pc.create()?;
    c.subscribe(&[dlq_topic])?;

    let chunk = ((opts.rate / 5.0).ceil() as usize).clamp(1, 500);
    let mut pacer = Pacer::new(opts.rate);
    let mut report = FromTopicReport::default();
    let mut done_to: HashMap<i32, i64> = HashMap::new();
    let mut committed_read = false;
    let mut last_record = tokio::time::Instant::now();
    let mut targets: HashMap<String, bool> = HashMap::new();
    'outer: loop {
        // One chunk: read, send matching records, wait for acks, commit.
        let mut read: Vec<(i32, i64)> = Vec::new();
        let mut futs = Vec::new();
        while read.len() < chunk {
            if stop.is_cancelled()
                || opts
                    .limit
                    .is_some_and(|l| report.replayed + futs.len() as u64 >= l)
            {
                break;
            }
            let m = match tokio::time::timeout(Duration::from_millis(300), c.recv()).await {
                Ok(Ok(m)) => m,
                Ok(Err(e)) => {
                    warn!(error = %e, "kafka error during replay");
                    break;
                }
                Err(_) => break,
            };
            last_record = tokio::time::Instant::now();
            report.read += 1;
            read.push((m.partition(), m.offset()));
            let row = Row::from_message(&m, DEFAULT_DLQ_SUFFIX);
            if !matches(&filter, &row) {
                report.skipped += 1;
                continue;
            }
            if opts.dry_run {
                report.replayed += 1;
                continue;
            }
            let target = opts
                .to_topic
                .clone()
                .unwrap_or_else(|| row.original_topic.clone());
            let exists = match targets.get(&target) {
                Some(b) => *b,
                None => {
                    use rdkafka::producer::Producer as _;
                    let md = producer
                        .client()
                        .fetch_metadata(Some(&target), Timeout::After(Duration::from_secs(15)))?;
                    let b = md
                        .topics()
                        .first()
                        .is_some_and(|t| t.error().is_none() && !t.partitions().is_empty());
                    targets.insert(target.clone(), b);
                    b
                }
            };
            if !exists {
                report.failed += 1;
                read.pop();
                warn!(%target, "target topic does not exist; stopping before this record");
                break 'outer;
            }
            pacer.wait().await;
            let original = from_json(&row.headers);
            let (span, link) = crate::dlq::headers::replay_span(&target, &original);
            let headers = for_replay(
                &original,
                i64::from(row.dlq_retries),
                row.first_failed_at.map(rfc3339).as_deref(),
                &rfc3339(SystemTime::now()),
                // No archive job or letter to name: a comeback is matched by message id.
                None,
                link.as_deref(),
            );
            // Ends once the record is handed over: this path waits for its acks in bulk.
            drop(span);
            let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&target).headers(headers);
            if let Some(k) = &row.key {
                rec = rec.key(k.as_slice());
            }
            if let Some(b) = &row.body {
                rec = rec.payload(b.as_slice());
            }
            let fut = enqueue(&producer, rec).await?;
            futs.push((m.partition(), m.offset(), fut));
        }
        // Acks, then the commit: never past a record whose copy is not acknowledged.
        let mut first_failed: HashMap<i32, i64> = HashMap::new();
        let (meta, fs): (Vec<(i32, i64)>, Vec<_>) =
            futs.into_iter().map(|(p, o, f)| ((p, o), f)).unzip();
        for ((p, o), r) in meta.into_iter().zip(futures::future::join_all(fs).await) {
            match r {
                Ok(Ok(_)) => report.replayed += 1,
                Ok(Err((e, _))) => {
                    report.failed += 1;
                    warn!(partition = p, offset = o, error = %e, "replay of a record failed; stopping before it");
                    let f = first_failed.entry(p).or_insert(o);
                    *f = (*f).min(o);
                }
                Err(_) => {
                    report.failed += 1;
                    let f = first_failed.entry(p).or_insert(o);
                    *f = (*f).min(o);
                }
            }
        }
        if !opts.dry_run && !read.is_empty() {
            let mut next: HashMap<i32, i64> = HashMap::new();
            for (p, o) in &read {
                if first_failed.get(p).is_some_and(|f| o >= f) {
                    continue;
                }
                let e = next.entry(*p).or_insert(0);
                *e = (*e).max(o + 1);
            }
            for (p, f) in &first_failed {
                next.insert(*p, *f);
            }
            let mut tpl = TopicPartitionList::new();
            for (p, o) in &next {
                tpl.add_partition_offset(dlq_topic, *p, Offset::Offset(*o))?;
                done_to.insert(*p, *o);
            }
            if tpl.count() > 0 {
                c.commit(&tpl, CommitMode::Sync)?;
            }
        } else {
            for (p, o) in &read {
                let e = done_to.entry(*p).or_insert(0);
                *e = (*e).max(o + 1);
            }
        }
        progress(&report, total);
        if !first_failed.is_empty()
            || stop.is_cancelled()
            || opts.limit.is_some_and(|l| report.replayed >= l)
        {
            break;
        }
        let assigned: Vec<i32> = c
            .assignment()?
            .elements()
            .iter()
            .map(|e| e.partition())
            .collect();
        if assigned.is_empty() {
            if last_record.elapsed() > IDLE {
                break;
            }
            continue;
        }
        if !committed_read {
            committed_read = true;
            let mut tpl = TopicPartitionList::new();
            for p in &assigned {
                tpl.add_partition(dlq_topic, *p);
            }
            if let Ok(cm) = c.committed_offsets(tpl, Timeout::After(Duration::from_secs(10))) {
                for e in cm.elements() {
                    if let Offset::Offset(o) = e.offset() {
                        let v = done_to.entry(e.partition()).or_insert(o);
                        *v = (*v).max(o);
                    }
                }
            }
        }
        let finished = assigned.iter().all(|p| match end.get(p) {
            Some((lo, hi)) => done_to.get(p).copied().unwrap_or(*lo).max(*lo) >= *hi,
            None => true,
        });
        if finished || last_record.elapsed() > IDLE {
            break;
        }
    }
    c.unsubscribe();
    Ok(report)
}
