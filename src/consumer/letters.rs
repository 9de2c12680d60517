//! What leaves the main path, written until it is safe: dead letters (produced until the
//! broker acknowledges, once per record across a crash), parked letters, and the archive's
//! record of letters a drain replayed, parked again or dropped by policy. The one processing
//! loop (`process.rs`) and the drain's checks (`drain.rs`) both end here.

use std::sync::atomic::Ordering;
use std::time::SystemTime;

use rdkafka::producer::FutureRecord;
use rdkafka::util::Timeout;
use tracing::{debug, warn};

use super::dead_letter::*;
use super::envelope::{Envelope, Fate, Left};
use super::record::{Origin, Raw};
use super::stats::ConsumerStats;
use super::tx::count;
use super::Shared;
use crate::backoff::Backoff;

/// Dead-letters `raw` to its topic's DLQ with the failure's headers; final once the broker
/// acknowledged it.
pub(super) async fn dead_letter(
    raw: &Raw,
    origin: &Origin,
    shared: &Shared,
    kind: DeadLetterKind,
    error: &str,
    attempts: u32,
) -> Fate {
    crate::otel::delivery_failed(kind.as_str(), error);
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
        return Fate::Left(Left::Dead(kind));
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
    let why = if kind == DeadLetterKind::Unavailable {
        "park"
    } else {
        "dead_letter"
    };
    if produce_until_acked(shared, &topic, target.map(|t| t.0), raw, headers, why).await {
        log.record(&shared.pool, raw, &shared.cancel).await;
        ConsumerStats::inc(&shared.stats.dead_lettered);
        count(shared, &origin.topic, "dead_lettered", 1);
        Fate::Left(Left::Dead(kind))
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
    why: &'static str,
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
    // Under a delivery's `process` span: a `send` span of its own, and the letter carries the
    // delivery's context (`x-outbox-trace-link`) so the next delivery or replay links back.
    let traced = crate::otel::with_delivery(|s| {
        s.traceparent()
            .map(|tp| (crate::otel::forward(s, topic, why), tp))
    })
    .flatten();
    let headers = match &traced {
        Some((_, tp)) => with_trace_link(&headers, tp),
        None => headers,
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

/// `headers` with `x-outbox-trace-link` set to `tp` (an earlier one replaced).
fn with_trace_link(
    headers: &rdkafka::message::OwnedHeaders,
    tp: &str,
) -> rdkafka::message::OwnedHeaders {
    use rdkafka::message::{Header, Headers as _, OwnedHeaders};
    let mut h = OwnedHeaders::new_with_capacity(headers.count() + 1);
    for old in headers
        .iter()
        .filter(|x| x.key != crate::otel::X_TRACE_LINK)
    {
        h = h.insert(old);
    }
    h.insert(Header {
        key: crate::otel::X_TRACE_LINK,
        value: Some(tp.as_bytes()),
    })
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
    if !f.is_final() {
        return f;
    }
    if let Some(b) = shared.breaker() {
        b.parked.fetch_add(1, Ordering::Relaxed);
    }
    crate::otel::outcome("parked");
    // Parked, not dead: the breaker's drain delivers it before newer messages of its key.
    Fate::Final
}

/// Parks a drained letter again: a new dead letter with `x-dlq-retries + 1`; the record read
/// is settled (its offset moves on).
pub(super) async fn repark(
    env: &Envelope,
    shared: &Shared,
    error: &str,
    kind: DeadLetterKind,
) -> Fate {
    repark_after(env, shared, error, kind, 1).await
}

/// [`repark`] after `calls` calls of the handler (`x-attempts`).
pub(super) async fn repark_after(
    env: &Envelope,
    shared: &Shared,
    error: &str,
    kind: DeadLetterKind,
    calls: u32,
) -> Fate {
    let f = dead_letter(&env.raw, &env.origin, shared, kind, error, calls).await;
    if !f.is_final() {
        return f;
    }
    if let Some(b) = shared.breaker() {
        b.reparked.fetch_add(1, Ordering::Relaxed);
        superseded(env, shared, kind).await;
    }
    Fate::Final
}

/// The letter read during a drain now has a successor in the DLQ (parked again, or
/// dead-lettered for good): the archived copy is settled so operators act on the new one only.
pub(super) async fn superseded(env: &Envelope, shared: &Shared, kind: DeadLetterKind) {
    let reason = format!("drain: superseded by a new dead letter ({})", kind.as_str());
    settle(env, shared, "dropped", &reason).await;
}

/// Drops a parked letter by policy: never silently — recorded in the archive as `dropped`
/// with the reason, logged and counted.
pub(super) async fn drop_letter(env: &Envelope, shared: &Shared, reason: &'static str) -> Fate {
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
pub(super) async fn settle(env: &Envelope, shared: &Shared, status: &str, reason: &str) -> bool {
    let row = crate::dlq::Row::from_raw(&env.raw, &shared.config.dlq_suffix);
    crate::backoff::until_ok(
        &shared.cancel,
        "cannot record the letter's outcome in dead_letters",
        || shared.dlq.record_settled(&row, status, reason),
    )
    .await
    .is_some()
}
