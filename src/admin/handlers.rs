//! Route handlers: parse JSON or query strings, call the library, answer JSON.

use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};

use super::input::Strict;
use super::{ApiError, AppState, Caller, Role};
use crate::dlq::{Filter, Order, ReplayOptions, Status};

pub(super) type ApiResult = Result<Response, ApiError>;

pub(super) fn ok(v: impl serde::Serialize) -> ApiResult {
    Ok(Json(v).into_response())
}

/// The filter fields every selecting body takes (the CLI's flag names).
const FILTER_FIELDS: [&str; 10] = [
    "ids",
    "topic",
    "group",
    "error_contains",
    "error_group",
    "kind",
    "tenant",
    "status",
    "since",
    "until",
];

/// A JSON object body whose every field is one of `known`: a misspelt field is refused with
/// 400 naming it, never ignored (an ignored filter widens the selection).
pub(super) fn exact<T: serde::de::DeserializeOwned>(
    v: Value,
    known: &[&[&str]],
) -> Result<T, ApiError> {
    let Some(obj) = v.as_object() else {
        return Err(ApiError(
            StatusCode::UNPROCESSABLE_ENTITY,
            "the body must be a JSON object".into(),
        ));
    };
    let all: Vec<&str> = known.iter().flat_map(|k| k.iter().copied()).collect();
    if let Some(bad) = obj.keys().find(|k| !all.contains(&k.as_str())) {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!(
                "unknown field {bad:?}; this route takes: {}",
                all.join(", ")
            ),
        ));
    }
    serde_json::from_value(v).map_err(|e| ApiError(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()))
}

pub(super) async fn index() -> Html<&'static str> {
    Html(include_str!("ui/index.html"))
}

pub(super) async fn app_js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        // One script in this order: the parts use the helpers of app.js, boot.js starts it.
        concat!(
            include_str!("ui/app.js"),
            include_str!("ui/words.js"),
            include_str!("ui/jobs.js"),
            include_str!("ui/edit.js"),
            include_str!("ui/boot.js"),
        ),
    )
        .into_response()
}

pub(super) async fn style_css() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("ui/style.css"),
    )
        .into_response()
}

pub(super) async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Ready when Postgres and Kafka answer and an archiver checks in, from the server's last
/// look (every few seconds): a call costs no connection.
pub(super) async fn readyz(State(s): State<AppState>) -> Response {
    let Some(r) = s.ready.report().await else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"ready": false, "starting": true})),
        )
            .into_response();
    };
    (
        if r.ready() {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        Json(r.to_json()),
    )
        .into_response()
}

pub(super) async fn whoami(Extension(c): Extension<Caller>) -> ApiResult {
    ok(c)
}

pub(super) async fn outbox_status(State(s): State<AppState>) -> ApiResult {
    let c = s.reads().await?;
    let st = crate::status::status_on(&c, &s.db, crate::cleanup::DEFAULT_PROCESSED_RETENTION)
        .await
        .map_err(|e| ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    ok(st)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RequeueBody {
    id: Option<i64>,
    #[serde(default)]
    failed: bool,
}

pub(super) async fn outbox_requeue(
    State(s): State<AppState>,
    Extension(c): Extension<Caller>,
    Strict(b): Strict,
) -> ApiResult {
    let b: RequeueBody = exact(b, &[&["id", "failed"]])?;
    let which = match (b.id, b.failed) {
        (Some(id), false) => crate::status::Requeue::Id(id),
        (None, true) => crate::status::Requeue::AllFailed,
        _ => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                "give either {\"id\": N} or {\"failed\": true}".into(),
            ))
        }
    };
    let n = crate::status::requeue_by(&s.db, which, &c.holder)
        .await
        .map_err(|e| ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    if n == 0 && b.id.is_some() {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            "no failed row with that id".into(),
        ));
    }
    ok(json!({"requeued": n}))
}

