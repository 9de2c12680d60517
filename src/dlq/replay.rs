//! Replay is a job, not a loop.
//!
//! * **Frozen selection**: [`Dlq::create_job`] records the exact letters in `dlq_replay_items`
//!   in the same transaction as its audit row; letters dead-lettered later are never part of it.
//! * **Canary**: the first `canary` letters go first; the job waits `canary_wait` and pauses
//!   if any of them came back to the DLQ.
//! * **Refail stop**: when more than `max_refail` of the letters sent came back (same
//!   `message_id`, dead-lettered after the replay, seen by the archive), the job stops.
//! * **Throttle**: letters are sent on an absolute schedule of `rate` per second.
//! * **Ack before mark**: a letter becomes `replayed` only after the broker acknowledged it
//!   (idempotent producer, `acks=all`); a crash re-sends at most the letters acknowledged but
//!   not yet marked, which consumers' inboxes absorb (same `message_id`).
//! * **Durable**: jobs live in Postgres; one runner at a time (a session advisory lock); a job
//!   left `running` by a dead process is resumed with [`Dlq::run_job`].
//! * **Loop guard**: a letter whose message was already replayed `loop_guard` times is
//!   skipped (recorded as such) unless `force`.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::filter::{Filter, Status};
use super::headers::{for_replay, from_json, HeaderValue};
use super::query::{ts, ts_opt, LetterRow};
use super::{check_actor, invalid, not_found, Dlq, DlqError};
use crate::config::KafkaConfig;
use crate::message::rfc3339;
use crate::wire::X_FIRST_FAILED_AT;

/// Default replay rate, messages per second.
pub const DEFAULT_RATE: f64 = 100.0;
/// Default canary size.
pub const DEFAULT_CANARY: u32 = 10;
/// Default wait for the canary's outcome.
pub const DEFAULT_CANARY_WAIT: Duration = Duration::from_secs(30);
/// Default share of replayed letters that may come back before the job stops.
pub const DEFAULT_MAX_REFAIL: f64 = 0.10;
/// Default replay-loop guard: letters already replayed this often are skipped.
pub const DEFAULT_LOOP_GUARD: u32 = 3;
/// How often a running job looks for letters that came back.
const REFAIL_CHECK: Duration = Duration::from_secs(1);

/// How a replay job is made and run.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReplayOptions {
    /// Send to this topic instead of each letter's original topic.
    pub to_topic: Option<String>,
    /// Messages per second (default [`DEFAULT_RATE`]).
    pub rate: f64,
    /// At most this many letters (oldest first).
    pub limit: Option<i64>,
    /// Letters sent first, before the rest waits for their outcome (0 skips the canary).
    pub canary: u32,
    /// How long to wait for the canary's outcome.
    pub canary_wait: Duration,
    /// Stop when more than this share of sent letters came back (0.1 = 10 %).
    pub max_refail: f64,
    /// Skip letters already replayed this many times.
    pub loop_guard: u32,
    /// Replay letters the loop guard would skip.
    pub force: bool,
    /// Allow an unselective filter (every new letter).
    pub all: bool,
    /// Who asked (audit).
    pub actor: String,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            to_topic: None,
            rate: DEFAULT_RATE,
            limit: None,
            canary: DEFAULT_CANARY,
            canary_wait: DEFAULT_CANARY_WAIT,
            max_refail: DEFAULT_MAX_REFAIL,
            loop_guard: DEFAULT_LOOP_GUARD,
            force: false,
            all: false,
            actor: super::default_actor(),
        }
    }
}

impl ReplayOptions {
    fn validate(&self) -> Result<(), DlqError> {
        check_actor(&self.actor)?;
        if !(self.rate.is_finite() && self.rate > 0.0 && self.rate <= 1_000_000.0) {
            return invalid(format!(
                "invalid rate {}: give messages per second, 0 < rate <= 1000000",
                self.rate
            ));
        }
        if !(self.max_refail.is_finite() && (0.0..=1.0).contains(&self.max_refail)) {
            return invalid(format!(
                "invalid max refail {}: give a share between 0 and 1 (0.1 = 10 %)",
                self.max_refail
            ));
        }
        if self.limit.is_some_and(|l| l < 1) {
            return invalid("invalid limit: give at least 1");
        }
        if let Some(t) = &self.to_topic {
            crate::topic::validate_topic(t).map_err(|e| DlqError::Invalid(e.to_string()))?;
        }
        if self.canary_wait > Duration::from_secs(24 * 3600) {
            return invalid("invalid canary wait: at most 24h");
        }
        Ok(())
    }
}

