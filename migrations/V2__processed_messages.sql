-- Idempotent consumers (seed 002, step 6): a row per handled message, written in the same
-- transaction as the handler's business change. The group is part of the key because several
-- services may read one topic and each dedupes on its own.
CREATE TABLE processed_messages (
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    message_id     text        NOT NULL,
    processed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, message_id)
);

CREATE INDEX processed_messages_processed_at_idx ON processed_messages (processed_at);
