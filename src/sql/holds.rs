//! Strict per-key order: `consumer_holds` (one row per held key: the head it waits for) and
//! `consumer_held` (the messages waiting behind it, in arrival order). Parameters `$1..$3` are
//! always the group, the (original) topic and the key.

/// Every key the group holds, loaded when partitions are assigned: the runtime's set of keys
/// that take the database path.
pub(crate) const KEYS: &str =
    "SELECT topic, message_key FROM {s}.consumer_holds WHERE consumer_group = $1";

/// The hold of one key, if any: its head's message id, state and original position.
pub(crate) const GET: &str = "SELECT head_message_id, head_state, head_partition, head_offset
  FROM {s}.consumer_holds
 WHERE consumer_group = $1 AND topic = $2 AND message_key = $3";

/// A head failed: the key is held behind message `$4` (at `$5`/`$6`) in state `$7`, for at most
/// `$8` seconds (NULL: no expiry). Written after the broker acknowledged the letter or the
/// retry copy; a second write of the same head (a redelivery after a crash, another retry
/// hop) only updates its state.
pub(crate) const HOLD: &str = "INSERT INTO {s}.consumer_holds AS h
    (consumer_group, topic, message_key, head_message_id, head_partition, head_offset,
     head_state, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, now() + make_interval(secs => $8::float8))
ON CONFLICT (consumer_group, topic, message_key) DO UPDATE
   SET head_state = excluded.head_state,
       released_reason = NULL,
       held_since = CASE WHEN h.head_message_id IS NOT DISTINCT FROM excluded.head_message_id
                         THEN h.held_since ELSE now() END,
       expires_at = CASE WHEN h.head_message_id IS NOT DISTINCT FROM excluded.head_message_id
                         THEN h.expires_at ELSE excluded.expires_at END,
       head_message_id = excluded.head_message_id,
       head_partition = excluded.head_partition,
       head_offset = excluded.head_offset";

/// A message of a held key arrives: written behind the head, unless the hold ended
/// meanwhile. `FOR SHARE` waits for a release in progress (it holds the row `FOR UPDATE`),
/// so an arrival is either written before the release reads the last held row or sees the
/// hold gone. Returns whether the hold exists (then the message is held, now or by an
/// earlier delivery of the same record).
pub(crate) const ARRIVE: &str = "WITH h AS (
    SELECT 1 FROM {s}.consumer_holds
     WHERE consumer_group = $1 AND topic = $2 AND message_key = $3 FOR SHARE),
ins AS (
    INSERT INTO {s}.consumer_held (consumer_group, topic, message_key, record_topic,
        partition, \"offset\", message_id, header_names, header_values, payload, record_ts_ms)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11 FROM h
    ON CONFLICT DO NOTHING RETURNING 1)
SELECT EXISTS (SELECT 1 FROM h)";

/// The release's lock on a hold, held while its messages are let through (arrivals wait on
/// it). Also says whether the hold is past its expiry.
pub(crate) const LOCK: &str = "SELECT head_message_id, head_state,
       coalesce(expires_at < now(), false) AS expired
  FROM {s}.consumer_holds
 WHERE consumer_group = $1 AND topic = $2 AND message_key = $3 FOR UPDATE";

/// [`LOCK`] for upkeep: a hold another replica is releasing is skipped.
pub(crate) const LOCK_SKIP: &str = "SELECT head_message_id, head_state,
       coalesce(expires_at < now(), false) AS expired
  FROM {s}.consumer_holds
 WHERE consumer_group = $1 AND topic = $2 AND message_key = $3 FOR UPDATE SKIP LOCKED";

/// The head is resolved (`$4` says how): written before its held messages go, so that a
/// crash in between leaves the release to upkeep.
pub(crate) const RELEASE: &str = "UPDATE {s}.consumer_holds
   SET head_state = 'released', released_reason = $4
 WHERE consumer_group = $1 AND topic = $2 AND message_key = $3";

/// The first message waiting behind the head.
pub(crate) const NEXT: &str = "SELECT seq, record_topic, partition, \"offset\", message_id,
       header_names, header_values, payload, record_ts_ms
  FROM {s}.consumer_held
 WHERE consumer_group = $1 AND topic = $2 AND message_key = $3
 ORDER BY seq LIMIT 1";

/// A held message whose fate is final.
pub(crate) const DELETE_HELD: &str = "DELETE FROM {s}.consumer_held
 WHERE consumer_group = $1 AND topic = $2 AND message_key = $3 AND seq = $4";

/// A held message failed during the release: it is the key's new head (`$4`..`$7`, expiry
/// `$8` seconds), and its own row goes in the same transaction.
pub(crate) const NEW_HEAD: &str = "WITH gone AS (
    DELETE FROM {s}.consumer_held
     WHERE consumer_group = $1 AND topic = $2 AND message_key = $3 AND seq = $9)
UPDATE {s}.consumer_holds
   SET head_message_id = $4, head_partition = $5, head_offset = $6, head_state = $7,
       held_since = now(), expires_at = now() + make_interval(secs => $8::float8),
       released_reason = NULL
 WHERE consumer_group = $1 AND topic = $2 AND message_key = $3";

