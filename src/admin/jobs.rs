//! Replay jobs over the API: the list, one job with its timeline and items, and an
//! operator's pause, resume and cancel, each audited with the reason given.

use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use serde::Deserialize;

use super::handlers::{exact, ok, spawn_job, ApiResult, LimitQuery};
use super::input::MaybeStrict;
use super::{ApiError, AppState, Caller, Role};

/// The reason in an optional `{"reason": "…"}` body; none for an empty body.
fn reason_of(body: MaybeStrict) -> Result<Option<String>, ApiError> {
    #[derive(Deserialize)]
    struct B {
        reason: Option<String>,
    }
    let Some(v) = body.0 else {
        return Ok(None);
    };
    let b: B = exact(v, &[&["reason"]])?;
    Ok(b.reason.filter(|r| !r.trim().is_empty()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ItemsQuery {
    from_seq: Option<i32>,
    limit: Option<i64>,
}

/// `GET /api/dlq/jobs/{id}/items`: the job's letters in send order, what became of each, and
/// the letter each came back as.
pub(super) async fn dlq_job_items(
    State(s): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<ItemsQuery>, QueryRejection>,
) -> ApiResult {
    let Query(q) = q.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    let items = s
        .dlq
        .job_items(
            job_id(&id)?,
            q.from_seq.unwrap_or(1),
            q.limit.unwrap_or(200),
        )
        .await?;
    ok(items)
}

/// `GET /api/dlq/jobs/{id}/events`: the job's timeline.
pub(super) async fn dlq_job_events(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    ok(s.dlq.job_events(job_id(&id)?).await?)
}

pub(super) async fn dlq_jobs(
    State(s): State<AppState>,
    q: Result<Query<LimitQuery>, QueryRejection>,
) -> ApiResult {
    let Query(q) = q.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    ok(s.dlq.jobs(q.limit.unwrap_or(50)).await?)
}

fn job_id(id: &str) -> Result<i64, ApiError> {
    super::input::path_id(id, "job")
}

pub(super) async fn dlq_job(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    ok(s.dlq.job(job_id(&id)?).await?)
}

/// The job named in the path, if the caller may act on it: operators act on their own jobs,
/// admins on anyone's.
async fn own_job(s: &AppState, c: &Caller, id: &str) -> Result<crate::dlq::Job, ApiError> {
    let j = s.dlq.job(job_id(id)?).await?;
    if c.role < Role::Admin && j.created_by != c.holder {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            format!(
                "job {} belongs to {}; acting on others' jobs needs admin",
                j.id, j.created_by
            ),
        ));
    }
    Ok(j)
}

pub(super) async fn dlq_job_pause(
    State(s): State<AppState>,
    Extension(c): Extension<Caller>,
    Path(id): Path<String>,
    body: MaybeStrict,
) -> ApiResult {
    let reason = reason_of(body)?;
    let j = own_job(&s, &c, &id).await?;
    ok(s.dlq.pause_job(j.id, &c.holder, reason.as_deref()).await?)
}

pub(super) async fn dlq_job_cancel(
    State(s): State<AppState>,
    Extension(c): Extension<Caller>,
    Path(id): Path<String>,
    body: MaybeStrict,
) -> ApiResult {
    let reason = reason_of(body)?;
    let j = own_job(&s, &c, &id).await?;
    // Cancelling cannot be undone: the operator says why.
    let Some(reason) = reason else {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "cancelling a job needs a reason: {\"reason\": \"…\"}".into(),
        ));
    };
    ok(s.dlq.cancel_job(j.id, &c.holder, Some(&reason)).await?)
}

pub(super) async fn dlq_job_resume(
    State(s): State<AppState>,
    Extension(c): Extension<Caller>,
    Path(id): Path<String>,
    body: MaybeStrict,
) -> ApiResult {
    let reason = reason_of(body)?;
    let reason = crate::dlq::check_reason(reason.as_deref())?.map(str::to_owned);
    let j = own_job(&s, &c, &id).await?;
    let id = j.id;
    use crate::dlq::JobStatus as J;
    if !matches!(j.status, J::Pending | J::Paused | J::Running) {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "job {id} is {:?}: only pending, running or paused jobs resume",
                j.status
            )
            .to_lowercase(),
        ));
    }
    // Right after a pause, this server's runner may still be waiting for its pacer (up to
    // 1/rate s) before it sees the pause and ends: a paused job waits for it, briefly, rather
    // than answering "already running".
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    // The runner audits the resume when it takes the job up: a resume refused there (another
    // process runs the job) leaves no audit row.
    let start = || crate::dlq::Start::Resume(Some((c.holder.clone(), reason.clone())));
    while !spawn_job(&s, id, start()).await {
        if j.status != J::Paused || tokio::time::Instant::now() >= deadline {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!("job {id} is already running here"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok((StatusCode::ACCEPTED, Json(s.dlq.job(id).await?)).into_response())
}
