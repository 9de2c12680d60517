//! Configuration: plain structs with named defaults, validated before anything connects.
//!
//! `DATABASE_URL` and `KAFKA_BOOTSTRAP_SERVERS` are the seed's names; every other librdkafka
//! property passes through as a string pair (SASL/SSL included). Secrets never appear in
//! `Debug` output or error messages.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::schema::{InvalidSchema, Schema};

/// Rows claimed per relay pass.
pub const DEFAULT_BATCH_SIZE: usize = 2000;
/// Largest batch accepted: a claim transaction holds its row locks while the batch is in flight.
pub const MAX_BATCH_SIZE: usize = 50_000;
/// Default [`RelayConfig::in_flight_batches`]: one batch waiting for acks while the next is
/// claimed and the previous marked (measured in `benches/relay_drain.rs`).
pub const DEFAULT_IN_FLIGHT_BATCHES: usize = 2;
/// Upper bound of [`RelayConfig::in_flight_batches`].
pub const MAX_IN_FLIGHT_BATCHES: usize = 8;
/// Produce attempts before a row becomes `failed` (seed 002).
pub const DEFAULT_MAX_ATTEMPTS: i32 = 10;
/// How often an idle relay looks for due rows when no notification arrives.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);
/// How often the relay sweeps below its claim floor (rows of very long transactions, rows
/// requeued by hand).
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(10);
/// How long a transaction may keep outbox rows uncommitted before the claim floor passes them
/// (they are then published by the sweep).
pub const DEFAULT_LONG_TRANSACTION: Duration = Duration::from_secs(60);
/// How long librdkafka may try to deliver one message (`message.timeout.ms`).
pub const DEFAULT_DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long shutdown waits for in-flight messages to be flushed.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// Keep sent outbox rows this long (seed 002: the topics' retention).
pub const DEFAULT_SENT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Keep processed-message marks this long (seed 002: twice the topics' retention).
pub const DEFAULT_PROCESSED_RETENTION: Duration = Duration::from_secs(14 * 24 * 3600);
/// Rows deleted per cleanup statement, so no statement holds locks for long.
pub const DEFAULT_CLEANUP_BATCH: usize = 5_000;
/// How often the relay runs cleanup (the "cron module").
pub const DEFAULT_CLEANUP_INTERVAL: Duration = Duration::from_secs(3600);
/// Connections in the relay's pool.
pub const DEFAULT_POOL_SIZE: usize = 4;

/// Invalid configuration. Each variant says what is wrong without echoing secret values.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `DATABASE_URL` is missing or cannot be parsed.
    #[error("invalid DATABASE_URL: {0}")]
    DatabaseUrl(String),
    /// The schema name breaks the identifier rules.
    #[error(transparent)]
    Schema(#[from] InvalidSchema),
    /// `KAFKA_BOOTSTRAP_SERVERS` is missing or empty.
    #[error("invalid KAFKA_BOOTSTRAP_SERVERS: {0}")]
    Bootstrap(String),
    /// A librdkafka property is malformed or would weaken a guarantee.
    #[error("invalid Kafka property {name:?}: {reason}")]
    KafkaProperty {
        /// The property name.
        name: String,
        /// Why it is refused.
        reason: String,
    },
    /// A numeric or duration setting is out of range.
    #[error("invalid {name}: {reason}")]
    Value {
        /// The setting.
        name: &'static str,
        /// Why it is refused.
        reason: String,
    },
}

/// How the server certificate is checked (libpq's `sslmode` semantics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVerify {
    /// No certificate check (`sslmode=disable|prefer|require` without `sslrootcert`): encrypted
    /// when TLS is used, but open to an active man in the middle.
    None,
    /// The chain must lead to the root (`sslmode=verify-ca`, or `require` with `sslrootcert`).
    Ca,
    /// The chain and the host name must match (`sslmode=verify-full`): use this in production.
    Full,
}

