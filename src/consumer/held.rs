//! Strict per-key order, the messages behind a head (`holds.rs` holds the key): when a keyed message of a strict
//! topic leaves the main path (dead-lettered, or forwarded to a retry topic), its key is held
//! behind it. Later messages of the key are written to `consumer_held` in arrival order and
//! their offsets move on, so the partition and the other keys keep flowing and memory stays
//! bounded. The hold ends when its head is resolved:
//!
//! - the head comes back (a replay, or its retry topic's copy) and is handled: the same task
//!   lets the held messages through, in order, at the replay job's rate;
//! - an operator drops the head (`outbox dlq drop`): the drop marks the hold `released` and
//!   upkeep lets them through;
//! - the hold passes the group's expiry: upkeep lets them through, or dead-letters them in
//!   order behind their head (`OnHoldExpiry`).
//!
//! A held message that fails while being let through becomes the key's new head. A release
//! holds the hold's row `FOR UPDATE`; an arrival writes its row only while the hold exists
//! (`FOR SHARE`), so an arrival is either behind the last held message or sees the hold gone.
//! Holds live in Postgres: they survive restarts and move with partitions in a rebalance.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use super::envelope::{Envelope, Fate};
use super::holds::{after, hold_state, is_head, message_id, until_ok, OnHoldExpiry};
use super::process::{process, try_message};
use super::record::{decode, origin, Raw};
use super::tx::count;
use super::Shared;
use crate::sql::{holds as q, render};
use crate::wire::DeadLetterKind;

/// Without strict order, a message of a key with a letter: handled, it passes the letter
/// (a replay of it would land behind this message).
async fn process_passing(env: &Envelope, shared: &Shared, key: &[u8]) -> Fate {
    let fate = process(env, shared).await;
    if matches!(fate, Fate::Final) {
        let id = message_id(env).unwrap_or_default();
        let passed = async {
            let c = shared.pool.get().await.map_err(|e| e.to_string())?;
            c.execute(
                &shared.holds.sql.passed_by_newer,
                &[&shared.config.group, &env.origin.topic, &key, &id],
            )
            .await
            .map_err(|e| e.to_string())
        }
        .await;
        match passed {
            Ok(_) => shared.holds.remember(&env.origin.topic, key, false),
            Err(e) => warn!(error = %e, "cannot note a letter passed by a newer message"),
        }
    }
    fate
}

/// A message whose key may be held: the head coming back, a message held behind it, or (the
/// hold gone) the usual path. Without strict order, [`process_passing`].
pub(super) async fn process_keyed(env: &Envelope, shared: &Shared) -> Fate {
    if let Some(key) = shared.holds.loose_key(env) {
        return process_passing(env, shared, key).await;
    }
    let key = shared
        .holds
        .strict_key(env)
        .expect("keyed message of a strict topic");
    let topic = env.origin.topic.clone();
    let id = message_id(env);
    let get = &shared.holds.sql.get;
    let hold = until_ok(shared, "reading the key's hold", || async {
        let c = shared.pool.get().await.map_err(|e| e.to_string())?;
        c.query_opt(get, &[&shared.config.group, &topic, &key])
            .await
            .map(|r| {
                r.map(|r| {
                    (
                        r.get::<_, Option<String>>(0),
                        r.get::<_, i32>(2),
                        r.get::<_, i64>(3),
                    )
                })
            })
            .map_err(|e| e.to_string())
    })
    .await;
    let Some(hold) = hold else {
        return Fate::Abandoned;
    };
    match hold {
        None => {
            shared.holds.remember(&topic, key, false);
            process(env, shared).await
        }
        Some((_, partition, offset))
            if env.origin.hop == 0
                && env.origin.partition == partition
                && env.origin.offset < offset =>
        {
            // Before the head in its partition: a redelivery (a crash or a rebalance before
            // the offset was committed) of a message that was final before the head failed.
            // Not held: the usual path finds it handled (a duplicate); it never becomes a
            // head again (a dead letter resolved earlier is recognised as written).
            try_message(env, shared, None).await
        }
        Some((head, _, _)) if is_head(env, head.as_deref(), id.as_deref()) => {
            // The head came back: handled (or already handled), its key is released.
            let fate = try_message(env, shared, None).await;
            match fate {
                Fate::Abandoned => fate,
                Fate::Left(_) => after(env, shared, fate).await,
                Fate::Final => {
                    let pace = replay_rate(env, shared).await;
                    if release(shared, &topic, key, "head handled", pace, false).await {
                        Fate::Final
                    } else {
                        Fate::Abandoned
                    }
                }
            }
        }
        Some((head, _, _)) => hold_behind(env, shared, &topic, key, head.as_deref()).await,
    }
}

