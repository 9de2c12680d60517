//! `outbox topics apply FILE`: topics as code. Creates each topic with its retry chain and
//! dead-letter topic, and verifies existing ones; never relies on broker auto-creation.
//!
//! ```toml
//! # topics.toml
//! [defaults]
//! partitions = 6
//! replication_factor = 1
//! retention = "7d"             # retention.ms of main and retry topics
//! retry_delays = ["5s", "30s", "5m"]   # <topic>.retry-5s, .retry-30s, .retry-5m; [] for none
//! dlq_suffix = "dlq"           # <topic>.dlq
//! dlq_retention = "30d"        # dead letters are kept longer than their source
//!
//! [[topic]]
//! name = "orders.created"
//! partitions = 12              # any default can be overridden per topic
//! config = { "min.insync.replicas" = "1" }
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::util::Timeout;
use serde::Deserialize;

use crate::config::KafkaConfig;
use crate::topic::{validate_topic, InvalidTopic};

use crate::wire::{DEFAULT_DLQ_SUFFIX, DEFAULT_RETRY_DELAYS};

/// Default `retention.ms` of a dead-letter topic: 30 days, longer than its source's, so a
/// letter outlives the week it may take someone to look at it.
pub const DEFAULT_DLQ_TOPIC_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Why `topics apply` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopicsError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this format.
    #[error("invalid topics file: {0}")]
    Parse(String),
    /// A topic name (given or derived) breaks the naming rules.
    #[error(transparent)]
    InvalidTopic(#[from] InvalidTopic),
    /// Kafka refused or could not be reached.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// Existing topics differ from the file; nothing was changed for them.
    #[error("{0} topic(s) differ from the file: {1}")]
    Mismatch(usize, String),
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Defaults {
    partitions: Option<i32>,
    replication_factor: Option<i32>,
    retention: Option<String>,
    retry_delays: Option<Vec<String>>,
    dlq_suffix: Option<String>,
    dlq_retention: Option<String>,
    #[serde(default)]
    config: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TopicEntry {
    name: String,
    partitions: Option<i32>,
    replication_factor: Option<i32>,
    retention: Option<String>,
    retry_delays: Option<Vec<String>>,
    dlq_suffix: Option<String>,
    dlq_retention: Option<String>,
    #[serde(default)]
    config: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    defaults: Defaults,
    #[serde(default, rename = "topic")]
    topics: Vec<TopicEntry>,
}

/// One topic to exist on the broker, after defaults and derivation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    /// Topic name.
    pub name: String,
    /// Partition count.
    pub partitions: i32,
    /// Replication factor.
    pub replication_factor: i32,
    /// Topic configs (`retention.ms`, …).
    pub config: BTreeMap<String, String>,
}

fn millis(s: &str, what: &str) -> Result<String, TopicsError> {
    humantime::parse_duration(s)
        .map(|d| d.as_millis().to_string())
        .map_err(|e| TopicsError::Parse(format!("{what} {s:?}: {e}")))
}

/// Parses a topics file and expands each entry into main, retry and dead-letter topics.
///
/// # Errors
/// [`TopicsError::Parse`] for malformed TOML, unknown keys, bad durations or counts;
/// [`TopicsError::InvalidTopic`] for a bad name, including a derived one.
pub fn plan(toml_text: &str) -> Result<Vec<TopicSpec>, TopicsError> {
    let file: File = toml::from_str(toml_text).map_err(|e| TopicsError::Parse(e.to_string()))?;
    if file.topics.is_empty() {
        return Err(TopicsError::Parse("no [[topic]] entries".into()));
    }
    let d = file.defaults;
    let mut out = Vec::new();
    for t in file.topics {
        validate_topic(&t.name)?;
        let partitions = t.partitions.or(d.partitions).unwrap_or(3);
        let rf = t.replication_factor.or(d.replication_factor).unwrap_or(1);
        if partitions < 1 || rf < 1 {
            return Err(TopicsError::Parse(format!(
                "{}: partitions and replication_factor must be >= 1",
                t.name
            )));
        }
        let mut config = d.config.clone();
        config.extend(t.config.clone());
        if let Some(r) = t.retention.as_ref().or(d.retention.as_ref()) {
            config.insert("retention.ms".into(), millis(r, "retention")?);
        }
        let delays = t
            .retry_delays
            .clone()
            .or(d.retry_delays.clone())
            .unwrap_or_else(|| {
                DEFAULT_RETRY_DELAYS
                    .iter()
                    .map(|d| humantime::format_duration(*d).to_string())
                    .collect()
            });
        out.push(TopicSpec {
            name: t.name.clone(),
            partitions,
            replication_factor: rf,
            config: config.clone(),
        });
        for delay in &delays {
            let d = humantime::parse_duration(delay)
                .map_err(|e| TopicsError::Parse(format!("retry delay {delay:?}: {e}")))?;
            // Named exactly as the consumer names them ("300s" → retry-5m), so both agree.
            let suffix = crate::wire::retry_suffix(d).map_err(TopicsError::Parse)?;
            let name = format!("{}.{suffix}", t.name);
            validate_topic(&name)?;
            out.push(TopicSpec {
                name,
                partitions,
                replication_factor: rf,
                config: config.clone(),
            });
        }
        let suffix = t
            .dlq_suffix
            .as_ref()
            .or(d.dlq_suffix.as_ref())
            .map_or(DEFAULT_DLQ_SUFFIX, String::as_str);
        let dlq = format!("{}.{suffix}", t.name);
        validate_topic(&dlq)?;
        let mut dlq_config = config;
        let dlq_retention = match t.dlq_retention.as_ref().or(d.dlq_retention.as_ref()) {
            Some(r) => millis(r, "dlq_retention")?,
            None => DEFAULT_DLQ_TOPIC_RETENTION.as_millis().to_string(),
        };
        dlq_config.insert("retention.ms".into(), dlq_retention);
        out.push(TopicSpec {
            name: dlq,
            partitions,
            replication_factor: rf,
            config: dlq_config,
        });
    }
    Ok(out)
}

/// What `apply` did to one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The topic was created.
    Created(String),
    /// The topic existed with the expected partition count.
    Unchanged(String),
    /// The topic existed with another partition count; left alone.
    Differs {
        /// Topic name.
        name: String,
        /// Partitions on the broker.
        actual: i32,
        /// Partitions in the file.
        expected: i32,
    },
}

