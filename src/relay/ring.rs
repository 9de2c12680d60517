//! The relay on append-only storage (`sql/ring.rs`, issue 33): read, don't claim.
//!
//! A claim reads the ring from each lane's cursor up to the ids the claim floor proves
//! committed or rolled back (`floor.rs`: the same samples, `visible_below`), plus the due rows
//! of the retry table. Nothing is locked but the retry rows: the lanes are this relay's alone
//! (advisory locks, `lanes.rs`). Settling moves each lane's cursor past what was read, in the
//! claim's transaction, and copies into the retry table every ring row that did not reach Kafka
//! (refused, or held behind a row of its key that is in the retry table or was refused here).
//! A lane whose batch left a row deferred (Kafka unreachable, no report) stops at that row and
//! reads it again, with everything after it, and copies nothing.
//!
//! A writer the floor passes while still open (open longer than `long_transaction`) is
//! listed by its xid in the claim's transaction (`outbox_passed`); once it has committed, the
//! ring's sweep ([`sweep_passed`]) copies its rows below the cursors into the retry table.
//!
//! Pipelined batches: a batch reads from where the one before it stopped reading, before that
//! one settled. Its cursor moves only if the lane's cursor reached where it started reading
//! (the batch before it settled that far): otherwise its rows are read again, and since the
//! copies happen only for lanes that moved, a row is never both re-read and copied.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::Instrument as _;

use super::*;

/// How long a relay trusts what it saw of the schema's storage before looking again (a schema
/// moved onto the ring while relays run is seen within this).
const LAYOUT_TTL: Duration = Duration::from_secs(10);

/// How long a relay trusts its list of leaves to read (a leaf that stopped being settled — a
/// row written into it late — is read again within this; rotation keeps it meanwhile).
const LEAVES_TTL: Duration = Duration::from_secs(1);

/// Which storage a schema's outbox is on, and which leaves of the ring hold rows not yet read,
/// as last seen.
#[derive(Debug, Default)]
pub(crate) struct Layout {
    /// On ring storage, and when that was seen.
    ring: Mutex<Option<(bool, Instant)>>,
    /// The leaves to read (`{gens}`), and when they were listed.
    leaves: Mutex<Option<(String, Instant)>>,
    /// Lanes a settled batch kept where they were (no row of theirs in what it read, see
    /// [`IDLE_LAG`]), each with how far it is known to hold no row left to read: every row of
    /// the lane from its cursor up to there was read and settled. A later batch that read past
    /// that batch moves such a lane although its cursor is short of where it started reading.
    /// Cleared when a settle fails or the lanes change hands.
    clean: Mutex<HashMap<i32, i64>>,
    /// The cursors of this relay's lanes as it knows them: read by a claim, then moved by its
    /// own settles (no one else moves a lane this relay holds), so a claim need not read them
    /// again (64 probes of the cursor log, a third of a sample's cost). A lane whose move did
    /// not happen as expected is dropped; all are dropped when a settle fails or the lanes
    /// change hands, and never used in exactly-once mode (its recovery moves cursors too).
    cursors: Mutex<HashMap<i32, i64>>,
    /// Rows read ahead of the proof (see [`READ_AHEAD_CAP`]), by id: their lane, and whether
    /// their batch has settled them (sent, or copied into the retry table). Later reads skip
    /// them; a lane moves past one only once it is settled; dropped once the lane's cursor
    /// passed them. Cleared when a settle fails or the lanes change hands (the rows are then
    /// read again: at-least-once), never used in exactly-once mode.
    ahead: Mutex<HashMap<i64, (i32, bool)>>,
    /// A settle forgot a row read ahead (it did not reach Kafka and could not be copied):
    /// the pass ends, so the next one reads from the cursors, and no batch claimed after
    /// this one can send a later row of its key before it is read again.
    pub(super) forgot: std::sync::atomic::AtomicBool,
}

