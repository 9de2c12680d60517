//! What every command shares: the connection flags, configuration built from them, the usage
//! error (exit code 2) and the shutdown signal.

use std::time::Duration;

use clap::Args;
use outbox::{CleanupConfig, DbConfig, KafkaConfig};

#[derive(Args, Clone)]
pub(crate) struct DbArgs {
    /// Postgres connection URL. Its password is never logged.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub(crate) database_url: String,
    /// Schema holding the outbox tables.
    #[arg(long, env = "OUTBOX_SCHEMA", default_value = outbox::Schema::DEFAULT_NAME)]
    pub(crate) schema: String,
}

#[derive(Args, Clone)]
pub(crate) struct KafkaArgs {
    /// Kafka bootstrap servers, host:port[,host:port].
    #[arg(long, env = "KAFKA_BOOTSTRAP_SERVERS")]
    pub(crate) kafka_bootstrap_servers: String,
    /// Any librdkafka property, name=value (repeatable), e.g. -X security.protocol=SASL_SSL.
    #[arg(short = 'X', long = "kafka-property", value_name = "NAME=VALUE")]
    pub(crate) kafka_property: Vec<String>,
    /// A file of librdkafka properties, one `name=value` per line (`#` starts a comment
    /// line): credentials from a mounted Kubernetes Secret stay out of the command line and
    /// the environment. `-X` on the command line wins over the file.
    #[arg(long, env = "OUTBOX_KAFKA_PROPERTIES_FILE", value_name = "PATH")]
    pub(crate) kafka_properties_file: Option<std::path::PathBuf>,
}

#[derive(Args, Clone)]
pub(crate) struct CleanupArgs {
    /// Delete sent outbox rows older than this (e.g. 7d, 36h).
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    pub(crate) sent_retention: Duration,
    /// Delete processed_messages rows older than this.
    #[arg(long, default_value = "35d", value_parser = humantime::parse_duration)]
    pub(crate) processed_retention: Duration,
    /// Rows per DELETE statement.
    #[arg(long, default_value_t = outbox::CleanupConfig::DEFAULT_BATCH_SIZE)]
    pub(crate) cleanup_batch_size: usize,
    /// Delete archived dead letters that were replayed or dropped this long after archiving.
    #[arg(long, default_value = "30d", value_parser = humantime::parse_duration)]
    pub(crate) dlq_retention: Duration,
}

/// A cleanup schedule: a period or off.
#[derive(Clone, Copy)]
pub(crate) struct Interval(pub(crate) Option<Duration>);

pub(crate) fn parse_interval(s: &str) -> Result<Interval, String> {
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
pub(crate) struct UsageError(pub(crate) String);

pub(crate) fn db_config(a: &DbArgs) -> Result<DbConfig, UsageError> {
    let mut db =
        DbConfig::new(&a.database_url, &a.schema).map_err(|e| UsageError(e.to_string()))?;
    // Whatever error text later quotes the URL back, its password is never printed.
    // The password as a URL carries it (`:pw@`, raw or percent-encoded): a bare password may
    // be a common word ("outbox" in the dev setup) that would blank out ordinary text.
    for pw in db.secret_values() {
        crate::redact::register([
            format!(":{pw}@").as_str(),
            format!(":{}@", crate::redact::percent_encode(&pw)).as_str(),
        ]);
    }
    // Audit rows written by the CLI say so (`dlq_audit.via`); the admin server names its own.
    // A name given in the URL wins: the operator asked to tell this process's sessions apart.
    if !a.database_url.contains("application_name=") {
        db.set_application_name("outbox-cli");
    }
    Ok(db)
}

/// The databases a fleet's tenants name: `OUTBOX_DATABASE_<NAME>` variables, then `flags`
/// (`NAME=URL`, which win). The URLs' passwords are registered for redaction; a flag without
/// `=` is refused without being shown.
pub(crate) fn named_databases(
    flags: &[String],
) -> Result<std::collections::BTreeMap<String, DbConfig>, UsageError> {
    let mut named = std::collections::BTreeMap::new();
    for (k, v) in std::env::vars() {
        if let Some(name) = k.strip_prefix("OUTBOX_DATABASE_") {
            named.insert(name.to_ascii_lowercase(), v);
        }
    }
    for pair in flags {
        let Some((name, url)) = pair.split_once('=') else {
            return Err(UsageError(
                "--database expects NAME=URL (the value is not shown)".into(),
            ));
        };
        named.insert(name.trim().to_owned(), url.to_owned());
    }
    let mut out = std::collections::BTreeMap::new();
    for (name, url) in named {
        let conn = db_config(&DbArgs {
            database_url: url,
            schema: outbox::Schema::DEFAULT_NAME.to_owned(),
        })
        .map_err(|e| UsageError(format!("database {name}: {e}")))?;
        out.insert(name, conn);
    }
    Ok(out)
}

pub(crate) fn kafka_config(a: &KafkaArgs) -> Result<KafkaConfig, UsageError> {
    let mut k =
        KafkaConfig::new(&a.kafka_bootstrap_servers).map_err(|e| UsageError(e.to_string()))?;
    if let Some(path) = &a.kafka_properties_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            UsageError(format!(
                "cannot read the Kafka properties file {}: {e}",
                path.display()
            ))
        })?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            // The error names the line and at most the property, never the value.
            k.set_from_pair(line)
                .map_err(|e| UsageError(format!("{} line {}: {e}", path.display(), n + 1)))?;
        }
    }
    for p in &a.kafka_property {
        k.set_from_pair(p).map_err(|e| UsageError(e.to_string()))?;
    }
    crate::redact::register(k.secret_values());
    // A misspelt or unknown property refuses to start (exit 2) rather than fail later with
    // librdkafka's message, which quotes the value back.
    k.validate().map_err(|e| UsageError(e.to_string()))?;
    Ok(k)
}

