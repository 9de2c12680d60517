//! `outbox dlq …`: one file per command; each parses its flags, calls `outbox::dlq` and
//! renders to the writer it is given. No logic of its own.

use std::io::Write;
use std::time::Duration;

use clap::{Args, Subcommand};
use outbox::dlq::{DlqError, Filter, Status};
use tokio_util::sync::CancellationToken;

use crate::args::{shutdown_signal, UsageError};

mod archive;
mod audit;
mod drop;
mod job;
mod jobs;
mod list;
mod replay;
mod show;
mod summary;

/// Selection flags shared by list, replay and drop.
#[derive(Args, Clone, Default)]
pub struct FilterArgs {
    /// Original topic (e.g. orders.created).
    #[arg(long)]
    topic: Option<String>,
    /// Consumer group that dead-lettered the message.
    #[arg(long)]
    group: Option<String>,
    /// Case-insensitive substring of the error.
    #[arg(long)]
    error_contains: Option<String>,
    /// Exactly this normalised error (a cause group from `dlq summary`).
    #[arg(long)]
    error_group: Option<String>,
    /// x-error-kind: transient-exhausted, permanent, decode, panic, unavailable.
    #[arg(long)]
    kind: Option<String>,
    /// The tenant the message came from (its x-tenant header).
    #[arg(long)]
    tenant: Option<String>,
    /// new, replayed or dropped.
    #[arg(long)]
    status: Option<String>,
    /// Dead-lettered at or after: RFC 3339 time or a duration ago (2h).
    #[arg(long)]
    since: Option<String>,
    /// Dead-lettered before: RFC 3339 time or a duration ago.
    #[arg(long)]
    until: Option<String>,
}

impl FilterArgs {
    fn to_filter(&self, ids: &[i64]) -> Result<Filter, UsageError> {
        Ok(Filter {
            ids: ids.to_vec(),
            topic: self.topic.clone(),
            group: self.group.clone(),
            error_contains: self.error_contains.clone(),
            error_group: self.error_group.clone(),
            kind: self.kind.clone(),
            tenant: self.tenant.clone(),
            status: self
                .status
                .as_deref()
                .map(str::parse::<Status>)
                .transpose()
                .map_err(|e| UsageError(e.to_string()))?,
            since: self.since.clone(),
            until: self.until.clone(),
        })
    }
}

/// A share: `10%` or `0.1`.
pub(super) fn parse_share(s: &str) -> Result<f64, String> {
    let v = match s.trim().strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|v| v / 100.0),
        None => s.trim().parse::<f64>(),
    }
    .map_err(|_| format!("{s:?} is not a share: give 10% or 0.1"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("{s:?} is out of range: give 0% to 100%"));
    }
    Ok(v)
}

pub(super) fn parse_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a rate: give messages per second"))?;
    let (min, max) = (outbox::dlq::MIN_RATE, outbox::dlq::MAX_RATE);
    if !(v.is_finite() && (min..=max).contains(&v)) {
        return Err(format!("{s:?} is out of range: {min} to {max} per second"));
    }
    Ok(v)
}

pub(super) fn parse_id(s: &str) -> Result<i64, String> {
    match s.parse::<i64>() {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(format!(
            "{s:?} is not a dead letter id (a positive integer)"
        )),
    }
}

// Parsed once per process: the size of its largest variant costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum DlqAction {
    /// Consume DLQ topics into the archive (sidecar until SIGTERM, or --once).
    Archive(archive::Args),
    /// New letters by topic and group, and grouped by cause.
    Summary(summary::Args),
    /// Letters matching filters, newest first.
    List(list::Args),
    /// One letter: headers, key, body.
    Show(show::Args),
    /// Send letters back to their original topic as a throttled, resumable job.
    Replay(replay::Args),
    /// Mark letters dropped, with a reason.
    Drop(drop::Args),
    /// Put dropped letters back to new (undo a drop), with a reason.
    Restore(drop::Args),
    /// Who did what, when, to how many letters.
    Audit(audit::Args),
    /// Replay jobs, newest first.
    Jobs(jobs::Args),
    /// Pause, resume, cancel or show one replay job.
    Job {
        #[command(subcommand)]
        action: job::JobAction,
    },
}

/// Runs one `outbox dlq` command, writing its result to `out`.
pub async fn run(action: DlqAction, out: &mut dyn Write) -> anyhow::Result<()> {
    match action {
        DlqAction::Archive(a) => archive::run(a, out).await,
        DlqAction::Summary(a) => summary::run(a, out).await,
        DlqAction::List(a) => list::run(a, out).await,
        DlqAction::Show(a) => show::run(a, out).await,
        DlqAction::Replay(a) => replay::run(a, out).await,
        DlqAction::Drop(a) => drop::run(a, out).await,
        DlqAction::Restore(a) => drop::restore(a, out).await,
        DlqAction::Audit(a) => audit::run(a, out).await,
        DlqAction::Jobs(a) => jobs::run(a, out).await,
        DlqAction::Job { action } => job::run(action, out).await,
    }
}

/// Invalid requests exit 2, everything else 1.
pub(super) fn lift(e: DlqError) -> anyhow::Error {
    if e.is_invalid() {
        anyhow::Error::new(UsageError(e.to_string()))
    } else {
        anyhow::Error::new(e)
    }
}

pub(super) fn actor_or_default(a: Option<String>) -> String {
    a.unwrap_or_else(outbox::dlq::default_actor)
}

pub(super) fn age(secs: Option<f64>) -> String {
    secs.map_or_else(
        || "-".into(),
        |s| humantime::format_duration(Duration::from_secs(s.max(0.0) as u64)).to_string(),
    )
}

pub(super) fn cut(s: &str, n: usize) -> String {
    let one_line: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one_line.chars().count() <= n {
        one_line
    } else {
        format!("{}…", one_line.chars().take(n - 1).collect::<String>())
    }
}

/// A token cancelled by SIGINT/SIGTERM.
pub(super) fn interrupt_token() -> CancellationToken {
    let t = CancellationToken::new();
    let t2 = t.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        t2.cancel();
    });
    t
}
