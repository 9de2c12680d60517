//! OpenTelemetry spans for one event's whole journey, named and attributed by the messaging
//! semantic conventions **v1.45.0** ([`SEMCONV_VERSION`], [`SCHEMA_URL`]), through the
//! OpenTelemetry API only (feature `otel`).
//!
//! The library never installs a tracer provider: it asks the global one (`opentelemetry::global`)
//! for a tracer each time, so with none installed every span here is a no-op and nothing is
//! parsed or allocated per row. A binary installs one with `outbox-otlp` (the `outbox` binary
//! does when `OTEL_EXPORTER_OTLP_ENDPOINT` is set); a service may install its own.
//!
//! | span | kind | where | parent, links |
//! |---|---|---|---|
//! | `create {topic}` | PRODUCER | `enqueue`, only when the message has no `traceparent` | the ambient context; its context becomes the message's `traceparent` |
//! | `send {topic}` | CLIENT | the relay, per batch and topic | the Kafka transaction's span (exactly-once) or none; one link per row to its creation context |
//! | `outbox wait {topic}` | INTERNAL | the relay, per published row | child of the creation context, from `created_at` to the broker's ack; links to the `send` span |
//! | `kafka transaction` | INTERNAL | the exactly-once relay, per transaction | `outbox.transaction.outcome` = commit / abort |
//! | `process {topic}` | CONSUMER | the consumer, per delivery (all in-place tries) | a link to the creation context (default) or it as parent ([`TraceParenting`]); a link to the previous delivery or replay (`x-outbox-trace-link`) |
//! | `send {topic}` | PRODUCER | a retry hop, parking or dead letter, under `process` | child of the `process` span |
//! | `commit` | CLIENT | the consumer's offset commit | none |
//! | `replay {topic}` | PRODUCER | a replay job, per letter | child of the creation context; a link to the delivery that dead-lettered it |
//!
//! Per-message values that vary within a batch go on the links, not the span (semconv).

use std::future::Future;
use std::time::SystemTime;

/// The messaging semantic conventions these spans follow.
pub const SEMCONV_VERSION: &str = "1.45.0";
/// The schema URL set on the instrumentation scope.
pub const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.45.0";
/// The instrumentation scope's name.
pub const SCOPE: &str = "outbox";
/// The header that carries the context a delivery links back to: the `process` span of the
/// delivery that sent a message to a retry topic, parked it or dead-lettered it, or the
/// `replay` span that brought it back. Its value has the `traceparent` format.
pub const X_TRACE_LINK: &str = "x-outbox-trace-link";

/// How a consumer's `process` span relates to the producer's context (the message's
/// `traceparent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceParenting {
    /// A new trace with a link to the producer's context: the conventions' default, and the
    /// only shape that stays consistent when a message is read again (retries, replays).
    #[default]
    Link,
    /// The producer's context is the parent: one trace holds the event's whole journey (create,
    /// wait, every delivery, its dead letter and its replay).
    Parent,
}

impl std::str::FromStr for TraceParenting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "link" => Ok(Self::Link),
            "parent" => Ok(Self::Parent),
            other => Err(format!(
                "unknown trace parenting {other:?}: expected link or parent"
            )),
        }
    }
}

/// The attribute names used, in one place (a golden file in the tests checks them).
pub(crate) mod attr {
    pub const SYSTEM: &str = "messaging.system.name";
    pub const OPERATION_NAME: &str = "messaging.operation.name";
    pub const OPERATION_TYPE: &str = "messaging.operation.type";
    pub const DESTINATION: &str = "messaging.destination.name";
    pub const PARTITION: &str = "messaging.destination.partition.id";
    pub const BATCH_COUNT: &str = "messaging.batch.message_count";
    pub const GROUP: &str = "messaging.consumer.group.name";
    pub const MESSAGE_ID: &str = "messaging.message.id";
    pub const KEY: &str = "kafka.message.key";
    pub const OFFSET: &str = "kafka.offset";
    pub const ERROR_TYPE: &str = "error.type";
    pub const OUTCOME: &str = "outbox.outcome";
    pub const FORWARD: &str = "outbox.forward";
    pub const RETRY_HOP: &str = "outbox.retry.hop";
    pub const DRAIN: &str = "outbox.drain";
    pub const TRANSACTIONAL: &str = "outbox.transactional";
    pub const TX_OUTCOME: &str = "outbox.transaction.outcome";
    pub const ROW_ID: &str = "outbox.row.id";
    pub const LINK_KIND: &str = "outbox.link";
}

/// A started span (or nothing, without the feature or a provider). Ends when dropped, unless
/// ended before.
#[derive(Default)]
pub(crate) struct Span {
    #[cfg(feature = "otel")]
    cx: Option<opentelemetry::Context>,
    /// Attributes whose last value counts (an outcome, an error type), written once at the
    /// end: the SDK keeps every value set for a key, not the last.
    #[cfg(feature = "otel")]
    last: std::sync::Mutex<Vec<(&'static str, String)>>,
}

impl std::fmt::Debug for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("otel::Span")
    }
}

