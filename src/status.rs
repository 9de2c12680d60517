//! `outbox status` ([`status()`]) and `outbox requeue` ([`requeue`]): what an operator looks at
//! and the one repair they make.

use crate::config::DbConfig;
use crate::sql::Statements;

/// Rows per status.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StatusCount {
    /// `pending`, `sent` or `failed`.
    pub status: String,
    /// Rows in that status.
    pub count: i64,
    /// `created_at` of the oldest such row (Postgres text form).
    pub oldest: Option<String>,
}

/// Failed rows sharing one `last_error`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FailedGroup {
    /// The error text.
    pub last_error: String,
    /// Rows with it.
    pub count: i64,
    /// Smallest and largest id with it, to find examples.
    pub min_id: i64,
    /// See `min_id`.
    pub max_id: i64,
}

/// The status report.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OutboxStatus {
    /// Counts by status.
    pub counts: Vec<StatusCount>,
    /// Age of the oldest pending row in seconds; a growing value means the relay is not keeping up.
    pub oldest_pending_age_secs: Option<f64>,
    /// Failed rows grouped by error, most frequent first (at most 20 groups).
    pub failed_by_error: Vec<FailedGroup>,
    /// Consumer circuit breakers open now (every replica of the group is paused).
    pub open_breakers: Vec<OpenBreakerRow>,
    /// Processed marks older than the marks retention, per consumer group: cleanup is behind
    /// or off for that group (a consumer cleans up its own group's marks by default).
    #[serde(default)]
    pub overdue_marks: Vec<OverdueMarks>,
    /// Which storage the outbox is on, its size, and on ring storage its generations.
    #[serde(default)]
    pub storage: Option<crate::storage::StorageState>,
}

/// One group's processed marks past retention.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OverdueMarks {
    /// The consumer group.
    pub consumer_group: String,
    /// Marks older than the retention.
    pub count: i64,
}

/// An open circuit breaker (`circuit_breakers`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OpenBreakerRow {
    /// The consumer group.
    pub consumer_group: String,
    /// The dependency.
    pub dependency: String,
    /// Seconds until it closes.
    pub closes_in_secs: f64,
    /// Why it opened.
    pub reason: Option<String>,
    /// Opens so far.
    pub generation: i64,
    /// Who opened it: `operator <holder>`, or the replica whose calls failed.
    pub opened_by: Option<String>,
    /// How long ago it opened, seconds.
    pub opened_secs_ago: Option<f64>,
}

impl OutboxStatus {
    /// Rows in `status`, 0 when none.
    pub fn count(&self, status: &str) -> i64 {
        self.counts
            .iter()
            .find(|c| c.status == status)
            .map_or(0, |c| c.count)
    }
}

/// Reads the status of the outbox in `db.schema`, with marks overdue against the default
/// retention (35 days).
///
/// # Errors
/// The Postgres error when unreachable or the tables are missing (run `outbox migrate`).
pub async fn status(db: &DbConfig) -> Result<OutboxStatus, tokio_postgres::Error> {
    status_with(db, crate::cleanup::DEFAULT_PROCESSED_RETENTION).await
}

/// [`status()`], with marks overdue against `marks_retention`.
///
/// # Errors
/// As [`status()`].
pub async fn status_with(
    db: &DbConfig,
    marks_retention: std::time::Duration,
) -> Result<OutboxStatus, tokio_postgres::Error> {
    let client = crate::db::connect(db).await?;
    status_on(&client, db, marks_retention).await
}

