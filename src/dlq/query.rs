//! Read-only views of the archive: the summary by cause, lists with filters and keyset
//! pagination, one letter whole, and the audit log.

use std::time::SystemTime;

use base64::Engine as _;
use serde::Serialize;
use serde_json::{json, Value};
use tokio_postgres::Row;

use super::filter::Filter;
use super::headers::{from_json, HeaderValue};
use super::{invalid, not_found, Dlq, DlqError};
use crate::message::rfc3339;
use crate::sql;

/// New letters of one original topic and consumer group.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TopicSummary {
    /// The original topic.
    pub original_topic: String,
    /// The consumer group that gave up (absent for records without the header).
    pub consumer_group: Option<String>,
    /// Letters waiting for an operator.
    pub new: i64,
    /// Letters replayed.
    pub replayed: i64,
    /// Letters dropped.
    pub dropped: i64,
    /// When the oldest new letter failed (RFC 3339).
    pub oldest_new_failed_at: Option<String>,
    /// Its age in seconds.
    pub oldest_new_age_secs: Option<f64>,
}

/// New letters sharing one cause: topic, group, kind and normalised error.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CauseGroup {
    /// The original topic.
    pub original_topic: String,
    /// The consumer group.
    pub consumer_group: Option<String>,
    /// `x-error-kind`.
    pub error_kind: Option<String>,
    /// The normalised error (see [`super::normalize_error`]); filter on it with
    /// [`Filter::error_group`].
    pub error_group: String,
    /// Letters in the group.
    pub count: i64,
    /// Earliest failure (RFC 3339).
    pub first_seen: String,
    /// Latest failure (RFC 3339).
    pub last_seen: String,
    /// One letter of the group, to open with `show`.
    pub example_id: i64,
    /// That letter's error as written.
    pub example_error: Option<String>,
}

/// The letters of one tenant (their message's `x-tenant` header).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TenantSummary {
    /// The tenant.
    pub tenant: String,
    /// Letters not acted on yet.
    pub new: i64,
    /// Replayed.
    pub replayed: i64,
    /// Dropped.
    pub dropped: i64,
    /// Age of its oldest new letter, seconds.
    pub oldest_new_age_secs: Option<f64>,
}

/// The archive at a glance.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    /// Per original topic and group.
    pub topics: Vec<TopicSummary>,
    /// Per tenant, most new letters first (empty without tenants; at most 1,000).
    pub tenants: Vec<TenantSummary>,
    /// New letters grouped by cause, largest first.
    pub groups: Vec<CauseGroup>,
}

/// The order of a letter list: by archive id, which follows the order letters failed in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Order {
    /// The latest letters first (the default: what is failing now).
    #[default]
    NewestFirst,
    /// The earliest first (what has waited longest).
    OldestFirst,
}

impl std::str::FromStr for Order {
    type Err = DlqError;
    fn from_str(s: &str) -> Result<Self, DlqError> {
        match s {
            "newest" => Ok(Order::NewestFirst),
            "oldest" => Ok(Order::OldestFirst),
            _ => Err(DlqError::Invalid(format!(
                "unknown order {s:?}: give newest or oldest"
            ))),
        }
    }
}

/// One line of a list.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LetterRow {
    /// Archive id.
    pub id: i64,
    /// The original topic.
    pub original_topic: String,
    /// The consumer group.
    pub consumer_group: Option<String>,
    /// `x-error-kind`.
    pub error_kind: Option<String>,
    /// The error, cut to 200 characters.
    pub error: Option<String>,
    /// `message_id` header.
    pub message_id: Option<String>,
    /// When it was dead-lettered.
    pub failed_at: String,
    /// `new`, `replayed` or `dropped`.
    pub status: String,
    /// Times dead-lettered before (the `x-dlq-retries` envelope).
    pub dlq_retries: i32,
    /// The tenant its message came from (`x-tenant`), if any.
    pub tenant: Option<String>,
}

/// One letter, whole.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    /// Archive id.
    pub id: i64,
    /// The DLQ topic, partition and offset it was read from.
    pub dlq_topic: String,
    /// Partition in the DLQ topic.
    pub partition: i32,
    /// Offset in the DLQ topic.
    pub offset: i64,
    /// The original topic.
    pub original_topic: String,
    /// The original partition.
    pub original_partition: Option<i32>,
    /// The original offset.
    pub original_offset: Option<i64>,
    /// The consumer group.
    pub consumer_group: Option<String>,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Body bytes, exactly as dead-lettered.
    pub body: Option<Vec<u8>>,
    /// Every header in record order.
    pub headers: Vec<(String, HeaderValue)>,
    /// `message_type` header.
    pub message_type: Option<String>,
    /// `message_id` header.
    pub message_id: Option<String>,
    /// `x-error`.
    pub error: Option<String>,
    /// The normalised error.
    pub error_group: String,
    /// `x-error-kind`.
    pub error_kind: Option<String>,
    /// `x-attempts`.
    pub attempts: Option<i32>,
    /// `x-dlq-retries`.
    pub dlq_retries: i32,
    /// `x-first-failed-at`.
    pub first_failed_at: Option<String>,
    /// `x-failed-at` (or the record's time).
    pub failed_at: String,
    /// When the archive read it.
    pub archived_at: String,
    /// `new`, `replayed` or `dropped`.
    pub status: String,
    /// When the status last changed.
    pub status_at: Option<String>,
    /// Why (drop reason, replay job).
    pub status_reason: Option<String>,
    /// Times a replay job sent this letter (or an earlier letter of the same message).
    pub times_replayed: i64,
}

