//! The selection shared by `list`, `replay` and `drop`: ids, or filters on the archive's
//! columns. Rendered as a parameterised SQL condition (never string-pasted values), and stored
//! as JSON in the audit log and in replay jobs exactly as it was applied.

use std::str::FromStr;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use tokio_postgres::types::ToSql;

use super::{invalid, DlqError};
use crate::message::rfc3339;
// A value given back in an error is cut and escaped: a filter may be 100,000 bytes of anything.
use crate::schema::shown;

/// A dead letter's status in the archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Archived, nobody acted on it yet.
    New,
    /// Sent back to its original topic (after the broker's ack).
    Replayed,
    /// Dropped by an operator or by a drain policy, with a reason.
    Dropped,
}

impl Status {
    /// The column value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::Replayed => "replayed",
            Self::Dropped => "dropped",
        }
    }
}

impl FromStr for Status {
    type Err = DlqError;
    fn from_str(s: &str) -> Result<Self, DlqError> {
        match s {
            "new" => Ok(Self::New),
            "replayed" => Ok(Self::Replayed),
            "dropped" => Ok(Self::Dropped),
            other => invalid(format!(
                "invalid status {}: expected new, replayed or dropped",
                shown(other)
            )),
        }
    }
}

/// Which dead letters an operation applies to. Empty fields do not filter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Filter {
    /// Exactly these archive ids.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<i64>,
    /// The original topic (e.g. `orders.created`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The consumer group that gave up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Case-insensitive substring of the error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_contains: Option<String>,
    /// Exactly this normalised error (a group of the summary).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_group: Option<String>,
    /// `x-error-kind`: `transient-exhausted`, `permanent`, `decode`, `panic`, `unavailable`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The tenant the message came from (its `x-tenant` header; see `outbox tenants`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Status; list shows every status when unset, replay and drop take `new` letters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// Dead-lettered at or after (RFC 3339, or a duration such as `2h` meaning "2 h ago").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Dead-lettered before (same forms as `since`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
}

/// A condition and its parameters, numbered from `$1`.
pub(crate) struct Where {
    pub sql: String,
    pub params: Vec<Box<dyn ToSql + Sync + Send>>,
}

impl Where {
    pub fn refs(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params
            .iter()
            .map(|p| p.as_ref() as &(dyn ToSql + Sync))
            .collect()
    }
    /// Appends a parameter and returns its placeholder.
    pub fn push(&mut self, p: impl ToSql + Sync + Send + 'static) -> String {
        self.params.push(Box::new(p));
        format!("${}", self.params.len())
    }
}

/// The `x-error-kind` values the framework writes; the archive records any other as
/// `unknown`.
pub(crate) const KINDS: [&str; 5] = [
    "transient-exhausted",
    "permanent",
    "decode",
    "panic",
    "unavailable",
];

/// Parses RFC 3339 (`2026-11-30T08:00:00Z`, also without zone = UTC) or a duration ago (`90m`).
fn parse_time(what: &str, s: &str) -> Result<SystemTime, DlqError> {
    crate::message::parse_instant(s).map_err(|e| DlqError::Invalid(format!("invalid {what} {e}")))
}

impl Filter {
    /// True when the filter selects something narrower than "everything".
    pub fn is_selective(&self) -> bool {
        !self.ids.is_empty()
            || self.topic.is_some()
            || self.group.is_some()
            || self.error_contains.is_some()
            || self.error_group.is_some()
            || self.kind.is_some()
            || self.tenant.is_some()
            || self.since.is_some()
            || self.until.is_some()
    }

