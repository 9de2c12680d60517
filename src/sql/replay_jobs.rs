//! `dlq_replay_jobs` and `dlq_replay_items`: a replay job, its frozen selection, and the
//! runner's progress through it. `{s}` stands for the quoted schema.

/// Jobs with their item counts by state, newest first; one job when `$1` is set.
pub(crate) const JOBS: &str = "SELECT j.*, c.* FROM {s}.dlq_replay_jobs j
                     CROSS JOIN LATERAL (
                       SELECT count(*) AS total,
                              count(*) FILTER (WHERE state = 'pending') AS pending,
                              count(*) FILTER (WHERE state = 'sent') AS sent,
                              count(*) FILTER (WHERE state = 'failed') AS failed,
                              count(*) FILTER (WHERE state = 'skipped') AS skipped,
                              count(*) FILTER (WHERE came_back_id IS NOT NULL) AS came_back
                       FROM {s}.dlq_replay_items i WHERE i.job_id = j.id) c
                     WHERE $1::bigint IS NULL OR j.id = $1
                     ORDER BY j.id DESC LIMIT $2";

/// A state change of a job, only from the states `$4` allows (a finished job stays finished),
/// recorded on the job's timeline. Returns one row when it changed.
pub(crate) const SET_STATUS: &str = "WITH u AS (
    UPDATE {s}.dlq_replay_jobs SET status = $2, status_reason = $3, updated_at = now()
     WHERE id = $1 AND status = ANY($4)
 RETURNING id, status, status_reason)
INSERT INTO {s}.dlq_replay_job_events (job_id, status, reason)
SELECT id, status, status_reason FROM u RETURNING job_id";

/// A job's timeline: every status it took, oldest first.
pub(crate) const EVENTS: &str = "SELECT at, status, reason FROM {s}.dlq_replay_job_events
  WHERE job_id = $1 ORDER BY at, status";

/// A job's items in send order from seq `$2` on, with the letter each sent and the comeback it
/// became; `$3` rows at most.
pub(crate) const ITEMS: &str =
    "SELECT i.seq, i.dead_letter_id, i.state, i.sent_at, i.error, i.came_back_id,
        i.came_back_at, i.edited_body IS NOT NULL OR i.edited_headers IS NOT NULL AS edited,
        d.original_topic, d.consumer_group, d.error_kind, d.error_group, d.message_id,
        b.error AS came_back_error
   FROM {s}.dlq_replay_items i JOIN {s}.dead_letters d ON d.id = i.dead_letter_id
   LEFT JOIN {s}.dead_letters b ON b.id = i.came_back_id
  WHERE i.job_id = $1 AND i.seq >= $2 ORDER BY i.seq LIMIT $3";

/// A new job with its options.
pub(crate) const INSERT_JOB: &str =
    "INSERT INTO {s}.dlq_replay_jobs (created_by, audit_id, filter, to_topic, rate, canary,
                                     canary_wait_ms, max_refail, watch_ms)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id";

/// The job's frozen selection, in send order: letters dead-lettered later are never part of it.
pub(crate) const INSERT_ITEMS: &str = "INSERT INTO {s}.dlq_replay_items (job_id, dead_letter_id, seq, state, error)
                 SELECT $1, x.id, x.ord, x.state, x.error
                 FROM unnest($2::bigint[], $3::text[], $4::text[]) WITH ORDINALITY AS x(id, state, error, ord)";

/// Pending items whose letter was dropped after the job was created are skipped, not sent.
pub(crate) const SKIP_DROPPED: &str = "UPDATE {s}.dlq_replay_items i SET state = 'skipped', error = 'dropped after the job was created'
                 FROM {s}.dead_letters d WHERE d.id = i.dead_letter_id AND i.job_id = $1 AND i.state = 'pending'
                   AND d.status = 'dropped'";

