//! Topic name rules (`[a-zA-Z0-9._-]`, at most 249 characters, never both `.` and `_`), checked before a name is used anywhere.

/// Kafka's own limit on topic name length.
pub const MAX_TOPIC_LEN: usize = 249;

/// A topic name that Kafka, or our naming rules, would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid topic name {name:?}: {reason}")]
pub struct InvalidTopic {
    /// The refused name, as given (possibly shortened for display).
    pub name: String,
    /// Which rule it broke.
    pub reason: &'static str,
}

/// Checks `name` against the topic naming rules.
///
/// Kafka accepts `[a-zA-Z0-9._-]`, at most 249 characters, and not `.` or `..`. This crate adds
/// that a name never mixes `.` and `_`: Kafka maps both to `_` in metric names, so `a.b` and
/// `a_b` would collide. Empty levels (`a..b`, leading or trailing `.`) are refused as typos.
///
/// # Errors
/// [`InvalidTopic`] naming the rule that failed.
pub fn validate_topic(name: &str) -> Result<(), InvalidTopic> {
    let err = |reason| {
        let shown: String = name.chars().take(80).collect();
        Err(InvalidTopic {
            name: shown,
            reason,
        })
    };
    if name.is_empty() {
        return err("it is empty");
    }
    if name.len() > MAX_TOPIC_LEN {
        return err("it is longer than 249 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return err("only ASCII letters, digits, '.', '_' and '-' are allowed");
    }
    if name.contains('.') && name.contains('_') {
        return err("it mixes '.' and '_', which collide in Kafka's metric names");
    }
    if name.split('.').any(str::is_empty) {
        return err("it has an empty level (leading, trailing or doubled '.')");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_seed_style_names() {
        for ok in [
            "orders.created",
            "billing.invoice-paid.v2",
            "orders_created",
            "a",
            "x-1",
        ] {
            validate_topic(ok).unwrap();
        }
    }

    #[test]
    fn refuses_bad_names() {
        for bad in [
            "",
            ".",
            "..",
            "orders..created",
            ".orders",
            "orders.",
            "orders.created_v2",
            "orders created",
            "orders/created",
            "заказы",
            "orders;DROP",
        ] {
            assert!(validate_topic(bad).is_err(), "{bad:?} accepted");
        }
        assert!(validate_topic(&"a".repeat(250)).is_err());
        validate_topic(&"a".repeat(249)).unwrap();
    }
}