pub(crate) fn cleanup_config(a: &CleanupArgs, interval: Option<Duration>) -> CleanupConfig {
    let mut c = CleanupConfig::default();
    c.sent_retention = a.sent_retention;
    c.processed_retention = a.processed_retention;
    c.dlq_retention = a.dlq_retention;
    c.batch_size = a.cleanup_batch_size;
    c.interval = interval;
    c
}

/// Serves `/metrics` on `addr` (a sidecar's `--metrics-addr`) until `stop` is cancelled.
/// Requests naming a host other than an IP literal, `localhost` or one of `allowed_hosts`
/// (`--metrics-allowed-host`) get 403.
pub(crate) async fn serve_metrics(
    addr: Option<std::net::SocketAddr>,
    allowed_hosts: Vec<String>,
    health: Option<outbox::health::Health>,
    stop: &tokio_util::sync::CancellationToken,
) -> Result<(), UsageError> {
    if let Some(addr) = addr {
        let s = stop.clone();
        outbox::metrics::serve_with_health(addr, allowed_hosts, health, async move {
            s.cancelled().await
        })
        .await
        .map_err(|e| UsageError(format!("--metrics-addr {addr}: {e}")))?;
    }
    Ok(())
}

pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}

/// `--tenants` / `--tenant NAME`: a command acts on the tenants of a fleet's registry (the
/// `outbox_tenants` table in --schema), each in its own database and schema.
#[derive(Args, Clone, Default)]
pub(crate) struct TenantArgs {
    /// Act on every tenant of the registry in --schema (`outbox tenants`), each in its
    /// database (`default`: this one; others from --database NAME=URL or
    /// OUTBOX_DATABASE_<NAME>). One that fails does not stop the others; the exit code says.
    #[arg(long, conflicts_with = "tenant")]
    pub(crate) tenants: bool,
    /// Act on this tenant of the registry only.
    #[arg(long, value_name = "NAME")]
    pub(crate) tenant: Option<String>,
    /// A database tenants name (repeatable), NAME=URL.
    #[arg(long = "database", value_name = "NAME=URL")]
    pub(crate) databases: Vec<String>,
}

/// A tenant and the connection to its outbox, or why there is none.
pub(crate) struct TenantTarget {
    pub(crate) tenant: outbox::fleet::Tenant,
    pub(crate) db: Result<DbConfig, String>,
}

impl TenantTarget {
    /// `tenant (database.schema)`, for output lines.
    pub(crate) fn label(&self) -> String {
        format!(
            "{} ({}.{})",
            self.tenant.tenant,
            self.tenant.database,
            self.tenant.schema.name()
        )
    }
}

impl TenantArgs {
    /// True when the command acts on tenants.
    pub(crate) fn selected(&self) -> bool {
        self.tenants || self.tenant.is_some()
    }

    /// The selected tenants of `control`'s registry, each with its connection; `None` when the
    /// command does not act on tenants.
    ///
    /// # Errors
    /// A [`UsageError`] for a bad name or `--database` without a tenant selection; an error
    /// when the registry cannot be read or `--tenant` names none of it.
    pub(crate) async fn targets(
        &self,
        control: &DbConfig,
    ) -> anyhow::Result<Option<Vec<TenantTarget>>> {
        if !self.selected() {
            if !self.databases.is_empty() {
                return Err(
                    UsageError("--database needs --tenants or --tenant NAME".into()).into(),
                );
            }
            return Ok(None);
        }
        if let Some(name) = &self.tenant {
            outbox::fleet::Tenant::new(name, control.schema.clone())
                .map_err(|e| UsageError(e.to_string()))?;
        }
        let named = named_databases(&self.databases)?;
        let registered = outbox::fleet::tenants(control)
            .await
            .map_err(|e| anyhow::anyhow!("reading the tenants' registry failed: {e}"))?;
        let picked: Vec<_> = registered
            .into_iter()
            .filter(|t| self.tenant.as_ref().is_none_or(|n| *n == t.tenant))
            .collect();
        if let (Some(name), true) = (&self.tenant, picked.is_empty()) {
            anyhow::bail!(
                "tenant {name} is not in the registry of schema {} (outbox tenants list)",
                control.schema
            );
        }
        Ok(Some(
            picked
                .into_iter()
                .map(|t| {
                    let db = t.connection(control, &named).ok_or_else(|| {
                        format!(
                            "database {} not given (--database {}=URL)",
                            t.database, t.database
                        )
                    });
                    TenantTarget { tenant: t, db }
                })
                .collect(),
        ))
    }
}

/// Exit 1 naming the tenants in `failed` (of `total`), what befell them said by `what`
/// ("not migrated"), if any.
pub(crate) fn tenants_done(failed: &[String], total: usize, what: &str) -> anyhow::Result<()> {
    if failed.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "{} of {total} tenants {what}: {}",
        failed.len(),
        failed.join(", ")
    )
}
