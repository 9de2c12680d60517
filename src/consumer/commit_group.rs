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
//! BEGIN                                                          -- the recipe: `driver/`
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

use super::envelope::{Envelope, Fate, InGroup};
use super::process::process_traced;
use super::stats::ConsumerStats;
use super::tx::count;
use super::Shared;

/// Processes `envs` (heads of different lanes) as one commit group; returns each one's fate.
pub(super) async fn process_group(envs: &[&Envelope], shared: &Shared) -> Vec<Fate> {
    // Each member's delivery span, current while its handler runs under its savepoint; a
    // member that failed (or was not tried) keeps it for the processing that follows.
    let spans: Vec<crate::otel::Span> = if crate::otel::enabled() {
        envs.iter()
            .map(|env| crate::otel::process(&super::process::delivery(env, shared)))
            .collect()
    } else {
        Vec::new()
    };
    let spans = std::sync::Arc::new(spans);
    let outcomes = crate::otel::in_group(spans.clone(), shared.tx.group(shared, envs)).await;
    let spans = std::sync::Arc::try_unwrap(spans).unwrap_or_default();
    let outcomes = match outcomes {
        Ok(o) => o,
        Err(e) => {
            tracing::debug!(error = %e, size = envs.len(), "commit group failed: processing its messages one by one");
            envs.iter().map(|_| InGroup::Alone).collect()
        }
    };
    let mut spans = spans.into_iter();
    let mut fates = Vec::with_capacity(envs.len());
    for (env, outcome) in envs.iter().zip(outcomes) {
        let topic = &env.origin.topic;
        let span = spans.next().unwrap_or_default();
        fates.push(match outcome {
            InGroup::Processed => {
                ConsumerStats::inc(&shared.stats.handled);
                count(shared, topic, "handled", 1);
                span.set_str(crate::otel::attr::OUTCOME, "handled");
                if let Some(b) = shared.breaker() {
                    b.record_call(None);
                }
                Fate::Final
            }
            InGroup::Duplicate => {
                ConsumerStats::inc(&shared.stats.duplicates);
                count(shared, topic, "duplicate", 1);
                span.set_str(crate::otel::attr::OUTCOME, "duplicate");
                Fate::Final
            }
            InGroup::Failed(tried) => process_traced(env, shared, Some(tried), span).await,
            InGroup::Alone => process_traced(env, shared, None, span).await,
        });
    }
    fates
}
