//! `outbox migrate`: Apply the embedded migrations (idempotent); with `--ring`, then move the
//! schema onto append-only ring storage, online.

use std::io::Write;

use anyhow::Context as _;
use clap::Args as ClapArgs;

use crate::args::*;

/// Apply the embedded migrations (idempotent).
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    db: DbArgs,
    /// Then move the schema onto append-only ring storage (no per-row UPDATE or DELETE; see
    /// docs/RELIABILITY.md "Storage"), online: services keep inserting, relays keep
    /// publishing, unsent rows are carried over. A no-op when it already is.
    #[arg(long)]
    ring: bool,
    /// With --ring: how long one try waits for the outbox table (services' INSERTs queue
    /// behind a waiting try), e.g. 500ms or 2s; 1ms to 60s.
    #[arg(long, value_parser = parse_lock_wait, default_value = "1s")]
    lock_wait: std::time::Duration,
    /// With --ring: tries before giving up (nothing changes on a try that times out).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    attempts: u32,
    /// Then migrate every tenant of the registry in --schema (`outbox tenants`), each in its
    /// database (`default`: this one; others from --database NAME=URL or
    /// OUTBOX_DATABASE_<NAME>). One that fails does not stop the others; the exit code says.
    #[arg(long, conflicts_with = "ring")]
    tenants: bool,
    /// A database tenants name (repeatable), NAME=URL.
    #[arg(long = "database", value_name = "NAME=URL", requires = "tenants")]
    databases: Vec<String>,
}

/// `--lock-wait`: a duration from 1 ms to [`outbox::storage::MoveOptions::MAX_LOCK_WAIT`].
fn parse_lock_wait(s: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    let max = outbox::storage::MoveOptions::MAX_LOCK_WAIT;
    if d < std::time::Duration::from_millis(1) || d > max {
        return Err(format!(
            "must be from 1ms to {} (services' INSERTs queue behind each try)",
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let Args {
        db,
        ring,
        lock_wait,
        attempts,
        tenants,
        databases,
    } = args;
    let db = db_config(&db)?;
    let report = outbox::migrate(&db).await.context("migrate failed")?;
    if report.applied.is_empty() {
        writeln!(out, "schema {} is up to date", db.schema)?;
    } else {
        for m in &report.applied {
            writeln!(out, "applied {m}")?;
        }
    }
    if tenants {
        let named = named_databases(&databases)?;
        let registered = outbox::fleet::tenants(&db)
            .await
            .context("reading the tenants' registry failed")?;
        let mut failed = Vec::new();
        for t in &registered {
            let conn = if t.database == outbox::fleet::DEFAULT_DATABASE {
                Some(db.clone())
            } else {
                named.get(&t.database).cloned()
            };
            let Some(mut conn) = conn else {
                writeln!(
                    out,
                    "tenant {}: database {} not given (--database {}=URL)",
                    t.tenant, t.database, t.database
                )?;
                failed.push(t.tenant.clone());
                continue;
            };
            conn.schema = t.schema.clone();
            match outbox::migrate(&conn).await {
                Ok(r) => writeln!(
                    out,
                    "tenant {} ({}.{}): {}",
                    t.tenant,
                    t.database,
                    t.schema.name(),
                    if r.applied.is_empty() {
                        "up to date".to_owned()
                    } else {
                        format!("{} migrations applied", r.applied.len())
                    }
                )?,
                Err(e) => {
                    writeln!(out, "tenant {}: migrate failed: {e}", t.tenant)?;
                    failed.push(t.tenant.clone());
                }
            }
        }
        if !failed.is_empty() {
            anyhow::bail!(
                "{} of {} tenants not migrated: {}",
                failed.len(),
                registered.len(),
                failed.join(", ")
            );
        }
    }
    if ring {
        let mut options = outbox::storage::MoveOptions::default();
        options.lock_wait = lock_wait;
        options.attempts = attempts;
        let moved = outbox::storage::use_ring(&db, options)
            .await
            .context("moving onto ring storage failed")?;
        if moved.moved {
            writeln!(
                out,
                "schema {} moved onto ring storage ({} unsent rows carried over, {} tries)",
                db.schema, moved.carried, moved.attempts
            )?;
        } else {
            writeln!(out, "schema {} is on ring storage", db.schema)?;
        }
    }
    Ok(())
}
