//! Configuration: plain structs with named defaults, validated before anything connects.
//!
//! `DATABASE_URL` and `KAFKA_BOOTSTRAP_SERVERS` are the usual names; every other librdkafka
//! property passes through as a string pair (SASL/SSL included). Secrets never appear in
//! `Debug` output or error messages.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::schema::{InvalidSchema, Schema};

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

/// The TLS connector every connection uses: OpenSSL with the `tls` feature, plain otherwise.
#[cfg(feature = "tls")]
pub(crate) type Tls = postgres_openssl::MakeTlsConnector;
/// The TLS connector every connection uses: OpenSSL with the `tls` feature, plain otherwise.
#[cfg(not(feature = "tls"))]
pub(crate) type Tls = tokio_postgres::NoTls;

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
#[non_exhaustive]
pub struct DbConfig {
    pub(crate) pg: tokio_postgres::Config,
    pub(crate) tls: Tls,
    /// Certificate checking derived from `sslmode` / `sslrootcert`.
    pub tls_verify: TlsVerify,
    /// Schema holding `outbox` and `processed_messages`.
    pub schema: Schema,
    /// Pool size for the relay and operator commands.
    pub pool_size: usize,
}

impl DbConfig {
    /// Default [`DbConfig::pool_size`].
    pub const DEFAULT_POOL_SIZE: usize = DEFAULT_POOL_SIZE;
}