/// Writes `env` behind its key's head. If the hold ended meanwhile, takes the usual path.
async fn hold_behind(
    env: &Envelope,
    shared: &Shared,
    topic: &str,
    key: &[u8],
    head: Option<&str>,
) -> Fate {
    let raw = &env.raw;
    let (names, values): (Vec<&str>, Vec<Option<&[u8]>>) = raw
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_deref()))
        .unzip();
    let id = message_id(env);
    let sql = &shared.holds.sql.arrive;
    let held = until_ok(
        shared,
        "holding a message behind its key's head",
        || async {
            let c = shared.pool.get().await.map_err(|e| e.to_string())?;
            c.query_one(
                sql,
                &[
                    &shared.config.group,
                    &topic,
                    &key,
                    &raw.topic,
                    &raw.partition,
                    &raw.offset,
                    &id,
                    &names,
                    &values,
                    &raw.payload,
                    &raw.timestamp_ms,
                ],
            )
            .await
            .map(|r| r.get::<_, bool>(0))
            .map_err(|e| e.to_string())
        },
    )
    .await;
    match held {
        None => Fate::Abandoned,
        Some(true) => {
            debug!(%topic, message_id = ?id, ?head, "held behind its key's head");
            count(shared, topic, "held", 1);
            Fate::Final
        }
        Some(false) => {
            shared.holds.remember(topic, key, false);
            process(env, shared).await
        }
    }
}

/// The rate of the replay job that brought `env` back, if any: its held messages follow it
/// no faster.
async fn replay_rate(env: &Envelope, shared: &Shared) -> Option<f64> {
    let job: i64 = env.raw.header(crate::wire::X_REPLAY_JOB)?.parse().ok()?;
    let c = shared.pool.get().await.ok()?;
    c.query_opt(
        &render(crate::sql::replay_jobs::RATE, &shared.db_schema),
        &[&job],
    )
    .await
    .ok()
    .flatten()
    .map(|r| r.get::<_, f64>(0))
    .filter(|r| r.is_finite() && *r > 0.0)
}

/// A held message read back, as the envelope it arrived in.
fn envelope(row: &tokio_postgres::Row, key: &[u8], shared: &Shared) -> Envelope {
    let names: Vec<String> = row.get("header_names");
    let values: Vec<Option<Vec<u8>>> = row.get("header_values");
    let raw = Raw {
        topic: row.get("record_topic"),
        partition: row.get("partition"),
        offset: row.get("offset"),
        key: Some(key.to_vec()),
        payload: row.get("payload"),
        headers: names.into_iter().zip(values).collect(),
        timestamp_ms: row.get("record_ts_ms"),
    };
    let origin = origin(&raw, shared);
    let decoded = decode(&raw, &origin);
    Envelope {
        raw,
        epoch: 0,
        due: None,
        origin,
        decoded,
        drain: false,
    }
}

