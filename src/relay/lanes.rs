//! Ordering lanes: which relay may publish which keys.
//!
//! Rows are hashed by key into [`LANES`] lanes (`hashtext(coalesce(message_key, '')) & 63`,
//! the same expression the claim query uses). A relay publishes only rows of lanes it holds a
//! session advisory lock on, so one key is never in flight in two relays at once and per-key
//! order follows outbox id order even with several relays.
//!
//! Fair share: every relay also holds a *member* lock; the number of member locks in `pg_locks`
//! is the number of live relays, and each relay aims at `ceil(LANES / members)` lanes, releasing
//! extras and taking free ones at each rebalance (between batches, never with a batch in flight).
//! A relay that dies loses its locks with its connection; the survivors take its lanes at their
//! next rebalance (every [`DEFAULT_REBALANCE_INTERVAL`]).
//!
//! Lanes are the fast path, not the only safeguard: before sending, the relay also checks that
//! no earlier pending row of each claimed key exists outside its claim (see
//! `sql::FIRST_PENDING`), so order holds even if a lock connection dies mid-batch and another
//! relay takes the lane early.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, info};

use crate::config::DbConfig;
use crate::sql::locks;

/// Number of ordering lanes. Fixed: the claim query and every relay must agree.
pub const LANES: i32 = 64;
/// Exactly-once mode owns lanes in this many slots of `LANES / SLOTS` consecutive lanes: a
/// slot is the unit a transactional producer (and its fencing) belongs to.
///
/// Why 4: every pass runs a Kafka transaction per slot that has rows in it, side by side, and
/// a transaction costs the broker the same whatever its size (AddPartitionsToTxn, the
/// partition verification on a first produce, EndTxn, a marker per partition). On a trickle
/// most rows land in different slots, so with 8 slots a pass of ~5 rows ran ~4 transactions
/// and waited for the slowest: the commit → `read_committed` p99 at 500 msg/s was 46 – 114 ms
/// against 37 – 47 ms with 4 slots and 35 – 37 ms with 2 (docs/BENCHMARKS_HISTORY.md, round 12). 4 keeps
/// up to four relays sharing the work; a fifth is a standby.
///
/// Every relay of a deployment must agree on it (it names the transactional ids and the
/// progress partitions): relays built with another slot count must not run beside these.
pub const SLOTS: i32 = 4;

/// The slot of `lane` in exactly-once mode.
pub(crate) fn slot_of(lane: i32) -> i32 {
    lane / (LANES / SLOTS)
}

/// How often a relay re-counts relays and rebalances its lanes.
pub const DEFAULT_REBALANCE_INTERVAL: Duration = Duration::from_secs(2);

/// The session lane locks are held on: a relay's own, or one a fleet's relays of one database
/// share (their locks are namespaced by schema, so they never meet). If it dies, every lock
/// on it dies with it; whoever asks next opens a new one.
pub(crate) struct LockSession {
    db: DbConfig,
    current: tokio::sync::Mutex<Option<Arc<tokio_postgres::Client>>>,
    /// The schemas whose relays use it, and their relay counts as last looked up: one look at
    /// the lock table serves every schema for a moment (a look costs a copy of the whole lock
    /// table: milliseconds with a fleet's thousands of locks).
    members: tokio::sync::Mutex<Members>,
    /// Schemas named by [`LockSession::expect`], joining `members` at the next look.
    expected: std::sync::Mutex<BTreeSet<String>>,
}

#[derive(Default)]
struct Members {
    schemas: std::collections::BTreeSet<String>,
    counts: std::collections::HashMap<String, i64>,
    at: Option<Instant>,
}

/// How long one look at the member locks serves every schema of a session.
const MEMBERS_FRESH: Duration = Duration::from_millis(500);

impl LockSession {
    pub(crate) fn new(db: &DbConfig) -> Arc<Self> {
        Arc::new(Self {
            db: db.clone(),
            current: tokio::sync::Mutex::new(None),
            members: tokio::sync::Mutex::new(Members::default()),
            expected: std::sync::Mutex::default(),
        })
    }