/// Creates the missing topics of `specs` and checks the existing ones.
///
/// # Errors
/// [`TopicsError::Kafka`] when the cluster is unreachable or refuses a creation.
pub async fn apply(kafka: &KafkaConfig, specs: &[TopicSpec]) -> Result<Vec<Applied>, TopicsError> {
    let admin: AdminClient<DefaultClientContext> = kafka.client_config().create()?;
    // Blocking librdkafka call; acceptable in a one-shot operator command.
    let md = admin
        .inner()
        .fetch_metadata(None, Timeout::After(Duration::from_secs(15)))?;
    let existing: BTreeMap<String, i32> = md
        .topics()
        .iter()
        .map(|t| (t.name().to_owned(), t.partitions().len() as i32))
        .collect();
    let mut results = Vec::new();
    let mut to_create = Vec::new();
    for s in specs {
        match existing.get(&s.name) {
            Some(&n) if n == s.partitions => results.push(Applied::Unchanged(s.name.clone())),
            Some(&n) => results.push(Applied::Differs {
                name: s.name.clone(),
                actual: n,
                expected: s.partitions,
            }),
            None => to_create.push(s),
        }
    }
    if !to_create.is_empty() {
        let new: Vec<NewTopic<'_>> = to_create
            .iter()
            .map(|s| {
                let mut nt = NewTopic::new(
                    &s.name,
                    s.partitions,
                    TopicReplication::Fixed(s.replication_factor),
                );
                for (k, v) in &s.config {
                    nt = nt.set(k, v);
                }
                nt
            })
            .collect();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for r in admin.create_topics(&new, &opts).await? {
            match r {
                Ok(name) => results.push(Applied::Created(name)),
                Err((name, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {
                    results.push(Applied::Unchanged(name));
                }
                Err((name, code)) => {
                    return Err(TopicsError::Parse(format!("creating {name}: {code}")));
                }
            }
        }
    }
    Ok(results)
}

/// Reads `path`, plans and applies it. Returns what happened; a differing topic makes it fail
/// after everything else was applied.
///
/// # Errors
/// See [`plan`] and [`apply`]; [`TopicsError::Mismatch`] when existing topics differ.
pub async fn apply_file(kafka: &KafkaConfig, path: &str) -> Result<Vec<Applied>, TopicsError> {
    let text = std::fs::read_to_string(path).map_err(|source| TopicsError::Read {
        path: path.into(),
        source,
    })?;
    let specs = plan(&text)?;
    let results = apply(kafka, &specs).await?;
    let differs: Vec<String> = results
        .iter()
        .filter_map(|r| match r {
            Applied::Differs {
                name,
                actual,
                expected,
            } => Some(format!(
                "{name} has {actual} partitions, file says {expected}"
            )),
            _ => None,
        })
        .collect();
    if differs.is_empty() {
        Ok(results)
    } else {
        Err(TopicsError::Mismatch(differs.len(), differs.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_retry_chain_and_dlq_with_longer_retention() {
        let specs = plan(
            r#"
            [defaults]
            partitions = 6
            retention = "7d"
            [[topic]]
            name = "orders.created"
            [[topic]]
            name = "billing.charged"
            partitions = 2
            retry_delays = []
            dlq_suffix = "dead"
            [[topic]]
            name = "billing.refunded"
            retry_delays = ["300s", "90s"]
            "#,
        )
        .unwrap();
        let names: Vec<_> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "orders.created",
                "orders.created.retry-5s",
                "orders.created.retry-30s",
                "orders.created.retry-5m",
                "orders.created.dlq",
                "billing.charged",
                "billing.charged.dead",
                "billing.refunded",
                "billing.refunded.retry-5m",
                "billing.refunded.retry-90s",
                "billing.refunded.dlq"
            ]
        );
        assert_eq!(specs[0].config["retention.ms"], "604800000");
        assert_eq!(specs[4].config["retention.ms"], "2592000000");
        assert_eq!(specs[6].partitions, 2);
    }

    #[test]
    fn refuses_bad_files() {
        assert!(matches!(
            plan("[[topic]]\nname = \"a b\""),
            Err(TopicsError::InvalidTopic(_))
        ));
        // orders_created + ".retry-5s" would mix '.' and '_'.
        assert!(matches!(
            plan("[[topic]]\nname = \"orders_created\""),
            Err(TopicsError::InvalidTopic(_))
        ));
        assert!(matches!(
            plan("[[topic]]\nname = \"a.b\"\nretention = \"soon\""),
            Err(TopicsError::Parse(_))
        ));
        assert!(matches!(
            plan("[[topic]]\nname = \"a.b\"\nbogus = 1"),
            Err(TopicsError::Parse(_))
        ));
        assert!(matches!(plan(""), Err(TopicsError::Parse(_))));
        assert!(matches!(
            plan("[[topic]]\nname = \"a.b\"\npartitions = 0"),
            Err(TopicsError::Parse(_))
        ));
    }
}
