//! The `outbox` table: the relay's claim, marks, floor and sweep; enqueue; cleanup of sent
//! rows; the gauges and the operator's views and repair. `{s}` stands for the quoted schema.

/// Claim a batch of due rows (the "take" of take → send → mark) of the relay's ordering lanes, in id order.
/// `SKIP LOCKED` lets several relays work side by side; the lane filter keeps each key with one
/// relay; a probe of the key index holds a row back while an earlier pending row of its key is backed off,
/// so per-key first deliveries follow id order. `$1` = batch size, `$2` = owned lanes, `$3` =
/// the relay's claim floor (every row of its lanes below it is settled, see `floor.rs`): the
/// scan starts there instead of at the head of the index, whose entries for rows sent while
/// some snapshot is held open cannot be removed.
/// Uses `outbox_pending_id_idx` (scan in id order from the floor) and `outbox_pending_key_idx`
/// for the check. The due test is written `(…) IS TRUE` so the planner
/// cannot use it as an index condition: on the pending `(available_at, id)` index it bounds
/// nothing (every pending row is due) and the scan would read every entry below the floor —
/// exactly the entries the floor exists to skip. Measured in `tests/relay/plans.rs`.
/// `o.ctid` (true of every row) makes the claim fail on ring storage's view, which has no
/// `ctid`: a relay that has not yet seen a schema move onto the ring (`storage::use_ring`)
/// errs and looks again, instead of claiming ring rows it could never mark sent.
/// The hold-back check is a `LATERAL … ORDER BY (message_key, id) LIMIT 1` probe of the key
/// index, not `NOT EXISTS` (whose `ORDER BY` the planner drops): with statistics of an idle
/// outbox (nothing pending when it was last analyzed, both pending-only indexes "empty") and
/// a backlog, the planner answered `NOT EXISTS` by walking `outbox_pending_id_idx` from the
/// floor for every claimed row, 29 s for one 2,000-row claim
/// (`plans::a_backlog_behind_statistics_of_an_idle_outbox_is_checked_key_by_key`). Only the key
/// index gives the probe's order without a sort, which the relay's sessions disable.
pub(super) const CLAIM: &str = "\
SELECT o.id, o.topic, o.message_key, o.headers::text, o.payload::text,
       extract(epoch FROM o.created_at)::float8, hashtext(coalesce(o.message_key, '')) & 63
  FROM {s}.outbox AS o
  LEFT JOIN LATERAL (
         SELECT 1 AS held FROM {s}.outbox AS e
          WHERE e.status = 'pending'
            AND (e.message_key, e.id) >= (o.message_key, $3)
            AND (e.message_key, e.id) < (o.message_key, o.id)
            AND e.available_at > now()
          ORDER BY e.message_key, e.id
          LIMIT 1) AS h ON true
 WHERE o.status = 'pending' AND o.id >= $3 AND (o.available_at <= now()) IS TRUE
   AND (hashtext(coalesce(o.message_key, '')) & 63) = ANY($2::int[]) AND o.ctid IS NOT NULL
   AND h.held IS NULL
 ORDER BY o.id
 LIMIT $1
 FOR UPDATE OF o SKIP LOCKED";

/// [`CLAIM`] when no pending row is backed off or scheduled for later (the usual case, told
/// by [`SAMPLE`]): nothing can be held back, so the claim is a plain walk of
/// `outbox_pending_id_idx` from the floor that stops after the batch. Per-key order still holds:
/// `FIRST_PENDING` checks every claimed key against earlier pending rows before sending.
pub(super) const CLAIM_FREE: &str = "\
SELECT o.id, o.topic, o.message_key, o.headers::text, o.payload::text,
       extract(epoch FROM o.created_at)::float8, hashtext(coalesce(o.message_key, '')) & 63
  FROM {s}.outbox AS o
 WHERE o.status = 'pending' AND o.id >= $3 AND (o.available_at <= now()) IS TRUE
   AND (hashtext(coalesce(o.message_key, '')) & 63) = ANY($2::int[]) AND o.ctid IS NOT NULL
 ORDER BY o.id
 LIMIT $1
 FOR UPDATE OF o SKIP LOCKED";

