//! `outbox topics apply FILE`: topics as code. Creates each topic with the retry chain of every
//! consumer group that reads it and its dead-letter topic, verifies existing ones (partitions,
//! replication factor and every config the plan states) and changes them only when asked
//! (`--fix`); never relies on broker auto-creation.
//!
//! ```toml
//! # topics.toml
//! [defaults]
//! partitions = 6
//! replication_factor = 3
//! retention = "7d"                     # retention.ms of main and retry topics
//! retry_delays = ["5s", "30s", "5m"]   # per group: <topic>.<group>.retry-5s, -30s, -5m
//! groups = ["billing-service"]         # consumer groups that read every topic
//! dlq_suffix = "dlq"                   # <topic>.dlq, shared by the groups
//! dlq_retention = "30d"                # dead letters are kept longer than their source
//! dlq_replication_factor = 3           # default: the source's
//! config = { "min.insync.replicas" = "2" }   # default: 2 when RF >= 3, else 1
//!
//! [[topic]]
//! name = "orders.created"
//! partitions = 12                      # any default can be overridden per topic
//! groups = ["billing-service", "notifications-service"]
//! strict_order = ["billing-service"]   # groups that hold a key behind its dead letter
//! config = { "cleanup.policy" = "compact" }  # a state topic (its retry and DLQ topics stay "delete")
//! ```
//!
//! `strict_order` is read by the consumer ([`strict_order_topics`] into
//! `ConsumerConfig::strict_order`), not by `topics apply`: one file says what each group
//! promises about a topic.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::topic::{validate_topic, InvalidTopic};
use crate::wire::{retry_topic, DEFAULT_DLQ_SUFFIX, DEFAULT_RETRY_DELAYS};

mod apply;
pub use apply::{apply, apply_file, Applied, Drift};

