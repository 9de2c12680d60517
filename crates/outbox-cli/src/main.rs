//! The `outbox` binary: parses arguments, sets up logging, calls the library.
//!
//! Exit codes: 0 success, 1 runtime failure (e.g. Postgres unreachable for a one-shot command),
//! 2 invalid arguments or configuration.

use std::process::ExitCode;
use std::time::Duration;

mod dlq_cli;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use outbox::{CleanupConfig, ConfigError, DbConfig, KafkaConfig, Relay, RelayConfig, Requeue};

#[derive(Parser)]
#[command(
    name = "outbox",
    version,
    about = "Transactional outbox relay and operator tools for Postgres + Kafka"
)]
struct Cli {
    /// Log lines as text (default) or one JSON object per line.
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Args, Clone)]
struct DbArgs {
    /// Postgres connection URL. Its password is never logged.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// Schema holding the outbox tables.
    #[arg(long, env = "OUTBOX_SCHEMA", default_value = outbox::DEFAULT_SCHEMA)]
    schema: String,
}

#[derive(Args, Clone)]
struct KafkaArgs {
    /// Kafka bootstrap servers, host:port[,host:port].
    #[arg(long, env = "KAFKA_BOOTSTRAP_SERVERS")]
    kafka_bootstrap_servers: String,
    /// Any librdkafka property, name=value (repeatable), e.g. -X security.protocol=SASL_SSL.
    #[arg(short = 'X', long = "kafka-property", value_name = "NAME=VALUE")]
    kafka_property: Vec<String>,
}

#[derive(Args, Clone)]
struct CleanupArgs {
    /// Delete sent outbox rows older than this (e.g. 7d, 36h).
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    sent_retention: Duration,
    /// Delete processed_messages rows older than this.
    #[arg(long, default_value = "14d", value_parser = humantime::parse_duration)]
    processed_retention: Duration,
    /// Rows per DELETE statement.
    #[arg(long, default_value_t = outbox::DEFAULT_CLEANUP_BATCH)]
    cleanup_batch_size: usize,
    /// Delete archived dead letters that were replayed or dropped this long after archiving.
    #[arg(long, default_value = "30d", value_parser = humantime::parse_duration)]
    dlq_retention: Duration,
}