/// The keys (`$1`) with a pending row in `[$2, $3)` (same position): from the claim floor, or
/// just past the key's rows in batches this relay still has in flight (whose order the pipeline
/// keeps), up to the key's first claimed row. Such a row is outside this claim (locked by
/// another relay, or not due), so the key's claimed rows must not be sent yet. Normally none.
/// One index probe per key (`outbox_pending_key_idx`), whatever the backlog (below the floor
/// nothing of these lanes is pending, see [`CLAIM`]); the probe is a range that ends before
/// the claimed row, so it normally finds nothing and reads no heap page (measured 2.7 ms for
/// 1,000 keys, against 7.8 ms for "the key's lowest pending id", which found and checked the
/// claimed row itself).
/// (`LATERAL … LIMIT 1`, not `EXISTS`: the planner may turn `EXISTS` into a hash join that
/// reads every pending row.)
/// The range is written as `(message_key, id)` row comparisons in that index's order, and the
/// probe asks for that order: only the key index gives it without a sort (which the relay's
/// sessions disable). Written as `message_key = k AND id >= f AND id < b`, the planner picked
/// `outbox_pending_id_idx` whenever the statistics said no row was pending (an idle outbox
/// vacuumed and analyzed, then a bulk job's backlog): each key then walked every row of the
/// batch before its own, 50 – 120 ms for a 2,000-row batch instead of 3 – 10
/// (`plans::a_backlog_behind_statistics_of_an_idle_outbox_is_checked_key_by_key`).
pub(super) const FIRST_PENDING: &str = "\
SELECT u.k
  FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u(k, f, b),
       LATERAL (SELECT 1 FROM {s}.outbox AS e
                 WHERE e.status = 'pending'
                   AND (e.message_key, e.id) >= (u.k, u.f) AND (e.message_key, e.id) < (u.k, u.b)
                 ORDER BY e.message_key, e.id
                 LIMIT 1) AS earlier";

/// [`SAMPLE`] and [`SAMPLE_LEAN`], with the writers' column given.
macro_rules! sample {
    ($writers:literal) => {
        concat!(
            "\
SELECT coalesce((SELECT max(m.id) FROM {s}.outbox AS m), 0),
       ",
            $writers,
            ",
       EXISTS (SELECT 1 FROM {s}.outbox AS h
                WHERE h.status = 'pending' AND h.available_at > now())"
        )
    };
}

/// First statement of every claim transaction: what the relay needs to move its claim floor
/// (see `floor.rs`), and whether any pending row is not yet due (then the claim must skip
/// later rows of such keys: [`CLAIM`]; otherwise [`CLAIM_FREE`]). Returns the highest visible id, and the transactions holding `ROW
/// EXCLUSIVE` on the outbox table (every INSERT takes it before drawing its id and keeps it to
/// commit), this session excluded. Both are read after the statement's snapshot was taken:
/// every id up to the first was drawn by one of those writers or by a transaction that ended.
pub(super) const SAMPLE: &str = sample!(
    "array(SELECT l.virtualtransaction FROM pg_locks AS l
              WHERE l.locktype = 'relation' AND l.mode = 'RowExclusiveLock'
                AND l.relation = '{s}.outbox'::regclass
                AND l.database = (SELECT d.oid FROM pg_database AS d
                                   WHERE d.datname = current_database())
                AND l.pid IS DISTINCT FROM pg_backend_pid())"
);

/// [`SAMPLE`] without the writers (`NULL`): for a claim that does not move the floor
/// (`RelayConfig::floor_sample_interval`), so it spares the copy of Postgres's lock table that
/// reading `pg_locks` takes — with a fleet's thousands of lane locks, most of a small claim.
pub(super) const SAMPLE_LEAN: &str = sample!("NULL::text[]");

/// Last statement of a claim transaction (after the marks, so this pass's sent rows are no longer
/// pending to it): the lowest row of the relay's lanes (`$3`) still pending in `[$1, $2)`, the
/// ids between the old floor and where the floor would move. Whatever is there — held back,
/// deferred, backed off, not due, locked by another session — stops the floor. Reads the same
/// stretch of `outbox_pending_id_idx` the claim just read.
pub(super) const LEFT_BEHIND: &str = "\
SELECT min(o.id) FROM {s}.outbox AS o
 WHERE o.status = 'pending' AND o.id >= $1 AND o.id < $2
   AND (hashtext(coalesce(o.message_key, '')) & 63) = ANY($3::int[])";

/// The sweep: the lowest due pending row of the relay's lanes (`$2`) below its claim floor
/// (`$1`). Normally none; it finds rows the floor passed because their transaction stayed open
/// longer than `long_transaction`, or rows put back to pending by plain SQL. Run off the claim
/// path.
pub(super) const SWEEP: &str = "\
SELECT min(o.id) FROM {s}.outbox AS o
 WHERE o.status = 'pending' AND o.id < $1 AND o.available_at <= now()
   AND (hashtext(coalesce(o.message_key, '')) & 63) = ANY($2::int[])";