/// Where the outbox tables live.
#[derive(Clone)]
pub struct DbConfig {
    pub(crate) pg: tokio_postgres::Config,
    pub(crate) tls: postgres_openssl::MakeTlsConnector,
    /// Certificate checking derived from `sslmode` / `sslrootcert`.
    pub tls_verify: TlsVerify,
    /// Schema holding `outbox` and `processed_messages`.
    pub schema: Schema,
    /// Pool size for the relay and operator commands.
    pub pool_size: usize,
}

impl DbConfig {
    /// Parses a `postgres://` URL or a key=value connection string.
    ///
    /// # Errors
    /// [`ConfigError::DatabaseUrl`] when it does not parse or names no host;
    /// [`ConfigError::Schema`] for a bad schema name.
    ///
    /// TLS follows libpq: `sslmode=disable|prefer|require|verify-ca|verify-full` and
    /// `sslrootcert=PATH` (PEM). tokio-postgres itself knows only the first three, so the
    /// verification modes are taken out here and enforced by the OpenSSL connector.
    pub fn new(url: &str, schema: &str) -> Result<Self, ConfigError> {
        if url.trim().is_empty() {
            return Err(ConfigError::DatabaseUrl(
                "it is empty (set DATABASE_URL)".into(),
            ));
        }
        let (url, mode, root) = split_tls_params(url);
        // tokio-postgres' parse errors name the option, never its value, so they are safe to show.
        let mut pg = tokio_postgres::Config::from_str(&url)
            .map_err(|e| ConfigError::DatabaseUrl(e.to_string()))?;
        let tls_verify = match mode.as_deref() {
            Some("verify-full") => TlsVerify::Full,
            Some("verify-ca") => TlsVerify::Ca,
            _ if root.is_some() => TlsVerify::Ca,
            _ => TlsVerify::None,
        };
        let tls = tls_connector(tls_verify, root.as_deref())?;
        if pg.get_hosts().is_empty() {
            return Err(ConfigError::DatabaseUrl("no host given".into()));
        }
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(Duration::from_secs(5));
        }
        if pg.get_application_name().is_none() {
            pg.application_name("outbox");
        }
        pg.keepalives(true).keepalives_idle(Duration::from_secs(30));
        Ok(Self {
            pg,
            tls,
            tls_verify,
            schema: Schema::new(schema)?,
            pool_size: DEFAULT_POOL_SIZE,
        })
    }

    /// The parsed connection settings.
    pub fn pg_config(&self) -> &tokio_postgres::Config {
        &self.pg
    }
}

/// Takes `sslmode=verify-*` and `sslrootcert` out of a URL or key=value string (tokio-postgres
/// rejects them), leaving `sslmode=require` in their place.
fn split_tls_params(url: &str) -> (String, Option<String>, Option<String>) {
    let mut mode = None;
    let mut root = None;
    let mut keep = |k: &str, v: &str| -> bool {
        match k {
            "sslmode" if v == "verify-ca" || v == "verify-full" => {
                mode = Some(v.to_owned());
                false
            }
            "sslmode" => {
                mode = Some(v.to_owned());
                true
            }
            "sslrootcert" => {
                root = Some(v.to_owned());
                false
            }
            _ => true,
        }
    };
    let rebuilt = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            Some((base, query)) => {
                let mut params: Vec<&str> = query
                    .split('&')
                    .filter(|p| p.split_once('=').is_none_or(|(k, v)| keep(k, v)))
                    .collect();
                if matches!(mode.as_deref(), Some("verify-ca" | "verify-full")) {
                    params.push("sslmode=require");
                }
                if params.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", params.join("&"))
                }
            }
            None => url.to_owned(),
        }
    } else {
        let mut parts: Vec<String> = url
            .split_whitespace()
            .filter(|p| p.split_once('=').is_none_or(|(k, v)| keep(k, v)))
            .map(str::to_owned)
            .collect();
        if matches!(mode.as_deref(), Some("verify-ca" | "verify-full")) {
            parts.push("sslmode=require".into());
        }
        parts.join(" ")
    };
    (rebuilt, mode, root)
}

