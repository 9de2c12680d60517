-- Dead letters written once: the consumer records each record it dead-lettered (after the
-- broker's ack), so a redelivery of that same record after a crash is not dead-lettered again.
-- Keyed by the record read (a replayed or re-published message is a new record and is handled,
-- and if need be dead-lettered, again). Cleaned up with processed_messages' retention.
CREATE TABLE dead_lettered (
    consumer_group   text        NOT NULL,
    topic            text        NOT NULL,
    "partition"      integer     NOT NULL,
    "offset"         bigint      NOT NULL,
    dead_lettered_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, "partition", "offset")
);
CREATE INDEX dead_lettered_at_idx ON dead_lettered (dead_lettered_at);
