//! The keys consumer groups hold in strict per-key order, for operators: which key, behind
//! which failed message (and its archived letter, to replay or drop), how many wait, since when.

use std::time::SystemTime;

use serde::Serialize;

use super::{Dlq, DlqError};
use crate::message::rfc3339;
use crate::sql;

/// At most this many holds per listing.
pub const MAX_HOLDS_LISTED: i64 = 1000;

/// A key held behind a failed message (strict per-key order).
#[derive(Debug, Clone, Serialize)]
pub struct HeldKey {
    /// The consumer group that holds it.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// The key (UTF-8, lossy); `None` in a viewer's answer (keys are contents).
    pub key: Option<String>,
    /// The message the key waits for.
    pub head_message_id: Option<String>,
    /// The head's newest archived letter: resolve the hold by replaying or dropping it.
    pub head_letter: Option<i64>,
    /// `dead` (in the DLQ), `retrying` (on a retry topic) or `released` (being let through).
    pub state: String,
    /// Since when the key is held (RFC 3339).
    pub since: String,
    /// How long, in seconds.
    pub age_secs: f64,
    /// When the group's expiry ends it, if it has one.
    pub expires_at: Option<String>,
    /// Messages waiting behind the head.
    pub waiting: i64,
    /// Why it was released, once it is.
    pub released_reason: Option<String>,
}

impl Dlq {
    /// The held keys of every group, oldest first, at most `limit` (capped at
    /// [`MAX_HOLDS_LISTED`]).
    ///
    /// # Errors
    /// [`DlqError`] when Postgres fails.
    pub async fn held_keys(&self, limit: i64) -> Result<Vec<HeldKey>, DlqError> {
        let c = self.pool.get().await?;
        let now = SystemTime::now();
        Ok(c.query(
            &self.sql(sql::holds::LIST),
            &[&limit.clamp(1, MAX_HOLDS_LISTED)],
        )
        .await?
        .iter()
        .map(|r| {
            let since: SystemTime = r.get(5);
            HeldKey {
                group: r.get(0),
                topic: r.get(1),
                key: Some(String::from_utf8_lossy(&r.get::<_, Vec<u8>>(2)).into_owned()),
                head_message_id: r.get(3),
                head_letter: r.get(9),
                state: r.get(4),
                since: rfc3339(since),
                age_secs: now.duration_since(since).map_or(0.0, |d| d.as_secs_f64()),
                expires_at: r.get::<_, Option<SystemTime>>(6).map(rfc3339),
                waiting: r.get(7),
                released_reason: r.get(8),
            }
        })
        .collect())
    }
}
