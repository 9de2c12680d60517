//! `outbox admin`: The HTTP admin API, the web dashboard and /metrics.

use std::io::Write;
use std::time::Duration;

use clap::Args as ClapArgs;

use crate::args::*;

/// The HTTP admin API, the web dashboard and /metrics.
#[derive(ClapArgs)]
pub struct Args {
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
    /// A host name this server is reached by (repeatable, or comma-separated in the
    /// variable); `localhost` and IP addresses always are. Requests naming any other host
    /// are refused (DNS rebinding).
    #[arg(
        long = "allowed-host",
        env = "OUTBOX_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    allowed_hosts: Vec<String>,
    /// Open connections at most; more are closed as they arrive.
    #[arg(long, default_value_t = outbox::admin::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Open connections from one address at most, so one client cannot take every slot
    /// (behind a proxy, every client has the proxy's address: raise it there).
    /// Default: half of --max-connections.
    #[arg(long)]
    max_connections_per_peer: Option<usize>,
    /// A request's headers must arrive within this.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    header_timeout: std::time::Duration,
    /// A connection with nothing read or written for this long is closed.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    idle_timeout: std::time::Duration,
    /// The topics file whose `format` entries say which topics carry a schema: an edited
    /// retry on such a topic is checked against its schema and encoded as the relay would.
    #[arg(long, requires = "schema_registry_url")]
    topics_file: Option<String>,
    /// The schema registry's Confluent-compatible API (with --topics-file).
    #[arg(long, env = "SCHEMA_REGISTRY_URL")]
    schema_registry_url: Option<String>,
}

pub async fn run(args: Args, _out: &mut dyn Write) -> anyhow::Result<()> {
    let Args {
        db,
        kafka,
        listen,
        admin_token,
        tokens_file,
        insecure_no_auth,
        allowed_hosts,
        max_connections,
        max_connections_per_peer,
        header_timeout,
        idle_timeout,
        topics_file,
        schema_registry_url,
    } = args;
    if let Some(url) = &schema_registry_url {
        crate::redact::register_url(url);
    }
    if let Some(t) = &admin_token {
        crate::redact::register([t.trim()]);
    }
    if !(1..=100_000).contains(&max_connections) {
        return Err(UsageError("--max-connections: 1 to 100000".into()).into());
    }
    if max_connections_per_peer.is_some_and(|n| !(1..=max_connections).contains(&n)) {
        return Err(UsageError("--max-connections-per-peer: 1 to --max-connections".into()).into());
    }
    let hour = Duration::from_secs(3600);
    if header_timeout.is_zero() || header_timeout > hour {
        return Err(UsageError("--header-timeout: above 0, at most 1h".into()).into());
    }
    if idle_timeout < Duration::from_secs(1) || idle_timeout > 24 * hour {
        return Err(UsageError("--idle-timeout: 1s to 24h".into()).into());
    }
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
            outbox::admin::Auth::from_file_text(&text).map_err(|e| UsageError(e.to_string()))?
        }
        (false, None, Some(t)) => outbox::admin::Auth::single(&t).map_err(|e| UsageError(e.to_string()))?,
        (false, None, None) => {
            return Err(UsageError(
                "the admin API needs authentication: set OUTBOX_ADMIN_TOKEN or --tokens-file (or --insecure-no-auth, explicitly)".into(),
            )
            .into())
        }
    };
    let mut opts = outbox::admin::ServeOptions::default();
    opts.allowed_hosts = allowed_hosts
        .iter()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .collect();
    opts.max_connections = max_connections;
    opts.max_connections_per_peer = max_connections_per_peer;
    opts.header_timeout = header_timeout;
    opts.idle_timeout = idle_timeout;
    if let (Some(file), Some(url)) = (&topics_file, &schema_registry_url) {
        opts.schemas = Some(
            outbox::schemas::SchemaConfig::from_topics_file(url, file)
                .and_then(outbox::schemas::Schemas::new)
                .map_err(|e| UsageError(e.to_string()))?,
        );
    }
    outbox::admin::serve_with(listen, &db, &kafka, auth, &opts, shutdown_signal())
        .await
        .map_err(|e| UsageError(format!("--listen {listen}: {e}")))?;

    Ok(())
}