impl DbConfig {
    /// Names the program on its Postgres sessions (`application_name`): it shows in
    /// `pg_stat_activity`, and every audit row records it (`dlq_audit.via`), so an action
    /// from the CLI is told apart from one through the admin API.
    pub fn set_application_name(&mut self, name: &str) {
        self.pg.application_name(name);
    }

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
        let tls = tls_connector(tls_verify, root.as_deref(), pg.get_ssl_mode())?;
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

#[cfg(feature = "tls")]
fn tls_connector(
    verify: TlsVerify,
    root: Option<&str>,
    _mode: tokio_postgres::config::SslMode,
) -> Result<Tls, ConfigError> {
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

/// Without the `tls` feature only plain connections exist: a URL that requires TLS is refused
/// here rather than silently downgraded (`sslmode=prefer`, libpq's default, stays plain).
#[cfg(not(feature = "tls"))]
fn tls_connector(
    verify: TlsVerify,
    root: Option<&str>,
    mode: tokio_postgres::config::SslMode,
) -> Result<Tls, ConfigError> {
    plain_only(verify, root, mode)?;
    Ok(tokio_postgres::NoTls)
}

/// Without TLS support a URL that asks for TLS is refused, never downgraded to a plain
/// connection (`sslmode=prefer`, libpq's default, stays plain). Compiled in every build so its
/// unit test runs in the default one.
#[cfg_attr(feature = "tls", allow(dead_code))]
fn plain_only(
    verify: TlsVerify,
    root: Option<&str>,
    mode: tokio_postgres::config::SslMode,
) -> Result<(), ConfigError> {
    if verify != TlsVerify::None
        || root.is_some()
        || mode == tokio_postgres::config::SslMode::Require
    {
        return Err(ConfigError::DatabaseUrl(
            "the URL asks for TLS, but outbox was built without its `tls` feature".into(),
        ));
    }
    Ok(())
}

impl DbConfig {
    /// `text` with the connection's password replaced by `<redacted>` (for error texts of
    /// other libraries, which may quote a URL back).
    pub fn redact(&self, text: &str) -> String {
        let pw = self.secret_values();
        redact_values(text, pw.iter().map(String::as_str))
    }

    /// Every session opened through this config cancels a statement running longer than
    /// `timeout` (Postgres's `statement_timeout`, added to the URL's own `options`).
    pub(crate) fn set_statement_timeout(&mut self, timeout: Duration) {
        let own = self.pg.get_options().unwrap_or_default().to_owned();
        self.pg
            .options(format!("{own} -c statement_timeout={}", timeout.as_millis()).trim());
    }

    /// The database the URL names (or, as libpq defaults, the user's name).
    pub fn database_name(&self) -> Option<&str> {
        // libpq's default database is the user's name.
        self.pg.get_dbname().or_else(|| self.pg.get_user())
    }

    /// The values [`Self::redact`] hides (the password, when the URL has one), for a process
    /// that cleans every line it prints.
    pub fn secret_values(&self) -> Vec<String> {
        self.pg
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .into_iter()
            .collect()
    }
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
#[non_exhaustive]
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

/// Properties whose values are plain settings (protocols, mechanisms, sizes, names), shown as
/// they are; every other property's value is treated as a secret.
fn is_plain_property(name: &str) -> bool {
    const PLAIN: [&str; 18] = [
        "security.protocol",
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "ssl.endpoint.identification.algorithm",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "client.id",
        "acks",
        "compression.type",
        "linger.ms",
        "batch.size",
        "batch.num.messages",
        "message.max.bytes",
        "enable.idempotence",
        "isolation.level",
        "debug",
    ];
    let n = name.to_ascii_lowercase();
    !is_secret_property(&n) && (PLAIN.contains(&n.as_str()) || n.ends_with(".ms"))
}

/// librdkafka's description of a refused property without the value it quotes back.
#[cfg(feature = "kafka")]
fn property_reason(desc: &str, name: &str, value: &str) -> String {
    // librdkafka writes e.g. `No such configuration property: "sasl.passwrd"`, or `Invalid
    // value "x" for configuration property "acks"`: keep the text, drop the value.
    let text = if value.is_empty() {
        desc.to_owned()
    } else {
        desc.replace(value, "<redacted>")
    };
    let text = text.trim();
    if text.is_empty() {
        format!("librdkafka refuses {name:?}")
    } else {
        text.to_owned()
    }
}

/// Every byte but the unreserved ones (`A-Z a-z 0-9 - _ . ~`) percent-encoded: how a URL's
/// userinfo or a registry subject carries text.
pub(crate) const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// `text` with each of `secrets` replaced by `<redacted>`, also where a secret appears as a
/// string literal escapes it: a `Debug` rendering or a JSON string (`\"`, `\\`, control
/// characters) or a URL's percent-encoding. An error text that quotes a value back usually does
/// so through one of those, and a secret holding a quote or a backslash would pass a plain
/// search.
pub(crate) fn redact_values<'a>(text: &str, secrets: impl IntoIterator<Item = &'a str>) -> String {
    let mut forms: Vec<String> = secrets
        .into_iter()
        .filter(|s| !s.is_empty())
        .flat_map(secret_forms)
        .collect();
    // Longest first, so a form that contains another is replaced whole.
    forms.sort_by_key(|f| std::cmp::Reverse(f.len()));
    let mut out = text.to_owned();
    for f in &forms {
        if out.contains(f.as_str()) {
            out = out.replace(f.as_str(), "<redacted>");
        }
    }
    out
}

/// The ways `secret` can appear in a text: as it is, escaped as a Rust `Debug` string or a JSON
/// string, and percent-encoded (every byte but unreserved ones), without duplicates.
pub(crate) fn secret_forms(secret: &str) -> Vec<String> {
    let json = serde_json::to_string(secret).unwrap_or_default();
    let json = json
        .strip_prefix('"')
        .and_then(|j| j.strip_suffix('"'))
        .unwrap_or(secret);
    let mut forms = vec![
        secret.to_owned(),
        secret.escape_debug().to_string(),
        json.to_owned(),
        percent_encoding::utf8_percent_encode(secret, UNRESERVED).to_string(),
    ];
    forms.sort();
    forms.dedup();
    forms
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
            // Without `=` there is no telling a name from a pasted secret: show none of it.
            return Err(ConfigError::KafkaProperty {
                name: "<not shown>".into(),
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

    /// Checks every property with librdkafka itself, before anything connects: a misspelt or
    /// unknown name, or a value librdkafka refuses, is an error naming the property and
    /// librdkafka's reason, never the value (which may be a secret).
    ///
    /// # Errors
    /// [`ConfigError::KafkaProperty`] for the first property librdkafka refuses.
    #[cfg(feature = "kafka")]
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.client_config().create_native_config() {
            Ok(_) => Ok(()),
            Err(rdkafka::error::KafkaError::ClientConfig(_, desc, name, value)) => {
                Err(ConfigError::KafkaProperty {
                    reason: property_reason(&desc, &name, &value),
                    name,
                })
            }
            Err(e) => Err(ConfigError::KafkaProperty {
                name: String::new(),
                reason: self.redact(&e.to_string()),
            }),
        }
    }

    /// `text` with the value of every pass-through property that may be a secret replaced by
    /// `<redacted>`: any property not known to hold plain settings counts as secret, so a
    /// misspelt `sasl.passwrd` is covered too. For error texts that librdkafka or a broker
    /// wrote, which may quote a value back.
    pub fn redact(&self, text: &str) -> String {
        redact_values(text, self.secret_values())
    }

    /// The values [`Self::redact`] hides, longest first (so one that contains another is
    /// replaced whole).
    pub fn secret_values(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .properties
            .iter()
            // A number or a boolean is a setting, whatever the property's name.
            .filter(|(k, v)| {
                let setting_like = v.eq_ignore_ascii_case("true")
                    || v.eq_ignore_ascii_case("false")
                    || v.bytes().all(|b| b.is_ascii_digit());
                // A secret-named property is a secret whatever it looks like (`12345678`).
                !is_plain_property(k) && !v.is_empty() && (is_secret_property(k) || !setting_like)
            })
            .map(|(_, v)| v.as_str())
            .collect();
        v.sort_by_key(|s| std::cmp::Reverse(s.len()));
        v
    }

    /// Builds the librdkafka config: bootstrap servers, then the pass-through properties.
    #[cfg(feature = "kafka")]
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

/// The operator's name for audit rows when none is given: `$USER`, `$LOGNAME`, or `unknown`.
pub(crate) fn os_user() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| "unknown".into())
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
    fn a_secret_quoted_back_escaped_is_redacted_too() {
        let mut k = KafkaConfig::new("127.0.0.1:9092").unwrap();
        k.set_from_pair("sasl.password=pa\"ss\\w\u{7}rd").unwrap();
        for quoted in [
            format!("refused {:?}", "pa\"ss\\w\u{7}rd"),
            serde_json::json!({"value": "pa\"ss\\w\u{7}rd"}).to_string(),
            "sasl://u:pa%22ss%5Cw%07rd@h".to_owned(),
            "raw pa\"ss\\w\u{7}rd".to_owned(),
        ] {
            let r = k.redact(&quoted);
            assert!(
                r.contains("<redacted>") && !r.contains("ss"),
                "{quoted} -> {r}"
            );
        }
        let db = DbConfig::new("postgres://u:a%22b%5Cc99@localhost:5432/db", "public").unwrap();
        let r = db.redact(r#"url postgres://u:a%22b%5Cc99@localhost and "a\"b\\c99""#);
        assert!(!r.contains("c99"), "{r}");
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
    fn without_tls_a_url_asking_for_tls_is_refused_not_downgraded() {
        use tokio_postgres::config::SslMode;
        let refused = |v, root: Option<&str>, m| plain_only(v, root, m).is_err();
        assert!(refused(TlsVerify::None, None, SslMode::Require));
        assert!(refused(TlsVerify::Full, None, SslMode::Require));
        assert!(refused(TlsVerify::None, Some("/ca.pem"), SslMode::Prefer));
        assert!(!refused(TlsVerify::None, None, SslMode::Prefer));
        assert!(!refused(TlsVerify::None, None, SslMode::Disable));
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
    fn a_misspelt_property_is_refused_by_name_without_its_value() {
        let mut k = KafkaConfig::new("127.0.0.1:9092").unwrap();
        k.set_from_pair("sasl.passwrd=S3cret").unwrap();
        let e = k.validate().unwrap_err().to_string();
        assert!(e.contains("sasl.passwrd") && !e.contains("S3cret"), "{e}");
        let mut k = KafkaConfig::new("127.0.0.1:9092").unwrap();
        k.set_from_pair("acks=S3cret-ish").unwrap();
        let e = k.validate().unwrap_err().to_string();
        assert!(e.contains("acks") && !e.contains("S3cret"), "{e}");
        let mut k = KafkaConfig::new("127.0.0.1:9092").unwrap();
        k.set_from_pair("security.protocol=SASL_PLAINTEXT").unwrap();
        k.set_from_pair("sasl.password=S3cret").unwrap();
        k.validate().unwrap();
        // A secret-named property is a secret even when it looks like a number.
        k.set_from_pair("ssl.key.password=12345678").unwrap();
        assert_eq!(k.redact("pin 12345678"), "pin <redacted>");
        // Any value of a property not known to be plain is hidden, whatever its name.
        k.set_from_pair("sasl.passwrd=0therS3cret").unwrap();
        let shown = k.redact("refused: sasl.passwrd 0therS3cret and S3cret, SASL_PLAINTEXT");
        assert_eq!(
            shown,
            "refused: sasl.passwrd <redacted> and <redacted>, SASL_PLAINTEXT"
        );
        let e = KafkaConfig::new("a:1")
            .unwrap()
            .set_from_pair("S3cret")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("S3cret"), "{e}");
    }

    #[test]
    fn bootstrap_must_be_host_port() {
        assert!(KafkaConfig::new("").is_err());
        assert!(KafkaConfig::new("localhost").is_err());
        assert!(KafkaConfig::new("a:1,b").is_err());
        KafkaConfig::new("a:1, b:2").unwrap();
    }
}
