//! `outbox dlq archive`: consume dead-letter topics into `dead_letters`.
//!
//! The archiver reads the dead-letter topics it is given (or, asked explicitly, every topic
//! ending in the DLQ suffix) under a group that names its deployment (database and schema,
//! [`Archiver::default_group`]), so archivers of several deployments on one cluster never read
//! each other's letters or move each other's offsets. It inserts a batch of records in
//! one transaction (`ON CONFLICT (dlq_topic, partition, offset) DO NOTHING`), and commits the
//! batch's offsets only after that transaction committed. A crash between the two re-reads the
//! batch and inserts nothing twice; a crash before the insert loses nothing.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, SystemTime};

use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::message::BorrowedMessage;
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{info, warn};

use super::headers::{find, to_json};
use super::normalize::normalize_error;
use super::{invalid, Dlq, DlqError};
use crate::backoff::Backoff;
use crate::config::{DbConfig, KafkaConfig};
use crate::kafka::Raw;
use crate::sql;
use crate::wire::{
    DEFAULT_DLQ_SUFFIX, UNREADABLE_HEADERS, X_ATTEMPTS, X_CONSUMER_GROUP, X_DLQ_RETRIES, X_ERROR,
    X_ERROR_KIND, X_FAILED_AT, X_FIRST_FAILED_AT, X_ORIGINAL_OFFSET, X_ORIGINAL_PARTITION,
    X_ORIGINAL_TOPIC,
};
use crate::wire::{HEADER_MESSAGE_ID, HEADER_MESSAGE_TYPE};

/// The prefix of the archiver's consumer group: `outbox-dlq-archive.<database>.<schema>`.
pub const ARCHIVE_GROUP: &str = "outbox-dlq-archive";
/// Records per insert transaction.
const BATCH: usize = 500;
/// How long a batch may wait to fill before it is written.
const LINGER: Duration = Duration::from_millis(200);
/// `--once` gives up waiting for records it was told exist after this long without any (a
/// restart after a crash first waits out the dead member's 10 s session).
const ONCE_IDLE: Duration = Duration::from_secs(60);

/// What an archive run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ArchiveReport {
    /// Records read from DLQ topics.
    pub read: u64,
    /// Rows inserted.
    pub archived: u64,
    /// Records already archived (re-read after a crash or a second run).
    pub duplicates: u64,
}

/// Consumes dead-letter topics into the archive.
pub struct Archiver {
    dlq: Dlq,
    kafka: KafkaConfig,
    topics: Vec<String>,
    /// Dead-letter topic → the topic its letters came from, when a topics file says.
    origins: HashMap<String, String>,
    suffix: String,
    retention: Duration,
    group: String,
    db: DbConfig,
    /// Liveness (its loop, and the insert retries through a Postgres outage, beat) and
    /// readiness (Postgres and Kafka looked at while it runs).
    health: crate::health::Health,
}

/// How long the archiver's loop may stay silent before it is not live.
const ARCHIVER_ALLOWANCE: Duration = Duration::from_secs(120);

/// One archive row, parsed from a record.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub dlq_topic: String,
    pub partition: i32,
    pub offset: i64,
    pub original_topic: String,
    pub original_partition: Option<i32>,
    pub original_offset: Option<i64>,
    pub group: Option<String>,
    pub key: Option<Vec<u8>>,
    pub body: Option<Vec<u8>>,
    pub headers: serde_json::Value,
    pub message_type: Option<String>,
    pub message_id: Option<String>,
    pub error: Option<String>,
    pub error_group: String,
    pub error_kind: Option<String>,
    pub attempts: Option<i32>,
    pub dlq_retries: i32,
    pub first_failed_at: Option<SystemTime>,
    pub failed_at: SystemTime,
    /// The replay job and letter this record is a comeback of (`x-replay-job`, `x-replay-of`).
    pub replay_job: Option<i64>,
    pub replay_of: Option<i64>,
}

