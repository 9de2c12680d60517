//! The relay's claim floor: the id below which every row of its lanes is already settled, so a
//! claim can start there instead of at the head of the pending index.
//!
//! Why it exists: marking a row `sent` leaves a dead entry in the pending indexes. Normally the
//! next index scan or vacuum removes it, but while *any* transaction in the database holds a
//! snapshot older than the row's update (a forgotten `BEGIN`, a long report, a stuck replica
//! slot), Postgres may neither vacuum nor kill those entries. A claim that starts at the head
//! of the index then walks every row sent since that snapshot was taken — 1.2 million entries
//! after ten minutes at 2,000 msg/s — and the relay falls behind. With a floor, the walk is the
//! few rows sent since the previous claim.
//!
//! Why it is safe: rows are not committed in id order, so "the highest id sent so far" is not a
//! floor. Every claim transaction first records a [`Sample`] (`sql::SAMPLE`): the highest
//! visible id `v`, and the transactions that hold `ROW EXCLUSIVE` on the outbox table — every
//! INSERT takes that lock before it draws its id from the sequence and keeps it until commit.
//! So every row with an id <= `v` was drawn either by one of those writers, or by a transaction
//! that had already ended (its rows are visible to any later statement). Once none of the
//! sample's writers is still running, every row up to `v` is committed or rolled back, and the
//! floor may move to `v + 1`. After each claim, one more probe (`sql::LEFT_BEHIND`) finds the
//! lowest row between the old and the new floor that is still pending — held back, deferred,
//! backed off, not yet due, or locked by someone else — and the floor stops there. It never
//! passes a pending row it has seen.
//!
//! The one escape hatch keeps a pathological transaction from pinning the floor: a writer still
//! open `long_transaction` after the sample is passed anyway; its rows, and rows put back to
//! `pending` by plain SQL, are found by the sweep ([`crate::Relay::sweep`], every
//! `sweep_interval`, off the claim path) instead of at commit. Nothing is ever skipped for good.
//! On ring storage, where nothing below a lane's cursor is read again, the writers passed are
//! listed by transaction id ([`ClaimFloor::passed`], `outbox_passed`) before the cursors pass
//! them, and the ring's sweep copies their rows once they commit.
//! (The same holds if someone sets the id sequence's `CACHE` above 1, which lets a session use
//! ids drawn long before: those rows too reach Kafka through the sweep.)

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

/// Samples kept while none can be used (a long writer is open); beyond this the oldest are
/// dropped, which only delays the floor.
const MAX_SAMPLES: usize = 100_000;

/// What the first statement of a claim transaction saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sample {
    /// When the statement returned.
    pub at: Instant,
    /// The highest id visible to the statement.
    pub max_id: i64,
    /// The transactions (virtual transaction ids) holding `ROW EXCLUSIVE` on the outbox table
    /// while the statement ran, this relay's own excluded.
    pub writers: Vec<String>,
}

/// What a claim should use, from [`ClaimFloor::begin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Begin {
    /// Scan from this id (`id >= scan_from`).
    pub scan_from: i64,
    /// Every row with an id below this is visible to the claim's statements (committed or rolled
    /// back), when that could be shown.
    pub visible_below: Option<i64>,
    /// The last claim that settled moved the floor to its bound with nothing left behind, and
    /// nothing rewound it since: no row is known to wait at the floor.
    pub clean: bool,
}

impl Begin {
    /// How far the floor may move if nothing in `[scan_from, bound)` is left pending: the ids
    /// proven visible, and no further than the last row of a full batch (rows after it were not
    /// looked at). `None` when it cannot move.
    pub fn bound(&self, full_batch_last: Option<i64>) -> Option<i64> {
        let mut b = self.visible_below?;
        if let Some(last) = full_batch_last {
            b = b.min(last.saturating_add(1));
        }
        (b > self.scan_from).then_some(b)
    }
}

/// One relay's floor state.
#[derive(Debug)]
pub(crate) struct ClaimFloor {
    floor: i64,
    lanes: Vec<i32>,
    samples: VecDeque<Sample>,
    rewind: Option<i64>,
    long_transaction: Duration,
    /// See [`Begin::clean`].
    clean: bool,
    /// See [`ClaimFloor::passed`].
    passed: HashSet<String>,
    /// The claim under way took no sample ([`ClaimFloor::begin_unsampled`]): its end leaves
    /// the floor as it is.
    unsampled: bool,
    /// When the last sample was taken.
    last_sample: Option<Instant>,
}

impl ClaimFloor {
    pub fn new(long_transaction: Duration) -> Self {
        Self {
            floor: 0,
            lanes: Vec::new(),
            samples: VecDeque::new(),
            rewind: None,
            long_transaction,
            clean: false,
            passed: HashSet::new(),
            unsampled: false,
            last_sample: None,
        }
    }

