//! Edit and retry over the API: what the editor starts from (the body decoded through the
//! topic's schema where one is registered), and the edited letter sent as a new message.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};

use super::handlers::{exact, ok, spawn_job, ApiResult};
use super::input::Strict;
use super::{ApiError, AppState, Caller};
use crate::dlq::{Edit, HeaderValue};

fn letter_id(id: &str) -> Result<i64, ApiError> {
    super::input::path_id(id, "dead letter")
}

/// `GET /api/dlq/messages/{id}/editable` (operator): the letter's body as text to edit — JSON
/// pretty-printed, a framed body decoded through its schema — and its text headers.
pub(super) async fn editable(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let l = s.dlq.show(letter_id(&id)?).await?;
    let body = l.body.clone().unwrap_or_default();
    let (text, format, schema_id) = body_for_editing(&s, &body).await;
    let headers: Vec<Value> = l
        .headers
        .iter()
        // The framework sets these on the retry itself: not for editing.
        .filter(|(k, _)| !crate::dlq::framework_header(k))
        .map(|(k, v)| match v {
            HeaderValue::Null => json!([k, null]),
            HeaderValue::Bytes(b) => match std::str::from_utf8(b) {
                Ok(t) => json!([k, t]),
                Err(_) => json!([k, null, "binary"]),
            },
        })
        .collect();
    ok(json!({
        "letter": l.id,
        "topic": l.original_topic,
        "status": l.status,
        "message_id": l.message_id,
        "body_text": text,
        "format": format,
        "schema_id": schema_id,
        "headers": headers,
    }))
}

/// The body as the editor shows it: (text, format, schema id).
async fn body_for_editing(s: &AppState, body: &[u8]) -> (String, &'static str, Option<u32>) {
    #[cfg(feature = "schemas")]
    if let Some(schemas) = &s.limits.schemas {
        if crate::schemas::frame::is_framed(body) {
            if let Ok(d) = schemas.decode(body).await {
                let text = serde_json::to_string_pretty(&d.json).unwrap_or_default();
                return (text, "schema", Some(d.schema_id));
            }
        }
    }
    let _ = s;
    match std::str::from_utf8(body) {
        Ok(t) => match serde_json::from_str::<Value>(t) {
            Ok(v) => (
                serde_json::to_string_pretty(&v).unwrap_or_else(|_| t.to_owned()),
                "json",
                None,
            ),
            Err(_) => (t.to_owned(), "text", None),
        },
        Err(_) => (String::new(), "binary", None),
    }
}

#[derive(Deserialize)]
struct EditBody {
    body_text: String,
    headers: Option<Vec<(String, Option<String>)>>,
    reason: Option<String>,
}

/// `POST /api/dlq/messages/{id}/edit-retry` (operator): the edited body must be JSON and,
/// when the topic has a schema, valid against it (then encoded as the relay encodes); it goes
/// out as a new message naming the original, through a one-letter replay job started here.
pub(super) async fn edit_retry(
    State(s): State<AppState>,
    Extension(c): Extension<Caller>,
    Path(id): Path<String>,
    Strict(b): Strict,
) -> ApiResult {
    let b: EditBody = exact(b, &[&["body_text", "headers", "reason"]])?;
    let id = letter_id(&id)?;
    let reason = b.reason.unwrap_or_default();
    if reason.trim().is_empty() {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "an edited retry needs a reason (audited)".into(),
        ));
    }
    let json: Value = serde_json::from_str(&b.body_text).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("the body is not valid JSON: {e}"),
        )
    })?;
    let l = s.dlq.show(id).await?;
    let body = encode(&s, &l.original_topic, &json, &b.body_text).await?;
    let edit = Edit {
        body,
        headers: b.headers,
        reason,
        actor: c.holder.clone(),
    };
    let r = s.dlq.edit_and_retry(id, &edit).await?;
    spawn_job(&s, r.job.id, crate::dlq::Start::New).await;
    Ok((StatusCode::ACCEPTED, Json(r)).into_response())
}

/// The bytes to send: encoded through the topic's schema when it has one, else the JSON text
/// as the operator wrote it.
async fn encode(s: &AppState, topic: &str, json: &Value, text: &str) -> Result<Vec<u8>, ApiError> {
    #[cfg(feature = "schemas")]
    if let Some(schemas) = &s.limits.schemas {
        match schemas.for_topic(topic).await {
            Ok(Some(c)) => {
                return c.encode(json).map_err(|e| {
                    ApiError(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "the body does not match the schema of {topic} (id {}): {e}",
                            c.id
                        ),
                    )
                })
            }
            Ok(None) => {}
            Err(e) => {
                return Err(ApiError(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "the schema of {topic} could not be read, so the edit is not checked: {e}"
                    ),
                ))
            }
        }
    }
    let _ = (s, topic, json);
    Ok(text.as_bytes().to_vec())
}
