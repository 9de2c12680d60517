//! `outbox migrate`: the embedded migrations (`migrations/V{n}__{name}.sql`), applied in the
//! configured schema.
//!
//! The runner keeps refinery's history table (`refinery_schema_history`: version, name,
//! applied_on, checksum) and its checksum (SipHash-1-3 of name, version and SQL), so a database
//! migrated by earlier releases, which ran refinery, is recognised as it is, and refinery would
//! recognise one migrated by this runner. It is written here rather than taken from refinery
//! because refinery's runner brings URL, regex and date parsing (about 40 crates and more
//! than half of an enqueue-only service's build time) to do what these 100 lines do for one
//! driver and one directory. `tests/ops/layout.rs` checks the checksums against refinery's own.

use std::hash::{Hash, Hasher};
use std::time::SystemTime;

use crate::config::DbConfig;
use crate::db;

/// The embedded migrations, in version order. A file in `migrations/` missing here fails the
/// unit test `every_file_is_embedded`.
const MIGRATIONS: [(i32, &str, &str); 29] = [
    (1, "outbox", include_str!("../migrations/V1__outbox.sql")),
    (
        2,
        "processed_messages",
        include_str!("../migrations/V2__processed_messages.sql"),
    ),
    (
        3,
        "outbox_notify",
        include_str!("../migrations/V3__outbox_notify.sql"),
    ),
    (4, "uuidv7", include_str!("../migrations/V4__uuidv7.sql")),
    (
        5,
        "claim_index_and_vacuum",
        include_str!("../migrations/V5__claim_index_and_vacuum.sql"),
    ),
    (
        6,
        "ordering_lanes",
        include_str!("../migrations/V6__ordering_lanes.sql"),
    ),
    (
        7,
        "dead_letter_archive",
        include_str!("../migrations/V7__dead_letter_archive.sql"),
    ),
    (
        8,
        "failed_index",
        include_str!("../migrations/V8__failed_index.sql"),
    ),
    (
        9,
        "circuit_breakers",
        include_str!("../migrations/V9__circuit_breakers.sql"),
    ),
    (
        10,
        "dead_lettered",
        include_str!("../migrations/V10__dead_lettered.sql"),
    ),
    (
        11,
        "dead_letter_intent",
        include_str!("../migrations/V11__dead_letter_intent.sql"),
    ),
    (
        12,
        "tombstones_and_undo",
        include_str!("../migrations/V12__tombstones_and_undo.sql"),
    ),
    (
        13,
        "breaker_probe",
        include_str!("../migrations/V13__breaker_probe.sql"),
    ),
    (
        14,
        "replay_comebacks",
        include_str!("../migrations/V14__replay_comebacks.sql"),
    ),
    (
        15,
        "instances",
        include_str!("../migrations/V15__instances.sql"),
    ),
    (
        16,
        "message_id_index",
        include_str!("../migrations/V16__message_id_index.sql"),
    ),
    (
        17,
        "job_timeline_and_edits",
        include_str!("../migrations/V17__job_timeline_and_edits.sql"),
    ),
    (
        18,
        "ring_storage",
        include_str!("../migrations/V18__ring_storage.sql"),
    ),
    (
        19,
        "ring_upgrade",
        include_str!("../migrations/V19__ring_upgrade.sql"),
    ),
    (
        20,
        "ring_writes",
        include_str!("../migrations/V20__ring_writes.sql"),
    ),
    (
        21,
        "ring_cursor_log",
        include_str!("../migrations/V21__ring_cursor_log.sql"),
    ),
    (
        22,
        "ring_passed_lanes",
        include_str!("../migrations/V22__ring_passed_lanes.sql"),
    ),
    (
        23,
        "applied_sequences",
        include_str!("../migrations/V23__applied_sequences.sql"),
    ),
    (
        24,
        "key_holds",
        include_str!("../migrations/V24__key_holds.sql"),
    ),
    (
        25,
        "passed_letters",
        include_str!("../migrations/V25__passed_letters.sql"),
    ),
    (
        26,
        "tenants",
        include_str!("../migrations/V26__tenants.sql"),
    ),
    (
        27,
        "dead_letter_tenants",
        include_str!("../migrations/V27__dead_letter_tenants.sql"),
    ),
    (
        28,
        "outbox_column_statistics",
        include_str!("../migrations/V28__outbox_column_statistics.sql"),
    ),
    (
        29,
        "ring_insert_gen",
        include_str!("../migrations/V29__ring_insert_gen.sql"),
    ),
];

/// The history table, as refinery names it.
const HISTORY: &str = "refinery_schema_history";

/// A failed migration run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrateError {
    /// Postgres could not be reached or refused a statement (the failing migration is rolled
    /// back; the ones before it stay applied).
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// The database's history disagrees with the embedded migrations: an applied migration
    /// was changed or is unknown to this build (a newer release migrated this schema), or an
    /// embedded one older than the newest applied one was never applied.
    #[error("migration history: {0}")]
    History(String),
}

/// What a migration run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateReport {
    /// Names of the migrations applied by this run (`V1__outbox`, …); empty when up to date.
    pub applied: Vec<String>,
}

/// The checksum refinery records: SipHash-1-3 (zero keys) over name, version and SQL.
fn checksum(version: i32, name: &str, sql: &str) -> u64 {
    let mut h = siphasher::sip::SipHasher13::new();
    name.hash(&mut h);
    version.hash(&mut h);
    sql.hash(&mut h);
    h.finish()
}

