-- Enqueue an event from plain SQL, for services not written in Rust.
--
-- Run it in the SAME transaction as the business change: if the transaction rolls back, the
-- event never existed; if it commits, `outbox relay` publishes it (the table's trigger wakes the
-- relay at commit). Set search_path to the outbox schema, or qualify the names.
--
-- Contract (seed 002 / DESIGN §3.1):
--   message_key          = the entity id (the Kafka key; NULL only for deliberately keyless events)
--   headers.message_type = what happened, consumers dispatch on it
--   headers.entity_id    = the entity id again
--   headers.message_id   = a UUIDv7, assigned here once and never changed
--   headers.timestamp    = RFC 3339, UTC, with Z
--   payload              = the JSON body; no secrets. NULL publishes a tombstone (null value: the
--                          delete marker of a compacted topic; message_type 'tombstone')
-- Extra headers (e.g. traceparent) may be added to the object; values must be strings.
--
-- Topic names: [a-zA-Z0-9._-], at most 249 chars, never both '.' and '_'. The relay refuses rows
-- with invalid names (they end `failed` with a readable last_error).

BEGIN;

INSERT INTO orders (order_number, total, status)
VALUES ('A-1024', 1500, 'created');

INSERT INTO outbox (topic, message_key, headers, payload)
VALUES (
    'orders.created',
    'A-1024',
    jsonb_build_object(
        'message_type', 'order_created',
        'entity_id',    'A-1024',
        'message_id',   outbox_uuidv7()::text,
        'timestamp',    to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
    ),
    '{"order_number": "A-1024", "items": 3, "total": 1500}'::jsonb
);

COMMIT;
