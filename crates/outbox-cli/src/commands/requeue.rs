//! `outbox requeue`: put failed rows back to pending (after fixing the cause), or sent rows of
//! one topic (re-publish, after the broker lost the topic's data).

use std::io::Write;

use anyhow::Context as _;
use clap::Args as ClapArgs;

use crate::args::*;
use outbox::republish::{RequeueError, RequeueSent};
use outbox::status::Requeue;

/// Put failed rows back to pending, or publish sent rows of a topic again.
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    db: DbArgs,
    /// Requeue every failed row.
    #[arg(long, conflicts_with_all = ["id", "sent"], required_unless_present_any = ["id", "sent"])]
    failed: bool,
    /// Requeue one failed row.
    #[arg(long, conflicts_with = "sent")]
    id: Option<i64>,
    /// Publish sent rows of --topic again (rebuilding a topic after broker data loss).
    #[arg(long, requires = "topic")]
    sent: bool,
    /// The topic whose sent rows are published again.
    #[arg(long, requires = "sent")]
    topic: Option<String>,
    /// Sent rows created at or after: RFC 3339 time or a duration ago (2h).
    #[arg(long, requires = "sent", value_parser = outbox::parse_instant)]
    since: Option<std::time::SystemTime>,
    /// Sent rows created before: RFC 3339 time or a duration ago.
    #[arg(long, requires = "sent", value_parser = outbox::parse_instant)]
    until: Option<std::time::SystemTime>,
    /// Rows per transaction.
    #[arg(long, default_value_t = outbox::republish::RequeueSent::DEFAULT_BATCH, requires = "sent")]
    batch: usize,
    /// Only count what would be published again.
    #[arg(long, requires = "sent")]
    dry_run: bool,
    /// Who re-publishes (audit); default the OS user.
    #[arg(long, requires = "sent")]
    actor: Option<String>,
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let db_cfg = db_config(&args.db)?;
    if args.sent {
        let mut which = RequeueSent::topic(args.topic.clone().unwrap_or_default());
        which.since = args.since;
        which.until = args.until;
        which.batch = args.batch;
        let lift = |e: outbox::republish::RequeueError| match e {
            RequeueError::Invalid(m) => anyhow::Error::new(UsageError(m)),
            e => anyhow::Error::new(e).context("requeue --sent failed"),
        };
        let n = outbox::republish::count_sent(&db_cfg, &which)
            .await
            .map_err(lift)?;
        writeln!(out, "{n} sent row(s) of {} selected", which.topic)?;
        if args.dry_run || n == 0 {
            if args.dry_run {
                writeln!(out, "dry run: nothing changed")?;
            }
            return Ok(());
        }
        let actor = args.actor.unwrap_or_else(outbox::dlq::default_actor);
        let r = outbox::republish::requeue_sent(&db_cfg, &which, &actor)
            .await
            .map_err(lift)?;
        writeln!(
            out,
            "requeued {} sent row(s) in {} batch(es); the relay publishes them again in id order",
            r.rows, r.batches
        )?;
        return Ok(());
    }
    let which = match args.id {
        Some(id) => Requeue::Id(id),
        None => Requeue::AllFailed,
    };
    let n = outbox::status::requeue(&db_cfg, which)
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
