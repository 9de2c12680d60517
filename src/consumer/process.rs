//! Processing one message (or a batch): the handler's transaction with the inbox mark (or a
//! call handler's call, then its mark),
//! in-place retries, forwarding to retry topics, dead letters written until acknowledged.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use futures::FutureExt;
use rdkafka::producer::FutureRecord;
use rdkafka::util::Timeout;
use tracing::{debug, warn, Instrument as _};

use super::breaker::BreakerMode;
use super::dead_letter::*;
use super::driver::Kind;
use super::envelope::{Envelope, Fate, Tried};
use super::handler::{Delivered, HandlerError};
use super::inbox::InboxOutcome;
use super::record::{Origin, Raw};
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
    let result = AssertUnwindSafe(shared.tx.batch(shared, &ds))
        .catch_unwind()
        .instrument(tracing::info_span!("outbox.handle_batch", size = ds.len(), group = %shared.config.group))
        .await;
    handler_seconds(shared, &ds[0].topic, started);
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

/// [`process`], when the first try already happened elsewhere (in a commit group, see
/// `commit_group.rs`) and gave `first`: it counts as attempt 1.
pub(super) async fn process_from(
    env: &Envelope,
    shared: &Shared,
    mut first: Option<Tried>,
) -> Fate {
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
                return if produce_until_acked(shared, &topic, None, raw, headers).await {
                    ConsumerStats::inc(&shared.stats.forwarded_to_retry);
                    count(shared, &origin.topic, "retried", 1);
                    Fate::Final
                } else {
                    Fate::Abandoned
                };
            }
        }
    }
}

pub(super) async fn dead_letter(
    raw: &Raw,
    origin: &Origin,
    shared: &Shared,
    kind: DeadLetterKind,
    error: &str,
    attempts: u32,
) -> Fate {
    let now = crate::message::rfc3339(SystemTime::now());
    let dlq_retries = raw
        .header(X_DLQ_RETRIES)
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |n| n.saturating_add(1));
    let first_failed = raw
        .header(X_FIRST_FAILED_AT)
        .map_or_else(|| now.clone(), str::to_owned);
    let headers = rebuild(
        &raw.headers,
        &SERVICE_HEADERS,
        &[
            (X_ORIGINAL_TOPIC, origin.topic.clone()),
            (X_ORIGINAL_PARTITION, origin.partition.to_string()),
            (X_ORIGINAL_OFFSET, origin.offset.to_string()),
            (X_CONSUMER_GROUP, shared.config.group.clone()),
            (X_ATTEMPTS, attempts.to_string()),
            (X_ERROR, cut(error)),
            (X_ERROR_KIND, kind.as_str().to_owned()),
            (X_FAILED_AT, now),
            (X_DLQ_RETRIES, dlq_retries.to_string()),
            (X_FIRST_FAILED_AT, first_failed),
        ],
    );
    let topic = shared.config.dlq_topic(&origin.topic);
    // A record already dead-lettered before a crash (its DLQ write acked, its offset not yet
    // committed) is not written twice: one defect, one dead letter.
    let log = &shared.dead_lettered;
    let written_before = match log.logged(&shared.pool, raw).await {
        Logged::Written => true,
        Logged::Intended { partition, from } => {
            // A crash came between the intent and the record: was the letter appended?
            log.written_since(&topic, partition, from, origin).await == Some(true)
        }
        Logged::No => false,
    };
    if written_before {
        debug!(topic = %raw.topic, partition = raw.partition, offset = raw.offset, "already dead-lettered before a restart: not written again");
        log.record(&shared.pool, raw, &shared.cancel).await;
        return Fate::Final;
    }
    let target = match &shared.producer {
        super::Sink::Kafka(p) => log.target(p, &topic, origin.partition).await,
        // A harness keeps its records in order; there is no partition to find.
        super::Sink::Recorded(_) => None,
    };
    if let Some((partition, from)) = target {
        if !log.intend(&shared.pool, raw, partition, from).await {
            debug!("cannot record the intent to dead-letter; writing anyway (a crash meanwhile may duplicate it)");
        }
    }
    if produce_until_acked(shared, &topic, target.map(|t| t.0), raw, headers).await {
        log.record(&shared.pool, raw, &shared.cancel).await;
        ConsumerStats::inc(&shared.stats.dead_lettered);
        count(shared, &origin.topic, "dead_lettered", 1);
        Fate::Final
    } else {
        Fate::Abandoned
    }
}

/// Writes key and body byte-identical with `headers` to `topic`, retrying with capped backoff
/// until the broker acknowledges. Returns false only when shutdown interrupts the retries.
pub(super) async fn produce_until_acked(
    shared: &Shared,
    topic: &str,
    partition: Option<i32>,
    raw: &Raw,
    headers: rdkafka::message::OwnedHeaders,
) -> bool {
    let mut backoff = Backoff::default();
    let group = shared.config.group.clone();
    let blocked = metrics::gauge!(crate::metrics::CONSUMER_DLQ_BLOCKED, "group" => group.clone());
    let mut failed_before = false;
    let unblock = |failed_before: bool| {
        if failed_before {
            blocked.decrement(1.0);
        }
    };
    let producer = match &shared.producer {
        super::Sink::Kafka(p) => p,
        super::Sink::Recorded(written) => {
            use rdkafka::message::Headers as _;
            let headers = headers
                .iter()
                .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                .collect();
            written.lock().expect("written lock").push(super::Written {
                topic: topic.to_owned(),
                key: raw.key.clone(),
                headers,
                payload: raw.payload.clone(),
            });
            return true;
        }
    };
    loop {
        let mut rec: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(topic).headers(headers.clone());
        if let Some(p) = partition {
            rec = rec.partition(p);
        }
        if let Some(k) = &raw.key {
            rec = rec.key(k.as_slice());
        }
        if let Some(p) = &raw.payload {
            rec = rec.payload(p.as_slice());
        }
        match producer
            .send(rec, Timeout::After(shared.config.delivery_timeout))
            .await
        {
            Ok(_) => {
                unblock(failed_before);
                return true;
            }
            Err((e, _)) => {
                ConsumerStats::inc(&shared.stats.forward_failures);
                metrics::counter!(crate::metrics::CONSUMER_DLQ_WRITE_FAILURES, "topic" => topic.to_owned(), "group" => group.clone())
                    .increment(1);
                if !failed_before {
                    failed_before = true;
                    blocked.increment(1.0);
                }
                let wait = backoff.next_delay();
                warn!(%topic, error = %e, retry_in = ?wait, "write to retry/dead-letter topic failed; the offset stays put and the write is retried");
                tokio::select! {
                    () = shared.cancel.cancelled() => {
                        unblock(failed_before);
                        return false;
                    }
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}

/// Parks a message whose dependency is down: a dead letter of kind `unavailable`, drained when
/// the breaker closes.
pub(super) async fn park(
    raw: &Raw,
    origin: &Origin,
    shared: &Shared,
    error: &str,
    attempts: u32,
) -> Fate {
    let f = dead_letter(
        raw,
        origin,
        shared,
        DeadLetterKind::Unavailable,
        error,
        attempts,
    )
    .await;
    if let (Fate::Final, Some(b)) = (f, shared.breaker()) {
        b.parked.fetch_add(1, Ordering::Relaxed);
    }
    f
}
