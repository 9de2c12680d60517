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
    /// Then migrate the tenants of the registry in --schema: `--tenants` all, `--tenant
    /// NAME` one (see `outbox tenants`).
    #[command(flatten)]
    tenants: TenantArgs,
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
    } = args;
    if ring && tenants.selected() {
        return Err(
            UsageError("--ring acts on one schema: not with --tenants or --tenant".into()).into(),
        );
    }
    let db = db_config(&db)?;
    let report = outbox::migrate(&db).await.context("migrate failed")?;
    if report.applied.is_empty() {
        writeln!(out, "schema {} is up to date", db.schema)?;
    } else {
        for m in &report.applied {
            writeln!(out, "applied {m}")?;
        }
    }
    let targets = tenants.targets(&db).await?.unwrap_or_default();
    let mut failed = Vec::new();
    for t in &targets {
        let label = t.label();
        let conn = match &t.db {
            Ok(c) => c,
            Err(e) => {
                writeln!(out, "tenant {label}: {e}")?;
                failed.push(t.tenant.tenant.clone());
                continue;
            }
        };
        match outbox::migrate(conn).await {
            Ok(r) if r.applied.is_empty() => writeln!(out, "tenant {label}: up to date")?,
            Ok(r) => writeln!(
                out,
                "tenant {label}: {} migrations applied",
                r.applied.len()
            )?,
            Err(e) => {
                writeln!(out, "tenant {label}: migrate failed: {e}")?;
                failed.push(t.tenant.tenant.clone());
            }
        }
    }
    tenants_done(&failed, targets.len(), "not migrated")?;
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