fn tls_connector(
    verify: TlsVerify,
    root: Option<&str>,
) -> Result<postgres_openssl::MakeTlsConnector, ConfigError> {
    use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
    let err = |e: openssl::error::ErrorStack| ConfigError::DatabaseUrl(format!("TLS setup: {e}"));
    let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(err)?;
    match verify {
        TlsVerify::None => b.set_verify(SslVerifyMode::NONE),
        TlsVerify::Ca | TlsVerify::Full => {
            if let Some(path) = root {
                b.set_ca_file(path).map_err(|e| {
                    ConfigError::DatabaseUrl(format!("cannot load sslrootcert {path:?}: {e}"))
                })?;
            }
        }
    }
    let mut connector = postgres_openssl::MakeTlsConnector::new(b.build());
    if verify != TlsVerify::Full {
        connector.set_callback(|cfg, _domain| {
            cfg.set_verify_hostname(false);
            Ok(())
        });
    }
    Ok(connector)
}

impl fmt::Debug for DbConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DbConfig")
            .field("hosts", &self.pg.get_hosts())
            .field("ports", &self.pg.get_ports())
            .field("user", &self.pg.get_user())
            .field("dbname", &self.pg.get_dbname())
            .field("password", &self.pg.get_password().map(|_| "<redacted>"))
            .field("ssl_mode", &self.pg.get_ssl_mode())
            .field("tls_verify", &self.tls_verify)
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .finish()
    }
}

/// Kafka client settings: the bootstrap servers plus any librdkafka property.
#[derive(Clone, Default)]
pub struct KafkaConfig {
    /// `host:port[,host:port…]`.
    pub bootstrap_servers: String,
    /// Extra librdkafka properties (e.g. `security.protocol`, `sasl.username`), passed through.
    pub properties: BTreeMap<String, String>,
}

/// Property names whose values are secrets and are never shown.
fn is_secret_property(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("password")
        || n.contains("secret")
        || n.ends_with(".key.pem")
        || n == "ssl.key.pem"
        || n.contains("sasl.oauthbearer.config")
        || n.contains("jaas")
}

impl KafkaConfig {
    /// Settings for `bootstrap_servers`.
    ///
    /// # Errors
    /// [`ConfigError::Bootstrap`] when it is empty or an entry is not `host:port`.
    pub fn new(bootstrap_servers: &str) -> Result<Self, ConfigError> {
        let servers = bootstrap_servers.trim();
        if servers.is_empty() {
            return Err(ConfigError::Bootstrap(
                "it is empty (set KAFKA_BOOTSTRAP_SERVERS)".into(),
            ));
        }
        for entry in servers.split(',') {
            let entry = entry.trim();
            let hostport = entry.rsplit_once("://").map_or(entry, |(_, rest)| rest);
            let ok = hostport
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok {
                return Err(ConfigError::Bootstrap(format!(
                    "{entry:?} is not host:port"
                )));
            }
        }
        Ok(Self {
            bootstrap_servers: servers.to_owned(),
            properties: BTreeMap::new(),
        })
    }

    /// Adds a librdkafka property from `name=value`.
    ///
    /// # Errors
    /// [`ConfigError::KafkaProperty`] when there is no `=` or the name is empty.
    pub fn set_from_pair(&mut self, pair: &str) -> Result<(), ConfigError> {
        let Some((name, value)) = pair.split_once('=') else {
            // Show only the part before any secret could start.
            let shown: String = pair.chars().take_while(|c| *c != ' ').take(40).collect();
            return Err(ConfigError::KafkaProperty {
                name: if is_secret_property(&shown) {
                    "<redacted>".into()
                } else {
                    shown
                },
                reason: "expected name=value".into(),
            });
        };
        let name = name.trim();
        if name.is_empty() {
            return Err(ConfigError::KafkaProperty {
                name: String::new(),
                reason: "empty name".into(),
            });
        }
        self.properties.insert(name.to_owned(), value.to_owned());
        Ok(())
    }

    /// Builds the librdkafka config: bootstrap servers, then the pass-through properties.
    pub(crate) fn client_config(&self) -> rdkafka::ClientConfig {
        let mut c = rdkafka::ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap_servers);
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }
}

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let props: BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str(),
                    if is_secret_property(k) {
                        "<redacted>"
                    } else {
                        v.as_str()
                    },
                )
            })
            .collect();
        f.debug_struct("KafkaConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("properties", &props)
            .finish()
    }
}

