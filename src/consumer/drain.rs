//! Parked letters: parking a message whose dependency is down, and draining parked letters
//! when the breaker closes (envelope policies, freshness check, park again, drop by policy),
//! each settled in the archive.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;

use futures::FutureExt;
use tracing::{warn, Instrument as _};

use super::envelope::Envelope;
use crate::backoff::Backoff;
use crate::consumer::breaker::first_failed;
use crate::consumer::dead_letter::*;
use crate::consumer::envelope::Fate;
use crate::consumer::handler::Freshness;
use crate::consumer::inbox::InboxOutcome;
use crate::consumer::process::*;
use crate::consumer::retry::RetryStrategy;
use crate::consumer::tx::{count, handle_span};
use crate::consumer::Shared;

/// A parked letter read back during a drain: envelope policies, freshness check, then the
/// handler like any message (same inbox, so a letter already handled is a duplicate).
pub(in crate::consumer) async fn process_drain(env: &Envelope, shared: &Shared) -> Fate {
    let Some(b) = shared.breaker() else {
        return Fate::Final;
    };
    let (raw, origin) = (&env.raw, &env.origin);
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
    if shared.tx.kind(d.route()).is_none() {
        return Fate::Final;
    }
    let mut attempt: u32 = 0;
    let mut outage = Backoff::default();
    loop {
        attempt += 1;
        let result = AssertUnwindSafe(run_in_tx(shared, d))
            .catch_unwind()
            .instrument(handle_span(d, shared))
            .await;
        let err = match result {
            Ok(Ok(outcome)) => {
                let what = if outcome == InboxOutcome::Processed {
                    "handled"
                } else {
                    "duplicate"
                };
                count(shared, &origin.topic, what, 1);
                b.drained.fetch_add(1, Ordering::Relaxed);
                if outcome == InboxOutcome::Processed {
                    // A call that worked after the breaker expired: trust it again.
                    b.confirm().await;
                }
                settle(env, shared, "replayed", "drain").await;
                return Fate::Final;
            }
            Err(panic) => {
                let text = format!("panic: {}", panic_text(panic.as_ref()));
                return dead_letter(raw, origin, shared, DeadLetterKind::Panic, &text, attempt)
                    .await;
            }
            Ok(Err(e)) => e,
        };
        if err.is_database_unavailable() {
            attempt -= 1;
            let wait = outage.next_delay();
            tokio::select! {
                () = shared.cancel.cancelled() => return Fate::Abandoned,
                () = tokio::time::sleep(wait) => {}
            }
            continue;
        }
        if let Some(dep) = err.dependency() {
            // The dependency failed again during the drain: re-open (for longer) and park.
            b.probes.fetch_add(1, Ordering::Relaxed);
            b.open(dep, err.message()).await;
            return repark_after(
                env,
                shared,
                err.message(),
                DeadLetterKind::Unavailable,
                attempt,
            )
            .await;
        }
        if !err.is_transient() {
            return dead_letter(
                raw,
                origin,
                shared,
                DeadLetterKind::Permanent,
                err.message(),
                attempt,
            )
            .await;
        }
        let attempts = match &shared.config.retry {
            RetryStrategy::InPlace { attempts, .. } => *attempts,
            RetryStrategy::Topics { .. } => 1,
        };
        if attempt >= attempts {
            return repark_after(
                env,
                shared,
                err.message(),
                DeadLetterKind::TransientExhausted,
                attempt,
            )
            .await;
        }
        tokio::select! {
            () = shared.cancel.cancelled() => return Fate::Abandoned,
            () = tokio::time::sleep(b.config.retry_delay) => {}
        }
    }
}

/// Parks a drained letter again: a new dead letter with `x-dlq-retries + 1`; the record read
/// is settled (its offset moves on).
pub(in crate::consumer) async fn repark(
    env: &Envelope,
    shared: &Shared,
    error: &str,
    kind: DeadLetterKind,
) -> Fate {
    repark_after(env, shared, error, kind, 1).await
}

/// [`repark`] after `calls` calls of the handler (`x-attempts`).
async fn repark_after(
    env: &Envelope,
    shared: &Shared,
    error: &str,
    kind: DeadLetterKind,
    calls: u32,
) -> Fate {
    let f = dead_letter(&env.raw, &env.origin, shared, kind, error, calls).await;
    if let (Fate::Final, Some(b)) = (f, shared.breaker()) {
        b.reparked.fetch_add(1, Ordering::Relaxed);
        superseded(env, shared, kind).await;
    }
    f
}

/// The letter read during a drain now has a successor in the DLQ (parked again, or
/// dead-lettered for good): the archived copy is settled so operators act on the new one only.
pub(in crate::consumer) async fn superseded(env: &Envelope, shared: &Shared, kind: DeadLetterKind) {
    let reason = format!("drain: superseded by a new dead letter ({})", kind.as_str());
    settle(env, shared, "dropped", &reason).await;
}

/// Drops a parked letter by policy: never silently — recorded in the archive as `dropped`
/// with the reason, logged and counted.
pub(in crate::consumer) async fn drop_letter(
    env: &Envelope,
    shared: &Shared,
    reason: &'static str,
) -> Fate {
    warn!(group = %shared.config.group, topic = %env.origin.topic, offset = env.raw.offset,
          message_id = ?env.decoded.as_ref().ok().map(|d| d.message_id.as_str()), reason,
          "parked letter dropped by policy");
    if let Some(b) = shared.breaker() {
        b.dropped.fetch_add(1, Ordering::Relaxed);
    }
    count(shared, &env.origin.topic, "dropped", 1);
    metrics::counter!(crate::metrics::DLQ_DROPPED, "reason" => reason).increment(1);
    if !settle(env, shared, "dropped", reason).await {
        return Fate::Abandoned;
    }
    Fate::Final
}

/// Records a drained or dropped letter in `dead_letters` (inserted if the archive has not
/// seen it yet). Retries through a Postgres outage; false only at shutdown.
pub(in crate::consumer) async fn settle(
    env: &Envelope,
    shared: &Shared,
    status: &str,
    reason: &str,
) -> bool {
    let row = crate::dlq::Row::from_raw(&env.raw, &shared.config.dlq_suffix);
    let mut backoff = Backoff::default();
    loop {
        match shared.dlq.record_settled(&row, status, reason).await {
            Ok(()) => return true,
            Err(e) => {
                if backoff.failures() == 0 {
                    warn!(error = %e, "cannot record the letter's outcome in dead_letters; retrying");
                }
                tokio::select! {
                    () = shared.cancel.cancelled() => return false,
                    () = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
    }
}
