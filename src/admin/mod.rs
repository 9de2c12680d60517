//! `outbox admin`: the HTTP admin API, the web dashboard and `/metrics` in one server.
//!
//! Every route is listed in [`ROUTES`] with the least role it needs; a middleware enforces that
//! table on the server for every request (a route missing from the table is refused for
//! everyone, so a new route cannot skip authentication by accident). Handlers call the same
//! library code as the CLI (`outbox::dlq`, [`crate::status::status()`], [`crate::status::requeue`]); JSON in and
//! out, errors as `{"error": "…"}` with a status code.

mod auth;
mod edit;
mod handlers;
mod input;
mod jobs;
mod ready;
mod server;
mod trace;

pub use auth::{token_hash, Auth, AuthError, Caller, Role, MIN_TOKEN_CHARS};
pub use server::{
    ServeOptions, DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_IN_FLIGHT,
};

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio_util::sync::CancellationToken;

use crate::config::{DbConfig, KafkaConfig};
use crate::dlq::Dlq;

/// Largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No token needed (health, readiness, metrics, the page's static files).
    Public,
    /// A token of at least this role.
    At(Role),
}

/// One route of the server.
#[derive(Debug, Clone, Copy)]
pub struct RouteSpec {
    /// HTTP method.
    pub method: &'static str,
    /// Path as registered (`{id}` for a path parameter).
    pub path: &'static str,
    /// Who may call it.
    pub access: Access,
}

const fn r(method: &'static str, path: &'static str, access: Access) -> RouteSpec {
    RouteSpec {
        method,
        path,
        access,
    }
}

use Access::{At, Public};

/// `application_name` of the admin server's sessions, recorded on its audit rows.
pub const API_APPLICATION_NAME: &str = "outbox-admin";

/// Every route and the least role it needs: the single source the middleware enforces.
pub const ROUTES: &[RouteSpec] = &[
    r("GET", "/", Public),
    r("GET", "/app.js", Public),
    r("GET", "/style.css", Public),
    r("GET", "/healthz", Public),
    r("GET", "/readyz", Public),
    r("GET", "/metrics", Public),
    r("GET", "/api/whoami", At(Role::Viewer)),
    r("GET", "/api/outbox/status", At(Role::Viewer)),
    r("POST", "/api/outbox/requeue", At(Role::Operator)),
    r("GET", "/api/trace", At(Role::Viewer)),
    r("GET", "/api/overview", At(Role::Viewer)),
    r("POST", "/api/breakers/open", At(Role::Operator)),
    r("POST", "/api/breakers/close", At(Role::Operator)),
    r("GET", "/api/dlq/summary", At(Role::Viewer)),
    r("GET", "/api/holds", At(Role::Viewer)),
    r("GET", "/api/dlq/messages", At(Role::Viewer)),
    r("GET", "/api/dlq/messages/{id}", At(Role::Viewer)),
    r("GET", "/api/dlq/messages/{id}/editable", At(Role::Operator)),
    r(
        "POST",
        "/api/dlq/messages/{id}/edit-retry",
        At(Role::Operator),
    ),
    r("POST", "/api/dlq/replay", At(Role::Operator)),
    r("POST", "/api/dlq/drop", At(Role::Operator)),
    r("POST", "/api/dlq/restore", At(Role::Operator)),
    r("GET", "/api/dlq/audit", At(Role::Viewer)),
    r("GET", "/api/dlq/jobs", At(Role::Viewer)),
    r("GET", "/api/dlq/jobs/{id}", At(Role::Viewer)),
    r("GET", "/api/dlq/jobs/{id}/items", At(Role::Viewer)),
    r("GET", "/api/dlq/jobs/{id}/events", At(Role::Viewer)),
    r("POST", "/api/dlq/jobs/{id}/pause", At(Role::Operator)),
    r("POST", "/api/dlq/jobs/{id}/resume", At(Role::Operator)),
    r("POST", "/api/dlq/jobs/{id}/cancel", At(Role::Operator)),
    r("POST", "/api/dlq/purge", At(Role::Admin)),
];

/// Shared by every handler.
#[derive(Clone)]
pub(crate) struct AppState {
    pub db: DbConfig,
    pub kafka: KafkaConfig,
    pub dlq: Dlq,
    pub auth: Arc<Auth>,
    /// Cancelled at shutdown: replay jobs running in the server pause.
    pub stop: CancellationToken,
    pub jobs: Arc<tokio::sync::Mutex<std::collections::HashSet<i64>>>,
    /// The server's bounds and allowed host names.
    pub limits: Arc<ServeOptions>,
    /// Slots for API requests working at once.
    pub in_flight: Arc<tokio::sync::Semaphore>,
    /// `/readyz`'s last look at the dependencies.
    pub ready: ready::Readiness,
    /// Connections for the API's reads (status, overview, trace): a few, each session under
    /// [`READS_STATEMENT_TIMEOUT`], so what a viewer asks for holds a bounded number of
    /// Postgres backends for a bounded time, also when the viewer hangs up mid-request.
    pub pool: deadpool_postgres::Pool,
    /// Trace searches running at once.
    pub trace_slots: Arc<tokio::sync::Semaphore>,
}