/// The whole system at a glance: outbox, relays, consumer replicas (mode, paused, lag),
/// breakers, the archiver.
pub(super) async fn overview(State(s): State<AppState>) -> ApiResult {
    let c = s.reads().await?;
    let o = crate::instances::overview_on(&c, &s.db)
        .await
        .map_err(|e| ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    // With the verdict on each part, from the alert rules' thresholds.
    let verdicts = crate::verdict::verdicts(&o);
    let mut v = serde_json::to_value(o)
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    v["verdicts"] = json!(verdicts);
    ok(v)
}

#[derive(Deserialize)]
pub(super) struct BreakerBody {
    group: String,
    dependency: String,
    reason: Option<String>,
    open_for_secs: Option<u64>,
    /// Open it although no live replica declares the group or dependency.
    #[serde(default)]
    confirm: bool,
}

fn breaker_error(e: crate::instances::BreakerActionError) -> ApiError {
    use crate::instances::BreakerActionError as E;
    match e {
        E::Invalid(m) => ApiError(StatusCode::BAD_REQUEST, m),
        E::Unknown(m) => ApiError(StatusCode::CONFLICT, m),
        e @ E::NotFound(..) => ApiError(StatusCode::NOT_FOUND, e.to_string()),
        e => ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// Opens a breaker by hand (the API is known to be down), audited with the holder.
pub(super) async fn breaker_open(
    State(s): State<AppState>,
    Extension(c): Extension<Caller>,
    Strict(b): Strict,
) -> ApiResult {
    let b: BreakerBody = exact(
        b,
        &[&["group", "dependency", "reason", "open_for_secs", "confirm"]],
    )?;
    let open_for = Duration::from_secs(b.open_for_secs.unwrap_or(300));
    let mut reason = b.reason.clone().unwrap_or_default();
    crate::instances::check(&b.group, &b.dependency, &reason).map_err(breaker_error)?;
    let target = {
        let c = s.reads().await?;
        crate::instances::check_breaker_target_on(&c, &s.db, &b.group, &b.dependency).await
    };
    match target {
        Ok(()) => {}
        // Opened anyway, on the operator's word: the breaker's reason says so.
        Err(crate::instances::BreakerActionError::Unknown(_)) if b.confirm => {
            reason.push_str(" (confirmed: no live replica declares it)");
        }
        Err(e) => return Err(breaker_error(e)),
    }
    let generation = crate::instances::open_breaker(
        &s.db,
        &b.group,
        &b.dependency,
        open_for,
        &reason,
        &c.holder,
    )
    .await
    .map_err(breaker_error)?;
    ok(json!({"opened": true, "generation": generation}))
}

/// Closes a breaker by hand (the API is known to be back): replicas drain and resume.
pub(super) async fn breaker_close(
    State(s): State<AppState>,
    Extension(c): Extension<Caller>,
    Strict(b): Strict,
) -> ApiResult {
    let b: BreakerBody = exact(b, &[&["group", "dependency", "reason"]])?;
    crate::instances::close_breaker(
        &s.db,
        &b.group,
        &b.dependency,
        b.reason.as_deref().unwrap_or(""),
        &c.holder,
    )
    .await
    .map_err(breaker_error)?;
    ok(json!({"closed": true}))
}

pub(super) async fn dlq_summary(State(s): State<AppState>) -> ApiResult {
    ok(s.dlq.summary().await?)
}

/// Filters from a query string or a JSON body (same names as the CLI's flags).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FilterQuery {
    topic: Option<String>,
    group: Option<String>,
    error_contains: Option<String>,
    error_group: Option<String>,
    kind: Option<String>,
    tenant: Option<String>,
    status: Option<String>,
    since: Option<String>,
    until: Option<String>,
    limit: Option<i64>,
    /// `newest` (the default) or `oldest`.
    order: Option<String>,
    /// The next page newest first: the last id seen.
    before_id: Option<i64>,
    /// The next page oldest first: the last id seen.
    after_id: Option<i64>,
}

fn filter_of(q: &FilterQuery, ids: Vec<i64>) -> Result<Filter, ApiError> {
    let empty = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
    Ok(Filter {
        ids,
        topic: empty(&q.topic),
        group: empty(&q.group),
        error_contains: empty(&q.error_contains),
        error_group: empty(&q.error_group),
        kind: empty(&q.kind),
        tenant: empty(&q.tenant),
        status: empty(&q.status)
            .map(|s| s.parse::<Status>())
            .transpose()
            .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?,
        since: empty(&q.since),
        until: empty(&q.until),
    })
}

pub(super) async fn dlq_messages(
    State(s): State<AppState>,
    q: Result<Query<FilterQuery>, QueryRejection>,
) -> ApiResult {
    let Query(q) = q.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    let f = filter_of(&q, Vec::new())?;
    let limit = q.limit.unwrap_or(50);
    let order: Order = q
        .order
        .as_deref()
        .unwrap_or("newest")
        .parse()
        .map_err(|e: crate::dlq::DlqError| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    // Each order has its own cursor, so a link can never page one order with the other's.
    let (past, next_name, wrong) = match order {
        Order::NewestFirst => (
            q.before_id,
            "next_before_id",
            q.after_id.map(|_| "after_id"),
        ),
        Order::OldestFirst => (
            q.after_id,
            "next_after_id",
            q.before_id.map(|_| "before_id"),
        ),
    };
    if let Some(field) = wrong {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("{field} does not page this order: newest first pages with before_id, oldest first with after_id"),
        ));
    }
    let rows = s.dlq.list(&f, limit, order, past).await?;
    let next = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|r| r.id))
        .flatten();
    // How many match the filter in all (up to 10,001: "more than 10,000" beyond).
    let total = s.dlq.count_matching(&f).await?;
    ok(json!({"messages": rows, next_name: next, "total": total}))
}

