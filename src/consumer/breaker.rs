//! The circuit breaker shared by every replica of a consumer group, kept in
//! Postgres (`circuit_breakers`) instead of Redis.
//!
//! **NORMAL** → a handler reports a dependency unavailable ([`super::HandlerError::unavailable`])
//! past its in-place retries, or the failure rate crosses the threshold → the breaker row is
//! set open for `open_for` and the message is parked in `<topic>.dlq` (`x-error-kind:
//! unavailable`) → **PAUSED**: every replica sees the open row within `check_interval` and
//! pauses its main-topic partitions (group membership kept, no handler runs) → the row expires
//! → **DRAIN**: the replica reads its own parked letters from `<topic>.dlq` with the main topic
//! still paused, throttled (`drain_rate`, `drain_concurrency`), applying the envelope policies
//! (deadline, `max_dlq_retries`, freshness check) → at the end of its DLQ partitions → NORMAL,
//! main topic resumed. A failure during the drain re-opens the breaker for twice as long (up
//! to `max_open_for`) and parks the letter again with `x-dlq-retries + 1`.
//!
//! **Probe before trust**: an expired row is not yet trusted (its `streak` is above 0: the
//! dependency has not answered since it opened). One replica of the group takes the probe
//! (**PROBE**: its own parked letters first, then, if none brought a success, its main topics;
//! one call at a time at `drain_rate`) while the others stay PAUSED. The first successful call
//! confirms the row for the whole group (`streak` = 0) and every replica drains; a failure
//! re-opens it for twice as long. An empty drain, or one whose letters were all dropped by
//! policy, never counts as a success.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use deadpool_postgres::Pool;
use serde::Serialize;
use tracing::{info, warn};

use crate::schema::Schema;

/// Default for [`BreakerConfig::check_interval`].
pub const DEFAULT_BREAKER_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Default for [`BreakerConfig::open_for`].
pub const DEFAULT_OPEN_FOR: Duration = Duration::from_secs(30);

/// A failure-rate threshold: the breaker opens when, within `window`, at least `min_calls`
/// handler calls were made and more than `threshold` of them failed as unavailable.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct FailureRate {
    /// Share of calls (0.5 = 50 %).
    pub threshold: f64,
    /// Calls needed before the rate counts.
    pub min_calls: u32,
    /// The sliding window.
    pub window: Duration,
}

/// Breaker and drain settings, each with its default.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BreakerConfig {
    /// How often every replica re-reads the shared breaker rows (default 1 s).
    pub check_interval: Duration,
    /// How long an opened breaker stays open (default 30 s); each re-open before a completed
    /// drain doubles it.
    pub open_for: Duration,
    /// The cap of the doubling (default 10 min).
    pub max_open_for: Duration,
    /// In-place attempts for an unavailable dependency before the breaker opens (default 3).
    pub attempts: u32,
    /// Wait between those attempts (default 200 ms).
    pub retry_delay: Duration,
    /// Also open on a failure rate (default off).
    pub failure_rate: Option<FailureRate>,
    /// Parked letters handled at once during a drain (default 4).
    pub drain_concurrency: usize,
    /// Parked letters handled per second during a drain, at most (default 10).
    pub drain_rate: f64,
    /// A letter parked more often than this is dropped as `max_dlq_retries` (default 5).
    pub max_dlq_retries: u32,
    /// A letter whose first failure is older than this is dropped as `deadline_exceeded`
    /// (default 24 h).
    pub deadline: Duration,
    /// The dependencies this group's handlers name in [`super::HandlerError::unavailable`],
    /// declared in every replica's heartbeat: an operator opening a breaker by hand picks
    /// from them, and a name no replica declares (a typo) is refused unless confirmed.
    pub dependencies: Vec<String>,
}

