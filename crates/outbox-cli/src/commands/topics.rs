//! `outbox topics`: topics as code: create and verify main, retry and dead-letter topics from a
//! TOML file; change existing ones only with `--fix`.

use std::io::Write;

use anyhow::Context as _;
use clap::{Args as ClapArgs, Subcommand};
use outbox::topics::{Applied, Drift};

use crate::args::*;

/// Topics as code: create/verify main, retry and dead-letter topics from a TOML file.
#[derive(ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    action: TopicsAction,
}

fn describe(d: &Drift) -> String {
    format!(
        "{} is {} on the broker, {} in the file",
        d.setting, d.broker, d.file
    )
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let Args {
        action: TopicsAction::Apply { file, fix, kafka },
    } = args;
    let kafka = kafka_config(&kafka)?;
    let specs = match std::fs::read_to_string(&file) {
        Ok(text) => outbox::topics::plan(&text).map_err(|e| UsageError(format!("{file}: {e}")))?,
        Err(e) => return Err(UsageError(format!("cannot read {file}: {e}")).into()),
    };
    let results = outbox::topics::apply(&kafka, &specs, fix)
        .await
        .context("topics apply failed")?;
    let mut differs = 0;
    for r in &results {
        let name = r.name();
        match r {
            Applied::Created(_) => writeln!(out, "created   {name}")?,
            Applied::Unchanged(_) => writeln!(out, "ok        {name}")?,
            Applied::Differs { .. } => {}
            Applied::Fixed { fixed, .. } => {
                for d in fixed {
                    writeln!(
                        out,
                        "fixed     {name}: {} {} -> {}",
                        d.setting, d.broker, d.file
                    )?;
                }
            }
        }
        if !r.remaining().is_empty() {
            differs += 1;
        }
        for d in r.remaining() {
            match d.unfixable {
                Some(why) => writeln!(
                    out,
                    "DRIFT     {name}: {} (not fixable: {why})",
                    describe(d)
                )?,
                None => writeln!(out, "DRIFT     {name}: {}", describe(d))?,
            }
        }
    }
    if differs > 0 {
        let hint = if fix {
            "what --fix cannot change needs the file or the cluster changed by hand"
        } else {
            "run again with --fix to change configs and grow partitions, or fix the file"
        };
        anyhow::bail!("{differs} topic(s) differ from {file}; {hint}");
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum TopicsAction {
    /// Create missing topics and compare existing ones: partitions, replication factor and
    /// every config the file states (exit 1 while one differs).
    Apply {
        /// The TOML file (see `topics.toml`).
        file: String,
        /// Change differing configs to the file's values and grow partitions (never shrinks;
        /// the replication factor is only reported).
        #[arg(long)]
        fix: bool,
        #[command(flatten)]
        kafka: KafkaArgs,
    },
}