#[derive(Subcommand)]
enum Command {
    /// Apply the embedded migrations (idempotent).
    Migrate {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Run the publisher sidecar until SIGTERM/SIGINT.
    Relay {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        kafka: KafkaArgs,
        #[command(flatten)]
        cleanup: CleanupArgs,
        /// Rows claimed per pass.
        #[arg(long, default_value_t = outbox::DEFAULT_BATCH_SIZE)]
        batch_size: usize,
        /// Batches in flight at once: the next is claimed and the previous marked while one
        /// waits for Kafka's acks (1 = one at a time). Each takes a pooled connection.
        #[arg(long, default_value_t = outbox::DEFAULT_IN_FLIGHT_BATCHES)]
        in_flight_batches: usize,
        /// Attempts before a row becomes failed.
        #[arg(long, default_value_t = outbox::DEFAULT_MAX_ATTEMPTS)]
        max_attempts: i32,
        /// Idle poll period (notifications wake the relay sooner).
        #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
        poll_interval: Duration,
        /// librdkafka message.timeout.ms; unreported rows stay pending after it.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        delivery_timeout: Duration,
        /// Flush budget at shutdown.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        shutdown_timeout: Duration,
        /// How often to run cleanup, or "off".
        #[arg(long, default_value = "1h", value_parser = parse_interval)]
        cleanup_interval: Interval,
        /// Do not LISTEN for the enqueue trigger's notifications; rely on polling only.
        #[arg(long)]
        no_listen: bool,
        /// How often to re-count relays and rebalance ordering lanes (dead relays' lanes are
        /// taken over within this interval).
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        rebalance_interval: Duration,
        /// How often to look below the claim floor for rows of very long transactions and rows
        /// put back to pending by hand.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        sweep_interval: Duration,
        /// A transaction open longer than this after inserting outbox rows stops holding the
        /// claim floor back; its rows are published by the next sweep after it commits.
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        long_transaction: Duration,
        /// Serve Prometheus /metrics on this address (e.g. 127.0.0.1:9187).
        #[arg(long)]
        metrics_addr: Option<std::net::SocketAddr>,
    },
    /// The HTTP admin API, the web dashboard and /metrics.
    Admin {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        kafka: KafkaArgs,
        /// Address to listen on; loopback unless you say otherwise.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// One admin token (holder "admin", role admin).
        #[arg(long, env = "OUTBOX_ADMIN_TOKEN", hide_env_values = true)]
        admin_token: Option<String>,
        /// Tokens file: one `HOLDER ROLE SHA256HEX` per line (roles viewer, operator, admin).
        #[arg(long)]
        tokens_file: Option<std::path::PathBuf>,
        /// Serve without authentication (anyone reaching the address can replay and drop).
        #[arg(long)]
        insecure_no_auth: bool,
    },
    /// Print the SHA-256 of a token read from standard input, for a tokens file.
    HashToken,
    /// Counts by status, oldest pending age, failed rows grouped by last_error.
    Status {
        #[command(flatten)]
        db: DbArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Put failed rows back to pending (after fixing the cause).
    Requeue {
        #[command(flatten)]
        db: DbArgs,
        /// Requeue every failed row.
        #[arg(long, conflicts_with = "id", required_unless_present = "id")]
        failed: bool,
        /// Requeue one failed row.
        #[arg(long)]
        id: Option<i64>,
    },
    /// Topics as code: create/verify main, retry and dead-letter topics from a TOML file.
    Topics {
        #[command(subcommand)]
        action: TopicsAction,
    },
    /// Delete sent rows and processed_messages past retention, in bounded batches.
    Cleanup {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        cleanup: CleanupArgs,
    },
    /// Dead letters: archive, summary by cause, list, show, replay jobs, drop, audit.
    Dlq {
        #[command(subcommand)]
        action: dlq_cli::DlqAction,
    },
}

#[derive(Subcommand)]
enum TopicsAction {
    /// Create missing topics and verify existing ones (exit 1 when one differs).
    Apply {
        /// The TOML file (see `topics.toml`).
        file: String,
        #[command(flatten)]
        kafka: KafkaArgs,
    },
}

/// A cleanup schedule: a period or off.
#[derive(Clone, Copy)]
struct Interval(Option<Duration>);

fn parse_interval(s: &str) -> Result<Interval, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(Interval(None));
    }
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err("must be greater than zero, or \"off\"".into());
    }
    Ok(Interval(Some(d)))
}

/// Errors that mean "fix your configuration", reported with exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct UsageError(String);

fn db_config(a: &DbArgs) -> Result<DbConfig, UsageError> {
    DbConfig::new(&a.database_url, &a.schema).map_err(|e| UsageError(e.to_string()))
}

fn kafka_config(a: &KafkaArgs) -> Result<KafkaConfig, UsageError> {
    let mut k =
        KafkaConfig::new(&a.kafka_bootstrap_servers).map_err(|e| UsageError(e.to_string()))?;
    for p in &a.kafka_property {
        k.set_from_pair(p).map_err(|e| UsageError(e.to_string()))?;
    }
    Ok(k)
}