impl BreakerConfig {
    /// Default [`BreakerConfig::check_interval`].
    pub const DEFAULT_CHECK_INTERVAL: Duration = DEFAULT_BREAKER_CHECK_INTERVAL;
    /// Default [`BreakerConfig::open_for`].
    pub const DEFAULT_OPEN_FOR: Duration = DEFAULT_OPEN_FOR;
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            dependencies: Vec::new(),
            check_interval: DEFAULT_BREAKER_CHECK_INTERVAL,
            open_for: DEFAULT_OPEN_FOR,
            max_open_for: Duration::from_secs(600),
            attempts: 3,
            retry_delay: Duration::from_millis(200),
            failure_rate: None,
            drain_concurrency: 4,
            drain_rate: 10.0,
            max_dlq_retries: 5,
            deadline: Duration::from_secs(24 * 3600),
        }
    }
}

impl BreakerConfig {
    pub(super) fn validate(&self) -> Result<(), String> {
        if self.check_interval.is_zero() || self.open_for.is_zero() {
            return Err("breaker check_interval and open_for must be positive".into());
        }
        if self.max_open_for < self.open_for {
            return Err("breaker max_open_for must be at least open_for".into());
        }
        if self.attempts == 0 || self.drain_concurrency == 0 {
            return Err("breaker attempts and drain_concurrency must be at least 1".into());
        }
        if !(self.drain_rate.is_finite() && self.drain_rate > 0.0) {
            return Err("breaker drain_rate must be positive".into());
        }
        if let Some(f) = self.failure_rate {
            if !(0.0..=1.0).contains(&f.threshold) || f.min_calls == 0 || f.window.is_zero() {
                return Err("failure_rate: threshold 0..1, min_calls ≥ 1, window > 0".into());
            }
        }
        Ok(())
    }
}

/// Where the consumer is in the NORMAL → PAUSED → DRAIN cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BreakerMode {
    /// Consuming the main topics.
    Normal,
    /// A dependency's breaker is open: main topics paused, no handler calls.
    Paused,
    /// Breakers closed: parked letters first, main topics still paused.
    Drain,
    /// Breakers expired but not yet trusted, and this replica holds the probe: one call at a
    /// time, its parked letters first, then its main topics.
    Probe,
}

impl BreakerMode {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Paused,
            2 => Self::Drain,
            3 => Self::Probe,
            _ => Self::Normal,
        }
    }
    fn as_u8(self) -> u8 {
        match self {
            Self::Normal => 0,
            Self::Paused => 1,
            Self::Drain => 2,
            Self::Probe => 3,
        }
    }
}

/// One open breaker.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpenBreaker {
    /// The dependency.
    pub name: String,
    /// Seconds until it closes.
    pub closes_in_secs: f64,
    /// Why it opened.
    pub reason: Option<String>,
    /// Which replica opened it.
    pub opened_by: String,
    /// Opens so far (the row's generation).
    pub generation: i64,
}

/// A snapshot of [`super::Consumer::state`].
#[derive(Debug, Clone, Serialize)]
pub struct ConsumerState {
    /// The current mode.
    pub mode: BreakerMode,
    /// How long it has been in that mode.
    pub mode_for_secs: f64,
    /// Breakers open as last read.
    pub open: Vec<OpenBreaker>,
    /// Messages parked in the DLQ because a dependency was unavailable.
    pub parked: u64,
    /// Parked letters handled by drains.
    pub drained: u64,
    /// Parked letters dropped by a policy (deadline, retries, obsolete).
    pub dropped: u64,
    /// Parked letters parked again (a failure during a drain, a failed freshness query).
    pub reparked: u64,
    /// Breaker opens made by this replica.
    pub opens: u64,
}

/// Shared between the runtime, its tasks and [`StateHandle`].
pub(crate) struct Breakers {
    pool: Pool,
    schema: Schema,
    pub group: String,
    pub config: BreakerConfig,
    me: String,
    /// The group's breakers as last read: one lock, so a reader never sees half of a refresh.
    seen: Mutex<Seen>,
    /// One refresh at a time: what is published is never older than what it replaces.
    refreshing: tokio::sync::Mutex<()>,
    mode: AtomicU8,
    mode_since: Mutex<Instant>,
    calls: Mutex<VecDeque<(Instant, bool)>>,
    pub parked: AtomicU64,
    pub drained: AtomicU64,
    pub dropped: AtomicU64,
    pub reparked: AtomicU64,
    pub opens: AtomicU64,
    /// Postgres answered the last refresh (for the "back" log line).
    reachable: Mutex<bool>,
    /// Signalled when the set of open breakers changes, so the runtime steers at once.
    pub changed: tokio::sync::Notify,
    /// In PROBE, the parked letters are done without a success: probe with the main topics.
    pub probe_main: std::sync::atomic::AtomicBool,
    /// Calls made by this replica while probing (for its log line).
    pub probes: AtomicU64,
}