/// Keys held in strict per-key order: the key (operators only: keys are contents), its head
/// and the head's letter, how many wait, since when.
pub(super) async fn holds(State(s): State<AppState>, Extension(c): Extension<Caller>) -> ApiResult {
    let mut holds = s.dlq.held_keys(crate::dlq::MAX_HOLDS_LISTED).await?;
    if c.role < Role::Operator {
        for h in &mut holds {
            h.key = None;
        }
    }
    ok(json!({ "holds": holds }))
}

pub(super) async fn dlq_message(
    State(s): State<AppState>,
    Extension(c): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult {
    let d = s
        .dlq
        .show(super::input::path_id(&id, "dead letter")?)
        .await?;
    // Viewers see where and why, never the contents.
    ok(d.to_json(c.role < Role::Operator))
}

/// Checked by [`exact`] against [`FILTER_FIELDS`] and [`REPLAY_FIELDS`] first: serde cannot
/// refuse unknown fields next to a flattened filter.
#[derive(Deserialize)]
pub(super) struct ReplayBody {
    #[serde(default)]
    ids: Vec<i64>,
    #[serde(flatten)]
    filter: ReplayFilter,
    to: Option<String>,
    rate: Option<f64>,
    limit: Option<i64>,
    canary: Option<u32>,
    canary_wait_secs: Option<f64>,
    max_refail: Option<f64>,
    #[serde(default)]
    force: bool,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    accept_duplicates: bool,
    marks_retention_secs: Option<u64>,
    watch_secs: Option<u64>,
    #[serde(default)]
    confirm_kinds: bool,
    #[serde(default)]
    confirm_order: bool,
    #[serde(default)]
    dry_run: bool,
}

/// The filter fields of a JSON body (flattened next to the options).
#[derive(Deserialize, Default)]
pub(super) struct ReplayFilter {
    topic: Option<String>,
    group: Option<String>,
    error_contains: Option<String>,
    error_group: Option<String>,
    kind: Option<String>,
    tenant: Option<String>,
    status: Option<String>,
    since: Option<String>,
    until: Option<String>,
}

impl ReplayFilter {
    fn query(&self) -> FilterQuery {
        FilterQuery {
            topic: self.topic.clone(),
            group: self.group.clone(),
            error_contains: self.error_contains.clone(),
            error_group: self.error_group.clone(),
            kind: self.kind.clone(),
            tenant: self.tenant.clone(),
            status: self.status.clone(),
            since: self.since.clone(),
            until: self.until.clone(),
            ..FilterQuery::default()
        }
    }
}

/// The options a replay body takes besides the filter.
const REPLAY_FIELDS: [&str; 14] = [
    "to",
    "rate",
    "limit",
    "canary",
    "canary_wait_secs",
    "max_refail",
    "force",
    "all",
    "accept_duplicates",
    "marks_retention_secs",
    "watch_secs",
    "confirm_kinds",
    "confirm_order",
    "dry_run",
];

pub(super) async fn dlq_replay(
    State(s): State<AppState>,
    Extension(c): Extension<Caller>,
    Strict(b): Strict,
) -> ApiResult {
    let b: ReplayBody = exact(b, &[&FILTER_FIELDS, &REPLAY_FIELDS])?;
    let f = filter_of(&b.filter.query(), b.ids.clone())?;
    let d = ReplayOptions::default();
    let canary_wait = match b.canary_wait_secs {
        Some(w) if !(0.0..=86_400.0).contains(&w) => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                "canary_wait_secs: 0 to 86400".into(),
            ))
        }
        Some(w) => Duration::from_secs_f64(w),
        None => d.canary_wait,
    };
    let opts = ReplayOptions {
        to_topic: b.to,
        rate: b.rate.unwrap_or(d.rate),
        limit: b.limit,
        canary: b.canary.unwrap_or(d.canary),
        canary_wait,
        max_refail: b.max_refail.unwrap_or(d.max_refail),
        loop_guard: d.loop_guard,
        force: b.force,
        all: b.all,
        marks_retention: match b.marks_retention_secs.map(Duration::from_secs) {
            // The window decides which letters need `accept_duplicates`: a request may only
            // narrow it (stricter), never widen it past how long marks are kept, or a field
            // would stand in for the confirmation.
            Some(m) if m > d.marks_retention => {
                return Err(ApiError(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "marks_retention_secs: at most {} (how long processed marks are kept); \
                         to replay older letters, give accept_duplicates",
                        d.marks_retention.as_secs()
                    ),
                ))
            }
            Some(m) => m,
            None => d.marks_retention,
        },
        accept_duplicates: b.accept_duplicates,
        watch: b.watch_secs.map_or(d.watch, Duration::from_secs),
        confirm_kinds: b.confirm_kinds,
        confirm_order: b.confirm_order,
        actor: c.holder.clone(),
    };
    if b.dry_run {
        return ok(s.dlq.dry_run(&f, &opts).await?);
    }
    let job = s.dlq.create_job(&f, &opts).await?;
    spawn_job(&s, job.id, crate::dlq::Start::New).await;
    Ok((StatusCode::ACCEPTED, Json(job)).into_response())
}

