-- Retention deletes from seed 002, in bounded batches (what `outbox cleanup` runs).
-- One big DELETE would hold locks and produce WAL for a long time; repeat each statement
-- until it deletes fewer rows than the batch size. Set search_path to the outbox schema.

-- sent outbox rows older than 7 days, 5000 at a time
WITH doomed AS (
    SELECT id FROM outbox
     WHERE status = 'sent' AND sent_at < now() - interval '7 days'
     LIMIT 5000
     FOR UPDATE SKIP LOCKED)
DELETE FROM outbox AS o USING doomed WHERE o.id = doomed.id;

-- processed-message marks older than 14 days, 5000 at a time
WITH doomed AS (
    SELECT ctid FROM processed_messages
     WHERE processed_at < now() - interval '14 days'
     LIMIT 5000
     FOR UPDATE SKIP LOCKED)
DELETE FROM processed_messages AS p USING doomed WHERE p.ctid = doomed.ctid;
