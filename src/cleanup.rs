//! `outbox cleanup`: delete sent outbox rows and processed-message marks past retention, in
//! bounded batches so that no statement holds locks or bloats WAL for long.

use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio_util::sync::CancellationToken;

use crate::config::{CleanupConfig, DbConfig};
use crate::sql::Statements;

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
    /// DELETE statements run.
    pub statements: u64,
    /// The slowest single statement.
    pub longest_statement: Duration,
}

/// Runs cleanup once for the tables of `db.schema`.
///
/// # Errors
/// [`CleanupError`] when Postgres fails midway.
pub async fn cleanup(db: &DbConfig, config: &CleanupConfig) -> Result<CleanupReport, CleanupError> {
    let pool = crate::db::pool(db).expect("pool configuration is static");
    run_with(&pool, &Statements::new(&db.schema), config, &CancellationToken::new()).await
}

pub(crate) async fn run_with(
    pool: &Pool,
    stmts: &Statements,
    config: &CleanupConfig,
    cancel: &CancellationToken,
) -> Result<CleanupReport, CleanupError> {
    let mut report = CleanupReport::default();
    let batch = i64::try_from(config.batch_size).unwrap_or(i64::MAX);
    for (sql, retention, is_outbox) in [
        (&stmts.cleanup_outbox, config.sent_retention, true),
        (&stmts.cleanup_processed, config.processed_retention, false),
    ] {
        let secs = retention.as_secs_f64();
        loop {
            if cancel.is_cancelled() {
                return Ok(report);
            }
            let client = pool.get().await?;
            let started = Instant::now();
            let n = client.execute(sql.as_str(), &[&secs, &batch]).await?;
            report.longest_statement = report.longest_statement.max(started.elapsed());
            report.statements += 1;
            if is_outbox {
                report.outbox_deleted += n;
            } else {
                report.processed_deleted += n;
            }
            if n < batch as u64 {
                break;
            }
        }
    }
    Ok(report)
}