/// The group's breakers as one refresh read them.
#[derive(Default)]
struct Seen {
    /// Open breakers by dependency.
    open: HashMap<String, OpenBreaker>,
    /// Expired, untrusted breakers: dependency → whether this replica holds the probe.
    half_open: HashMap<String, bool>,
}

/// What the runtime steers by, read at one instant.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View {
    /// Some breaker of the group is open.
    pub open: bool,
    /// Some breaker of the group expired without being trusted again yet.
    pub untrusted: bool,
    /// This replica holds the probe of every untrusted breaker of the group.
    pub probing: bool,
}

/// What the runtime is to do next by the breaker: the consumer's mode machine (NORMAL,
/// PAUSED, PROBE, DRAIN) as a pure function of what it reads, so the runtime only applies
/// decisions (pauses, resumes, drain targets) and the transitions are tested by table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Nothing changes.
    Stay,
    /// Switch to the mode, for the reason (logged).
    Go(BreakerMode, &'static str),
    /// The drain is complete: back to NORMAL, and the failure streaks start again.
    Drained,
    /// A probe whose parked letters brought no success: probe with the main topics.
    ProbeMain,
}

/// What new partitions mean: a healthy NORMAL consumer drains their parked letters first
/// (`Go`); one already draining or probing recomputes its drain targets (`Stay`, the caller
/// then re-targets); otherwise nothing (`None`).
pub(super) fn on_assigned(mode: BreakerMode, view: View) -> Option<Step> {
    match mode {
        BreakerMode::Normal if !view.open && !view.untrusted => Some(Step::Go(
            BreakerMode::Drain,
            "partitions assigned: draining their parked letters first",
        )),
        BreakerMode::Drain | BreakerMode::Probe => Some(Step::Stay),
        _ => None,
    }
}

/// The next step from `mode` given `view`; `drain_complete` is asked only where it matters
/// (it reads the broker's watermarks).
pub(super) fn next_step(
    mode: BreakerMode,
    view: View,
    probe_main: bool,
    mut drain_complete: impl FnMut() -> bool,
) -> Step {
    let View {
        open,
        untrusted,
        probing,
    } = view;
    match mode {
        BreakerMode::Normal | BreakerMode::Drain | BreakerMode::Probe if open => {
            Step::Go(BreakerMode::Paused, "breaker open")
        }
        BreakerMode::Normal | BreakerMode::Drain if untrusted => Step::Go(
            BreakerMode::Paused,
            "breaker expired: waiting for a probe before trusting the dependency",
        ),
        BreakerMode::Paused if !open && untrusted && probing => Step::Go(
            BreakerMode::Probe,
            "breaker expired: probing the dependency (one call at a time)",
        ),
        BreakerMode::Paused if !open && !untrusted => Step::Go(
            BreakerMode::Drain,
            "breaker closed and trusted: draining parked letters",
        ),
        BreakerMode::Probe if !untrusted => Step::Go(
            BreakerMode::Drain,
            "the dependency answered: draining parked letters",
        ),
        BreakerMode::Probe if !probing => {
            Step::Go(BreakerMode::Paused, "another replica holds the probe")
        }
        // The parked letters brought no success (none of our own, or all dropped by
        // policy): an empty drain proves nothing, so probe with the main topics.
        BreakerMode::Probe if !probe_main && drain_complete() => Step::ProbeMain,
        BreakerMode::Drain if drain_complete() => Step::Drained,
        _ => Step::Stay,
    }
}

/// A handle on a consumer's breaker state, readable while it runs.
#[derive(Clone)]
pub struct StateHandle(pub(crate) Arc<Breakers>);

