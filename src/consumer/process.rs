//! Processing one message (or a batch): the handler's try (its transaction with the inbox
//! mark, or a call handler's call and then its mark), in-place retries, forwarding to retry
//! topics, parking behind the breaker and dead letters — one path for main-topic messages
//! and for parked letters read back during a drain.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;

use futures::FutureExt;
use tracing::{debug, warn, Instrument as _};

use super::breaker::BreakerMode;
use super::dead_letter::*;
use super::driver::Kind;
use super::envelope::{Envelope, Fate, Left, Tried};
use super::handler::{Delivered, HandlerError};
use super::inbox::InboxOutcome;
use super::letters::{dead_letter, park, produce_until_acked, repark_after, settle};
use super::retry::RetryStrategy;
use super::stats::ConsumerStats;
use super::tx::{count, handle_span, handler_seconds};
use super::Shared;
use crate::backoff::Backoff;

/// One try of the message's handler: for an in-transaction handler its transaction (mark
/// first, then the handler; both commit or neither), for a call handler its call and then its
/// mark (`call.rs`).
pub(super) async fn run_in_tx(
    shared: &Shared,
    d: &Delivered,
) -> Result<InboxOutcome, HandlerError> {
    if shared.tx.kind(d.route()) == Some(Kind::Call) {
        return super::call::run_call(shared, d).await;
    }
    shared.tx.one(shared, d).await
}

/// A batch of heads of different lanes, all of one batch-handled type. On any failure the
/// batch is replayed message by message so each gets its own outcome.
pub(super) async fn process_batch(envs: &[&Envelope], shared: &Shared) -> Vec<Fate> {
    let ds: Vec<&Delivered> = envs
        .iter()
        .filter_map(|e| e.decoded.as_ref().ok())
        .collect();
    let uniform = ds.len() == envs.len()
        && ds.iter().all(|d| d.route() == ds[0].route())
        && matches!(shared.tx.kind(ds[0].route()), Some(Kind::Batch(_)));
    if !uniform {
        // Defensive: batches are formed only from one batch type; anything else goes one by one.
        return one_by_one(envs, shared).await;
    }
    let started = std::time::Instant::now();
    let tps: Vec<(Option<&str>, Option<&str>)> = ds
        .iter()
        .map(|d| {
            (
                d.header(crate::trace_context::TRACEPARENT),
                d.header(crate::trace_context::TRACESTATE),
            )
        })
        .collect();
    let span = crate::otel::process_batch(&ds[0].topic, &shared.config.group, &tps);
    let result = span
        .around(AssertUnwindSafe(shared.tx.batch(shared, &ds)).catch_unwind())
        .instrument(tracing::info_span!("outbox.handle_batch", size = ds.len(), group = %shared.config.group))
        .await;
    handler_seconds(shared, &ds[0].topic, started);
    span.set_str(
        crate::otel::attr::OUTCOME,
        match &result {
            Ok(Ok(_)) => "handled",
            _ => "one_by_one",
        },
    );
    span.end();
    match result {
        Ok(Ok((handled, dups))) => {
            count(shared, &ds[0].topic, "handled", handled as u64);
            count(shared, &ds[0].topic, "duplicate", dups as u64);
            shared
                .stats
                .handled
                .fetch_add(handled as u64, Ordering::Relaxed);
            shared
                .stats
                .duplicates
                .fetch_add(dups as u64, Ordering::Relaxed);
            envs.iter().map(|_| Fate::Final).collect()
        }
        Ok(Err(e)) => {
            debug!(error = %e, size = envs.len(), "batch failed: retrying its messages one by one");
            one_by_one(envs, shared).await
        }
        Err(_panic) => {
            debug!(
                size = envs.len(),
                "batch handler panicked: retrying its messages one by one"
            );
            one_by_one(envs, shared).await
        }
    }
}

