//! The `outbox` binary: parses arguments, sets up logging, calls the library.
//!
//! Exit codes: 0 success, 1 runtime failure (e.g. Postgres unreachable for a one-shot command),
//! 2 invalid arguments or configuration.

use std::process::ExitCode;

mod args;
mod commands;
mod progress;
mod redact;

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
    /// One message's journey: outbox row, each group's outcome, dead letters, replays, audit.
    Trace(commands::trace::Args),
    /// Schema files as code: check them against the registry's compatibility rule (CI), or
    /// register them.
    Schemas(commands::schemas::Args),
    /// The tenants a relay fleet publishes (`outbox relay --tenants`).
    Tenants(commands::tenants::Args),
    /// Dead letters: archive, summary by cause, list, show, replay jobs, drop, audit.
    Dlq {
        #[command(subcommand)]
        action: commands::dlq::DlqAction,
    },
}

impl Command {
    /// The `service.name` its spans carry unless `OTEL_SERVICE_NAME` says otherwise.
    fn service_name(&self) -> &'static str {
        match self {
            Command::Relay(_) => "outbox-relay",
            Command::Admin(_) => "outbox-admin",
            Command::Dlq { .. } => "outbox-dlq",
            _ => "outbox",
        }
    }
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
        Command::Trace(a) => commands::trace::run(a, out).await,
        Command::Schemas(a) => commands::schemas::run(a, out).await,
        Command::Tenants(a) => commands::tenants::run(a, out).await,
        Command::Dlq { action } => commands::dlq::run(action, out).await,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,tokio_postgres=warn,refinery_core=warn,deadpool=error".into());
    match cli.log_format {
        // No colours: a log line's ESC bytes could then only come from data (see redact.rs).
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(|| redact::Stderr)
            .with_ansi(false)
            .init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_env_filter(filter)
            .with_writer(|| redact::Stderr)
            .init(),
    }
    // A panic's message may quote data or a secret: it goes through the same cleaning as
    // every log line.
    std::panic::set_hook(Box::new(|info| {
        let line = redact::log_line(format!("panic: {info}\n").as_bytes());
        let _ = std::io::stderr().write_all(&line);
    }));
    // Spans over OTLP when the standard OTEL_* variables ask for it; flushed after the
    // command returns (for the relay, after its SIGTERM shutdown).
    let otel = match outbox_otlp::init(cli.command.service_name()) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
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
    otel.shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let text = redact::clean(&format!("error: {e:#}\n"));
            let _ = std::io::stderr().write_all(&terminal_safe(text.as_bytes()));
            let usage = e.downcast_ref::<UsageError>().is_some()
                || e.downcast_ref::<outbox::ConfigError>().is_some()
                || matches!(
                    e.downcast_ref::<outbox::schemas::SchemaError>(),
                    Some(outbox::schemas::SchemaError::Config(_))
                );
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

/// `buf` with every control character but newline and tab shown as an escape (`\x1b`,
/// `\u{9b}`): message data (keys, headers, bodies, errors) printed for a person must never
/// drive their terminal (clear it, retitle it, recolour it). JSON output is unaffected: its
/// encoder already escapes control characters.
fn terminal_safe(buf: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let c1 = |i: usize| buf[i] == 0xC2 && buf.get(i + 1).is_some_and(|b| (0x80..=0x9F).contains(b));
    let bad = |i: usize| {
        let b = buf[i];
        (b < 0x20 && b != b'\n' && b != b'\t') || b == 0x7F || c1(i)
    };
    if !(0..buf.len()).any(bad) {
        return std::borrow::Cow::Borrowed(buf);
    }
    let mut out = Vec::with_capacity(buf.len() + 16);
    let mut i = 0;
    while i < buf.len() {
        if c1(i) {
            out.extend_from_slice(format!("\\u{{{:x}}}", buf[i + 1]).as_bytes());
            i += 2;
        } else if bad(i) {
            out.extend_from_slice(format!("\\x{:02x}", buf[i]).as_bytes());
            i += 1;
        } else {
            out.push(buf[i]);
            i += 1;
        }
    }
    std::borrow::Cow::Owned(out)
}

impl std::io::Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.closed {
            return Ok(buf.len());
        }
        match std::io::stdout().write_all(&terminal_safe(buf)) {
            Ok(()) => Ok(buf.len()),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(buf.len())
            }
            Err(e) => Err(e),
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

#[cfg(test)]
mod terminal_tests {
    #[test]
    fn control_characters_from_message_data_are_shown_not_obeyed() {
        let shown = super::terminal_safe(b"key \x1b[2J \x1b]0;owned\x07 \xc2\x9b31m ok\tend\n");
        assert_eq!(
            String::from_utf8(shown.into_owned()).unwrap(),
            "key \\x1b[2J \\x1b]0;owned\\x07 \\u{9b}31m ok\tend\n"
        );
        assert!(matches!(
            super::terminal_safe(b"plain \xc3\xa9t\xc3\xa9\n"),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
