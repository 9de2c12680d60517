//! Choosing what a replay sends: the selection a filter makes, the dry run, and the job that
//! freezes it (items and audit row in one transaction).

use std::collections::HashMap;

use serde_json::json;
use tracing::info;

use super::*;

impl Dlq {
    /// The letters `filter` selects for a replay, with how often each was replayed.
    pub(super) async fn selection(
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

    pub(super) fn prepare(filter: &Filter, opts: &ReplayOptions) -> Result<Filter, DlqError> {
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
}