/// The wall clock now (span times are wall-clock).
pub(crate) fn now() -> SystemTime {
    SystemTime::now()
}

#[cfg(feature = "otel")]
mod imp {
    use opentelemetry::trace::{
        Link, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId,
        TraceState, Tracer as _,
    };
    use opentelemetry::{global, Context, InstrumentationScope, KeyValue};

    use super::{attr, Span, SCHEMA_URL, SCOPE};

    /// The tracer of the installed provider, made once (not per span) and made again after
    /// [`super::refresh`].
    pub(super) static TRACER: std::sync::RwLock<Option<std::sync::Arc<global::BoxedTracer>>> =
        std::sync::RwLock::new(None);

    pub(super) fn tracer() -> std::sync::Arc<global::BoxedTracer> {
        if let Some(t) = TRACER.read().expect("tracer lock").as_ref() {
            return t.clone();
        }
        let t = std::sync::Arc::new(fresh_tracer());
        *TRACER.write().expect("tracer lock") = Some(t.clone());
        t
    }

    fn fresh_tracer() -> global::BoxedTracer {
        global::tracer_with_scope(
            InstrumentationScope::builder(SCOPE)
                .with_version(env!("CARGO_PKG_VERSION"))
                .with_schema_url(SCHEMA_URL)
                .build(),
        )
    }

    /// The most a `tracestate` may hold to be kept: W3C asks every vendor to carry at least
    /// 512 characters and at most 32 entries. Anyone who can write to a topic sets the header,
    /// and the state is copied onto every span of the message: a longer one is dropped.
    const MAX_STATE_BYTES: usize = 512;
    const MAX_STATE_ENTRIES: usize = 32;

    /// A `traceparent` value, with its `tracestate` (the vendors' entries) if any, as a remote
    /// span context. A `tracestate` that does not parse, or holds more than W3C's bounds, is
    /// dropped and the `traceparent` kept, as W3C trace context asks.
    pub(super) fn remote(tp: &str, ts: Option<&str>) -> Option<SpanContext> {
        let t = crate::trace_context::TraceParent::parse(tp)?;
        let state = ts
            .map(str::trim)
            .filter(|s| valid_state(s))
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        let sc = SpanContext::new(
            TraceId::from_hex(&t.trace_id).ok()?,
            SpanId::from_hex(&t.parent_id).ok()?,
            TraceFlags::new(t.flags),
            true,
            state,
        );
        sc.is_valid().then_some(sc)
    }

    /// Whether a `tracestate` keeps W3C's bounds and grammar: at most 32 `key=value` entries
    /// in 512 bytes, keys of `a-z 0-9 _ - * / @` starting with a letter or digit, values of
    /// printable ASCII without `,` or `=`. The SDK's own parser lets a NUL, an empty key or an
    /// upper-case one through.
    fn valid_state(s: &str) -> bool {
        let entry = |e: &str| {
            let Some((k, v)) = e.trim().split_once('=') else {
                return false;
            };
            let key = k
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                && k.len() <= 256
                && k.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-*/@".contains(&b));
            let value = !v.is_empty()
                && v.len() <= 256
                && !v.ends_with(' ')
                && v.bytes()
                    .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=');
            key && value
        };
        s.len() <= MAX_STATE_BYTES
            && s.split(',').count() <= MAX_STATE_ENTRIES
            && s.split(',').all(entry)
    }

    /// A link's context: a `traceparent`-format value, no vendor state.
    pub(super) fn linked(tp: &str) -> Option<SpanContext> {
        remote(tp, None)
    }

    /// A context's `tracestate` header value; `None` when it has no entries.
    pub(super) fn state(sc: &SpanContext) -> Option<String> {
        let h = sc.trace_state().header();
        (sc.is_valid() && !h.is_empty()).then_some(h)
    }

    pub(super) fn format(sc: &SpanContext) -> Option<String> {
        sc.is_valid().then(|| {
            format!(
                "00-{:032x}-{:016x}-{:02x}",
                sc.trace_id(),
                sc.span_id(),
                sc.trace_flags().to_u8() & 1
            )
        })
    }

    pub(super) fn base(op: &'static str, op_type: &'static str, topic: &str) -> Vec<KeyValue> {
        vec![
            KeyValue::new(attr::SYSTEM, "kafka"),
            KeyValue::new(attr::OPERATION_NAME, op),
            KeyValue::new(attr::OPERATION_TYPE, op_type),
            KeyValue::new(attr::DESTINATION, topic.to_owned()),
        ]
    }

