//! The Prometheus recorder and the `/metrics` route (the `prometheus` feature).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use super::OUTBOX_BATCH_SIZE;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide Prometheus recorder (once; later calls return the same handle).
///
/// # Errors
/// [`InstallError`] when the recorder cannot be built.
pub fn install() -> Result<PrometheusHandle, InstallError> {
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
        .map_err(|e| InstallError(e.to_string()))?;
    let recorder = builder.build_recorder();
    let handle = recorder.handle();
    // Two installs racing: the loser's recorder is dropped and both use the winner's handle.
    let _ = metrics::set_global_recorder(recorder);
    let h = HANDLE.get_or_init(|| handle);
    metrics::gauge!("outbox_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    metrics::gauge!("outbox_up").set(1.0);
    Ok(h.clone())
}

/// The Prometheus recorder could not be built (its text says why).
#[derive(Debug, Clone, thiserror::Error)]
#[error("metrics recorder: {0}")]
pub struct InstallError(pub String);

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

/// Serves `/metrics` on `addr` until `shutdown` resolves, to requests whose `Host` is an IP
/// literal, `localhost` or absent (a scraper addressing the pod or the loopback); a request
/// naming another host gets 403, so a web page whose name was rebound to this address
/// (DNS rebinding) reads nothing. [`serve_with_hosts`] also answers to names.
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    serve_with_hosts(addr, Vec::new(), shutdown).await
}

/// [`serve`], also answering requests that name one of `allowed_hosts` (any port, compared
/// without case): the names the scraper reaches the process by, e.g. a Kubernetes Service's.
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve_with_hosts(
    addr: SocketAddr,
    allowed_hosts: Vec<String>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    serve_with_health(addr, allowed_hosts, None, shutdown).await
}

/// The probes' routes of a part: `GET /healthz` (200 while live, else 503) and `GET /readyz`
/// (200 while ready, else 503), each with the [`crate::health::Answer`]'s JSON as its body.
pub fn health_router(health: crate::health::Health) -> axum::Router {
    use axum::response::IntoResponse as _;
    fn answer(v: crate::health::Answer) -> axum::response::Response {
        let code = if v.ok {
            axum::http::StatusCode::OK
        } else {
            axum::http::StatusCode::SERVICE_UNAVAILABLE
        };
        (code, axum::Json(v.detail)).into_response()
    }
    let live = health.clone();
    axum::Router::new()
        .route(
            "/healthz",
            axum::routing::get(move || {
                let v = live.live();
                async move { answer(v) }
            }),
        )
        .route(
            "/readyz",
            axum::routing::get(move || {
                let v = health.ready();
                async move { answer(v) }
            }),
        )
}

/// [`serve_with_hosts`], with `/healthz` and `/readyz` from `health` beside `/metrics`.
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve_with_health(
    addr: SocketAddr,
    allowed_hosts: Vec<String>,
    health: Option<crate::health::Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    install().map_err(std::io::Error::other)?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let mut routes = router();
    if let Some(h) = health {
        routes = routes.merge(health_router(h));
        tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    } else {
        tracing::info!(%addr, "serving /metrics");
    }
    let allowed = std::sync::Arc::new(allowed_hosts);
    let app = routes.layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let allowed = allowed.clone();
            async move {
                use axum::response::IntoResponse as _;
                let host = req
                    .headers()
                    .get(axum::http::header::HOST)
                    .map(|h| h.to_str().unwrap_or("\u{fffd}"));
                if crate::serve::host_allowed(host, &allowed) {
                    next.run(req).await
                } else {
                    (
                        axum::http::StatusCode::FORBIDDEN,
                        "this Host is not served here: name it with --metrics-allowed-host\n",
                    )
                        .into_response()
                }
            }
        },
    ));
    Ok(tokio::spawn(async move {
        // Bounded like the admin server: the port is open to whoever reaches it.
        if let Err(e) =
            crate::serve::run(listener, app, &crate::serve::Limits::metrics(), shutdown).await
        {
            tracing::warn!(error = %e, "metrics server stopped");
        }
    }))
}