/// Each of `envs` processed alone, in order.
pub(super) async fn one_by_one(envs: &[&Envelope], shared: &Shared) -> Vec<Fate> {
    let mut fates = Vec::with_capacity(envs.len());
    for env in envs {
        fates.push(process(env, shared).await);
    }
    fates
}

pub(super) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "handler panicked".into())
}

pub(super) async fn process(env: &Envelope, shared: &Shared) -> Fate {
    process_from(env, shared, None).await
}

/// The one processing path, for a message of a main or retry topic and for a parked letter
/// read back during a drain (`env.drain`, after the drain's own checks in `drain.rs`): tries
/// the handler, then by the failure's class retries in place, forwards to a retry topic,
/// parks behind the breaker or dead-letters. A drained letter differs only in its endings:
/// success settles its archived copy, a dependency still down re-opens the breaker and parks
/// it again, and transient failures get the in-place budget and are then parked again.
///
/// `first` is a try that already happened elsewhere (in a commit group, see
/// `commit_group.rs`): it counts as attempt 1.
///
/// In strict per-key order, a message that leaves for a retry topic or the DLQ holds its key
/// behind it (`holds.rs`).
pub(super) async fn process_from(env: &Envelope, shared: &Shared, first: Option<Tried>) -> Fate {
    process_traced(env, shared, first, crate::otel::Span::default()).await
}

/// [`process_from`] under a delivery span already opened (a commit group's member), or a new
/// one when `span` is off.
pub(super) async fn process_traced(
    env: &Envelope,
    shared: &Shared,
    first: Option<Tried>,
    span: crate::otel::Span,
) -> Fate {
    let fate = try_traced(env, shared, first, span).await;
    super::holds::after(env, shared, fate).await
}

/// [`process_from`] without the hold: what a release of held messages runs (it writes the
/// key's new head itself, under the hold's lock). One `process` span covers the delivery
/// (every in-place try), with its outcome.
pub(super) async fn try_message(env: &Envelope, shared: &Shared, first: Option<Tried>) -> Fate {
    try_traced(env, shared, first, crate::otel::Span::default()).await
}

async fn try_traced(
    env: &Envelope,
    shared: &Shared,
    first: Option<Tried>,
    span: crate::otel::Span,
) -> Fate {
    let span = if span.is_on() || !crate::otel::enabled() {
        span
    } else {
        crate::otel::process(&delivery(env, shared))
    };
    if !span.is_on() {
        return try_inner(env, shared, first).await;
    }
    crate::otel::in_delivery(span, try_inner(env, shared, first)).await
}

/// What a delivery's `process` span is opened with.
pub(super) fn delivery<'a>(env: &'a Envelope, shared: &'a Shared) -> crate::otel::Delivery<'a> {
    let raw = &env.raw;
    crate::otel::Delivery {
        topic: &raw.topic,
        group: &shared.config.group,
        partition: raw.partition,
        offset: raw.offset,
        message_id: env
            .decoded
            .as_ref()
            .map(|d| d.message_id.as_str())
            .unwrap_or_default(),
        key: raw.key.as_deref().and_then(|k| std::str::from_utf8(k).ok()),
        traceparent: raw.header(crate::trace_context::TRACEPARENT),
        tracestate: raw.header(crate::trace_context::TRACESTATE),
        link: raw.header(crate::otel::X_TRACE_LINK),
        hop: env.origin.hop,
        drain: env.drain,
        parenting: shared.config.trace_parenting,
    }
}

