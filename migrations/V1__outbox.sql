-- The transactional outbox, exactly as in seed 002. Rows are written in the caller's business
-- transaction and published by `outbox relay`.
CREATE TABLE outbox (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic        text        NOT NULL,
    message_key  text,
    headers      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    payload      jsonb       NOT NULL,
    status       text        NOT NULL DEFAULT 'pending',
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    available_at timestamptz NOT NULL DEFAULT now(),
    sent_at      timestamptz,
    CONSTRAINT outbox_status_check CHECK (status IN ('pending', 'sent', 'failed'))
);

-- Partial index: only rows still to be sent. The table grows with retention; this index stays
-- the size of the send queue, so claiming does not slow down as sent rows accumulate.
CREATE INDEX outbox_pending_idx ON outbox (available_at, id) WHERE status = 'pending';
