//! The Postgres schema that holds the outbox tables, validated once so it can be spliced into SQL.

use std::fmt;

/// Postgres limits identifiers to 63 bytes (NAMEDATALEN - 1).
const MAX_IDENTIFIER_LEN: usize = 63;

/// The default schema: the tables live next to the service's own tables.
pub const DEFAULT_SCHEMA: &str = "public";

/// A validated Postgres schema name.
///
/// Identifiers cannot be bound as query parameters, so the schema is spliced into SQL text. To
/// make that safe the name is restricted to `[a-z_][a-z0-9_]*`, at most 63 bytes, and not a
/// reserved `pg_` name; anything else is refused with [`InvalidSchema`] before any SQL runs.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Schema(String);

/// A schema name that cannot be used. The message says which rule it broke.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid schema name {}: {reason}", shown(.name))]
pub struct InvalidSchema {
    /// The refused name, as given.
    pub name: String,
    /// Which rule it broke.
    pub reason: &'static str,
}

/// A refused name as an error shows it: quoted with control characters escaped, and cut after
/// 64 characters (the rest could be anything, and any length).
pub(crate) fn shown(name: &str) -> String {
    let head: String = name.chars().take(64).collect();
    if head.len() < name.len() {
        format!("{head:?}… ({} bytes)", name.len())
    } else {
        format!("{head:?}")
    }
}

impl Schema {
    /// The schema used when none is named (`public`).
    pub const DEFAULT_NAME: &'static str = DEFAULT_SCHEMA;
}

impl Schema {
    /// Validates `name` as a schema name.
    ///
    /// # Errors
    /// [`InvalidSchema`] when the name is empty, too long, starts with `pg_` or a digit, or holds
    /// anything but lowercase ASCII letters, digits and `_`.
    pub fn new(name: impl Into<String>) -> Result<Self, InvalidSchema> {
        let name = name.into();
        let err = |reason| {
            Err(InvalidSchema {
                name: name.clone(),
                reason,
            })
        };
        if name.is_empty() {
            return err("it is empty");
        }
        if name.len() > MAX_IDENTIFIER_LEN {
            return err("it is longer than 63 bytes");
        }
        if name.starts_with("pg_") {
            return err("names starting with pg_ are reserved by Postgres");
        }
        if name.as_bytes()[0].is_ascii_digit() {
            return err("it starts with a digit");
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return err("only lowercase ASCII letters, digits and _ are allowed");
        }
        Ok(Self(name))
    }

    /// The bare name, e.g. `public`.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// The name quoted for SQL, e.g. `"public"`. Safe because of the validation in [`Schema::new`].
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }

    /// The LISTEN/NOTIFY channel the `outbox_notify` trigger signals for this schema.
    pub fn notify_channel(&self) -> String {
        format!("outbox:{}", self.0)
    }
}

/// The NOTIFY payload `outbox requeue` sends on [`Schema::notify_channel`]: rows below the
/// relays' claim floors are pending again, so their next claim starts from the head.
pub(crate) const REWIND_PAYLOAD: &str = "rewind";

impl Default for Schema {
    fn default() -> Self {
        Self(DEFAULT_SCHEMA.to_owned())
    }
}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Schema({})", self.0)
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Schema {
    type Err = InvalidSchema;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_names() {
        for ok in ["public", "orders", "svc_1", "_x"] {
            assert_eq!(Schema::new(ok).unwrap().name(), ok);
        }
    }

    #[test]
    fn refuses_sql_looking_and_odd_names() {
        for bad in [
            "",
            "Public",
            "a b",
            "x\"; DROP TABLE outbox; --",
            "pg_catalog",
            "1abc",
            "sch-ema",
            "é",
            &"a".repeat(64),
        ] {
            let e = Schema::new(bad).unwrap_err();
            assert!(e.to_string().contains("invalid schema name"), "{e}");
        }
    }
}