/// Default `retention.ms` of a dead-letter topic: 30 days, longer than its source's, so a
/// letter outlives the week it may take someone to look at it.
pub const DEFAULT_DLQ_TOPIC_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// Default `retention.ms` of main and retry topics: 7 days, stated on the topic rather than left
/// to whatever the broker's default is.
pub const DEFAULT_TOPIC_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

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
    /// A Kafka property librdkafka refuses (named; its value never shown).
    #[error(transparent)]
    Config(#[from] crate::ConfigError),
    /// Existing topics differ from the file (what could be fixed was, with `--fix`).
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
    groups: Option<Vec<String>>,
    dlq_suffix: Option<String>,
    dlq_retention: Option<String>,
    dlq_replication_factor: Option<i32>,
    /// Groups in strict per-key order on every topic (read by the consumer).
    strict_order: Option<Vec<String>>,
    #[serde(default)]
    config: BTreeMap<String, String>,
    #[serde(default)]
    dlq_config: BTreeMap<String, String>,
    /// The payload format and subject naming (read by `outbox::schemas`, not by `topics
    /// apply`): accepted here so one file serves both.
    #[serde(default)]
    #[allow(dead_code)]
    format: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    subject: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TopicEntry {
    name: String,
    partitions: Option<i32>,
    replication_factor: Option<i32>,
    retention: Option<String>,
    retry_delays: Option<Vec<String>>,
    groups: Option<Vec<String>>,
    dlq_suffix: Option<String>,
    dlq_retention: Option<String>,
    dlq_replication_factor: Option<i32>,
    /// Groups in strict per-key order on this topic (read by the consumer).
    strict_order: Option<Vec<String>>,
    #[serde(default)]
    config: BTreeMap<String, String>,
    #[serde(default)]
    dlq_config: BTreeMap<String, String>,
    /// `format`, `subject`, `record`: the schema settings (see `outbox::schemas`).
    #[serde(default)]
    #[allow(dead_code)]
    format: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    subject: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    record: Option<String>,
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
    /// Topic configs (`retention.ms`, `cleanup.policy`, `min.insync.replicas`, …), each one
    /// compared with the broker's value.
    pub config: BTreeMap<String, String>,
}

fn millis(s: &str, what: &str) -> Result<String, TopicsError> {
    humantime::parse_duration(s)
        .map(|d| d.as_millis().to_string())
        .map_err(|e| TopicsError::Parse(format!("{what} {s:?}: {e}")))
}

/// The settings every planned topic states explicitly, so that a topic created by hand with the
/// broker's defaults is seen to differ: retention, cleanup policy, and the in-sync minimum
/// that makes `acks=all` mean something (2 of 3 replicas; 1 below three).
fn stated(
    mut config: BTreeMap<String, String>,
    rf: i32,
    retention: String,
) -> BTreeMap<String, String> {
    config.entry("retention.ms".into()).or_insert(retention);
    config
        .entry("cleanup.policy".into())
        .or_insert_with(|| "delete".into());
    config
        .entry("min.insync.replicas".into())
        .or_insert_with(|| if rf >= 3 { "2" } else { "1" }.into());
    config
}

/// The dead-letter topic of entry `t` under defaults `d`.
fn dlq_name(t: &TopicEntry, d: &Defaults) -> String {
    let suffix = t
        .dlq_suffix
        .as_ref()
        .or(d.dlq_suffix.as_ref())
        .map_or(DEFAULT_DLQ_SUFFIX, String::as_str);
    format!("{}.{suffix}", t.name)
}

/// The dead-letter topics a topics file declares, each with the topic its letters come from
/// (`(dlq topic, topic)`, one per `[[topic]]`): what a deployment's archiver reads.
///
/// # Errors
/// As [`plan`].
pub fn dead_letter_topics(toml_text: &str) -> Result<Vec<(String, String)>, TopicsError> {
    plan(toml_text)?;
    let file: File = toml::from_str(toml_text).map_err(|e| TopicsError::Parse(e.to_string()))?;
    Ok(file
        .topics
        .iter()
        .map(|t| (dlq_name(t, &file.defaults), t.name.clone()))
        .collect())
}

/// The topics on which `group` keeps strict per-key order, by the file's `strict_order` (a
/// topic's own list replaces the defaults' one): what `ConsumerConfig::strict_order` takes.
///
/// # Errors
/// As [`plan`].
pub fn strict_order_topics(toml_text: &str, group: &str) -> Result<Vec<String>, TopicsError> {
    plan(toml_text)?;
    let file: File = toml::from_str(toml_text).map_err(|e| TopicsError::Parse(e.to_string()))?;
    Ok(file
        .topics
        .iter()
        .filter(|t| {
            t.strict_order
                .as_ref()
                .or(file.defaults.strict_order.as_ref())
                .is_some_and(|g| g.iter().any(|g| g == group))
        })
        .map(|t| t.name.clone())
        .collect())
}

/// Parses a topics file and expands each entry into the main topic, the retry chain of each
/// declared consumer group, and the dead-letter topic.
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
        let dlq_rf = t
            .dlq_replication_factor
            .or(d.dlq_replication_factor)
            .unwrap_or(rf);
        if partitions < 1 || rf < 1 || dlq_rf < 1 {
            return Err(TopicsError::Parse(format!(
                "{}: partitions and replication factors must be >= 1",
                t.name
            )));
        }
        let mut config = d.config.clone();
        config.extend(t.config.clone());
        let retention = match t.retention.as_ref().or(d.retention.as_ref()) {
            Some(r) => millis(r, "retention")?,
            None => DEFAULT_TOPIC_RETENTION.as_millis().to_string(),
        };
        let main_config = stated(config.clone(), rf, retention.clone());
        // Retry and dead-letter topics hold every failed record of a key, not the last one:
        // they are never compacted, whatever the source is.
        let mut side = config;
        side.insert("cleanup.policy".into(), "delete".into());
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
        let groups = t.groups.clone().or(d.groups.clone()).unwrap_or_default();
        out.push(TopicSpec {
            name: t.name.clone(),
            partitions,
            replication_factor: rf,
            config: main_config,
        });
        for group in &groups {
            for delay in &delays {
                let d = humantime::parse_duration(delay)
                    .map_err(|e| TopicsError::Parse(format!("retry delay {delay:?}: {e}")))?;
                // Named exactly as the consumer names them ("300s" → retry-5m), so both agree.
                let name = retry_topic(&t.name, group, d)
                    .map_err(|e| TopicsError::Parse(e.to_string()))?;
                out.push(TopicSpec {
                    name,
                    partitions,
                    replication_factor: rf,
                    config: stated(side.clone(), rf, retention.clone()),
                });
            }
        }
        let dlq = dlq_name(&t, &d);
        validate_topic(&dlq)?;
        let dlq_retention = match t.dlq_retention.as_ref().or(d.dlq_retention.as_ref()) {
            Some(r) => millis(r, "dlq_retention")?,
            None => DEFAULT_DLQ_TOPIC_RETENTION.as_millis().to_string(),
        };
        let mut dlq_config = side;
        if dlq_rf != rf {
            // The source's in-sync minimum was chosen for the source's replication.
            dlq_config.remove("min.insync.replicas");
        }
        dlq_config.extend(d.dlq_config.clone());
        dlq_config.extend(t.dlq_config.clone());
        dlq_config.insert("retention.ms".into(), dlq_retention);
        out.push(TopicSpec {
            name: dlq,
            partitions,
            replication_factor: dlq_rf,
            config: stated(dlq_config, dlq_rf, String::new()),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dead_letter_topics_of_a_file_are_its_own() {
        let t = dead_letter_topics(
            r#"
            [defaults]
            dlq_suffix = "dead"
            [[topic]]
            name = "orders.created"
            [[topic]]
            name = "payments.settled"
            dlq_suffix = "dlq"
            "#,
        )
        .unwrap();
        let pair = |d: &str, o: &str| (d.to_owned(), o.to_owned());
        assert_eq!(
            t,
            [
                pair("orders.created.dead", "orders.created"),
                pair("payments.settled.dlq", "payments.settled")
            ]
        );
        assert!(dead_letter_topics("[[topic]]\nname = \"bad name\"").is_err());
    }

    #[test]
    fn a_file_with_schema_settings_plans_the_same_topics() {
        let with = plan(
            r#"
            [defaults]
            format = "avro"
            subject = "topic"
            [[topic]]
            name = "orders.created"
            format = "protobuf"
            subject = "record"
            record = "acme.OrderCreated"
            "#,
        )
        .unwrap();
        let without = plan("[[topic]]\nname = \"orders.created\"").unwrap();
        assert_eq!(with, without);
    }

    #[test]
    fn strict_order_is_per_group_and_a_topic_list_replaces_the_default() {
        let f = r#"
            [defaults]
            strict_order = ["ledger"]
            [[topic]]
            name = "accounts.events"
            [[topic]]
            name = "orders.created"
            strict_order = ["billing-service"]
            [[topic]]
            name = "audit.log"
            strict_order = []
        "#;
        assert_eq!(
            super::strict_order_topics(f, "ledger").unwrap(),
            ["accounts.events"]
        );
        assert_eq!(
            super::strict_order_topics(f, "billing-service").unwrap(),
            ["orders.created"]
        );
        assert!(super::strict_order_topics(f, "other").unwrap().is_empty());
        // Odd group names are names like any other: they match themselves only.
        let odd = format!(
            "[[topic]]\nname = \"a\"\nstrict_order = [\"\\u0000\", \"{}\"]",
            "g".repeat(10_000)
        );
        assert!(super::strict_order_topics(&odd, "").unwrap().is_empty());
        assert_eq!(super::strict_order_topics(&odd, "\0").unwrap(), ["a"]);
        assert_eq!(
            super::strict_order_topics(&odd, &"g".repeat(10_000)).unwrap(),
            ["a"]
        );
        assert!(
            super::strict_order_topics("[[topic]]\nname = \"a\"\nstrict_order = \"x\"", "x")
                .is_err()
        );
    }

    #[test]
    fn expands_retry_chain_per_group_and_dlq_with_longer_retention() {
        let specs = plan(
            r#"
            [defaults]
            partitions = 6
            retention = "7d"
            groups = ["billing-service"]
            [[topic]]
            name = "orders.created"
            groups = ["billing-service", "mailer"]
            [[topic]]
            name = "billing.charged"
            partitions = 2
            retry_delays = []
            dlq_suffix = "dead"
            [[topic]]
            name = "billing.refunded"
            retry_delays = ["300s", "90s"]
            replication_factor = 3
            dlq_replication_factor = 2
            config = { "cleanup.policy" = "compact" }
            "#,
        )
        .unwrap();
        let names: Vec<_> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "orders.created",
                "orders.created.billing-service.retry-5s",
                "orders.created.billing-service.retry-30s",
                "orders.created.billing-service.retry-5m",
                "orders.created.mailer.retry-5s",
                "orders.created.mailer.retry-30s",
                "orders.created.mailer.retry-5m",
                "orders.created.dlq",
                "billing.charged",
                "billing.charged.dead",
                "billing.refunded",
                "billing.refunded.billing-service.retry-5m",
                "billing.refunded.billing-service.retry-90s",
                "billing.refunded.dlq"
            ]
        );
        let by = |n: &str| specs.iter().find(|s| s.name == n).unwrap();
        assert_eq!(by("orders.created").config["retention.ms"], "604800000");
        assert_eq!(by("orders.created").config["cleanup.policy"], "delete");
        assert_eq!(by("orders.created").config["min.insync.replicas"], "1");
        assert_eq!(
            by("orders.created.dlq").config["retention.ms"],
            "2592000000"
        );
        assert_eq!(by("billing.charged.dead").partitions, 2);
        // A compacted state topic; its retry and dead-letter topics keep every record.
        let refunded = by("billing.refunded");
        assert_eq!(refunded.config["cleanup.policy"], "compact");
        assert_eq!(refunded.config["min.insync.replicas"], "2");
        let retry = by("billing.refunded.billing-service.retry-5m");
        assert_eq!(retry.config["cleanup.policy"], "delete");
        let dlq = by("billing.refunded.dlq");
        assert_eq!(dlq.config["cleanup.policy"], "delete");
        assert_eq!(
            (dlq.replication_factor, refunded.replication_factor),
            (2, 3)
        );
        assert_eq!(dlq.config["min.insync.replicas"], "1");
    }

    #[test]
    fn a_group_that_cannot_name_a_topic_is_refused() {
        let e = plan("[[topic]]\nname = \"a.b\"\ngroups = [\"billing_service\"]").unwrap_err();
        assert!(e.to_string().contains("billing_service"), "{e}");
    }

    #[test]
    fn refuses_bad_files() {
        assert!(matches!(
            plan("[[topic]]\nname = \"a b\""),
            Err(TopicsError::InvalidTopic(_))
        ));
        // orders_created + ".dlq" would mix '.' and '_'.
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