/// Mark acknowledged rows sent, one statement per batch. `$1` = ids.
pub(super) const MARK_SENT: &str = "\
UPDATE {s}.outbox SET status = 'sent', sent_at = now() WHERE id = ANY($1::bigint[])";

/// Exactly-once recovery: the rows `$1` a slot's last committed Kafka transaction published,
/// marked sent if their mark was lost (a crash between the commit and the mark). Rows already
/// sent are left as they are; the count says how many were recovered.
pub(super) const RECOVER_SENT: &str = "\
UPDATE {s}.outbox SET status = 'sent', sent_at = now()
 WHERE id = ANY($1::bigint[]) AND status = 'pending'";

/// Back off rows whose produce failed, one statement per batch: `attempts + 1`, the error kept,
/// `available_at = now() + min(300 s, 2^attempts s)` scaled by a jitter in [0.75, 1.25) (and still
/// capped at 300 s), `failed` once `attempts + 1` reaches the maximum.
/// `$1` = ids, `$2` = errors (same order), `$3` = max attempts. The rows are found through the
/// primary key (`id = ANY`), never by joining the table, so the cost follows the batch, not the
/// table; the error is picked by position (failures are few, so the O(n²) lookup is cheap).
pub(super) const MARK_FAILED: &str = "\
UPDATE {s}.outbox AS o
   SET attempts     = o.attempts + 1,
       last_error   = ($2::text[])[array_position($1::bigint[], o.id)],
       available_at = now() + make_interval(secs => least(300.0,
                          power(2.0, least(o.attempts, 30)) * (0.75 + random() * 0.5))),
       status       = CASE WHEN o.attempts + 1 >= $3 THEN 'failed' ELSE 'pending' END
 WHERE o.id = ANY($1::bigint[])";

/// Insert one message. `$1..$4` = topic, key, headers, payload.
pub(super) const ENQUEUE: &str = "\
INSERT INTO {s}outbox (topic, message_key, headers, payload) VALUES ($1, $2, $3, $4)";

/// Insert many messages in one statement. `$1..$4` = arrays of topic, key, headers, payload.
pub(super) const ENQUEUE_BATCH: &str = "\
INSERT INTO {s}outbox (topic, message_key, headers, payload)
SELECT * FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::jsonb[])";

/// Delete one bounded batch of sent rows older than `$1` seconds; `$2` = batch size, `$3` =
/// the highest id deleted by the previous batch (keyset: each batch resumes where the last one
/// stopped, so the deleted region is never rescanned and a whole run reads the table once).
/// `SKIP LOCKED` keeps cleanup from ever waiting on a relay. Returns (deleted, max id).
pub(super) const CLEANUP_OUTBOX: &str = "\
WITH doomed AS (
    SELECT id FROM {s}.outbox
     WHERE id > $3 AND status = 'sent' AND sent_at < now() - make_interval(secs => $1)
     ORDER BY id
     LIMIT $2
     FOR UPDATE SKIP LOCKED),
gone AS (DELETE FROM {s}.outbox AS o USING doomed WHERE o.id = doomed.id RETURNING o.id)
SELECT count(*)::bigint, coalesce(max(id), $3) FROM gone";

/// Counts and oldest row per status.
pub(super) const STATUS_COUNTS: &str = "\
SELECT status, count(*)::bigint, min(created_at)::text
  FROM {s}.outbox GROUP BY status ORDER BY status";

/// Metrics gauges, cheap on any table size: pending and failed rows counted through their
/// partial indexes, sent rows estimated from the planner's row count, the oldest pending row
/// found at the head of the pending index.
pub(crate) const GAUGES: &str = "\
SELECT (SELECT count(*) FROM {s}.outbox WHERE status = 'pending')::bigint,
       (SELECT count(*) FROM {s}.outbox WHERE status = 'failed')::bigint,
       (SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = '{s}.outbox'::regclass),
       (SELECT extract(epoch FROM now() - o.created_at)::float8 FROM {s}.outbox AS o
         WHERE o.status = 'pending' ORDER BY o.id LIMIT 1)";

/// Age in seconds of the oldest pending row, NULL when none.
pub(super) const OLDEST_PENDING_AGE: &str = "\
SELECT extract(epoch FROM now() - min(created_at))::float8
  FROM {s}.outbox WHERE status = 'pending'";