    pub(super) struct Start<'a> {
        pub name: String,
        pub kind: SpanKind,
        pub attrs: Vec<KeyValue>,
        pub parent: Option<&'a Context>,
        pub links: Vec<Link>,
        pub start: Option<std::time::SystemTime>,
    }

    /// Whether a tracer provider (not the no-op one) is installed. The no-op tracer hands back
    /// its parent's context; a real one gives a child a span id of its own. The probe's parent
    /// is unsampled, so a parent-based sampler (the default) records nothing. Once true it
    /// stays true; false is asked again at most once a second (a provider installed later).
    pub(super) static ON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    pub(super) static ASKED_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    pub(super) fn installed() -> bool {
        use std::sync::atomic::Ordering;
        if ON.load(Ordering::Relaxed) {
            return true;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let asked = ASKED_MS.load(Ordering::Relaxed);
        if asked != 0 && now.saturating_sub(asked) < 1000 {
            return false;
        }
        ASKED_MS.store(now, Ordering::Relaxed);
        // A tracer cached while no provider was installed is the no-op one.
        *TRACER.write().expect("tracer lock") = None;
        let probe_id = SpanId::from_hex("00000000000000a1").expect("hex");
        let parent = SpanContext::new(
            TraceId::from_hex("000000000000000000000000000000a1").expect("hex"),
            probe_id,
            TraceFlags::default(),
            true,
            TraceState::default(),
        );
        let tracer = fresh_tracer();
        let span = tracer.build_with_context(
            tracer.span_builder("outbox.probe"),
            &Context::new().with_remote_span_context(parent),
        );
        let on = opentelemetry::trace::Span::span_context(&span).span_id() != probe_id;
        ON.store(on, Ordering::Relaxed);
        on
    }

    pub(super) fn start(s: Start<'_>) -> Span {
        if !installed() {
            return Span::default();
        }
        let tracer = tracer();
        let mut b = tracer
            .span_builder(s.name)
            .with_kind(s.kind)
            .with_attributes(s.attrs)
            .with_links(s.links);
        if let Some(t) = s.start {
            b = b.with_start_time(t);
        }
        let empty = Context::new();
        let parent = s.parent.unwrap_or(&empty);
        let span = tracer.build_with_context(b, parent);
        if !opentelemetry::trace::Span::span_context(&span).is_valid() {
            // No provider installed: nothing to record, nothing to end.
            return Span::default();
        }
        Span {
            cx: Some(parent.with_span(span)),
            last: std::sync::Mutex::default(),
        }
    }

    impl Span {
        /// Sets `key` to `value`, replacing an earlier value (written at the end).
        pub(super) fn set_last(&self, key: &'static str, value: String) {
            if self.cx.is_none() {
                return;
            }
            let mut last = self.last.lock().expect("span attributes");
            match last.iter_mut().find(|(k, _)| *k == key) {
                Some(kv) => kv.1 = value,
                None => last.push((key, value)),
            }
        }

        pub(super) fn fail(&self, error_type: &str, message: &str) {
            if let Some(cx) = &self.cx {
                self.set_last(attr::ERROR_TYPE, error_type.to_owned());
                cx.span().set_status(Status::error(message.to_owned()));
            }
        }

        pub(super) fn flush(&self, cx: &Context) {
            let last = std::mem::take(&mut *self.last.lock().expect("span attributes"));
            cx.span()
                .set_attributes(last.into_iter().map(|(k, v)| KeyValue::new(k, v)));
        }
    }

    pub(super) use opentelemetry::trace::SpanKind as Kind;
}

/// Tells the library that the global tracer provider was replaced (`outbox-otlp` calls it).
/// Without it a provider installed later is still found within a second, but a provider
/// removed (replaced by the no-op one) would go unnoticed.
pub fn refresh() {
    #[cfg(feature = "otel")]
    {
        use std::sync::atomic::Ordering;
        imp::ON.store(false, Ordering::Relaxed);
        imp::ASKED_MS.store(0, Ordering::Relaxed);
        *imp::TRACER.write().expect("tracer lock") = None;
    }
}

impl Span {
    /// Whether a provider is recording anything for this span (or could: a valid context).
    pub(crate) fn is_on(&self) -> bool {
        #[cfg(feature = "otel")]
        {
            self.cx.is_some()
        }
        #[cfg(not(feature = "otel"))]
        false
    }

    /// The span's context in the `traceparent` format.
    pub(crate) fn traceparent(&self) -> Option<String> {
        #[cfg(feature = "otel")]
        {
            use opentelemetry::trace::TraceContextExt as _;
            self.cx
                .as_ref()
                .and_then(|cx| imp::format(cx.span().span_context()))
        }
        #[cfg(not(feature = "otel"))]
        None
    }

    /// The span's `tracestate` (the vendors' entries it carries), if it has any.
    pub(crate) fn tracestate(&self) -> Option<String> {
        #[cfg(feature = "otel")]
        {
            use opentelemetry::trace::TraceContextExt as _;
            self.cx
                .as_ref()
                .and_then(|cx| imp::state(cx.span().span_context()))
        }
        #[cfg(not(feature = "otel"))]
        None
    }

