-- Strict per-key order (issue 38): a keyed message of a strict topic that ends in the DLQ (or
-- on a retry topic) holds its key; later messages of that key wait in `consumer_held`, in
-- arrival order, until the head is resolved (handled when it comes back, dropped by an
-- operator, or past the group's expiry). Partitions keep flowing: a held message's offset is
-- final once its row is written.
CREATE TABLE consumer_holds (
    consumer_group  text        NOT NULL,
    topic           text        NOT NULL,
    message_key     bytea       NOT NULL,
    -- The message the key waits for; NULL for a head that had no readable message_id.
    head_message_id text,
    head_partition  integer     NOT NULL,
    head_offset     bigint      NOT NULL,
    -- retrying: on a retry topic; dead: in the DLQ; released: resolved, its held messages
    -- are being let through (by the head's own task, or by upkeep after a drop or expiry).
    head_state      text        NOT NULL CHECK (head_state IN ('retrying', 'dead', 'released')),
    held_since      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz,
    released_reason text,
    PRIMARY KEY (consumer_group, topic, message_key)
);
CREATE INDEX consumer_holds_head_idx ON consumer_holds (head_message_id);

CREATE TABLE consumer_held (
    consumer_group  text        NOT NULL,
    topic           text        NOT NULL,
    message_key     bytea       NOT NULL,
    seq             bigint      GENERATED ALWAYS AS IDENTITY,
    -- Where it was read (a retry topic's copy included), for redelivery dedupe and trace.
    record_topic    text        NOT NULL,
    partition       integer     NOT NULL,
    "offset"        bigint      NOT NULL,
    message_id      text,
    header_names    text[]      NOT NULL,
    header_values   bytea[]     NOT NULL,
    payload         bytea,
    record_ts_ms    bigint,
    held_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, message_key, seq),
    -- A redelivery after a crash (held, offset not yet committed) is not held twice.
    UNIQUE (consumer_group, record_topic, partition, "offset")
);
CREATE INDEX consumer_held_message_idx ON consumer_held (message_id);
