//! `/api/trace`: a message's journey. Viewers trace by message id or `#letter` only and see no
//! keys: ids, statuses and errors, never contents. Operators also search keys and body values
//! (among the newest rows). Either way the search runs two at a time, on the read pool, under a
//! statement timeout and a deadline for the whole search.

use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, AppState, Caller, Role};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TraceQuery {
    q: String,
}

/// A message's journey. Viewers trace by message id or `#letter` only and see no keys: ids,
/// statuses and errors, never contents. Operators also search keys and body values (among the
/// newest rows). Either way the search runs on a small pool under a statement timeout.
pub(super) async fn trace(
    State(s): State<AppState>,
    Extension(c): Extension<Caller>,
    q: Result<Query<TraceQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    use crate::journey::{self, Search};
    let Query(q) = q.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    if q.q.chars().count() > journey::MAX_QUERY {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("q: at most {} characters", journey::MAX_QUERY),
        ));
    }
    let search = if c.role >= Role::Operator {
        Search::Content
    } else if q.q.trim().is_empty() || journey::is_id_query(&q.q) {
        Search::Ids
    } else {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            format!(
                "{} is a viewer: trace by message id or #letter id; searching keys and bodies \
                 needs an operator",
                c.holder
            ),
        ));
    };
    let unavailable = |e: String| ApiError(StatusCode::SERVICE_UNAVAILABLE, e);
    // Two searches at a time; a third is told at once rather than holding a request slot.
    let _slot = s
        .trace_slots
        .clone()
        .try_acquire_owned()
        .map_err(|_| unavailable("two searches are running: try again".into()))?;
    let conn = s.reads().await?;
    conn.batch_execute(&format!("SET statement_timeout = '{TRACE_TIMEOUT_SECS}s'"))
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    let too_long = || {
        unavailable(format!(
            "the search took longer than {TRACE_TIMEOUT_SECS} s: trace by message id or #letter id"
        ))
    };
    // Each statement has the timeout; the whole search has it too.
    let limit = Duration::from_secs(TRACE_TIMEOUT_SECS.into());
    let found = tokio::time::timeout(limit, journey::trace_on(&conn, &s.db, &q.q, search)).await;
    let Ok(found) = found else {
        // A statement may still be running on it: this connection leaves the pool.
        drop(deadpool_postgres::Object::take(conn));
        return Err(too_long());
    };
    conn.batch_execute(READS_TIMEOUT_SQL)
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    let mut found = found.map_err(|e| {
        if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) {
            too_long()
        } else {
            unavailable(e.to_string())
        }
    })?;
    if search == Search::Ids {
        found
            .iter_mut()
            .for_each(journey::MessageJourney::redact_keys);
    }
    Ok(Json(json!({ "query": q.q, "messages": found })).into_response())
}

/// The longest a trace search may run.
const TRACE_TIMEOUT_SECS: u32 = 5;
/// Back to the pool's own timeout after a search.
const READS_TIMEOUT_SQL: &str = "RESET statement_timeout";
