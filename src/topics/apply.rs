//! Applying a plan to the broker: create what is missing, compare what exists, and change an
//! existing topic only when asked (`fix`), never by shrinking it.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, ConfigSource, NewPartitions, NewTopic,
    ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::util::Timeout;

use super::{plan, TopicSpec, TopicsError};
use crate::config::KafkaConfig;

/// One difference between a topic on the broker and the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    /// What differs: `partitions`, `replication.factor`, or a topic config name.
    pub setting: String,
    /// The broker's value (`(unset)` when the broker has none).
    pub broker: String,
    /// The plan's value.
    pub file: String,
    /// Why `--fix` cannot change it, when it cannot.
    pub unfixable: Option<&'static str>,
}

/// What `apply` did to one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The topic was created.
    Created(String),
    /// The topic exists as planned.
    Unchanged(String),
    /// The topic differs; nothing was changed (no `fix`, or nothing fixable).
    Differs {
        /// Topic name.
        name: String,
        /// Every difference.
        drift: Vec<Drift>,
    },
    /// With `fix`: the fixable differences were changed on the broker; `left` could not be.
    Fixed {
        /// Topic name.
        name: String,
        /// Changed to the plan's value.
        fixed: Vec<Drift>,
        /// Still different (partitions above the plan, replication factor).
        left: Vec<Drift>,
    },
}

impl Applied {
    /// The topic's name.
    pub fn name(&self) -> &str {
        match self {
            Self::Created(n) | Self::Unchanged(n) => n,
            Self::Differs { name, .. } | Self::Fixed { name, .. } => name,
        }
    }

    /// Differences that remain on the broker after this apply.
    pub fn remaining(&self) -> &[Drift] {
        match self {
            Self::Differs { drift, .. } => drift,
            Self::Fixed { left, .. } => left,
            _ => &[],
        }
    }
}

const SHRINK: &str = "Kafka cannot remove partitions (and keys would move): change the file";
const REPLICATION: &str =
    "the replication factor changes only by a partition reassignment (kafka-reassign-partitions.sh)";

fn drift(setting: &str, broker: String, file: String, unfixable: Option<&'static str>) -> Drift {
    Drift {
        setting: setting.into(),
        broker,
        file,
        unfixable,
    }
}