impl StateHandle {
    /// The current state.
    pub fn get(&self) -> ConsumerState {
        let b = &self.0;
        let mut open: Vec<OpenBreaker> = b
            .seen
            .lock()
            .expect("breakers")
            .open
            .values()
            .cloned()
            .collect();
        open.sort_by(|a, c| a.name.cmp(&c.name));
        ConsumerState {
            mode: b.mode(),
            mode_for_secs: b.mode_since.lock().expect("mode").elapsed().as_secs_f64(),
            open,
            parked: b.parked.load(Ordering::Relaxed),
            drained: b.drained.load(Ordering::Relaxed),
            dropped: b.dropped.load(Ordering::Relaxed),
            reparked: b.reparked.load(Ordering::Relaxed),
            opens: b.opens.load(Ordering::Relaxed),
        }
    }
}

impl Breakers {
    pub fn new(pool: Pool, schema: Schema, group: String, config: BreakerConfig) -> Self {
        Self {
            pool,
            schema,
            group,
            config,
            me: crate::instances::instance_name(),
            seen: Mutex::default(),
            refreshing: tokio::sync::Mutex::default(),
            mode: AtomicU8::new(BreakerMode::Normal.as_u8()),
            mode_since: Mutex::new(Instant::now()),
            calls: Mutex::default(),
            parked: AtomicU64::default(),
            drained: AtomicU64::default(),
            dropped: AtomicU64::default(),
            reparked: AtomicU64::default(),
            opens: AtomicU64::default(),
            reachable: Mutex::new(true),
            changed: tokio::sync::Notify::new(),
            probe_main: std::sync::atomic::AtomicBool::new(false),
            probes: AtomicU64::default(),
        }
    }

    /// Open, untrusted and probing, as the last refresh read them.
    pub fn view(&self) -> View {
        let s = self.seen.lock().expect("breakers");
        View {
            open: !s.open.is_empty(),
            untrusted: !s.half_open.is_empty(),
            probing: !s.half_open.is_empty() && s.half_open.values().all(|mine| *mine),
        }
    }

    /// Reads the group's breakers, and takes or renews the probe of each untrusted one where
    /// no other replica holds it (the lease outlives three checks, so a dead prober's lapses
    /// quickly).
    async fn read(&self, c: &deadpool_postgres::Object) -> Result<Seen, tokio_postgres::Error> {
        let rows = c
            .query(
                &crate::sql::render(crate::sql::breakers::STATE_OF_GROUP, &self.schema),
                &[&self.group, &self.me],
            )
            .await?;
        let lease = (self.config.check_interval.as_secs_f64() * 3.0).max(3.0);
        let mut seen = Seen::default();
        for r in rows {
            let name: String = r.get(0);
            if r.get::<_, bool>(1) {
                let b = OpenBreaker {
                    name: name.clone(),
                    closes_in_secs: r.get(2),
                    reason: r.get(3),
                    opened_by: r.get(4),
                    generation: r.get(5),
                };
                seen.open.insert(name, b);
                continue;
            }
            let (mine, taken): (bool, bool) = (r.get(6), r.get(7));
            // A claim that finds the row re-opened meanwhile returns nothing: not ours, and
            // the next check reads it open.
            let mine = if mine || !taken {
                c.query_opt(
                    &crate::sql::render(crate::sql::breakers::CLAIM_PROBE, &self.schema),
                    &[&self.group, &name, &self.me, &lease],
                )
                .await?
                .is_some()
            } else {
                false
            };
            seen.half_open.insert(name, mine);
        }
        Ok(seen)
    }

    /// A call succeeded while probing (or draining): the group's expired breakers are
    /// trusted again, for every replica, and the next outage starts at `open_for`.
    pub async fn confirm(&self) {
        if !self.view().untrusted {
            return;
        }
        let done = match self.pool.get().await {
            Ok(c) => c
                .execute(
                    &crate::sql::render(crate::sql::breakers::CONFIRM, &self.schema),
                    &[&self.group],
                )
                .await
                .ok(),
            Err(_) => None,
        };
        if done.is_some_and(|n| n > 0) {
            let deps: Vec<String> = self
                .seen
                .lock()
                .expect("breakers")
                .half_open
                .keys()
                .cloned()
                .collect();
            info!(group = %self.group, dependency = ?deps, calls = self.probes.load(Ordering::Relaxed), "probe succeeded: the dependency answers again; the breaker cycle closes for the group");
        }
        self.refresh().await;
    }

