//! Commit groups: several messages of per-message handlers in one transaction, so a backlog
//! pays one `BEGIN`/`COMMIT` (and one WAL flush) per group instead of per message.
//!
//! The runtime forms a group only from heads already waiting in different lanes (different
//! keys, so per-key order is untouched), and only when more are waiting than there are free
//! handler slots: at low load every message still has its own transaction and nobody waits
//! for company. The group's inbox marks are one statement; each handler then runs under its
//! own savepoint, sent ahead of the handler's first statement (no extra round trip):
//!
//! ```text
//! BEGIN
//!   INSERT INTO processed_messages … unnest(A, B, C) … RETURNING   -- B is a duplicate
//!   SAVEPOINT m; <handler A's statements>                          -- pipelined
//!   SAVEPOINT m; <handler C fails>; ROLLBACK TO SAVEPOINT m; DELETE C's mark
//! COMMIT                                                           -- A's work + mark only
//! ```
//!
//! What each message is promised is unchanged: its handler's changes and its inbox mark commit
//! together or not at all. A handler that fails (or panics) loses only its own work and mark
//! and is then processed alone by [`super::process::process_from`] — retries, breaker, dead
//! letter, that failed try counting as its first attempt — after the group committed. If the group's transaction itself fails (the database went
//! away, the commit failed), every message of the group is processed alone.

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use tracing::Instrument as _;

use std::sync::Arc;

use super::envelope::{Envelope, Fate, InGroup};
use super::handler::{Delivered, Handler, HandlerError};
use super::inbox::InboxOutcome;
use super::process::{process, process_from};
use super::stats::ConsumerStats;
use super::tx::{connection, count, handle_span, handler_seconds};
use super::{HandlerRef, Shared};

/// Processes `envs` (heads of different lanes) as one commit group; returns each one's fate.
pub(super) async fn process_group(envs: &[&Envelope], shared: &Shared) -> Vec<Fate> {
    let run = async {
        match &shared.config.driver {
            super::Driver::TokioPostgres => run_group(envs, shared).await,
            #[cfg(feature = "sqlx")]
            super::Driver::Sqlx(pool) => super::sqlx::run_group(envs, shared, pool).await,
        }
    };
    let outcomes = match run
        .instrument(tracing::debug_span!(
            "outbox.commit_group",
            size = envs.len()
        ))
        .await
    {
        Ok(o) => o,
        Err(e) => {
            tracing::debug!(error = %e, size = envs.len(), "commit group failed: processing its messages one by one");
            envs.iter().map(|_| InGroup::Alone).collect()
        }
    };
    let mut fates = Vec::with_capacity(envs.len());
    for (env, outcome) in envs.iter().zip(outcomes) {
        let topic = &env.origin.topic;
        fates.push(match outcome {
            InGroup::Processed => {
                ConsumerStats::inc(&shared.stats.handled);
                count(shared, topic, "handled", 1);
                if let Some(b) = shared.breaker() {
                    b.record_call(None);
                }
                Fate::Final
            }
            InGroup::Duplicate => {
                ConsumerStats::inc(&shared.stats.duplicates);
                count(shared, topic, "duplicate", 1);
                Fate::Final
            }
            InGroup::Failed(tried) => process_from(env, shared, Some(tried)).await,
            InGroup::Alone => process(env, shared).await,
        });
    }
    fates
}

/// The group's transaction. An `Err` means it did not commit: nothing of it happened.
async fn run_group(envs: &[&Envelope], shared: &Shared) -> Result<Vec<InGroup>, HandlerError> {
    let mut conn = connection(shared).await?;
    let tx = conn.transaction().await?;
    let singles: Vec<Option<(&Delivered, &Arc<dyn Handler>)>> = envs
        .iter()
        .map(|env| {
            let d = env.decoded.as_ref().ok()?;
            match shared.handlers.get(d.route())? {
                HandlerRef::Single(h) => Some((d, h)),
                _ => None,
            }
        })
        .collect();
    // Every mark of the group in one statement; a message that fails has its mark taken back.
    let keys: Vec<(&str, &str)> = singles
        .iter()
        .flatten()
        .map(|(d, _)| (d.topic.as_str(), d.message_id.as_str()))
        .collect();
    let mut fresh = shared.inbox.mark_many(&*tx, &keys).await?;
    let mut outcomes = Vec::with_capacity(envs.len());
    for (env, single) in envs.iter().zip(singles) {
        let Some((d, h)) = single else {
            outcomes.push(InGroup::Alone);
            continue;
        };
        // The first of a repeated pair is the delivery; the rest are duplicates.
        if !fresh.remove(&(d.topic.clone(), d.message_id.clone())) {
            outcomes.push(InGroup::Duplicate);
            continue;
        }
        let started = std::time::Instant::now();
        // The savepoint is sent ahead of the handler's first statement, not waited for:
        // tokio-postgres pipelines requests polled together, and the server runs them in order.
        let (savepoint, handled) = futures::join!(
            tx.batch_execute("SAVEPOINT m"),
            AssertUnwindSafe(h.handle(d, &tx))
                .catch_unwind()
                .instrument(handle_span(d, shared))
        );
        handler_seconds(shared, &env.origin.topic, started);
        savepoint?;
        match handled {
            Ok(Ok(())) => outcomes.push(InGroup::Processed),
            failed => {
                tx.batch_execute("ROLLBACK TO SAVEPOINT m").await?;
                shared.inbox.unmark(&*tx, &d.topic, &d.message_id).await?;
                outcomes.push(InGroup::Failed(
                    failed.map(|r| r.map(|()| InboxOutcome::Processed)),
                ));
            }
        }
    }
    // A handler that swallowed its statement's error left the transaction aborted; `COMMIT`
    // would roll back without an error and every member would count as handled.
    super::tx::live(&tx).await?;
    tx.commit().await?;
    shared.pg_outage.ok();
    Ok(outcomes)
}
