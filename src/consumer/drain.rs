//! Draining parked letters when the breaker closes: a letter's envelope policies (deadline,
//! most re-parks) and the freshness check decide whether it is handled at all; then it takes
//! the one processing path (`process.rs`), which settles it in the archive, parks it again or
//! dead-letters it.

use tracing::warn;

use super::breaker::first_failed;
use super::dead_letter::*;
use super::envelope::{Envelope, Fate};
use super::handler::Freshness;
use super::letters::{drop_letter, repark};
use super::process::process_from;
use super::Shared;

/// A parked letter read back during a drain: envelope policies, freshness check, then the
/// handler like any message (same inbox, so a letter already handled is a duplicate).
pub(in crate::consumer) async fn process_drain(env: &Envelope, shared: &Shared) -> Fate {
    let Some(b) = shared.breaker() else {
        return Fate::Final;
    };
    let raw = &env.raw;
    let Ok(d) = &env.decoded else {
        warn!(topic = %raw.topic, offset = raw.offset, "a parked letter does not decode; leaving it to operators");
        return Fate::Final;
    };
    let retries: u32 = raw
        .header(X_DLQ_RETRIES)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if first_failed(&raw.headers)
        .is_some_and(|t| t + b.config.deadline < std::time::SystemTime::now())
    {
        return drop_letter(env, shared, "deadline_exceeded").await;
    }
    if retries > b.config.max_dlq_retries {
        return drop_letter(env, shared, "max_dlq_retries").await;
    }
    if let Some(check) = &shared.freshness {
        match check.check(d).await {
            Freshness::Match => {}
            Freshness::Mismatch => return drop_letter(env, shared, "event_obsolete").await,
            Freshness::QueryFailed(why) => {
                warn!(message_id = %d.message_id, error = %why, "freshness check failed: parking the letter again");
                return repark(
                    env,
                    shared,
                    &format!("freshness check failed: {why}"),
                    DeadLetterKind::Unavailable,
                )
                .await;
            }
        }
    }
    // Then the one processing path, with a drained letter's endings.
    process_from(env, shared, None).await
}
