//! `outbox requeue`: Put failed rows back to pending (after fixing the cause).

use std::io::Write;

use anyhow::Context as _;
use clap::Args as ClapArgs;

use crate::args::*;
use outbox::Requeue;

/// Put failed rows back to pending (after fixing the cause).
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    db: DbArgs,
    /// Requeue every failed row.
    #[arg(long, conflicts_with = "id", required_unless_present = "id")]
    failed: bool,
    /// Requeue one failed row.
    #[arg(long)]
    id: Option<i64>,
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let Args { db, failed, id } = args;
    let db = db_config(&db)?;
    let which = match (failed, id) {
        (_, Some(id)) => Requeue::Id(id),
        _ => Requeue::AllFailed,
    };
    let n = outbox::requeue(&db, which)
        .await
        .context("requeue failed")?;
    writeln!(out, "requeued {n} row(s)")?;
    if let Requeue::Id(id) = which {
        if n == 0 {
            return Err(UsageError(format!("no failed row with id {id}")).into());
        }
    }

    Ok(())
}
