//! Edit and retry: an operator's corrected body (and headers) for a letter no code fix will
//! ever make valid, sent as a new message through a one-letter replay job. The letter stays
//! as it was; the audit row and the job's item keep both.

use serde_json::json;
use tracing::info;

use super::*;
use crate::dlq::DeadLetter;
use crate::sql;
use crate::wire::HEADER_MESSAGE_ID;
use crate::wire::{HeaderValue, SERVICE_HEADERS, X_EDITED_FROM};

/// The largest edited body accepted (the admin API's request limit is smaller).
pub const MAX_EDITED_BODY: usize = 1024 * 1024;

/// What an operator changed in a letter before retrying it.
#[derive(Debug, Clone, Default)]
pub struct Edit {
    /// The body to send, already encoded for the topic (framed when it has a schema).
    pub body: Vec<u8>,
    /// The headers to send instead of the letter's (name, value; `None` is a null header);
    /// `None` keeps the letter's. Service headers and `message_id` are the framework's.
    pub headers: Option<Vec<(String, Option<String>)>>,
    /// Why (required, audited).
    pub reason: String,
    /// Who (audited).
    pub actor: String,
}

/// The job an edit and retry created and the message id its record carries.
#[derive(Debug, Clone, Serialize)]
pub struct EditedRetry {
    /// The one-letter job that sends it.
    pub job: Job,
    /// The new message's id (the original's is in its `x-edited-from` header).
    pub message_id: String,
    /// The original's message id, when it had one.
    pub edited_from: Option<String>,
}

impl Dlq {
    /// Creates a one-letter replay job that sends letter `letter` with `edit`'s body and
    /// headers as a new message (a new `message_id`, `x-edited-from` naming the original),
    /// audited as `edit-retry` in the same transaction. Run it with [`Dlq::run_job`].
    ///
    /// # Errors
    /// [`DlqError::NotFound`] for an unknown letter; [`DlqError::Invalid`] for a dropped letter,
    /// one pending in another job, an empty reason or actor, a body over [`MAX_EDITED_BODY`],
    /// or a bad header name.
    pub async fn edit_and_retry(&self, letter: i64, edit: &Edit) -> Result<EditedRetry, DlqError> {
        check_actor(&edit.actor)?;
        let Some(reason) = check_reason(Some(&edit.reason))? else {
            return invalid("an edit needs a reason");
        };
        if edit.body.len() > MAX_EDITED_BODY {
            return invalid(format!("the edited body is over {MAX_EDITED_BODY} bytes"));
        }
        let original = self.show(letter).await?;
        let headers = edited_headers(&original, edit.headers.as_deref())?;
        let new_id = uuid::Uuid::now_v7().to_string();
        let mut out = headers;
        out.push((
            HEADER_MESSAGE_ID.to_owned(),
            Some(new_id.clone().into_bytes()),
        ));
        if let Some(m) = &original.message_id {
            out.push((X_EDITED_FROM.to_owned(), Some(m.clone().into_bytes())));
        }
        let opts = ReplayOptions {
            rate: 1.0,
            canary: 0,
            actor: edit.actor.clone(),
            force: true,
            ..ReplayOptions::default()
        };
        let filter = Self::prepare(
            &Filter {
                ids: vec![letter],
                ..Filter::default()
            },
            &opts,
        )?;
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;
        tx.execute(sql::locks::CREATE_JOB, &[&self.schema.name()])
            .await?;
        self.check_ids(&*tx, &[letter], &[Status::New, Status::Replayed])
            .await?;
        // The letter must not be pending in another job (which would send it too).
        if self.selection(&*tx, &filter, &opts).await?.is_empty() {
            return invalid(format!(
                "letter {letter} is waiting in an unfinished replay job: cancel that job (or let it finish) first"
            ));
        }
        // The editor shows JSON pretty-printed: the same value re-indented is no change.
        let same_body = match (original.body.as_deref(), edit.body.as_slice()) {
            (Some(a), b) if a == b => true,
            (Some(a), b) => serde_json::from_slice::<serde_json::Value>(a)
                .ok()
                .zip(serde_json::from_slice::<serde_json::Value>(b).ok())
                .is_some_and(|(x, y)| x == y),
            (None, b) => b.is_empty(),
        };
        let changed: Vec<&str> = [
            Some("body").filter(|_| !same_body),
            edit.headers.as_ref().map(|_| "headers"),
        ]
        .into_iter()
        .flatten()
        .collect();
        let recorded = json!({
            "edit_of": letter,
            "topic": original.original_topic,
            "message_id": new_id,
            "edited_from": original.message_id,
            "changed": changed,
            "body_bytes": edit.body.len(),
        });
        let audit_id: i64 = tx
            .query_one(
                &self.sql(sql::dead_letters::AUDIT_EDIT),
                &[&edit.actor, &recorded, &letter, &reason],
            )
            .await?
            .get(0);
        let job_id: i64 = tx
            .query_one(
                &self.sql(sql::replay_jobs::INSERT_JOB),
                &[
                    &edit.actor,
                    &audit_id,
                    &recorded,
                    &None::<String>,
                    &opts.rate,
                    &0_i32,
                    &0_i64,
                    &opts.max_refail,
                    &(i64::try_from(opts.watch.as_millis()).unwrap_or(i64::MAX)),
                ],
            )
            .await?
            .get(0);
        tx.execute(
            &self.sql(sql::dead_letters::AUDIT_EDIT_JOB),
            &[&audit_id, &job_id],
        )
        .await?;
        tx.execute(
            &self.sql(sql::replay_jobs::INSERT_EDITED_ITEM),
            &[&job_id, &letter, &edit.body, &crate::wire::to_json(&out)],
        )
        .await?;
        tx.commit().await?;
        info!(job = job_id, letter, actor = %edit.actor, "edited retry created");
        Ok(EditedRetry {
            job: self.job(job_id).await?,
            message_id: new_id,
            edited_from: original.message_id,
        })
    }
}

