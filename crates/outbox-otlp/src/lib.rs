//! OTLP export of outbox's OpenTelemetry spans, turned on by the standard variables: the one
//! call a binary (or a service that embeds `outbox` with its `otel` feature) makes at start.
//!
//! ```no_run
//! # fn main() -> Result<(), outbox_otlp::Error> {
//! // Keep the guard for the life of the process; dropping it (or `shutdown`) flushes.
//! let otel = outbox_otlp::init("billing-service")?;
//! // ... run the consumer or the relay ...
//! otel.shutdown();
//! # Ok(()) }
//! ```
//!
//! Export is on when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is
//! set, or `OTEL_TRACES_EXPORTER=otlp`; off when `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none`. Read as the specification says: `OTEL_SERVICE_NAME` and
//! `OTEL_RESOURCE_ATTRIBUTES` (the name given to [`init`] only when neither names the
//! service), `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_BSP_*` (unset, the queue holds [`DEFAULT_QUEUE`] spans
//! and exports [`DEFAULT_BATCH`] at a time: a relay makes a span per event). The protocol is `http/protobuf` (port 4318);
//! `OTEL_EXPORTER_OTLP_PROTOCOL=grpc` is refused with an error naming it.
//!
//! Spans leave from a background thread in batches: a slow or unreachable collector never
//! blocks the relay or a handler (a full queue drops spans, never events) and costs one
//! warning a minute, not one per batch.

#![warn(missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, SpanData, SpanExporter,
    SpanProcessor,
};

/// Why export could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A variable names something this build does not support.
    #[error("{0}")]
    Unsupported(String),
    /// The exporter could not be built (e.g. an invalid endpoint).
    #[error("OTLP exporter: {0}")]
    Exporter(String),
}

/// Keeps export running; flushes and stops it on [`Guard::shutdown`] or drop.
#[must_use = "dropping the guard stops export"]
#[derive(Debug)]
pub struct Guard {
    provider: Option<SdkTracerProvider>,
    counts: Arc<Counts>,
}

/// Spans recorded and spans the collector accepted, since [`init`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpanCounts {
    /// Sampled spans that ended (handed to the export queue).
    pub ended: u64,
    /// Spans in batches the collector acknowledged.
    pub exported: u64,
}

impl SpanCounts {
    /// Spans that never reached the collector: dropped from a full queue or in a failed
    /// export. Spans are dropped, never waited for; events are never affected.
    pub fn dropped(&self) -> u64 {
        self.ended.saturating_sub(self.exported)
    }
}

#[derive(Debug, Default)]
struct Counts {
    ended: AtomicU64,
    exported: AtomicU64,
}

impl Guard {
    /// Whether spans are exported.
    pub fn is_exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// What was recorded and exported so far.
    pub fn counts(&self) -> SpanCounts {
        SpanCounts {
            ended: self.counts.ended.load(Ordering::Relaxed),
            exported: self.counts.exported.load(Ordering::Relaxed),
        }
    }

    /// Flushes what is queued (bounded by the exporter's timeout), stops export, and says how
    /// many spans were recorded and exported (a warning names the dropped ones).
    pub fn shutdown(mut self) -> SpanCounts {
        self.stop();
        self.counts()
    }

    fn stop(&mut self) {
        if let Some(p) = self.provider.take() {
            // The batch processor's thread does the last export; a blocking call, off any
            // async worker's hands.
            let _ = std::thread::spawn(move || {
                let _ = p.force_flush();
                let _ = p.shutdown();
            })
            .join();
            let c = self.counts();
            if c.dropped() > 0 {
                tracing::warn!(
                    ended = c.ended,
                    exported = c.exported,
                    dropped = c.dropped(),
                    "some spans never reached the collector (a full export queue drops spans rather than wait; OTEL_BSP_MAX_QUEUE_SIZE raises it)"
                );
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.stop();
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Whether the variables turn export on (see the crate docs).
pub fn enabled() -> bool {
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return false;
    }
    match var("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
        Some("none") => return false,
        Some("otlp") => return true,
        _ => {}
    }
    var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
        || var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
}

/// Installs the global tracer provider exporting over OTLP/HTTP when the variables turn it on
/// (a guard that exports nothing otherwise). `service` names the process when neither
/// `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` does.
///
/// # Errors
/// [`Error::Unsupported`] for a protocol other than `http/protobuf` or an unknown
/// `OTEL_TRACES_EXPORTER`; [`Error::Exporter`] when the exporter cannot be built.
pub fn init(service: &str) -> Result<Guard, Error> {
    if !enabled() {
        return Ok(Guard {
            provider: None,
            counts: Arc::default(),
        });
    }
    if let Some(e) = var("OTEL_TRACES_EXPORTER") {
        if !e.split(',').all(|x| x.trim() == "otlp") {
            return Err(Error::Unsupported(format!(
                "OTEL_TRACES_EXPORTER={e:?} is not supported: use otlp or none"
            )));
        }
    }
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(p) = var(name) {
            if p.trim() != "http/protobuf" {
                return Err(Error::Unsupported(format!(
                    "{name}={p:?} is not supported: this build exports http/protobuf (port 4318)"
                )));
            }
            break;
        }
    }
    // The blocking HTTP client must not be built (or dropped) on an async worker.
    let exporter = std::thread::spawn(|| {
        opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
            .map_err(|e| Error::Exporter(redact(&e.to_string())))
    })
    .join()
    .map_err(|_| Error::Exporter("building the exporter panicked".into()))??;
    let named = var("OTEL_SERVICE_NAME").is_some()
        || var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| {
            a.split(',')
                .any(|kv| kv.split('=').next().map(str::trim) == Some("service.name"))
        });
    let mut resource = opentelemetry_sdk::Resource::builder();
    if !named {
        resource = resource.with_service_name(service.to_owned());
    }
    let counts = Arc::new(Counts::default());
    // A relay makes a span per event: larger batches and a deeper queue than the SDK's
    // defaults (512 of 2,048) keep a 200,000-event drain at 100 % sampling from dropping spans
    // (it dropped 9 % with the defaults, at the same throughput). The variables still decide.
    let mut config = BatchConfigBuilder::default();
    if var("OTEL_BSP_MAX_QUEUE_SIZE").is_none() {
        config = config.with_max_queue_size(DEFAULT_QUEUE);
    }
    if var("OTEL_BSP_MAX_EXPORT_BATCH_SIZE").is_none() {
        config = config.with_max_export_batch_size(DEFAULT_BATCH);
    }
    let batches = BatchSpanProcessor::builder(Warned::new(exporter, counts.clone()))
        .with_batch_config(config.build())
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(Counting {
            inner: batches,
            counts: counts.clone(),
        })
        .with_resource(resource.build())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    outbox::otel::refresh();
    tracing::info!(
        service,
        semconv = outbox::otel::SEMCONV_VERSION,
        "exporting OpenTelemetry spans over OTLP/HTTP"
    );
    Ok(Guard {
        provider: Some(provider),
        counts,
    })
}

/// What the OTLP variables hold that must never reach a log line: the password of an
/// endpoint's userinfo, and the values of `OTEL_EXPORTER_OTLP_HEADERS` (API keys).
fn secrets() -> Vec<String> {
    let mut out = Vec::new();
    for name in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ] {
        if let Some(url) = var(name) {
            let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
            let authority = rest.split('/').next().unwrap_or_default();
            if let Some((userinfo, _)) = authority.rsplit_once('@') {
                out.push(userinfo.to_owned());
                out.extend(userinfo.split_once(':').map(|(_, pw)| pw.to_owned()));
            }
        }
    }
    for name in [
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    ] {
        for pair in var(name).unwrap_or_default().split(',') {
            if let Some((_, v)) = pair.split_once('=') {
                out.push(v.trim().to_owned());
            }
        }
    }
    out.retain(|s| !s.is_empty());
    // Longest first: a secret that contains another is replaced whole.
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out
}

