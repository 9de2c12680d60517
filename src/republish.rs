//! `outbox requeue --sent` ([`requeue_sent`]): publishing sent rows again, the runbook for a topic whose broker
//! lost data. Sent rows are kept (7 days by default) for exactly this; the consumers' inbox
//! makes the second delivery harmless to every group that already handled it.

use std::time::SystemTime;

use serde_json::json;

use crate::config::DbConfig;
use crate::sql::{outbox as q, render};

/// Which sent rows to publish again.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequeueSent {
    /// The topic to rebuild (required: a re-publish is never "everything").
    pub topic: String,
    /// Rows created at or after this instant (unbounded when `None`).
    pub since: Option<SystemTime>,
    /// Rows created before this instant (unbounded when `None`).
    pub until: Option<SystemTime>,
    /// Rows per transaction (each audited), so no statement holds many row locks.
    pub batch: usize,
}

/// Default rows per re-publish batch.
pub(crate) const DEFAULT_REQUEUE_BATCH: usize = 5_000;

impl RequeueSent {
    /// Every sent row of `topic`, in batches of [`RequeueSent::DEFAULT_BATCH`].
    pub fn topic(topic: impl Into<String>) -> Self {
        Self {
            topic: topic.into(),
            since: None,
            until: None,
            batch: DEFAULT_REQUEUE_BATCH,
        }
    }
}

/// What a re-publish did (or, for [`count_sent`], would do).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct RequeueSentReport {
    /// Rows put back to pending (or selected, for a count).
    pub rows: u64,
    /// Transactions used.
    pub batches: u64,
}

/// Why a re-publish was refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequeueError {
    /// The request is not acceptable (bad topic, empty window, zero batch).
    #[error("{0}")]
    Invalid(String),
    /// Postgres failed; batches already committed stay requeued (and audited).
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
}

fn check(r: &RequeueSent) -> Result<(), RequeueError> {
    crate::topic::validate_topic(&r.topic).map_err(|e| RequeueError::Invalid(e.to_string()))?;
    if r.batch == 0 {
        return Err(RequeueError::Invalid("batch must be at least 1".into()));
    }
    if let (Some(a), Some(b)) = (r.since, r.until) {
        if a >= b {
            return Err(RequeueError::Invalid(
                "--since must be before --until".into(),
            ));
        }
    }
    Ok(())
}

impl RequeueSent {
    /// Default rows per statement of a requeue.
    pub const DEFAULT_BATCH: usize = DEFAULT_REQUEUE_BATCH;
}

/// How many sent rows `which` selects (the count shown before a re-publish, and `--dry-run`).
///
/// # Errors
/// [`RequeueError`] for a bad request or when Postgres fails.
pub async fn count_sent(db: &DbConfig, which: &RequeueSent) -> Result<u64, RequeueError> {
    check(which)?;
    let c = crate::db::connect(db).await?;
    let row = c
        .query_one(
            &render(q::COUNT_SENT, &db.schema),
            &[&which.topic, &which.since, &which.until, &i64::MAX],
        )
        .await?;
    Ok(row.get::<_, i64>(0) as u64)
}

/// Puts the sent rows `which` selects back to pending, in id order, `batch` rows per
/// transaction, each batch audited (`dlq_audit`, action `requeue-sent`, by `actor`). Rows sent
/// after the call started are not touched: the selection is bounded by the largest id at the
/// start. Running relays are told to look from the head.
///
/// # Errors
/// [`RequeueError`] for a bad request or when Postgres fails; committed batches stay.
pub async fn requeue_sent(
    db: &DbConfig,
    which: &RequeueSent,
    actor: &str,
) -> Result<RequeueSentReport, RequeueError> {
    check(which)?;
    if actor.trim().is_empty() || actor.chars().any(char::is_control) {
        return Err(RequeueError::Invalid("a re-publish needs an actor".into()));
    }
    let mut c = crate::db::connect(db).await?;
    let on_ring: bool = c
        .query_one(&render(crate::sql::ring::LAYOUT, &db.schema), &[])
        .await?
        .get(0);
    let (select, audit) = (
        if on_ring {
            render(&crate::sql::ring::requeue_sent(), &db.schema)
        } else {
            render(q::REQUEUE_SENT, &db.schema)
        },
        render(q::AUDIT_REQUEUE_SENT, &db.schema),
    );
    let head = c
        .query_one(
            &render(q::COUNT_SENT, &db.schema),
            &[&which.topic, &which.since, &which.until, &i64::MAX],
        )
        .await?;
    let Some(max_id) = head.get::<_, Option<i64>>(1) else {
        return Ok(RequeueSentReport::default());
    };
    let window = json!({
        "topic": which.topic,
        "since": which.since.map(crate::message::rfc3339),
        "until": which.until.map(crate::message::rfc3339),
    });
    let mut report = RequeueSentReport::default();
    let mut after = 0i64;
    loop {
        let tx = c.transaction().await?;
        let ids: Vec<i64> = tx
            .query(
                &select,
                &[
                    &which.topic,
                    &which.since,
                    &which.until,
                    &max_id,
                    &(which.batch as i64),
                    &after,
                ],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let Some(&last) = ids.iter().max() else {
            tx.rollback().await?;
            break;
        };
        let mut filter = window.clone();
        filter["ids"] = json!([ids.iter().min(), last]);
        tx.query_one(
            &audit,
            &[
                &actor,
                &filter,
                &(ids.len() as i64),
                &"re-publish of sent rows",
            ],
        )
        .await?;
        tx.commit().await?;
        // Their ids are below the relays' claim floors: tell them to look from the head.
        c.execute(
            crate::sql::NOTIFY,
            &[&db.schema.notify_channel(), &crate::schema::REWIND_PAYLOAD],
        )
        .await?;
        report.rows += ids.len() as u64;
        report.batches += 1;
        after = last;
        if ids.len() < which.batch {
            break;
        }
    }
    Ok(report)
}