/// Headers the framework sets on an edited retry (service headers, `message_id`,
/// `x-edited-from`, the replay's): never taken from the letter or the operator.
pub(crate) fn framework_header(k: &str) -> bool {
    SERVICE_HEADERS.contains(&k)
        || [HEADER_MESSAGE_ID, X_EDITED_FROM].contains(&k)
        || k.starts_with("x-replay")
}

/// Kafka headers as sent: names and optional byte values, in order.
type RawHeaders = Vec<(String, Option<Vec<u8>>)>;

/// The headers an edited retry carries before the framework's own: the operator's, or the
/// letter's, without service headers, `message_id` or an earlier edit's `x-edited-from`.
fn edited_headers(
    original: &DeadLetter,
    given: Option<&[(String, Option<String>)]>,
) -> Result<RawHeaders, DlqError> {
    let framework = framework_header;
    match given {
        Some(h) => {
            if h.len() > 100 {
                return invalid("at most 100 headers");
            }
            for (k, v) in h {
                if k.is_empty() || k.len() > 255 || k.contains('\0') {
                    return invalid(format!("invalid header name {k:?}"));
                }
                if v.as_ref()
                    .is_some_and(|v| v.contains('\0') || v.len() > 64 * 1024)
                {
                    return invalid(format!("invalid value of header {k:?}"));
                }
            }
            Ok(h.iter()
                .filter(|(k, _)| !framework(k))
                .map(|(k, v)| (k.clone(), v.clone().map(String::into_bytes)))
                .collect())
        }
        // Unedited headers go as they were, binary ones included.
        None => Ok(original
            .headers
            .iter()
            .filter(|(k, _)| !framework(k))
            .map(|(k, v)| {
                (
                    k.clone(),
                    match v {
                        HeaderValue::Null => None,
                        HeaderValue::Bytes(b) => Some(b.clone()),
                    },
                )
            })
            .collect()),
    }
}