fn bytes_json(b: Option<&[u8]>, redact: bool) -> Value {
    match b {
        _ if redact => json!({"redacted": true}),
        None => Value::Null,
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => json!({"text": s}),
            Err(_) => json!({"base64": base64::engine::general_purpose::STANDARD.encode(b)}),
        },
    }
}

impl DeadLetter {
    /// JSON for the CLI and the API: key and body as `{"text"}` when UTF-8, `{"base64"}`
    /// otherwise; with `redact_body` the body, the key and every header value are replaced by
    /// `{"redacted": true}` (the viewer role never receives message contents; header names,
    /// the error and the framework columns stay).
    pub fn to_json(&self, redact_body: bool) -> Value {
        let headers: Vec<Value> = self
            .headers
            .iter()
            .map(|(k, v)| {
                let value = match v {
                    HeaderValue::Null => Value::Null,
                    HeaderValue::Bytes(b) => bytes_json(Some(b), redact_body),
                };
                json!({"name": k, "value": value})
            })
            .collect();
        json!({
            "id": self.id,
            "dlq_topic": self.dlq_topic,
            "partition": self.partition,
            "offset": self.offset,
            "original_topic": self.original_topic,
            "original_partition": self.original_partition,
            "original_offset": self.original_offset,
            "consumer_group": self.consumer_group,
            "key": bytes_json(self.key.as_deref(), redact_body),
            "body": bytes_json(self.body.as_deref(), redact_body),
            "headers": headers,
            "message_type": self.message_type,
            "message_id": self.message_id,
            "error": self.error,
            "error_group": self.error_group,
            "error_kind": self.error_kind,
            "attempts": self.attempts,
            "dlq_retries": self.dlq_retries,
            "first_failed_at": self.first_failed_at,
            "failed_at": self.failed_at,
            "archived_at": self.archived_at,
            "status": self.status,
            "status_at": self.status_at,
            "status_reason": self.status_reason,
            "times_replayed": self.times_replayed,
        })
    }
}

/// One audit row.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AuditEntry {
    /// Audit id.
    pub id: i64,
    /// When (RFC 3339).
    pub at: String,
    /// Who: `--actor`, the OS user, or the admin token's holder.
    pub actor: String,
    /// `replay`, `drop` or `archive-purge`.
    pub action: String,
    /// The exact selection applied.
    pub filter: Value,
    /// How many letters.
    pub count: i64,
    /// Which letters.
    pub dead_letter_ids: Vec<i64>,
    /// The reason given (drop), or the job (replay).
    pub reason: Option<String>,
    /// Where it came from: `outbox-cli`, `outbox-admin` (the API), or the library caller's
    /// `application_name`.
    pub via: String,
}

pub(crate) fn ts(row: &Row, col: &str) -> String {
    rfc3339(row.get::<_, SystemTime>(col))
}

pub(crate) fn ts_opt(row: &Row, col: &str) -> Option<String> {
    row.get::<_, Option<SystemTime>>(col).map(rfc3339)
}

impl Dlq {
    /// Per topic and group, and new letters grouped by cause.
    ///
    /// # Errors
    /// [`DlqError`] when Postgres fails.
    pub async fn summary(&self) -> Result<Summary, DlqError> {
        let c = self.pool.get().await?;
        let topics = c
            .query(&self.sql(sql::dead_letters::SUMMARY_BY_TOPIC), &[])
            .await?
            .iter()
            .map(|r| TopicSummary {
                original_topic: r.get(0),
                consumer_group: r.get(1),
                new: r.get(2),
                replayed: r.get(3),
                dropped: r.get(4),
                oldest_new_failed_at: ts_opt(r, "oldest"),
                oldest_new_age_secs: r.get(6),
            })
            .collect();
        let groups = c
            .query(&self.sql(sql::dead_letters::CAUSE_GROUPS), &[])
            .await?
            .iter()
            .map(|r| CauseGroup {
                original_topic: r.get("original_topic"),
                consumer_group: r.get("consumer_group"),
                error_kind: r.get("error_kind"),
                error_group: r.get("error_group"),
                count: r.get("n"),
                first_seen: ts(r, "first_seen"),
                last_seen: ts(r, "last_seen"),
                example_id: r.get("example_id"),
                example_error: r.get("example_error"),
            })
            .collect();
        let tenants = c
            .query(&self.sql(sql::dead_letters::SUMMARY_BY_TENANT), &[])
            .await?
            .iter()
            .map(|r| TenantSummary {
                tenant: r.get(0),
                new: r.get(1),
                replayed: r.get(2),
                dropped: r.get(3),
                oldest_new_age_secs: r.get(4),
            })
            .collect();
        Ok(Summary {
            topics,
            tenants,
            groups,
        })
    }

