//! Choosing what a replay sends: the selection a filter makes, the dry run, and the job that
//! freezes it (items and audit row in one transaction).

use std::collections::HashMap;

use serde_json::json;
use tracing::info;

use super::*;
use crate::sql;

/// One letter a replay would select.
pub(super) struct Selected {
    pub(super) id: i64,
    pub(super) times_replayed: i64,
    /// Where it would go.
    pub(super) target: String,
    /// How long ago it first failed.
    pub(super) age: std::time::Duration,
    /// Its `x-error-kind`.
    pub(super) kind: Option<String>,
    /// The group that dead-lettered it.
    pub(super) group: Option<String>,
    /// Its cause (normalised error).
    pub(super) cause: Option<String>,
}

/// Kinds of letters a replay alone does not fix.
const RISKY_KINDS: [&str; 3] = ["decode", "permanent", "panic"];

/// What needs confirming before a replay.
struct Risks {
    older_than_marks: i64,
    oldest: Option<std::time::Duration>,
    stale_topics: Vec<String>,
    kinds: Vec<(String, i64)>,
    /// Letters passed by newer handled messages of their key.
    passed: Vec<i64>,
}

impl Dlq {
    /// The letters `filter` selects for a replay, with how often each was replayed.
    pub(super) async fn selection(
        &self,
        client: &impl tokio_postgres::GenericClient,
        filter: &Filter,
        opts: &ReplayOptions,
    ) -> Result<Vec<Selected>, DlqError> {
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
                &self
                    .sql(sql::replay_jobs::SELECTION)
                    .replace("{to}", &to)
                    .replace("{where}", &w.sql)
                    .replace("{limit}", &lim),
                &w.refs(),
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| Selected {
                id: r.get(0),
                times_replayed: r.get(2),
                target: r.get(1),
                age: std::time::Duration::from_secs_f64(r.get::<_, f64>(3).max(0.0)),
                kind: r.get(4),
                group: r.get(5),
                cause: r.get(6),
            })
            .collect())
    }

    /// What is risky about replaying `go`: letters older than the processed marks are kept
    /// (a group whose mark expired handles them again), and letters of kinds a replay alone
    /// cannot fix (`decode`: the same bytes fail the same way; `permanent`, `panic`: only after
    /// the fix is deployed). Each needs its own explicit confirmation.
    fn risks(go: &[&Selected], opts: &ReplayOptions, passed: Vec<i64>) -> Risks {
        let stale: Vec<&&Selected> = go.iter().filter(|s| s.age > opts.marks_retention).collect();
        let mut kinds: std::collections::BTreeMap<String, i64> = Default::default();
        for s in go {
            if let Some(k) = s.kind.as_deref().filter(|k| RISKY_KINDS.contains(k)) {
                *kinds.entry(k.to_owned()).or_default() += 1;
            }
        }
        let mut topics: Vec<String> = stale.iter().map(|s| s.target.clone()).collect();
        topics.sort_unstable();
        topics.dedup();
        Risks {
            older_than_marks: stale.len() as i64,
            oldest: stale.iter().map(|s| s.age).max(),
            stale_topics: topics,
            kinds: kinds.into_iter().collect(),
            passed,
        }
    }

    /// Of `go`, the letters whose group handled a newer message of their key since it
    /// dead-lettered them (noted by consumers not in strict order).
    async fn passed_by_newer(
        &self,
        client: &impl tokio_postgres::GenericClient,
        go: &[&Selected],
    ) -> Result<Vec<i64>, DlqError> {
        let ids: Vec<i64> = go.iter().map(|s| s.id).collect();
        let mut passed: Vec<i64> = client
            .query(&self.sql(sql::holds::PASSED_LETTERS), &[&ids])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        passed.sort_unstable();
        Ok(passed)
    }

    /// Refuses what [`Self::risks`] found unless the options confirm it, saying why.
    fn refuse_unconfirmed(r: &Risks, opts: &ReplayOptions) -> Result<(), DlqError> {
        if let (Some(oldest), false) = (r.oldest, opts.accept_duplicates) {
            let days = |d: std::time::Duration| format!("{:.1} days", d.as_secs_f64() / 86_400.0);
            return invalid(format!(
                "{} of the selected letters first failed longer ago than processed marks are kept \
                 (oldest {}, marks kept {}): every group reading {} whose mark has expired would \
                 handle them a second time. Replay only newer letters (--since), or give \
                 --accept-duplicates to replay anyway (audited)",
                r.older_than_marks,
                days(oldest),
                days(opts.marks_retention),
                r.stale_topics.join(", ")
            ));
        }
        if !r.passed.is_empty() && !opts.confirm_order {
            return invalid(format!(
                "{} of the selected letters (e.g. #{}) have newer messages of their key that \
                 their group handled after dead-lettering them: replayed, each lands behind \
                 those and may undo newer state. Handlers that compare x-outbox-seq \
                 (Delivered::newer_than_applied) ignore them; give --confirm-order to replay \
                 anyway (audited)",
                r.passed.len(),
                r.passed[0]
            ));
        }
        if !r.kinds.is_empty() && !opts.confirm_kinds {
            let what: Vec<String> = r.kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
            return invalid(format!(
                "the selection holds {} letter(s): a decode letter's bytes fail the same way \
                 again unless the consumer changed, and a permanent or panic letter only \
                 succeeds once its fix is deployed. Give --confirm-kinds once that is so",
                what.join(", ")
            ));
        }
        Ok(())
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
        let go: Vec<&Selected> = sel
            .iter()
            .filter(|s| opts.force || s.times_replayed < guard)
            .collect();
        // A dry run reports the risks (the dashboard asks to confirm them); the job refuses them.
        let passed = self.passed_by_newer(&**c, &go).await?;
        let risks = Self::risks(&go, opts, passed);
        let mut by_topic: HashMap<String, i64> = HashMap::new();
        for s in &go {
            *by_topic.entry(s.target.clone()).or_default() += 1;
        }
        let mut by_topic: Vec<(String, i64)> = by_topic.into_iter().collect();
        by_topic.sort();
        // The confirmation is written for the selection: which causes, which groups.
        let tally = |f: &dyn Fn(&Selected) -> Option<String>| {
            let mut m: HashMap<String, i64> = HashMap::new();
            for s in &go {
                *m.entry(f(s).unwrap_or_default()).or_default() += 1;
            }
            let mut v: Vec<(String, i64)> = m.into_iter().collect();
            v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            v.truncate(10);
            v
        };
        let by_group = tally(&|s| s.group.clone());
        let by_cause = tally(&|s| s.cause.clone());
        let sample_ids: Vec<i64> = go.iter().take(20).map(|s| s.id).collect();
        let sample = if sample_ids.is_empty() {
            Vec::new()
        } else {
            self.list(
                &Filter {
                    ids: sample_ids,
                    ..Filter::default()
                },
                20,
                crate::dlq::Order::OldestFirst,
                None,
            )
            .await?
        };
        Ok(DryRun {
            count: go.len() as i64,
            skipped_loop_guard: (sel.len() - go.len()) as i64,
            older_than_marks: risks.older_than_marks,
            risky_kinds: risks.kinds,
            passed_by_newer: risks.passed.len() as i64,
            passed_sample: risks.passed.iter().take(20).copied().collect(),
            by_topic,
            by_group,
            by_cause,
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
        tx.execute(sql::locks::CREATE_JOB, &[&self.schema.name()])
            .await?;
        self.check_ids(&*tx, &filter.ids, &[Status::New, Status::Replayed])
            .await?;
        let sel = self.selection(&*tx, &filter, opts).await?;
        if sel.is_empty() {
            return not_found("no letters match: nothing to replay (already replayed or dropped letters need --id, or --status)");
        }
        let guard = i64::from(opts.loop_guard);
        let go: Vec<&Selected> = sel
            .iter()
            .filter(|s| opts.force || s.times_replayed < guard)
            .collect();
        let passed = self.passed_by_newer(&*tx, &go).await?;
        let risks = Self::risks(&go, opts, passed);
        Self::refuse_unconfirmed(&risks, opts)?;
        let older_than_marks = risks.older_than_marks;
        let mut ids = Vec::with_capacity(sel.len());
        let mut states = Vec::with_capacity(sel.len());
        let mut errors: Vec<Option<String>> = Vec::with_capacity(sel.len());
        let mut go_ids = Vec::new();
        // Letters to send first (oldest first), skipped ones after: the canary is the first
        // `canary` items by seq, so it must be made of letters that are actually sent.
        let mut sel = sel;
        sel.sort_by_key(|s| (!(opts.force || s.times_replayed < guard), s.id));
        for s in &sel {
            let (id, n) = (s.id, s.times_replayed);
            ids.push(id);
            if opts.force || n < guard {
                states.push("pending".to_owned());
                errors.push(None);
                go_ids.push(id);
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
            // The risk the operator accepted, on the record.
            "accept_duplicates": opts.accept_duplicates,
            "older_than_marks": older_than_marks,
            "confirm_kinds": opts.confirm_kinds,
            "risky_kinds": risks.kinds,
            "confirm_order": opts.confirm_order,
            "passed_by_newer": risks.passed.len(),
            "marks_retention_secs": opts.marks_retention.as_secs(),
        });
        let audit_id: i64 = tx
            .query_one(
                &self.sql(sql::dead_letters::AUDIT_REPLAY),
                &[&opts.actor, &recorded, &(go_ids.len() as i64), &go_ids],
            )
            .await?
            .get(0);
        let job_id: i64 = tx
            .query_one(
                &self.sql(sql::replay_jobs::INSERT_JOB),
                &[
                    &opts.actor,
                    &audit_id,
                    &recorded,
                    &opts.to_topic,
                    &opts.rate,
                    &(i32::try_from(opts.canary).unwrap_or(i32::MAX)),
                    &(opts.canary_wait.as_millis() as i64),
                    &opts.max_refail,
                    &(i64::try_from(opts.watch.as_millis()).unwrap_or(i64::MAX)),
                ],
            )
            .await?
            .get(0);
        tx.execute(
            &self.sql(sql::dead_letters::AUDIT_NAME_JOB),
            &[&audit_id, &job_id],
        )
        .await?;
        tx.execute(
            &self.sql(sql::replay_jobs::INSERT_ITEMS),
            &[&job_id, &ids, &states, &errors],
        )
        .await?;
        tx.commit().await?;
        info!(job = job_id, letters = go_ids.len(), skipped = sel.len() - go_ids.len(), actor = %opts.actor, "replay job created");
        self.job(job_id).await
    }
}
