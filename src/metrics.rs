//! Prometheus metrics: names, bounded labels, the recorder and the `/metrics` endpoint.
//!
//! The library records through the `metrics` facade everywhere; nothing is kept unless a
//! recorder is installed ([`install`]), which `outbox relay --metrics-addr`, `outbox admin`,
//! `outbox dlq archive --metrics-addr` and [`crate::consumer::ConsumerConfig::metrics_addr`]
//! do. An application that already serves HTTP mounts [`router`] instead.
//!
//! Labels are bounded: topic, consumer group, partition, status, outcome, reason — never a
//! message id, key or free text.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// `outbox_rows{status}`: outbox rows by status (`sent` is an estimate on large tables).
pub const OUTBOX_ROWS: &str = "outbox_rows";
/// Age of the oldest pending outbox row, seconds (0 when none).
pub const OUTBOX_OLDEST_PENDING_AGE: &str = "outbox_oldest_pending_age_seconds";
/// `outbox_published_total{topic}`: rows acknowledged by the broker and marked sent.
pub const OUTBOX_PUBLISHED: &str = "outbox_published_total";
/// `outbox_publish_failures_total{reason}`: sends that did not succeed (`unknown_topic`,
/// `message_too_large`, `refused`, `no_report`).
pub const OUTBOX_PUBLISH_FAILURES: &str = "outbox_publish_failures_total";
/// Histogram: a row's `created_at` to the broker's ack, seconds.
pub const OUTBOX_COMMIT_TO_ACK: &str = "outbox_commit_to_ack_seconds";
/// Histogram: rows per claimed batch.
pub const OUTBOX_BATCH_SIZE: &str = "outbox_batch_size";
/// Histogram: the claim statement's duration, seconds.
pub const OUTBOX_CLAIM_SECONDS: &str = "outbox_claim_seconds";
/// Ordering lanes this relay owns (of 64).
pub const OUTBOX_LANES_OWNED: &str = "outbox_relay_lanes_owned";

/// `outbox_consumer_messages_total{topic,group,outcome}`: `handled`, `duplicate`, `retried`,
/// `dead_lettered`, `skipped`, `dropped`.
pub const CONSUMER_MESSAGES: &str = "outbox_consumer_messages_total";
/// Histogram `{topic,group}`: handler transaction duration, seconds.
pub const CONSUMER_HANDLER_SECONDS: &str = "outbox_handler_seconds";
/// `{topic,partition,group}`: messages behind the end of the partition (librdkafka's view).
pub const CONSUMER_LAG: &str = "outbox_consumer_lag";
/// `{topic,partition,group}`: while behind, the age of the last message finished on the
/// partition, an upper bound of the oldest unconsumed message's age; 0 when caught up.
pub const CONSUMER_LAG_SECONDS: &str = "outbox_consumer_lag_seconds";
/// `{group}`: partitions paused (backpressure, retry delays).
pub const CONSUMER_PAUSED: &str = "outbox_consumer_paused_partitions";
/// `{group}`: messages accepted and not yet final.
pub const CONSUMER_IN_FLIGHT: &str = "outbox_consumer_in_flight";

/// `{group,dependency}`: 1 while the group's shared circuit breaker for the dependency is open.
pub const BREAKER_OPEN: &str = "outbox_breaker_open";
/// `{group}`: 0 normal, 1 paused (a breaker is open), 2 draining parked letters.
pub const CONSUMER_MODE: &str = "outbox_consumer_mode";

/// `outbox_dlq_messages{topic,group,kind,status}`: archived dead letters (`kind` is
/// `x-error-kind`; the per-cause view, by normalised error, is the admin dashboard's).
pub const DLQ_MESSAGES: &str = "outbox_dlq_messages";
/// `{topic}`: age of the oldest new dead letter, seconds.
pub const DLQ_OLDEST_AGE: &str = "outbox_dlq_oldest_age_seconds";
/// `{topic}`: records archived from DLQ topics.
pub const DLQ_ARCHIVED: &str = "outbox_dlq_archived_total";
/// `{topic}`: archived letters whose cause (kind + normalised error) was not seen before.
pub const DLQ_NEW_ERROR_GROUPS: &str = "outbox_dlq_new_error_groups_total";
/// Letters replayed (acknowledged on the target topic).
pub const DLQ_REPLAYED: &str = "outbox_dlq_replayed_total";
/// Replayed letters seen back in the DLQ.
pub const DLQ_REPLAY_CAME_BACK: &str = "outbox_dlq_replay_came_back_total";
/// `{reason}`: letters dropped (`operator`, or a drain policy's reason).
pub const DLQ_DROPPED: &str = "outbox_dlq_dropped_total";

/// Every metric name the code exports, for the dashboard and alert-rule checks.
pub const ALL: [&str; 25] = [
    BREAKER_OPEN,
    CONSUMER_MODE,
    OUTBOX_ROWS,
    OUTBOX_OLDEST_PENDING_AGE,
    OUTBOX_PUBLISHED,
    OUTBOX_PUBLISH_FAILURES,
    OUTBOX_COMMIT_TO_ACK,
    OUTBOX_BATCH_SIZE,
    OUTBOX_CLAIM_SECONDS,
    OUTBOX_LANES_OWNED,
    CONSUMER_MESSAGES,
    CONSUMER_HANDLER_SECONDS,
    CONSUMER_LAG,
    CONSUMER_LAG_SECONDS,
    CONSUMER_PAUSED,
    CONSUMER_IN_FLIGHT,
    DLQ_MESSAGES,
    DLQ_OLDEST_AGE,
    DLQ_ARCHIVED,
    DLQ_NEW_ERROR_GROUPS,
    DLQ_REPLAYED,
    DLQ_REPLAY_CAME_BACK,
    DLQ_DROPPED,
    "outbox_build_info",
    "outbox_up",
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide Prometheus recorder (once; later calls return the same handle).
///
/// # Errors
/// When another `metrics` recorder was installed by the application: mount that one instead.
pub fn install() -> Result<PrometheusHandle, String> {
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let seconds = [
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        300.0,
    ];
    let sizes = [
        1.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
    ];
    let builder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &seconds)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(OUTBOX_BATCH_SIZE.into()), &sizes))
        .map_err(|e| e.to_string())?;
    let recorder = builder.build_recorder();
    let handle = recorder.handle();
    // Two installs racing: the loser's recorder is dropped and both use the winner's handle.
    let _ = metrics::set_global_recorder(recorder);
    let h = HANDLE.get_or_init(|| handle);
    metrics::gauge!("outbox_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    metrics::gauge!("outbox_up").set(1.0);
    Ok(h.clone())
}

/// A router serving `GET /metrics` in Prometheus text format.
///
/// # Panics
/// Never: the recorder is installed on first use.
pub fn router() -> axum::Router {
    let handle = install().ok();
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let body = handle
                .as_ref()
                .map(PrometheusHandle::render)
                .unwrap_or_default();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    body,
                )
            }
        }),
    )
}

/// Serves `/metrics` on `addr` until `shutdown` resolves.
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    install().map_err(std::io::Error::other)?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics");
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router())
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::warn!(error = %e, "metrics server stopped");
        }
    }))
}

/// A bounded reason for a failed send, from librdkafka's error text.
pub(crate) fn publish_failure_reason(err: &str) -> &'static str {
    if err.contains("UnknownTopic") || err.contains("does not exist") {
        "unknown_topic"
    } else if err.contains("TooLarge") || err.contains("too large") {
        "message_too_large"
    } else {
        "refused"
    }
}