    /// Whether the next claim should take a sample (read the writers), when samples are taken
    /// at most every `every` (zero: every claim). The first claim after start waits `every` too:
    /// a short-lived pass (a fleet's tenant with a few rows) then reads no lock table at all.
    pub fn wants_sample(&mut self, every: Duration, now: Instant) -> bool {
        if every.is_zero() {
            return true;
        }
        let last = *self.last_sample.get_or_insert(now);
        now.duration_since(last) >= every
    }

    /// Starts a claim without a sample: it scans from the floor and its end moves nothing
    /// (no id is proven visible). Lane changes and rewinds apply as in [`ClaimFloor::begin`].
    pub fn begin_unsampled(&mut self, lanes: &[i32]) -> Begin {
        self.apply(lanes);
        self.unsampled = true;
        Begin {
            scan_from: self.floor,
            visible_below: None,
            clean: self.clean,
        }
    }

    fn apply(&mut self, lanes: &[i32]) {
        if self.lanes != lanes {
            // Lanes just taken over may hold old pending rows: start from the head once.
            self.lanes = lanes.to_vec();
            self.floor = 0;
            self.clean = false;
        }
        if let Some(r) = self.rewind.take() {
            self.floor = self.floor.min(r);
            self.clean = false;
        }
    }

    /// The writers this floor passed while they were open and that were still running at the
    /// last [`ClaimFloor::begin`]: ring storage (`ring.rs`) lists them before its cursors pass
    /// their rows, so their rows are found once they commit.
    pub fn passed(&self) -> Vec<String> {
        self.passed.iter().cloned().collect()
    }

    /// The current floor (0 = scan from the head).
    pub fn get(&self) -> i64 {
        self.floor
    }

    /// The lanes the floor is valid for.
    pub fn lanes(&self) -> &[i32] {
        &self.lanes
    }

    /// Asks the next claim to start at or below `id` (the sweep found a pending row there, or an
    /// operator requeued rows: `id = 0`).
    pub fn rewind_to(&mut self, id: i64) {
        self.rewind = Some(self.rewind.map_or(id, |r| r.min(id)));
    }

    /// Starts a claim: applies lane changes and rewinds, records `sample`, and says where to
    /// scan from and how far the claim's statements are proven to see.
    pub fn begin(&mut self, lanes: &[i32], sample: Sample) -> Begin {
        self.apply(lanes);
        self.unsampled = false;
        self.last_sample = Some(sample.at);
        let now = sample.at;
        let running: HashSet<String> = sample.writers.iter().cloned().collect();
        self.samples.push_back(sample);
        if self.samples.len() > MAX_SAMPLES {
            self.samples.pop_front();
        }
        Begin {
            scan_from: self.floor,
            visible_below: self.proven(now, &running).map(|v| v.saturating_add(1)),
            clean: self.clean,
        }
    }

    /// Ends a claim that committed: the floor moves to `bound` (from [`Begin::bound`]), or to
    /// `left_pending` (the lowest row below that bound still pending after the claim) when there
    /// is one. `None` leaves it where it is.
    pub fn finish(&mut self, bound: Option<i64>, left_pending: Option<i64>) {
        if std::mem::take(&mut self.unsampled) {
            return;
        }
        if let Some(bound) = bound {
            self.floor = left_pending.map_or(bound, |l| l.min(bound));
        }
        self.clean = bound.is_some() && left_pending.is_none();
    }

