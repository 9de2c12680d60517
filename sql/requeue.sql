-- Put failed rows back to work after fixing the cause named in last_error (seed 002).
-- What `outbox requeue --failed` / `--id N` run. Set search_path to the outbox schema.

-- every failed row
UPDATE outbox SET status = 'pending', attempts = 0, available_at = now() WHERE status = 'failed';

-- one row
-- UPDATE outbox SET status = 'pending', attempts = 0, available_at = now()
--  WHERE status = 'failed' AND id = 42;
