//! `outbox dlq audit`: Who did what, when, to how many letters.

use std::io::Write;

use clap::Args as ClapArgs;
use outbox::dlq::Dlq;

use super::*;
use crate::args::*;

/// Who did what, when, to how many letters.
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    db: DbArgs,
    /// At most this many rows, newest first.
    #[arg(long, default_value_t = 50)]
    limit: i64,
    /// JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let Args { db, limit, json } = args;
    let dlq = Dlq::new(&db_config(&db)?);
    let rows = dlq.audit(limit).await.map_err(lift)?;
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "{:>7}  {:<24} {:<16} {:<13} {:<14} {:>8}  REASON / FILTER",
        "ID", "AT", "ACTOR", "VIA", "ACTION", "COUNT"
    )?;
    for a in &rows {
        // The API's holders and the CLI's --actor can share a name; `via` tells them apart.
        let via = match a.via.as_str() {
            "outbox-cli" => "cli",
            outbox::admin::API_APPLICATION_NAME => "api",
            other => other,
        };
        writeln!(
            out,
            "{:>7}  {:<24} {:<16} {:<13} {:<14} {:>8}  {} {}",
            a.id,
            a.at,
            cut(&a.actor, 16),
            cut(via, 13),
            a.action,
            a.count,
            a.reason.as_deref().unwrap_or(""),
            cut(&a.filter.to_string(), 120)
        )?;
    }

    Ok(())
}
