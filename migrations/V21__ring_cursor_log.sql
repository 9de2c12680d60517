-- Ring storage's lane cursors, insert-only (issue 33).
--
-- V18 kept one row per lane and updated it once per batch. While any transaction in the
-- database holds a snapshot (a forgotten BEGIN, a long report), vacuum may remove none of the
-- versions those updates leave, and every read or update of a lane's cursor walks all of them:
-- 40 s into a held snapshot at 2,000 events/s a relay's claim took 8.7 ms instead of under 1,
-- and it kept growing with the hold. Now a cursor move is an INSERT of the lane's new
-- position; a lane's cursor is its highest entry, found at the end of the primary key whatever
-- the log's length. `outbox_lanes` stays, as a view, for everything that reads it (the
-- `outbox` view, operators' queries).
--
-- The log has two halves; new entries go to the active one (`outbox_cursor_half`). Each
-- rotation copies every lane's newest entry from the inactive half into the active one,
-- TRUNCATEs the inactive half and makes it the active one: no entry is ever deleted, so a held
-- snapshot leaves no dead tuple here either, and the log holds at most two rotation periods.
CREATE TABLE outbox_cursor_half (
    half smallint NOT NULL CHECK (half IN (0, 1))
);
INSERT INTO outbox_cursor_half VALUES (0);
CREATE UNIQUE INDEX outbox_cursor_half_one ON outbox_cursor_half ((true));

CREATE FUNCTION outbox_cursor_active_half() RETURNS smallint
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS 'SELECT half FROM outbox_cursor_half';

CREATE TABLE outbox_cursor_log (
    half     smallint    NOT NULL DEFAULT outbox_cursor_active_half(),
    lane     integer     NOT NULL CHECK (lane BETWEEN 0 AND 63),
    next_id  bigint      NOT NULL,
    moved_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (lane, next_id, half)
) PARTITION BY LIST (half);
CREATE TABLE outbox_cursor_log_0 PARTITION OF outbox_cursor_log FOR VALUES IN (0);
CREATE TABLE outbox_cursor_log_1 PARTITION OF outbox_cursor_log FOR VALUES IN (1);
INSERT INTO outbox_cursor_log (lane, next_id, moved_at)
SELECT lane, next_id, moved_at FROM outbox_lanes;
ALTER TABLE outbox_lanes RENAME TO outbox_lanes_v18;
CREATE VIEW outbox_lanes AS
SELECT l.lane, c.next_id, c.moved_at
  FROM generate_series(0, 63) AS l(lane)
 CROSS JOIN LATERAL (SELECT m.next_id, m.moved_at FROM outbox_cursor_log AS m
                      WHERE m.lane = l.lane ORDER BY m.next_id DESC LIMIT 1) AS c;

-- Schemas already on the ring: their `outbox` view reads the new lanes.
DO $$
BEGIN
    IF (SELECT c.relkind FROM pg_class AS c WHERE c.oid = 'outbox'::regclass) = 'v' THEN
        PERFORM outbox_ring_view();
    END IF;
END
$$;
DROP TABLE outbox_lanes_v18;

-- The move onto the ring (V19), starting the cursors with an entry each.
CREATE OR REPLACE FUNCTION outbox_use_ring(lock_wait interval DEFAULT '5s') RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    last_id bigint;
    carried bigint;
BEGIN
    IF (SELECT c.relkind FROM pg_class AS c WHERE c.oid = 'outbox'::regclass) = 'v' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('lock_timeout', (extract(epoch FROM lock_wait) * 1000)::bigint || 'ms',
                       true);
    LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE;
    SELECT greatest(coalesce(max(id), 0),
                    coalesce(pg_sequence_last_value(pg_get_serial_sequence('outbox', 'id')), 0))
      INTO last_id FROM outbox;
    INSERT INTO outbox_retry (id, topic, message_key, headers, payload, created_at, status,
                              attempts, last_error, available_at)
    SELECT o.id, o.topic, o.message_key, o.headers, o.payload, o.created_at, o.status,
           o.attempts, o.last_error, o.available_at
      FROM outbox AS o WHERE o.status <> 'sent';
    GET DIAGNOSTICS carried = ROW_COUNT;
    -- The carried rows' state is the retry table's from now on: the view shows their copy
    -- there while it is there, and this one, sent, once it has gone (it reached Kafka), as the
    -- ring's rows are sent once out of the retry table. Marked here so that nothing still
    -- reading the table by its old name finds a row to send.
    UPDATE outbox SET status = 'sent', sent_at = now() WHERE status <> 'sent';
    PERFORM setval('outbox_ring_id_seq', last_id + 1, false);
    INSERT INTO outbox_cursor_log (lane, next_id)
    SELECT l.lane, last_id + 1 FROM outbox_lanes AS l WHERE l.next_id < last_id + 1
    ON CONFLICT DO NOTHING;
    ALTER TABLE outbox RENAME TO outbox_legacy;
    PERFORM outbox_ring_view();
    RETURN carried;
END
$$;