/// What a replay would do, changing nothing.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DryRun {
    /// Letters that would be sent.
    pub count: i64,
    /// Letters the loop guard would skip.
    pub skipped_loop_guard: i64,
    /// Letters per target topic.
    pub by_topic: Vec<(String, i64)>,
    /// The first letters, oldest first (at most 20).
    pub sample: Vec<LetterRow>,
}

/// A replay job's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    /// Created, not started.
    Pending,
    /// Being run (or its runner died: resume it).
    Running,
    /// Paused by an operator, Ctrl-C or a failed canary; resumable.
    Paused,
    /// Cancelled; its unsent letters stay `new`.
    Cancelled,
    /// Stopped because too many letters came back.
    Stopped,
    /// Every letter sent (or failed/skipped).
    Completed,
}

impl JobStatus {
    fn parse(s: &str) -> Self {
        match s {
            "pending" => Self::Pending,
            "running" => Self::Running,
            "paused" => Self::Paused,
            "cancelled" => Self::Cancelled,
            "stopped" => Self::Stopped,
            _ => Self::Completed,
        }
    }
}

/// A replay job and its counts.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Job {
    /// Job id.
    pub id: i64,
    /// When it was created.
    pub created_at: String,
    /// Who created it.
    pub created_by: String,
    /// Its audit row.
    pub audit_id: i64,
    /// The selection and options, as applied.
    pub filter: Value,
    /// Target topic override.
    pub to_topic: Option<String>,
    /// Messages per second.
    pub rate: f64,
    /// Canary size.
    pub canary: i32,
    /// Canary wait in milliseconds.
    pub canary_wait_ms: i64,
    /// Whether the canary phase is over.
    pub canary_done: bool,
    /// Refail share that stops the job.
    pub max_refail: f64,
    /// State.
    pub status: JobStatus,
    /// Why it is in that state.
    pub status_reason: Option<String>,
    /// Last change.
    pub updated_at: String,
    /// Letters in the job.
    pub total: i64,
    /// Not yet sent.
    pub pending: i64,
    /// Sent and acknowledged.
    pub sent: i64,
    /// Could not be sent.
    pub failed: i64,
    /// Skipped by the loop guard.
    pub skipped: i64,
    /// Sent and dead-lettered again afterwards.
    pub came_back: i64,
}

/// A running job's counts, reported after each chunk.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Progress {
    /// The job.
    pub job_id: i64,
    /// Letters in the job (skipped ones included).
    pub total: u64,
    /// Sent and acknowledged (over the job's life).
    pub sent: u64,
    /// Could not be sent.
    pub failed: u64,
    /// Skipped by the loop guard.
    pub skipped: u64,
    /// Came back to the DLQ.
    pub came_back: u64,
}

/// How a run of a job ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", content = "reason", rename_all = "lowercase")]
pub enum RunOutcome {
    /// Every letter handled.
    Completed,
    /// Paused (operator, Ctrl-C, canary); resume later.
    Paused(String),
    /// Cancelled by an operator.
    Cancelled,
    /// Stopped: too many letters came back.
    Stopped(String),
}

/// A letter to send.
struct Item {
    id: i64,
    topic: String,
    key: Option<Vec<u8>>,
    body: Option<Vec<u8>>,
    headers: Vec<(String, HeaderValue)>,
    dlq_retries: i32,
    first_failed_at: Option<String>,
}

