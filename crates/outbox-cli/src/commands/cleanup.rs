//! `outbox cleanup`: Delete sent rows and processed_messages past retention, in bounded batches.

use std::io::Write;

use anyhow::Context as _;
use clap::Args as ClapArgs;

use crate::args::*;

/// Delete sent rows and processed_messages past retention, in bounded batches.
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    db: DbArgs,
    #[command(flatten)]
    cleanup: CleanupArgs,
    /// Instead: clean the registry's tenants (`--tenants` all, `--tenant NAME` one), each in
    /// its own outbox. One that fails does not stop the others; the exit code says.
    #[command(flatten)]
    tenants: TenantArgs,
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let Args {
        db,
        cleanup,
        tenants,
    } = args;
    let db = db_config(&db)?;
    if cleanup.cleanup_batch_size == 0 {
        return Err(UsageError("cleanup batch size must be at least 1".into()).into());
    }
    let config = cleanup_config(&cleanup, None);
    let Some(targets) = tenants.targets(&db).await? else {
        return clean(&db, &config, "", out).await;
    };
    let mut failed = Vec::new();
    for t in &targets {
        let prefix = format!("tenant {}: ", t.label());
        let done = match &t.db {
            Ok(conn) => clean(conn, &config, &prefix, out).await,
            Err(e) => Err(anyhow::anyhow!("{e}")),
        };
        if let Err(e) = done {
            writeln!(out, "{prefix}{e:#}")?;
            failed.push(t.tenant.tenant.clone());
        }
    }
    tenants_done(&failed, targets.len(), "not cleaned")
}

/// One outbox's cleanup, its report lines starting with `prefix`.
async fn clean(
    db: &outbox::DbConfig,
    config: &outbox::CleanupConfig,
    prefix: &str,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut m = crate::progress::Meter::new("cleanup");
    let r = outbox::cleanup_with_progress(db, config, &mut |r| {
        let n = r.outbox_deleted + r.processed_deleted + r.dlq_purged;
        m.update(n, n, &format!("{} statement(s)", r.statements))
    })
    .await
    .context("cleanup failed")?;
    m.finish();
    writeln!(out,
        "{prefix}deleted {} sent outbox row(s), {} processed_messages row(s) and {} settled dead letter(s) in {} statement(s); longest {:?}",
        r.outbox_deleted, r.processed_deleted, r.dlq_purged, r.statements, r.longest_statement
    )?;
    if r.generations_reclaimed > 0 || r.generations_busy > 0 || r.generation_advanced {
        writeln!(
            out,
            "{prefix}ring storage: {} generation(s) reclaimed, {} busy (tried again next run), {}",
            r.generations_reclaimed,
            r.generations_busy,
            if r.generation_advanced {
                "new rows go to the next generation"
            } else {
                "the current generation stays"
            }
        )?;
    }
    Ok(())
}