/// What a ring claim read, for its settle.
pub(crate) struct RingRead {
    /// Where the batch started reading (every lane: `max(from, its cursor)`).
    from: i64,
    /// The cursors of the claim's lanes when it sampled, in lane order.
    cursors: Vec<i64>,
    /// How far the lanes may move if nothing stops them: the proven ids, cut at the last row of
    /// a full batch. `None`: nothing was proven, nothing read from the ring.
    bound: Option<i64>,
    /// Ring rows of keys waiting in the retry table: copied in behind, never sent.
    parked: Vec<(i64, i32)>,
    /// How far this batch and those in flight before it read: the next batch reads from
    /// here (never again what a batch in flight holds).
    reach: Option<i64>,
    /// The keys of the parked rows: the batch after this one holds its rows of them back
    /// (their order is the retry table's now).
    parked_keys: Vec<String>,
    /// The leaves read (`{gens}`), for the copies at settle.
    gens: String,
    /// A writer is listed as passed in the claim's lanes: its rows were left out, so a lane
    /// with nothing read is not known to hold nothing (it moves, see [`IDLE_LAG`]).
    passing: bool,
    /// Ring rows from this id up were read ahead of the proof ([`READ_AHEAD_CAP`]).
    ahead_from: i64,
    /// The rows read ahead by earlier batches that this claim skipped, with their lanes: a
    /// lane moves past one only if its batch settled it.
    skipped: Vec<(i64, i32)>,
}

/// How many times, and how long apart, a claim looks again whether the writers its sample
/// saw have ended (see `claim_ring`).
const PROVE_RECHECKS: u32 = 3;
const PROVE_WAIT: Duration = Duration::from_millis(1);

/// Outside exactly-once mode a claim reads every committed row of its lanes, not only those
/// below the ids its samples proved (no lower id still to commit): a row goes out as soon as
/// its transaction commits, as on the table, instead of after every writer open when it was
/// sampled has ended (at 2,000 events/s and 8 writers, most of the ring's commit→ack time).
/// The cursors still move only as far as the proof: a row read ahead is remembered
/// ([`Layout::ahead`]) and skipped until they pass it; one that did not reach Kafka is copied
/// into the retry table at once, as a row the cursors step over is; a row with a lower id
/// committed later is read then, once. So a key's rows go out in commit order, as on the
/// table. Beyond this many rows remembered (a writer open for long holds the proof back)
/// the claim reads only what is proven again until the proof catches up.
const READ_AHEAD_CAP: usize = 20_000;

/// A lane with no row in a batch keeps its cursor (a cursor log entry per lane and batch is
/// what a steady trickle of one-row batches would otherwise cost: 64 per batch) until it lags
/// the batch's bound by more than this many ids; a read starts at the lowest cursor, so this
/// bounds what it steps over. A batch read past one that kept a lane moves it anyway
/// ([`Layout::clean`]).
const IDLE_LAG: i64 = 256;

impl RingRead {
    /// Where the next batch reads from while this one is in flight (see [`Ahead`]): past
    /// everything this one and those before it read.
    pub(super) fn ahead(&self) -> Option<Ahead> {
        Some(Ahead {
            scan_from: self.from,
            next: self.reach?,
        })
    }

    /// Keys whose rows were parked behind the retry table in this batch.
    pub(super) fn parked_keys(&self) -> impl Iterator<Item = String> + '_ {
        self.parked_keys.iter().cloned()
    }
}

impl Layout {
    /// Forgets what was seen of the storage: the next claim asks again.
    pub(super) fn forget(&self) {
        *self.ring.lock().expect("layout lock") = None;
    }

    /// Forgets the rows `read` read ahead of the proof: its batch is dropped unsent (the one
    /// before it failed), so they are read again.
    pub(super) fn forget_ahead(&self, rows: &[Row], read: &RingRead) {
        let mut remembered = self.ahead.lock().expect("layout lock");
        for r in rows.iter().filter(|r| !r.retry && r.id >= read.ahead_from) {
            remembered.remove(&r.id);
        }
        for (id, _) in read.parked.iter().filter(|(id, _)| *id >= read.ahead_from) {
            remembered.remove(id);
        }
    }

