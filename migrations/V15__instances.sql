-- Every running relay, consumer replica and DLQ archiver writes a heartbeat here (every few
-- seconds, with a small state: mode, paused partitions, lag, last archive), so the admin
-- server can show the whole system's health from Postgres alone. A row whose seen_at is old
-- is a process that is gone; rows unseen for a day are deleted by the next heartbeat.
CREATE TABLE outbox_instances (
    kind       text        NOT NULL CHECK (kind IN ('relay', 'consumer', 'archiver')),
    name       text        NOT NULL,
    instance   text        NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at    timestamptz NOT NULL DEFAULT now(),
    state      jsonb       NOT NULL DEFAULT '{}',
    PRIMARY KEY (kind, name, instance)
);

-- Operators open and close circuit breakers by hand from the console, audited.
ALTER TABLE dlq_audit DROP CONSTRAINT dlq_audit_action_check;
ALTER TABLE dlq_audit ADD CONSTRAINT dlq_audit_action_check
    CHECK (action IN ('replay', 'drop', 'archive-purge', 'restore', 'requeue-sent', 'requeue',
                      'breaker-open', 'breaker-close'));