    pub fn mode(&self) -> BreakerMode {
        BreakerMode::from_u8(self.mode.load(Ordering::SeqCst))
    }

    /// Switches mode; logs the transition once with how long the previous mode lasted.
    pub fn set_mode(&self, to: BreakerMode, why: &str) {
        let from = self.mode();
        if from == to {
            return;
        }
        let lasted = {
            let mut s = self.mode_since.lock().expect("mode");
            let d = s.elapsed();
            *s = Instant::now();
            d
        };
        self.mode.store(to.as_u8(), Ordering::SeqCst);
        let deps: Vec<String> = self
            .seen
            .lock()
            .expect("breakers")
            .open
            .keys()
            .cloned()
            .collect();
        info!(group = %self.group, dependency = ?deps, from = ?from, to = ?to, reason = why, lasted = ?lasted, "consumer breaker transition");
        metrics::gauge!(crate::metrics::CONSUMER_MODE, "group" => self.group.clone())
            .set(f64::from(to.as_u8()));
    }

    pub fn is_open(&self, name: &str) -> bool {
        self.seen
            .lock()
            .expect("breakers")
            .open
            .get(name)
            .is_some_and(|b| b.closes_in_secs > 0.0)
    }

    /// Re-reads the group's breakers and publishes them at once. On a Postgres error the last
    /// known state stays (a breaker that was open keeps the consumer paused; it is re-read on
    /// reconnect).
    pub async fn refresh(&self) {
        let _one = self.refreshing.lock().await;
        let read = match self.pool.get().await {
            Ok(c) => self.read(&c).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let seen = match read {
            Ok(seen) => seen,
            Err(e) => return self.unreachable(&e),
        };
        {
            let mut r = self.reachable.lock().expect("reachable");
            if !*r {
                info!(group = %self.group, "breaker state re-read from Postgres after an outage");
                *r = true;
            }
        }
        let changed = {
            let mut cur = self.seen.lock().expect("breakers");
            for name in cur.open.keys().filter(|k| !seen.open.contains_key(*k)) {
                metrics::gauge!(crate::metrics::BREAKER_OPEN, "group" => self.group.clone(), "dependency" => name.clone()).set(0.0);
            }
            for name in seen.open.keys() {
                metrics::gauge!(crate::metrics::BREAKER_OPEN, "group" => self.group.clone(), "dependency" => name.clone()).set(1.0);
            }
            let changed = cur.open.len() != seen.open.len()
                || cur.open.keys().any(|k| !seen.open.contains_key(k))
                || cur.half_open != seen.half_open;
            *cur = seen;
            changed
        };
        if changed {
            self.changed.notify_one();
        }
    }

    fn unreachable(&self, e: &str) {
        let mut r = self.reachable.lock().expect("reachable");
        if *r {
            warn!(group = %self.group, error = %e, "cannot read the breaker state; keeping the last known until Postgres is back");
            *r = false;
        }
        // Let known breakers run out on the local clock meanwhile. One that runs out is not
        // trusted: no probe can be claimed without Postgres, so this replica probes on its own
        // (one call at a time), never resumes at full speed on a guess.
        let step = self.config.check_interval.as_secs_f64();
        let mut s = self.seen.lock().expect("breakers");
        let mut expired = Vec::new();
        s.open.retain(|name, b| {
            b.closes_in_secs -= step;
            let open = b.closes_in_secs > 0.0;
            if !open {
                expired.push(name.clone());
            }
            open
        });
        s.half_open
            .extend(expired.into_iter().map(|name| (name, true)));
    }

    /// Opens the breaker for `name` (no-op when another replica already did). Returns how
    /// long it is open.
    pub async fn open(&self, name: &str, reason: &str) -> Option<Duration> {
        let base = self.config.open_for.as_secs_f64();
        let cap = self.config.max_open_for.as_secs_f64();
        let reason = crate::wire::cut(reason);
        let c = match self.pool.get().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, dependency = name, "cannot open the shared breaker (Postgres unreachable); opening it locally");
                self.local_open(name, base, &reason);
                return None;
            }
        };
        let row = c
            .query_opt(
                &crate::sql::render(crate::sql::breakers::OPEN, &self.schema),
                &[&self.group, &name, &base, &cap, &self.me, &reason],
            )
            .await;
        match row {
            Ok(Some(r)) => {
                let secs: f64 = r.get(0);
                self.opens.fetch_add(1, Ordering::Relaxed);
                warn!(group = %self.group, dependency = name, open_for = ?Duration::from_secs_f64(secs.max(0.0)), %reason, "circuit breaker opened for every replica");
                self.local_open(name, secs, &reason);
                Some(Duration::from_secs_f64(secs.max(0.0)))
            }
            Ok(None) => {
                // Already open (another replica was first): read it.
                self.refresh().await;
                None
            }
            Err(e) => {
                warn!(error = %e, dependency = name, "cannot open the shared breaker; opening it locally");
                self.local_open(name, base, &reason);
                None
            }
        }
    }

    fn local_open(&self, name: &str, secs: f64, reason: &str) {
        self.seen.lock().expect("breakers").open.insert(
            name.to_owned(),
            OpenBreaker {
                name: name.to_owned(),
                closes_in_secs: secs,
                reason: Some(reason.to_owned()),
                opened_by: self.me.clone(),
                generation: 0,
            },
        );
    }

    /// After a completed drain that followed a confirmation: the next outage starts again at
    /// `open_for`.
    pub async fn reset_streaks(&self) {
        if let Ok(c) = self.pool.get().await {
            let _ = c
                .execute(
                    &crate::sql::render(crate::sql::breakers::RESET_STREAK, &self.schema),
                    &[&self.group],
                )
                .await;
        }
    }

    /// Records a handler call for the failure-rate rule; returns the dependency whose rate
    /// crossed the threshold.
    pub fn record_call(&self, failed_dependency: Option<&str>) -> bool {
        let Some(rule) = self.config.failure_rate else {
            return false;
        };
        let mut calls = self.calls.lock().expect("calls");
        let now = Instant::now();
        calls.push_back((now, failed_dependency.is_some()));
        while calls
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > rule.window)
        {
            calls.pop_front();
        }
        let n = calls.len() as u32;
        let failed = calls.iter().filter(|(_, f)| *f).count() as f64;
        failed_dependency.is_some() && n >= rule.min_calls && failed / f64::from(n) > rule.threshold
    }
}

