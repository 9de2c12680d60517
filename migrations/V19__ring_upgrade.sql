-- The online move onto ring storage (issue 33, docs/design/append-only-storage.md "Online
-- upgrade"): a table still holding unsent rows moves too. Its unsent rows (pending, backed
-- off, failed) are carried into `outbox_retry` with their ids, attempts, errors and due times,
-- so the relay sends them through the retry path in id order per key, and the rows of their
-- keys written to the ring after the move wait behind them. The sent rows stay in
-- `outbox_legacy`, shown by the view as sent (a re-publish within retention still finds
-- them) until cleanup deletes them past retention; so do the carried rows once they are sent.

-- The view over the ring, the retry table and the table the schema had before (its sent
-- rows), with the triggers that keep seed 002's INSERT and requeue working. Replaced in place:
-- the columns never change.
CREATE FUNCTION outbox_ring_view() RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    -- A row is `failed` or `pending` while it is in the retry table; otherwise `sent` below its
    -- lane's cursor and `pending` above it. `sent_at` is not kept per ring row.
    CREATE OR REPLACE VIEW outbox AS
    SELECT r.id, r.topic, r.message_key, r.headers, r.payload,
           CASE WHEN r.id < l.next_id THEN 'sent' ELSE 'pending' END AS status,
           0 AS attempts, NULL::text AS last_error, r.created_at,
           r.created_at AS available_at, NULL::timestamptz AS sent_at
      FROM outbox_ring AS r
      JOIN outbox_lanes AS l ON l.lane = hashtext(coalesce(r.message_key, '')) & 63
     WHERE NOT EXISTS (SELECT 1 FROM outbox_retry AS t WHERE t.id = r.id)
    UNION ALL
    SELECT t.id, t.topic, t.message_key, t.headers, t.payload, t.status, t.attempts,
           t.last_error, t.created_at, t.available_at, NULL::timestamptz
      FROM outbox_retry AS t
    UNION ALL
    -- Only sent rows are left in the old table (the move carried the others over into the
    -- retry table); a row is shown from the retry table while it is there.
    SELECT g.id, g.topic, g.message_key, g.headers, g.payload, g.status, g.attempts,
           g.last_error, g.created_at, g.available_at, g.sent_at
      FROM outbox_legacy AS g
     WHERE NOT EXISTS (SELECT 1 FROM outbox_retry AS t WHERE t.id = g.id);
    DROP TRIGGER IF EXISTS outbox_insert ON outbox;
    DROP TRIGGER IF EXISTS outbox_update ON outbox;
    CREATE TRIGGER outbox_insert INSTEAD OF INSERT ON outbox
        FOR EACH ROW EXECUTE FUNCTION outbox_ring_insert();
    CREATE TRIGGER outbox_update INSTEAD OF UPDATE ON outbox
        FOR EACH ROW EXECUTE FUNCTION outbox_ring_update();
END
$$;

-- Moves this schema onto the ring, online. Waits at most `lock_wait` for the table (the relays'
-- batches in flight and the services' open transactions that wrote it hold it; INSERTs queue
-- behind the move meanwhile): a `lock_not_available` error then, nothing changed, try again.
-- Under the lock, which ends every write to the table: the unsent rows are carried into the
-- retry table, the ring's ids and the lanes' cursors start after every id the table used, the
-- table becomes `outbox_legacy` and `outbox` the view. Returns how many rows were carried;
-- NULL, doing nothing, on a schema already moved.
DROP FUNCTION outbox_use_ring();
CREATE FUNCTION outbox_use_ring(lock_wait interval DEFAULT '5s') RETURNS bigint
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
    UPDATE outbox_lanes SET next_id = greatest(next_id, last_id + 1), moved_at = now();
    ALTER TABLE outbox RENAME TO outbox_legacy;
    PERFORM outbox_ring_view();
    RETURN carried;
END
$$;

-- Schemas moved by V18's function: their view gains the old table's sent rows.
DO $$
BEGIN
    IF (SELECT c.relkind FROM pg_class AS c WHERE c.oid = 'outbox'::regclass) = 'v' THEN
        PERFORM outbox_ring_view();
    END IF;
END
$$;