/// [`checksum`] of a migration named `V{n}__{name}`.
pub(crate) fn checksum_of(file_name: &str, sql: &str) -> Option<u64> {
    let (v, name) = file_name.strip_prefix('V')?.split_once("__")?;
    Some(checksum(v.parse().ok()?, name, sql))
}

/// Applies every embedded migration not yet applied, in `db.schema` (created if missing).
///
/// Idempotent: a second run applies nothing. Concurrent runs (several replicas starting at once)
/// are serialised by an advisory lock on the schema, so each migration runs exactly once. Each
/// migration and its history row commit in one transaction. The history table
/// `refinery_schema_history` lives in the same schema.
///
/// # Errors
/// [`MigrateError::Postgres`] when Postgres is unreachable or a migration fails (it is rolled
/// back); [`MigrateError::History`] when the recorded history does not match this build.
pub async fn migrate(db: &DbConfig) -> Result<MigrateReport, MigrateError> {
    let mut client = db::connect(db).await?;
    let schema = db.schema.quoted();
    // The advisory lock key is derived from the schema name so different schemas migrate in
    // parallel; it is a session lock released when this connection closes, even on a crash.
    client
        .batch_execute(&format!(
            "SELECT pg_advisory_lock(hashtext('outbox-migrate:' || '{name}'));
             CREATE SCHEMA IF NOT EXISTS {schema};
             SET search_path TO {schema};
             CREATE TABLE IF NOT EXISTS {schema}.{HISTORY} (
                 version INT4 PRIMARY KEY, name VARCHAR(255),
                 applied_on VARCHAR(255), checksum VARCHAR(255));",
            name = db.schema.name()
        ))
        .await?;
    let applied: Vec<(i32, String, String)> = client
        .query(
            &format!("SELECT version, name, checksum FROM {schema}.{HISTORY} ORDER BY version"),
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let todo = plan(&applied)?;
    let mut report = MigrateReport {
        applied: Vec::new(),
    };
    for (version, name, sql) in todo {
        let tx = client.transaction().await?;
        tx.batch_execute(sql).await?;
        tx.execute(
            &format!(
                "INSERT INTO {schema}.{HISTORY} (version, name, applied_on, checksum)
                 VALUES ($1, $2, $3, $4)"
            ),
            &[
                &version,
                &name,
                &humantime::format_rfc3339(SystemTime::now()).to_string(),
                &checksum(version, name, sql).to_string(),
            ],
        )
        .await?;
        tx.commit().await?;
        tracing::info!(migration = %format!("V{version}__{name}"), "applied");
        report.applied.push(format!("V{version}__{name}"));
    }
    client
        .batch_execute(&format!(
            "SELECT pg_advisory_unlock(hashtext('outbox-migrate:' || '{}'))",
            db.schema.name()
        ))
        .await?;
    Ok(report)
}

/// The embedded migrations still to apply, after checking the recorded history against them
/// (the checks refinery makes with its defaults: no divergent and no missing versions).
fn plan(
    applied: &[(i32, String, String)],
) -> Result<Vec<(i32, &'static str, &'static str)>, MigrateError> {
    let newest = applied.iter().map(|a| a.0).max().unwrap_or(0);
    for (version, name, sum) in applied {
        match MIGRATIONS.iter().find(|m| m.0 == *version) {
            None => {
                return Err(MigrateError::History(format!(
                    "V{version}__{name} is applied but unknown to this build (a newer release \
                     migrated this schema?)"
                )))
            }
            Some(&(v, n, sql)) if n != name || checksum(v, n, sql).to_string() != *sum => {
                return Err(MigrateError::History(format!(
                    "V{version}__{name} was applied with different contents than this build's \
                     V{v}__{n}"
                )))
            }
            Some(_) => {}
        }
    }
    let mut todo = Vec::new();
    for &(version, name, sql) in &MIGRATIONS {
        if applied.iter().any(|a| a.0 == version) {
            continue;
        }
        if version < newest {
            return Err(MigrateError::History(format!(
                "V{version}__{name} was never applied, but V{newest} was"
            )));
        }
        todo.push((version, name, sql));
    }
    Ok(todo)
}

/// The names of every embedded migration, in order.
pub fn embedded_migrations() -> Vec<String> {
    MIGRATIONS
        .iter()
        .map(|(v, n, _)| format!("V{v}__{n}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_embedded() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|f| f.ends_with(".sql"))
            .map(|f| f.trim_end_matches(".sql").to_owned())
            .collect();
        files.sort_by_key(|f| f[1..].split("__").next().unwrap().parse::<i32>().unwrap());
        assert_eq!(files, embedded_migrations());
        for w in MIGRATIONS.windows(2) {
            assert_eq!(w[1].0, w[0].0 + 1, "versions are consecutive");
        }
    }

    #[test]
    fn history_is_checked_like_refinery_checks_it() {
        let row = |v: i32| {
            let (v, n, sql) = MIGRATIONS[v as usize - 1];
            (v, n.to_owned(), checksum(v, n, sql).to_string())
        };
        assert_eq!(plan(&[]).unwrap().len(), MIGRATIONS.len());
        assert_eq!(plan(&[row(1), row(2)]).unwrap()[0].0, 3);
        let all: Vec<_> = (1..=MIGRATIONS.len() as i32).map(row).collect();
        assert!(plan(&all).unwrap().is_empty());
        // Changed contents, an unknown newer version, a gap below the newest applied one.
        let mut changed = row(1);
        changed.2 = "1".into();
        assert!(matches!(plan(&[changed]), Err(MigrateError::History(_))));
        let unknown = (99, "future".to_owned(), "0".to_owned());
        assert!(plan(&[row(1), unknown]).is_err());
        assert!(plan(&[row(1), row(3)]).is_err());
    }
}
