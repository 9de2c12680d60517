//! OpenTelemetry: the spans' shapes in process (an in-memory exporter installed as this test
//! binary's global provider, spans told apart by their random topics), and one event's whole
//! journey in a real tracing backend (Jaeger, `dev/jaeger.sh`) across the binaries a team runs:
//! `order_service`, `outbox relay`, `billing_consumer`, `outbox dlq archive` and `replay`.

mod jaeger;
mod shape;

use std::sync::OnceLock;

use opentelemetry::trace::{SpanContext, SpanId};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};

static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();

/// The in-memory exporter behind the global provider (installed on first use).
pub fn exporter() -> &'static InMemorySpanExporter {
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        opentelemetry::global::set_tracer_provider(provider);
        exporter
    })
}

/// Every finished span so far whose destination is `topic` or one of its retry/DLQ topics,
/// and every `commit` and `kafka transaction` span (no destination).
pub fn spans_of(topic: &str) -> Vec<SpanData> {
    let family = format!("{topic}.");
    exporter()
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|s| {
            attr(s, "messaging.destination.name")
                .is_some_and(|d| d == topic || d.starts_with(&family))
        })
        .collect()
}

/// A span attribute's value as text.
pub fn attr(s: &SpanData, key: &str) -> Option<String> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

/// A span context in the `traceparent` format.
pub fn tp(sc: &SpanContext) -> String {
    format!(
        "00-{:032x}-{:016x}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    )
}

/// Whether the span has no parent.
pub fn is_root(s: &SpanData) -> bool {
    s.parent_span_id == SpanId::INVALID
}
