//! Strict per-key order (opt-in per topic, [`StrictOrder`]): when a keyed message of a strict
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
//!   order behind their head ([`OnHoldExpiry`]).
//!
//! A held message that fails while being let through becomes the key's new head. A release
//! holds the hold's row `FOR UPDATE`; an arrival writes its row only while the hold exists
//! (`FOR SHARE`), so an arrival is either behind the last held message or sees the hold gone.
//! Holds live in Postgres: they survive restarts and move with partitions in a rebalance.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{debug, info, warn};

use super::envelope::{Envelope, Fate, Left};
use super::process::{process, try_message};
use super::record::{decode, origin, Raw};
use super::tx::count;
use super::Shared;
use crate::backoff::Backoff;
use crate::sql::{holds as q, render};
use crate::wire::DeadLetterKind;

/// Strict per-key order for some of a consumer's topics ([`super::ConsumerConfig::strict_order`]).
///
/// Costs one indexed lookup per message of a held key and nothing for the others; what a
/// held key waits for is visible in `outbox trace`, the dashboard, the admin API
/// (`GET /api/holds`) and the `outbox_consumer_held_keys` / `…_oldest_hold_seconds` gauges.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StrictOrder {
    /// The topics (of [`super::ConsumerConfig::topics`]) whose keys are held.
    pub topics: Vec<String>,
    /// How long a key stays held at most (default: until resolved).
    pub expiry: Option<Duration>,
    /// What happens to the held messages when a hold expires (default: let through).
    pub on_expiry: OnHoldExpiry,
    /// How often upkeep looks for released and expired holds, and updates the gauges
    /// (default 2 s).
    pub check_interval: Duration,
}

impl StrictOrder {
    /// Strict order on `topics`, holds without expiry.
    pub fn new(topics: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            topics: topics.into_iter().map(Into::into).collect(),
            expiry: None,
            on_expiry: OnHoldExpiry::Release,
            check_interval: Duration::from_secs(2),
        }
    }

    pub(super) fn validate(&self, topics: &[String]) -> Result<(), String> {
        if let Some(t) = self.topics.iter().find(|t| !topics.contains(t)) {
            return Err(format!(
                "strict order topic {t:?} is not one of the consumer's topics"
            ));
        }
        if self.expiry.is_some_and(|e| e < Duration::from_secs(1)) {
            return Err("the hold expiry must be at least 1 s".into());
        }
        if self.check_interval < Duration::from_millis(100) {
            return Err("the holds check interval must be at least 100 ms".into());
        }
        Ok(())
    }
}

/// What becomes of the messages held behind a head when the hold expires.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnHoldExpiry {
    /// They go on to their handler, in order (the head stays in the DLQ).
    #[default]
    Release,
    /// They follow the head to the DLQ, in order, as `held-expired` letters.
    DeadLetter,
}

/// The runtime's view of the group's holds.
pub(super) struct Holds {
    strict: HashSet<String>,
    expiry: Option<Duration>,
    /// A superset of the held keys of the assigned partitions: a key in it takes the
    /// database path (which decides), the others the usual one.
    keys: Mutex<HashSet<(String, Vec<u8>)>>,
    /// False until loaded, and after a failed load: every key takes the database path.
    loaded: AtomicBool,
    /// Set by the rebalance callback: partitions (and their holds) changed hands.
    stale: Arc<AtomicBool>,
    /// After a failed load, no new try before this.
    retry_at: Mutex<Option<tokio::time::Instant>>,
}

impl Holds {
    pub(super) fn new(config: Option<&StrictOrder>, stale: Arc<AtomicBool>) -> Self {
        Self {
            strict: config
                .map(|c| c.topics.iter().cloned().collect())
                .unwrap_or_default(),
            expiry: config.and_then(|c| c.expiry),
            keys: Mutex::default(),
            loaded: AtomicBool::new(false),
            stale,
            retry_at: Mutex::new(None),
        }
    }

    /// Strict order is on for some topic.
    pub(super) fn enabled(&self) -> bool {
        !self.strict.is_empty()
    }