    /// Sets a string attribute.
    pub(crate) fn set_str(&self, key: &'static str, value: impl Into<String>) {
        #[cfg(feature = "otel")]
        self.set_last(key, value.into());
        #[cfg(not(feature = "otel"))]
        let _ = (key, value);
    }

    /// Marks the span failed: `error.type` (low cardinality) and an error status.
    pub(crate) fn failed(&self, error_type: &str, message: &str) {
        #[cfg(feature = "otel")]
        self.fail(error_type, message);
        #[cfg(not(feature = "otel"))]
        let _ = (error_type, message);
    }

    /// Adds a timestamped event.
    pub(crate) fn event(&self, name: &'static str, attrs: &[(&'static str, String)]) {
        #[cfg(feature = "otel")]
        if let Some(cx) = &self.cx {
            use opentelemetry::trace::TraceContextExt as _;
            cx.span().add_event(
                name,
                attrs
                    .iter()
                    .map(|(k, v)| opentelemetry::KeyValue::new(*k, v.clone()))
                    .collect(),
            );
        }
        #[cfg(not(feature = "otel"))]
        let _ = (name, attrs);
    }

    /// Ends the span now.
    pub(crate) fn end(mut self) {
        self.end_at(None);
    }

    fn end_at(&mut self, at: Option<SystemTime>) {
        #[cfg(feature = "otel")]
        if let Some(cx) = self.cx.take() {
            use opentelemetry::trace::TraceContextExt as _;
            self.flush(&cx);
            match at {
                Some(t) => cx.span().end_with_timestamp(t),
                None => cx.span().end(),
            }
        }
        #[cfg(not(feature = "otel"))]
        let _ = at;
    }

    /// Runs `fut` with this span as the current context (so the spans a handler opens, through
    /// the OpenTelemetry API or a tracing bridge that falls back to the current context, nest
    /// under it).
    pub(crate) async fn around<F: Future>(&self, fut: F) -> F::Output {
        #[cfg(feature = "otel")]
        if let Some(cx) = &self.cx {
            use opentelemetry::context::FutureExt as _;
            return fut.with_context(cx.clone()).await;
        }
        fut.await
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        self.end_at(None);
    }
}

/// Whether spans are recorded at all (the feature is on and a provider is installed): callers
/// skip gathering what a span would need otherwise.
pub(crate) fn enabled() -> bool {
    #[cfg(feature = "otel")]
    {
        imp::installed()
    }
    #[cfg(not(feature = "otel"))]
    false
}

/// `create {topic}` at enqueue: the new message's `traceparent` (its context) and
/// `tracestate` (the vendors' entries it inherited, if any), or `None` without a provider and
/// without an ambient context. Called only when the caller gave no `traceparent`.
pub(crate) fn create(
    topic: &str,
    message_id: &dyn std::fmt::Display,
) -> Option<(String, Option<String>)> {
    #[cfg(feature = "otel")]
    {
        let parent = opentelemetry::Context::current();
        if !imp::installed() {
            // No provider, but perhaps an ambient context (a caller's own propagation): carry it.
            use opentelemetry::trace::TraceContextExt as _;
            let sc = parent.span().span_context().clone();
            return imp::format(&sc).map(|tp| (tp, imp::state(&sc)));
        }
        let mut attrs = imp::base("create", "create", topic);
        attrs.push(opentelemetry::KeyValue::new(
            attr::MESSAGE_ID,
            message_id.to_string(),
        ));
        let span = imp::start(imp::Start {
            name: format!("create {topic}"),
            kind: imp::Kind::Producer,
            attrs,
            parent: Some(&parent),
            links: Vec::new(),
            start: None,
        });
        let tp = span.traceparent().map(|tp| (tp, span.tracestate()));
        span.end();
        tp
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = (topic, message_id);
        None
    }
}

/// The `traceparent` value in a headers JSON text as Postgres prints `jsonb`
/// (`{"k": "v", ...}`), found without parsing the whole object.
pub(crate) fn traceparent_in_json(headers: &str) -> Option<&str> {
    header_in_json(headers, "\"traceparent\"")
}

/// The `tracestate` value in a headers JSON text, as [`traceparent_in_json`] finds it.
pub(crate) fn tracestate_in_json(headers: &str) -> Option<&str> {
    header_in_json(headers, "\"tracestate\"")
}

/// The string value of `quoted_name` (the key with its quotes) in a headers JSON text. Only a
/// key counts: the text is preceded by `{` or `,` and followed by `:` (another header's
/// value, or a key ending in an escaped quote and the name, is passed over). A value holding
/// an escaped quote ends there: neither header may contain a quote.
fn header_in_json<'a>(headers: &'a str, quoted_name: &str) -> Option<&'a str> {
    headers.match_indices(quoted_name).find_map(|(at, _)| {
        let before = headers[..at].trim_end();
        if !(before.ends_with('{') || before.ends_with(',')) {
            return None;
        }
        let rest = headers[at + quoted_name.len()..]
            .trim_start()
            .strip_prefix(':')?
            .trim_start();
        let rest = rest.strip_prefix('"')?;
        let end = rest.find('"')?;
        Some(&rest[..end])
    })
}