/// Retention and batching for `outbox cleanup` and the relay's schedule.
#[derive(Debug, Clone)]
pub struct CleanupConfig {
    /// Sent outbox rows older than this are deleted.
    pub sent_retention: Duration,
    /// Processed-message marks older than this are deleted.
    pub processed_retention: Duration,
    /// Rows per DELETE statement.
    pub batch_size: usize,
    /// How often the relay runs cleanup; `None` disables the schedule.
    pub interval: Option<Duration>,
    /// Archived dead letters that were replayed or dropped are deleted this long after they
    /// were archived (new ones are never deleted).
    pub dlq_retention: Duration,
}

impl Default for CleanupConfig {
    fn default() -> Self {
        Self {
            sent_retention: DEFAULT_SENT_RETENTION,
            processed_retention: DEFAULT_PROCESSED_RETENTION,
            batch_size: DEFAULT_CLEANUP_BATCH,
            interval: Some(DEFAULT_CLEANUP_INTERVAL),
            dlq_retention: crate::dlq::DEFAULT_RETENTION,
        }
    }
}

/// How the relay claims, produces and backs off.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Rows per claim (default [`DEFAULT_BATCH_SIZE`]).
    pub batch_size: usize,
    /// Attempts before a row becomes `failed` (default [`DEFAULT_MAX_ATTEMPTS`]).
    pub max_attempts: i32,
    /// Idle poll period when no notification arrives (default [`DEFAULT_POLL_INTERVAL`]).
    pub poll_interval: Duration,
    /// librdkafka `message.timeout.ms`; the relay waits this plus a margin for delivery reports,
    /// and rows without a report by then stay pending (default [`DEFAULT_DELIVERY_TIMEOUT`]).
    pub delivery_timeout: Duration,
    /// Flush budget at shutdown (default [`DEFAULT_SHUTDOWN_TIMEOUT`]).
    pub shutdown_timeout: Duration,
    /// Wake on the `outbox_notify` trigger's notifications (LISTEN); polling runs regardless.
    pub listen: bool,
    /// Cleanup schedule run by the relay.
    pub cleanup: CleanupConfig,
    /// How often the relay re-counts relays and rebalances its ordering lanes.
    pub rebalance_interval: Duration,
    /// How often the relay sweeps below its claim floor for pending rows the floor passed
    /// (default [`DEFAULT_SWEEP_INTERVAL`]); see [`Relay::sweep`](crate::Relay::sweep).
    pub sweep_interval: Duration,
    /// A transaction still open this long after inserting outbox rows no longer holds the claim
    /// floor back; its rows are published by the next sweep after it commits
    /// (default [`DEFAULT_LONG_TRANSACTION`]).
    pub long_transaction: Duration,
    /// Claim transactions open at once: while one batch waits for Kafka's acks the next is
    /// claimed and the one before is marked (default [`DEFAULT_IN_FLIGHT_BATCHES`]; 1 = one
    /// batch at a time). Each takes a pooled connection.
    pub in_flight_batches: usize,
    /// Fault injection for tests: the probability that a row is refused with
    /// "injected produce failure" instead of being produced (exercises the backoff path).
    #[doc(hidden)]
    pub inject_refusals: f64,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            batch_size: DEFAULT_BATCH_SIZE,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            poll_interval: DEFAULT_POLL_INTERVAL,
            delivery_timeout: DEFAULT_DELIVERY_TIMEOUT,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            listen: true,
            cleanup: CleanupConfig::default(),
            rebalance_interval: crate::lanes::DEFAULT_REBALANCE_INTERVAL,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            long_transaction: DEFAULT_LONG_TRANSACTION,
            in_flight_batches: DEFAULT_IN_FLIGHT_BATCHES,
            inject_refusals: 0.0,
        }
    }
}

