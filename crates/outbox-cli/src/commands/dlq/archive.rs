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
    /// DLQ topics to archive (repeatable); default every *.dlq on the cluster.
    #[arg(long = "topic")]
    topics: Vec<String>,
    /// Archive what is there now, then exit.
    #[arg(long)]
    once: bool,
    /// Replayed/dropped letters are purged this long after archiving.
    #[arg(long, default_value = "30d", value_parser = humantime::parse_duration)]
    retention: Duration,
    /// Dead-letter topic suffix.
    #[arg(long, default_value = "dlq")]
    dlq_suffix: String,
    /// The archiver's consumer group.
    #[arg(long, default_value = outbox::dlq::ARCHIVE_GROUP)]
    archive_group: String,
    /// Serve Prometheus /metrics on this address (sidecar mode).
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let Args {
        db,
        kafka,
        topics,
        once,
        retention,
        dlq_suffix,
        archive_group,
        metrics_addr,
    } = args;
    let stop = CancellationToken::new();
    serve_metrics(metrics_addr, &stop).await?;
    let db = db_config(&db)?;
    let kafka = kafka_config(&kafka)?;
    let a = Archiver::new(&db, &kafka, topics)
        .map_err(lift)?
        .suffix(&dlq_suffix)
        .retention(retention)
        .group(&archive_group);
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