    /// After a settle failed: nothing this relay remembers of its lanes holds (their rows are
    /// read again from the cursors).
    pub(super) fn settle_failed(&self) {
        self.clean.lock().expect("layout lock").clear();
        self.cursors.lock().expect("layout lock").clear();
        self.ahead.lock().expect("layout lock").clear();
        self.forgot
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Relay {
    /// Whether this relay's schema is on ring storage (cached for [`LAYOUT_TTL`]).
    pub(super) async fn on_ring(&self, c: &deadpool_postgres::Object) -> Result<bool, RelayError> {
        let cached = *self.layout.ring.lock().expect("layout lock");
        if let Some((ring, at)) = cached {
            if at.elapsed() < LAYOUT_TTL {
                return Ok(ring);
            }
        }
        let stmt = c.prepare_cached(&self.stmts.ring_layout).await?;
        let ring: bool = c.query_one(&stmt, &[]).await?.get(0);
        *self.layout.ring.lock().expect("layout lock") = Some((ring, Instant::now()));
        Ok(ring)
    }

    /// The leaves a claim reads, as a literal list for `{gens}`: the current generation and
    /// the next (rotation moves only one step), and every leaf whose newest row is at or above
    /// the lowest lane cursor. Asked in its own statement, outside the claim's transaction
    /// (it looks at every leaf), at most once per [`LEAVES_TTL`].
    async fn readable_leaves(&self, c: &deadpool_postgres::Object) -> Result<String, RelayError> {
        if let Some((gens, at)) = self.layout.leaves.lock().expect("layout lock").as_ref() {
            if at.elapsed() < LEAVES_TTL {
                return Ok(gens.clone());
            }
        }
        let stmt = c.prepare_cached(&self.stmts.ring_rotation_state).await?;
        let row = c.query_one(&stmt, &[]).await?;
        let current: i16 = row.get(0);
        let lowest: Option<i64> = row.get(2);
        let newest: Vec<Option<i64>> = row.get(3);
        let mut gens: Vec<i16> = vec![current, (current + 1) % crate::sql::ring::LEAVES];
        for (g, id) in (0..crate::sql::ring::LEAVES).zip(&newest) {
            if id.is_some_and(|id| id >= lowest.unwrap_or(0)) && !gens.contains(&g) {
                gens.push(g);
            }
        }
        gens.sort_unstable();
        let list = gens
            .iter()
            .map(i16::to_string)
            .collect::<Vec<_>>()
            .join(",");
        *self.layout.leaves.lock().expect("layout lock") = Some((list.clone(), Instant::now()));
        Ok(list)
    }

    /// [`Relay::claim_in`] on ring storage: reads instead of claiming (see the module's doc).
    pub(super) async fn claim_ring(
        &self,
        tx: OpenTx,
        limit: usize,
        lanes: Vec<i32>,
        ahead: Option<Ahead>,
    ) -> Result<Claimed, RelayError> {
        let c = tx.client();
        let mut gens = self.readable_leaves(c).await?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&lanes];
        let known: Option<Vec<i64>> = {
            let mut cache = self.layout.cursors.lock().expect("layout lock");
            if self.floor.lock().expect("floor lock").lanes() != lanes.as_slice() {
                cache.clear();
            }
            if self.config.exactly_once.is_some() {
                None
            } else {
                lanes.iter().map(|l| cache.get(l).copied()).collect()
            }
        };
        let sample_sql = if known.is_some() {
            &self.stmts.ring_sample_known
        } else {
            &self.stmts.ring_sample
        };
        let stmt = c
            .prepare_cached(&sample_sql.replace("{gens}", &gens))
            .await?;
        // Outside the claim's transaction, which opens once the writers passed are listed.
        let mut sampled = c.query_one(&stmt, &params).await?;
        let current: i16 = sampled.get(4);
        if !gens.split(',').any(|g| g == current.to_string()) {
            // The generation moved past the leaves this relay reads (two rotations within
            // `LEAVES_TTL`): sample again with the new leaves, and ask for the list next time.
            *self.layout.leaves.lock().expect("layout lock") = None;
            gens = format!(
                "{gens},{current},{}",
                (current + 1) % crate::sql::ring::LEAVES
            );
            let stmt = c
                .prepare_cached(&sample_sql.replace("{gens}", &gens))
                .await?;
            sampled = c.query_one(&stmt, &params).await?;
        }
        let sample = Sample {
            at: Instant::now(),
            max_id: sampled.get(0),
            writers: sampled.get(1),
        };
        let retry_due: bool = sampled.get(2);
        let mut passing: bool = sampled.get(5);
        let retry_waiting: bool = sampled.get(6);
        self.rows_waiting
            .store(retry_waiting, std::sync::atomic::Ordering::Relaxed);
        let cursors: Vec<i64> = match known {
            Some(known) => known,
            None => {
                let read: Vec<i64> = sampled.get(3);
                if self.config.exactly_once.is_none() {
                    // Cursors only move forward: a settle that committed since this sample
                    // was taken knows better.
                    let mut cache = self.layout.cursors.lock().expect("layout lock");
                    for (lane, cursor) in lanes.iter().zip(&read) {
                        let e = cache.entry(*lane).or_insert(*cursor);
                        *e = (*e).max(*cursor);
                    }
                }
                read
            }
        };
        let newest = sample.max_id;
        let (mut begin, mut passed) = {
            let mut floor = self.floor.lock().expect("floor lock");
            if floor.lanes() != lanes.as_slice() {
                // What a batch knew of lanes it no longer owns (or owns anew) may be stale.
                self.layout.clean.lock().expect("layout lock").clear();
                // Rows read ahead in lanes it gave away are the new owner's to read (again).
                self.layout
                    .ahead
                    .lock()
                    .expect("layout lock")
                    .retain(|_, (lane, _)| lanes.contains(lane));
            }
            let begin = floor.begin(&lanes, sample);
            (begin, floor.passed())
        };
        // The sample just taken is proven only once the writers it saw have ended; the next
        // claim would see that, a whole batch later. The services' transactions last a few
        // milliseconds: look again shortly, and read up to this sample if they are gone (at
        // 2,000 events/s the commit-to-ack p50 went from 16 ms to 10–11 ms).
        let lowest = cursors.iter().copied().min().unwrap_or(0);
        // Past what the batches in flight before this one read (see `Ahead`): their rows are
        // settled by them, not read again.
        let from = ahead.map_or(lowest, |a| a.next.max(lowest));
        let reads_ahead = self.config.exactly_once.is_none();
        let mut rechecks = 0;
        // Reading ahead, the rows need no proof to go: the next claim moves the cursors.
        let max_rechecks = if reads_ahead { 0 } else { PROVE_RECHECKS };
        while begin.visible_below.is_none_or(|v| v <= newest) && rechecks < max_rechecks {
            rechecks += 1;
            tokio::time::sleep(PROVE_WAIT).await;
            let stmt = c
                .prepare_cached(&self.stmts.ring_recheck.replace("{gens}", &gens))
                .await?;
            let r = c.query_one(&stmt, &[]).await?;
            let sample = Sample {
                at: Instant::now(),
                max_id: r.get(0),
                writers: r.get(1),
            };
            let mut floor = self.floor.lock().expect("floor lock");
            begin = floor.begin(&lanes, sample);
            passed = floor.passed();
        }
        if !passed.is_empty() {
            // Listed in every lane of this claim, and committed, before the claim reads: this
            // claim and every later one of these lanes leave their rows out until the sweep
            // copies the ones the cursors step over (see `sweep_passed`). A claim of the batch
            // after this one must not read them as usual once they commit.
            let pass = c.prepare_cached(&self.stmts.ring_pass).await?;
            c.execute(&pass, &[&passed, &lanes]).await?;
            passing = true;
        }
        // The claim's transaction, holding the cursors' lock: the passed list cannot change
        // until it ends. Sent with the claim's first statement (one round trip).
        let mut begin_held = Some(c.batch_execute(&self.stmts.ring_begin_held));
        let batch = i64::try_from(limit).unwrap_or(i64::MAX);
        metrics::gauge!(crate::metrics::OUTBOX_LANES_OWNED).set(lanes.len() as f64);
        let claim_started = Instant::now();
        let mut rows: Vec<Row> = Vec::new();
        if retry_due {
            let claim = c.prepare_cached(&self.stmts.ring_claim_retry).await?;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&batch, &lanes];
            let query = c.query(&claim, &params);
            let due = match begin_held.take() {
                Some(open) => futures::try_join!(open, query)?.1,
                None => query.await?,
            };
            rows.extend(due.into_iter().map(|r| Row {
                id: r.get(0),
                created: r.get(5),
                raw: r,
                retry: true,
            }));
        }
        let mut read = 0usize;
        let skipped: Vec<(i64, i32)> = if reads_ahead {
            let ahead = self.layout.ahead.lock().expect("layout lock");
            ahead.iter().map(|(id, (lane, _))| (*id, *lane)).collect()
        } else {
            Vec::new()
        };
        // (Ids below `from` are not read anyway: at the cap the list is long.)
        let skip: Vec<i64> = skipped
            .iter()
            .map(|(id, _)| *id)
            .filter(|id| *id >= from)
            .collect();
        let upper = if reads_ahead && skipped.len() < READ_AHEAD_CAP {
            Some(i64::MAX)
        } else {
            begin.visible_below.filter(|b| *b > from)
        };
        if let Some(below) = upper {
            let read_sql = if passing {
                &self.stmts.ring_read_passing
            } else {
                &self.stmts.ring_read
            };
            let stmt = c.prepare_cached(&read_sql.replace("{gens}", &gens)).await?;
            let mut by_lane: Vec<Option<i64>> = vec![None; super::LANES as usize];
            for (lane, cursor) in lanes.iter().zip(&cursors) {
                if let Some(slot) = usize::try_from(*lane).ok().and_then(|l| by_lane.get_mut(l)) {
                    *slot = Some(*cursor);
                }
            }
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
                [&batch, &from, &below, &by_lane, &skip];
            let query = c.query(&stmt, &params).instrument(tracing::debug_span!(
                "outbox.claim",
                batch,
                lanes = lanes.len(),
                from
            ));
            let ring_rows = match begin_held.take() {
                Some(open) => futures::try_join!(open, query)?.1,
                None => query.await?,
            };
            read = ring_rows.len();
            rows.extend(ring_rows.into_iter().map(|r| Row {
                id: r.get(0),
                created: r.get(5),
                raw: r,
                retry: false,
            }));
        }
        if let Some(open) = begin_held.take() {
            open.await?;
        }
        drop(begin_held);
        metrics::histogram!(crate::metrics::OUTBOX_CLAIM_SECONDS)
            .record(claim_started.elapsed().as_secs_f64());
        let full_last = (read >= limit)
            .then(|| rows.iter().filter(|r| !r.retry).map(|r| r.id).max())
            .flatten();
        let bound = begin
            .visible_below
            .map(|v| full_last.map_or(v, |l| v.min(l.saturating_add(1))))
            .filter(|b| *b > from);
        rows.sort_unstable_by_key(|r| r.id);

        // Ring rows of keys with a pending row in the retry table wait behind it there.
        let keys: Vec<&str> = rows
            .iter()
            .filter(|r| !r.retry)
            .filter_map(Row::key)
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let mut waiting: HashSet<String> = HashSet::new();
        if !keys.is_empty() {
            let stmt = c.prepare_cached(&self.stmts.ring_retry_keys).await?;
            for r in c.query(&stmt, &[&keys]).await? {
                waiting.insert(r.get(0));
            }
        }
        let mut parked = Vec::new();
        let mut parked_keys = HashSet::new();
        if !waiting.is_empty() {
            rows.retain(|r| {
                let park = !r.retry && r.key().is_some_and(|k| waiting.contains(k));
                if park {
                    parked.push((r.id, r.lane()));
                    parked_keys.extend(r.key().map(str::to_owned));
                }
                !park
            });
        }
        let reach = bound.or(ahead.map(|a| a.next));
        // The rows read past the proof (all of them when nothing new was proven).
        let ahead_from = if reads_ahead {
            bound.unwrap_or(i64::MIN)
        } else {
            i64::MAX
        };
        if reads_ahead {
            let mut remembered = self.layout.ahead.lock().expect("layout lock");
            for r in rows.iter().filter(|r| !r.retry && r.id >= ahead_from) {
                remembered.insert(r.id, (r.lane(), false));
            }
            for (id, lane) in parked.iter().filter(|(id, _)| *id >= ahead_from) {
                remembered.insert(*id, (*lane, false));
            }
        }
        Ok(Claimed {
            tx,
            rows,
            begin,
            lanes,
            waiting: HashSet::new(),
            limit,
            ring: Some(RingRead {
                from,
                cursors,
                bound,
                parked,
                reach,
                parked_keys: parked_keys.into_iter().collect(),
                gens,
                passing,
                ahead_from,
                skipped,
            }),
        })
    }

