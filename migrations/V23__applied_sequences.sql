-- The newest event sequence a handler applied per entity (issue 38): `x-outbox-seq`, the
-- outbox row's id the relay adds to every record, compared by
-- `Delivered::newer_than_applied` in the handler's transaction, so that an older delivery (a
-- replayed dead letter whose key was handled meanwhile) can be ignored. One row per scope,
-- topic and entity; written only by handlers that ask.
CREATE TABLE applied_sequences (
    scope      text        NOT NULL,
    topic      text        NOT NULL,
    entity_key bytea       NOT NULL,
    seq        bigint      NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, topic, entity_key)
);