/// When a row's wait began: its `created_at` (Unix seconds), never after `ended`. A row
/// written by hand may say anything: before 1970, `infinity` or NaN start the wait at `ended`'s
/// epoch floor or at `ended`, never a panic.
pub(crate) fn wait_start(created: f64, ended: SystemTime) -> SystemTime {
    if created.is_nan() {
        return ended;
    }
    std::time::Duration::try_from_secs_f64(created.max(0.0))
        .ok()
        .and_then(|d| std::time::UNIX_EPOCH.checked_add(d))
        .map_or(ended, |t| t.min(ended))
}

/// One row of a relay batch, as the send spans see it.
pub(crate) struct SentRow<'a> {
    pub topic: &'a str,
    pub id: i64,
    /// The row's headers (JSON text), searched for its `traceparent` only when tracing is on.
    pub headers: &'a str,
    /// `created_at`, Unix seconds.
    pub created: f64,
    /// `None` when published; the failure's class otherwise.
    pub error: Option<&'static str>,
}

/// The relay's spans for one produced batch: `send {topic}` per topic (CLIENT, one link per
/// row, `messaging.batch.message_count`, `error.type` when a row failed), and for each
/// published row with a creation context `outbox wait {topic}` from its `created_at` to now
/// (the acks are in). `parent` is the Kafka transaction's span in exactly-once mode.
pub(crate) fn sent_batch(
    started: SystemTime,
    rows: &[SentRow<'_>],
    parent: Option<&Span>,
    transactional: bool,
) {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::{Link, TraceContextExt as _};
        use opentelemetry::KeyValue;
        if rows.is_empty() {
            return;
        }
        let ended = SystemTime::now();
        let mut topics: Vec<&str> = rows.iter().map(|r| r.topic).collect();
        topics.sort_unstable();
        topics.dedup();
        let parent_cx = parent.and_then(|p| p.cx.as_ref());
        for topic in topics {
            let of_topic = || rows.iter().filter(move |r| r.topic == topic);
            let n = of_topic().count();
            let mut attrs = imp::base("send", "send", topic);
            attrs.push(KeyValue::new(attr::BATCH_COUNT, n as i64));
            if transactional {
                attrs.push(KeyValue::new(attr::TRANSACTIONAL, true));
            }
            let send = imp::start(imp::Start {
                name: format!("send {topic}"),
                kind: imp::Kind::Client,
                attrs,
                parent: parent_cx,
                links: Vec::new(),
                start: Some(started),
            });
            let Some(send_cx) = send.cx.clone() else {
                // No provider: nothing more to do for any topic.
                return;
            };
            let send_sc = send_cx.span().span_context().clone();
            let mut failed: Option<&'static str> = None;
            // Per row, built once per batch and topic: the tracer, the name, the topic.
            let tracer = imp::tracer();
            let wait_name = format!("outbox wait {topic}");
            let dest = opentelemetry::Value::String(std::sync::Arc::<str>::from(topic).into());
            for r in of_topic() {
                if r.error.is_some() {
                    failed = failed.or(r.error);
                }
                let Some(sc) = traceparent_in_json(r.headers)
                    .and_then(|tp| imp::remote(tp, tracestate_in_json(r.headers)))
                else {
                    continue;
                };
                // The event's own sampling decision, taken where it was created: an unsampled
                // event's trace is not recorded, so neither its link nor its wait is.
                if !sc.is_sampled() {
                    continue;
                }
                send_cx
                    .span()
                    .add_link(sc.clone(), vec![KeyValue::new(attr::ROW_ID, r.id)]);
                if r.error.is_some() {
                    continue;
                }
                let created = wait_start(r.created, ended);
                let parent = opentelemetry::Context::new().with_remote_span_context(sc);
                use opentelemetry::trace::{Span as _, Tracer as _};
                let builder = tracer
                    .span_builder(wait_name.clone())
                    .with_kind(imp::Kind::Internal)
                    // Not a messaging operation (INTERNAL): where it waited to go, and which
                    // row; one span per event, so kept small.
                    .with_attributes([
                        KeyValue::new(attr::DESTINATION, dest.clone()),
                        KeyValue::new(attr::ROW_ID, r.id),
                    ])
                    .with_links(vec![Link::with_context(send_sc.clone())])
                    .with_start_time(created);
                tracer
                    .build_with_context(builder, &parent)
                    .end_with_timestamp(ended);
            }
            if let Some(e) = failed {
                send.failed(e, "a row of the batch was not published");
            }
            let mut send = send;
            send.end_at(Some(ended));
        }
    }
    #[cfg(not(feature = "otel"))]
    let _ = (started, rows, parent, transactional);
}

