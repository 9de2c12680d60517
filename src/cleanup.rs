//! `outbox cleanup`: delete sent outbox rows, processed-message marks and settled dead letters
//! past retention, in
//! bounded batches so that no statement holds locks or bloats WAL for long.

use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio_util::sync::CancellationToken;

use crate::config::DbConfig;
use crate::sql::Statements;

/// Keep sent outbox rows this long (as long as the topics keep them, so a topic can be rebuilt).
pub const DEFAULT_SENT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Keep processed-message marks this long: longer than anything that can bring a message back
/// (the topics' 7 days, the dead-letter topics' 30 days), so a redelivery or a replay from the DLQ
/// topic never outlives its mark. Replays from the archive are checked against it.
pub const DEFAULT_PROCESSED_RETENTION: Duration = Duration::from_secs(35 * 24 * 3600);
/// Rows deleted per cleanup statement, so no statement holds locks for long.
pub const DEFAULT_CLEANUP_BATCH: usize = 5_000;
/// How often the relay runs cleanup (the "cron module").
pub const DEFAULT_CLEANUP_INTERVAL: Duration = Duration::from_secs(3600);
/// Archived dead letters that were replayed or dropped are deleted this long after they were
/// archived; `new` ones are never deleted.
pub const DEFAULT_ARCHIVE_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Retention and batching for `outbox cleanup` and the relay's schedule.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CleanupConfig {
    /// Sent outbox rows older than this are deleted.
    pub sent_retention: Duration,
    /// Processed-message marks older than this are deleted.
    pub processed_retention: Duration,
    /// Rows per DELETE statement.
    pub batch_size: usize,
    /// How often the relay runs cleanup; `None` disables the schedule.
    pub interval: Option<Duration>,
    /// Archived dead letters that were replayed or dropped are deleted this long after they
    /// were archived (new ones are never deleted).
    pub dlq_retention: Duration,
}

impl CleanupConfig {
    /// Default [`CleanupConfig::sent_retention`]: 7 days.
    pub const DEFAULT_SENT_RETENTION: Duration = DEFAULT_SENT_RETENTION;
    /// Default [`CleanupConfig::processed_retention`]: 35 days.
    pub const DEFAULT_PROCESSED_RETENTION: Duration = DEFAULT_PROCESSED_RETENTION;
    /// Default [`CleanupConfig::batch_size`]: rows per delete statement.
    pub const DEFAULT_BATCH_SIZE: usize = DEFAULT_CLEANUP_BATCH;
    /// Default [`CleanupConfig::interval`]: how often a relay runs cleanup.
    pub const DEFAULT_INTERVAL: Duration = DEFAULT_CLEANUP_INTERVAL;
    /// Default [`CleanupConfig::dlq_retention`]: 30 days.
    pub const DEFAULT_DLQ_RETENTION: Duration = DEFAULT_ARCHIVE_RETENTION;
}

impl Default for CleanupConfig {
    fn default() -> Self {
        Self {
            sent_retention: DEFAULT_SENT_RETENTION,
            processed_retention: DEFAULT_PROCESSED_RETENTION,
            batch_size: DEFAULT_CLEANUP_BATCH,
            interval: Some(DEFAULT_CLEANUP_INTERVAL),
            dlq_retention: DEFAULT_ARCHIVE_RETENTION,
        }
    }
}

/// A failed cleanup run. Batches already deleted stay deleted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CleanupError {
    /// Postgres refused a statement or went away.
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// No connection could be had.
    #[error("postgres pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
}

/// What a cleanup run deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Sent outbox rows deleted.
    pub outbox_deleted: u64,
    /// processed_messages rows deleted.
    pub processed_deleted: u64,
    /// Settled dead letters purged from the archive.
    pub dlq_purged: u64,
    /// DELETE statements run.
    pub statements: u64,
    /// The slowest single statement.
    pub longest_statement: Duration,
    /// Ring storage: generations reclaimed whole (TRUNCATE), instead of rows deleted.
    pub generations_reclaimed: u64,
    /// Ring storage: generations that could be reclaimed but whose lock was busy (relays
    /// reading them); the next run tries again.
    pub generations_busy: u64,
    /// Ring storage: new rows go to the next generation from now on.
    pub generation_advanced: bool,
}

/// Runs cleanup once for the tables of `db.schema`.
///
/// # Errors
/// [`CleanupError`] when Postgres fails midway.
pub async fn cleanup(db: &DbConfig, config: &CleanupConfig) -> Result<CleanupReport, CleanupError> {
    cleanup_with_progress(db, config, &mut |_| {}).await
}

