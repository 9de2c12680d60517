//! What every handler try and every outcome uses, whatever the driver or the kind of
//! handler: the handler's span and timing, and the outcome counter.

use super::handler::Delivered;
use super::Shared;

/// Counts one outcome (`outbox_consumer_messages_total`), labelled by the original topic.
pub(super) fn count(shared: &Shared, topic: &str, outcome: &'static str, n: u64) {
    metrics::counter!(crate::metrics::CONSUMER_MESSAGES,
        "topic" => topic.to_owned(), "group" => shared.config.group.clone(), "outcome" => outcome)
    .increment(n);
    crate::otel::outcome(outcome);
}

/// Records a handler's duration (`outbox_consumer_handler_seconds`).
pub(super) fn handler_seconds(shared: &Shared, topic: &str, started: std::time::Instant) {
    metrics::histogram!(crate::metrics::CONSUMER_HANDLER_SECONDS,
        "topic" => topic.to_owned(), "group" => shared.config.group.clone())
    .record(started.elapsed().as_secs_f64());
}

/// The handler span: a `traceparent` header makes its trace the parent.
pub(super) fn handle_span(d: &Delivered, shared: &Shared) -> tracing::Span {
    let tp = d
        .headers
        .iter()
        .find(|(k, _)| k == crate::trace_context::TRACEPARENT)
        .and_then(|(_, v)| v.as_deref())
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(crate::trace_context::TraceParent::parse);
    tracing::info_span!(
        "outbox.handle",
        topic = %d.topic,
        partition = d.partition,
        offset = d.offset,
        group = %shared.config.group,
        message_type = %d.message_type,
        message_id = %d.message_id,
        trace_id = tp.as_ref().map(|t| t.trace_id.as_str()),
        parent_id = tp.as_ref().map(|t| t.parent_id.as_str()),
    )
}
