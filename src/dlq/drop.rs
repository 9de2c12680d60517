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
        check_actor(actor)?;
        if reason.trim().is_empty() || reason.len() > 2000 {
            return invalid("a drop needs --reason (1 to 2000 characters)");
        }
        let filter = filter.clone().normalized()?;
        if !filter.is_selective() && !all {
            return invalid(
                "refusing to drop with an empty filter: give --id or filters, or --all to drop every new letter",
            );
        }
        if filter.status.is_some_and(|s| s != Status::New) {
            return invalid("only new letters can be dropped");
        }
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;
        self.check_ids(&*tx, &filter.ids, &[Status::New]).await?;
        let mut w = filter.to_where("d", Some(Status::New));
        let r = w.push(reason.to_owned());
        let ids: Vec<i64> = tx
            .query(
                &self
                    .sql(sql::dead_letters::DROP)
                    .replace("{reason}", &r)
                    .replace("{where}", &w.sql),
                &w.refs(),
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut ids = ids;
        ids.sort_unstable();
        let audit_id = if ids.is_empty() {
            None
        } else {
            let f = json!({"filter": filter, "all": all});
            Some(
                tx.query_one(
                    &self.sql(sql::dead_letters::AUDIT_DROP),
                    &[&actor, &f, &(ids.len() as i64), &ids, &reason],
                )
                .await?
                .get(0),
            )
        };
        tx.commit().await?;
        metrics::counter!(crate::metrics::DLQ_DROPPED, "reason" => "operator")
            .increment(ids.len() as u64);
        Ok(DropReport {
            dropped: ids.len() as u64,
            ids,
            audit_id,
        })
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
