-- Operator queries from seed 002 (what `outbox status` runs). Set search_path to the outbox schema.

-- Counts and oldest row per status. Expected: pending a handful with a recent oldest, failed 0.
-- A growing pending count with an old oldest means the relay is down or not keeping up.
SELECT status, count(*), min(created_at) AS oldest FROM outbox GROUP BY status;

-- Age of the oldest pending row.
SELECT now() - min(created_at) AS oldest_pending_age FROM outbox WHERE status = 'pending';

-- Failed rows by cause: the cause is not broker availability (unknown topic, too large, bad data).
SELECT last_error, count(*), min(id), max(id)
  FROM outbox WHERE status = 'failed'
 GROUP BY last_error ORDER BY count(*) DESC;

-- Processed-message marks past retention. Expected: 0; otherwise cleanup is not running.
SELECT count(*) FROM processed_messages WHERE processed_at < now() - interval '14 days';