impl Row {
    /// The 21 insert parameters, in the column order of the archive's INSERTs.
    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 21] {
        [
            &self.dlq_topic,
            &self.partition,
            &self.offset,
            &self.original_topic,
            &self.original_partition,
            &self.original_offset,
            &self.group,
            &self.key,
            &self.body,
            &self.headers,
            &self.message_type,
            &self.message_id,
            &self.error,
            &self.error_group,
            &self.error_kind,
            &self.attempts,
            &self.dlq_retries,
            &self.first_failed_at,
            &self.failed_at,
            &self.replay_job,
            &self.replay_of,
        ]
    }

    pub(crate) fn from_message(m: &BorrowedMessage<'_>, suffix: &str) -> Self {
        Self::from_raw(&Raw::from_message(m), suffix)
    }

    /// The archive row of a record read from a DLQ topic.
    pub(crate) fn from_raw(r: &Raw, suffix: &str) -> Self {
        Self::from_parts(
            &r.topic,
            r.partition,
            r.offset,
            r.key.clone(),
            r.payload.clone(),
            &r.headers,
            r.time(),
            suffix,
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_parts(
        topic: &str,
        partition: i32,
        offset: i64,
        key: Option<Vec<u8>>,
        body: Option<Vec<u8>>,
        headers: &[(String, Option<Vec<u8>>)],
        record_time: Option<SystemTime>,
        suffix: &str,
    ) -> Self {
        // Text columns cannot hold NUL (a hostile or broken producer): replaced, never fatal.
        let h = |n: &str| find(headers, n).map(super::headers::no_nul);
        let time = |n: &str| find(headers, n).and_then(|v| humantime::parse_rfc3339_weak(v).ok());
        let error = h(X_ERROR).or_else(|| {
            headers
                .iter()
                .any(|(k, _)| k == UNREADABLE_HEADERS)
                .then(|| "a header name is not valid UTF-8".to_owned())
        });
        // Headers are whatever the record's producer wrote. A DLQ topic is named after the
        // topic its letters came from: that name wins over the header (a replay goes there,
        // so a header must not choose where); the header serves only for a DLQ topic of
        // another suffix, and only when it is a valid topic name.
        let original_topic = match topic.strip_suffix(&format!(".{suffix}")) {
            Some(t) if !t.is_empty() => t.to_owned(),
            _ => h(X_ORIGINAL_TOPIC)
                .filter(|t| crate::topic::validate_topic(t).is_ok())
                .unwrap_or_else(|| topic.to_owned()),
        };
        let now = SystemTime::now();
        // A letter cannot have failed in the future, nor first failed after it failed.
        let failed_at = time(X_FAILED_AT).or(record_time).unwrap_or(now).min(now);
        let first_failed_at = time(X_FIRST_FAILED_AT).map(|t| t.min(failed_at));
        Self {
            dlq_topic: topic.to_owned(),
            partition,
            offset,
            original_topic,
            original_partition: h(X_ORIGINAL_PARTITION).and_then(|v| v.parse().ok()),
            original_offset: h(X_ORIGINAL_OFFSET).and_then(|v| v.parse().ok()),
            // A group name as Kafka allows it (at most 255 characters, printable).
            group: h(X_CONSUMER_GROUP)
                .filter(|g| g.chars().count() <= 255 && !g.chars().any(char::is_control)),
            key,
            body,
            headers: to_json(headers),
            message_type: h(HEADER_MESSAGE_TYPE),
            message_id: h(HEADER_MESSAGE_ID),
            error_group: error.as_deref().map(normalize_error).unwrap_or_default(),
            error,
            // The kinds the framework writes; anything else is `unknown` (the header itself
            // stays in `headers`).
            error_kind: h(X_ERROR_KIND).map(|k| {
                if super::filter::KINDS.contains(&k.as_str()) {
                    k
                } else {
                    "unknown".to_owned()
                }
            }),
            attempts: h(X_ATTEMPTS).and_then(|v| v.parse().ok()),
            dlq_retries: h(X_DLQ_RETRIES).and_then(|v| v.parse().ok()).unwrap_or(0),
            first_failed_at,
            failed_at,
            replay_job: h(crate::wire::X_REPLAY_JOB).and_then(|v| v.parse().ok()),
            replay_of: h(crate::wire::X_REPLAY_OF).and_then(|v| v.parse().ok()),
        }
    }
}

type Tp = (String, i32);

impl Archiver {
    /// An archiver of the dead-letter topics `topics` (say which: a cluster shared by several
    /// deployments holds other teams' letters too; [`Archiver::every_dlq_topic`] reads them
    /// all, explicitly).
    ///
    /// # Errors
    /// [`DlqError::Invalid`] for no topic or an invalid topic name.
    pub fn new(db: &DbConfig, kafka: &KafkaConfig, topics: Vec<String>) -> Result<Self, DlqError> {
        if topics.is_empty() {
            return invalid(
                "name the dead-letter topics to archive (a topics file or topic names); \
                 reading every DLQ topic on the cluster must be asked for explicitly",
            );
        }
        for t in &topics {
            if let Err(e) = crate::topic::validate_topic(t) {
                return invalid(e.to_string());
            }
        }
        Ok(Self::of(db, kafka, topics))
    }

    /// An archiver of every topic on the cluster ending in the DLQ suffix, new ones included.
    /// On a cluster shared by several deployments it archives their letters too: prefer
    /// [`Archiver::new`] with this deployment's topics.
    pub fn every_dlq_topic(db: &DbConfig, kafka: &KafkaConfig) -> Self {
        Self::of(db, kafka, Vec::new())
    }

    fn of(db: &DbConfig, kafka: &KafkaConfig, topics: Vec<String>) -> Self {
        Self {
            dlq: Dlq::new(db),
            kafka: kafka.clone(),
            topics,
            origins: HashMap::new(),
            suffix: DEFAULT_DLQ_SUFFIX.into(),
            retention: crate::cleanup::DEFAULT_ARCHIVE_RETENTION,
            group: Self::default_group(db),
            db: db.clone(),
            health: crate::health::Health::new(),
        }
    }

    /// This archiver's health, to answer probes (`outbox dlq archive --metrics-addr` serves it
    /// as `/healthz` and `/readyz`): live while its loop turns, also while it waits out an
    /// outage; ready while [`Archiver::run`] runs, not shutting down, and Postgres and Kafka
    /// answered their last look.
    pub fn health(&self) -> crate::health::Health {
        self.health.clone()
    }

    /// The default consumer group: [`ARCHIVE_GROUP`]`.<database>.<schema>`, one per
    /// deployment (a deployment is an outbox schema in a database).
    pub fn default_group(db: &DbConfig) -> String {
        format!(
            "{ARCHIVE_GROUP}.{}.{}",
            db.database_name().unwrap_or("postgres"),
            db.schema.name()
        )
    }

    /// The topic each dead-letter topic's letters came from (`(dlq topic, origin)`, as
    /// [`crate::topics::dead_letter_topics`] reads them from a topics file): what a letter's
    /// original topic is, whatever its suffix and whatever its headers claim.
    #[must_use]
    pub fn origins(mut self, pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        self.origins.extend(pairs);
        self
    }

    /// The archive row of record `m`, its origin as the topics file names it when it does.
    fn row(&self, m: &BorrowedMessage<'_>) -> Row {
        let mut row = Row::from_message(m, &self.suffix);
        if let Some(origin) = self.origins.get(&row.dlq_topic) {
            row.original_topic.clone_from(origin);
        }
        row
    }

    /// Dead-letter topic suffix (default `dlq`), for "every DLQ topic" and original topics.
    #[must_use]
    pub fn suffix(mut self, suffix: &str) -> Self {
        self.suffix = suffix.into();
        self
    }

    /// Retention of settled letters, purged hourly by [`Archiver::run`].
    #[must_use]
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The consumer group (default [`Archiver::default_group`]).
    #[must_use]
    pub fn group(mut self, group: &str) -> Self {
        self.group = group.into();
        self
    }

    fn consumer(&self) -> Result<StreamConsumer, DlqError> {
        // By name, never librdkafka's message (it quotes the value, maybe a secret).
        self.kafka
            .validate()
            .map_err(|e| DlqError::Invalid(e.to_string()))?;
        let mut cc = self.kafka.client_config();
        cc.set("group.id", &self.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("allow.auto.create.topics", "false")
            // A tool restarted after a crash waits for its dead predecessor's session to
            // expire before it gets partitions: keep that short.
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "2000")
            // New DLQ topics are picked up by the pattern subscription within this period.
            .set("topic.metadata.refresh.interval.ms", "30000");
        Ok(cc.create()?)
    }

    /// DLQ topics on the cluster now: the configured ones, or every `*.<suffix>`.
    fn topics_now(&self, c: &StreamConsumer) -> Result<Vec<String>, DlqError> {
        if !self.topics.is_empty() {
            return Ok(self.topics.clone());
        }
        let md = c
            .client()
            .fetch_metadata(None, Timeout::After(Duration::from_secs(15)))?;
        let end = format!(".{}", self.suffix);
        let mut v: Vec<String> = md
            .topics()
            .iter()
            .map(|t| t.name().to_owned())
            .filter(|n| n.ends_with(&end) && !n.starts_with("__"))
            .collect();
        v.sort();
        Ok(v)
    }

    /// Archives every record present when it starts, then returns (`--once`).
    ///
    /// # Errors
    /// [`DlqError`] when Kafka or Postgres fail for good; rows already archived stay.
    pub async fn run_once(
        &self,
        progress: &mut (dyn FnMut(&ArchiveReport, Option<u64>) + Send),
    ) -> Result<ArchiveReport, DlqError> {
        let c = self.consumer()?;
        let topics = self.topics_now(&c)?;
        let mut report = ArchiveReport::default();
        if topics.is_empty() {
            return Ok(report);
        }
        // The end to reach: high watermarks now. Records arriving later wait for the next run.
        let mut high: HashMap<Tp, (i64, i64)> = HashMap::new();
        for t in &topics {
            let md = c
                .client()
                .fetch_metadata(Some(t), Timeout::After(Duration::from_secs(15)))?;
            let Some(mt) = md.topics().first() else {
                continue;
            };
            if let Some(e) = mt.error() {
                return invalid(format!("topic {t}: {e:?}"));
            }
            for p in mt.partitions() {
                let w = c.fetch_watermarks(t, p.id(), Timeout::After(Duration::from_secs(15)))?;
                high.insert((t.clone(), p.id()), w);
            }
        }
        let total: i64 = high.values().map(|(lo, hi)| hi - lo).sum();
        c.subscribe(&topics.iter().map(String::as_str).collect::<Vec<_>>())?;
        let mut done_to: HashMap<Tp, i64> = HashMap::new();
        let mut seen_assignment: Option<HashSet<Tp>> = None;
        let mut batch: Vec<Row> = Vec::new();
        let mut last_record = tokio::time::Instant::now();
        // A batch is written when full or LINGER after its first record, however the records
        // trickle in.
        let mut flush_at = tokio::time::Instant::now() + LINGER;
        loop {
            if batch.is_empty() {
                flush_at = tokio::time::Instant::now() + LINGER;
            }
            match tokio::time::timeout_at(flush_at, c.recv()).await {
                Ok(Ok(m)) => {
                    last_record = tokio::time::Instant::now();
                    batch.push(self.row(&m));
                    if batch.len() < BATCH && tokio::time::Instant::now() < flush_at {
                        continue;
                    }
                }
                Ok(Err(e)) => warn!(error = %e, "kafka error while archiving"),
                Err(_) => {}
            }
            for (tp, next) in self.flush(&c, &mut batch, &mut report).await? {
                done_to.insert(tp, next);
            }
            progress(&report, Some(u64::try_from(total).unwrap_or(0)));
            // Our share of the partitions (another archiver in the group may hold the rest).
            let assigned: HashSet<Tp> = c
                .assignment()?
                .elements()
                .iter()
                .map(|e| (e.topic().to_owned(), e.partition()))
                .collect();
            if assigned.is_empty() {
                if last_record.elapsed() > ONCE_IDLE {
                    warn!("no partitions assigned: another archiver holds them all");
                    break;
                }
                continue;
            }
            if seen_assignment.as_ref() != Some(&assigned) {
                // What the group committed before us counts as done.
                let tpl = crate::kafka::tpl_of(assigned.iter());
                if let Ok(committed) =
                    c.committed_offsets(tpl, Timeout::After(Duration::from_secs(10)))
                {
                    for e in committed.elements() {
                        if let Offset::Offset(o) = e.offset() {
                            let k = (e.topic().to_owned(), e.partition());
                            let v = done_to.entry(k).or_insert(o);
                            *v = (*v).max(o);
                        }
                    }
                }
                seen_assignment = Some(assigned.clone());
            }
            let finished = assigned.iter().all(|tp| match high.get(tp) {
                Some((lo, hi)) => done_to.get(tp).copied().unwrap_or(*lo).max(*lo) >= *hi,
                None => true,
            });
            if finished {
                break;
            }
            if last_record.elapsed() > ONCE_IDLE {
                warn!(
                    "no records for {ONCE_IDLE:?} before reaching the end seen at start; stopping"
                );
                break;
            }
        }
        c.unsubscribe();
        Ok(report)
    }

    /// Runs as a sidecar until `shutdown` resolves: archives as records arrive, picks up new
    /// DLQ topics, purges settled letters past retention every hour. On shutdown the current
    /// batch is written and committed.
    ///
    /// # Errors
    /// [`DlqError`] when the consumer cannot be created or subscribed.
    pub async fn run(
        &self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<ArchiveReport, DlqError> {
        let c = self.consumer()?;
        if self.topics.is_empty() {
            let pattern = format!("^.*\\.{}$", regex::escape(&self.suffix));
            c.subscribe(&[pattern.as_str()])?;
        } else {
            c.subscribe(&self.topics.iter().map(String::as_str).collect::<Vec<_>>())?;
        }
        info!(group = %self.group, topics = ?self.topics, "dlq archiver started");
        let mut report = ArchiveReport::default();
        let mut batch: Vec<Row> = Vec::new();
        let mut next_purge = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut next_gauges = tokio::time::Instant::now();
        let mut next_beat = tokio::time::Instant::now();
        // The overview shows this archiver alive (and a banner when none is).
        let beat = crate::instances::Heartbeat::new(
            self.dlq.pool.clone(),
            &self.dlq.schema,
            "archiver",
            &self.group,
        );
        tokio::pin!(shutdown);
        let stop_probing = tokio_util::sync::CancellationToken::new();
        let _probing = stop_probing.clone().drop_guard();
        crate::health::spawn_prober(
            self.health.clone(),
            self.dlq.pool.clone(),
            self.db.clone(),
            self.kafka.clone(),
            stop_probing,
        );
        let mut flush_at = tokio::time::Instant::now() + LINGER;
        loop {
            self.health.beat("archiver", ARCHIVER_ALLOWANCE);
            if batch.is_empty() {
                flush_at = tokio::time::Instant::now() + LINGER;
            }
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                r = tokio::time::timeout_at(flush_at, c.recv()) => match r {
                    Ok(Ok(m)) => {
                        batch.push(self.row(&m));
                        if batch.len() < BATCH && tokio::time::Instant::now() < flush_at {
                            continue;
                        }
                    }
                    Ok(Err(e)) => warn!(error = %e, "kafka error while archiving"),
                    Err(_) => {}
                },
            }
            self.flush(&c, &mut batch, &mut report).await?;
            if tokio::time::Instant::now() >= next_beat {
                next_beat = tokio::time::Instant::now() + crate::instances::HEARTBEAT_EVERY;
                beat.beat(serde_json::json!({
                    "archived": report.archived,
                    "duplicates": report.duplicates,
                    "topics": self.topics,
                }))
                .await;
            }
            if tokio::time::Instant::now() >= next_gauges {
                next_gauges = tokio::time::Instant::now() + Duration::from_secs(15);
                if let Err(e) = self.dlq.refresh_gauges().await {
                    warn!(error = %e, "dlq gauges not refreshed");
                }
            }
            if tokio::time::Instant::now() >= next_purge {
                next_purge = tokio::time::Instant::now() + Duration::from_secs(3600);
                match self.dlq.purge(self.retention, 5000, "archiver").await {
                    Ok(p) if p.deleted > 0 => info!(
                        deleted = p.deleted,
                        "purged settled dead letters past retention"
                    ),
                    Ok(_) => {}
                    Err(e) => warn!(error = %e, "purge failed; retried in an hour"),
                }
            }
        }
        self.health.stopping();
        self.flush(&c, &mut batch, &mut report).await?;
        beat.stopped().await;
        info!(
            archived = report.archived,
            duplicates = report.duplicates,
            "dlq archiver stopped"
        );
        Ok(report)
    }

    /// Inserts the batch (retrying through Postgres outages), then commits its offsets.
    /// Returns the committed next offsets.
    async fn flush(
        &self,
        c: &StreamConsumer,
        batch: &mut Vec<Row>,
        report: &mut ArchiveReport,
    ) -> Result<Vec<(Tp, i64)>, DlqError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let mut backoff = Backoff::default();
        let inserted = loop {
            match self.dlq.insert_rows(batch).await {
                Ok(n) => break n,
                Err(e) => {
                    let wait = backoff.next_delay();
                    if backoff.failures() == 1 {
                        warn!(error = %e, "archive insert failed; offsets stay put and the batch is retried");
                    }
                    // Waiting out an outage is being alive.
                    self.health.beat("archiver", ARCHIVER_ALLOWANCE);
                    tokio::time::sleep(wait).await;
                }
            }
        };
        report.read += batch.len() as u64;
        report.archived += inserted;
        report.duplicates += batch.len() as u64 - inserted;
        let mut next: HashMap<Tp, i64> = HashMap::new();
        for r in batch.iter() {
            let e = next.entry((r.dlq_topic.clone(), r.partition)).or_insert(0);
            *e = (*e).max(r.offset + 1);
        }
        batch.clear();
        let mut tpl = TopicPartitionList::new();
        for ((t, p), o) in &next {
            tpl.add_partition_offset(t, *p, Offset::Offset(*o))?;
        }
        if let Err(e) = c.commit(&tpl, CommitMode::Sync) {
            // The rows are in; a re-read after this inserts nothing twice.
            warn!(error = %e, "offset commit after archiving failed; the records will be re-read (no duplicates)");
        }
        Ok(next.into_iter().collect())
    }
}