    /// [`Relay::settle`] on ring storage: the retry rows' marks (the retry rows among
    /// `marks`), the lanes' cursors and the copies, then COMMIT, in one round trip.
    pub(super) async fn settle_ring(
        &self,
        tx: OpenTx,
        rows: &[Row],
        fates: &[Fate],
        lanes: &[i32],
        read: RingRead,
        marks: &Marks<'_>,
    ) -> Result<(), RelayError> {
        let c = tx.client();
        let retry: HashSet<i64> = rows.iter().filter(|r| r.retry).map(|r| r.id).collect();
        let of_retry = |(ids, errs): (&[i64], &[String])| -> (Vec<i64>, Vec<String>) {
            ids.iter()
                .zip(errs)
                .filter(|(id, _)| retry.contains(id))
                .map(|(id, e)| (*id, e.clone()))
                .unzip()
        };
        let retry_sent: Vec<i64> = marks
            .sent
            .iter()
            .copied()
            .filter(|id| retry.contains(id))
            .collect();
        let (retry_failed, retry_errs) = of_retry(marks.refused);
        let (retry_broken, broken_errs) = of_retry(marks.broken);
        // Per lane: the first ring row that must be read again, if any. Only when nothing of
        // the batch reached Kafka (the cluster or the registry unreachable): the lane then
        // waits at that row and the batch is read again. When other rows went through, a
        // deferred row (one partition away, a report missing) goes to the retry table with
        // the rows of its key behind it, so one row cannot pin its lane (and the rotation).
        // Exactly-once: per slot, each its own Kafka transaction (a slot that aborted sent
        // nothing, whatever the others did; its rows are read again, never copied: the slot's
        // recovery must find them at or above the cursor, or sent).
        let group = |lane: i32| {
            if self.config.exactly_once.is_some() {
                super::lanes::slot_of(lane)
            } else {
                0
            }
        };
        let sent_in: HashSet<i32> = rows
            .iter()
            .zip(fates)
            .filter(|(_, f)| matches!(f, Fate::Sent))
            .map(|(r, _)| group(r.lane()))
            .collect();
        let mut stop: HashMap<i32, i64> = HashMap::new();
        for (row, fate) in rows.iter().zip(fates) {
            let any_sent = sent_in.contains(&group(row.lane()));
            if !row.retry && !any_sent && matches!(fate, Fate::Deferred(_) | Fate::Waiting(_)) {
                stop.entry(row.lane())
                    .and_modify(|s| *s = (*s).min(row.id))
                    .or_insert(row.id);
            }
        }
        // A row an earlier batch read ahead and this one skipped: its lane moves past it only
        // if that batch settled it (the batches settle in order; one that sent nothing
        // forgot its rows, to be read again).
        {
            let known = self.layout.cursors.lock().expect("layout lock");
            let remembered = self.layout.ahead.lock().expect("layout lock");
            for (id, lane) in &read.skipped {
                // Gone from the list: a batch since moved its lane past it, or its batch
                // forgot it (the lane's cursor is then still at or below it).
                let settled = match remembered.get(id) {
                    Some((_, settled)) => *settled,
                    None => known.get(lane).is_some_and(|c| c > id),
                };
                if read.bound.is_some_and(|b| *id < b) && !settled {
                    stop.entry(*lane)
                        .and_modify(|s| *s = (*s).min(*id))
                        .or_insert(*id);
                }
            }
        }
        // This batch's own rows read ahead that did not reach Kafka (and those parked behind
        // their key's rows in the retry table) are copied as the rows below the proof are: only
        // if their lane moves in this settle (its cursor was where the batch expected, so every
        // earlier row of their keys, all in that lane, was sent or copied before them) and
        // they are before the lane's stop. Otherwise they are forgotten: read again by the next
        // pass, which starts at the cursors (this one ends, see `Layout::forgot`).
        let is_ahead = |row: &Row| !row.retry && row.id >= read.ahead_from;
        // The ring rows to copy into the retry table (only if their lane moves past them).
        let (mut copy_ids, mut copy_lanes, mut copy_errs, mut copy_dead) = (
            Vec::new(),
            Vec::new(),
            Vec::<Option<String>>::new(),
            Vec::new(),
        );
        let before_stop = |lane: i32, id: i64| stop.get(&lane).is_none_or(|s| id < *s);
        for (row, fate) in rows.iter().zip(fates) {
            if row.retry || !before_stop(row.lane(), row.id) {
                continue;
            }
            let (err, dead) = match fate {
                Fate::Refused(err, reason) => (
                    Some(err.clone()),
                    *reason == RefusalReason::Contract || self.config.max_attempts <= 1,
                ),
                Fate::HeldBack | Fate::Deferred(_) | Fate::Waiting(_) => (None, false),
                Fate::Sent => continue,
            };
            copy_ids.push(row.id);
            copy_lanes.push(row.lane());
            copy_errs.push(err);
            copy_dead.push(dead);
        }
        for &(id, lane) in &read.parked {
            if before_stop(lane, id) {
                copy_ids.push(id);
                copy_lanes.push(lane);
                copy_errs.push(None);
                copy_dead.push(false);
            }
        }
        // (A row skipped as read ahead by an earlier batch is a row of its lane here too: the
        // lane moves past it rather than stay as if it held none.)
        let touched: HashSet<i32> = rows
            .iter()
            .filter(|r| !r.retry)
            .map(Row::lane)
            .chain(read.parked.iter().map(|(_, lane)| *lane))
            .chain(read.skipped.iter().map(|(_, lane)| *lane))
            .collect();
        let (mut adv_lanes, mut adv_start, mut adv_next) = (Vec::new(), Vec::new(), Vec::new());
        let mut kept = Vec::new();
        if let Some(bound) = read.bound {
            let clean = self.layout.clean.lock().expect("layout lock").clone();
            for (lane, cursor) in lanes.iter().zip(&read.cursors) {
                let next = stop.get(lane).map_or(bound, |s| (*s).min(bound));
                // Nothing of the lane is left to read below where this batch read from: its
                // cursor was there, or a batch before this one kept it with nothing between.
                let clean_to_from =
                    *cursor >= read.from || clean.get(lane).is_some_and(|c| *c >= read.from);
                // Then it may move from wherever its cursor is; otherwise only if the batch
                // before this one settled it up to where this one started.
                let start = if clean_to_from {
                    0
                } else {
                    read.from.max(*cursor)
                };
                // No row of the lane here: its cursor may stay (see `IDLE_LAG`), known clean
                // up to the bound.
                let idle = !read.passing
                    && clean_to_from
                    && !touched.contains(lane)
                    && next - *cursor <= IDLE_LAG;
                if idle {
                    kept.push((*lane, next));
                } else if next > start {
                    adv_lanes.push(*lane);
                    adv_start.push(start);
                    adv_next.push(next);
                }
            }
        }
        // In one round trip, only the marks this settle runs.
        let advance_sql = self.stmts.ring_advance.replace("{gens}", &read.gens);
        let (sent_stmt, failed_stmt, advance, advance_lanes) = futures::try_join!(
            prepare_if(c, !retry_sent.is_empty(), &self.stmts.ring_retry_sent),
            prepare_if(
                c,
                !retry_failed.is_empty() || !retry_broken.is_empty(),
                &self.stmts.ring_retry_failed
            ),
            c.prepare_cached(&advance_sql),
            c.prepare_cached(&self.stmts.ring_advance_lanes),
        )?;
        let sent = mark_unless_empty(c, sent_stmt.as_ref(), &retry_sent, [&retry_sent]);
        let failed = mark_unless_empty(
            c,
            failed_stmt.as_ref(),
            &retry_failed,
            [&retry_failed, &retry_errs, &self.config.max_attempts],
        );
        let broken = mark_unless_empty(
            c,
            failed_stmt.as_ref(),
            &retry_broken,
            [&retry_broken, &broken_errs, &1i32],
        );
        let moved = async {
            if !adv_lanes.is_empty() && copy_ids.is_empty() {
                c.query(&advance_lanes, &[&adv_lanes, &adv_start, &adv_next])
                    .instrument(tracing::debug_span!("outbox.mark", lanes = adv_lanes.len()))
                    .await
            } else if !adv_lanes.is_empty() {
                c.query(
                    &advance,
                    &[
                        &adv_lanes,
                        &adv_start,
                        &adv_next,
                        &copy_ids,
                        &copy_lanes,
                        &copy_errs,
                        &copy_dead,
                    ],
                )
                .instrument(tracing::debug_span!("outbox.mark", lanes = adv_lanes.len()))
                .await
            } else {
                Ok(Vec::new())
            }
        };
        let done = futures::try_join!(sent, failed, broken, moved, c.batch_execute("COMMIT"));
        let mut clean = self.layout.clean.lock().expect("layout lock");
        let mut cursors = self.layout.cursors.lock().expect("layout lock");
        let mut remembered = self.layout.ahead.lock().expect("layout lock");
        let Ok((_, _, _, moved, ())) = done else {
            clean.clear();
            cursors.clear();
            remembered.clear();
            return done.map(|_| ()).map_err(Into::into);
        };
        tx.committed();
        // A lane that moved has nothing left to read below where it moved to; one whose
        // cursor was not where this batch expected did not move, and is not known clean.
        let moved: HashSet<i32> = moved.iter().map(|r| r.get(0)).collect();
        // The rows read ahead: settled if sent, or copied (their lane moved, before its stop);
        // otherwise forgotten, and this pass ends.
        let copied: HashSet<i64> = copy_ids
            .iter()
            .zip(&copy_lanes)
            .filter(|(_, lane)| moved.contains(*lane))
            .map(|(id, _)| *id)
            .collect();
        let ahead_rows = rows
            .iter()
            .zip(fates)
            .filter(|(r, _)| is_ahead(r))
            .map(|(r, f)| (r.id, matches!(f, Fate::Sent)))
            .chain(
                read.parked
                    .iter()
                    .filter(|(id, _)| *id >= read.ahead_from)
                    .map(|(id, _)| (*id, false)),
            );
        for (id, sent) in ahead_rows {
            if sent || copied.contains(&id) {
                if let Some(e) = remembered.get_mut(&id) {
                    e.1 = true;
                }
            } else {
                remembered.remove(&id);
                self.layout
                    .forgot
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let mut passed: HashMap<i32, i64> = HashMap::new();
        for (lane, next) in adv_lanes.iter().zip(&adv_next) {
            if moved.contains(lane) {
                clean.insert(*lane, *next);
                cursors.insert(*lane, *next);
                passed.insert(*lane, *next);
            } else {
                clean.remove(lane);
                cursors.remove(lane);
            }
        }
        clean.extend(kept);
        // Rows read ahead that a cursor has now passed are behind it for good.
        if !passed.is_empty() {
            remembered.retain(|id, (lane, _)| passed.get(lane).is_none_or(|next| id >= next));
        }
        Ok(())
    }
}

/// The ring's sweep (every `sweep_interval`): writers the floor passed while open
/// (`outbox_passed`) that have since committed get the rows the cursors stepped over while
/// they were listed copied into the retry table, once; those that rolled back are forgotten.
/// Returns the rows copied.
/// (No ring row is updated: the copies go to the retry table, as a refused row's do.)
pub(super) async fn sweep_passed(
    pool: &deadpool_postgres::Pool,
    stmts: &Statements,
) -> Result<u64, RelayError> {
    let mut c = pool.get().await?;
    let passed: Vec<(String, Option<String>)> = c
        .query(&stmts.ring_passed, &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut copied = 0;
    for (xid, status) in passed {
        if status.as_deref() == Some("in progress") {
            continue;
        }
        let tx = c.transaction().await?;
        // The claims in flight end first (they read without its rows), new ones wait.
        tx.query_one(&stmts.ring_hold_cursors, &[]).await?;
        // Only the sweep that takes the entries off the list copies (one at a time).
        let entries = tx.query(&stmts.ring_unpass, &[&xid]).await?;
        if entries.is_empty() {
            continue;
        }
        // Committed, or too old for Postgres to say (then copy too: a writer that rolled back
        // left no row to find).
        if status.as_deref() != Some("aborted") {
            let lanes: Vec<i32> = entries.iter().map(|r| r.get(0)).collect();
            let from: Vec<i64> = entries.iter().map(|r| r.get(1)).collect();
            let n = tx
                .execute(&stmts.ring_copy_passed, &[&xid, &lanes, &from])
                .await?;
            tracing::info!(
                xid,
                rows = n,
                "a writer passed while open has committed: the rows of it the cursors stepped over go out through the retry table"
            );
            copied += n;
        }
        tx.commit().await?;
    }
    Ok(copied)
}