impl Dlq {
    /// The letters `filter` selects for a replay, with how often each was replayed.
    async fn selection(
        &self,
        client: &impl tokio_postgres::GenericClient,
        filter: &Filter,
        opts: &ReplayOptions,
    ) -> Result<Vec<(i64, i64, String)>, DlqError> {
        // Explicit ids may be replayed again (new or replayed); filters take new letters.
        let mut w = filter.to_where(
            "d",
            if filter.ids.is_empty() {
                Some(Status::New)
            } else {
                None
            },
        );
        let lim = w.push(opts.limit.unwrap_or(i64::MAX));
        let to = w.push(opts.to_topic.clone());
        let rows = client
            .query(
                &format!(
                    "SELECT d.id, coalesce({to}::text, d.original_topic) AS target,
                       (SELECT count(*) FROM {items} i JOIN {t} d2 ON d2.id = i.dead_letter_id
                         WHERE i.state = 'sent' AND (d2.id = d.id OR (d2.original_topic = d.original_topic
                               AND d2.message_id = d.message_id))) AS times_replayed
                     FROM {t} d
                     WHERE {w} AND d.status <> 'dropped'
                       AND NOT EXISTS (SELECT 1 FROM {items} i JOIN {jobs} j ON j.id = i.job_id
                                       WHERE i.dead_letter_id = d.id AND i.state = 'pending'
                                         AND j.status IN ('pending', 'running', 'paused'))
                     ORDER BY d.id LIMIT {lim}",
                    t = self.t("dead_letters"),
                    items = self.t("dlq_replay_items"),
                    jobs = self.t("dlq_replay_jobs"),
                    w = w.sql,
                ),
                &w.refs(),
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), r.get(2), r.get(1)))
            .collect())
    }

    fn prepare(filter: &Filter, opts: &ReplayOptions) -> Result<Filter, DlqError> {
        opts.validate()?;
        let filter = filter.clone().normalized()?;
        if !filter.is_selective() && !opts.all {
            return invalid(
                "refusing to replay with an empty filter: give --id or filters, or --all to replay every new letter",
            );
        }
        if filter.status == Some(Status::Dropped) {
            return invalid("dropped letters are not replayed");
        }
        Ok(filter)
    }

    /// What [`Dlq::create_job`] would select; changes nothing.
    ///
    /// # Errors
    /// [`DlqError::Invalid`] for a bad filter, options or id.
    pub async fn dry_run(&self, filter: &Filter, opts: &ReplayOptions) -> Result<DryRun, DlqError> {
        let filter = Self::prepare(filter, opts)?;
        let c = self.pool.get().await?;
        self.check_ids(&**c, &filter.ids, &[Status::New, Status::Replayed])
            .await?;
        let sel = self.selection(&**c, &filter, opts).await?;
        let guard = i64::from(opts.loop_guard);
        let go: Vec<&(i64, i64, String)> = sel
            .iter()
            .filter(|(_, n, _)| opts.force || *n < guard)
            .collect();
        let mut by_topic: HashMap<String, i64> = HashMap::new();
        for (_, _, t) in &go {
            *by_topic.entry(t.clone()).or_default() += 1;
        }
        let mut by_topic: Vec<(String, i64)> = by_topic.into_iter().collect();
        by_topic.sort();
        let sample_ids: Vec<i64> = go.iter().take(20).map(|(id, _, _)| *id).collect();
        let mut sample = if sample_ids.is_empty() {
            Vec::new()
        } else {
            self.list(
                &Filter {
                    ids: sample_ids,
                    ..Filter::default()
                },
                20,
                None,
            )
            .await?
        };
        sample.reverse();
        Ok(DryRun {
            count: go.len() as i64,
            skipped_loop_guard: (sel.len() - go.len()) as i64,
            by_topic,
            sample,
        })
    }

    /// Creates a replay job over the letters `filter` selects now (frozen), with its audit
    /// row, in one transaction. The job is `pending` until [`Dlq::run_job`].
    ///
    /// # Errors
    /// [`DlqError::Invalid`] for an empty or bad filter, bad options, an unknown or dropped
    /// id, or when nothing matches.
    pub async fn create_job(&self, filter: &Filter, opts: &ReplayOptions) -> Result<Job, DlqError> {
        let filter = Self::prepare(filter, opts)?;
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;
        // Job creations are serialised so two jobs never freeze the same letters.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('outbox-dlq-jobs:' || $1))",
            &[&self.schema.name()],
        )
        .await?;
        self.check_ids(&*tx, &filter.ids, &[Status::New, Status::Replayed])
            .await?;
        let sel = self.selection(&*tx, &filter, opts).await?;
        if sel.is_empty() {
            return not_found("no letters match: nothing to replay (already replayed or dropped letters need --id, or --status)");
        }
        let guard = i64::from(opts.loop_guard);
        let mut ids = Vec::with_capacity(sel.len());
        let mut states = Vec::with_capacity(sel.len());
        let mut errors: Vec<Option<String>> = Vec::with_capacity(sel.len());
        let mut go_ids = Vec::new();
        // Letters to send first (oldest first), skipped ones after: the canary is the first
        // `canary` items by seq, so it must be made of letters that are actually sent.
        let mut sel = sel;
        sel.sort_by_key(|(id, n, _)| (!(opts.force || *n < guard), *id));
        for (id, n, _) in &sel {
            ids.push(*id);
            if opts.force || *n < guard {
                states.push("pending".to_owned());
                errors.push(None);
                go_ids.push(*id);
            } else {
                states.push("skipped".to_owned());
                errors.push(Some(format!(
                    "loop guard: already replayed {n} times (use --force)"
                )));
            }
        }
        let recorded = json!({
            "filter": filter,
            "to": opts.to_topic,
            "rate": opts.rate,
            "limit": opts.limit,
            "canary": opts.canary,
            "canary_wait_ms": opts.canary_wait.as_millis() as u64,
            "max_refail": opts.max_refail,
            "loop_guard": opts.loop_guard,
            "force": opts.force,
            "all": opts.all,
        });
        let audit_id: i64 = tx
            .query_one(
                &format!(
                    "INSERT INTO {} (actor, action, filter, count, dead_letter_ids)
                     VALUES ($1, 'replay', $2, $3, $4) RETURNING id",
                    self.t("dlq_audit")
                ),
                &[&opts.actor, &recorded, &(go_ids.len() as i64), &go_ids],
            )
            .await?
            .get(0);
        let job_id: i64 = tx
            .query_one(
                &format!(
                    "INSERT INTO {} (created_by, audit_id, filter, to_topic, rate, canary,
                                     canary_wait_ms, max_refail)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
                    self.t("dlq_replay_jobs")
                ),
                &[
                    &opts.actor,
                    &audit_id,
                    &recorded,
                    &opts.to_topic,
                    &opts.rate,
                    &(i32::try_from(opts.canary).unwrap_or(i32::MAX)),
                    &(opts.canary_wait.as_millis() as i64),
                    &opts.max_refail,
                ],
            )
            .await?
            .get(0);
        tx.execute(
            &format!(
                "UPDATE {} SET reason = 'replay job ' || $2::bigint WHERE id = $1",
                self.t("dlq_audit")
            ),
            &[&audit_id, &job_id],
        )
        .await?;
        tx.execute(
            &format!(
                "INSERT INTO {} (job_id, dead_letter_id, seq, state, error)
                 SELECT $1, x.id, x.ord, x.state, x.error
                 FROM unnest($2::bigint[], $3::text[], $4::text[]) WITH ORDINALITY AS x(id, state, error, ord)",
                self.t("dlq_replay_items")
            ),
            &[&job_id, &ids, &states, &errors],
        )
        .await?;
        tx.commit().await?;
        info!(job = job_id, letters = go_ids.len(), skipped = sel.len() - go_ids.len(), actor = %opts.actor, "replay job created");
        self.job(job_id).await
    }

    /// One job with its counts.
    ///
    /// # Errors
    /// [`DlqError::Invalid`] when there is no such job.
    pub async fn job(&self, id: i64) -> Result<Job, DlqError> {
        self.jobs_where(Some(id), 1)
            .await?
            .pop()
            .map_or_else(|| not_found(format!("no replay job with id {id}")), Ok)
    }

    /// Jobs, newest first.
    ///
    /// # Errors
    /// [`DlqError`] when Postgres fails.
    pub async fn jobs(&self, limit: i64) -> Result<Vec<Job>, DlqError> {
        if !(1..=10_000).contains(&limit) {
            return invalid(format!("invalid limit {limit}: give 1 to 10000"));
        }
        self.jobs_where(None, limit).await
    }

    async fn jobs_where(&self, id: Option<i64>, limit: i64) -> Result<Vec<Job>, DlqError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                &format!(
                    "SELECT j.*, c.* FROM {jobs} j
                     CROSS JOIN LATERAL (
                       SELECT count(*) AS total,
                              count(*) FILTER (WHERE state = 'pending') AS pending,
                              count(*) FILTER (WHERE state = 'sent') AS sent,
                              count(*) FILTER (WHERE state = 'failed') AS failed,
                              count(*) FILTER (WHERE state = 'skipped') AS skipped,
                              count(*) FILTER (WHERE came_back_id IS NOT NULL) AS came_back
                       FROM {items} i WHERE i.job_id = j.id) c
                     WHERE $1::bigint IS NULL OR j.id = $1
                     ORDER BY j.id DESC LIMIT $2",
                    jobs = self.t("dlq_replay_jobs"),
                    items = self.t("dlq_replay_items"),
                ),
                &[&id, &limit],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| Job {
                id: r.get("id"),
                created_at: ts(r, "created_at"),
                created_by: r.get("created_by"),
                audit_id: r.get("audit_id"),
                filter: r.get("filter"),
                to_topic: r.get("to_topic"),
                rate: r.get("rate"),
                canary: r.get("canary"),
                canary_wait_ms: r.get("canary_wait_ms"),
                canary_done: r.get("canary_done"),
                max_refail: r.get("max_refail"),
                status: JobStatus::parse(r.get("status")),
                status_reason: r.get("status_reason"),
                updated_at: ts(r, "updated_at"),
                total: r.get("total"),
                pending: r.get("pending"),
                sent: r.get("sent"),
                failed: r.get("failed"),
                skipped: r.get("skipped"),
                came_back: r.get("came_back"),
            })
            .collect())
    }

    async fn set_status(
        &self,
        id: i64,
        from: &[&str],
        to: &str,
        reason: Option<&str>,
    ) -> Result<bool, DlqError> {
        let c = self.pool.get().await?;
        let from: Vec<String> = from.iter().map(|s| (*s).to_owned()).collect();
        let n = c
            .execute(
                &format!(
                    "UPDATE {} SET status = $2, status_reason = $3, updated_at = now()
                     WHERE id = $1 AND status = ANY($4)",
                    self.t("dlq_replay_jobs")
                ),
                &[&id, &to, &reason, &from],
            )
            .await?;
        Ok(n == 1)
    }

    /// Pauses a pending or running job (its runner stops after the letters in flight).
    ///
    /// # Errors
    /// [`DlqError::Invalid`] when the job does not exist or cannot be paused.
    pub async fn pause_job(&self, id: i64, actor: &str) -> Result<Job, DlqError> {
        check_actor(actor)?;
        let why = format!("paused by {actor}");
        if !self
            .set_status(id, &["pending", "running"], "paused", Some(&why))
            .await?
        {
            let j = self.job(id).await?;
            return invalid(
                format!(
                    "job {id} is {:?}: only pending or running jobs can be paused",
                    j.status
                )
                .to_lowercase(),
            );
        }
        self.job(id).await
    }

    /// Cancels a job; its unsent letters stay `new`.
    ///
    /// # Errors
    /// [`DlqError::Invalid`] when the job does not exist or has ended.
    pub async fn cancel_job(&self, id: i64, actor: &str) -> Result<Job, DlqError> {
        check_actor(actor)?;
        let why = format!("cancelled by {actor}");
        if !self
            .set_status(
                id,
                &["pending", "running", "paused"],
                "cancelled",
                Some(&why),
            )
            .await?
        {
            let j = self.job(id).await?;
            return invalid(format!("job {id} has ended ({:?})", j.status).to_lowercase());
        }
        self.job(id).await
    }

    /// Letters of `job` sent and since dead-lettered again: records them, returns
    /// (sent, came back) over the job, or over its first `first` letters.
    async fn refail(&self, job: i64, first: Option<i64>) -> Result<(i64, i64), DlqError> {
        let c = self.pool.get().await?;
        let (t, items) = (self.t("dead_letters"), self.t("dlq_replay_items"));
        let newly = c
            .execute(
                &format!(
                    "UPDATE {items} i SET came_back_id = x.back_id, came_back_at = now()
                 FROM (SELECT i2.dead_letter_id, min(d2.id) AS back_id
                       FROM {items} i2
                       JOIN {t} d ON d.id = i2.dead_letter_id
                       JOIN {t} d2 ON d2.message_id = d.message_id AND d2.id > d.id
                                  AND d2.failed_at >= i2.sent_at - interval '1 second'
                       WHERE i2.job_id = $1 AND i2.state = 'sent' AND i2.came_back_id IS NULL
                         AND d.message_id IS NOT NULL
                       GROUP BY 1) x
                 WHERE i.job_id = $1 AND i.dead_letter_id = x.dead_letter_id"
                ),
                &[&job],
            )
            .await?;
        metrics::counter!(crate::metrics::DLQ_REPLAY_CAME_BACK).increment(newly);
        let r = c
            .query_one(
                &format!(
                    "SELECT count(*) FILTER (WHERE state = 'sent'),
                            count(*) FILTER (WHERE came_back_id IS NOT NULL)
                     FROM {items} WHERE job_id = $1 AND ($2::bigint IS NULL OR seq <= $2)"
                ),
                &[&job, &first],
            )
            .await?;
        Ok((r.get(0), r.get(1)))
    }

    async fn progress(&self, job: i64) -> Result<Progress, DlqError> {
        let j = self.job(job).await?;
        Ok(Progress {
            job_id: job,
            total: j.total as u64,
            sent: j.sent as u64,
            failed: j.failed as u64,
            skipped: j.skipped as u64,
            came_back: j.came_back as u64,
        })
    }

    async fn next_items(&self, job: i64, n: i64) -> Result<Vec<Item>, DlqError> {
        let c = self.pool.get().await?;
        // Letters dropped by an operator after the job froze them are not sent.
        c.execute(
            &format!(
                "UPDATE {items} i SET state = 'skipped', error = 'dropped after the job was created'
                 FROM {t} d WHERE d.id = i.dead_letter_id AND i.job_id = $1 AND i.state = 'pending'
                   AND d.status = 'dropped'",
                items = self.t("dlq_replay_items"),
                t = self.t("dead_letters"),
            ),
            &[&job],
        )
        .await?;
        let rows = c
            .query(
                &format!(
                    "SELECT d.id, coalesce(j.to_topic, d.original_topic) AS topic, d.message_key,
                            d.body, d.headers, d.dlq_retries, coalesce(d.first_failed_at, d.failed_at) AS first_failed
                     FROM {items} i JOIN {t} d ON d.id = i.dead_letter_id
                     JOIN {jobs} j ON j.id = i.job_id
                     WHERE i.job_id = $1 AND i.state = 'pending' ORDER BY i.seq LIMIT $2",
                    items = self.t("dlq_replay_items"),
                    t = self.t("dead_letters"),
                    jobs = self.t("dlq_replay_jobs"),
                ),
                &[&job, &n],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                let headers = from_json(&r.get::<_, Value>("headers"));
                // Carry the header exactly as written when present (the re-processing envelope).
                let first = headers
                    .iter()
                    .find(|(k, _)| k == X_FIRST_FAILED_AT)
                    .and_then(|(_, v)| v.text().map(str::to_owned))
                    .or_else(|| ts_opt(r, "first_failed"));
                Item {
                    id: r.get("id"),
                    topic: r.get("topic"),
                    key: r.get("message_key"),
                    body: r.get("body"),
                    headers,
                    dlq_retries: r.get("dlq_retries"),
                    first_failed_at: first,
                }
            })
            .collect())
    }

    /// Records acknowledged and failed letters of one chunk in one transaction.
    async fn mark(
        &self,
        job: i64,
        sent: &[(i64, SystemTime)],
        failed: &[(i64, String)],
    ) -> Result<(), DlqError> {
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;
        if !sent.is_empty() {
            let ids: Vec<i64> = sent.iter().map(|s| s.0).collect();
            let at: Vec<SystemTime> = sent.iter().map(|s| s.1).collect();
            tx.execute(
                &format!(
                    "UPDATE {} i SET state = 'sent', sent_at = x.at
                     FROM unnest($2::bigint[], $3::timestamptz[]) AS x(id, at)
                     WHERE i.job_id = $1 AND i.dead_letter_id = x.id",
                    self.t("dlq_replay_items")
                ),
                &[&job, &ids, &at],
            )
            .await?;
            tx.execute(
                &format!(
                    "UPDATE {} SET status = 'replayed', status_at = now(),
                            status_reason = 'replay job ' || $2::bigint
                     WHERE id = ANY($1) AND status <> 'dropped'",
                    self.t("dead_letters")
                ),
                &[&ids, &job],
            )
            .await?;
        }
        for (id, err) in failed {
            tx.execute(
                &format!(
                    "UPDATE {} SET state = 'failed', error = $3 WHERE job_id = $1 AND dead_letter_id = $2",
                    self.t("dlq_replay_items")
                ),
                &[&job, id, &crate::wire::cut(err)],
            )
            .await?;
        }
        tx.execute(
            &format!(
                "UPDATE {} SET updated_at = now() WHERE id = $1",
                self.t("dlq_replay_jobs")
            ),
            &[&job],
        )
        .await?;
        tx.commit().await?;
        metrics::counter!(crate::metrics::DLQ_REPLAYED).increment(sent.len() as u64);
        Ok(())
    }

    /// Runs (or resumes) job `id` in this task until it completes, is paused, cancelled or
    /// stopped, or `stop` is cancelled (then it pauses after the letters in flight).
    /// `progress` is called after every chunk.
    ///
    /// # Errors
    /// [`DlqError::Invalid`] when the job has ended or another process runs it; Kafka and
    /// Postgres errors otherwise (the job stays `running` and can be resumed).
    pub async fn run_job(
        &self,
        kafka: &KafkaConfig,
        id: i64,
        stop: &CancellationToken,
        progress: &mut (dyn FnMut(&Progress) + Send),
    ) -> Result<RunOutcome, DlqError> {
        // One runner per job: a session lock on a connection taken out of the pool, released
        // when this run ends or its process dies.
        let lock_conn = deadpool_postgres::Object::take(self.pool.get().await?);
        let locked: bool = lock_conn
            .query_one(
                "SELECT pg_try_advisory_lock(hashtext('outbox-dlq-job:' || $1), ($2::bigint % 2147483647)::int)",
                &[&self.schema.name(), &id],
            )
            .await?
            .get(0);
        if !locked {
            return invalid(format!("job {id} is being run by another process"));
        }
        let job = self.job(id).await?;
        match job.status {
            JobStatus::Pending | JobStatus::Running | JobStatus::Paused => {}
            s => {
                return invalid(
                    format!("job {id} is {s:?}: only pending, running or paused jobs run")
                        .to_lowercase(),
                )
            }
        }
        self.set_status(id, &["pending", "running", "paused"], "running", None)
            .await?;
        info!(job = id, "replay job running");

        let pc = crate::kafka::idempotent_producer(kafka, Duration::from_secs(30), 5);
        let producer: FutureProducer = pc.create()?;
        let mut topics_ok: HashMap<String, bool> = HashMap::new();

        let chunk = ((job.rate / 5.0).ceil() as i64).clamp(1, 500);
        let mut pacer = Pacer::new(job.rate);
        // Counted here between the (once a second) reads of the job's aggregate counts, so a
        // large job does not re-count all its items after every chunk.
        let mut shown = self.progress(id).await?;
        let mut last_check = Instant::now();
        // The canary: the first letters alone, then a wait for their outcome.
        if job.canary > 0 && !job.canary_done {
            let canary = i64::from(job.canary);
            let mut left = canary - job.sent - job.failed;
            while left > 0 {
                let items = self.next_items(id, left.min(chunk)).await?;
                if items.is_empty() {
                    break;
                }
                left -= items.len() as i64;
                let (sent, failed) = self
                    .send_chunk(&producer, id, items, &mut pacer, &mut topics_ok)
                    .await?;
                shown.sent += sent;
                shown.failed += failed;
                progress(&shown);
            }
            let wait_until = Instant::now() + Duration::from_millis(job.canary_wait_ms as u64);
            info!(job = id, wait = ?Duration::from_millis(job.canary_wait_ms as u64), "canary sent; waiting for its outcome");
            loop {
                let (sent, back) = self.refail(id, Some(canary)).await?;
                if back > 0 {
                    let why =
                        format!("canary: {back} of {sent} replayed letters came back to the DLQ");
                    self.set_status(id, &["running"], "paused", Some(&why))
                        .await?;
                    self.canary_done(id).await?;
                    warn!(job = id, %why, "replay job paused");
                    progress(&self.progress(id).await?);
                    return Ok(RunOutcome::Paused(why));
                }
                if let Some(o) = self.interrupted(id, stop).await? {
                    return Ok(o);
                }
                if Instant::now() >= wait_until {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            self.canary_done(id).await?;
            pacer = Pacer::new(job.rate);
        }
        loop {
            if let Some(o) = self.interrupted(id, stop).await? {
                return Ok(o);
            }
            let items = self.next_items(id, chunk).await?;
            let finished = items.is_empty();
            if !finished {
                let (sent, failed) = self
                    .send_chunk(&producer, id, items, &mut pacer, &mut topics_ok)
                    .await?;
                shown.sent += sent;
                shown.failed += failed;
            }
            if finished || last_check.elapsed() >= REFAIL_CHECK {
                last_check = Instant::now();
                let (sent, back) = self.refail(id, None).await?;
                if sent > 0 && back as f64 / sent as f64 > job.max_refail {
                    let why = format!(
                        "{back} of {sent} replayed letters came back to the DLQ (more than {:.0} %)",
                        job.max_refail * 100.0
                    );
                    self.set_status(id, &["running"], "stopped", Some(&why))
                        .await?;
                    warn!(job = id, %why, "replay job stopped");
                    progress(&self.progress(id).await?);
                    return Ok(RunOutcome::Stopped(why));
                }
                shown = self.progress(id).await?;
            }
            progress(&shown);
            if finished {
                self.set_status(id, &["running"], "completed", None).await?;
                info!(job = id, "replay job completed");
                return Ok(RunOutcome::Completed);
            }
        }
    }

    async fn canary_done(&self, id: i64) -> Result<(), DlqError> {
        let c = self.pool.get().await?;
        c.execute(
            &format!(
                "UPDATE {} SET canary_done = true WHERE id = $1",
                self.t("dlq_replay_jobs")
            ),
            &[&id],
        )
        .await?;
        Ok(())
    }

    /// Paused or cancelled from elsewhere, or interrupted here (then paused).
    async fn interrupted(
        &self,
        id: i64,
        stop: &CancellationToken,
    ) -> Result<Option<RunOutcome>, DlqError> {
        if stop.is_cancelled() {
            self.set_status(id, &["running"], "paused", Some("interrupted"))
                .await?;
            return Ok(Some(RunOutcome::Paused("interrupted".into())));
        }
        // The status only (a primary-key read): the counts are not needed here.
        let c = self.pool.get().await?;
        let r = c
            .query_one(
                &format!(
                    "SELECT status, status_reason FROM {} WHERE id = $1",
                    self.t("dlq_replay_jobs")
                ),
                &[&id],
            )
            .await?;
        let reason: Option<String> = r.get(1);
        Ok(match JobStatus::parse(r.get(0)) {
            JobStatus::Paused => Some(RunOutcome::Paused(reason.unwrap_or_default())),
            JobStatus::Cancelled => Some(RunOutcome::Cancelled),
            _ => None,
        })
    }

    /// Sends one chunk on the pacer's schedule, waits for every ack, records the outcome;
    /// returns (sent, failed).
    async fn send_chunk(
        &self,
        producer: &FutureProducer,
        job: i64,
        items: Vec<Item>,
        pacer: &mut Pacer,
        topics_ok: &mut HashMap<String, bool>,
    ) -> Result<(u64, u64), DlqError> {
        let mut pending = Vec::with_capacity(items.len());
        let mut failed: Vec<(i64, String)> = Vec::new();
        for it in &items {
            let exists = match topics_ok.get(&it.topic) {
                Some(b) => *b,
                None => {
                    let b = topic_exists(producer, &it.topic)?;
                    topics_ok.insert(it.topic.clone(), b);
                    b
                }
            };
            if !exists {
                failed.push((it.id, format!("topic {} does not exist", it.topic)));
                continue;
            }
            pacer.wait().await;
            let now = SystemTime::now();
            let headers = for_replay(
                &it.headers,
                i64::from(it.dlq_retries),
                it.first_failed_at.as_deref(),
                &rfc3339(now),
            );
            let mut rec: FutureRecord<'_, [u8], [u8]> =
                FutureRecord::to(&it.topic).headers(headers);
            if let Some(k) = &it.key {
                rec = rec.key(k.as_slice());
            }
            if let Some(b) = &it.body {
                rec = rec.payload(b.as_slice());
            }
            match enqueue(producer, rec).await {
                Ok(fut) => pending.push((it.id, now, fut)),
                Err(e) => failed.push((it.id, e.to_string())),
            }
        }
        let mut sent: Vec<(i64, SystemTime)> = Vec::with_capacity(pending.len());
        let (meta, futs): (Vec<(i64, SystemTime)>, Vec<_>) =
            pending.into_iter().map(|(i, t, f)| ((i, t), f)).unzip();
        for ((id, at), r) in meta.into_iter().zip(futures::future::join_all(futs).await) {
            match r {
                Ok(Ok(_)) => sent.push((id, at)),
                Ok(Err((e, _))) => failed.push((id, e.to_string())),
                Err(_) => failed.push((id, "producer closed".into())),
            }
        }
        if !failed.is_empty() {
            warn!(job, failed = failed.len(), first = %failed[0].1, "letters could not be replayed");
        }
        self.mark(job, &sent, &failed).await?;
        Ok((sent.len() as u64, failed.len() as u64))
    }
}

/// Hands a record to librdkafka, waiting while its queue is full.
pub(crate) async fn enqueue(
    producer: &FutureProducer,
    mut rec: FutureRecord<'_, [u8], [u8]>,
) -> Result<rdkafka::producer::DeliveryFuture, rdkafka::error::KafkaError> {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    loop {
        match producer.send_result(rec) {
            Ok(f) => return Ok(f),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                rec = r;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err((e, _)) => return Err(e),
        }
    }
}

fn topic_exists(producer: &FutureProducer, topic: &str) -> Result<bool, DlqError> {
    use rdkafka::producer::Producer as _;
    let md = producer
        .client()
        .fetch_metadata(Some(topic), Timeout::After(Duration::from_secs(15)))?;
    Ok(md
        .topics()
        .first()
        .is_some_and(|t| t.error().is_none() && !t.partitions().is_empty()))
}

/// Sends on an absolute schedule: message n at start + n / rate, so the rate holds over any
/// window however long acks and marks take.
pub(crate) struct Pacer {
    start: Instant,
    n: u64,
    period: Duration,
}

impl Pacer {
    pub(crate) fn new(rate: f64) -> Self {
        Self {
            start: Instant::now(),
            n: 0,
            period: Duration::from_secs_f64(1.0 / rate),
        }
    }

    pub(crate) async fn wait(&mut self) {
        let at = self.start + self.period.mul_f64(self.n as f64);
        self.n += 1;
        tokio::time::sleep_until(at).await;
    }
}
