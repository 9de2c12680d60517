//! `dead_letters` (the archive) and `dlq_audit`: archiving, the summary by cause, drop, the
//! audit log. `{s}` stands for the quoted schema.

/// A letter a consumer drained or dropped: inserted already settled when the archiver has not
/// read it yet, else its status set; either way operators see the outcome.
pub(crate) const UPSERT_SETTLED: &str = "INSERT INTO {s}.dead_letters (dlq_topic, \"partition\", \"offset\", original_topic,
                     original_partition, original_offset, consumer_group, message_key, body,
                     headers, message_type, message_id, error, error_group, error_kind, attempts,
                     dlq_retries, first_failed_at, failed_at, replay_job, replay_of,
                     status, status_at, status_reason)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                         $17, $18, $19, $20, $21, $22, now(), $23)
                 ON CONFLICT (dlq_topic, \"partition\", \"offset\") DO UPDATE
                   SET status = EXCLUDED.status, status_at = now(), status_reason = EXCLUDED.status_reason";

/// Archives one DLQ record. The archiver reads at least once: a record already archived (same
/// topic, partition, offset) is skipped, so each letter is stored once.
pub(crate) const ARCHIVE: &str =
    "INSERT INTO {s}.dead_letters (dlq_topic, \"partition\", \"offset\", original_topic,
                     original_partition, original_offset, consumer_group, message_key, body,
                     headers, message_type, message_id, error, error_group, error_kind, attempts,
                     dlq_retries, first_failed_at, failed_at, replay_job, replay_of)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                         $17, $18, $19, $20, $21)
                 ON CONFLICT (dlq_topic, \"partition\", \"offset\") DO NOTHING RETURNING id";

/// For letters just archived, per original topic: how many, and how many start a new cause
/// group (no earlier letter with the same group, kind and normalised error) — the counter an
/// alert on new defects watches.
pub(crate) const NEW_CAUSES: &str = "SELECT d.original_topic, count(*),
                                count(*) FILTER (WHERE NOT EXISTS (
                                  SELECT 1 FROM {s}.dead_letters e WHERE e.original_topic = d.original_topic
                                     AND e.error_group = d.error_group AND e.id < d.id
                                     AND e.error_kind IS NOT DISTINCT FROM d.error_kind
                                     AND e.consumer_group IS NOT DISTINCT FROM d.consumer_group))
                         FROM {s}.dead_letters d WHERE d.id = ANY($1) GROUP BY 1";

/// Letters per original topic and group by status, and the oldest new one: the home view.
pub(crate) const SUMMARY_BY_TOPIC: &str = "SELECT original_topic, consumer_group,
                            count(*) FILTER (WHERE status = 'new') AS new,
                            count(*) FILTER (WHERE status = 'replayed') AS replayed,
                            count(*) FILTER (WHERE status = 'dropped') AS dropped,
                            min(coalesce(first_failed_at, failed_at)) FILTER (WHERE status = 'new') AS oldest,
                            extract(epoch FROM now() - min(coalesce(first_failed_at, failed_at)) FILTER (WHERE status = 'new'))::float8 AS age
                     FROM {s}.dead_letters GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2";

/// Per tenant (letters whose message carried `x-tenant`), most new letters first.
pub(crate) const SUMMARY_BY_TENANT: &str = "SELECT tenant,
                            count(*) FILTER (WHERE status = 'new') AS new,
                            count(*) FILTER (WHERE status = 'replayed') AS replayed,
                            count(*) FILTER (WHERE status = 'dropped') AS dropped,
                            extract(epoch FROM now() - min(coalesce(first_failed_at, failed_at)) FILTER (WHERE status = 'new'))::float8 AS age
                     FROM {s}.dead_letters WHERE tenant IS NOT NULL
                     GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 1000";

/// New letters grouped by cause (topic, group, kind, normalised error) with an example: one
/// defect on a hundred messages is one row. "First seen" counts from each letter's first failure
/// (`x-first-failed-at`), so a replay that failed again does not make a cause look new.
pub(crate) const CAUSE_GROUPS: &str = "SELECT g.*, d.error AS example_error FROM (
                       SELECT original_topic, consumer_group, error_kind, error_group,
                              count(*) AS n, min(coalesce(first_failed_at, failed_at)) AS first_seen,
                              max(failed_at) AS last_seen, min(id) AS example_id
                       FROM {s}.dead_letters WHERE status = 'new' GROUP BY 1, 2, 3, 4) g
                     JOIN {s}.dead_letters d ON d.id = g.example_id
                     ORDER BY g.n DESC, g.last_seen DESC";

