-- DLQ operations (seeds 001-004): the archive of dead letters read from `<topic>.dlq`, the
-- audit of every operator action, and replay jobs whose selection is frozen at creation.

-- One row per record of a dead-letter topic. (dlq_topic, partition, offset) is unique, so an
-- archiver that re-reads a record after a crash inserts nothing twice.
CREATE TABLE dead_letters (
    id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dlq_topic          text        NOT NULL,
    "partition"        integer     NOT NULL,
    "offset"           bigint      NOT NULL,
    original_topic     text        NOT NULL,
    original_partition integer,
    original_offset    bigint,
    consumer_group     text,
    message_key        bytea,
    body               bytea,
    -- Every header in record order: [{"name": …, "value": "utf-8 text"} | {"name": …,
    -- "base64": "…"} (value not UTF-8) | {"name": …, "value": null}].
    headers            jsonb       NOT NULL DEFAULT '[]',
    message_type       text,
    message_id         text,
    error              text,
    -- The error with digits, UUIDs and hex ids replaced: one defect, one group.
    error_group        text        NOT NULL DEFAULT '',
    error_kind         text,
    attempts           integer,
    dlq_retries        integer     NOT NULL DEFAULT 0,
    first_failed_at    timestamptz,
    failed_at          timestamptz NOT NULL,
    archived_at        timestamptz NOT NULL DEFAULT now(),
    status             text        NOT NULL DEFAULT 'new'
                                   CHECK (status IN ('new', 'replayed', 'dropped')),
    status_at          timestamptz,
    status_reason      text,
    UNIQUE (dlq_topic, "partition", "offset")
);

-- Summary and list of what needs attention: new letters by topic, group and cause.
CREATE INDEX dead_letters_new_idx ON dead_letters (original_topic, consumer_group, error_kind, error_group)
    WHERE status = 'new';
-- "Did this letter come back after its replay?" and the replay-loop guard.
CREATE INDEX dead_letters_message_idx ON dead_letters (original_topic, message_id);
CREATE INDEX dead_letters_failed_at_idx ON dead_letters (failed_at);
-- "Is this cause new?" (metrics, alerting on a new error type).
CREATE INDEX dead_letters_cause_idx ON dead_letters (original_topic, error_group, id);
-- Retention: settled letters are purged by how long ago they were settled.
CREATE INDEX dead_letters_settled_idx ON dead_letters ((coalesce(status_at, archived_at)))
    WHERE status <> 'new';

-- Who did what to which letters, written in the same transaction as the change it records.
CREATE TABLE dlq_audit (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT now(),
    actor           text        NOT NULL,
    action          text        NOT NULL CHECK (action IN ('replay', 'drop', 'archive-purge')),
    filter          jsonb       NOT NULL,
    count           bigint      NOT NULL,
    dead_letter_ids bigint[]    NOT NULL DEFAULT '{}',
    reason          text
);
CREATE INDEX dlq_audit_at_idx ON dlq_audit (at);

-- A replay is a job: its letters are fixed when it is created and it survives crashes.
CREATE TABLE dlq_replay_jobs (
    id             bigint           GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at     timestamptz      NOT NULL DEFAULT now(),
    created_by     text             NOT NULL,
    audit_id       bigint           NOT NULL REFERENCES dlq_audit (id),
    filter         jsonb            NOT NULL,
    to_topic       text,
    rate           double precision NOT NULL CHECK (rate > 0),
    canary         integer          NOT NULL CHECK (canary >= 0),
    canary_wait_ms bigint           NOT NULL CHECK (canary_wait_ms >= 0),
    canary_done    boolean          NOT NULL DEFAULT false,
    max_refail     double precision NOT NULL CHECK (max_refail >= 0),
    status         text             NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'running', 'paused', 'cancelled', 'stopped', 'completed')),
    status_reason  text,
    updated_at     timestamptz      NOT NULL DEFAULT now()
);

-- Each letter of a job and what became of it.
CREATE TABLE dlq_replay_items (
    job_id         bigint      NOT NULL REFERENCES dlq_replay_jobs (id) ON DELETE CASCADE,
    dead_letter_id bigint      NOT NULL REFERENCES dead_letters (id) ON DELETE CASCADE,
    seq            integer     NOT NULL,
    state          text        NOT NULL DEFAULT 'pending'
                   CHECK (state IN ('pending', 'sent', 'failed', 'skipped')),
    sent_at        timestamptz,
    error          text,
    -- The dead letter that came back (same message id, dead-lettered after sent_at).
    came_back_id   bigint,
    came_back_at   timestamptz,
    PRIMARY KEY (job_id, dead_letter_id)
);
CREATE INDEX dlq_replay_items_seq_idx ON dlq_replay_items (job_id, seq) WHERE state = 'pending';
CREATE INDEX dlq_replay_items_letter_idx ON dlq_replay_items (dead_letter_id);