impl Dlq {
    /// Records a letter settled outside an operator's action (a drain handled or dropped it):
    /// inserted with that status if the archive has not read it yet, updated otherwise.
    pub(crate) async fn record_settled(
        &self,
        r: &Row,
        status: &str,
        reason: &str,
    ) -> Result<(), DlqError> {
        let c = self.pool.get().await?;
        c.execute(
            &self.sql(sql::dead_letters::UPSERT_SETTLED),
            &[
                &r.params()[..],
                &[
                    &status as &(dyn tokio_postgres::types::ToSql + Sync),
                    &reason,
                ],
            ]
            .concat(),
        )
        .await?;
        Ok(())
    }

    /// Inserts archive rows in one transaction; returns how many were new.
    pub(crate) async fn insert_rows(&self, rows: &[Row]) -> Result<u64, DlqError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let stmt = tx.prepare(&self.sql(sql::dead_letters::ARCHIVE)).await?;
        // Pipelined on the one connection: one round trip's latency for the batch.
        let params: Vec<_> = rows.iter().map(Row::params).collect();
        let futs = params.iter().map(|p| tx.query_opt(&stmt, p));
        let inserted: Vec<i64> = futures::future::try_join_all(futs)
            .await?
            .into_iter()
            .flatten()
            .map(|r| r.get(0))
            .collect();
        let n = inserted.len() as u64;
        // Comebacks: a letter that is a replayed record failing again, matched to its job's
        // item (by the replay's headers, else by message id), also after the job ended.
        if !inserted.is_empty() {
            let back = tx
                .query(&self.sql(sql::replay_jobs::MATCH_COMEBACKS), &[&inserted])
                .await?;
            for r in &back {
                let (job, topic, running): (i64, String, bool) = (r.get(0), r.get(1), r.get(2));
                metrics::counter!(crate::metrics::DLQ_REPLAY_CAME_BACK, "topic" => crate::metrics::bounded("topic", &topic))
                    .increment(1);
                if !running {
                    tracing::warn!(job, %topic, "a letter of a finished replay job came back to the DLQ: the fix did not hold for it");
                }
            }
        }
        // Metrics: letters archived per topic, and letters whose cause is new to the archive.
        if !inserted.is_empty() {
            for r in tx
                .query(&self.sql(sql::dead_letters::NEW_CAUSES), &[&inserted])
                .await?
            {
                let topic: String = r.get(0);
                let (all, fresh): (i64, i64) = (r.get(1), r.get(2));
                let topic = crate::metrics::bounded("topic", &topic);
                metrics::counter!(crate::metrics::DLQ_ARCHIVED, "topic" => topic.clone())
                    .increment(all as u64);
                metrics::counter!(crate::metrics::DLQ_NEW_ERROR_GROUPS, "topic" => topic.clone())
                    .increment(fresh as u64);
                // The comeback series of the topic exists from its first letter on (at 0), so
                // the alert's increase() sees its first comeback.
                metrics::counter!(crate::metrics::DLQ_REPLAY_CAME_BACK, "topic" => topic)
                    .increment(0);
            }
        }
        tx.commit().await?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_without_framework_headers_is_still_archived_with_its_topic() {
        let r = Row::from_parts(
            "orders.created.dlq",
            0,
            7,
            None,
            Some(b"\xff".to_vec()),
            &[("x-error".into(), Some(b"order 12 failed".to_vec()))],
            None,
            "dlq",
        );
        assert_eq!(r.original_topic, "orders.created");
        assert_eq!(r.error_group, "order <n> failed");
        assert_eq!(r.dlq_retries, 0);
        assert!(r.group.is_none());
    }
}