/// The next pending items in send order, with what sending them needs: an edited retry's
/// body and headers instead of its letter's.
pub(crate) const NEXT_PENDING: &str = "SELECT d.id, coalesce(j.to_topic, d.original_topic) AS topic, d.message_key,
                            CASE WHEN i.edited_body IS NOT NULL THEN i.edited_body ELSE d.body END AS body,
                            coalesce(i.edited_headers, d.headers) AS headers, d.dlq_retries, coalesce(d.first_failed_at, d.failed_at) AS first_failed
                     FROM {s}.dlq_replay_items i JOIN {s}.dead_letters d ON d.id = i.dead_letter_id
                     JOIN {s}.dlq_replay_jobs j ON j.id = i.job_id
                     WHERE i.job_id = $1 AND i.state = 'pending' ORDER BY i.seq LIMIT $2";

/// Items the broker acknowledged, with the time of the ack (came-back matching starts there).
pub(crate) const MARK_SENT: &str =
    "UPDATE {s}.dlq_replay_items i SET state = 'sent', sent_at = x.at
                     FROM unnest($2::bigint[], $3::timestamptz[]) AS x(id, at)
                     WHERE i.job_id = $1 AND i.dead_letter_id = x.id";

/// An item the broker refused, with the reason.
pub(crate) const MARK_FAILED: &str = "UPDATE {s}.dlq_replay_items SET state = 'failed', error = $3 WHERE job_id = $1 AND dead_letter_id = $2";

/// The runner is alive: a job not touched for long is an orphan another runner may resume.
pub(crate) const TOUCH: &str = "UPDATE {s}.dlq_replay_jobs SET updated_at = now() WHERE id = $1";

/// The canary's outcome was good: the rest of the job may go.
pub(crate) const CANARY_DONE: &str =
    "UPDATE {s}.dlq_replay_jobs SET canary_done = true WHERE id = $1";

/// A job's status, read between chunks so a pause or cancel from elsewhere stops the runner.
pub(crate) const STATUS: &str =
    "SELECT status, status_reason FROM {s}.dlq_replay_jobs WHERE id = $1";

/// The letters a replay filter selects, with where each goes (`{to}`: the target topic
/// parameter, null for the original) and how often its message was replayed (the loop
/// guard). Dropped letters and letters already pending in an unfinished job are left out, so
/// two jobs never send one letter. `{where}` and `{limit}` as in `dead_letters::LIST`.
pub(crate) const SELECTION: &str = "SELECT d.id, coalesce({to}::text, d.original_topic) AS target,
   (SELECT count(*) FROM {s}.dlq_replay_items i JOIN {s}.dead_letters d2 ON d2.id = i.dead_letter_id
     WHERE i.state = 'sent' AND (d2.id = d.id OR (d2.original_topic = d.original_topic
           AND d2.message_id = d.message_id))) AS times_replayed,
   -- How long ago the message first failed: the groups reading the topic handled it then, and
   -- their processed marks age from about that moment.
   extract(epoch FROM now() - least(d.first_failed_at, d.failed_at, d.archived_at))::float8 AS age_secs,
   d.error_kind, d.consumer_group, d.error_group
 FROM {s}.dead_letters d
 WHERE {where} AND d.status <> 'dropped'
   AND NOT EXISTS (SELECT 1 FROM {s}.dlq_replay_items i JOIN {s}.dlq_replay_jobs j ON j.id = i.job_id
                   WHERE i.dead_letter_id = d.id AND i.state = 'pending'
                     AND j.status IN ('pending', 'running', 'paused'))
 ORDER BY d.id LIMIT {limit}";

