//! `outbox dlq drop` marks letters dropped, with a reason; `outbox dlq restore` undoes it (dropped
//! letters back to new). Both take the same selection and are audited.

use std::io::Write;

use clap::Args as ClapArgs;
use outbox::dlq::Dlq;

use super::*;
use crate::args::*;

/// The letters to drop or restore, and why.
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    db: DbArgs,
    #[command(flatten)]
    filter: FilterArgs,
    /// Archive ids (repeatable).
    #[arg(long = "id", value_parser = parse_id)]
    ids: Vec<i64>,
    /// Why (required, audited).
    #[arg(long)]
    reason: String,
    /// Allow every new letter (drop) or every dropped letter (restore): no filter.
    #[arg(long)]
    all: bool,
    /// Who does it (audit); default the OS user.
    #[arg(long)]
    actor: Option<String>,
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    act(args, false, out).await
}

pub async fn restore(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    act(args, true, out).await
}

/// A drop, or (`restore`) its undoing: the same selection, reason and audit.
async fn act(args: Args, restore: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let Args {
        db,
        filter,
        ids,
        reason,
        all,
        actor,
    } = args;
    let dlq = Dlq::new(&db_config(&db)?);
    let (f, actor) = (filter.to_filter(&ids)?, actor_or_default(actor));
    if restore {
        let r = dlq
            .restore_letters(&f, all, &reason, &actor)
            .await
            .map_err(lift)?;
        writeln!(out, "restored={}", r.restored)?;
    } else {
        let r = dlq
            .drop_letters(&f, all, &reason, &actor)
            .await
            .map_err(lift)?;
        writeln!(out, "dropped={}", r.dropped)?;
    }
    Ok(())
}
