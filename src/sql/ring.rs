//! The append-only storage (`migrations/V18__ring_storage.sql`, issue 33): the relay reads
//! `outbox_ring` from its lanes' cursors instead of claiming rows, moves the cursors
//! (`outbox_lanes`, a view of each lane's newest entry in the insert-only
//! `outbox_cursor_log`, `V21__ring_cursor_log.sql`) once Kafka acknowledged, and copies rows that need another attempt, with
//! the rows of their key behind them, into `outbox_retry`. No statement here updates or deletes
//! a row of the ring. `{s}` stands for the quoted schema.
//!
//! A statement that needs a lane's cursor probes the log's primary key for the lane's newest
//! entry itself, or takes all 64 as an array once; none joins the `outbox_lanes` view: under
//! the relay's plan settings (no hash or merge join) such a join evaluated the view's 64 probes
//! for every row joined: 4,096 for a sample of 64 lanes.

/// Whether the schema's `outbox` is the view over the ring (`outbox_use_ring()` ran).
pub(crate) const LAYOUT: &str = "\
SELECT coalesce((SELECT c.relkind = 'v' FROM pg_class AS c
                  WHERE c.oid = to_regclass('{s}.outbox')), false)";

/// Moves the schema onto the ring (`V19__ring_upgrade.sql`), waiting at most `$1` seconds
/// for the table. Returns the rows carried into the retry table, NULL when already moved.
pub(crate) const USE_RING: &str = "SELECT {s}.outbox_use_ring(make_interval(secs => $1::float8))";

/// The bytes on disk of the outbox's storage, indexes included, and whether it is the ring:
/// the `outbox` table, or the ring's leaves, the retry table, the lanes and the table the schema
/// moved from. Sizes come from the files, not from reading rows.
pub(crate) const STORAGE: &str = "\
SELECT k.ring,
       CASE WHEN k.ring
            THEN (SELECT coalesce(sum(pg_total_relation_size(p.relid)), 0)::bigint
                    FROM pg_partition_tree('{s}.outbox_ring') AS p)
                 + pg_total_relation_size('{s}.outbox_retry')
                 + (SELECT coalesce(sum(pg_total_relation_size(p.relid)), 0)::bigint
                      FROM pg_partition_tree('{s}.outbox_cursor_log') AS p)
                 + coalesce(pg_total_relation_size(to_regclass('{s}.outbox_legacy')), 0)
            ELSE pg_total_relation_size('{s}.outbox') END
  FROM (SELECT coalesce((SELECT c.relkind = 'v' FROM pg_class AS c
                          WHERE c.oid = to_regclass('{s}.outbox')), false) AS ring) AS k";

/// The cursor of row `o`'s lane, from all 64 taken once as an array (an InitPlan), for
/// statements that look at many rows of many lanes.
macro_rules! row_cursor {
    () => {
        "(SELECT array_agg(coalesce((SELECT m.next_id FROM {s}.outbox_cursor_log AS m
                                   WHERE m.lane = l.lane ORDER BY m.next_id DESC LIMIT 1), 0)
                          ORDER BY l.lane)
             FROM generate_series(0, 63) AS l(lane))[(hashtext(coalesce(o.message_key, '')) & 63) + 1]"
    };
}

/// The relay's gauges on ring storage, as `outbox::GAUGES` on the table (pending, failed, all
/// rows, the oldest pending row's age), without reading the view: pending ring rows are those
/// at or above their lane's cursor, found from the lowest cursor up (the backlog, not the
/// ring); all rows are the planner's estimate. A statement over the whole view would hold
/// every leaf for seconds at volume, and rotation could reclaim none meanwhile.
pub(crate) const GAUGES: &str = concat!(
    "\
WITH ahead AS (
    SELECT o.id, o.created_at FROM {s}.outbox_ring AS o
     WHERE o.id >= (SELECT min(m.next_id) FROM {s}.outbox_lanes AS m)
       AND o.id >= ",
    row_cursor!(),
    "
       AND NOT EXISTS (SELECT 1 FROM {s}.outbox_retry AS t WHERE t.id = o.id)),
