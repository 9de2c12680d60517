//! The consumer's marks: `processed_messages` (the inbox: a message handled by a group) and
//! `dead_lettered` (a record a group dead-lettered, so a redelivery after a crash is not
//! dead-lettered twice). `{s}` stands for the quoted schema.

/// Marks message `$3` of topic `$2` handled by group `$1`, in the handler's transaction; no row
/// back means it was handled before (a duplicate: skip it).
pub(crate) const MARK: &str =
    "INSERT INTO {s}.processed_messages (consumer_group, topic, message_id)
 VALUES ($1, $2, $3) ON CONFLICT DO NOTHING RETURNING 1";

/// Which of the (`$2` topics, `$3` message ids) group `$1` already processed: the check call
/// handlers make before their calls, outside any transaction, many at once.
pub(crate) const SEEN: &str = "SELECT p.topic, p.message_id FROM {s}.processed_messages p
 JOIN unnest($2::text[], $3::text[]) AS u(t, m) ON p.topic = u.t AND p.message_id = u.m
 WHERE p.consumer_group = $1";

/// [`MARK`] for a batch in one statement; the rows back are the first deliveries.
pub(crate) const MARK_MANY: &str =
    "INSERT INTO {s}.processed_messages (consumer_group, topic, message_id)
 SELECT $1, t, m FROM unnest($2::text[], $3::text[]) AS u(t, m)
 ON CONFLICT DO NOTHING RETURNING topic, message_id";

/// Takes back a mark made earlier in the same transaction (a commit group member that failed).
pub(crate) const UNMARK: &str = "DELETE FROM {s}.processed_messages
 WHERE consumer_group = $1 AND topic = $2 AND message_id = $3";

/// What group `$1` recorded for record (`$2`, `$3`, `$4`): written, or only the intent (the
/// dead-letter partition and its end offset before the write).
pub(crate) const DEAD_LETTERED_CHECK: &str = "SELECT written, dlq_partition, dlq_from
   FROM {s}.dead_lettered
  WHERE consumer_group = $1 AND topic = $2 AND \"partition\" = $3 AND \"offset\" = $4";

/// The intent before a dead letter is written: where it will go and where that partition
/// ended. Never overwrites a record already written.
pub(crate) const DEAD_LETTERED_INTEND: &str = "INSERT INTO {s}.dead_lettered
        (consumer_group, topic, \"partition\", \"offset\", written, dlq_partition, dlq_from)
 VALUES ($1, $2, $3, $4, false, $5, $6)
 ON CONFLICT (consumer_group, topic, \"partition\", \"offset\") DO UPDATE
   SET dlq_partition = excluded.dlq_partition, dlq_from = excluded.dlq_from
 WHERE NOT {s}.dead_lettered.written";

/// The dead letter is acknowledged by the broker: written.
pub(crate) const DEAD_LETTERED_WRITTEN: &str = "INSERT INTO {s}.dead_lettered
        (consumer_group, topic, \"partition\", \"offset\") VALUES ($1, $2, $3, $4)
 ON CONFLICT (consumer_group, topic, \"partition\", \"offset\") DO UPDATE SET written = true";

/// Delete one bounded batch of marks older than `$1` seconds from `{t}`, oldest first through
/// its `{at}` index; `$2` = batch size. Returns the number deleted. Rendered for
/// `processed_messages` (`processed_at`) and for the consumer's record of dead-lettered records,
/// `dead_lettered` (`dead_lettered_at`).
pub(crate) const CLEANUP: &str = "\
WITH doomed AS (
    SELECT ctid FROM {s}.{t}
     WHERE {at} < now() - make_interval(secs => $1)
     ORDER BY {at}
     LIMIT $2
     FOR UPDATE SKIP LOCKED),
gone AS (DELETE FROM {s}.{t} AS p USING doomed WHERE p.ctid = doomed.ctid RETURNING 1)
SELECT count(*)::bigint FROM gone";

/// [`CLEANUP`] for one consumer group (`$3`): a consumer deletes only its own group's marks,
/// by its own retention; other groups sharing the schema may keep theirs longer.
pub(crate) const CLEANUP_GROUP: &str = "\
WITH doomed AS (
    SELECT ctid FROM {s}.{t}
     WHERE {at} < now() - make_interval(secs => $1) AND consumer_group = $3
     ORDER BY {at}
     LIMIT $2
     FOR UPDATE SKIP LOCKED),
gone AS (DELETE FROM {s}.{t} AS p USING doomed WHERE p.ctid = doomed.ctid RETURNING 1)
SELECT count(*)::bigint FROM gone";

/// Processed marks older than `$1` seconds, per group: overdue for cleanup.
pub(crate) const OVERDUE: &str = "\
SELECT consumer_group, count(*)::bigint FROM {s}.processed_messages
 WHERE processed_at < now() - make_interval(secs => $1)
 GROUP BY consumer_group ORDER BY consumer_group";

/// Which groups handled messages `$1` (any topic), and when: a journey's consumer side. The
/// key is (group, topic, message id), so the (group, topic) pairs are walked first, one index
/// probe each (a loose index scan: there are few pairs), and each pair is probed for the ids:
/// a handful of index lookups instead of reading every mark.
pub(crate) const JOURNEY_MARKS: &str = "\
WITH RECURSIVE pairs(g, t) AS (
    (SELECT consumer_group, topic FROM {s}.processed_messages ORDER BY 1, 2 LIMIT 1)
  UNION ALL
    SELECT n.consumer_group, n.topic FROM pairs, LATERAL (
        SELECT p.consumer_group, p.topic FROM {s}.processed_messages p
         WHERE (p.consumer_group, p.topic) > (pairs.g, pairs.t)
         ORDER BY 1, 2 LIMIT 1) n
)
SELECT m.consumer_group, m.topic, m.message_id, m.processed_at
  FROM pairs JOIN {s}.processed_messages m
    ON m.consumer_group = pairs.g AND m.topic = pairs.t AND m.message_id = ANY($1)
 ORDER BY m.processed_at";

/// `Delivered::newer_than_applied`: records sequence `$4` as the newest applied for entity
/// `$3` (the record's key) of topic `$2` in scope `$1` if it is newer than the one recorded;
/// a row back when it was (apply), none when it was not (ignore). Unqualified: handlers run
/// with the outbox schema first on their `search_path`.
pub(crate) const APPLY_SEQUENCE: &str = "\
INSERT INTO applied_sequences AS a (scope, topic, entity_key, seq)
VALUES ($1, $2, $3, $4)
ON CONFLICT (scope, topic, entity_key) DO UPDATE
   SET seq = excluded.seq, applied_at = now()
 WHERE a.seq < excluded.seq
RETURNING a.seq";