/// `text` with every secret of the OTLP variables replaced by `***`.
fn redact(text: &str) -> String {
    secrets()
        .iter()
        .fold(text.to_owned(), |t, s| t.replace(s.as_str(), "***"))
}

/// The export queue's size unless `OTEL_BSP_MAX_QUEUE_SIZE` says otherwise (spans).
pub const DEFAULT_QUEUE: usize = 16_384;
/// Spans per export unless `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` says otherwise.
pub const DEFAULT_BATCH: usize = 2_048;

/// How long a failing collector stays quiet in the log after a warning.
pub const WARN_EVERY: Duration = Duration::from_secs(60);

/// An exporter whose failures are logged at most once per [`WARN_EVERY`] (with how many
/// batches failed meanwhile, secrets taken out), and once when it works again.
#[derive(Debug)]
struct Warned<E> {
    inner: E,
    state: Mutex<WarnState>,
    counts: Arc<Counts>,
}

/// Counts the sampled spans that end, in front of the batch processor.
#[derive(Debug)]
struct Counting<P> {
    inner: P,
    counts: Arc<Counts>,
}

impl<P: SpanProcessor> SpanProcessor for Counting<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if span.span_context.is_sampled() {
            self.counts.ended.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

#[derive(Debug, Default)]
struct WarnState {
    last_warned: Option<Instant>,
    failed_since: u64,
}

impl<E> Warned<E> {
    fn new(inner: E, counts: Arc<Counts>) -> Self {
        Self {
            inner,
            state: Mutex::new(WarnState::default()),
            counts,
        }
    }

    fn record(&self, result: &OTelSdkResult) {
        let mut s = self.state.lock().expect("warn state");
        match result {
            Ok(()) => {
                if s.failed_since > 0 {
                    tracing::info!(failed_batches = s.failed_since, "OTLP export works again");
                }
                s.failed_since = 0;
                s.last_warned = None;
            }
            Err(e) => {
                s.failed_since += 1;
                if s.last_warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                    let e = redact(&e.to_string());
                    tracing::warn!(error = %e, failed_batches = s.failed_since,
                        "OTLP export failed: spans are dropped (events are not affected); next warning in a minute at the earliest");
                    s.last_warned = Some(Instant::now());
                }
            }
        }
    }
}

impl<E: SpanExporter> SpanExporter for Warned<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
        let r = self.inner.export(batch).await;
        if r.is_ok() {
            self.counts.exported.fetch_add(n, Ordering::Relaxed);
        }
        self.record(&r);
        r
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn endpoint_passwords_and_header_values_never_reach_a_log_line() {
        // The only test in this crate that sets these variables.
        std::env::set_var(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "https://tenant:p4ss-w0rd@otel.example:4318/base",
        );
        std::env::set_var(
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-api-key=k3y-v4lue, x-other=odd value",
        );
        let out = super::redact(
            "error sending request for url (https://tenant:p4ss-w0rd@otel.example:4318/base/v1/traces) with k3y-v4lue",
        );
        assert!(
            !out.contains("p4ss-w0rd") && !out.contains("k3y-v4lue"),
            "{out}"
        );
        assert!(out.contains("otel.example"), "{out}");
        std::env::remove_var("OTEL_EXPORTER_OTLP_ENDPOINT");
        std::env::remove_var("OTEL_EXPORTER_OTLP_HEADERS");
    }
}