/// [`status_with`] over a connection the caller holds (a pooled one, with its own statement
/// timeout).
pub(crate) async fn status_on(
    client: &tokio_postgres::Client,
    db: &DbConfig,
    marks_retention: std::time::Duration,
) -> Result<OutboxStatus, tokio_postgres::Error> {
    let s = Statements::new(&db.schema);
    let counts = client
        .query(&s.status_counts, &[])
        .await?
        .iter()
        .map(|r| StatusCount {
            status: r.get(0),
            count: r.get(1),
            oldest: r.get(2),
        })
        .collect();
    let oldest_pending_age_secs = client.query_one(&s.oldest_pending_age, &[]).await?.get(0);
    let failed_by_error = client
        .query(&s.failed_by_error, &[&20i64])
        .await?
        .iter()
        .map(|r| FailedGroup {
            last_error: r.get(0),
            count: r.get(1),
            min_id: r.get(2),
            max_id: r.get(3),
        })
        .collect();
    let open_breakers = client
        .query(&s.open_breakers, &[])
        .await?
        .iter()
        .map(|r| OpenBreakerRow {
            consumer_group: r.get(0),
            dependency: r.get(1),
            closes_in_secs: r.get(2),
            reason: r.get(3),
            generation: r.get(4),
            opened_by: r.get(5),
            opened_secs_ago: r.get(6),
        })
        .collect();
    let overdue_marks = client
        .query(
            &crate::sql::render(crate::sql::marks::OVERDUE, &db.schema),
            &[&marks_retention.as_secs_f64()],
        )
        .await?
        .iter()
        .map(|r| OverdueMarks {
            consumer_group: r.get(0),
            count: r.get(1),
        })
        .collect();
    let storage = Some(crate::storage::state_on(client, &db.schema).await?);
    Ok(OutboxStatus {
        counts,
        oldest_pending_age_secs,
        failed_by_error,
        open_breakers,
        overdue_marks,
        storage,
    })
}

/// Which rows to put back to pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// Every failed row.
    AllFailed,
    /// One failed row by id.
    Id(i64),
}

/// Puts failed rows back to `pending` with `attempts = 0`, due now (the operator's repair, to be run
/// after the cause in `last_error` is fixed). `last_error` is kept until the next attempt.
/// Returns the number of rows requeued.
///
/// # Errors
/// The Postgres error when unreachable.
pub async fn requeue(db: &DbConfig, which: Requeue) -> Result<u64, tokio_postgres::Error> {
    requeue_by(db, which, &crate::config::os_user()).await
}

/// [`requeue`] on behalf of `actor`: the requeue and its audit row (`dlq_audit`, action
/// `requeue`, with the ids) commit together, and it is logged.
///
/// # Errors
/// The Postgres error when unreachable.
pub async fn requeue_by(
    db: &DbConfig,
    which: Requeue,
    actor: &str,
) -> Result<u64, tokio_postgres::Error> {
    let mut client = crate::db::connect(db).await?;
    let s = Statements::new(&db.schema);
    let tx = client.transaction().await?;
    let ids: Vec<i64> = match which {
        Requeue::AllFailed => tx.query(&s.requeue_failed, &[]).await?,
        Requeue::Id(id) => tx.query(&s.requeue_id, &[&id]).await?,
    }
    .iter()
    .map(|r| r.get(0))
    .collect();
    let n = ids.len() as u64;
    if n > 0 {
        let filter = match which {
            Requeue::AllFailed => serde_json::json!({"failed": true}),
            Requeue::Id(id) => serde_json::json!({"id": id}),
        };
        tx.execute(
            &crate::sql::render(crate::sql::outbox::AUDIT_REQUEUE, &db.schema),
            &[&actor, &filter, &(n as i64), &ids],
        )
        .await?;
    }
    tx.commit().await?;
    if n > 0 {
        tracing::info!(rows = n, %actor, ids = ?&ids[..ids.len().min(20)], "failed outbox rows put back to pending");
    }
    if n > 0 {
        // The rows keep their old ids, below the running relays' claim floors: tell them to
        // look from the head (a relay that misses this finds the rows at its next sweep).
        client
            .execute(
                crate::sql::NOTIFY,
                &[&db.schema.notify_channel(), &crate::schema::REWIND_PAYLOAD],
            )
            .await?;
    }
    Ok(n)
}