async fn try_inner(env: &Envelope, shared: &Shared, mut first: Option<Tried>) -> Fate {
    let (raw, origin) = (&env.raw, &env.origin);
    let d = match &env.decoded {
        Ok(d) => d,
        Err(reason) => {
            ConsumerStats::inc(&shared.stats.decode_errors);
            warn!(topic = %raw.topic, partition = raw.partition, offset = raw.offset, %reason, "undecodable message: dead-lettering");
            return dead_letter(raw, origin, shared, DeadLetterKind::Decode, reason, 0).await;
        }
    };
    if shared.tx.kind(d.route()).is_none() {
        if d.tombstone {
            // A delete marker nobody asked for: skipped and counted, never a dead letter.
            ConsumerStats::inc(&shared.stats.tombstones_skipped);
            count(shared, &origin.topic, "tombstone_skipped", 1);
            return Fate::Final;
        }
        ConsumerStats::inc(&shared.stats.skipped_unknown);
        count(shared, &origin.topic, "skipped", 1);
        debug!(message_type = %d.message_type, "no handler registered: skipped");
        return Fate::Final;
    }
    let mut attempt: u32 = 0;
    let mut dep_attempt: u32 = 0;
    // Every call of the handler (x-attempts on a parked letter), whatever the budget it spent.
    let mut calls: u32 = 0;
    let mut outage = Backoff::default();
    loop {
        attempt += 1;
        calls += 1;
        let result = match first.take() {
            Some(tried) => tried,
            None => {
                let started = std::time::Instant::now();
                let tried = AssertUnwindSafe(run_in_tx(shared, d))
                    .catch_unwind()
                    .instrument(handle_span(d, shared))
                    .await;
                handler_seconds(shared, &origin.topic, started);
                tried
            }
        };
        let err = match result {
            Ok(Ok(outcome)) if env.drain => {
                let what = if outcome == InboxOutcome::Processed {
                    "handled"
                } else {
                    "duplicate"
                };
                count(shared, &origin.topic, what, 1);
                if let Some(b) = shared.breaker() {
                    b.drained.fetch_add(1, Ordering::Relaxed);
                    if outcome == InboxOutcome::Processed {
                        // A call that worked after the breaker expired: trust it again.
                        b.confirm().await;
                    }
                }
                settle(env, shared, "replayed", "drain").await;
                return Fate::Final;
            }
            Ok(Ok(InboxOutcome::Processed)) => {
                shared.pg_outage.ok();
                ConsumerStats::inc(&shared.stats.handled);
                if d.tombstone {
                    ConsumerStats::inc(&shared.stats.tombstones_handled);
                }
                count(shared, &origin.topic, "handled", 1);
                if let Some(b) = shared.breaker() {
                    b.record_call(None);
                    if b.mode() == BreakerMode::Probe {
                        b.confirm().await;
                    }
                }
                return Fate::Final;
            }
            Ok(Ok(InboxOutcome::Duplicate)) => {
                ConsumerStats::inc(&shared.stats.duplicates);
                count(shared, &origin.topic, "duplicate", 1);
                return Fate::Final;
            }
            Err(panic) => {
                ConsumerStats::inc(&shared.stats.panics);
                let text = format!("panic: {}", panic_text(panic.as_ref()));
                warn!(message_id = %d.message_id, error = %text, "handler panicked: dead-lettering");
                return dead_letter(raw, origin, shared, DeadLetterKind::Panic, &text, attempt)
                    .await;
            }
            Ok(Err(e)) => e,
        };
        if err.is_database_unavailable() {
            // Our database is down: not this message's fault, so no attempt is spent.
            attempt -= 1;
            calls -= 1;
            ConsumerStats::inc(&shared.stats.outage_waits);
            let wait = outage.next_delay();
            shared.pg_outage.failed(&format!(
                "database unavailable: holding messages until it is back: {err}"
            ));
            tokio::select! {
                () = shared.cancel.cancelled() => return Fate::Abandoned,
                () = tokio::time::sleep(wait) => {}
            }
            continue;
        }
        if let (Some(dep), Some(b)) = (err.dependency(), shared.breaker()) {
            if env.drain {
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
            // A downstream outage: a few quick retries, then the shared breaker opens and the
            // message is parked. Once the breaker is open, park at once.
            dep_attempt += 1;
            let rate_crossed = b.record_call(Some(dep));
            if b.mode() == BreakerMode::Probe {
                // The probe failed: the dependency is still down. Re-open at once (for twice
                // as long), no in-place retries against it.
                b.probes.fetch_add(1, Ordering::Relaxed);
                b.open(dep, err.message()).await;
                return park(raw, origin, shared, err.message(), calls).await;
            }
            if b.is_open(dep) || b.mode() != BreakerMode::Normal {
                return park(raw, origin, shared, err.message(), calls).await;
            }
            if dep_attempt < b.config.attempts && !rate_crossed {
                attempt -= 1;
                ConsumerStats::inc(&shared.stats.in_place_retries);
                count(shared, &origin.topic, "retried", 1);
                tokio::select! {
                    () = shared.cancel.cancelled() => return Fate::Abandoned,
                    () = tokio::time::sleep(b.config.retry_delay) => {}
                }
                continue;
            }
            b.open(dep, err.message()).await;
            return park(raw, origin, shared, err.message(), calls).await;
        }
        if !err.is_transient() {
            warn!(message_id = %d.message_id, error = %err, "permanent failure: dead-lettering");
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
        if let (true, Some(b)) = (env.drain, shared.breaker()) {
            // A drained letter is not forwarded to retry topics: the in-place budget (one try
            // with retry topics), then it is parked again.
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
            continue;
        }
        match &shared.config.retry {
            RetryStrategy::InPlace {
                attempts,
                base,
                max,
            } => {
                if attempt >= *attempts {
                    warn!(message_id = %d.message_id, error = %err, attempt, "retries exhausted: dead-lettering");
                    return dead_letter(
                        raw,
                        origin,
                        shared,
                        DeadLetterKind::TransientExhausted,
                        err.message(),
                        attempt,
                    )
                    .await;
                }
                ConsumerStats::inc(&shared.stats.in_place_retries);
                count(shared, &origin.topic, "retried", 1);
                let wait = RetryStrategy::in_place_delay(*base, *max, attempt);
                debug!(message_id = %d.message_id, error = %err, ?wait, "transient failure: retrying in place");
                tokio::select! {
                    () = shared.cancel.cancelled() => return Fate::Abandoned,
                    () = tokio::time::sleep(wait) => {}
                }
            }
            RetryStrategy::Topics { delays } => {
                let hop = origin.hop as usize;
                if hop >= delays.len() {
                    return dead_letter(
                        raw,
                        origin,
                        shared,
                        DeadLetterKind::TransientExhausted,
                        err.message(),
                        origin.hop + 1,
                    )
                    .await;
                }
                let topic = shared.config.retry_topic(&origin.topic, delays[hop]);
                let headers = rebuild(
                    &raw.headers,
                    &[
                        X_RETRY_ATTEMPT,
                        X_ERROR,
                        X_ORIGINAL_TOPIC,
                        X_ORIGINAL_PARTITION,
                        X_ORIGINAL_OFFSET,
                        X_CONSUMER_GROUP,
                    ],
                    &[
                        (X_RETRY_ATTEMPT, (hop + 1).to_string()),
                        (X_CONSUMER_GROUP, shared.config.group.clone()),
                        (X_ORIGINAL_TOPIC, origin.topic.clone()),
                        (X_ORIGINAL_PARTITION, origin.partition.to_string()),
                        (X_ORIGINAL_OFFSET, origin.offset.to_string()),
                        (X_ERROR, cut(err.message())),
                    ],
                );
                debug!(message_id = %d.message_id, %topic, "transient failure: forwarding to retry topic");
                return if produce_until_acked(shared, &topic, None, raw, headers, "retry").await {
                    ConsumerStats::inc(&shared.stats.forwarded_to_retry);
                    count(shared, &origin.topic, "retried", 1);
                    Fate::Left(Left::Retrying)
                } else {
                    Fate::Abandoned
                };
            }
        }
    }
}