/// Paces drain dispatches: at most `rate` per second.
pub(super) struct DrainPacer {
    period: Duration,
    next: Instant,
}

impl DrainPacer {
    pub fn new(rate: f64) -> Self {
        Self {
            period: Duration::from_secs_f64(1.0 / rate),
            next: Instant::now(),
        }
    }
    /// When the next dispatch may happen (None: now).
    pub fn wait(&self) -> Option<Instant> {
        (self.next > Instant::now()).then_some(self.next)
    }
    pub fn take(&mut self) {
        let now = Instant::now();
        self.next = self.next.max(now) + self.period;
    }
}

/// When a parked letter was first dead-lettered, from its envelope.
pub(super) fn first_failed(headers: &[(String, Option<Vec<u8>>)]) -> Option<SystemTime> {
    headers
        .iter()
        .find(|(k, _)| k == super::X_FIRST_FAILED_AT)
        .and_then(|(_, v)| v.as_deref())
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| humantime::parse_rfc3339_weak(v).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_machine_goes_normal_paused_probe_drain_normal() {
        use BreakerMode::*;
        let v = |open, untrusted, probing| View {
            open,
            untrusted,
            probing,
        };
        let go = |s: Step| match s {
            Step::Go(m, _) => Some(m),
            _ => None,
        };
        // Opened anywhere but PAUSED: pause.
        for m in [Normal, Drain, Probe] {
            assert_eq!(
                go(next_step(m, v(true, false, false), false, || true)),
                Some(Paused)
            );
        }
        assert_eq!(
            next_step(Paused, v(true, false, false), false, || true),
            Step::Stay
        );
        // Expired but untrusted: NORMAL and DRAIN wait; the replica holding the probe probes.
        assert_eq!(
            go(next_step(Normal, v(false, true, false), false, || true)),
            Some(Paused)
        );
        assert_eq!(
            go(next_step(Paused, v(false, true, true), false, || true)),
            Some(Probe)
        );
        assert_eq!(
            next_step(Paused, v(false, true, false), false, || true),
            Step::Stay
        );
        assert_eq!(
            go(next_step(Probe, v(false, true, false), false, || true)),
            Some(Paused)
        );
        // Trusted again: drain, then NORMAL once the drain is complete (and not before).
        assert_eq!(
            go(next_step(Paused, v(false, false, false), false, || true)),
            Some(Drain)
        );
        assert_eq!(
            go(next_step(Probe, v(false, false, true), false, || true)),
            Some(Drain)
        );
        assert_eq!(
            next_step(Drain, v(false, false, false), false, || false),
            Step::Stay
        );
        assert_eq!(
            next_step(Drain, v(false, false, false), false, || true),
            Step::Drained
        );
        // A probe whose parked letters ran out without a success probes with the main topics,
        // once.
        assert_eq!(
            next_step(Probe, v(false, true, true), false, || true),
            Step::ProbeMain
        );
        assert_eq!(
            next_step(Probe, v(false, true, true), true, || true),
            Step::Stay
        );
        assert_eq!(
            next_step(Probe, v(false, true, true), false, || false),
            Step::Stay
        );
        // NORMAL and healthy never asks whether a drain is complete.
        assert_eq!(
            next_step(Normal, v(false, false, false), false, || panic!(
                "not asked"
            )),
            Step::Stay
        );
        // New partitions: a healthy consumer drains first; a draining one re-targets.
        assert_eq!(
            go(on_assigned(Normal, v(false, false, false)).unwrap()),
            Some(Drain)
        );
        assert_eq!(on_assigned(Drain, v(false, false, false)), Some(Step::Stay));
        assert_eq!(on_assigned(Probe, v(false, true, true)), Some(Step::Stay));
        assert_eq!(on_assigned(Normal, v(true, false, false)), None);
        assert_eq!(on_assigned(Paused, v(false, false, false)), None);
    }

    fn breakers(rule: Option<FailureRate>) -> Breakers {
        let db = crate::DbConfig::new("postgres://u:p@127.0.0.1:1/x", "public").unwrap();
        Breakers::new(
            crate::db::pool(&db).unwrap(),
            Schema::default(),
            "g".into(),
            BreakerConfig {
                failure_rate: rule,
                ..BreakerConfig::default()
            },
        )
    }

    #[test]
    fn the_failure_rate_opens_only_past_the_threshold_with_enough_calls() {
        let b = breakers(Some(FailureRate {
            threshold: 0.5,
            min_calls: 4,
            window: Duration::from_secs(60),
        }));
        assert!(!b.record_call(Some("api")), "1 call: not enough calls");
        assert!(!b.record_call(None));
        assert!(!b.record_call(None));
        assert!(!b.record_call(Some("api")), "2 of 4 failed: not above 50 %");
        assert!(b.record_call(Some("api")), "3 of 5 failed: above 50 %");
        assert!(!b.record_call(None), "a success never opens");
        let off = breakers(None);
        for _ in 0..10 {
            assert!(!off.record_call(Some("api")));
        }
    }

    #[test]
    fn the_drain_pacer_spaces_dispatches() {
        let mut p = DrainPacer::new(10.0);
        assert!(p.wait().is_none());
        p.take();
        let next = p.wait().expect("the next one waits");
        let gap = next.duration_since(Instant::now());
        assert!(
            gap > Duration::from_millis(80) && gap <= Duration::from_millis(100),
            "{gap:?}"
        );
    }

    #[test]
    fn invalid_settings_are_refused() {
        let bad = |f: fn(&mut BreakerConfig)| {
            let mut c = BreakerConfig::default();
            f(&mut c);
            c.validate().is_err()
        };
        assert!(bad(|c| c.open_for = Duration::ZERO));
        assert!(bad(|c| c.max_open_for = Duration::from_secs(1)));
        assert!(bad(|c| c.drain_rate = 0.0));
        assert!(bad(|c| c.attempts = 0));
        assert!(BreakerConfig::default().validate().is_ok());
    }
}
