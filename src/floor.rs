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
//! floor. The floor instead advances only to ids that every still-running transaction is too
//! young to hold. Every claim transaction first records a [`Sample`]: its own xid `q` (handed
//! out in that statement, so newer than every xid handed out before) and the highest id `v` the
//! outbox sequence has handed out. An INSERT takes its id from the sequence and gets its xid in
//! the same statement, so once a later snapshot shows every xid up to `q` ended (`q < xmin`),
//! every row with id <= `v` of an *earlier* sample (taken at least [`GRACE`] before) is committed
//! or rolled back, and the claim sees it. The floor then moves to `v + 1`, but never past a row
//! this relay left pending (held back, deferred, refused, or beyond a full batch).
//!
//! Two escape hatches keep one pathological transaction from pinning the floor: a transaction
//! open longer than `long_transaction` after inserting rows is passed anyway, and the sweep
//! ([`crate::Relay::sweep`], every `sweep_interval`, off the claim path) finds any pending row
//! below the floor — those rows, and rows put back to `pending` by hand, are published by the
//! next sweep instead of at commit. Nothing is ever skipped for good.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How much earlier than a proven-finished sample the sample that gives the floor must be. The
/// id and the xid of an INSERT are taken microseconds apart; this absorbs a backend descheduled
/// between the two. (Anything slower still is found by the sweep.)
pub(crate) const GRACE: Duration = Duration::from_millis(100);
/// Samples kept while none can be used (a transaction pins the xmin); beyond this the oldest
/// are dropped, which only delays the floor.
const MAX_SAMPLES: usize = 100_000;

/// What the first statement of a claim transaction saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sample {
    /// When the statement was sent.
    pub at: Instant,
    /// The claim transaction's own xid.
    pub xid: i64,
    /// The highest id the outbox sequence had handed out.
    pub seq: i64,
}

/// What a claim should use, from [`ClaimFloor::begin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Begin {
    /// Scan from this id (`id >= scan_from`).
    pub scan_from: i64,
    /// Every row with an id below this is visible to the claim (committed or rolled back), if
    /// it could be proven.
    pub visible_below: Option<i64>,
}

/// One relay's floor state.
#[derive(Debug)]
pub(crate) struct ClaimFloor {
    floor: i64,
    lanes: Vec<i32>,
    samples: VecDeque<Sample>,
    rewind: Option<i64>,
    long_transaction: Duration,
}

