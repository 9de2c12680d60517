//! A job's state in Postgres: reading jobs, pausing, cancelling, and the counts (sent, came
//! back) its runner decides on.

use super::*;
use crate::sql;

/// The longest reason an operator may give for a job action (it is audited and shown).
pub const MAX_JOB_REASON: usize = 1000;

/// A job action's reason: trimmed, none when empty; refused when too long or with a NUL.
pub(crate) fn check_reason(reason: Option<&str>) -> Result<Option<&str>, DlqError> {
    match reason.map(str::trim) {
        None | Some("") => Ok(None),
        Some(r) if r.chars().count() > MAX_JOB_REASON || r.contains('\0') => invalid(format!(
            "invalid reason: at most {MAX_JOB_REASON} characters, no NUL"
        )),
        Some(r) => Ok(Some(r)),
    }
}

/// "paused by alice: the fix is not deployed yet": the job's status reason.
fn said(what: &str, actor: &str, reason: Option<&str>) -> String {
    match reason {
        Some(r) => format!("{what} by {actor}: {r}"),
        None => format!("{what} by {actor}"),
    }
}

impl Dlq {
    /// One job with its counts.
    ///
    /// # Errors
    /// [`DlqError::NotFound`] when there is no such job.
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
                canary_failed: r.get::<_, &str>("status") == "paused"
                    && r.get::<_, Option<&str>>("status_reason")
                        .is_some_and(|w| w.starts_with(CANARY_FAILED)),
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
        self.set_status_audited(id, from, to, reason, None).await
    }

    /// A status change and, when `audit` names an action and actor, its audit row, in one
    /// transaction: an operator's pause or cancel is on the record exactly when it happened.
    pub(super) async fn set_status_audited(
        &self,
        id: i64,
        from: &[&str],
        to: &str,
        reason: Option<&str>,
        audit: Option<(&str, &str, Option<&str>)>,
    ) -> Result<bool, DlqError> {
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;
        let from: Vec<String> = from.iter().map(|s| (*s).to_owned()).collect();
        let n = tx
            .execute(
                &self.sql(sql::replay_jobs::SET_STATUS),
                &[&id, &to, &reason, &from],
            )
            .await?;
        if n == 1 {
            if let Some((action, actor, why)) = audit {
                tx.execute(
                    &self.sql(sql::dead_letters::AUDIT_JOB_ACTION),
                    &[&actor, &action, &id, &why],
                )
                .await?;
            }
        }
        tx.commit().await?;
        Ok(n == 1)
    }

    /// Pauses a pending or running job (its runner stops after the letters in flight), audited
    /// with `reason`.
    ///
    /// # Errors
    /// [`DlqError::NotFound`] when the job does not exist, [`DlqError::Conflict`] when it
    /// cannot be paused.
    pub async fn pause_job(
        &self,
        id: i64,
        actor: &str,
        reason: Option<&str>,
    ) -> Result<Job, DlqError> {
        check_actor(actor)?;
        let reason = check_reason(reason)?;
        let why = said("paused", actor, reason);
        if !self
            .set_status_audited(
                id,
                &["pending", "running"],
                "paused",
                Some(&why),
                Some(("job-pause", actor, reason)),
            )
            .await?
        {
            let j = self.job(id).await?;
            return conflict(
                format!(
                    "job {id} is {:?}: only pending or running jobs can be paused",
                    j.status
                )
                .to_lowercase(),
            );
        }
        self.job(id).await
    }

    /// Cancels a job, audited with `reason`; its unsent letters stay `new`.
    ///
    /// # Errors
    /// [`DlqError::NotFound`] when the job does not exist, [`DlqError::Conflict`] when it has
    /// ended.
    pub async fn cancel_job(
        &self,
        id: i64,
        actor: &str,
        reason: Option<&str>,
    ) -> Result<Job, DlqError> {
        check_actor(actor)?;
        let reason = check_reason(reason)?;
        let why = said("cancelled", actor, reason);
        if !self
            .set_status_audited(
                id,
                &["pending", "running", "paused"],
                "cancelled",
                Some(&why),
                Some(("job-cancel", actor, reason)),
            )
            .await?
        {
            let j = self.job(id).await?;
            return conflict(format!("job {id} has ended ({:?})", j.status).to_lowercase());
        }
        self.job(id).await
    }

    /// A job's timeline: each status it took, when, and why, oldest first.
    ///
    /// # Errors
    /// [`DlqError::NotFound`] when there is no such job.
    pub async fn job_events(&self, id: i64) -> Result<Vec<JobEvent>, DlqError> {
        self.job(id).await?;
        let c = self.pool.get().await?;
        Ok(c.query(&self.sql(sql::replay_jobs::EVENTS), &[&id])
            .await?
            .iter()
            .map(|r| JobEvent {
                at: ts(r, "at"),
                status: r.get("status"),
                reason: r.get("reason"),
            })
            .collect())
    }

    /// A job's items in send order from `from_seq` on (at most `limit`, 1 to 1000): the letter
    /// each sent, its state, and the letter it came back as.
    ///
    /// # Errors
    /// [`DlqError::Invalid`] for a bad limit, [`DlqError::NotFound`] for an unknown job.
    pub async fn job_items(
        &self,
        id: i64,
        from_seq: i32,
        limit: i64,
    ) -> Result<Vec<JobItem>, DlqError> {
        if !(1..=1000).contains(&limit) {
            return invalid(format!("invalid limit {limit}: give 1 to 1000"));
        }
        self.job(id).await?;
        let c = self.pool.get().await?;
        Ok(c.query(
            &self.sql(sql::replay_jobs::ITEMS),
            &[&id, &from_seq, &limit],
        )
        .await?
        .iter()
        .map(|r| JobItem {
            seq: r.get("seq"),
            letter: r.get("dead_letter_id"),
            state: r.get("state"),
            sent_at: ts_opt(r, "sent_at"),
            error: r.get("error"),
            came_back_as: r.get("came_back_id"),
            came_back_at: ts_opt(r, "came_back_at"),
            came_back_error: r.get("came_back_error"),
            edited: r.get("edited"),
            topic: r.get("original_topic"),
            group: r.get("consumer_group"),
            kind: r.get("error_kind"),
            cause: r.get("error_group"),
            message_id: r.get("message_id"),
        })
        .collect())
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
