-- Ring storage's writes without a function call per INSERT (issue 33).
--
-- A ring row's generation came from the DEFAULT `outbox_current_gen()`, and a cursor entry's
-- half from `outbox_cursor_active_half()`: SQL functions with a pinned search_path, which
-- Postgres cannot inline, so each INSERT switched the search_path and parsed and planned the
-- function's one-line body again. In the 2,000 events/s soak that was about 5 % of the
-- machine's CPU (BENCHMARKS_HISTORY round 24). The rule behind `INSERT INTO outbox` now reads
-- the generation itself, in a subquery of the same statement (the same snapshot the function
-- read it with), and the relay names the cursor log's half the same way. The DEFAULTs stay
-- for COPY (the INSTEAD OF trigger) and for any other writer of the ring.

CREATE OR REPLACE FUNCTION outbox_ring_view() RETURNS void
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
    -- An INSERT is rewritten into one on the ring: no trigger call per row (the trigger stays
    -- for COPY, which rules do not rewrite).
    -- The generation is read here, not by the ring's DEFAULT: that function (SQL, with its
    -- search_path pinned) was parsed and planned again at each INSERT (V29).
    CREATE OR REPLACE RULE outbox_insert_ring AS ON INSERT TO outbox DO INSTEAD
        INSERT INTO outbox_ring (gen, topic, message_key, headers, payload)
        VALUES ((SELECT g.gen FROM outbox_generation AS g), NEW.topic, NEW.message_key,
                coalesce(NEW.headers, '{}'::jsonb), NEW.payload)
        RETURNING outbox_ring.id, outbox_ring.topic, outbox_ring.message_key,
                  outbox_ring.headers, outbox_ring.payload, 'pending'::text, 0, NULL::text,
                  outbox_ring.created_at, outbox_ring.created_at, NULL::timestamptz;
END
$$;

DO $$
BEGIN
    IF (SELECT c.relkind FROM pg_class AS c WHERE c.oid = 'outbox'::regclass) = 'v' THEN
        PERFORM outbox_ring_view();
    END IF;
END
$$;