/// Creates the missing topics of `specs` and compares the existing ones: partition count,
/// replication factor and every config the spec states. With `fix`, configs are set to the
/// plan's values (the topic's other overrides kept) and partitions grown; partitions are never
/// shrunk and the replication factor is only reported.
///
/// # Errors
/// [`TopicsError::Kafka`] when the cluster is unreachable or refuses a creation or change.
pub async fn apply(
    kafka: &KafkaConfig,
    specs: &[TopicSpec],
    fix: bool,
) -> Result<Vec<Applied>, TopicsError> {
    // By name, never librdkafka's message (it quotes the value, maybe a secret).
    kafka.validate()?;
    let admin: AdminClient<DefaultClientContext> = kafka.client_config().create()?;
    // Blocking librdkafka call; acceptable in a one-shot operator command.
    let md = admin
        .inner()
        .fetch_metadata(None, Timeout::After(Duration::from_secs(15)))?;
    // name → (partitions, replication factor as the largest replica set of any partition)
    let existing: BTreeMap<String, (i32, i32)> = md
        .topics()
        .iter()
        .map(|t| {
            let rf = t.partitions().iter().map(|p| p.replicas().len()).max();
            (
                t.name().to_owned(),
                (t.partitions().len() as i32, rf.unwrap_or(0) as i32),
            )
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let mut results = Vec::new();
    let mut to_create = Vec::new();
    for s in specs {
        let Some(&(partitions, rf)) = existing.get(&s.name) else {
            to_create.push(s);
            continue;
        };
        let configs = admin
            .describe_configs([&ResourceSpecifier::Topic(&s.name)], &opts)
            .await?;
        let resource = match configs.into_iter().next() {
            Some(Ok(r)) => r,
            Some(Err(code)) => {
                return Err(TopicsError::Parse(format!("describing {}: {code}", s.name)))
            }
            None => return Err(TopicsError::Parse(format!("no configs for {}", s.name))),
        };
        let broker: HashMap<&str, Option<&str>> = resource
            .entries
            .iter()
            .map(|e| (e.name.as_str(), e.value.as_deref()))
            .collect();
        let mut found = Vec::new();
        if partitions != s.partitions {
            found.push(drift(
                "partitions",
                partitions.to_string(),
                s.partitions.to_string(),
                (partitions > s.partitions).then_some(SHRINK),
            ));
        }
        if rf != s.replication_factor {
            found.push(drift(
                "replication.factor",
                rf.to_string(),
                s.replication_factor.to_string(),
                Some(REPLICATION),
            ));
        }
        for (k, v) in &s.config {
            let have = broker.get(k.as_str()).copied().flatten();
            if have != Some(v.as_str()) {
                found.push(drift(k, have.unwrap_or("(unset)").into(), v.clone(), None));
            }
        }
        if found.is_empty() {
            results.push(Applied::Unchanged(s.name.clone()));
            continue;
        }
        if !fix || found.iter().all(|d| d.unfixable.is_some()) {
            results.push(Applied::Differs {
                name: s.name.clone(),
                drift: found,
            });
            continue;
        }
        let (left, fixed): (Vec<Drift>, Vec<Drift>) =
            found.into_iter().partition(|d| d.unfixable.is_some());
        if fixed.iter().any(|d| d.setting == "partitions") {
            let grow = NewPartitions::new(&s.name, s.partitions as usize);
            for r in admin.create_partitions([&grow], &opts).await? {
                r.map_err(|(n, code)| {
                    TopicsError::Parse(format!(
                        "growing {n} to {} partitions: {code}",
                        s.partitions
                    ))
                })?;
            }
        }
        if fixed.iter().any(|d| d.setting != "partitions") {
            // AlterConfigs replaces the topic's whole set of overrides: keep the ones the plan
            // does not mention, set the ones it does.
            let mut entries: BTreeMap<&str, &str> = resource
                .entries
                .iter()
                .filter(|e| e.source == ConfigSource::DynamicTopic)
                .filter_map(|e| Some((e.name.as_str(), e.value.as_deref()?)))
                .collect();
            entries.extend(s.config.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            let mut change = AlterConfig::new(ResourceSpecifier::Topic(&s.name));
            for (k, v) in entries {
                change = change.set(k, v);
            }
            for r in admin.alter_configs([&change], &opts).await? {
                r.map_err(|(_, code)| {
                    TopicsError::Parse(format!("changing the configs of {}: {code}", s.name))
                })?;
            }
        }
        results.push(Applied::Fixed {
            name: s.name.clone(),
            fixed,
            left,
        });
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

/// Reads `path`, plans and applies it (see [`apply`]). Returns what happened; a topic that still
/// differs makes it fail after everything else was applied.
///
/// # Errors
/// See [`plan`] and [`apply`]; [`TopicsError::Mismatch`] when existing topics still differ.
pub async fn apply_file(
    kafka: &KafkaConfig,
    path: &str,
    fix: bool,
) -> Result<Vec<Applied>, TopicsError> {
    let text = std::fs::read_to_string(path).map_err(|source| TopicsError::Read {
        path: path.into(),
        source,
    })?;
    let specs = plan(&text)?;
    let results = apply(kafka, &specs, fix).await?;
    let differs: Vec<String> = results
        .iter()
        .filter(|r| !r.remaining().is_empty())
        .map(|r| {
            let what: Vec<String> = r
                .remaining()
                .iter()
                .map(|d| {
                    format!(
                        "{} {} on the broker, {} in the file",
                        d.setting, d.broker, d.file
                    )
                })
                .collect();
            format!("{}: {}", r.name(), what.join(", "))
        })
        .collect();
    if differs.is_empty() {
        Ok(results)
    } else {
        Err(TopicsError::Mismatch(differs.len(), differs.join("; ")))
    }
}