/// Lets the messages held behind `key` through, in order, under the hold's lock; ends the
/// hold when none is left. A message that fails becomes the new head (the hold stays). With
/// `upkeep`, a hold another replica is releasing is skipped, and an expired one is let
/// through or dead-lettered by the group's policy. False only at shutdown (the hold stays
/// `released`; upkeep finishes it).
pub(super) async fn release(
    shared: &Shared,
    topic: &str,
    key: &[u8],
    why: &str,
    pace: Option<f64>,
    upkeep: bool,
) -> bool {
    let group = &shared.config.group;
    let s = &shared.db_schema;
    if !upkeep {
        // Recorded first: a crash from here on leaves the release to upkeep.
        let sql = render(q::RELEASE, s);
        let marked = until_ok(shared, "releasing a held key", || async {
            let c = shared.pool.get().await.map_err(|e| e.to_string())?;
            c.execute(&sql, &[group, &topic, &key, &why])
                .await
                .map_err(|e| e.to_string())
        })
        .await;
        if marked.is_none() {
            return false;
        }
    }
    let result = release_locked(shared, topic, key, pace, upkeep).await;
    match result {
        Ok(done) => done,
        Err(e) => {
            warn!(%topic, error = %e, "releasing a held key failed; upkeep retries it");
            !shared.cancel.is_cancelled()
        }
    }
}

async fn release_locked(
    shared: &Shared,
    topic: &str,
    key: &[u8],
    pace: Option<f64>,
    upkeep: bool,
) -> Result<bool, String> {
    let group = &shared.config.group;
    let s = &shared.db_schema;
    let mut c = shared.pool.get().await.map_err(|e| e.to_string())?;
    let tx = c.transaction().await.map_err(|e| e.to_string())?;
    let lock = render(if upkeep { q::LOCK_SKIP } else { q::LOCK }, s);
    let Some(hold) = tx
        .query_opt(&lock, &[group, &topic, &key])
        .await
        .map_err(|e| e.to_string())?
    else {
        // Gone, or (upkeep) being released elsewhere.
        return Ok(true);
    };
    let head: Option<String> = hold.get(0);
    let state: String = hold.get(1);
    let expired: bool = hold.get(2);
    if upkeep && state != "released" && !expired {
        return Ok(true);
    }
    let dead_letter_them = upkeep
        && state != "released"
        && expired
        && shared
            .config
            .strict_order
            .as_ref()
            .is_some_and(|c| c.on_expiry == OnHoldExpiry::DeadLetter);
    if upkeep {
        info!(%topic, head = ?head, state = %state, expired, dead_letter_them, "releasing a held key");
    }
    let (next, delete) = (render(q::NEXT, s), render(q::DELETE_HELD, s));
    let mut released = 0u64;
    loop {
        let Some(row) = tx
            .query_opt(&next, &[group, &topic, &key])
            .await
            .map_err(|e| e.to_string())?
        else {
            tx.execute(&render(q::END, s), &[group, &topic, &key])
                .await
                .map_err(|e| e.to_string())?;
            tx.commit().await.map_err(|e| e.to_string())?;
            shared.holds.remember(topic, key, false);
            count(shared, topic, "released", released);
            return Ok(true);
        };
        let seq: i64 = row.get("seq");
        if let Some(rate) = pace {
            // Behind a replayed head, at its job's rate.
            tokio::time::sleep(Duration::from_secs_f64(1.0 / rate)).await;
        }
        let mut env = envelope(&row, key, shared);
        let fate = if dead_letter_them {
            let why = format!(
                "held behind {} past the group's hold expiry",
                head.as_deref().unwrap_or("an unreadable message")
            );
            let f = super::letters::dead_letter(
                &env.raw,
                &env.origin,
                shared,
                DeadLetterKind::HeldExpired,
                &why,
                0,
            )
            .await;
            // Following the head to the DLQ is this message's resolution, not a new head.
            if f.is_final() {
                Fate::Final
            } else {
                f
            }
        } else {
            let resolved = {
                let mut one = [&mut env];
                super::schemas::resolve(&mut one, shared).await
            };
            if resolved {
                try_message(&env, shared, None).await
            } else {
                Fate::Abandoned
            }
        };
        match fate {
            Fate::Final => {
                tx.execute(&delete, &[group, &topic, &key, &seq])
                    .await
                    .map_err(|e| e.to_string())?;
                released += 1;
            }
            Fate::Left(left) if hold_state(left).is_some() => {
                // The new head: the rest waits behind it.
                let expiry = shared.holds.expiry.map(|e| e.as_secs_f64());
                tx.execute(
                    &render(q::NEW_HEAD, s),
                    &[
                        group,
                        &topic,
                        &key,
                        &message_id(&env),
                        &env.origin.partition,
                        &env.origin.offset,
                        &hold_state(left).expect("state"),
                        &expiry,
                        &seq,
                    ],
                )
                .await
                .map_err(|e| e.to_string())?;
                tx.commit().await.map_err(|e| e.to_string())?;
                count(shared, topic, "released", released);
                info!(%topic, message_id = ?message_id(&env), "a held message failed: it is the key's new head");
                return Ok(true);
            }
            Fate::Left(_) => {
                // Parked behind the breaker: its drain delivers it; the rest may follow.
                tx.execute(&delete, &[group, &topic, &key, &seq])
                    .await
                    .map_err(|e| e.to_string())?;
                released += 1;
            }
            Fate::Abandoned => {
                // Shutdown: what was let through stays deleted; the rest waits for upkeep.
                tx.commit().await.map_err(|e| e.to_string())?;
                count(shared, topic, "released", released);
                return Ok(false);
            }
        }
        // The deletes commit with the hold's end: a crash meanwhile lets the same messages
        // through again, and the inbox makes each a duplicate.
    }
}