    /// The key, when `env` is a keyed message of a strict topic (main or retry topic).
    fn strict_key<'e>(&self, env: &'e Envelope) -> Option<&'e [u8]> {
        (!env.drain && self.strict.contains(&env.origin.topic))
            .then_some(())
            .and(env.raw.key.as_deref())
    }

    /// The key, when `env` is a keyed message of a topic not in strict order.
    fn loose_key<'e>(&self, env: &'e Envelope) -> Option<&'e [u8]> {
        (!env.drain && !self.strict.contains(&env.origin.topic))
            .then_some(())
            .and(env.raw.key.as_deref())
    }

    /// True when `env` must take the database path: its key may be held (strict order), or
    /// (otherwise) it has a letter not yet passed by a newer message.
    pub(super) fn may_hold(&self, env: &Envelope) -> bool {
        let known = |key: &[u8]| {
            self.keys
                .lock()
                .expect("holds lock")
                .contains(&(env.origin.topic.clone(), key.to_vec()))
        };
        if let Some(key) = self.strict_key(env) {
            return !self.loaded.load(Ordering::SeqCst) || known(key);
        }
        // Without strict order, a key missed while the set loads only loses a dry run's
        // warning, never a message: no database path for every message meanwhile.
        self.loose_key(env).is_some_and(known)
    }

    fn remember(&self, topic: &str, key: &[u8], held: bool) {
        let mut keys = self.keys.lock().expect("holds lock");
        if held {
            keys.insert((topic.to_owned(), key.to_vec()));
        } else {
            keys.remove(&(topic.to_owned(), key.to_vec()));
        }
    }

    /// Reloads the held keys after an assignment (before the new partitions' first message
    /// is dispatched). On failure every key takes the database path until a load succeeds.
    pub(super) async fn reload(&self, shared: &Shared) {
        if !self.stale.load(Ordering::SeqCst) {
            return;
        }
        if self
            .retry_at
            .lock()
            .expect("holds lock")
            .is_some_and(|t| tokio::time::Instant::now() < t)
        {
            // The last load failed a moment ago: messages take the database path meanwhile.
            return;
        }
        self.stale.store(false, Ordering::SeqCst);
        let loaded = async {
            let c = shared.pool.get().await.ok()?;
            let mut keys = HashSet::new();
            for sql in [q::KEYS, q::PASSED_KEYS] {
                let rows = c
                    .query(&render(sql, &shared.db_schema), &[&shared.config.group])
                    .await
                    .ok()?;
                keys.extend(
                    rows.iter()
                        .map(|r| (r.get::<_, String>(0), r.get::<_, Vec<u8>>(1))),
                );
            }
            Some(keys)
        }
        .await;
        match loaded {
            Some(keys) => {
                // A union: a hold written by a task while this load ran is kept (a key
                // leaves the set only when the database says it is not held).
                self.keys.lock().expect("holds lock").extend(keys);
                self.loaded.store(true, Ordering::SeqCst);
            }
            None => {
                warn!("cannot load the held keys: every message of a strict topic checks its key in the database until they load");
                self.loaded.store(false, Ordering::SeqCst);
                self.stale.store(true, Ordering::SeqCst);
                *self.retry_at.lock().expect("holds lock") =
                    Some(tokio::time::Instant::now() + Duration::from_secs(1));
            }
        }
    }
}