waiting AS (
    SELECT created_at FROM ahead
    UNION ALL
    SELECT t.created_at FROM {s}.outbox_retry AS t WHERE t.status = 'pending')
SELECT (SELECT count(*) FROM waiting)::bigint,
       (SELECT count(*) FROM {s}.outbox_retry AS t WHERE t.status = 'failed')::bigint,
       (SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint FROM pg_class AS c
         WHERE c.oid = ANY (array(SELECT p.relid FROM pg_partition_tree('{s}.outbox_ring') AS p)
                            || to_regclass('{s}.outbox_legacy')::oid)),
       (SELECT extract(epoch FROM now() - min(created_at))::float8 FROM waiting)"
);

// `{gens}` in the statements below: the leaves a relay reads (see `relay/ring.rs`), as a
// literal list, so the planner prunes the others at plan time and the claim's transaction
// holds no lock on them: rotation can truncate a settled leaf while batches are in flight.

/// The first two columns of [`SAMPLE`] and [`RECHECK`]: the highest visible id and the
/// transactions writing the ring.
macro_rules! sample_head {
    () => {
        "\
SELECT coalesce((SELECT max(m.id) FROM {s}.outbox_ring AS m WHERE m.gen IN ({gens})), 0),
       array(SELECT l.virtualtransaction FROM pg_locks AS l
              WHERE l.locktype = 'relation' AND l.mode = 'RowExclusiveLock'
                AND l.relation = '{s}.outbox_ring'::regclass
                AND l.database = (SELECT d.oid FROM pg_database AS d
                                   WHERE d.datname = current_database())
                AND l.pid IS DISTINCT FROM pg_backend_pid())"
    };
}

/// [`SAMPLE`]'s third column: whether a row of the lanes `$1` waits in the retry table and is
/// due.
macro_rules! retry_due {
    () => {
        ",
       EXISTS (SELECT 1 FROM {s}.outbox_retry AS t
                WHERE t.status = 'pending' AND t.available_at <= now()
                  AND (hashtext(coalesce(t.message_key, '')) & 63) = ANY($1::int[]))"
    };
}

/// The column after [`passed_listed`]: whether a row of the lanes `$1` waits in the retry
/// table and is not due yet (backed off). An idle fleet relay then polls at its usual pace
/// instead of its seat's longer idle poll, so the row goes when due.
macro_rules! retry_waiting {
    () => {
        ",
       EXISTS (SELECT 1 FROM {s}.outbox_retry AS t
                WHERE t.status = 'pending' AND t.available_at > now()
                  AND (hashtext(coalesce(t.message_key, '')) & 63) = ANY($1::int[]))"
    };
}

/// The fifth column of [`SAMPLE`] and [`SAMPLE_KNOWN`]: whether a writer is listed as passed
/// in one of the lanes `$1` (the claim then reads with [`read_passing`]).
macro_rules! passed_listed {
    () => {
        ",
       EXISTS (SELECT 1 FROM {s}.outbox_passed AS p WHERE p.lane = ANY($1::int[]))"
    };
}

/// First statement of a ring claim: as `outbox::SAMPLE` (the highest visible id and the
/// transactions holding `ROW EXCLUSIVE` on the ring, which every INSERT takes before drawing
/// its id), then whether a row of the lanes `$1` waits in the retry table and is due, the
/// lanes' cursors in the order of `$1`, the current generation, whether a writer is listed
/// as passed in one of the lanes, and whether a retry row of the lanes waits, not due yet. Outside the claim's transaction: it is opened afterwards,
/// with [`BEGIN_HELD`].
pub(crate) const SAMPLE: &str = concat!(
    sample_head!(),
    retry_due!(),
    ",
       array(SELECT coalesce((SELECT m.next_id FROM {s}.outbox_cursor_log AS m
                               WHERE m.lane = u.lane ORDER BY m.next_id DESC LIMIT 1), 0)
               FROM unnest($1::int[]) WITH ORDINALITY AS u(lane, n) ORDER BY u.n),
       (SELECT g.gen FROM {s}.outbox_generation AS g)",
    passed_listed!(),
    retry_waiting!()
);

