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
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let Args { db, cleanup } = args;
    let db = db_config(&db)?;
    if cleanup.cleanup_batch_size == 0 {
        return Err(UsageError("cleanup batch size must be at least 1".into()).into());
    }
    let mut m = crate::progress::Meter::new("cleanup");
    let r = outbox::cleanup_with_progress(&db, &cleanup_config(&cleanup, None), &mut |r| {
        let n = r.outbox_deleted + r.processed_deleted + r.dlq_purged;
        m.update(n, n, &format!("{} statement(s)", r.statements))
    })
    .await
    .context("cleanup failed")?;
    m.finish();
    writeln!(out,
        "deleted {} sent outbox row(s), {} processed_messages row(s) and {} settled dead letter(s) in {} statement(s); longest {:?}",
        r.outbox_deleted, r.processed_deleted, r.dlq_purged, r.statements, r.longest_statement
    )?;
    if r.generations_reclaimed > 0 || r.generations_busy > 0 || r.generation_advanced {
        writeln!(
            out,
            "ring storage: {} generation(s) reclaimed, {} busy (tried again next run), {}",
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