    /// Relays of `schema` holding their member lock, from a look at most [`MEMBERS_FRESH`] old.
    async fn members(
        &self,
        c: &tokio_postgres::Client,
        schema: &str,
    ) -> Result<i64, tokio_postgres::Error> {
        let mut m = self.members.lock().await;
        let expected = std::mem::take(&mut *self.expected.lock().expect("expected schemas"));
        m.schemas.extend(expected);
        // A session of one relay's own always looks (a rebalance right after another relay
        // joined must see it); a shared one serves its schemas from one look for a moment.
        let shared = m.schemas.len() > 1;
        let fresh = shared && m.at.is_some_and(|t| t.elapsed() < MEMBERS_FRESH);
        if !(fresh && m.counts.contains_key(schema)) {
            m.schemas.insert(schema.to_owned());
            let schemas: Vec<&str> = m.schemas.iter().map(String::as_str).collect();
            let rows = c.query(locks::COUNT_RELAYS_OF, &[&schemas]).await?;
            m.counts = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
            m.at = Some(Instant::now());
        }
        Ok(m.counts.get(schema).copied().unwrap_or(0))
    }

    /// A schema whose relay is about to start on this session: the next look at the lock
    /// table counts it too. A fleet starting hundreds of tenants names them all before the
    /// first look, which then serves every one of them instead of each looking on its own
    /// (a look copies the whole lock table, thousands of lane locks: 201 looks took 767 ms
    /// of Postgres time in a 200-tenant start).
    pub(crate) fn expect(&self, schema: &str) {
        self.expected
            .lock()
            .expect("expected schemas")
            .insert(schema.to_owned());
    }

    /// A schema whose relays no longer use it.
    async fn forget(&self, schema: &str) {
        self.expected
            .lock()
            .expect("expected schemas")
            .remove(schema);
        let mut m = self.members.lock().await;
        m.schemas.remove(schema);
        m.counts.remove(schema);
    }

    /// The live session, opened if there is none.
    async fn client(&self) -> Result<Arc<tokio_postgres::Client>, tokio_postgres::Error> {
        let mut current = self.current.lock().await;
        if let Some(c) = current.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let c = Arc::new(crate::db::connect(&self.db).await?);
        *current = Some(c.clone());
        Ok(c)
    }
}

/// The lanes one relay holds, and the session that holds their locks.
pub(crate) struct Lanes {
    db: DbConfig,
    session: Arc<LockSession>,
    /// The session its locks (and its member lock) were taken on; another one means they are
    /// gone.
    conn: Option<Arc<tokio_postgres::Client>>,
    /// The lanes it holds one lock each (with the gate shared).
    owned: BTreeSet<i32>,
    /// Holds the schema's lane gate exclusively: every lane, with that one lock.
    all: bool,
    /// Holds the lane gate shared, as anyone holding lanes one by one must.
    shared: bool,
    member_id: i32,
    last: Option<Instant>,
    interval: Duration,
    /// After a failure, the next attempt waits (capped, jittered) instead of every pass.
    backoff: crate::backoff::Backoff,
    retry_at: Option<Instant>,
    outages: std::sync::Arc<super::Outages>,
    /// Lanes taken and given up together: 1, or `LANES / SLOTS` in exactly-once mode (a slot).
    unit: i32,
}

impl Lanes {
    pub fn new(
        db: &DbConfig,
        session: Arc<LockSession>,
        interval: Duration,
        outages: std::sync::Arc<super::Outages>,
        by_slot: bool,
    ) -> Self {
        Self {
            unit: if by_slot { LANES / SLOTS } else { 1 },
            db: db.clone(),
            session,
            conn: None,
            owned: BTreeSet::new(),
            all: false,
            shared: false,
            member_id: fastrand::i32(1..i32::MAX),
            last: None,
            interval,
            backoff: crate::backoff::Backoff::default(),
            retry_at: None,
            outages,
        }
    }

    /// The lanes held now, for the claim query. Empty when the lock connection is gone.
    pub fn owned(&self) -> Vec<i32> {
        match &self.conn {
            Some(c) if !c.is_closed() && self.all => (0..LANES).collect(),
            Some(c) if !c.is_closed() => self.owned.iter().copied().collect(),
            _ => Vec::new(),
        }
    }

