-- A replayed record carries the job and the letter it replays (x-replay-job, x-replay-of); a
-- consumer keeps both on the dead letter it writes if it fails again, so the archiver matches
-- the comeback to its job and letter whatever else the record carries (no message id needed),
-- also after the job ended, for `watch_ms` after its last update.
ALTER TABLE dead_letters
    ADD COLUMN replay_job bigint,
    ADD COLUMN replay_of  bigint;
ALTER TABLE dlq_replay_jobs
    ADD COLUMN watch_ms bigint NOT NULL DEFAULT 3600000 CHECK (watch_ms >= 0);

-- Where an audited action came from: the writing session's application_name ("outbox-cli",
-- "outbox-admin"; a library caller's own), so `--actor alice` on the CLI is not mistaken
-- for a signed-in alice. Requeues of failed outbox rows are audited too.
ALTER TABLE dlq_audit
    ADD COLUMN via text NOT NULL
        DEFAULT coalesce(nullif(current_setting('application_name', true), ''), 'library');
ALTER TABLE dlq_audit DROP CONSTRAINT dlq_audit_action_check;
ALTER TABLE dlq_audit ADD CONSTRAINT dlq_audit_action_check
    CHECK (action IN ('replay', 'drop', 'archive-purge', 'restore', 'requeue-sent', 'requeue'));