/// [`SAMPLE`] without the cursors (NULL in their place), for a relay that knows them: every
/// cursor of its lanes moved by its own settles since it last read them (see `relay/ring.rs`).
/// A sample reads 64 entries of the log fewer, a third of its cost.
pub(crate) const SAMPLE_KNOWN: &str = concat!(
    sample_head!(),
    retry_due!(),
    ",
       NULL::bigint[],
       (SELECT g.gen FROM {s}.outbox_generation AS g)",
    passed_listed!(),
    retry_waiting!()
);

/// A claim's second look (see `relay/ring.rs`): the first two columns of [`SAMPLE`].
pub(crate) const RECHECK: &str = sample_head!();

/// The next rows in id order from `$2` up to (not including) `$3` (the ids proven committed or
/// rolled back; unbounded when the relay reads ahead of the proof, see `relay/ring.rs`), but
/// not the ids `$5` (read ahead by an earlier batch, sent or in flight), of the lanes with a cursor in `$4` (indexed by lane + 1, NULL for a lane this
/// relay does not own), each lane from its own cursor (as [`SAMPLE`] read them). At most `$1`.
/// A merge of the leaves' primary keys that stops after the batch; no lock, no write. Column 8
/// tells a ring row from a retry row. The cursors come as a parameter, not from
/// `outbox_lanes`: while a snapshot is held, every cursor move leaves a version of a lane's row
/// that vacuum may not remove, and a join that reads the table walked tens of thousands of them
/// per claim (8.7 ms a claim 40 s into a held snapshot). And they are a filter, not a join:
/// with a join on the lane, the relay's plan settings made a nested loop that hashed each
/// row's key once per lane (15–18 ms per 2,000-row batch), and without them the planner, not
/// knowing every row of the range matches, read and sorted the whole backlog (85 ms over
/// 100,000 rows), against 2.5 ms for this walk.
pub(crate) const READ: &str = "\
SELECT o.id, o.topic, o.message_key, o.headers::text, o.payload::text,
       extract(epoch FROM o.created_at)::float8, hashtext(coalesce(o.message_key, '')) & 63,
       false
  FROM {s}.outbox_ring AS o
 WHERE o.id >= $2 AND o.id < $3 AND o.gen IN ({gens})
   AND o.id >= ($4::bigint[])[(hashtext(coalesce(o.message_key, '')) & 63) + 1]
   AND o.id <> ALL($5::bigint[])
 ORDER BY o.id
 LIMIT $1";

/// [`READ`] while a writer is listed as passed in the claim's lanes: its rows in those lanes
/// are left out (the sweep copies the ones the cursors step over, `COPY_PASSED`), even once
/// it has committed, until the sweep has taken it off the list. Read in the claim's
/// transaction, which holds the cursors' lock ([`BEGIN_HELD`]): the list cannot change
/// between this read and the settle.
pub(crate) fn read_passing() -> String {
    READ.replace(
        "\n ORDER BY o.id",
        "
   AND NOT EXISTS (SELECT 1 FROM {s}.outbox_passed AS p
                    WHERE p.xid = o.xid AND p.lane = hashtext(coalesce(o.message_key, '')) & 63)
 ORDER BY o.id",
    )
}

/// Opens a ring claim's transaction, holding the cursors' lock shared (see [`HOLD_CURSORS`])
/// until it ends: the sweep waits for the claims in flight before it takes a writer off the
/// passed list. Sent before the claim's first statement in the transaction, whose snapshot is
/// then taken with the lock held.
pub(crate) const BEGIN_HELD: &str = "\
BEGIN;
SELECT pg_advisory_xact_lock_shared('{s}.outbox_cursor_log'::regclass::oid::bigint)";