    /// Rebalances when the interval has passed (or the lock connection was lost).
    pub async fn refresh_if_due(&mut self) {
        if self.is_due() {
            self.rebalance().await;
        }
    }

    /// True when [`Lanes::refresh_if_due`] would rebalance now.
    pub fn is_due(&self) -> bool {
        let lost = self.conn.as_ref().is_none_or(|c| c.is_closed());
        if self.retry_at.is_some_and(|t| Instant::now() < t) {
            return false; // backing off after a failure
        }
        lost || self.last.is_none_or(|t| t.elapsed() >= self.interval)
    }

    /// Registers this relay, counts relays, and moves towards the fair share of lanes.
    pub async fn rebalance(&mut self) {
        self.last = Some(Instant::now());
        match self.try_rebalance().await {
            Ok(()) => {
                self.backoff.reset();
                self.retry_at = None;
                self.outages.postgres.ok();
            }
            Err(e) => {
                self.outages.postgres.failed(&format!(
                    "lane rebalance failed; holding no lanes until the lock session is back: {e}"
                ));
                self.retry_at = Some(Instant::now() + self.backoff.next_delay());
                // A dead session took its locks along. On a live one, a failed statement
                // leaves unknown which locks it holds (one it took twice needs two unlocks; a
                // gate nobody records would stop the schema's every relay): the session is
                // ended, and Postgres frees all of them. A fleet's other relays on it take
                // theirs again at their next rebalance.
                if let Some(c) = self.conn.take() {
                    end_session(&c).await;
                }
                self.owned.clear();
                (self.all, self.shared) = (false, false);
            }
        }
    }

    /// Gives up every lane and the member lock: a relay stopping while its session lives on
    /// (a fleet's). On a session of its own, closing it would do the same. If a statement
    /// fails, the session is ended instead (see [`Lanes::rebalance`]): leaving with a lock
    /// still held would strand its lanes, or with the gate, the whole schema.
    pub async fn release(&mut self) {
        let (all, shared) = (
            std::mem::take(&mut self.all),
            std::mem::take(&mut self.shared),
        );
        let Some(c) = self.conn.take().filter(|c| !c.is_closed()) else {
            self.owned.clear();
            return;
        };
        let schema = self.db.schema.name();
        let lanes: Vec<i32> = std::mem::take(&mut self.owned).into_iter().collect();
        let left = async {
            c.query_one(locks::UNLOCK_LANES, &[&lanes, &schema]).await?;
            if shared {
                c.query_one(locks::UNSHARE_LANES, &[&schema]).await?;
            }
            if all {
                c.query_one(locks::RELEASE_ALL_LANES, &[&schema]).await?;
            }
            c.query_one(locks::LEAVE_RELAYS, &[&self.member_id, &schema])
                .await
        }
        .await;
        if left.is_err() {
            end_session(&c).await;
        }
        self.session.forget(schema).await;
    }

