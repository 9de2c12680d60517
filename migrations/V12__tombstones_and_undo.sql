-- A tombstone, the delete marker of a compacted topic, is a record with a key and no value: its
-- outbox row has no payload.
ALTER TABLE outbox ALTER COLUMN payload DROP NOT NULL;

-- Two more audited operator actions: putting dropped letters back to new (undoing a drop), and
-- putting sent outbox rows back to pending (re-publishing a topic after the broker lost data).
ALTER TABLE dlq_audit DROP CONSTRAINT dlq_audit_action_check;
ALTER TABLE dlq_audit ADD CONSTRAINT dlq_audit_action_check
    CHECK (action IN ('replay', 'drop', 'archive-purge', 'restore', 'requeue-sent'));