/// Due rows of the retry table of the lanes `$2`, in id order, at most `$1`, locked for this
/// batch; as `outbox::CLAIM`, a row waits while an earlier row of its key is backed off.
pub(crate) const CLAIM_RETRY: &str = "\
SELECT o.id, o.topic, o.message_key, o.headers::text, o.payload::text,
       extract(epoch FROM o.created_at)::float8, hashtext(coalesce(o.message_key, '')) & 63,
       true
  FROM {s}.outbox_retry AS o
 WHERE o.status = 'pending' AND (o.available_at <= now()) IS TRUE
   AND (hashtext(coalesce(o.message_key, '')) & 63) = ANY($2::int[])
   AND NOT EXISTS (
         SELECT 1 FROM {s}.outbox_retry AS e
          WHERE e.status = 'pending' AND e.message_key = o.message_key
            AND e.id < o.id AND e.available_at > now())
 ORDER BY o.id
 LIMIT $1
 FOR UPDATE OF o SKIP LOCKED";

/// Of the keys `$1`, those with a pending row in the retry table: their rows read from the
/// ring are copied in behind it instead of being sent (per-key order).
pub(crate) const RETRY_KEYS: &str = "\
SELECT DISTINCT t.message_key FROM {s}.outbox_retry AS t
 WHERE t.status = 'pending' AND t.message_key = ANY($1::text[])";

/// A retry row reached Kafka: it is gone. `$1` = ids.
pub(crate) const RETRY_SENT: &str = "\
DELETE FROM {s}.outbox_retry WHERE id = ANY($1::bigint[])";

/// Back off retry rows whose produce failed: `outbox::MARK_FAILED` (the same backoff and
/// `failed` at the maximum) on the retry table.
pub(crate) fn retry_failed() -> String {
    super::outbox::MARK_FAILED.replace("UPDATE {s}.outbox AS o", "UPDATE {s}.outbox_retry AS o")
}

