//! A job's state in Postgres: reading jobs, pausing, cancelling, and the counts (sent, came
//! back) its runner decides on.

use super::*;
use crate::sql;

impl Dlq {
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

    pub(super) async fn jobs_where(
        &self,
        id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<Job>, DlqError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(&self.sql(sql::replay_jobs::JOBS), &[&id, &limit])
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

    pub(super) async fn set_status(
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
                &self.sql(sql::replay_jobs::SET_STATUS),
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
    pub(super) async fn refail(
        &self,
        job: i64,
        first: Option<i64>,
    ) -> Result<(i64, i64), DlqError> {
        // The archiver matches comebacks as it archives them (it sees every letter, also after
        // the job ended); the job only reads the count.
        let c = self.pool.get().await?;
        let r = c
            .query_one(
                &self.sql(sql::replay_jobs::SENT_AND_CAME_BACK),
                &[&job, &first],
            )
            .await?;
        Ok((r.get(0), r.get(1)))
    }

    pub(super) async fn progress(&self, job: i64) -> Result<Progress, DlqError> {
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
}
