-- A replay job's page shows how it got where it is: every change of its status, with the
-- reason (who paused it and why, what the canary saw), kept next to the job.
CREATE TABLE IF NOT EXISTS dlq_replay_job_events (
    job_id bigint      NOT NULL REFERENCES dlq_replay_jobs (id) ON DELETE CASCADE,
    at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    status text        NOT NULL,
    reason text
);
CREATE INDEX IF NOT EXISTS dlq_replay_job_events_job_idx ON dlq_replay_job_events (job_id, at);

-- Edit and retry: an item may carry the operator's edited body and headers; the runner sends
-- those instead of the letter's, which stays as it was.
ALTER TABLE dlq_replay_items
    ADD COLUMN IF NOT EXISTS edited_body    bytea,
    ADD COLUMN IF NOT EXISTS edited_headers jsonb;

-- Pausing, resuming and cancelling a job are audited like the replay that created it, and so
-- is an edited retry.
ALTER TABLE dlq_audit DROP CONSTRAINT dlq_audit_action_check;
ALTER TABLE dlq_audit ADD CONSTRAINT dlq_audit_action_check
    CHECK (action IN ('replay', 'drop', 'archive-purge', 'restore', 'requeue-sent', 'requeue',
                      'breaker-open', 'breaker-close', 'job-pause', 'job-resume', 'job-cancel',
                      'edit-retry'));