impl RelayConfig {
    /// Checks ranges.
    ///
    /// # Errors
    /// [`ConfigError::Value`] naming the first setting out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |name, reason: &str| {
            Err(ConfigError::Value {
                name,
                reason: reason.into(),
            })
        };
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return bad("batch size", "must be between 1 and 50000");
        }
        if self.in_flight_batches == 0 || self.in_flight_batches > MAX_IN_FLIGHT_BATCHES {
            return bad("in-flight batches", "must be between 1 and 8");
        }
        if self.max_attempts < 1 {
            return bad("max attempts", "must be at least 1");
        }
        if self.poll_interval.is_zero() {
            return bad("poll interval", "must be greater than zero");
        }
        if self.delivery_timeout < Duration::from_millis(100) {
            return bad("delivery timeout", "must be at least 100ms");
        }
        if self.delivery_timeout > Duration::from_secs(3600) {
            return bad("delivery timeout", "must be at most 1h");
        }
        if self.cleanup.batch_size == 0 {
            return bad("cleanup batch size", "must be at least 1");
        }
        if self.rebalance_interval.is_zero() {
            return bad("rebalance interval", "must be greater than zero");
        }
        if self.sweep_interval.is_zero() {
            return bad("sweep interval", "must be greater than zero");
        }
        if self.long_transaction < Duration::from_secs(1) {
            return bad("long transaction", "must be at least 1s");
        }
        if self.cleanup.interval.is_some_and(|d| d.is_zero()) {
            return bad("cleanup interval", "must be greater than zero (or off)");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_url_errors_do_not_echo_the_password() {
        let e = DbConfig::new("postgres://u:hunter2@host:notaport/db", "public").unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        let ok = DbConfig::new("postgres://u:hunter2@localhost:5432/db", "public").unwrap();
        assert!(!format!("{ok:?}").contains("hunter2"));
    }

    #[test]
    fn verify_modes_are_taken_out_for_tokio_postgres() {
        let (u, m, r) = split_tls_params(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem&application_name=x",
        );
        assert_eq!(
            (u.as_str(), m.as_deref(), r.as_deref()),
            (
                "postgres://u@h/db?application_name=x&sslmode=require",
                Some("verify-full"),
                Some("/ca.pem")
            )
        );
        let (u, m, _) = split_tls_params("host=h sslmode=verify-ca user=u");
        assert_eq!(
            (u.as_str(), m.as_deref()),
            ("host=h user=u sslmode=require", Some("verify-ca"))
        );
        let (u, m, r) = split_tls_params("postgres://u@h/db?sslmode=require");
        assert_eq!(
            (u.as_str(), m.as_deref(), r),
            ("postgres://u@h/db?sslmode=require", Some("require"), None)
        );
        assert_eq!(
            DbConfig::new("postgres://u@h/db?sslmode=verify-full", "public")
                .unwrap()
                .tls_verify,
            TlsVerify::Full
        );
        let e = DbConfig::new(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent.pem",
            "public",
        )
        .unwrap_err();
        assert!(e.to_string().contains("cannot load sslrootcert"), "{e}");
    }

    #[test]
    fn kafka_secrets_are_redacted() {
        let mut k = KafkaConfig::new("127.0.0.1:9092").unwrap();
        k.set_from_pair("sasl.password=hunter2").unwrap();
        k.set_from_pair("security.protocol=SASL_SSL").unwrap();
        let shown = format!("{k:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("SASL_SSL"),
            "{shown}"
        );
    }

    #[test]
    fn bootstrap_must_be_host_port() {
        assert!(KafkaConfig::new("").is_err());
        assert!(KafkaConfig::new("localhost").is_err());
        assert!(KafkaConfig::new("a:1,b").is_err());
        KafkaConfig::new("a:1, b:2").unwrap();
    }

    #[test]
    fn relay_config_ranges() {
        RelayConfig::default().validate().unwrap();
        let c = RelayConfig {
            batch_size: 0,
            ..RelayConfig::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("batch size"));
        let c = RelayConfig {
            max_attempts: 0,
            ..RelayConfig::default()
        };
        assert!(c.validate().is_err());
    }
}
