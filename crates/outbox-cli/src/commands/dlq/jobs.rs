//! `outbox dlq jobs`: Replay jobs, newest first.

use std::io::Write;

use clap::Args as ClapArgs;
use outbox::dlq::Dlq;

use super::*;
use crate::args::*;

/// Replay jobs, newest first.
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    db: DbArgs,
    /// At most this many.
    #[arg(long, default_value_t = 20)]
    limit: i64,
    /// JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let Args { db, limit, json } = args;
    let dlq = Dlq::new(&db_config(&db)?);
    let jobs = dlq.jobs(limit).await.map_err(lift)?;
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&jobs)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "{:>6}  {:<10} {:<24} {:<14} {:>7} {:>7} {:>7} {:>7} {:>7} {:>9}  REASON",
        "ID",
        "STATUS",
        "CREATED",
        "BY",
        "TOTAL",
        "PENDING",
        "SENT",
        "FAILED",
        "SKIPPED",
        "CAME BACK"
    )?;
    for j in &jobs {
        writeln!(
            out,
            "{:>6}  {:<10} {:<24} {:<14} {:>7} {:>7} {:>7} {:>7} {:>7} {:>9}  {}",
            j.id,
            format!("{:?}", j.status).to_lowercase(),
            j.created_at,
            cut(&j.created_by, 14),
            j.total,
            j.pending,
            j.sent,
            j.failed,
            j.skipped,
            j.came_back,
            j.status_reason.as_deref().unwrap_or("")
        )?;
    }

    Ok(())
}