/// Runs a job on a task of the server (it pauses when the server stops). False when this
/// server already runs it (checked and recorded under one lock).
pub(super) async fn spawn_job(s: &AppState, id: i64, start: crate::dlq::Start) -> bool {
    let (dlq, kafka, stop, jobs) = (
        s.dlq.clone(),
        s.kafka.clone(),
        s.stop.clone(),
        s.jobs.clone(),
    );
    if !jobs.lock().await.insert(id) {
        return false;
    }
    let runner = tokio::spawn(async move {
        dlq.run_job_with(&kafka, id, start, &stop, &mut |_| {})
            .await
    });
    // The job leaves the running set however its runner ends, a panic included: otherwise
    // it could never be resumed on this server again.
    tokio::spawn(async move {
        match runner.await {
            Ok(Ok(o)) => tracing::info!(job = id, outcome = ?o, "replay job ended"),
            Ok(Err(e)) => tracing::warn!(job = id, error = %e, "replay job failed; resume it"),
            Err(e) => tracing::error!(job = id, error = %e, "replay job's runner died; resume it"),
        }
        jobs.lock().await.remove(&id);
    });
    true
}

#[derive(Deserialize)]
pub(super) struct DropBody {
    #[serde(default)]
    ids: Vec<i64>,
    #[serde(flatten)]
    filter: ReplayFilter,
    reason: Option<String>,
    #[serde(default)]
    all: bool,
}

/// A drop's or a restore's body: the selection, `all`, and the reason.
fn drop_args(b: Value) -> Result<(Filter, bool, String), ApiError> {
    let b: DropBody = exact(b, &[&FILTER_FIELDS, &["reason", "all"]])?;
    let f = filter_of(&b.filter.query(), b.ids)?;
    Ok((f, b.all, b.reason.unwrap_or_default()))
}

pub(super) async fn dlq_drop(
    State(s): State<AppState>,
    Extension(c): Extension<Caller>,
    Strict(b): Strict,
) -> ApiResult {
    let (f, all, reason) = drop_args(b)?;
    ok(s.dlq.drop_letters(&f, all, &reason, &c.holder).await?)
}

/// Undoes a drop: the same body as a drop, for `dropped` letters.
pub(super) async fn dlq_restore(
    State(s): State<AppState>,
    Extension(c): Extension<Caller>,
    Strict(b): Strict,
) -> ApiResult {
    let (f, all, reason) = drop_args(b)?;
    ok(s.dlq.restore_letters(&f, all, &reason, &c.holder).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitQuery {
    pub(super) limit: Option<i64>,
}

pub(super) async fn dlq_audit(
    State(s): State<AppState>,
    q: Result<Query<LimitQuery>, QueryRejection>,
) -> ApiResult {
    let Query(q) = q.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    ok(s.dlq.audit(q.limit.unwrap_or(100)).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PurgeBody {
    retention_secs: Option<u64>,
}

pub(super) async fn dlq_purge(
    State(s): State<AppState>,
    Extension(c): Extension<Caller>,
    Strict(b): Strict,
) -> ApiResult {
    let b: PurgeBody = exact(b, &[&["retention_secs"]])?;
    let retention = b.retention_secs.map_or(
        crate::cleanup::DEFAULT_ARCHIVE_RETENTION,
        Duration::from_secs,
    );
    ok(s.dlq.purge(retention, 5000, &c.holder).await?)
}