/// Runs `f` against the consumer's database until it succeeds; `None` at shutdown.
async fn until_ok<T, F, Fut>(shared: &Shared, what: &str, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let mut backoff = Backoff::default();
    loop {
        match f().await {
            Ok(v) => return Some(v),
            Err(e) => {
                if backoff.failures() == 0 {
                    warn!(error = %e, "{what} failed; retrying");
                }
                tokio::select! {
                    () = shared.cancel.cancelled() => return None,
                    () = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
    }
}

/// The head coming back: its own id, or (edited and retried from the dashboard, which gives
/// it a new id) the id it was edited from.
fn is_head(env: &Envelope, head: Option<&str>, id: Option<&str>) -> bool {
    head.is_some() && (head == id || head == env.raw.header(crate::wire::X_EDITED_FROM))
}

fn message_id(env: &Envelope) -> Option<String> {
    env.decoded.as_ref().ok().map(|d| d.message_id.clone())
}

fn hold_state(left: Left) -> Option<&'static str> {
    match left {
        Left::Retrying => Some("retrying"),
        // Parked behind the breaker: its drain already orders the key.
        Left::Dead(DeadLetterKind::Unavailable) => None,
        Left::Dead(_) => Some("dead"),
    }
}

/// After a message of the usual path: one that left for a retry topic or the DLQ holds its
/// key (written after the broker's ack; a crash before this write redelivers the message,
/// which is recognised as already written and holds the key then).
pub(super) async fn after(env: &Envelope, shared: &Shared, fate: Fate) -> Fate {
    let Fate::Left(left) = fate else { return fate };
    if let (Some(key), Left::Dead(kind)) = (shared.holds.loose_key(env), left) {
        if kind != DeadLetterKind::Unavailable {
            note_passed(env, shared, key).await;
        }
        return fate;
    }
    let (Some(key), Some(st)) = (shared.holds.strict_key(env), hold_state(left)) else {
        return fate;
    };
    let topic = &env.origin.topic;
    let id = message_id(env);
    let expiry = shared.holds.expiry.map(|e| e.as_secs_f64());
    let sql = render(q::HOLD, &shared.db_schema);
    let done = until_ok(shared, "holding the key", || async {
        let c = shared.pool.get().await.map_err(|e| e.to_string())?;
        c.execute(
            &sql,
            &[
                &shared.config.group,
                topic,
                &key,
                &id,
                &env.origin.partition,
                &env.origin.offset,
                &st,
                &expiry,
            ],
        )
        .await
        .map_err(|e| e.to_string())
    })
    .await;
    if done.is_none() {
        return Fate::Abandoned;
    }
    shared.holds.remember(topic, key, true);
    info!(group = %shared.config.group, %topic, message_id = ?id, state = st, "key held behind its failed message (strict order)");
    fate
}

/// Without strict order: a keyed message dead-lettered is noted, so that a replay's dry run can
/// say when newer messages of its key were handled meanwhile. One try: a note lost to an
/// outage costs a warning, never the message.
async fn note_passed(env: &Envelope, shared: &Shared, key: &[u8]) {
    let Some(id) = message_id(env) else { return };
    let noted = async {
        let c = shared.pool.get().await.map_err(|e| e.to_string())?;
        c.execute(
            &render(q::PASSED, &shared.db_schema),
            &[&shared.config.group, &env.origin.topic, &key, &id],
        )
        .await
        .map_err(|e| e.to_string())
    }
    .await;
    match noted {
        Ok(_) => shared.holds.remember(&env.origin.topic, key, true),
        Err(e) => warn!(error = %e, "cannot note the dead-lettered key for replay checks"),
    }
}

/// Without strict order, a message of a key with a letter: handled, it passes the letter
/// (a replay of it would land behind this message).
async fn process_passing(env: &Envelope, shared: &Shared, key: &[u8]) -> Fate {
    let fate = process(env, shared).await;
    if matches!(fate, Fate::Final) {
        let id = message_id(env).unwrap_or_default();
        let passed = async {
            let c = shared.pool.get().await.map_err(|e| e.to_string())?;
            c.execute(
                &render(q::PASSED_BY_NEWER, &shared.db_schema),
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
    let get = render(q::GET, &shared.db_schema);
    let hold = until_ok(shared, "reading the key's hold", || async {
        let c = shared.pool.get().await.map_err(|e| e.to_string())?;
        c.query_opt(&get, &[&shared.config.group, &topic, &key])
            .await
            .map(|r| r.map(|r| r.get::<_, Option<String>>(0)))
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
        Some(head) if is_head(env, head.as_deref(), id.as_deref()) => {
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
        Some(head) => hold_behind(env, shared, &topic, key, head.as_deref()).await,
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
    let sql = render(q::ARRIVE, &shared.db_schema);
    let held = until_ok(
        shared,
        "holding a message behind its key's head",
        || async {
            let c = shared.pool.get().await.map_err(|e| e.to_string())?;
            c.query_one(
                &sql,
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
        &render(
            "SELECT rate FROM {s}.dlq_replay_jobs WHERE id = $1",
            &shared.db_schema,
        ),
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
    let mut topics_seen: HashSet<String> = HashSet::new();
    for t in &cfg.topics {
        topics_seen.insert(t.clone());
    }
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
        gauges(&shared, &group, &topics_seen).await;
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            () = tokio::time::sleep(cfg.check_interval) => {}
        }
    }
}

async fn gauges(shared: &Shared, group: &str, topics: &HashSet<String>) {
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