    /// The highest id all of whose rows (and lower ones) are proven committed or rolled back,
    /// given the writers `running` now; drops the samples it no longer needs.
    fn proven(&mut self, now: Instant, running: &HashSet<String>) -> Option<i64> {
        let cap_at = now.checked_sub(self.long_transaction);
        // A writer seen in an older sample and still running is in every later sample too, so
        // the usable samples are a prefix: take the newest.
        let usable = |s: &Sample| {
            s.writers.iter().all(|w| !running.contains(w)) || cap_at.is_some_and(|t| s.at <= t)
        };
        self.passed.retain(|w| running.contains(w));
        let j = self.samples.iter().rposition(usable)?;
        self.passed.extend(
            self.samples[j]
                .writers
                .iter()
                .filter(|w| running.contains(*w))
                .cloned(),
        );
        let max_id = self.samples[j].max_id;
        self.samples.drain(..j);
        Some(max_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LANES: &[i32] = &[0, 1];

    fn sample(t0: Instant, ms: u64, max_id: i64, writers: &[&str]) -> Sample {
        Sample {
            at: t0 + Duration::from_millis(ms),
            max_id,
            writers: writers.iter().map(|w| (*w).to_owned()).collect(),
        }
    }

    #[test]
    fn floor_follows_samples_whose_writers_ended() {
        let t0 = Instant::now();
        let mut f = ClaimFloor::new(Duration::from_secs(60));
        // Writer 3/7 is open: nothing below 10 is proven yet.
        let b = f.begin(LANES, sample(t0, 0, 10, &["3/7"]));
        assert_eq!(
            b,
            Begin {
                scan_from: 0,
                visible_below: None,
                clean: false,
            }
        );
        f.finish(b.bound(None), None);
        assert_eq!(f.get(), 0);
        // 3/7 ended, 4/2 is open: the first sample is proven, not this one.
        let b = f.begin(LANES, sample(t0, 10, 20, &["4/2"]));
        assert_eq!(b.visible_below, Some(11));
        f.finish(b.bound(None), None);
        assert_eq!(f.get(), 11);
        // No writer open: this sample proves itself.
        let b = f.begin(LANES, sample(t0, 20, 30, &[]));
        assert_eq!(
            b,
            Begin {
                scan_from: 11,
                visible_below: Some(31),
                clean: true,
            }
        );
        // A row left pending at 25 stops the floor there: not clean.
        f.finish(b.bound(None), Some(25));
        assert_eq!(f.get(), 25);
        assert!(!f.begin(LANES, sample(t0, 30, 30, &[])).clean);
    }

    #[test]
    fn unsampled_claims_leave_the_floor_and_samples_come_every_interval() {
        let t0 = Instant::now();
        let every = Duration::from_millis(200);
        let mut f = ClaimFloor::new(Duration::from_secs(60));
        // The first claim after start waits an interval: no sample.
        assert!(!f.wants_sample(every, t0));
        let b = f.begin_unsampled(LANES);
        assert_eq!(b.visible_below, None);
        f.finish(b.bound(None), None);
        assert_eq!(f.get(), 0);
        assert!(!f.wants_sample(every, t0 + Duration::from_millis(199)));
        assert!(f.wants_sample(every, t0 + Duration::from_millis(200)));
        let b = f.begin(LANES, sample(t0, 200, 50, &[]));
        assert_eq!(b.visible_below, Some(51));
        f.finish(b.bound(None), None);
        assert_eq!(f.get(), 51);
        // An unsampled claim keeps it there, even if told a bound, and keeps it clean.
        assert!(!f.wants_sample(every, t0 + Duration::from_millis(300)));
        let b = f.begin_unsampled(LANES);
        assert_eq!((b.scan_from, b.clean), (51, true));
        f.finish(Some(90), None);
        assert_eq!(f.get(), 51);
        // A rewind applies to an unsampled claim too.
        f.rewind_to(7);
        assert_eq!(f.begin_unsampled(LANES).scan_from, 7);
        // Zero: every claim samples.
        assert!(f.wants_sample(Duration::ZERO, t0));
    }

    #[test]
    fn a_long_writer_holds_the_floor_until_long_transaction() {
        let t0 = Instant::now();
        let mut f = ClaimFloor::new(Duration::from_secs(5));
        let first = f.begin(LANES, sample(t0, 0, 10, &[]));
        f.finish(first.bound(None), None);
        assert_eq!(f.get(), 11);
        // Writer 9/1 opens and stays open; others come and go.
        for i in 1..50u64 {
            let w = format!("5/{i}");
            let b = f.begin(LANES, sample(t0, i * 100, 10 + i as i64, &["9/1", &w]));
            assert_eq!(b.visible_below, Some(11), "claim {i}");
            f.finish(b.bound(None), None);
        }
        // 5 s after the first sample that saw it, it no longer holds the floor.
        assert!(f.passed().is_empty(), "not passed while it holds the floor");
        let b = f.begin(LANES, sample(t0, 5_100, 999, &["9/1"]));
        assert_eq!(b.visible_below, Some(12));
        // It was passed while open (ring storage lists it); the short writers were not.
        assert_eq!(f.passed(), ["9/1"]);
        f.finish(b.bound(None), None);
        let b = f.begin(LANES, sample(t0, 5_200, 1_000, &["9/1"]));
        assert_eq!(f.passed(), ["9/1"], "still running: still passed");
        f.finish(b.bound(None), None);
        // Once it has ended it is no longer reported.
        f.begin(LANES, sample(t0, 5_300, 1_001, &[]));
        assert!(f.passed().is_empty());
    }

    #[test]
    fn full_batches_rewinds_and_lane_changes_keep_the_floor_low() {
        let t0 = Instant::now();
        let mut f = ClaimFloor::new(Duration::from_secs(60));
        let b = f.begin(LANES, sample(t0, 0, 3_000, &[]));
        // A full batch ending at 1,800: rows after it were not looked at.
        f.finish(b.bound(Some(1_800)), None);
        assert_eq!(f.get(), 1_801);
        // Nothing proven beyond the floor: it stays.
        let b = f.begin(LANES, sample(t0, 10, 3_000, &["1/1"]));
        assert_eq!(b.bound(None), Some(3_001));
        let b = Begin {
            scan_from: 1_801,
            visible_below: Some(1_500),
            clean: true,
        };
        assert_eq!(b.bound(None), None);
        f.finish(b.bound(None), None);
        assert_eq!(f.get(), 1_801);
        // The sweep found a straggler at 42.
        f.rewind_to(42);
        f.rewind_to(700);
        let b = f.begin(LANES, sample(t0, 20, 3_100, &[]));
        assert_eq!(b.scan_from, 42);
        // New lanes: from the head.
        let b = f.begin(&[0, 1, 2], sample(t0, 30, 3_200, &[]));
        assert_eq!(b.scan_from, 0);
    }
}