/// Upkeep of the group's holds, every `check_interval`: releases holds an operator resolved
/// (a drop) and expired ones, and updates the gauges.
pub(super) async fn run(shared: Arc<Shared>) {
    let Some(cfg) = shared.config.strict_order.clone() else {
        return;
    };
    let group = shared.config.group.clone();
    loop {
        let due = async {
            let c = shared.pool.get().await.ok()?;
            let rows = c
                .query(&render(q::DUE, &shared.db_schema), &[&group])
                .await
                .ok()?;
            Some(
                rows.iter()
                    .map(|r| (r.get::<_, String>(0), r.get::<_, Vec<u8>>(1)))
                    .collect::<Vec<_>>(),
            )
        }
        .await
        .unwrap_or_default();
        for (topic, key) in due {
            if shared.cancel.is_cancelled() {
                return;
            }
            release(&shared, &topic, &key, "", None, true).await;
        }
        gauges(&shared, &group, &cfg.topics).await;
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            () = tokio::time::sleep(cfg.check_interval) => {}
        }
    }
}

async fn gauges(shared: &Shared, group: &str, topics: &[String]) {
    let Ok(c) = shared.pool.get().await else {
        return;
    };
    let Ok(rows) = c
        .query(&render(q::GAUGES, &shared.db_schema), &[&group])
        .await
    else {
        return;
    };
    let mut seen = HashSet::new();
    for r in &rows {
        let topic: String = r.get(0);
        let labels = [("topic", topic.clone()), ("group", group.to_owned())];
        metrics::gauge!(crate::metrics::CONSUMER_HELD_KEYS, &labels).set(r.get::<_, i64>(1) as f64);
        metrics::gauge!(crate::metrics::CONSUMER_OLDEST_HOLD_SECONDS, &labels)
            .set(r.get::<_, f64>(2));
        metrics::gauge!(crate::metrics::CONSUMER_HELD_MESSAGES, &labels)
            .set(r.get::<_, i64>(3) as f64);
        seen.insert(topic);
    }
    for t in topics.iter().filter(|t| !seen.contains(*t)) {
        let labels = [("topic", t.clone()), ("group", group.to_owned())];
        metrics::gauge!(crate::metrics::CONSUMER_HELD_KEYS, &labels).set(0.0);
        metrics::gauge!(crate::metrics::CONSUMER_OLDEST_HOLD_SECONDS, &labels).set(0.0);
        metrics::gauge!(crate::metrics::CONSUMER_HELD_MESSAGES, &labels).set(0.0);
    }
}