/// [`cleanup()`], calling `progress` with the running totals after every statement (the CLI
/// shows them as a progress line).
///
/// # Errors
/// [`CleanupError`] when Postgres fails midway.
pub async fn cleanup_with_progress(
    db: &DbConfig,
    config: &CleanupConfig,
    progress: &mut (dyn FnMut(&CleanupReport) + Send),
) -> Result<CleanupReport, CleanupError> {
    let pool = crate::db::pool(db).expect("pool configuration is static");
    run_with(
        &pool,
        &db.schema,
        &Statements::new(&db.schema),
        config,
        &CancellationToken::new(),
        progress,
    )
    .await
}

pub(crate) async fn run_with(
    pool: &Pool,
    schema: &crate::schema::Schema,
    stmts: &Statements,
    config: &CleanupConfig,
    cancel: &CancellationToken,
    progress: &mut (dyn FnMut(&CleanupReport) + Send),
) -> Result<CleanupReport, CleanupError> {
    let mut report = CleanupReport::default();
    let batch = i64::try_from(config.batch_size).unwrap_or(i64::MAX);
    let mut last_id: i64 = 0;
    // On ring storage (`outbox_use_ring()`) nothing is deleted row by row: whole generations
    // are reclaimed instead (`rotate.rs`).
    let on_ring: bool = pool
        .get()
        .await?
        .query_one(stmts.ring_layout.as_str(), &[])
        .await?
        .get(0);
    if on_ring {
        let started = Instant::now();
        let mut c = pool.get().await?;
        let r = crate::rotate::rotate(&mut c, schema, config.sent_retention).await?;
        report.longest_statement = report.longest_statement.max(started.elapsed());
        report.generations_reclaimed = r.reclaimed;
        report.generations_busy = r.busy;
        report.generation_advanced = r.advanced;
        progress(&report);
    }
    // On the ring, the sent rows the table held when the schema moved (`outbox_legacy`) go
    // by retention as before; the table is otherwise never written again.
    let delete_sent = if on_ring {
        stmts.cleanup_legacy.as_str()
    } else {
        stmts.cleanup_outbox.as_str()
    };
    loop {
        if cancel.is_cancelled() {
            return Ok(report);
        }
        let client = pool.get().await?;
        let started = Instant::now();
        let row = client
            .query_one(
                delete_sent,
                &[&config.sent_retention.as_secs_f64(), &batch, &last_id],
            )
            .await?;
        report.longest_statement = report.longest_statement.max(started.elapsed());
        report.statements += 1;
        let n: i64 = row.get(0);
        last_id = row.get(1);
        report.outbox_deleted += n as u64;
        progress(&report);
        if n < batch {
            break;
        }
    }
    // processed_messages, then the consumer's record of dead-lettered records: same retention.
    for (stmt, processed) in [
        (stmts.cleanup_processed.as_str(), true),
        (stmts.cleanup_dead_lettered.as_str(), false),
    ] {
        loop {
            if cancel.is_cancelled() {
                return Ok(report);
            }
            let client = pool.get().await?;
            let started = Instant::now();
            let n: i64 = client
                .query_one(stmt, &[&config.processed_retention.as_secs_f64(), &batch])
                .await?
                .get(0);
            report.longest_statement = report.longest_statement.max(started.elapsed());
            report.statements += 1;
            if processed {
                report.processed_deleted += n as u64;
            }
            progress(&report);
            if n < batch {
                break;
            }
        }
    }
    if cancel.is_cancelled() {
        return Ok(report);
    }
    let started = Instant::now();
    let (deleted, statements) = purge_dead_letters(
        pool,
        &stmts.cleanup_dead_letters,
        config.dlq_retention,
        config.batch_size,
        "cleanup",
    )
    .await?;
    report.longest_statement = report.longest_statement.max(started.elapsed());
    report.statements += statements;
    report.dlq_purged = deleted;
    progress(&report);
    Ok(report)
}

/// Deletes settled dead letters archived longer than `retention` ago, `batch` per statement,
/// each batch audited under `actor`; `purge` is `sql::dead_letters::PURGE` rendered for the
/// schema. Returns (letters deleted, statements run).
pub(crate) async fn purge_dead_letters(
    pool: &Pool,
    purge: &str,
    retention: Duration,
    batch: usize,
    actor: &str,
) -> Result<(u64, u64), CleanupError> {
    let batch = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
    let filter = serde_json::json!({
        "status": ["replayed", "dropped"],
        "settled_before_secs_ago": retention.as_secs(),
    });
    let (mut deleted, mut statements) = (0u64, 0u64);
    loop {
        let c = pool.get().await?;
        let n: i64 = c
            .query_one(purge, &[&retention.as_secs_f64(), &batch, &actor, &filter])
            .await?
            .get(0);
        statements += 1;
        deleted += n as u64;
        if n < batch {
            return Ok((deleted, statements));
        }
    }
}
