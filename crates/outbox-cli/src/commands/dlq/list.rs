//! `outbox dlq list`: Letters matching filters, newest (or oldest) first.

use std::io::Write;

use clap::Args as ClapArgs;
use outbox::dlq::{Dlq, Order};

use super::*;
use crate::args::*;

/// Letters matching filters, newest first (`--oldest-first`: what waited longest).
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    db: DbArgs,
    #[command(flatten)]
    filter: FilterArgs,
    /// At most this many.
    #[arg(long, default_value_t = 50)]
    limit: i64,
    /// The earliest letters first.
    #[arg(long)]
    oldest_first: bool,
    /// Next page: letters past this id (below it newest first, above it oldest first).
    #[arg(long, alias = "before-id")]
    past_id: Option<i64>,
    /// JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let Args {
        db,
        filter,
        limit,
        oldest_first,
        past_id,
        json,
    } = args;
    let order = if oldest_first {
        Order::OldestFirst
    } else {
        Order::NewestFirst
    };
    let dlq = Dlq::new(&db_config(&db)?);
    let rows = dlq
        .list(&filter.to_filter(&[])?, limit, order, past_id)
        .await
        .map_err(lift)?;
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "{:>9}  {:<24} {:<8} {:<20} {:<24} {:<16} ERROR",
        "ID", "FAILED AT", "STATUS", "KIND", "TOPIC", "GROUP"
    )?;
    for r in &rows {
        writeln!(
            out,
            "{:>9}  {:<24} {:<8} {:<20} {:<24} {:<16} {}",
            r.id,
            r.failed_at,
            r.status,
            r.error_kind.as_deref().unwrap_or("-"),
            cut(&r.original_topic, 24),
            cut(r.consumer_group.as_deref().unwrap_or("-"), 16),
            cut(r.error.as_deref().unwrap_or("-"), 100)
        )?;
    }
    if rows.len() as i64 == limit {
        if let Some(last) = rows.last() {
            eprintln!("more: add --past-id {}", last.id);
        }
    }

    Ok(())
}