/// Failed rows grouped by error, most frequent first. `$1` = limit.
pub(super) const FAILED_BY_ERROR: &str = "\
SELECT coalesce(last_error, '(none)'), count(*)::bigint, min(id), max(id)
  FROM {s}.outbox WHERE status = 'failed'
 GROUP BY last_error ORDER BY count(*) DESC, min(id) LIMIT $1";

/// Put every failed row back to pending (the operator's repair). Returns the ids.
pub(super) const REQUEUE_FAILED: &str = "\
UPDATE {s}.outbox SET status = 'pending', attempts = 0, available_at = now()
 WHERE status = 'failed' RETURNING id";

/// Put one failed row back to pending. `$1` = id. Returns it.
pub(super) const REQUEUE_ID: &str = "\
UPDATE {s}.outbox SET status = 'pending', attempts = 0, available_at = now()
 WHERE status = 'failed' AND id = $1 RETURNING id";

/// The audit row of a requeue of failed rows, in its transaction.
pub(crate) const AUDIT_REQUEUE: &str = "\
INSERT INTO {s}.dlq_audit (actor, action, filter, count, dead_letter_ids, reason)
     VALUES ($1, 'requeue', $2, $3, $4, 'outbox rows (ids) put back to pending') RETURNING id";

/// Sent rows of topic `$1` created in `[$2, $3)` (NULL = unbounded), with ids up to `$4`: what
/// a re-publish would put back to pending.
pub(crate) const COUNT_SENT: &str = "\
SELECT count(*)::bigint, max(id) FROM {s}.outbox
 WHERE status = 'sent' AND topic = $1 AND id <= $4
   AND created_at >= coalesce($2::timestamptz, '-infinity')
   AND created_at < coalesce($3::timestamptz, 'infinity')";

/// One batch of a re-publish: the next `$5` sent rows of [`COUNT_SENT`]'s selection after id
/// `$6`, back to pending in id order (so each key's rows go out again in their order). The id
/// cursor keeps a row the relay re-sends meanwhile from being picked twice.
pub(crate) const REQUEUE_SENT: &str = "\
WITH picked AS (
  SELECT id FROM {s}.outbox
   WHERE status = 'sent' AND topic = $1 AND id <= $4 AND id > $6
     AND created_at >= coalesce($2::timestamptz, '-infinity')
     AND created_at < coalesce($3::timestamptz, 'infinity')
   ORDER BY id LIMIT $5 FOR UPDATE)
UPDATE {s}.outbox o
   SET status = 'pending', attempts = 0, available_at = now(), sent_at = NULL, last_error = NULL
  FROM picked WHERE o.id = picked.id
RETURNING o.id";

/// The audit row of one re-publish batch, in the batch's transaction.
pub(crate) const AUDIT_REQUEUE_SENT: &str = "\
INSERT INTO {s}.dlq_audit (actor, action, filter, count, reason)
     VALUES ($1, 'requeue-sent', $2, $3, $4) RETURNING id";

/// A message's journey starts here: outbox rows whose message id is `$1` (indexed), and, when
/// `$2` (a content search), rows among the newest `$4` whose key is `$1` or, when `$5`, whose
/// body holds `$1` as a string value; newest first, at most `$3`. The content part reads at
/// most `$4` rows by the primary key, whatever the outbox's size.
pub(crate) const JOURNEY_FIND: &str = "\
(SELECT o.id, o.topic, o.message_key, o.headers->>'message_id', o.headers->>'message_type',
        o.status, o.attempts, o.last_error, o.created_at, o.sent_at, o.payload IS NULL
   FROM {s}.outbox o
  WHERE o.headers->>'message_id' = $1)
UNION
(SELECT o.id, o.topic, o.message_key, o.headers->>'message_id', o.headers->>'message_type',
        o.status, o.attempts, o.last_error, o.created_at, o.sent_at, o.payload IS NULL
   FROM {s}.outbox o
  WHERE $2 AND o.id > (SELECT coalesce(max(id), 0) FROM {s}.outbox) - $4
    AND (o.message_key = $1
         OR ($5 AND jsonb_path_exists(o.payload, '$.** ? (@ == $v)', jsonb_build_object('v', $1::text)))))
 ORDER BY 1 DESC LIMIT $3";

/// The outbox rows of message ids `$1`.
pub(crate) const JOURNEY_ROWS: &str = "\
SELECT o.id, o.topic, o.message_key, o.headers->>'message_id', o.headers->>'message_type',
       o.status, o.attempts, o.last_error, o.created_at, o.sent_at, o.payload IS NULL
  FROM {s}.outbox o WHERE o.headers->>'message_id' = ANY($1) ORDER BY o.id";
