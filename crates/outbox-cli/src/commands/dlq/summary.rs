//! `outbox dlq summary`: New letters by topic and group, and grouped by cause.

use std::io::Write;

use anyhow::Context as _;
use clap::Args as ClapArgs;
use outbox::dlq::Dlq;

use super::*;
use crate::args::*;

/// New letters by topic and group, and grouped by cause.
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    db: DbArgs,
    /// One JSON document instead of tables.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let Args { db, json } = args;
    let dlq = Dlq::new(&db_config(&db)?);
    let s = dlq
        .summary()
        .await
        .map_err(lift)
        .context("summary failed")?;
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&s)?)?;
        return Ok(());
    }
    if s.topics.is_empty() {
        writeln!(
            out,
            "the archive is empty (is `outbox dlq archive` running?)"
        )?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<32} {:<24} {:>8} {:>9} {:>8}  oldest new",
        "TOPIC", "GROUP", "NEW", "REPLAYED", "DROPPED"
    )?;
    for t in &s.topics {
        writeln!(
            out,
            "{:<32} {:<24} {:>8} {:>9} {:>8}  {}",
            cut(&t.original_topic, 32),
            cut(t.consumer_group.as_deref().unwrap_or("-"), 24),
            t.new,
            t.replayed,
            t.dropped,
            age(t.oldest_new_age_secs)
        )?;
    }
    writeln!(out)?;
    writeln!(out, "CAUSES OF NEW LETTERS ({} groups)", s.groups.len())?;
    writeln!(
        out,
        "{:>7}  {:<24} {:<16} {:<20} {:>9}  {:<24} {:<24} ERROR",
        "COUNT", "TOPIC", "GROUP", "KIND", "EXAMPLE", "FIRST SEEN", "LAST SEEN"
    )?;
    for g in &s.groups {
        writeln!(
            out,
            "{:>7}  {:<24} {:<16} {:<20} {:>9}  {:<24} {:<24} {}",
            g.count,
            cut(&g.original_topic, 24),
            cut(g.consumer_group.as_deref().unwrap_or("-"), 16),
            g.error_kind.as_deref().unwrap_or("-"),
            g.example_id,
            g.first_seen,
            g.last_seen,
            cut(&g.error_group, 100)
        )?;
    }

    Ok(())
}
