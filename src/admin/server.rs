//! The admin server's connections, bounded for whoever connects: at most
//! [`ServeOptions::max_connections`] at once and [`ServeOptions::max_connections_per_peer`]
//! from one address (more are closed at accept), request headers
//! within [`ServeOptions::header_timeout`], no connection idle past
//! [`ServeOptions::idle_timeout`], at most [`ServeOptions::max_in_flight`] API requests
//! working at once (the rest wait briefly, then 503), a `Host` allow-list against DNS
//! rebinding, and a panic in a handler answered with 500 instead of a closed connection.

use std::future::Future;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use futures::FutureExt as _;

use super::{ApiError, AppState};
use crate::serve::host_allowed;

/// Default [`ServeOptions::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 128;
/// Default [`ServeOptions::header_timeout`].
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`ServeOptions::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default [`ServeOptions::max_in_flight`].
pub const DEFAULT_MAX_IN_FLIGHT: usize = 16;
/// How long a request waits for a working slot before it is answered 503.
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(10);

/// Limits and names of the admin server.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServeOptions {
    /// Host names (besides `localhost` and IP literals, always accepted) that requests may
    /// name in `Host`: the names operators and probes reach this server by. Any other name is
    /// refused with 403, so a web page whose DNS name is rebound to this address cannot read
    /// it through a victim's browser.
    pub allowed_hosts: Vec<String>,
    /// Open connections at most; more are closed as they are accepted.
    pub max_connections: usize,
    /// Open connections from one peer address at most (more from it are closed as they are
    /// accepted), so one client cannot take every slot. `None` (the default): half of
    /// [`Self::max_connections`]. Behind a proxy every client shares the proxy's address:
    /// raise it there.
    pub max_connections_per_peer: Option<usize>,
    /// A request's headers must arrive within this.
    pub header_timeout: Duration,
    /// A connection with nothing read or written for this long is closed.
    pub idle_timeout: Duration,
    /// Requests working at once at most (each may hold a Postgres connection).
    pub max_in_flight: usize,
    /// The topics' schemas: an edited retry of a letter on a topic with a schema is checked
    /// against it and encoded as the relay would; its body is shown decoded for editing.
    #[cfg(feature = "schemas")]
    pub schemas: Option<crate::schemas::Schemas>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            allowed_hosts: Vec::new(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_peer: None,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            #[cfg(feature = "schemas")]
            schemas: None,
        }
    }
}

/// Refuses requests naming a host that is not allowed, on every route.
pub(crate) async fn check_host(
    State(s): State<AppState>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let host = req
        .headers()
        .get(header::HOST)
        .map(|h| h.to_str().unwrap_or("\u{fffd}"));
    if !host_allowed(host, &s.limits.allowed_hosts) {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            "this Host is not served here: start the server with --allowed-host NAME for each \
             name it is reached by"
                .into(),
        ));
    }
    super::input::check_query(req.uri().query())?;
    Ok(next.run(req).await)
}

/// At most `max_in_flight` requests work at once; a 500 from a handler's panic; secrets taken
/// out of server-error texts (a library's error may quote a property back).
pub(crate) async fn bound_and_guard(
    State(s): State<AppState>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    // Health, readiness, metrics and the page's files cost nothing that needs bounding (and a
    // liveness probe must not queue behind slow API calls).
    let permit = if req.uri().path().starts_with("/api/") {
        Some(
            tokio::time::timeout(IN_FLIGHT_WAIT, s.in_flight.clone().acquire_owned())
                .await
                .ok()
                .and_then(Result::ok)
                .ok_or_else(|| {
                    ApiError(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the server is busy: try again".into(),
                    )
                })?,
        )
    } else {
        None
    };
    let res = std::panic::AssertUnwindSafe(next.run(req))
        .catch_unwind()
        .await;
    drop(permit);
    let res = match res {
        Ok(r) => r,
        Err(_) => {
            tracing::error!("an admin request panicked; answered 500");
            return Err(ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error (logged)".into(),
            ));
        }
    };
    if !res.status().is_server_error() {
        return Ok(res);
    }
    let (parts, body) = res.into_parts();
    let bytes = axum::body::to_bytes(body, super::MAX_BODY * 16)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    let clean = s.db.redact(&s.kafka.redact(&text));
    Ok(Response::from_parts(parts, axum::body::Body::from(clean)))
}

/// Serves `app` on `listener` with `opts`' bounds until `shutdown` resolves.
pub(crate) async fn run(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    opts: &ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = crate::serve::Limits {
        max_connections: opts.max_connections,
        max_per_peer: opts
            .max_connections_per_peer
            .unwrap_or((opts.max_connections / 2).max(1)),
        header_timeout: opts.header_timeout,
        idle_timeout: opts.idle_timeout,
    };
    crate::serve::run(listener, app, &limits, shutdown).await
}
