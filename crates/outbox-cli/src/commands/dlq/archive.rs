//! `outbox dlq archive`: Consume DLQ topics into the archive (sidecar until SIGTERM, or --once).

use std::io::Write;
use std::time::Duration;

use clap::Args as ClapArgs;
use outbox::dlq::Archiver;

use super::*;
use crate::args::*;
use crate::progress::Meter;

/// Consume DLQ topics into the archive (sidecar until SIGTERM, or --once).
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    db: DbArgs,
    #[command(flatten)]
    kafka: KafkaArgs,
    /// A dead-letter topic to archive (repeatable).
    #[arg(long = "topic")]
    topics: Vec<String>,
    /// Archive the dead-letter topics this topics file declares (the file `topics apply`
    /// takes).
    #[arg(long, env = "OUTBOX_TOPICS_FILE")]
    topics_file: Option<std::path::PathBuf>,
    /// Archive every topic on the cluster ending in the DLQ suffix, other deployments'
    /// included (on a shared cluster, prefer --topics-file).
    #[arg(long, conflicts_with_all = ["topics", "topics_file"])]
    all_dlq_topics: bool,
    /// Archive what is there now, then exit.
    #[arg(long)]
    once: bool,
    /// Replayed/dropped letters are purged this long after archiving.
    #[arg(long, default_value = "30d", value_parser = humantime::parse_duration)]
    retention: Duration,
    /// Dead-letter topic suffix.
    #[arg(long, default_value = "dlq")]
    dlq_suffix: String,
    /// The archiver's consumer group [default: outbox-dlq-archive.<database>.<schema>, one per
    /// deployment].
    #[arg(long)]
    archive_group: Option<String>,
    /// Serve Prometheus /metrics on this address (sidecar mode).
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// A host name /metrics also answers to (repeat for several), besides IP literals and
    /// localhost: the name the scraper uses, e.g. a Kubernetes Service's. Others get 403.
    #[arg(
        long = "metrics-allowed-host",
        value_name = "NAME",
        requires = "metrics_addr"
    )]
    metrics_allowed_hosts: Vec<String>,
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let Args {
        db,
        kafka,
        mut topics,
        topics_file,
        all_dlq_topics,
        once,
        retention,
        dlq_suffix,
        archive_group,
        metrics_addr,
        metrics_allowed_hosts,
    } = args;
    let stop = CancellationToken::new();
    let db = db_config(&db)?;
    let kafka = kafka_config(&kafka)?;
    let mut origins = Vec::new();
    if let Some(f) = &topics_file {
        let text = std::fs::read_to_string(f)
            .map_err(|e| UsageError(format!("cannot read {}: {e}", f.display())))?;
        origins = outbox::topics::dead_letter_topics(&text)
            .map_err(|e| UsageError(format!("{}: {e}", f.display())))?;
        topics.extend(origins.iter().map(|(dlq, _)| dlq.clone()));
    }
    let a = if all_dlq_topics {
        Archiver::every_dlq_topic(&db, &kafka)
    } else if topics.is_empty() {
        return Err(UsageError(
            "say which dead-letter topics to archive: --topics-file FILE, --topic NAME, or \
             --all-dlq-topics (every *.dlq on the cluster, other deployments' included)"
                .into(),
        )
        .into());
    } else {
        Archiver::new(&db, &kafka, topics).map_err(|e| UsageError(e.to_string()))?
    };
    let group = archive_group.unwrap_or_else(|| Archiver::default_group(&db));
    let a = a
        .suffix(&dlq_suffix)
        .retention(retention)
        .group(&group)
        .origins(origins);
    serve_metrics(metrics_addr, metrics_allowed_hosts, Some(a.health()), &stop).await?;
    let r = if once {
        let mut m = Meter::new("archive");
        let r = a
            .run_once(&mut |r, total| {
                m.update(
                    r.read,
                    total.unwrap_or(r.read),
                    &format!("archived {}", r.archived),
                )
            })
            .await
            .map_err(lift)?;
        m.finish();
        r
    } else {
        a.run(shutdown_signal()).await.map_err(lift)?
    };
    writeln!(
        out,
        "archived={} duplicates={} read={}",
        r.archived, r.duplicates, r.read
    )?;

    Ok(())
}