impl ClaimFloor {
    pub fn new(long_transaction: Duration) -> Self {
        Self {
            floor: 0,
            lanes: Vec::new(),
            samples: VecDeque::new(),
            rewind: None,
            long_transaction,
        }
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
    /// scan from. `xmin` = the oldest running xid of the sample's snapshot; `oldest_retrying` =
    /// the oldest pending row of these lanes waiting for a retry.
    pub fn begin(
        &mut self,
        lanes: &[i32],
        sample: Sample,
        xmin: i64,
        oldest_retrying: Option<i64>,
    ) -> Begin {
        if self.lanes != lanes {
            // Lanes just taken over may hold old pending rows: start from the head once.
            self.lanes = lanes.to_vec();
            self.floor = 0;
        }
        if let Some(r) = self.rewind.take() {
            self.floor = self.floor.min(r);
        }
        let scan_from = oldest_retrying.map_or(self.floor, |r| self.floor.min(r));
        let visible_below = self.proven(sample.at, xmin).map(|v| v.saturating_add(1));
        self.samples.push_back(sample);
        if self.samples.len() > MAX_SAMPLES {
            self.samples.pop_front();
        }
        Begin {
            scan_from,
            visible_below,
        }
    }

    /// Ends a claim that committed: moves the floor to the highest id it may have, given the
    /// claim's [`Begin`], the lowest id the claim left pending (held back, deferred, refused),
    /// and — when the batch was full — the last id claimed (rows after it were not looked at).
    pub fn finish(&mut self, begin: Begin, lowest_left: Option<i64>, full_batch_last: Option<i64>) {
        let mut floor = begin.visible_below.unwrap_or(self.floor);
        if let Some(l) = lowest_left {
            floor = floor.min(l);
        }
        if let Some(last) = full_batch_last {
            floor = floor.min(last.saturating_add(1));
        }
        self.floor = floor;
    }

    /// The highest sequence value all of whose rows are proven visible to a snapshot whose
    /// oldest running xid is `xmin`, taken at `now`; drops the samples it no longer needs.
    fn proven(&mut self, now: Instant, xmin: i64) -> Option<i64> {
        // The newest sample whose transaction, and so every older one, has ended.
        let ended_at = self
            .samples
            .iter()
            .rposition(|s| s.xid < xmin)
            .and_then(|i| self.samples[i].at.checked_sub(GRACE));
        // Transactions open longer than this are passed (their rows go to the sweep).
        let cap_at = now.checked_sub(self.long_transaction);
        let usable = |s: &Sample| ended_at.is_some_and(|t| s.at <= t) || cap_at.is_some_and(|t| s.at <= t);
        let j = self.samples.iter().rposition(usable)?;
        let seq = self.samples[j].seq;
        // Usable stays usable (xmin and time only grow): keep only the newest usable sample.
        self.samples.drain(..j);
        Some(seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LANES: &[i32] = &[0, 1];

    fn sample(t0: Instant, ms: u64, xid: i64, seq: i64) -> Sample {
        Sample {
            at: t0 + Duration::from_millis(ms),
            xid,
            seq,
        }
    }

    #[test]
    fn floor_follows_samples_whose_transactions_ended() {
        let t0 = Instant::now();
        let mut f = ClaimFloor::new(Duration::from_secs(60));
        // First claim: nothing proven yet, scan from the head.
        let b = f.begin(LANES, sample(t0, 0, 100, 10), 100, None);
        assert_eq!(b, Begin { scan_from: 0, visible_below: None });
        f.finish(b, None, None);
        assert_eq!(f.get(), 0);
        // 200 ms later, xid 100 has ended but no sample is GRACE older than it: still nothing.
        let b = f.begin(LANES, sample(t0, 200, 105, 20), 101, None);
        assert_eq!(b.visible_below, None);
        f.finish(b, None, None);
        // Later still, xid 105 ended too: the sample at 0 ms is GRACE older than the one at
        // 200 ms, so every id <= 10 is visible.
        let b = f.begin(LANES, sample(t0, 400, 110, 30), 106, None);
        assert_eq!(b.visible_below, Some(11));
        f.finish(b, None, None);
        assert_eq!(f.get(), 11);
    }

    #[test]
    fn a_running_old_transaction_holds_the_floor_until_long_transaction() {
        let t0 = Instant::now();
        let mut f = ClaimFloor::new(Duration::from_secs(5));
        // xid 50 stays open for the whole test: xmin is 50 at every claim.
        for i in 0..40u64 {
            let b = f.begin(LANES, sample(t0, i * 100, 100 + i as i64, 10 * i as i64), 50, None);
            assert_eq!(b.visible_below, None, "claim {i}");
            f.finish(b, None, None);
        }
        // Past long_transaction the floor moves to the sample taken 5 s ago anyway.
        let b = f.begin(LANES, sample(t0, 5_100, 200, 999), 50, None);
        assert_eq!(b.visible_below, Some(11));
        f.finish(b, None, None);
        assert_eq!(f.get(), 11);
    }

    #[test]
    fn rows_left_pending_retries_lane_changes_and_rewinds_keep_the_floor_low() {
        let t0 = Instant::now();
        let mut f = ClaimFloor::new(Duration::from_secs(60));
        for (ms, xid, seq) in [(0, 100, 1_000), (200, 101, 2_000)] {
            let b = f.begin(LANES, sample(t0, ms, xid, seq), xid, None);
            assert_eq!(b.visible_below, None);
            f.finish(b, None, None);
        }
        let b = f.begin(LANES, sample(t0, 400, 102, 3_000), 102, None);
        assert_eq!(b.visible_below, Some(1_001));
        // A held-back (or deferred, or refused) row at 900 keeps the floor there.
        f.finish(b, Some(900), None);
        assert_eq!(f.get(), 900);
        let b = f.begin(LANES, sample(t0, 600, 103, 3_500), 103, None);
        assert_eq!(b, Begin { scan_from: 900, visible_below: Some(2_001) });
        // A full batch ending at 1,800: rows after it were not looked at.
        f.finish(b, None, Some(1_800));
        assert_eq!(f.get(), 1_801);
        // A retrying row below the floor: the scan starts there, the floor moves on.
        let b = f.begin(LANES, sample(t0, 800, 104, 3_600), 104, Some(700));
        assert_eq!(b, Begin { scan_from: 700, visible_below: Some(3_001) });
        f.finish(b, None, None);
        assert_eq!(f.get(), 3_001);
        // The sweep found a straggler at 42.
        f.rewind_to(42);
        let b = f.begin(LANES, sample(t0, 1_000, 105, 3_700), 105, None);
        assert_eq!(b.scan_from, 42);
        // New lanes: from the head.
        let b = f.begin(&[0, 1, 2], sample(t0, 1_200, 106, 3_800), 106, None);
        assert_eq!(b.scan_from, 0);
    }
}