fn cleanup_config(a: &CleanupArgs, interval: Option<Duration>) -> CleanupConfig {
    {
        let mut c = CleanupConfig::default();
        c.sent_retention = a.sent_retention;
        c.processed_retention = a.processed_retention;
        c.dlq_retention = a.dlq_retention;
        c.batch_size = a.cleanup_batch_size;
        c.interval = interval;
        c
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Migrate { db } => {
            let db = db_config(&db)?;
            let report = outbox::migrate(&db).await.context("migrate failed")?;
            if report.applied.is_empty() {
                println!("schema {} is up to date", db.schema);
            } else {
                for m in &report.applied {
                    println!("applied {m}");
                }
            }
        }
        Command::Relay {
            db,
            kafka,
            cleanup,
            batch_size,
            in_flight_batches,
            max_attempts,
            poll_interval,
            delivery_timeout,
            shutdown_timeout,
            cleanup_interval,
            no_listen,
            rebalance_interval,
            sweep_interval,
            long_transaction,
            metrics_addr,
        } => {
            let db = db_config(&db)?;
            let kafka = kafka_config(&kafka)?;
            let config = {
                let mut c = RelayConfig::default();
                c.batch_size = batch_size;
                c.max_attempts = max_attempts;
                c.poll_interval = poll_interval;
                c.delivery_timeout = delivery_timeout;
                c.shutdown_timeout = shutdown_timeout;
                c.listen = !no_listen;
                c.cleanup = cleanup_config(&cleanup, cleanup_interval.0);
                c.rebalance_interval = rebalance_interval;
                c.sweep_interval = sweep_interval;
                c.long_transaction = long_transaction;
                c.in_flight_batches = in_flight_batches;
                c
            };
            let relay = Relay::new(&db, &kafka, config).map_err(|e| match e {
                outbox::RelayError::Config(c) => anyhow::Error::new(UsageError(c.to_string())),
                outbox::RelayError::Kafka(k) => {
                    anyhow::Error::new(UsageError(format!("kafka configuration: {k}")))
                }
                other => anyhow::Error::new(other),
            })?;
            let stop = tokio_util::sync::CancellationToken::new();
            if let Some(addr) = metrics_addr {
                let s = stop.clone();
                outbox::metrics::serve(addr, async move { s.cancelled().await })
                    .await
                    .map_err(|e| UsageError(format!("--metrics-addr {addr}: {e}")))?;
            }
            relay.run(shutdown_signal()).await?;
            stop.cancel();
        }
        Command::Status { db, json } => {
            let db = db_config(&db)?;
            let s = outbox::status(&db).await.context("status failed")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!("{:<8} {:>12}  oldest created_at", "status", "rows");
                for c in &s.counts {
                    println!(
                        "{:<8} {:>12}  {}",
                        c.status,
                        c.count,
                        c.oldest.as_deref().unwrap_or("-")
                    );
                }
                match s.oldest_pending_age_secs {
                    Some(a) => println!("oldest pending age: {a:.1} s"),
                    None => println!("oldest pending age: - (no pending rows)"),
                }
                if s.open_breakers.is_empty() {
                    println!("circuit breakers: none open");
                } else {
                    println!("circuit breakers OPEN (every replica of the group is paused):");
                    for b in &s.open_breakers {
                        println!(
                            "  {:<24} {:<20} closes in {:>6.1} s  opened {} time(s)  {}",
                            b.consumer_group,
                            b.dependency,
                            b.closes_in_secs,
                            b.generation,
                            b.reason.as_deref().unwrap_or("")
                        );
                    }
                }
                if !s.failed_by_error.is_empty() {
                    println!("failed rows by last_error:");
                    for g in &s.failed_by_error {
                        println!(
                            "  {:>8}  ids {}..{}  {}",
                            g.count, g.min_id, g.max_id, g.last_error
                        );
                    }
                }
            }
        }
        Command::Requeue { db, failed, id } => {
            let db = db_config(&db)?;
            let which = match (failed, id) {
                (_, Some(id)) => Requeue::Id(id),
                _ => Requeue::AllFailed,
            };
            let n = outbox::requeue(&db, which)
                .await
                .context("requeue failed")?;
            println!("requeued {n} row(s)");
            if let Requeue::Id(id) = which {
                if n == 0 {
                    return Err(UsageError(format!("no failed row with id {id}")).into());
                }
            }
        }
        Command::Topics {
            action: TopicsAction::Apply { file, kafka },
        } => {
            let kafka = kafka_config(&kafka)?;
            let specs = match std::fs::read_to_string(&file) {
                Ok(text) => {
                    outbox::topics::plan(&text).map_err(|e| UsageError(format!("{file}: {e}")))?
                }
                Err(e) => return Err(UsageError(format!("cannot read {file}: {e}")).into()),
            };
            let results = outbox::topics::apply(&kafka, &specs)
                .await
                .context("topics apply failed")?;
            let mut differs = 0;
            for r in &results {
                match r {
                    outbox::topics::Applied::Created(n) => println!("created   {n}"),
                    outbox::topics::Applied::Unchanged(n) => println!("ok        {n}"),
                    outbox::topics::Applied::Differs {
                        name,
                        actual,
                        expected,
                    } => {
                        differs += 1;
                        println!("DIFFERS   {name}: {actual} partitions on the broker, {expected} in the file");
                    }
                }
            }
            if differs > 0 {
                anyhow::bail!(
                    "{differs} topic(s) differ from {file}; change them by hand or fix the file"
                );
            }
        }
        Command::Dlq { action } => dlq_cli::run(action).await?,
        Command::HashToken => {
            let mut t = String::new();
            std::io::stdin().read_line(&mut t)?;
            let t = t.trim_end_matches(['\n', '\r']);
            if t.is_empty() {
                return Err(UsageError("give the token on standard input".into()).into());
            }
            println!("{}", outbox::admin::token_hash(t));
        }
        Command::Admin {
            db,
            kafka,
            listen,
            admin_token,
            tokens_file,
            insecure_no_auth,
        } => {
            let db = db_config(&db)?;
            let kafka = kafka_config(&kafka)?;
            let auth = match (insecure_no_auth, tokens_file, admin_token) {
                (true, None, None) => outbox::admin::Auth::insecure(),
                (true, _, _) => {
                    return Err(UsageError(
                        "--insecure-no-auth cannot be combined with tokens".into(),
                    )
                    .into())
                }
                (false, Some(f), _) => {
                    let text = std::fs::read_to_string(&f)
                        .map_err(|e| UsageError(format!("cannot read {}: {e}", f.display())))?;
                    outbox::admin::Auth::from_file_text(&text).map_err(UsageError)?
                }
                (false, None, Some(t)) => outbox::admin::Auth::single(&t).map_err(UsageError)?,
                (false, None, None) => {
                    return Err(UsageError(
                        "the admin API needs authentication: set OUTBOX_ADMIN_TOKEN or --tokens-file (or --insecure-no-auth, explicitly)".into(),
                    )
                    .into())
                }
            };
            outbox::admin::serve(listen, &db, &kafka, auth, shutdown_signal())
                .await
                .map_err(|e| UsageError(format!("--listen {listen}: {e}")))?;
        }
        Command::Cleanup { db, cleanup } => {
            let db = db_config(&db)?;
            if cleanup.cleanup_batch_size == 0 {
                return Err(UsageError("cleanup batch size must be at least 1".into()).into());
            }
            let mut m = dlq_cli::Meter::new("cleanup");
            let r = outbox::cleanup_with_progress(&db, &cleanup_config(&cleanup, None), &mut |r| {
                let n = r.outbox_deleted + r.processed_deleted + r.dlq_purged;
                m.update(n, n, &format!("{} statement(s)", r.statements))
            })
            .await
            .context("cleanup failed")?;
            m.finish();
            println!(
                "deleted {} sent outbox row(s), {} processed_messages row(s) and {} settled dead letter(s) in {} statement(s); longest {:?}",
                r.outbox_deleted, r.processed_deleted, r.dlq_purged, r.statements, r.longest_statement
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,tokio_postgres=warn,refinery_core=warn,deadpool=error".into());
    match cli.log_format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init(),
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            let usage = e.downcast_ref::<UsageError>().is_some()
                || e.downcast_ref::<ConfigError>().is_some();
            ExitCode::from(if usage { 2 } else { 1 })
        }
    }
}