/// No message is left behind the head: the hold ends (in the lock's transaction).
pub(crate) const END: &str = "DELETE FROM {s}.consumer_holds
 WHERE consumer_group = $1 AND topic = $2 AND message_key = $3";

/// Holds upkeep releases: resolved (a drop) or past their expiry, oldest first.
pub(crate) const DUE: &str = "SELECT topic, message_key FROM {s}.consumer_holds
 WHERE consumer_group = $1 AND (head_state = 'released' OR expires_at < now())
 ORDER BY held_since LIMIT 100";

/// Per topic of the group: held keys, the oldest hold's age in seconds, messages waiting.
pub(crate) const GAUGES: &str = "SELECT h.topic, count(*)::bigint,
       extract(epoch FROM now() - min(h.held_since))::float8,
       (SELECT count(*) FROM {s}.consumer_held x
         WHERE x.consumer_group = $1 AND x.topic = h.topic)::bigint
  FROM {s}.consumer_holds h WHERE h.consumer_group = $1 GROUP BY h.topic";

/// An operator dropped letters (ids `$1`, reason `$2`): a hold whose head is one of them is
/// released, in the drop's transaction. A head without a readable message id (it did not
/// decode) is its letter by original position.
pub(crate) const RELEASE_DROPPED: &str = "UPDATE {s}.consumer_holds h
   SET head_state = 'released', released_reason = 'head dropped: ' || $2
  FROM {s}.dead_letters d
 WHERE d.id = ANY($1) AND h.consumer_group = d.consumer_group
   AND h.topic = d.original_topic AND h.message_key = d.message_key
   AND (h.head_message_id = d.message_id
        OR (h.head_message_id IS NULL AND h.head_partition = d.original_partition
            AND h.head_offset = d.original_offset))";

/// Every hold (the admin API, the dashboard, `outbox dlq holds`), oldest first, with how many
/// wait behind it and the head's archived letter (the one to replay or drop), if archived.
pub(crate) const LIST: &str = "SELECT h.consumer_group, h.topic, h.message_key,
       h.head_message_id, h.head_state, h.held_since, h.expires_at,
       (SELECT count(*) FROM {s}.consumer_held x WHERE x.consumer_group = h.consumer_group
           AND x.topic = h.topic AND x.message_key = h.message_key)::bigint AS waiting,
       h.released_reason,
       (SELECT max(d.id) FROM {s}.dead_letters d
         WHERE d.consumer_group = h.consumer_group AND d.original_topic = h.topic
           AND (d.message_id = h.head_message_id
                OR (h.head_message_id IS NULL AND d.message_key = h.message_key
                    AND d.original_partition = h.head_partition
                    AND d.original_offset = h.head_offset))) AS head_letter
  FROM {s}.consumer_holds h ORDER BY h.held_since LIMIT $1";

/// A message's holds, for `outbox trace`: held behind a head (since it arrived), or the head
/// a key waits for (since it failed, with how many wait).
/// Of the message ids `$1`.
pub(crate) const TRACE: &str = "SELECT x.consumer_group, x.topic, 'held'::text,
       h.head_message_id, x.held_at, 0::bigint, x.message_id
  FROM {s}.consumer_held x
  LEFT JOIN {s}.consumer_holds h USING (consumer_group, topic, message_key)
 WHERE x.message_id = ANY($1)
UNION ALL
SELECT h.consumer_group, h.topic, 'head'::text, h.head_message_id, h.held_since,
       (SELECT count(*) FROM {s}.consumer_held x WHERE x.consumer_group = h.consumer_group
           AND x.topic = h.topic AND x.message_key = h.message_key)::bigint,
       h.head_message_id
  FROM {s}.consumer_holds h
 WHERE h.head_message_id = ANY($1)
 ORDER BY 5";

/// A group not in strict order dead-lettered message `$4` of the key: noted, so that the first
/// later message of the key it handles marks the letter as passed by newer events.
pub(crate) const PASSED: &str = "INSERT INTO {s}.consumer_passed
    (consumer_group, topic, message_key, message_id)
VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";

/// Message `$4`, a later one of the key, was handled: the key's open letters are passed (not
/// the message's own: a replayed letter handled does not pass itself).
pub(crate) const PASSED_BY_NEWER: &str = "UPDATE {s}.consumer_passed SET newer_handled_at = now()
 WHERE consumer_group = $1 AND topic = $2 AND message_key = $3 AND newer_handled_at IS NULL
   AND message_id <> $4";

/// The keys of the group whose letters are not passed yet (loaded with the held keys).
pub(crate) const PASSED_KEYS: &str = "SELECT DISTINCT topic, message_key FROM {s}.consumer_passed
 WHERE consumer_group = $1 AND newer_handled_at IS NULL";

/// Of archived letters `$1`, those whose group has handled a newer message of their key since
/// it dead-lettered them: (letter id, when the newer one was handled).
pub(crate) const PASSED_LETTERS: &str = "SELECT d.id, min(p.newer_handled_at)
  FROM {s}.dead_letters d
  JOIN {s}.consumer_passed p ON p.message_id = d.message_id
   AND p.consumer_group = d.consumer_group AND p.topic = d.original_topic
 WHERE d.id = ANY($1) AND p.newer_handled_at IS NOT NULL
 GROUP BY d.id";
