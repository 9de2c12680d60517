//! Running a job: the next letters, sending them paced and acknowledged, marking them after
//! the ack, the canary and the refail stop.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::*;
use crate::sql;

/// A letter to send.
pub(super) struct Item {
    pub(super) id: i64,
    pub(super) topic: String,
    pub(super) key: Option<Vec<u8>>,
    pub(super) body: Option<Vec<u8>>,
    pub(super) headers: Vec<(String, HeaderValue)>,
    pub(super) dlq_retries: i32,
    pub(super) first_failed_at: Option<String>,
}

impl Dlq {
    pub(super) async fn next_items(&self, job: i64, n: i64) -> Result<Vec<Item>, DlqError> {
        let c = self.pool.get().await?;
        // Letters dropped by an operator after the job froze them are not sent.
        c.execute(&self.sql(sql::replay_jobs::SKIP_DROPPED), &[&job])
            .await?;
        let rows = c
            .query(&self.sql(sql::replay_jobs::NEXT_PENDING), &[&job, &n])
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
    pub(super) async fn mark(
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
            tx.execute(&self.sql(sql::replay_jobs::MARK_SENT), &[&job, &ids, &at])
                .await?;
            tx.execute(&self.sql(sql::dead_letters::MARK_REPLAYED), &[&ids, &job])
                .await?;
            // Letters that failed again and were archived before this mark committed.
            for r in tx
                .query(&self.sql(sql::replay_jobs::LATE_COMEBACKS), &[&job, &ids])
                .await?
            {
                let topic: String = r.get(0);
                metrics::counter!(crate::metrics::DLQ_REPLAY_CAME_BACK,
                    "topic" => crate::metrics::bounded("topic", &topic))
                .increment(1);
            }
        }
        for (id, err) in failed {
            tx.execute(
                &self.sql(sql::replay_jobs::MARK_FAILED),
                &[&job, id, &crate::wire::cut(err)],
            )
            .await?;
        }
        tx.execute(&self.sql(sql::replay_jobs::TOUCH), &[&job])
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
    /// [`DlqError::Conflict`] when the job has ended or another process runs it; Kafka and
    /// Postgres errors otherwise (the job stays `running` and can be resumed).
    pub async fn run_job(
        &self,
        kafka: &KafkaConfig,
        id: i64,
        stop: &CancellationToken,
        progress: &mut (dyn FnMut(&Progress) + Send),
    ) -> Result<RunOutcome, DlqError> {
        self.run_job_with(kafka, id, Start::Resume(None), stop, progress)
            .await
    }

    /// Runs a job just created: one an operator paused before its runner started stays
    /// paused (the outcome says so), where [`Dlq::run_job`] would resume it.
    ///
    /// # Errors
    /// As [`Dlq::run_job`].
    pub async fn run_new_job(
        &self,
        kafka: &KafkaConfig,
        id: i64,
        stop: &CancellationToken,
        progress: &mut (dyn FnMut(&Progress) + Send),
    ) -> Result<RunOutcome, DlqError> {
        self.run_job_with(kafka, id, Start::New, stop, progress)
            .await
    }

    /// Resumes job `id` as [`Dlq::run_job`] does, audited as `job-resume` by `actor` with
    /// `reason` in the same transaction as its status becoming `running` — once this runner
    /// holds the job, so a refused resume leaves no audit row.
    ///
    /// # Errors
    /// [`DlqError::Invalid`] for an empty actor or a bad reason, and as [`Dlq::run_job`].
    pub async fn resume_job(
        &self,
        kafka: &KafkaConfig,
        id: i64,
        actor: &str,
        reason: Option<&str>,
        stop: &CancellationToken,
        progress: &mut (dyn FnMut(&Progress) + Send),
    ) -> Result<RunOutcome, DlqError> {
        check_actor(actor)?;
        let reason = check_reason(reason)?.map(str::to_owned);
        let by = Some((actor.to_owned(), reason));
        self.run_job_with(kafka, id, Start::Resume(by), stop, progress)
            .await
    }

    pub(crate) async fn run_job_with(
        &self,
        kafka: &KafkaConfig,
        id: i64,
        start: Start,
        stop: &CancellationToken,
        progress: &mut (dyn FnMut(&Progress) + Send),
    ) -> Result<RunOutcome, DlqError> {
        // One runner per job: a session lock on a connection taken out of the pool, released
        // when this run ends or its process dies.
        let lock_conn = deadpool_postgres::Object::take(self.pool.get().await?);
        let locked: bool = lock_conn
            .query_one(sql::locks::RUN_JOB, &[&self.schema.name(), &id])
            .await?
            .get(0);
        if !locked {
            return conflict(format!("job {id} is being run by another process"));
        }
        let job = self.job(id).await?;
        match job.status {
            JobStatus::Pending | JobStatus::Running | JobStatus::Paused => {}
            s => {
                return conflict(
                    format!("job {id} is {s:?}: only pending, running or paused jobs run")
                        .to_lowercase(),
                )
            }
        }
        let audit = match &start {
            // Paused before its first runner started: the operator's pause holds.
            Start::New if job.status == JobStatus::Paused => {
                return Ok(RunOutcome::Paused(job.status_reason.unwrap_or_default()));
            }
            Start::New | Start::Resume(None) => None,
            Start::Resume(Some((actor, reason))) => {
                Some(("job-resume", actor.as_str(), reason.as_deref()))
            }
        };
        self.set_status_audited(
            id,
            &["pending", "running", "paused"],
            "running",
            None,
            audit,
        )
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
                    let why = format!(
                        "{CANARY_FAILED}{back} of {sent} replayed letters came back to the DLQ"
                    );
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

    pub(super) async fn canary_done(&self, id: i64) -> Result<(), DlqError> {
        let c = self.pool.get().await?;
        c.execute(&self.sql(sql::replay_jobs::CANARY_DONE), &[&id])
            .await?;
        Ok(())
    }

    /// Paused or cancelled from elsewhere, or interrupted here (then paused).
    pub(super) async fn interrupted(
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
            .query_one(&self.sql(sql::replay_jobs::STATUS), &[&id])
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
    pub(super) async fn send_chunk(
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
            let (span, link) = crate::dlq::headers::replay_span(&it.topic, &it.headers);
            let headers = for_replay(
                &it.headers,
                i64::from(it.dlq_retries),
                it.first_failed_at.as_deref(),
                &rfc3339(now),
                Some((job, it.id)),
                link.as_deref(),
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
                Ok(fut) => pending.push((it.id, now, span, fut)),
                Err(e) => {
                    span.failed("enqueue", &e.to_string());
                    failed.push((it.id, e.to_string()));
                }
            }
        }
        let mut sent: Vec<(i64, SystemTime)> = Vec::with_capacity(pending.len());
        let (meta, futs): (Vec<_>, Vec<_>) = pending
            .into_iter()
            .map(|(i, t, s, f)| ((i, t, s), f))
            .unzip();
        for ((id, at, span), r) in meta.into_iter().zip(futures::future::join_all(futs).await) {
            match r {
                Ok(Ok(_)) => sent.push((id, at)),
                Ok(Err((e, _))) => {
                    span.failed("produce", &e.to_string());
                    failed.push((id, e.to_string()));
                }
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