    /// Checks every field and turns relative times into absolute ones, so the stored filter
    /// means the same thing tomorrow.
    ///
    /// # Errors
    /// [`DlqError::Invalid`] naming the bad field.
    pub fn normalized(mut self) -> Result<Self, DlqError> {
        for id in &self.ids {
            if *id <= 0 {
                return invalid(format!("invalid dead letter id {id}: ids are positive"));
            }
        }
        self.ids.sort_unstable();
        self.ids.dedup();
        for (name, v) in [
            ("topic", &self.topic),
            ("group", &self.group),
            ("error filter", &self.error_contains),
            ("error group", &self.error_group),
            ("kind", &self.kind),
            ("tenant", &self.tenant),
        ] {
            if let Some(v) = v {
                if v.is_empty() || v.len() > 1000 || v.contains('\u{0}') {
                    return invalid(format!(
                        "invalid {name} {}: give 1 to 1000 characters, no NUL",
                        shown(v)
                    ));
                }
            }
        }
        if let Some(k) = &self.kind {
            if !KINDS.contains(&k.as_str()) && k != "unknown" {
                return invalid(format!(
                    "invalid kind {}: expected one of {}, unknown",
                    shown(k),
                    KINDS.join(", ")
                ));
            }
        }
        let since = self
            .since
            .as_deref()
            .map(|s| parse_time("--since", s))
            .transpose()?;
        let until = self
            .until
            .as_deref()
            .map(|s| parse_time("--until", s))
            .transpose()?;
        if let (Some(a), Some(b)) = (since, until) {
            if a >= b {
                return invalid("--since must be before --until");
            }
        }
        self.since = since.map(rfc3339);
        self.until = until.map(rfc3339);
        Ok(self)
    }

    /// The condition on `dead_letters` (aliased `alias`), for a normalised filter; `status`
    /// applies when the filter names none.
    pub(crate) fn to_where(&self, alias: &str, default_status: Option<Status>) -> Where {
        let mut w = Where {
            sql: String::new(),
            params: Vec::new(),
        };
        let mut parts: Vec<String> = Vec::new();
        if !self.ids.is_empty() {
            let p = w.push(self.ids.clone());
            parts.push(format!("{alias}.id = ANY({p})"));
        }
        if let Some(v) = &self.topic {
            let p = w.push(v.clone());
            parts.push(format!("{alias}.original_topic = {p}"));
        }
        if let Some(v) = &self.group {
            let p = w.push(v.clone());
            parts.push(format!("{alias}.consumer_group = {p}"));
        }
        if let Some(v) = &self.error_contains {
            let p = w.push(v.to_lowercase());
            parts.push(format!(
                "strpos(lower(coalesce({alias}.error, '')), {p}) > 0"
            ));
        }
        if let Some(v) = &self.error_group {
            let p = w.push(v.clone());
            parts.push(format!("{alias}.error_group = {p}"));
        }
        if let Some(v) = &self.kind {
            let p = w.push(v.clone());
            parts.push(format!("{alias}.error_kind = {p}"));
        }
        if let Some(v) = &self.tenant {
            let p = w.push(v.clone());
            parts.push(format!("{alias}.tenant = {p}"));
        }
        if let Some(s) = self.status.or(default_status) {
            let p = w.push(s.as_str().to_owned());
            parts.push(format!("{alias}.status = {p}"));
        }
        for (v, op) in [(&self.since, ">="), (&self.until, "<")] {
            if let Some(t) = v
                .as_deref()
                .and_then(|s| humantime::parse_rfc3339_weak(s).ok())
            {
                let p = w.push(t);
                parts.push(format!("{alias}.failed_at {op} {p}"));
            }
        }
        w.sql = if parts.is_empty() {
            "true".into()
        } else {
            parts.join(" AND ")
        };
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times_become_absolute_and_bad_fields_are_named() {
        let f = Filter {
            since: Some("2h".into()),
            ..Filter::default()
        }
        .normalized()
        .unwrap();
        assert!(humantime::parse_rfc3339(f.since.as_deref().unwrap()).is_ok());
        let e = Filter {
            since: Some("yesterday-ish".into()),
            ..Filter::default()
        }
        .normalized()
        .unwrap_err();
        assert!(e.to_string().contains("--since"), "{e}");
        assert!(Filter {
            kind: Some("bogus".into()),
            ..Filter::default()
        }
        .normalized()
        .is_err());
        assert!(Filter {
            ids: vec![0],
            ..Filter::default()
        }
        .normalized()
        .is_err());
        assert!(!Filter {
            status: Some(Status::New),
            ..Filter::default()
        }
        .is_selective());
    }

    #[test]
    fn the_condition_numbers_its_parameters() {
        let f = Filter {
            ids: vec![3],
            topic: Some("a.b".into()),
            kind: Some("decode".into()),
            ..Filter::default()
        };
        let w = f.to_where("d", Some(Status::New));
        assert_eq!(
            w.sql,
            "d.id = ANY($1) AND d.original_topic = $2 AND d.error_kind = $3 AND d.status = $4"
        );
        assert_eq!(w.params.len(), 4);
    }
}