    /// How many letters match `filter`, counted up to 10,001 (beyond: "more than 10,000").
    ///
    /// # Errors
    /// [`DlqError::Invalid`] for a bad filter.
    pub async fn count_matching(&self, filter: &Filter) -> Result<i64, DlqError> {
        let filter = filter.clone().normalized()?;
        let w = filter.to_where("d", None);
        let c = self.pool.get().await?;
        Ok(c.query_one(
            &self
                .sql(sql::dead_letters::COUNT_MATCHING)
                .replace("{where}", &w.sql),
            &w.refs(),
        )
        .await?
        .get(0))
    }

    /// Letters matching `filter` in `order`, at most `limit`; `past` continues a previous page
    /// (keyset pagination: pass the last id you saw, and the same order).
    ///
    /// # Errors
    /// [`DlqError::Invalid`] for a bad filter or limit.
    pub async fn list(
        &self,
        filter: &Filter,
        limit: i64,
        order: Order,
        past: Option<i64>,
    ) -> Result<Vec<LetterRow>, DlqError> {
        if !(1..=10_000).contains(&limit) {
            return invalid(format!("invalid limit {limit}: give 1 to 10000"));
        }
        let filter = filter.clone().normalized()?;
        let mut w = filter.to_where("d", None);
        let (cmp, dir) = match order {
            Order::NewestFirst => ("<", "DESC"),
            Order::OldestFirst => (">", "ASC"),
        };
        if let Some(b) = past {
            let p = w.push(b);
            w.sql = format!("{} AND d.id {cmp} {p}", w.sql);
        }
        let lim = w.push(limit);
        let c = self.pool.get().await?;
        let rows = c
            .query(
                &self
                    .sql(sql::dead_letters::LIST)
                    .replace("{where}", &w.sql)
                    .replace("{dir}", dir)
                    .replace("{limit}", &lim),
                &w.refs(),
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| LetterRow {
                id: r.get("id"),
                original_topic: r.get("original_topic"),
                consumer_group: r.get("consumer_group"),
                error_kind: r.get("error_kind"),
                error: r.get("error"),
                message_id: r.get("message_id"),
                failed_at: ts(r, "failed_at"),
                status: r.get("status"),
                dlq_retries: r.get("dlq_retries"),
                tenant: r.get("tenant"),
            })
            .collect())
    }

    /// One letter whole.
    ///
    /// # Errors
    /// [`DlqError::Invalid`] when there is no letter with that id.
    pub async fn show(&self, id: i64) -> Result<DeadLetter, DlqError> {
        let c = self.pool.get().await?;
        let Some(r) = c
            .query_opt(&self.sql(sql::dead_letters::LETTER), &[&id])
            .await?
        else {
            return not_found(format!("no dead letter with id {id}"));
        };
        Ok(DeadLetter {
            id: r.get("id"),
            dlq_topic: r.get("dlq_topic"),
            partition: r.get("partition"),
            offset: r.get("offset"),
            original_topic: r.get("original_topic"),
            original_partition: r.get("original_partition"),
            original_offset: r.get("original_offset"),
            consumer_group: r.get("consumer_group"),
            key: r.get("message_key"),
            body: r.get("body"),
            headers: from_json(&r.get::<_, Value>("headers")),
            message_type: r.get("message_type"),
            message_id: r.get("message_id"),
            error: r.get("error"),
            error_group: r.get("error_group"),
            error_kind: r.get("error_kind"),
            attempts: r.get("attempts"),
            dlq_retries: r.get("dlq_retries"),
            first_failed_at: ts_opt(&r, "first_failed_at"),
            failed_at: ts(&r, "failed_at"),
            archived_at: ts(&r, "archived_at"),
            status: r.get("status"),
            status_at: ts_opt(&r, "status_at"),
            status_reason: r.get("status_reason"),
            times_replayed: r.get("times_replayed"),
        })
    }

    /// Sets the DLQ gauges (`outbox_dlq_messages{topic,group,kind,status}`,
    /// `outbox_dlq_oldest_age_seconds{topic}`) from
    /// the archive; the archiver and the admin server call it every 15 s.
    ///
    /// # Errors
    /// [`DlqError`] when Postgres fails.
    pub async fn refresh_gauges(&self) -> Result<(), DlqError> {
        let c = self.pool.get().await?;
        let rows = c.query(&self.sql(sql::dead_letters::GAUGES), &[]).await?;
        let mut oldest: std::collections::HashMap<String, f64> = std::collections::HashMap::new();
        // Label values from headers are capped (several raw values may share `other`): sum
        // their counts per series before setting it.
        let mut counts: std::collections::HashMap<(String, String, String, String), f64> =
            std::collections::HashMap::new();
        for r in &rows {
            let (topic, group, kind, status): (String, String, String, String) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            let n: i64 = r.get(4);
            let topic = crate::metrics::bounded("topic", &topic);
            let key = (
                topic.clone(),
                crate::metrics::bounded("group", &group),
                crate::metrics::bounded("kind", &kind),
                status.clone(),
            );
            *counts.entry(key).or_default() += n as f64;
            let e = oldest.entry(topic).or_insert(0.0);
            if status == "new" {
                *e = e.max(r.get::<_, Option<f64>>(5).unwrap_or(0.0));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for ((topic, group, kind, status), n) in counts {
            seen.insert((topic.clone(), group.clone(), kind.clone(), status.clone()));
            metrics::gauge!(crate::metrics::DLQ_MESSAGES,
                "topic" => topic, "group" => group, "kind" => kind, "status" => status)
            .set(n);
        }
        {
            // Series that emptied since the last refresh go to 0 rather than keep their last value.
            let mut known = self
                .gauges_seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for k in known.difference(&seen) {
                metrics::gauge!(crate::metrics::DLQ_MESSAGES,
                    "topic" => k.0.clone(), "group" => k.1.clone(), "kind" => k.2.clone(), "status" => k.3.clone())
                .set(0.0);
            }
            known.extend(seen);
            for (topic, age) in oldest {
                metrics::gauge!(crate::metrics::DLQ_OLDEST_AGE, "topic" => topic).set(age);
            }
        }
        self.refresh_tenant_gauges(&c).await
    }

    /// `outbox_dlq_tenant_messages{tenant,status}`: the busiest
    /// [`crate::metrics::TENANT_LABELS`] tenants keep a label of their own (the first seen keep
    /// it for the process's life), the rest are summed under `tenant="other"`.
    async fn refresh_tenant_gauges(&self, c: &tokio_postgres::Client) -> Result<(), DlqError> {
        let rows = c
            .query(&self.sql(sql::dead_letters::GAUGES_BY_TENANT), &[])
            .await?;
        let mut labels = self
            .tenant_labels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut counts: std::collections::BTreeMap<(String, String), f64> =
            std::collections::BTreeMap::new();
        for r in &rows {
            let (tenant, status): (String, String) = (r.get(0), r.get(1));
            let n: i64 = r.get(2);
            let known = labels.contains(&tenant);
            let label = if known || labels.len() < crate::metrics::TENANT_LABELS {
                if !known {
                    labels.insert(tenant.clone());
                }
                tenant
            } else {
                "other".to_owned()
            };
            *counts.entry((label, status)).or_default() += n as f64;
        }
        // Every labelled tenant (and other) gets every status, 0 when it has none now.
        let mut names: Vec<String> = labels.iter().cloned().collect();
        names.push("other".to_owned());
        for t in names {
            for status in ["new", "replayed", "dropped"] {
                let n = counts
                    .get(&(t.clone(), status.to_owned()))
                    .copied()
                    .unwrap_or(0.0);
                metrics::gauge!(crate::metrics::DLQ_TENANT_MESSAGES,
                    "tenant" => t.clone(), "status" => status)
                .set(n);
            }
        }
        Ok(())
    }

    /// The audit log, newest first.
    ///
    /// # Errors
    /// [`DlqError`] when Postgres fails.
    pub async fn audit(&self, limit: i64) -> Result<Vec<AuditEntry>, DlqError> {
        if !(1..=10_000).contains(&limit) {
            return invalid(format!("invalid limit {limit}: give 1 to 10000"));
        }
        let c = self.pool.get().await?;
        Ok(c.query(&self.sql(sql::dead_letters::AUDIT_LOG), &[&limit])
            .await?
            .iter()
            .map(|r| AuditEntry {
                id: r.get("id"),
                at: ts(r, "at"),
                actor: r.get("actor"),
                action: r.get("action"),
                filter: r.get("filter"),
                count: r.get("count"),
                dead_letter_ids: r.get("dead_letter_ids"),
                reason: r.get("reason"),
                via: r.get("via"),
            })
            .collect())
    }
}
