//! Dropping letters an operator decided not to replay, and the retention purge of settled
//! letters. Each writes its audit row in the same transaction as the change.

use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use super::filter::{Filter, Status};
use super::{check_actor, invalid, not_found, Dlq, DlqError};
use crate::sql;

/// What a drop did.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DropReport {
    /// Letters marked `dropped`.
    pub dropped: u64,
    /// Their ids.
    pub ids: Vec<i64>,
    /// The audit row (absent when nothing matched).
    pub audit_id: Option<i64>,
}

/// What a restore did.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RestoreReport {
    /// Letters put back to `new`.
    pub restored: u64,
    /// Their ids.
    pub ids: Vec<i64>,
    /// The audit row (absent when nothing matched).
    pub audit_id: Option<i64>,
}

/// What a purge did.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct PurgeReport {
    /// Letters deleted.
    pub deleted: u64,
    /// DELETE statements run.
    pub statements: u64,
}

impl Dlq {
    /// Checks that every id names a letter and that it is in one of `allowed` statuses.
    pub(crate) async fn check_ids(
        &self,
        client: &impl tokio_postgres::GenericClient,
        ids: &[i64],
        allowed: &[Status],
    ) -> Result<(), DlqError> {
        if ids.is_empty() {
            return Ok(());
        }
        let rows = client
            .query(&self.sql(sql::dead_letters::STATUS_OF_IDS), &[&ids])
            .await?;
        let found: std::collections::HashMap<i64, String> =
            rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        let missing: Vec<String> = ids
            .iter()
            .filter(|i| !found.contains_key(i))
            .map(ToString::to_string)
            .collect();
        if !missing.is_empty() {
            return not_found(format!("no dead letter with id {}", missing.join(", ")));
        }
        for id in ids {
            let s = &found[id];
            if !allowed.iter().any(|a| a.as_str() == s) {
                return invalid(format!(
                    "dead letter {id} is {s}; this needs {}",
                    allowed
                        .iter()
                        .map(|a| a.as_str())
                        .collect::<Vec<_>>()
                        .join(" or ")
                ));
            }
        }
        Ok(())
    }

    /// Marks the `new` letters selected by `filter` as `dropped` with `reason`, and audits it.
    /// An unselective filter is refused unless `all`.
    ///
    /// # Errors
    /// [`DlqError::Invalid`] for an empty filter, a missing reason, an unknown id or an id
    /// that is not `new`; nothing is changed then.
    pub async fn drop_letters(
        &self,
        filter: &Filter,
        all: bool,
        reason: &str,
        actor: &str,
    ) -> Result<DropReport, DlqError> {
        let ids = self
            .move_letters(filter, all, reason, actor, Status::New, "drop")
            .await?;
        metrics::counter!(crate::metrics::DLQ_DROPPED, "reason" => "operator")
            .increment(ids.0.len() as u64);
        Ok(DropReport {
            dropped: ids.0.len() as u64,
            ids: ids.0,
            audit_id: ids.1,
        })
    }

    /// Undoes a drop: puts the `dropped` letters selected by `filter` back to `new` (their
    /// bytes never left the archive), with `reason`, audited as `restore`. They can then be
    /// replayed or dropped again. A letter already purged by retention cannot come back.
    ///
    /// # Errors
    /// [`DlqError::Invalid`] for an empty filter (unless `all`), a missing reason, an unknown id
    /// or an id that is not `dropped`; nothing is changed then.
    pub async fn restore_letters(
        &self,
        filter: &Filter,
        all: bool,
        reason: &str,
        actor: &str,
    ) -> Result<RestoreReport, DlqError> {
        let (ids, audit_id) = self
            .move_letters(filter, all, reason, actor, Status::Dropped, "restore")
            .await?;
        Ok(RestoreReport {
            restored: ids.len() as u64,
            ids,
            audit_id,
        })
    }

    /// Moves the letters `filter` selects from `from` (`new` for a drop, `dropped` for a
    /// restore) and audits it in the same transaction. Returns their ids and the audit row.
    async fn move_letters(
        &self,
        filter: &Filter,
        all: bool,
        reason: &str,
        actor: &str,
        from: Status,
        action: &str,
    ) -> Result<(Vec<i64>, Option<i64>), DlqError> {
        check_actor(actor)?;
        if reason.trim().is_empty() || reason.len() > 2000 {
            return invalid(format!("a {action} needs --reason (1 to 2000 characters)"));
        }
        let filter = filter.clone().normalized()?;
        if !filter.is_selective() && !all {
            return invalid(format!(
                "refusing to {action} with an empty filter: give --id or filters, or --all for every {} letter",
                from.as_str()
            ));
        }
        if filter.status.is_some_and(|s| s != from) {
            return invalid(format!("a {action} takes only {} letters", from.as_str()));
        }
        let (change, audit, stored_reason) = if from == Status::New {
            (
                sql::dead_letters::DROP,
                sql::dead_letters::AUDIT_DROP,
                reason.to_owned(),
            )
        } else {
            (
                sql::dead_letters::RESTORE,
                sql::dead_letters::AUDIT_RESTORE,
                format!("restored: {reason}"),
            )
        };
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;
        self.check_ids(&*tx, &filter.ids, &[from]).await?;
        let mut w = filter.to_where("d", Some(from));
        let r = w.push(stored_reason);
        let mut ids: Vec<i64> = tx
            .query(
                &self
                    .sql(change)
                    .replace("{reason}", &r)
                    .replace("{where}", &w.sql),
                &w.refs(),
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        ids.sort_unstable();
        let audit_id = if ids.is_empty() {
            None
        } else {
            let f = json!({"filter": filter, "all": all});
            Some(
                tx.query_one(
                    &self.sql(audit),
                    &[&actor, &f, &(ids.len() as i64), &ids, &reason],
                )
                .await?
                .get(0),
            )
        };
        if from == Status::New && !ids.is_empty() {
            // A dropped head resolves its key's hold (strict order): the consumer's upkeep
            // lets the held messages through.
            tx.execute(
                &self.sql(crate::sql::holds::RELEASE_DROPPED),
                &[&ids, &reason],
            )
            .await?;
        }
        tx.commit().await?;
        Ok((ids, audit_id))
    }

    /// Deletes settled (`replayed`, `dropped`) letters settled longer than `retention` ago (and
    /// not part of a job still pending, running or paused),
    /// `batch` per statement, each batch audited as `archive-purge`.
    ///
    /// # Errors
    /// [`DlqError`] when Postgres fails; batches already deleted stay deleted.
    pub async fn purge(
        &self,
        retention: Duration,
        batch: usize,
        actor: &str,
    ) -> Result<PurgeReport, DlqError> {
        let (deleted, statements) = crate::cleanup::purge_dead_letters(
            &self.pool,
            &self.sql(crate::sql::dead_letters::PURGE),
            retention,
            batch,
            actor,
        )
        .await?;
        Ok(PurgeReport {
            deleted,
            statements,
        })
    }
}