/// The exactly-once relay's `kafka transaction` span (ended by the caller with the outcome).
pub(crate) fn transaction(slot: i32) -> Span {
    #[cfg(feature = "otel")]
    {
        imp::start(imp::Start {
            name: "kafka transaction".to_owned(),
            kind: imp::Kind::Internal,
            attrs: vec![
                opentelemetry::KeyValue::new(attr::SYSTEM, "kafka"),
                opentelemetry::KeyValue::new(attr::PARTITION, slot.to_string()),
                opentelemetry::KeyValue::new(attr::TRANSACTIONAL, true),
            ],
            parent: None,
            links: Vec::new(),
            start: None,
        })
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = slot;
        Span::default()
    }
}

/// What a consumer's `process` span is opened with.
pub(crate) struct Delivery<'a> {
    pub topic: &'a str,
    pub group: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub message_id: &'a str,
    pub key: Option<&'a str>,
    /// The message's `traceparent` (its creation context).
    pub traceparent: Option<&'a str>,
    /// The message's `tracestate` (the vendors' entries of that context).
    pub tracestate: Option<&'a str>,
    /// The message's `x-outbox-trace-link` (the delivery or replay it came from).
    pub link: Option<&'a str>,
    pub hop: u32,
    pub drain: bool,
    pub parenting: TraceParenting,
}

/// Opens the consumer's `process {topic}` span for one delivery.
pub(crate) fn process(d: &Delivery<'_>) -> Span {
    #[cfg(feature = "otel")]
    {
        if !imp::installed() {
            return Span::default();
        }
        use opentelemetry::trace::{Link, TraceContextExt as _};
        use opentelemetry::KeyValue;
        let mut attrs = imp::base("process", "process", d.topic);
        attrs.extend([
            KeyValue::new(attr::GROUP, d.group.to_owned()),
            KeyValue::new(attr::PARTITION, d.partition.to_string()),
            KeyValue::new(attr::OFFSET, d.offset),
            KeyValue::new(attr::MESSAGE_ID, d.message_id.to_owned()),
        ]);
        if let Some(k) = d.key {
            attrs.push(KeyValue::new(attr::KEY, k.to_owned()));
        }
        if d.hop > 0 {
            attrs.push(KeyValue::new(attr::RETRY_HOP, i64::from(d.hop)));
        }
        if d.drain {
            attrs.push(KeyValue::new(attr::DRAIN, true));
        }
        let created = d.traceparent.and_then(|tp| imp::remote(tp, d.tracestate));
        let mut links = Vec::new();
        let ambient = opentelemetry::Context::current();
        let parent = match (d.parenting, created) {
            (TraceParenting::Parent, Some(sc)) => {
                if ambient.has_active_span() {
                    links.push(Link::with_context(ambient.span().span_context().clone()));
                }
                opentelemetry::Context::new().with_remote_span_context(sc)
            }
            (_, sc) => {
                if let Some(sc) = sc {
                    links.push(Link::new(
                        sc,
                        vec![KeyValue::new(attr::LINK_KIND, "producer")],
                        0,
                    ));
                }
                ambient
            }
        };
        if let Some(sc) = d.link.and_then(imp::linked) {
            links.push(Link::new(
                sc,
                vec![KeyValue::new(attr::LINK_KIND, "previous")],
                0,
            ));
        }
        imp::start(imp::Start {
            name: format!("process {}", d.topic),
            kind: imp::Kind::Consumer,
            attrs,
            parent: Some(&parent),
            links,
            start: None,
        })
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = d;
        Span::default()
    }
}

/// A consumer's batch handler call: one `process {topic}` span with
/// `messaging.batch.message_count` and one link per message's creation context (each
/// message's `traceparent` and `tracestate`).
pub(crate) fn process_batch(
    topic: &str,
    group: &str,
    traceparents: &[(Option<&str>, Option<&str>)],
) -> Span {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::Link;
        use opentelemetry::KeyValue;
        let mut attrs = imp::base("process", "process", topic);
        attrs.push(KeyValue::new(attr::GROUP, group.to_owned()));
        attrs.push(KeyValue::new(attr::BATCH_COUNT, traceparents.len() as i64));
        let links = traceparents
            .iter()
            .filter_map(|(tp, ts)| tp.and_then(|tp| imp::remote(tp, *ts)))
            .map(Link::with_context)
            .collect();
        let ambient = opentelemetry::Context::current();
        imp::start(imp::Start {
            name: format!("process {topic}"),
            kind: imp::Kind::Consumer,
            attrs,
            parent: Some(&ambient),
            links,
            start: None,
        })
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = (topic, group, traceparents);
        Span::default()
    }
}

