//! `outbox trace QUERY`: one message's journey — outbox row, each group's outcome, dead
//! letters, replays and drops with their audit rows.

use std::io::Write;

use anyhow::Context as _;
use clap::Args as ClapArgs;
use outbox::journey::MessageJourney;

use crate::args::*;

/// One message's journey: by message id, key (entity id), dead letter `#ID`, or a business id
/// anywhere in the body.
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    db: DbArgs,
    /// A message id, a key, `#42` (a dead letter's archive id), or a value in the body.
    query: String,
    /// JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let db = db_config(&args.db)?;
    let found = outbox::journey::trace(&db, &args.query)
        .await
        .context("trace failed")?;
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&found)?)?;
        return Ok(());
    }
    if found.is_empty() {
        writeln!(out, "nothing found for {:?}", args.query)?;
        return Ok(());
    }
    for j in &found {
        render(j, out)?;
    }
    Ok(())
}

fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".into(), ToString::to_string)
}

/// One journey as text, in the order things happened to the message.
fn render(j: &MessageJourney, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "message {}",
        j.message_id.as_deref().unwrap_or("(no message id)")
    )?;
    for o in &j.outbox {
        writeln!(
            out,
            "  outbox #{:<8} {:<8} {} key={} type={} attempts={} created={} sent={}{}",
            o.id,
            o.status,
            o.topic,
            opt(&o.key),
            opt(&o.message_type),
            o.attempts,
            o.created_at,
            opt(&o.sent_at),
            if o.tombstone { " (tombstone)" } else { "" }
        )?;
        if let Some(e) = &o.last_error {
            writeln!(out, "      last error: {e}")?;
        }
    }
    if j.outbox.is_empty() {
        writeln!(
            out,
            "  outbox   (no row: cleaned up, or not published through the outbox)"
        )?;
    }
    for h in &j.handled {
        writeln!(
            out,
            "  handled  by {:<24} from {} at {}",
            h.group, h.topic, h.at
        )?;
    }
    for h in &j.holds {
        if h.role == "held" {
            writeln!(
                out,
                "  held     by {:<24} on {} behind {} since {} (strict order: waits for its key's failed message)",
                h.group,
                h.topic,
                opt(&h.head),
                h.since
            )?;
        } else {
            writeln!(
                out,
                "  holding  its key in {:<20} on {} since {}: {} message(s) wait behind it",
                h.group, h.topic, h.since, h.waiting
            )?;
        }
    }
    for l in &j.dead_letters {
        writeln!(
            out,
            "  dead letter #{} by {} ({}) at {}: {} [{} attempt(s), {} earlier] now {}{}",
            l.id,
            opt(&l.group),
            opt(&l.kind),
            l.failed_at,
            opt(&l.error),
            opt(&l.attempts),
            l.dlq_retries,
            l.status,
            l.status_reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        )?;
        writeln!(
            out,
            "      failed at {}[{}]@{}, stored at {}[{}]@{}{}",
            l.original.0,
            opt(&l.original.1),
            opt(&l.original.2),
            l.dlq.0,
            l.dlq.1,
            l.dlq.2,
            l.comeback_of
                .map(|(job, of)| format!(", came back from job {job} (letter #{of})"))
                .unwrap_or_default()
        )?;
    }
    for r in &j.replays {
        writeln!(
            out,
            "  replay   job {} ({}, by {}) letter #{} {} at {}{}",
            r.job,
            r.job_status,
            r.by,
            r.letter,
            r.state,
            opt(&r.sent_at),
            r.came_back_as
                .map(|b| format!(" — came back as #{b}"))
                .unwrap_or_default()
        )?;
    }
    for a in &j.audit {
        writeln!(
            out,
            "  audit    #{} {} {} by {} via {} ({} letter(s)) {}",
            a.id,
            a.at,
            a.action,
            a.actor,
            a.via,
            a.count,
            opt(&a.reason)
        )?;
    }
    Ok(())
}
