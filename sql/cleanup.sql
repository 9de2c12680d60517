-- Retention deletes from seed 002, in bounded batches (what `outbox cleanup` runs).
-- One big DELETE would hold locks and produce WAL for a long time; repeat each statement
-- until it deletes fewer rows than the batch size. Set search_path to the outbox schema.

-- Sent outbox rows older than 7 days, 5000 at a time. :last_id starts at 0 and becomes the
-- max_id returned by the previous batch (keyset pagination: deleted rows are never rescanned).
WITH doomed AS (
    SELECT id FROM outbox
     WHERE id > :last_id AND status = 'sent' AND sent_at < now() - interval '7 days'
     ORDER BY id
     LIMIT 5000
     FOR UPDATE SKIP LOCKED),
gone AS (DELETE FROM outbox AS o USING doomed WHERE o.id = doomed.id RETURNING o.id)
SELECT count(*) AS deleted, max(id) AS max_id FROM gone;

-- Processed-message marks older than 14 days, oldest first, 5000 at a time.
WITH doomed AS (
    SELECT ctid FROM processed_messages
     WHERE processed_at < now() - interval '14 days'
     ORDER BY processed_at
     LIMIT 5000
     FOR UPDATE SKIP LOCKED)
DELETE FROM processed_messages AS p USING doomed WHERE p.ctid = doomed.ctid;