/// A child `send {topic}` PRODUCER span of `parent` (`why`: `retry`, `park` or `dead_letter`).
pub(crate) fn forward(parent: &Span, topic: &str, why: &'static str) -> Span {
    #[cfg(feature = "otel")]
    {
        let Some(cx) = parent.cx.as_ref() else {
            return Span::default();
        };
        let mut attrs = imp::base("send", "send", topic);
        attrs.push(opentelemetry::KeyValue::new(attr::FORWARD, why));
        imp::start(imp::Start {
            name: format!("send {topic}"),
            kind: imp::Kind::Producer,
            attrs,
            parent: Some(cx),
            links: Vec::new(),
            start: None,
        })
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = (parent, topic, why);
        Span::default()
    }
}

/// The consumer's offset `commit` span.
pub(crate) fn commit(group: &str, partitions: usize) -> Span {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::KeyValue;
        imp::start(imp::Start {
            name: "commit".to_owned(),
            kind: imp::Kind::Client,
            attrs: vec![
                KeyValue::new(attr::SYSTEM, "kafka"),
                KeyValue::new(attr::OPERATION_NAME, "commit"),
                KeyValue::new(attr::OPERATION_TYPE, "settle"),
                KeyValue::new(attr::GROUP, group.to_owned()),
                KeyValue::new(attr::BATCH_COUNT, partitions as i64),
            ],
            parent: None,
            links: Vec::new(),
            start: None,
        })
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = (group, partitions);
        Span::default()
    }
}

/// A replay job's `replay {topic}` span for one letter: a child of its creation context, with a
/// link to the delivery that dead-lettered it.
pub(crate) fn replay(
    topic: &str,
    message_id: &str,
    (traceparent, tracestate): (Option<&str>, Option<&str>),
    link: Option<&str>,
) -> Span {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::{Link, TraceContextExt as _};
        use opentelemetry::KeyValue;
        let mut attrs = imp::base("replay", "send", topic);
        attrs.push(KeyValue::new(attr::MESSAGE_ID, message_id.to_owned()));
        let parent = match traceparent.and_then(|tp| imp::remote(tp, tracestate)) {
            Some(sc) => opentelemetry::Context::new().with_remote_span_context(sc),
            None => opentelemetry::Context::new(),
        };
        let links = link
            .and_then(imp::linked)
            .map(|sc| {
                vec![Link::new(
                    sc,
                    vec![KeyValue::new(attr::LINK_KIND, "dead_lettered")],
                    0,
                )]
            })
            .unwrap_or_default();
        imp::start(imp::Start {
            name: format!("replay {topic}"),
            kind: imp::Kind::Producer,
            attrs,
            parent: Some(&parent),
            links,
            start: None,
        })
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = (topic, message_id, traceparent, tracestate, link);
        Span::default()
    }
}

tokio::task_local! {
    /// The delivery spans of a commit group's members, by position.
    static GROUP: std::sync::Arc<Vec<Span>>;
}

/// Runs a commit group's transaction with its members' delivery spans.
pub(crate) async fn in_group<F: Future>(spans: std::sync::Arc<Vec<Span>>, fut: F) -> F::Output {
    GROUP.scope(spans, fut).await
}

/// Runs member `i`'s handler of the current commit group with its delivery span current.
pub(crate) async fn as_member<F: Future>(i: usize, fut: F) -> F::Output {
    #[cfg(feature = "otel")]
    {
        let cx = GROUP
            .try_with(|g| g.get(i).and_then(|s| s.cx.clone()))
            .ok()
            .flatten();
        if let Some(cx) = cx {
            use opentelemetry::context::FutureExt as _;
            return fut.with_context(cx).await;
        }
    }
    #[cfg(not(feature = "otel"))]
    let _ = i;
    fut.await
}

tokio::task_local! {
    /// The delivery being processed on this task: its outcome is recorded on it, and what it
    /// forwards links back to it.
    static CURRENT: std::sync::Arc<Span>;
}

/// Runs `fut` (one delivery's processing) with `span` as the current delivery.
pub(crate) async fn in_delivery<F: Future>(span: Span, fut: F) -> F::Output {
    let span = std::sync::Arc::new(span);
    let inner = span.clone();
    CURRENT
        .scope(span, async move { inner.around(fut).await })
        .await
}

/// Records an outcome of the current delivery (`handled`, `duplicate`, `retried`,
/// `dead_lettered`, ...): the last one is the span's `outbox.outcome`; in-place retries are
/// events.
pub(crate) fn outcome(what: &'static str) {
    let _ = CURRENT.try_with(|s| {
        if !s.is_on() {
            return;
        }
        if what == "retried" {
            s.event("outbox.retry", &[]);
        }
        s.set_str(attr::OUTCOME, what);
    });
}

/// Marks the current delivery failed with `error_type` (a dead letter's kind, a park).
pub(crate) fn delivery_failed(error_type: &str, message: &str) {
    let _ = CURRENT.try_with(|s| s.failed(error_type, message));
}

