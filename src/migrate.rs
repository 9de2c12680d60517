//! `outbox migrate`: the embedded refinery migrations, applied in the configured schema.

use crate::config::DbConfig;
use crate::db;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// A failed migration run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrateError {
    /// Postgres could not be reached or refused a statement.
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// refinery refused or failed a migration.
    #[error("migration: {0}")]
    Refinery(#[from] refinery::Error),
}

/// What a migration run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateReport {
    /// Names of the migrations applied by this run (`V1__outbox`, …); empty when up to date.
    pub applied: Vec<String>,
}

/// Applies every embedded migration not yet applied, in `db.schema` (created if missing).
///
/// Idempotent: a second run applies nothing. Concurrent runs (several replicas starting at once)
/// are serialised by an advisory lock on the schema, so each migration runs exactly once.
/// The history table `refinery_schema_history` lives in the same schema.
///
/// # Errors
/// [`MigrateError`] when Postgres is unreachable or a migration fails (it is rolled back).
pub async fn migrate(db: &DbConfig) -> Result<MigrateReport, MigrateError> {
    let mut client = db::connect(db).await?;
    let schema = db.schema.quoted();
    // The advisory lock key is derived from the schema name so different schemas migrate in
    // parallel; it is a session lock released when this connection closes, even on a crash.
    client
        .batch_execute(&format!(
            "SELECT pg_advisory_lock(hashtext('outbox-migrate:' || '{name}'));
             CREATE SCHEMA IF NOT EXISTS {schema};
             SET search_path TO {schema};",
            name = db.schema.name()
        ))
        .await?;
    let report = embedded::migrations::runner()
        .set_grouped(false)
        .run_async(&mut client)
        .await?;
    client
        .batch_execute(&format!(
            "SELECT pg_advisory_unlock(hashtext('outbox-migrate:' || '{}'))",
            db.schema.name()
        ))
        .await?;
    let applied = report
        .applied_migrations()
        .iter()
        .map(|m| format!("V{}__{}", m.version(), m.name()))
        .collect();
    Ok(MigrateReport { applied })
}

/// The names of every embedded migration, in order.
pub fn embedded_migrations() -> Vec<String> {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| format!("V{}__{}", m.version(), m.name()))
        .collect()
}
