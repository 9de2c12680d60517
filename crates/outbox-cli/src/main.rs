//! The `outbox` binary: parses arguments, sets up logging, calls the library.
//!
//! Exit codes: 0 success, 1 runtime failure (e.g. Postgres unreachable for a one-shot command),
//! 2 invalid arguments or configuration.

use std::process::ExitCode;

mod args;
mod commands;
mod progress;

use std::io::Write as _;

use clap::{Parser, Subcommand};

use args::UsageError;

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

#[derive(Subcommand)]
enum Command {
    /// Apply the embedded migrations (idempotent).
    Migrate(commands::migrate::Args),
    /// Run the publisher sidecar until SIGTERM/SIGINT.
    Relay(commands::relay::Args),
    /// The HTTP admin API, the web dashboard and /metrics.
    Admin(commands::admin::Args),
    /// Print the SHA-256 of a token read from standard input, for a tokens file.
    HashToken,
    /// Counts by status, oldest pending age, failed rows grouped by last_error.
    Status(commands::status::Args),
    /// Put failed rows back to pending (after fixing the cause).
    Requeue(commands::requeue::Args),
    /// Topics as code: create/verify main, retry and dead-letter topics from a TOML file.
    Topics(commands::topics::Args),
    /// Delete sent rows and processed_messages past retention, in bounded batches.
    Cleanup(commands::cleanup::Args),
    /// Dead letters: archive, summary by cause, list, show, replay jobs, drop, audit.
    Dlq {
        #[command(subcommand)]
        action: commands::dlq::DlqAction,
    },
}

/// Runs one command, writing its result to `out` (progress and hints go to standard error).
async fn run(cli: Cli, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    match cli.command {
        Command::Migrate(a) => commands::migrate::run(a, out).await,
        Command::Relay(a) => commands::relay::run(a, out).await,
        Command::Admin(a) => commands::admin::run(a, out).await,
        Command::HashToken => commands::hash_token::run(out).await,
        Command::Status(a) => commands::status::run(a, out).await,
        Command::Requeue(a) => commands::requeue::run(a, out).await,
        Command::Topics(a) => commands::topics::run(a, out).await,
        Command::Cleanup(a) => commands::cleanup::run(a, out).await,
        Command::Dlq { action } => commands::dlq::run(action, out).await,
    }
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
    let mut out = Output::default();
    let result = rt
        .block_on(run(cli, &mut out))
        .and_then(|()| Ok(out.flush()?));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            let usage = e.downcast_ref::<UsageError>().is_some()
                || e.downcast_ref::<outbox::ConfigError>().is_some();
            ExitCode::from(if usage { 2 } else { 1 })
        }
    }
}

/// Standard output that outlives its reader: once the reader has gone (`outbox dlq list |
/// head -1`), what it would have read is discarded instead of failing the write. The command
/// still runs to its end and exits with its own code (a topic that differs still exits 1).
#[derive(Default)]
struct Output {
    closed: bool,
}

impl std::io::Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.closed {
            return Ok(buf.len());
        }
        match std::io::stdout().write(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(buf.len())
            }
            other => other,
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.closed {
            return Ok(());
        }
        match std::io::stdout().flush() {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            other => other,
        }
    }
}
