//! `outbox migrate`: Apply the embedded migrations (idempotent).

use std::io::Write;

use anyhow::Context as _;
use clap::Args as ClapArgs;

use crate::args::*;

/// Apply the embedded migrations (idempotent).
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    db: DbArgs,
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let Args { db } = args;
    let db = db_config(&db)?;
    let report = outbox::migrate(&db).await.context("migrate failed")?;
    if report.applied.is_empty() {
        writeln!(out, "schema {} is up to date", db.schema)?;
    } else {
        for m in &report.applied {
            writeln!(out, "applied {m}")?;
        }
    }

    Ok(())
}