/// Runs `f` with the current delivery's span, if any.
pub(crate) fn with_delivery<T>(f: impl FnOnce(&Span) -> T) -> Option<T> {
    CURRENT.try_with(|s| f(s)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_traceparent_in_postgres_json_text() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            traceparent_in_json(&format!(r#"{{"a": "b", "traceparent": "{tp}", "z": "y"}}"#)),
            Some(tp)
        );
        assert_eq!(
            traceparent_in_json(&format!(r#"{{"traceparent":"{tp}"}}"#)),
            Some(tp)
        );
        assert_eq!(traceparent_in_json(r#"{"a": "traceparent"}"#), None);
        assert_eq!(traceparent_in_json(r#"{"traceparent": 5}"#), None);
        assert_eq!(traceparent_in_json("{}"), None);
        // Postgres prints shorter keys first: a header whose value is the name comes before
        // the real one and must not hide it.
        assert_eq!(
            traceparent_in_json(&format!(
                r#"{{"kind": "traceparent", "traceparent": "{tp}"}}"#
            )),
            Some(tp)
        );
        assert_eq!(
            tracestate_in_json(r#"{"kind": "tracestate", "tracestate": "k=v"}"#),
            Some("k=v")
        );
        // A key that only ends in the name (after an escaped quote) is another header.
        assert_eq!(tracestate_in_json(r#"{"x\"tracestate": "k=v"}"#), None);
        assert_eq!(
            tracestate_in_json(r#"{"tracestatex": "k=v", "xtracestate": "a=b"}"#),
            None
        );
    }

    #[test]
    fn a_hand_written_created_at_never_panics_the_wait_span() {
        let ended = SystemTime::now();
        for odd in [f64::INFINITY, f64::NAN, 1e300] {
            assert_eq!(wait_start(odd, ended), ended, "{odd}");
        }
        // Before 1970 (or -infinity): the epoch.
        for early in [-86_400.0, f64::NEG_INFINITY] {
            assert_eq!(wait_start(early, ended), std::time::UNIX_EPOCH, "{early}");
        }
        // In the future (a skewed clock): no later than the ack.
        assert_eq!(wait_start(4e9, ended), ended);
        let t = wait_start(1_000.5, ended);
        assert_eq!(
            t,
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_000_500)
        );
    }

    #[test]
    fn hostile_trace_headers_are_ignored_not_trusted() {
        let huge = format!(r#"{{"traceparent": "{}"}}"#, "0".repeat(1 << 20));
        let tp = traceparent_in_json(&huge).unwrap();
        assert!(crate::trace_context::TraceParent::parse(tp).is_none());
        for bad in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\\u0000",
            "00-4bf92f3577b34da6a3ce929d0e0e4736\\u0000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            let json = format!(r#"{{"traceparent": "{bad}"}}"#);
            let found = traceparent_in_json(&json).unwrap();
            assert!(
                crate::trace_context::TraceParent::parse(found).is_none(),
                "{bad}"
            );
        }
        // A quote inside a value never ends the search early into another key's value.
        assert_eq!(
            traceparent_in_json(r#"{"x": "\"traceparent\": \"00-a\""}"#),
            None
        );
    }

    #[cfg(feature = "otel")]
    #[test]
    fn a_hostile_tracestate_is_dropped_and_its_traceparent_kept() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let state = |ts: &str| imp::remote(tp, Some(ts)).unwrap().trace_state().header();
        assert_eq!(state("vendor=a1,other=b2"), "vendor=a1,other=b2");
        let entries = |n: usize| {
            (0..n)
                .map(|i| format!("k{i}=v"))
                .collect::<Vec<_>>()
                .join(",")
        };
        assert_eq!(state(&entries(32)), entries(32), "W3C's 32 entries kept");
        for (why, bad) in [
            ("huge", format!("vendor={}", "a".repeat(1 << 20))),
            ("33 entries", entries(33)),
            ("just over 512 bytes", format!("v={}", "a".repeat(511))),
            ("NUL", "vendor=a\u{0}b".to_owned()),
            ("no key", "=v".to_owned()),
            ("no value", "vendor".to_owned()),
            ("upper case key", "Vendor=a".to_owned()),
            ("not ASCII", "vendor=é".to_owned()),
        ] {
            assert_eq!(state(&bad), "", "{why}");
        }
        // Without a valid traceparent, no context at all, whatever the state.
        assert!(imp::remote("00-0-0-01", Some("vendor=a")).is_none());
    }

    #[test]
    fn parenting_parses_and_refuses() {
        assert_eq!("link".parse::<TraceParenting>(), Ok(TraceParenting::Link));
        assert_eq!(
            "parent".parse::<TraceParenting>(),
            Ok(TraceParenting::Parent)
        );
        assert!("Parent\0"
            .parse::<TraceParenting>()
            .unwrap_err()
            .contains("link or parent"));
    }
}