/// The statement timeout of the API's read connections.
pub const READS_STATEMENT_TIMEOUT: Duration = Duration::from_secs(15);

impl AppState {
    /// A connection of the read pool (503 when none frees up in time).
    pub(crate) async fn reads(&self) -> Result<deadpool_postgres::Object, ApiError> {
        self.pool
            .get()
            .await
            .map_err(|e| ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))
    }
}

/// An error answer: status and `{"error": message}`.
#[derive(Debug)]
pub(crate) struct ApiError(pub StatusCode, pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

/// The library's messages name the CLI's flags (`--accept-duplicates`); an API caller sends
/// fields (`accept_duplicates`): say it in their words.
fn api_words(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while let Some(i) = rest.find("--") {
        out.push_str(&rest[..i]);
        let flag = &rest[i + 2..];
        let end = flag
            .find(|c: char| !(c.is_ascii_lowercase() || c == '-'))
            .unwrap_or(flag.len());
        if end == 0 {
            out.push_str("--");
        } else {
            out.push_str(&flag[..end].replace('-', "_"));
        }
        rest = &flag[end..];
    }
    out.push_str(rest);
    out
}

impl From<crate::dlq::DlqError> for ApiError {
    fn from(e: crate::dlq::DlqError) -> Self {
        if e.is_not_found() {
            Self(StatusCode::NOT_FOUND, api_words(&e.to_string()))
        } else if e.is_conflict() {
            Self(StatusCode::CONFLICT, api_words(&e.to_string()))
        } else if e.is_invalid() {
            Self(StatusCode::BAD_REQUEST, api_words(&e.to_string()))
        } else {
            tracing::warn!(error = %e, "admin request failed");
            Self(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
    }
}

async fn authorize(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let path = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned());
    // HEAD is a GET without the body (axum's GET routes answer it): the same access rule.
    let method = match req.method() {
        &Method::HEAD => Method::GET,
        m => m.clone(),
    };
    let spec = path.as_deref().and_then(|p| {
        ROUTES.iter().find(|r| {
            r.path == p && Method::from_bytes(r.method.as_bytes()).ok() == Some(method.clone())
        })
    });
    // Fail closed: a route without an entry is refused for everyone.
    let Some(spec) = spec else {
        // A known path with another method: answer 405 before anything runs.
        if path.is_none()
            || path
                .as_deref()
                .is_some_and(|p| ROUTES.iter().any(|r| r.path == p))
        {
            return Err(ApiError(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{method} is not allowed here"),
            ));
        }
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            "route has no access rule".into(),
        ));
    };
    let need = match spec.access {
        Access::Public => return Ok(next.run(req).await),
        Access::At(role) => role,
    };
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let Some(caller) = state.auth.check(token) else {
        return Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token".into(),
        ));
    };
    if caller.role < need {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            format!("{} is {}; this needs {need}", caller.holder, caller.role),
        ));
    }
    req.extensions_mut().insert(caller);
    Ok(next.run(req).await)
}

/// The admin router over `db` and `kafka` with `auth`, with the default [`ServeOptions`].
/// Jobs started through it pause when `stop` is cancelled.
pub fn app(db: &DbConfig, kafka: &KafkaConfig, auth: Auth, stop: CancellationToken) -> Router {
    app_with(db, kafka, auth, &ServeOptions::default(), stop)
}

