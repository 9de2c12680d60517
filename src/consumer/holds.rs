//! Strict per-key order (opt-in per topic, [`StrictOrder`]): when a keyed message of a strict
//! topic leaves the main path (dead-lettered, or forwarded to a retry topic), its key is held
//! behind it (`after`, called by the one processing path). What waits behind a head, and how
//! it is let through, is `held.rs`. Without strict order, a keyed dead letter is noted, so
//! that a replay's dry run can say when newer messages of its key were handled meanwhile.
//! Holds live in Postgres: they survive restarts and move with partitions in a rebalance.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{info, warn};

use super::envelope::{Envelope, Fate, Left};
use super::Shared;
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

/// The statements a message may run on its way (rendered once; the rarer ones of a release and
/// of upkeep are rendered where they run).
pub(super) struct Sql {
    pub(super) get: String,
    pub(super) arrive: String,
    pub(super) hold: String,
    pub(super) passed: String,
    pub(super) passed_by_newer: String,
}

/// The runtime's view of the group's holds.
pub(super) struct Holds {
    pub(super) sql: Sql,
    strict: HashSet<String>,
    pub(super) expiry: Option<Duration>,
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
    pub(super) fn new(
        config: Option<&StrictOrder>,
        stale: Arc<AtomicBool>,
        schema: &crate::schema::Schema,
    ) -> Self {
        Self {
            sql: Sql {
                get: render(q::GET, schema),
                arrive: render(q::ARRIVE, schema),
                hold: render(q::HOLD, schema),
                passed: render(q::PASSED, schema),
                passed_by_newer: render(q::PASSED_BY_NEWER, schema),
            },
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
    pub(super) fn strict_key<'e>(&self, env: &'e Envelope) -> Option<&'e [u8]> {
        (!env.drain && self.strict.contains(&env.origin.topic))
            .then_some(())
            .and(env.raw.key.as_deref())
    }

    /// The key, when `env` is a keyed message of a topic not in strict order.
    pub(super) fn loose_key<'e>(&self, env: &'e Envelope) -> Option<&'e [u8]> {
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

    pub(super) fn remember(&self, topic: &str, key: &[u8], held: bool) {
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
pub(super) async fn until_ok<T, F, Fut>(shared: &Shared, what: &str, f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    crate::backoff::until_ok(&shared.cancel, &format!("{what} failed"), f).await
}

/// The head coming back: its own id, or (edited and retried from the dashboard, which gives
/// it a new id) the id it was edited from.
pub(super) fn is_head(env: &Envelope, head: Option<&str>, id: Option<&str>) -> bool {
    head.is_some() && (head == id || head == env.raw.header(crate::wire::X_EDITED_FROM))
}

pub(super) fn message_id(env: &Envelope) -> Option<String> {
    env.decoded.as_ref().ok().map(|d| d.message_id.clone())
}

pub(super) fn hold_state(left: Left) -> Option<&'static str> {
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
    let sql = &shared.holds.sql.hold;
    let done = until_ok(shared, "holding the key", || async {
        let c = shared.pool.get().await.map_err(|e| e.to_string())?;
        c.execute(
            sql,
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
            &shared.holds.sql.passed,
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