/// The transaction ids (xid8) of the writers whose virtual transaction ids are in `$p`, as a
/// subquery with one column, `xid`. `pg_locks` gives a 32-bit xid; its epoch is the current
/// one, or the one before when it is above the current counter (it was drawn before the wrap).
macro_rules! writer_xids {
    ($p:literal) => {
        concat!(
            "\
SELECT DISTINCT ((((c.x >> 32) - CASE WHEN t.x > (c.x & 4294967295) THEN 1 ELSE 0 END) << 32)
                 | t.x)::text::xid8 AS xid
  FROM (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS x) AS c,
       LATERAL (SELECT l.transactionid::text::bigint AS x FROM pg_locks AS l
                 WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
                   AND l.virtualtransaction = ANY(",
            $p,
            "::text[])) AS t"
        )
    };
}

/// Exactly-once recovery on the ring: the ids `$1` of a slot's last committed Kafka
/// transaction (and of its batch before, while unconfirmed) reached Kafka; make the database
/// say so if their settle was lost (a crash between the commit and the settle). Retry rows
/// among them leave the retry table. For each lane, its cursor moves past the highest of them,
/// if it is not already: the batches read every row of the lane from the cursor up, so a row
/// in between that is not among the ids was parked or held back by those batches, and is
/// copied into the retry table (behind its key) as their settle would have. Every part is a
/// no-op once done. The writers `$2` (virtual transaction ids, [`RING_WRITERS`]) still open
/// in this statement's snapshot may hold rows the moves step over, unseen: each is listed as
/// passed in every lane that moves, from where the lane was (the sweep copies those rows once
/// it has committed). A writer that committed before is seen: its rows are copied here.
/// Returns the retry rows removed, the lanes moved and the rows copied.
pub(crate) const RECOVER: &str = concat!(
    "\
WITH sent AS (SELECT DISTINCT unnest($1::bigint[]) AS id),
gone AS (DELETE FROM {s}.outbox_retry AS t WHERE t.id IN (SELECT id FROM sent) RETURNING t.id),
last AS (
    SELECT hashtext(coalesce(o.message_key, '')) & 63 AS lane, max(o.id) AS last
      FROM {s}.outbox_ring AS o WHERE o.id IN (SELECT id FROM sent)
     GROUP BY 1),
held AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared('{s}.outbox_cursor_log'::regclass::oid::bigint)),
moving AS (
    SELECT l.lane, c.next_id AS start, l.last + 1 AS next
      FROM held CROSS JOIN last AS l
     CROSS JOIN LATERAL (SELECT m.next_id FROM {s}.outbox_cursor_log AS m
                          WHERE m.lane = l.lane ORDER BY m.next_id DESC LIMIT 1) AS c
     WHERE c.next_id <= l.last),
copied AS (
    INSERT INTO {s}.outbox_retry (id, topic, message_key, headers, payload, created_at)
    SELECT o.id, o.topic, o.message_key, o.headers, o.payload, o.created_at
      FROM moving AS m
      JOIN {s}.outbox_ring AS o
        ON o.id >= m.start AND o.id < m.next
       AND (hashtext(coalesce(o.message_key, '')) & 63) = m.lane
     WHERE o.id NOT IN (SELECT id FROM sent)
    ON CONFLICT (id) DO NOTHING
    RETURNING id),
moved AS (
    INSERT INTO {s}.outbox_cursor_log (half, lane, next_id)
    SELECT (SELECT h.half FROM {s}.outbox_cursor_half AS h), m.lane, m.next FROM moving AS m
    ON CONFLICT DO NOTHING
    RETURNING lane),
passed AS (
    INSERT INTO {s}.outbox_passed (xid, lane, from_id)
    SELECT w.xid, m.lane, m.start
      FROM (",
    writer_xids!("$2"),
    ") AS w CROSS JOIN moving AS m
     WHERE NOT pg_visible_in_snapshot(w.xid, pg_current_snapshot())
    ON CONFLICT (xid, lane) DO NOTHING)
SELECT (SELECT count(*) FROM gone)::bigint, (SELECT count(*) FROM moved)::bigint,
       (SELECT count(*) FROM copied)::bigint"
);

/// Lists the writers `$1` (virtual transaction ids) a claim's floor passed while they were
/// still open, by their transaction id, in each of the claim's lanes `$2`, from the lane's
/// cursor now (see `V20__ring_writes.sql`, `V22__ring_passed_lanes.sql`). Run on its own,
/// committed before the claim reads: from then on every claim of those lanes leaves the
/// writer's rows out ([`read_passing`]) until the sweep copies the ones the cursors stepped
/// over. A writer already listed in a lane keeps its first entry there.
pub(crate) const PASS: &str = concat!(
    "\
INSERT INTO {s}.outbox_passed (xid, lane, from_id)
SELECT w.xid, u.lane,
       coalesce((SELECT m.next_id FROM {s}.outbox_cursor_log AS m
                  WHERE m.lane = u.lane ORDER BY m.next_id DESC LIMIT 1), 0)
  FROM (",
    writer_xids!("$1"),
    ") AS w CROSS JOIN unnest($2::int[]) AS u(lane)
ON CONFLICT (xid, lane) DO NOTHING"
);

/// The transactions writing the ring now (virtual transaction ids), for [`RECOVER`]: exactly-once
/// recovery moves cursors past ids no claim of its own proved visible, so every writer open
/// then may hold rows it steps over.
pub(crate) const RING_WRITERS: &str = "\
SELECT coalesce(array_agg(l.virtualtransaction), '{}')
  FROM pg_locks AS l
 WHERE l.locktype = 'relation' AND l.mode = 'RowExclusiveLock'
   AND l.relation = '{s}.outbox_ring'::regclass AND l.pid IS DISTINCT FROM pg_backend_pid()";

/// The writers passed while open, and whether each has ended (`pg_xact_status`: `committed`,
/// `aborted`, `in progress`, NULL when too old to say).
pub(crate) const PASSED: &str = "\
SELECT DISTINCT p.xid::text, pg_xact_status(p.xid) FROM {s}.outbox_passed AS p ORDER BY 1";

/// Takes passed writer `$1` off the list, returning its entries (lane, and where the lane's
/// cursor was when it was listed there); the sweep that gets them copies its rows, in the same
/// transaction (only one sweep can).
pub(crate) const UNPASS: &str =
    "DELETE FROM {s}.outbox_passed WHERE xid = $1::text::xid8 RETURNING lane, from_id";

/// Waits for the claims in flight, and holds new ones back, while a passed writer is taken off
/// the list and its rows are copied: a claim that read without its rows (the list as it was)
/// and settled after the copy looked would step over rows nobody copies. An advisory lock,
/// keyed by the cursor log's oid, that every claim takes shared for its whole transaction
/// ([`BEGIN_HELD`]), as every other statement moving a cursor does (no row is locked or
/// written for it).
pub(crate) const HOLD_CURSORS: &str = "\
SELECT 1 FROM (SELECT pg_advisory_xact_lock('{s}.outbox_cursor_log'::regclass::oid::bigint)) AS l";

/// A committed passed writer's (`$1`) rows that the cursors stepped over while it was listed,
/// copied into the retry table (published once from there): for each of its entries (lane
/// `$2[i]`, listed when the lane's cursor was at `$3[i]`), its rows of the lane from there up
/// to the lane's cursor now. Its rows above the cursor are read as usual once it is off the
/// list; the claims left out all of its rows of the lane while it was on it, so none was read.
/// Reads every leaf (no index on `xid`: this runs once per writer passed, never per event).
pub(crate) const COPY_PASSED: &str = concat!(
    "\
INSERT INTO {s}.outbox_retry (id, topic, message_key, headers, payload, created_at)
SELECT o.id, o.topic, o.message_key, o.headers, o.payload, o.created_at
  FROM (SELECT r.id, r.topic, r.message_key, r.headers, r.payload, r.created_at
          FROM {s}.outbox_ring AS r WHERE r.xid = $1::text::xid8 OFFSET 0) AS o
  JOIN unnest($2::int[], $3::bigint[]) AS e(lane, from_id)
    ON e.lane = hashtext(coalesce(o.message_key, '')) & 63 AND o.id >= e.from_id
 WHERE o.id < ",
    row_cursor!(),
    "
ON CONFLICT (id) DO NOTHING"
);

/// Cleanup on the ring: `outbox::CLEANUP_OUTBOX` on `outbox_legacy`, the table the schema had
/// before it moved (only sent rows are left there: `V19__ring_upgrade.sql`).
pub(crate) fn cleanup_legacy() -> String {
    super::outbox::CLEANUP_OUTBOX.replace("{s}.outbox", "{s}.outbox_legacy")
}

/// A re-publish batch on the ring: `outbox::REQUEUE_SENT` without its row lock (a view over
/// a `UNION` cannot be locked; the view's `INSTEAD OF UPDATE` trigger copies each row into the
/// retry table, once: `ON CONFLICT`).
pub(crate) fn requeue_sent() -> String {
    super::outbox::REQUEUE_SENT.replace(" FOR UPDATE)", ")")
}

/// Settles a batch's ring rows, in the claim's transaction: each lane `$1[i]` whose cursor is
/// still at or past where this batch started reading it (`$2[i]`: the batch before it in the
/// pipeline settled it that far) moves to `$3[i]`; for the lanes that moved, the rows that did
/// not reach Kafka are copied into the retry table — `$4` ids with `$5` their lanes, `$6` the
/// error of a refused row (NULL for a row held behind another of its key), `$7` whether it
/// failed for good (a schema refusal, or `max_attempts` of 1). The copy reads the ring by
/// primary key, driven by the ids (no `ORDER BY`: with one, the planner walked the whole ring
/// in id order to join it, 35 ms at 100,000 rows and growing). A lane that did not move copies
/// nothing: its rows are read again. The log's half is read in the statement, not by the
/// log's DEFAULT, a function planned again at each call (`V29__ring_insert_gen.sql`).
/// Returns the lanes that moved.
pub(crate) const ADVANCE: &str = "\
WITH held AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared('{s}.outbox_cursor_log'::regclass::oid::bigint)),
moved AS (
    INSERT INTO {s}.outbox_cursor_log (half, lane, next_id)
    SELECT (SELECT h.half FROM {s}.outbox_cursor_half AS h), v.lane, v.next
      FROM held CROSS JOIN unnest($1::int[], $2::bigint[], $3::bigint[]) AS v(lane, start, next)
     CROSS JOIN LATERAL (SELECT m.next_id FROM {s}.outbox_cursor_log AS m
                          WHERE m.lane = v.lane ORDER BY m.next_id DESC LIMIT 1) AS c
     WHERE c.next_id >= v.start AND c.next_id < v.next
    ON CONFLICT DO NOTHING
    RETURNING lane),
copied AS (
    INSERT INTO {s}.outbox_retry (id, topic, message_key, headers, payload, created_at,
                                  status, attempts, last_error, available_at)
    SELECT o.id, o.topic, o.message_key, o.headers, o.payload, o.created_at,
           CASE WHEN f.dead THEN 'failed' ELSE 'pending' END,
           CASE WHEN f.error IS NULL THEN 0 ELSE 1 END, f.error,
           CASE WHEN f.error IS NULL THEN now()
                ELSE now() + make_interval(secs => 0.75 + random() * 0.5) END
      FROM unnest($4::bigint[], $5::int[], $6::text[], $7::bool[]) AS f(id, lane, error, dead)
      JOIN {s}.outbox_ring AS o ON o.id = f.id AND o.gen IN ({gens})
     WHERE f.lane IN (SELECT lane FROM moved)
    ON CONFLICT (id) DO NOTHING)
SELECT lane FROM moved";

/// [`ADVANCE`] when nothing is to be copied (the usual batch): the cursors alone, a few small
/// rows appended to the log; returns the lanes that moved. (An `INSERT … SELECT` of nothing into the retry table would
/// still fire its NOTIFY trigger, and wake every relay after every batch.)
pub(crate) const ADVANCE_LANES: &str = "\
WITH held AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared('{s}.outbox_cursor_log'::regclass::oid::bigint))
INSERT INTO {s}.outbox_cursor_log (half, lane, next_id)
SELECT (SELECT h.half FROM {s}.outbox_cursor_half AS h), v.lane, v.next
  FROM held CROSS JOIN unnest($1::int[], $2::bigint[], $3::bigint[]) AS v(lane, start, next)
 CROSS JOIN LATERAL (SELECT m.next_id FROM {s}.outbox_cursor_log AS m
                      WHERE m.lane = v.lane ORDER BY m.next_id DESC LIMIT 1) AS c
 WHERE c.next_id >= v.start AND c.next_id < v.next
ON CONFLICT DO NOTHING
RETURNING lane";

/// The cursor log's active half (`V21__ring_cursor_log.sql`): new entries go there.
pub(crate) const CURSOR_HALF: &str = "SELECT half FROM {s}.outbox_cursor_half";

/// Rotation's swap of the cursor log's halves, first statements of its own transaction: wait
/// at most 50 ms for the inactive half `{h}` (every claim reads both halves; a claim arriving
/// meanwhile waits behind this), then copy each lane's newest entry from it into the active
/// half `{a}`, so that truncating it loses no lane's position.
pub(crate) const CURSOR_SWAP_LOCK: &str = "\
SET LOCAL lock_timeout = '50ms';
LOCK TABLE {s}.outbox_cursor_log_{h} IN ACCESS EXCLUSIVE MODE";

/// See [`CURSOR_SWAP_LOCK`].
pub(crate) const CURSOR_CARRY: &str = "\
INSERT INTO {s}.outbox_cursor_log (half, lane, next_id, moved_at)
SELECT {a}, m.lane, max(m.next_id), max(m.moved_at) FROM {s}.outbox_cursor_log_{h} AS m
 GROUP BY m.lane
ON CONFLICT DO NOTHING";

/// The inactive half's entries, each lane's newest now also in the active half, go at once.
pub(crate) const CURSOR_TRUNCATE: &str = "TRUNCATE {s}.outbox_cursor_log_{h}";

/// The emptied half becomes the active one (if `{a}` still is).
pub(crate) const CURSOR_FLIP: &str =
    "UPDATE {s}.outbox_cursor_half SET half = {h} WHERE half = {a}";

/// The ring's leaves, `outbox_ring_0 … _7` (`V18__ring_storage.sql`).
pub(crate) const LEAVES: i16 = 8;

/// What rotation looks at: the current generation, seconds since it began, the lowest lane
/// cursor (every row below it, in every lane, has been published or copied), and per leaf
/// (in order) its newest row's id and age in seconds, NULL when the leaf is empty — each found
/// at the end of the leaf's primary key, whatever its size.
pub(crate) fn rotation_state() -> String {
    let (mut ids, mut ages) = (Vec::new(), Vec::new());
    for g in 0..LEAVES {
        ids.push(format!(
            "(SELECT id FROM {{s}}.outbox_ring_{g} ORDER BY id DESC LIMIT 1)"
        ));
        ages.push(format!(
            "(SELECT extract(epoch FROM now() - created_at)::float8 \
               FROM {{s}}.outbox_ring_{g} ORDER BY id DESC LIMIT 1)"
        ));
    }
    format!(
        "SELECT g.gen, extract(epoch FROM now() - g.since)::float8,
                (SELECT min(c.next_id) FROM {{s}}.outbox_lanes AS c),
                ARRAY[{}]::bigint[], ARRAY[{}]::float8[]
           FROM {{s}}.outbox_generation AS g",
        ids.join(", "),
        ages.join(", ")
    )
}

/// Reclaiming leaf `{g}`, first statements of its own transaction: wait at most 50 ms for the
/// lock (the relays' reads hold a share of it for a batch; the services' INSERTs go to the
/// current leaf and never touch this one), then, under the lock, whether it may go: not the
/// current generation, and every row in it below its lane's cursor (a row written into it
/// late — a REPEATABLE READ writer that saw the old generation — keeps it until the relays have
/// read it), and no writer passed while open is still listed (its rows may be anywhere). Only
/// the rows at or above the lowest cursor are looked at (an idle lane's cursor lags by at most
/// a few hundred ids), from the end of the leaf's primary key.
pub(crate) const RECLAIM_LOCK: &str = "\
SET LOCAL lock_timeout = '50ms';
LOCK TABLE {s}.outbox_ring_{g} IN ACCESS EXCLUSIVE MODE";

/// See [`RECLAIM_LOCK`].
pub(crate) const RECLAIM_CHECK: &str = concat!(
    "\
SELECT (SELECT gen FROM {s}.outbox_generation) <> {g}
   AND NOT EXISTS (
         SELECT 1 FROM {s}.outbox_ring_{g} AS o
          WHERE o.id >= (SELECT min(m.next_id) FROM {s}.outbox_lanes AS m)
            AND o.id >= ",
    row_cursor!(),
    ")
   AND NOT EXISTS (SELECT 1 FROM {s}.outbox_passed)"
);

/// The leaf's rows, all published, go at once: no dead tuple, no vacuum.
pub(crate) const RECLAIM: &str = "TRUNCATE {s}.outbox_ring_{g}";

/// New rows go to leaf `{g}` from now on, if it is empty and generation `$1` is still the
/// current one. Returns a row when it moved.
pub(crate) const ADVANCE_GEN: &str = "\
UPDATE {s}.outbox_generation SET gen = {g}, since = now()
 WHERE gen = $1 AND NOT EXISTS (SELECT 1 FROM {s}.outbox_ring_{g})
RETURNING gen";