/// Counts and oldest age per topic, group, kind and status, for the DLQ gauges. The age counts
/// from when the archive took the letter in (`archived_at`, this process's clock), not from
/// a time a record's producer wrote in a header.
/// Busiest series first: label values are capped per process and the first seen keep their
/// slots, so a process's first refresh gives them to the groups with the most letters, not to
/// whichever junk header value came first.
pub(crate) const GAUGES: &str =
    "SELECT original_topic, coalesce(consumer_group, ''), coalesce(error_kind, ''),
                            status, count(*),
                            extract(epoch FROM now() - min(archived_at))::float8
                     FROM {s}.dead_letters GROUP BY 1, 2, 3, 4 ORDER BY 5 DESC";

/// Counts per tenant and status for `outbox_dlq_tenant_messages`, busiest first (the first
/// seen keep their labels).
pub(crate) const GAUGES_BY_TENANT: &str = "SELECT tenant, status, count(*)
                     FROM {s}.dead_letters WHERE tenant IS NOT NULL
                     GROUP BY 1, 2 ORDER BY 3 DESC";

/// The audit log, newest first.
pub(crate) const AUDIT_LOG: &str = "SELECT * FROM {s}.dlq_audit ORDER BY id DESC LIMIT $1";

/// The status of each named letter, to refuse unknown ids and wrong states before acting.
pub(crate) const STATUS_OF_IDS: &str = "SELECT id, status FROM {s}.dead_letters WHERE id = ANY($1)";

/// The audit row of a drop, written in the drop's transaction.
pub(crate) const AUDIT_DROP: &str =
    "INSERT INTO {s}.dlq_audit (actor, action, filter, count, dead_letter_ids, reason)
                         VALUES ($1, 'drop', $2, $3, $4, $5) RETURNING id";

/// The audit row of a restore (dropped letters back to new), in the restore's transaction.
pub(crate) const AUDIT_RESTORE: &str =
    "INSERT INTO {s}.dlq_audit (actor, action, filter, count, dead_letter_ids, reason)
                         VALUES ($1, 'restore', $2, $3, $4, $5) RETURNING id";

/// The audit row of a replay, written in the transaction that freezes the job's selection.
pub(crate) const AUDIT_REPLAY: &str =
    "INSERT INTO {s}.dlq_audit (actor, action, filter, count, dead_letter_ids)
                     VALUES ($1, 'replay', $2, $3, $4) RETURNING id";

/// The audit row of a job's pause, resume or cancel (`$2`), naming the job and its unsent
/// letters.
pub(crate) const AUDIT_JOB_ACTION: &str =
    "INSERT INTO {s}.dlq_audit (actor, action, filter, count, dead_letter_ids, reason)
     SELECT $1, $2, jsonb_build_object('job', $3::bigint), count(*), coalesce(array_agg(dead_letter_id), '{}'), $4
       FROM {s}.dlq_replay_items WHERE job_id = $3 AND state = 'pending'";

/// Names the replay job in its audit row once the job has an id.
pub(crate) const AUDIT_NAME_JOB: &str =
    "UPDATE {s}.dlq_audit SET reason = 'replay job ' || $2::bigint WHERE id = $1";

/// Letters whose replay the broker acknowledged become `replayed` (never a dropped one: a drop
/// during the job wins).
pub(crate) const MARK_REPLAYED: &str =
    "UPDATE {s}.dead_letters SET status = 'replayed', status_at = now(),
                            status_reason = 'replay job ' || $2::bigint
                     WHERE id = ANY($1) AND status <> 'dropped'";

/// One letter whole, with how many times its message was replayed (by id or by the same
/// message id on the same topic).
pub(crate) const LETTER: &str = "SELECT d.*, (SELECT count(*) FROM {s}.dlq_replay_items i JOIN {s}.dead_letters d2 ON d2.id = i.dead_letter_id
                                  WHERE i.state = 'sent' AND (d2.id = d.id OR (d2.original_topic = d.original_topic
                                        AND d2.message_id = d.message_id))) AS times_replayed
                     FROM {s}.dead_letters d WHERE d.id = $1";

/// A page of letters matching a filter, in `{dir}` (`DESC` newest first, `ASC` oldest first)
/// of id. `{where}` is the filter's condition on `d` and `{limit}` its limit parameter (both
/// rendered by `Filter::to_where` with numbered parameters, never with values).
pub(crate) const LIST: &str = "SELECT d.id, d.original_topic, d.consumer_group, d.error_kind,
        left(d.error, 200) AS error, d.message_id, d.failed_at, d.status, d.dlq_retries, d.tenant
   FROM {s}.dead_letters d WHERE {where} ORDER BY d.id {dir} LIMIT {limit}";

