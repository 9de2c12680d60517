//! W3C trace context: a `traceparent` header given at enqueue (with its `tracestate`, if any)
//! travels with the message to Kafka (both are ordinary headers), is kept on dead letters and
//! replays, and becomes the parent of
//! the consumer's `outbox.handle` span (fields `trace_id` and `parent_id`), so a tracing layer
//! (e.g. OpenTelemetry) can join the producer's and the consumer's traces.

/// The `traceparent` header name.
pub const TRACEPARENT: &str = "traceparent";
/// The `tracestate` header name: the vendors' entries of the `traceparent`'s context, carried
/// beside it wherever it goes (W3C trace context), e.g. a sampler's consistent-probability
/// threshold.
pub const TRACESTATE: &str = "tracestate";

/// A parsed `traceparent`: `00-<trace id: 32 hex>-<parent id: 16 hex>-<flags: 2 hex>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace id, 32 lowercase hex digits.
    pub trace_id: String,
    /// The parent span id, 16 lowercase hex digits.
    pub parent_id: String,
    /// Trace flags (bit 0: sampled).
    pub flags: u8,
}

impl TraceParent {
    /// Parses a header value; `None` for anything that is not a valid version-00 value
    /// (all-zero ids are invalid per the W3C spec).
    pub fn parse(v: &str) -> Option<Self> {
        let mut parts = v.trim().split('-');
        let (ver, trace, parent, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |s: &str, n: usize| {
            s.len() == n
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if ver != "00"
            || parts.next().is_some()
            || !hex(trace, 32)
            || !hex(parent, 16)
            || !hex(flags, 2)
        {
            return None;
        }
        if trace.bytes().all(|b| b == b'0') || parent.bytes().all(|b| b == b'0') {
            return None;
        }
        Some(Self {
            trace_id: trace.to_owned(),
            parent_id: parent.to_owned(),
            flags: u8::from_str_radix(flags, 16).ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::TraceParent;

    #[test]
    fn parses_valid_values_and_refuses_the_rest() {
        let t =
            TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(t.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id, "00f067aa0ba902b7");
        assert_eq!(t.flags, 1);
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-xyz-00f067aa0ba902b7-01",
        ] {
            assert!(TraceParent::parse(bad).is_none(), "{bad}");
        }
    }
}
