//! `outbox topics`: Topics as code: create/verify main, retry and dead-letter topics from a TOML file.

use std::io::Write;

use anyhow::Context as _;
use clap::{Args as ClapArgs, Subcommand};

use crate::args::*;

/// Topics as code: create/verify main, retry and dead-letter topics from a TOML file.
#[derive(ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    action: TopicsAction,
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let Args {
        action: TopicsAction::Apply { file, kafka },
    } = args;
    let kafka = kafka_config(&kafka)?;
    let specs = match std::fs::read_to_string(&file) {
        Ok(text) => outbox::topics::plan(&text).map_err(|e| UsageError(format!("{file}: {e}")))?,
        Err(e) => return Err(UsageError(format!("cannot read {file}: {e}")).into()),
    };
    let results = outbox::topics::apply(&kafka, &specs)
        .await
        .context("topics apply failed")?;
    let mut differs = 0;
    for r in &results {
        match r {
            outbox::topics::Applied::Created(n) => writeln!(out, "created   {n}")?,
            outbox::topics::Applied::Unchanged(n) => writeln!(out, "ok        {n}")?,
            outbox::topics::Applied::Differs {
                name,
                actual,
                expected,
            } => {
                differs += 1;
                writeln!(
                    out,
                    "DIFFERS   {name}: {actual} partitions on the broker, {expected} in the file"
                )?;
            }
        }
    }
    if differs > 0 {
        anyhow::bail!("{differs} topic(s) differ from {file}; change them by hand or fix the file");
    }

    Ok(())
}

#[derive(Subcommand)]
pub enum TopicsAction {
    /// Create missing topics and verify existing ones (exit 1 when one differs).
    Apply {
        /// The TOML file (see `topics.toml`).
        file: String,
        #[command(flatten)]
        kafka: KafkaArgs,
    },
}