/// How many letters `{where}` selects, counted up to 10,001 (the list says "more than 10,000"
/// rather than scan a huge archive for a number).
pub(crate) const COUNT_MATCHING: &str = "SELECT count(*) FROM (
   SELECT 1 FROM {s}.dead_letters d WHERE {where} LIMIT 10001) x";

/// Puts the dropped letters `{where}` selects back to `new`; the drop's reason is kept in the
/// audit log, the letter's own reason says it was restored (`{reason}`).
pub(crate) const RESTORE: &str = "UPDATE {s}.dead_letters d
    SET status = 'new', status_at = now(), status_reason = {reason}
  WHERE {where} RETURNING d.id";

/// Drops the new letters a filter selects, with the reason parameter `{reason}`; the ids come
/// back for the audit row written in the same transaction.
pub(crate) const DROP: &str = "UPDATE {s}.dead_letters d
    SET status = 'dropped', status_at = now(), status_reason = {reason}
  WHERE {where} RETURNING d.id";

/// Purges archived letters settled (replayed or dropped) longer than `$1` seconds ago, at most
/// `$2` per statement, and audits each batch as `archive-purge` by actor `$3` with filter `$4`.
/// A letter still part of an unfinished replay job is kept: the job would lose its item.
/// `new` letters are never purged: nobody has decided about them yet.
pub(crate) const PURGE: &str = "WITH victims AS (
   SELECT d.id FROM {s}.dead_letters d WHERE d.status <> 'new'
     AND coalesce(d.status_at, d.archived_at) < now() - make_interval(secs => $1)
     AND NOT EXISTS (SELECT 1 FROM {s}.dlq_replay_items i JOIN {s}.dlq_replay_jobs j ON j.id = i.job_id
                     WHERE i.dead_letter_id = d.id
                       AND j.status IN ('pending', 'running', 'paused'))
   ORDER BY coalesce(d.status_at, d.archived_at) LIMIT $2 FOR UPDATE SKIP LOCKED),
 del AS (DELETE FROM {s}.dead_letters d USING victims v WHERE d.id = v.id RETURNING d.id),
 audit AS (
   INSERT INTO {s}.dlq_audit (actor, action, filter, count, dead_letter_ids)
   SELECT $3, 'archive-purge', $4, count(*), array_agg(id ORDER BY id)
   FROM del HAVING count(*) > 0)
 SELECT count(*) FROM del";

/// Dead letters of message ids `$1`, or with key `$2` (bytes), or with archive id `$3`.
pub(crate) const JOURNEY_LETTERS: &str = "SELECT id, message_id, consumer_group, error_kind, error,
        attempts, dlq_retries, status, status_reason, failed_at, dlq_topic, \"partition\", \"offset\",
        original_topic, original_partition, original_offset, replay_job, replay_of
   FROM {s}.dead_letters
  WHERE message_id = ANY($1) OR ($2::bytea IS NOT NULL AND message_key = $2) OR id = $3
  ORDER BY id LIMIT 200";

/// Audit rows naming any of dead letters `$1` (drops, restores, replays).
pub(crate) const JOURNEY_AUDIT: &str = "SELECT id, at, actor, via, action, count, reason
   FROM {s}.dlq_audit WHERE dead_letter_ids && $1::bigint[] ORDER BY id";

/// An audited breaker action (`$2` = breaker-open | breaker-close) by `$1` on `$3`.
pub(crate) const AUDIT_BREAKER: &str =
    "INSERT INTO {s}.dlq_audit (actor, action, filter, count, reason)
 VALUES ($1, $2, $3, 1, $4) RETURNING id";

/// The audit row of an edit and retry (`$2`: the letter, the new message id, what changed).
pub(crate) const AUDIT_EDIT: &str =
    "INSERT INTO {s}.dlq_audit (actor, action, filter, count, dead_letter_ids, reason)
     VALUES ($1, 'edit-retry', $2, 1, ARRAY[$3::bigint], $4) RETURNING id";

/// Names the job an edit and retry created in its audit row's selection.
pub(crate) const AUDIT_EDIT_JOB: &str =
    "UPDATE {s}.dlq_audit SET filter = filter || jsonb_build_object('job', $2::bigint) WHERE id = $1";
