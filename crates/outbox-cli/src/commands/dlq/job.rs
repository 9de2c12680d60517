//! `outbox dlq job …` and `outbox dlq jobs`' runner: pause, resume, cancel or show one replay job.

use std::io::Write;

use clap::Subcommand;
use outbox::dlq::{Dlq, RunOutcome};

use super::*;
use crate::args::*;
use crate::progress::Meter;

#[derive(Subcommand)]
pub enum JobAction {
    /// Stop a running job after the letters in flight; resumable.
    Pause {
        #[command(flatten)]
        db: DbArgs,
        /// Job id.
        id: i64,
        /// Who (recorded in the job's reason and the audit log).
        #[arg(long)]
        actor: Option<String>,
        /// Why (audited).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Run a paused, pending or orphaned job in the foreground.
    Resume {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        kafka: KafkaArgs,
        /// Job id.
        id: i64,
        /// Who (audited).
        #[arg(long)]
        actor: Option<String>,
        /// Why (audited).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Cancel a job; unsent letters stay new.
    Cancel {
        #[command(flatten)]
        db: DbArgs,
        /// Job id.
        id: i64,
        /// Who (recorded in the job's reason and the audit log).
        #[arg(long)]
        actor: Option<String>,
        /// Why (audited).
        #[arg(long)]
        reason: Option<String>,
    },
    /// One job and its counts.
    Show {
        #[command(flatten)]
        db: DbArgs,
        /// Job id.
        id: i64,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Runs one `outbox dlq job` command.
pub async fn run(action: JobAction, out: &mut dyn Write) -> anyhow::Result<()> {
    match action {
        JobAction::Pause {
            db,
            id,
            actor,
            reason,
        } => {
            let dlq = Dlq::new(&db_config(&db)?);
            let j = dlq
                .pause_job(id, &actor_or_default(actor), reason.as_deref())
                .await
                .map_err(lift)?;
            writeln!(
                out,
                "job {} paused ({} sent, {} pending)",
                j.id, j.sent, j.pending
            )?;
        }
        JobAction::Cancel {
            db,
            id,
            actor,
            reason,
        } => {
            let dlq = Dlq::new(&db_config(&db)?);
            let j = dlq
                .cancel_job(id, &actor_or_default(actor), reason.as_deref())
                .await
                .map_err(lift)?;
            writeln!(
                out,
                "job {} cancelled ({} sent; {} unsent letter(s) stay new)",
                j.id, j.sent, j.pending
            )?;
        }
        JobAction::Resume {
            db,
            kafka,
            id,
            actor,
            reason,
        } => {
            let dlq = Dlq::new(&db_config(&db)?);
            let kafka = kafka_config(&kafka)?;
            let how = How::Resume {
                actor: actor_or_default(actor),
                reason,
            };
            run_job(&dlq, &kafka, id, how, out).await?;
        }
        JobAction::Show { db, id, json } => {
            let dlq = Dlq::new(&db_config(&db)?);
            let j = dlq.job(id).await.map_err(lift)?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&j)?)?;
            } else {
                let v = serde_json::to_value(&j)?;
                for (k, v) in v.as_object().into_iter().flatten() {
                    writeln!(out, "{k:<15} {v}")?;
                }
            }
        }
    }
    Ok(())
}

/// How the foreground runner takes a job up.
pub(super) enum How {
    /// A job this command just created.
    New,
    /// `outbox dlq job resume`: audited with who and why once the runner holds the job.
    Resume {
        actor: String,
        reason: Option<String>,
    },
}

/// Runs a job in the foreground with its progress; the final line is always printed.
pub(super) async fn run_job(
    dlq: &Dlq,
    kafka: &outbox::KafkaConfig,
    id: i64,
    how: How,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let stop = interrupt_token();
    let mut m = Meter::new(&format!("replay job {id}"));
    let mut show = |p: &outbox::dlq::Progress| {
        m.update(
            p.sent + p.failed + p.skipped,
            p.total,
            &format!("failed {} came back {}", p.failed, p.came_back),
        )
    };
    let outcome = match how {
        How::New => dlq.run_new_job(kafka, id, &stop, &mut show).await,
        How::Resume { actor, reason } => {
            dlq.resume_job(kafka, id, &actor, reason.as_deref(), &stop, &mut show)
                .await
        }
    };
    m.finish();
    let outcome = outcome.map_err(lift)?;
    let j = dlq.job(id).await.map_err(lift)?;
    writeln!(
        out,
        "replayed={} failed={} skipped={} came_back={} pending={} job={} status={}",
        j.sent,
        j.failed,
        j.skipped,
        j.came_back,
        j.pending,
        j.id,
        format!("{:?}", j.status).to_lowercase()
    )?;
    match outcome {
        RunOutcome::Completed if j.failed == 0 => Ok(()),
        RunOutcome::Completed => anyhow::bail!(
            "{} letter(s) could not be replayed (see `outbox dlq job show {id}`)",
            j.failed
        ),
        RunOutcome::Paused(why) => {
            anyhow::bail!("job {id} paused: {why}; resume with `outbox dlq job resume {id}`")
        }
        RunOutcome::Cancelled => anyhow::bail!("job {id} was cancelled"),
        RunOutcome::Stopped(why) => anyhow::bail!("job {id} stopped: {why}"),
    }
}
