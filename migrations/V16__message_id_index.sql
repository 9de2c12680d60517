-- Finding a message by its id (`outbox trace`, the dashboard's trace, `/api/trace`) must not
-- read the whole outbox: at volume that is a sequential scan of millions of rows per lookup.
-- This build holds writes to the outbox while it runs: on an outbox of millions of rows,
-- create the index first without blocking writes, then migrate (IF NOT EXISTS makes this
-- step a no-op):
--   CREATE INDEX CONCURRENTLY outbox_message_id_idx ON <schema>.outbox ((headers->>'message_id'));
CREATE INDEX IF NOT EXISTS outbox_message_id_idx ON outbox ((headers->>'message_id'));
-- The journey's other lookups by message id and by letter: dead letters by message id (the
-- archive's index leads with the topic), audit rows naming a letter (an array).
CREATE INDEX IF NOT EXISTS dead_letters_message_id_idx ON dead_letters (message_id);
CREATE INDEX IF NOT EXISTS dlq_audit_letters_idx ON dlq_audit USING gin (dead_letter_ids);
-- A comeback carries its replay's job and letter: found by them when the runner marks the
-- item sent after the archive filed the comeback.
CREATE INDEX IF NOT EXISTS dead_letters_replay_idx ON dead_letters (replay_job, replay_of)
    WHERE replay_job IS NOT NULL;
