-- Replays and per-key order for groups NOT in strict order (issue 38): when such a group
-- dead-letters a keyed message, the key is noted here; the first later message of that key
-- the group handles sets `newer_handled_at`. A replay's dry run flags those letters (they
-- would land behind newer events of their entity) and the job needs a confirmation.
CREATE TABLE consumer_passed (
    consumer_group   text        NOT NULL,
    topic            text        NOT NULL,
    message_key      bytea       NOT NULL,
    message_id       text        NOT NULL,
    dead_at          timestamptz NOT NULL DEFAULT now(),
    newer_handled_at timestamptz,
    PRIMARY KEY (consumer_group, topic, message_key, message_id)
);
CREATE INDEX consumer_passed_message_idx ON consumer_passed (message_id);