    /// Each step updates `owned`, `all` and `shared` as soon as its statement succeeded; a
    /// failure ends the session ([`Lanes::rebalance`]), so the next rebalance starts afresh.
    async fn try_rebalance(&mut self) -> Result<(), tokio_postgres::Error> {
        let schema = self.db.schema.name().to_owned();
        let schema = schema.as_str();
        let session = self.session.client().await?;
        if !self.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, &session)) {
            // Locks died with the old session (if any). The member lock is taken once per
            // session: advisory locks count, and one unlock must let it go.
            self.owned.clear();
            (self.all, self.shared) = (false, false);
            session
                .query_one(locks::JOIN_RELAYS, &[&self.member_id, &schema])
                .await?;
            self.conn = Some(session);
        }
        let c = self.conn.as_ref().expect("connected").clone();
        let members = self.session.members(&c, schema).await?;
        let members = members.max(1) as usize;
        let before = (self.owned.len(), self.all);
        if members == 1 && !self.all {
            // Alone: every lane under one lock, granted only if no other relay still holds
            // lanes (the count missed it, or it is leaving).
            self.all = c.query_one(locks::TAKE_ALL_LANES, &[&schema]).await?.get(0);
        }
        if self.all && members == 1 {
            if !self.owned.is_empty() {
                let lanes: Vec<i32> = self.owned.iter().copied().collect();
                c.query_one(locks::UNLOCK_LANES, &[&lanes, &schema]).await?;
                self.owned.clear();
            }
            if self.shared {
                c.query_one(locks::UNSHARE_LANES, &[&schema]).await?;
                self.shared = false;
            }
        } else {
            if !self.shared {
                // Refused only while another relay holds every lane through the gate; it
                // gives way at its next rebalance, once it counts this one. (Holding the gate
                // ourselves, the share is granted.)
                self.shared = c.query_one(locks::SHARE_LANES, &[&schema]).await?.get(0);
                if !self.shared {
                    debug!(
                        relays = members,
                        "every lane is held by a relay that was alone"
                    );
                    return Ok(());
                }
            }
            self.take_share(&c, schema, members).await?;
            if self.all {
                // Another relay joined: the share is held lane by lane before the gate goes,
                // so no lane is unowned in between (nobody else holds any: they need the gate).
                c.query_one(locks::RELEASE_ALL_LANES, &[&schema]).await?;
                self.all = false;
            }
        }
        if (self.owned.len(), self.all) != before {
            info!(
                relays = members,
                lanes = self.owned().len(),
                one_lock = self.all,
                "ordering lanes rebalanced"
            );
        } else {
            debug!(
                relays = members,
                lanes = self.owned().len(),
                "ordering lanes unchanged"
            );
        }
        Ok(())
    }

    /// Moves the lanes held one by one towards the fair share of `members` relays.
    async fn take_share(
        &mut self,
        c: &tokio_postgres::Client,
        schema: &str,
        members: usize,
    ) -> Result<(), tokio_postgres::Error> {
        let unit = self.unit;
        let units = (LANES / unit) as usize;
        let target = units.div_ceil(members) * unit as usize;
        // Each change is one round trip, whatever the number of lanes: a fleet's relays of one
        // database take and give lanes through one shared session.
        let (mut keep, mut extra) = (self.owned.clone(), Vec::new());
        while keep.len() > target {
            // The highest unit goes, all of its lanes.
            let last = *keep.iter().next_back().expect("non-empty");
            let first = last - last % unit;
            extra.extend((first..first + unit).filter(|lane| keep.remove(lane)));
        }
        if !extra.is_empty() {
            // Forgotten once given back, not before.
            c.query_one(locks::UNLOCK_LANES, &[&extra, &schema]).await?;
            self.owned = keep;
        }
        if self.owned.len() < target {
            // Start at a member-specific offset so relays do not all contend for lane 0 first.
            let start = self.member_id.rem_euclid(units as i32);
            let order: Vec<i32> = (0..units as i32)
                .map(|i| ((start + i) % units as i32) * unit)
                .filter(|first| !self.owned.contains(first))
                .collect();
            if unit == 1 {
                let need = (target - self.owned.len()) as i64;
                let got = c
                    .query(locks::LOCK_LANES, &[&order, &schema, &need])
                    .await?;
                self.owned.extend(got.iter().map(|r| r.get::<_, i32>(0)));
            } else {
                for first in order {
                    if self.owned.len() >= target {
                        break;
                    }
                    let lanes: Vec<i32> = (first..first + unit).collect();
                    let all = lanes.len() as i64;
                    let got: Vec<i32> = c
                        .query(locks::LOCK_LANES, &[&lanes, &schema, &all])
                        .await?
                        .iter()
                        .map(|r| r.get(0))
                        .collect();
                    if got.len() == unit as usize {
                        self.owned.extend(got);
                    } else if !got.is_empty() {
                        // Part of a slot is no slot: give back what was taken.
                        c.query_one(locks::UNLOCK_LANES, &[&got, &schema]).await?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Ends the lock session `c` (best effort: a session that cannot run it is already broken),
/// so Postgres frees every lock it holds.
async fn end_session(c: &tokio_postgres::Client) {
    if !c.is_closed() {
        let _ = c.simple_query(locks::END_SESSION).await;
    }
}