/// [`app`] with `opts`' allowed hosts and in-flight bound.
pub fn app_with(
    db: &DbConfig,
    kafka: &KafkaConfig,
    auth: Auth,
    opts: &ServeOptions,
    stop: CancellationToken,
) -> Router {
    let mut db = db.clone();
    // Audit rows written through the API say so (`dlq_audit.via`).
    db.set_application_name(API_APPLICATION_NAME);
    let db = &db;
    let state = AppState {
        db: db.clone(),
        kafka: kafka.clone(),
        dlq: Dlq::new(db),
        auth: Arc::new(auth),
        ready: ready::Readiness::new(db, kafka, stop.clone()),
        stop,
        jobs: Arc::default(),
        limits: Arc::new(opts.clone()),
        in_flight: Arc::new(tokio::sync::Semaphore::new(
            opts.max_in_flight
                .clamp(1, tokio::sync::Semaphore::MAX_PERMITS),
        )),
        pool: {
            let mut reads = db.clone();
            reads.pool_size = 4;
            reads.set_statement_timeout(READS_STATEMENT_TIMEOUT);
            crate::db::pool(&reads).expect("a pool over a parsed DbConfig always builds")
        },
        trace_slots: Arc::new(tokio::sync::Semaphore::new(2)),
    };
    use handlers as h;

    Router::new()
        .route("/", get(h::index))
        .route("/app.js", get(h::app_js))
        .route("/style.css", get(h::style_css))
        .route("/healthz", get(h::healthz))
        .route("/readyz", get(h::readyz))
        .route("/api/whoami", get(h::whoami))
        .route("/api/outbox/status", get(h::outbox_status))
        .route("/api/outbox/requeue", post(h::outbox_requeue))
        .route("/api/trace", get(trace::trace))
        .route("/api/overview", get(h::overview))
        .route("/api/breakers/open", post(h::breaker_open))
        .route("/api/breakers/close", post(h::breaker_close))
        .route("/api/dlq/summary", get(h::dlq_summary))
        .route("/api/holds", get(h::holds))
        .route("/api/dlq/messages", get(h::dlq_messages))
        .route("/api/dlq/messages/{id}", get(h::dlq_message))
        .route("/api/dlq/messages/{id}/editable", get(edit::editable))
        .route("/api/dlq/messages/{id}/edit-retry", post(edit::edit_retry))
        .route("/api/dlq/replay", post(h::dlq_replay))
        .route("/api/dlq/drop", post(h::dlq_drop))
        .route("/api/dlq/restore", post(h::dlq_restore))
        .route("/api/dlq/audit", get(h::dlq_audit))
        .route("/api/dlq/jobs", get(jobs::dlq_jobs))
        .route("/api/dlq/jobs/{id}", get(jobs::dlq_job))
        .route("/api/dlq/jobs/{id}/items", get(jobs::dlq_job_items))
        .route("/api/dlq/jobs/{id}/events", get(jobs::dlq_job_events))
        .route("/api/dlq/jobs/{id}/pause", post(jobs::dlq_job_pause))
        .route("/api/dlq/jobs/{id}/resume", post(jobs::dlq_job_resume))
        .route("/api/dlq/jobs/{id}/cancel", post(jobs::dlq_job_cancel))
        .route("/api/dlq/purge", post(h::dlq_purge))
        .merge(crate::metrics::router().with_state(()))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authorize,
        ))
        .fallback(|| async { ApiError(StatusCode::NOT_FOUND, "no such route".into()) })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            server::bound_and_guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            server::check_host,
        ))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(state)
}

/// Headers on every answer: the dashboard runs only its own script and style, cannot be
/// framed (clickjacking), and API answers — dead letters' contents among them — are never
/// stored by a browser or a proxy.
async fn security_headers(req: Request, next: Next) -> Response {
    let api = req.uri().path().starts_with("/api/");
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
             img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
    );
    h.insert(
        header::X_FRAME_OPTIONS,
        header::HeaderValue::from_static("DENY"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        header::HeaderValue::from_static("no-referrer"),
    );
    if api {
        h.insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-store"),
        );
    }
    res
}

/// Serves the admin API on `listen` until `shutdown` resolves, with the default
/// [`ServeOptions`]; refreshes the DLQ and outbox gauges every 15 s.
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve(
    listen: SocketAddr,
    db: &DbConfig,
    kafka: &KafkaConfig,
    auth: Auth,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listen, db, kafka, auth, &ServeOptions::default(), shutdown).await
}

/// [`serve`] with `opts`' bounds and allowed host names.
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve_with(
    listen: SocketAddr,
    db: &DbConfig,
    kafka: &KafkaConfig,
    auth: Auth,
    opts: &ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::metrics::install().map_err(std::io::Error::other)?;
    if auth.is_insecure() {
        tracing::warn!("admin API running WITHOUT authentication (--insecure-no-auth): anyone who can reach {listen} can replay and drop dead letters");
    }
    if !listen.ip().is_loopback() {
        tracing::warn!(%listen, "admin API listening beyond loopback");
    }
    let stop = CancellationToken::new();
    let app = app_with(db, kafka, auth, opts, stop.clone());
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(%listen, "admin API and dashboard listening");
    let dlq = Dlq::new(db);
    let gauges_stop = stop.clone();
    let pool = crate::db::pool(db).map_err(std::io::Error::other)?;
    let stmts = crate::sql::Statements::new(&db.schema);
    let schema = db.schema.clone();
    tokio::spawn(async move {
        loop {
            if let Err(e) = dlq.refresh_gauges().await {
                tracing::debug!(error = %e, "dlq gauges not refreshed");
            }
            crate::relay::refresh_outbox_gauges(&pool, &schema, &stmts, None).await;
            tokio::select! {
                () = gauges_stop.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(15)) => {}
            }
        }
    });
    let s2 = stop.clone();
    server::run(listener, app, opts, async move {
        shutdown.await;
        s2.cancel();
    })
    .await
}

/// A request body through the strict JSON parser: the value, or the status it is refused with.
#[cfg(test)]
pub(crate) fn parse_body_for_tests(b: &[u8]) -> Result<serde_json::Value, u16> {
    input::parse(b).map_err(|e| e.0.as_u16())
}

/// Whether a `Host` header value is served by a server that allows `outbox.internal`.
#[cfg(test)]
pub(crate) fn host_allowed_for_tests(host: &str) -> bool {
    crate::serve::host_allowed(Some(host), &["outbox.internal".to_owned()])
}

#[cfg(test)]
mod tests {
    #[test]
    fn api_errors_name_fields_not_flags() {
        assert_eq!(
            super::api_words("give --accept-duplicates or --since, not --"),
            "give accept_duplicates or since, not --"
        );
        assert_eq!(super::api_words("no flags here"), "no flags here");
    }
}