/// Marks the comebacks among the letters just archived (`$1`): an item of a job whose record
/// failed again — matched by the replay's headers (`replay_job`, `replay_of`) whatever the
/// item's state (a fast consumer and archiver can file the comeback before the runner's mark
/// of the item commits), or, for a letter without them, a sent item by original topic and
/// message id after the send (a second of clock slack; items marked later pick such letters
/// up with [`LATE_COMEBACKS`]) — while the job runs or within its watch window after it. Returns one row per
/// comeback: job, original topic, whether the job is still unfinished.
pub(crate) const MATCH_COMEBACKS: &str = "WITH back AS (
    SELECT DISTINCT ON (i.job_id, i.dead_letter_id) i.job_id, i.dead_letter_id, d.id AS back_id,
           d.original_topic, j.status IN ('pending', 'running', 'paused') AS running
      FROM {s}.dead_letters d
      JOIN {s}.dlq_replay_items i ON i.came_back_id IS NULL
      JOIN {s}.dead_letters o ON o.id = i.dead_letter_id
      JOIN {s}.dlq_replay_jobs j ON j.id = i.job_id
     WHERE d.id = ANY($1)
       AND ((d.replay_job IS NOT NULL AND i.job_id = d.replay_job AND i.dead_letter_id = d.replay_of)
         OR (d.replay_job IS NULL AND i.state = 'sent' AND d.message_id IS NOT NULL
             AND o.message_id = d.message_id
             AND o.original_topic = d.original_topic AND o.id < d.id
             AND d.failed_at >= i.sent_at - interval '1 second'))
       AND (j.status IN ('pending', 'running', 'paused')
            OR j.updated_at + make_interval(secs => j.watch_ms / 1000.0) > now())
     ORDER BY i.job_id, i.dead_letter_id, d.id)
UPDATE {s}.dlq_replay_items it SET came_back_id = back.back_id, came_back_at = now()
  FROM back WHERE it.job_id = back.job_id AND it.dead_letter_id = back.dead_letter_id
RETURNING it.job_id, back.original_topic, back.running";

/// Comebacks of job `$1`'s items `$2` just marked sent that the archive already holds: a
/// letter archived before the mark committed, matched as [`MATCH_COMEBACKS`] matches. Returns
/// the original topic of each.
pub(crate) const LATE_COMEBACKS: &str = "WITH back AS (
    SELECT DISTINCT ON (i.dead_letter_id) i.job_id, i.dead_letter_id, d.id AS back_id,
           d.original_topic
      FROM {s}.dlq_replay_items i
      JOIN {s}.dead_letters o ON o.id = i.dead_letter_id
      JOIN {s}.dead_letters d ON d.id > o.id
       AND ((d.replay_job = i.job_id AND d.replay_of = i.dead_letter_id)
         OR (d.replay_job IS NULL AND d.message_id = o.message_id
             AND d.original_topic = o.original_topic
             AND d.failed_at >= i.sent_at - interval '1 second'))
     WHERE i.job_id = $1 AND i.dead_letter_id = ANY($2) AND i.state = 'sent'
       AND i.came_back_id IS NULL
     ORDER BY i.dead_letter_id, d.id)
UPDATE {s}.dlq_replay_items it SET came_back_id = back.back_id, came_back_at = now()
  FROM back WHERE it.job_id = back.job_id AND it.dead_letter_id = back.dead_letter_id
RETURNING back.original_topic";

/// Sent and came-back counts of job `$1`, over its first `$2` items when set (the canary).
pub(crate) const SENT_AND_CAME_BACK: &str = "SELECT count(*) FILTER (WHERE state = 'sent'),
        count(*) FILTER (WHERE came_back_id IS NOT NULL)
   FROM {s}.dlq_replay_items WHERE job_id = $1 AND ($2::bigint IS NULL OR seq <= $2)";

/// Replay items of dead letters `$1`: which job sent which letter, and whether it came back.
pub(crate) const JOURNEY_REPLAYS: &str = "SELECT i.job_id, i.dead_letter_id, i.state, i.sent_at,
        i.came_back_id, j.status, j.created_by
   FROM {s}.dlq_replay_items i JOIN {s}.dlq_replay_jobs j ON j.id = i.job_id
  WHERE i.dead_letter_id = ANY($1) ORDER BY i.job_id, i.seq";

/// The one item of an edit-and-retry job: the letter, and the body and headers to send
/// instead of its own.
pub(crate) const INSERT_EDITED_ITEM: &str = "INSERT INTO {s}.dlq_replay_items
        (job_id, dead_letter_id, seq, state, edited_body, edited_headers)
 VALUES ($1, $2, 1, 'pending', $3, $4)";

/// The rate of job `$1`: a strict-order consumer lets a replayed head's held messages follow
/// it no faster.
pub(crate) const RATE: &str = "SELECT rate FROM {s}.dlq_replay_jobs WHERE id = $1";
