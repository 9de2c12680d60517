-- Append-only storage (issue 33, docs/design/append-only-storage.md), created beside today's
-- table. A schema moves onto it with `SELECT outbox_use_ring()`: `outbox` then becomes a view
-- over the objects below, and the relay reads the ring instead of claiming rows. Until then
-- nothing here is written.

-- The generation new rows go to: one row, moved by rotation.
CREATE TABLE outbox_generation (
    only_row boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    gen      smallint    NOT NULL DEFAULT 0 CHECK (gen BETWEEN 0 AND 7),
    since    timestamptz NOT NULL DEFAULT now()
);
INSERT INTO outbox_generation DEFAULT VALUES;

-- Read by the ring's DEFAULT, so no statement on the write path names a leaf and no DDL runs
-- in steady state. The schema is pinned: a service's search_path may not name it.
CREATE FUNCTION outbox_current_gen() RETURNS smallint
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$ SELECT gen FROM outbox_generation $$;

CREATE SEQUENCE outbox_ring_id_seq AS bigint;

-- The rows: written once, never updated or deleted; a leaf is reclaimed whole (TRUNCATE).
-- `xid` names the writing transaction, for writers the relay's floor had to pass.
CREATE TABLE outbox_ring (
    id          bigint      NOT NULL DEFAULT nextval('outbox_ring_id_seq'),
    gen         smallint    NOT NULL DEFAULT outbox_current_gen(),
    topic       text        NOT NULL,
    message_key text,
    headers     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    payload     jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    xid         xid8        NOT NULL DEFAULT pg_current_xact_id()
) PARTITION BY LIST (gen);

-- Eight leaves, each with its primary key and nothing else (every index is WAL per event), no
-- autovacuum (nothing to vacuum: no row is ever updated or deleted).
DO $$
BEGIN
    FOR g IN 0..7 LOOP
        EXECUTE format(
            'CREATE TABLE outbox_ring_%s PARTITION OF outbox_ring FOR VALUES IN (%s)
               WITH (fillfactor = 100, autovacuum_enabled = false,
                     toast.autovacuum_enabled = false)', g, g);
        EXECUTE format('ALTER TABLE outbox_ring_%s ADD PRIMARY KEY (id)', g);
    END LOOP;
END
$$;

CREATE TRIGGER outbox_ring_notify
AFTER INSERT ON outbox_ring
FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- What has been published: every row of lane `lane` with an id below `next_id` reached Kafka
-- or was copied into outbox_retry. 64 small rows, updated in place (HOT) once per batch.
CREATE TABLE outbox_lanes (
    lane     integer     PRIMARY KEY CHECK (lane BETWEEN 0 AND 63),
    next_id  bigint      NOT NULL DEFAULT 0,
    moved_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 20, autovacuum_vacuum_threshold = 200,
        autovacuum_vacuum_scale_factor = 0);
INSERT INTO outbox_lanes (lane) SELECT generate_series(0, 63);

-- Rows that need another attempt (backed off, refused, failed, requeued) and the rows of the
-- same key behind them: a full copy, so the ring is reclaimed without looking here. Small and
-- ordinary: rows are updated and deleted here.
CREATE TABLE outbox_retry (
    id           bigint      PRIMARY KEY,
    topic        text        NOT NULL,
    message_key  text,
    headers      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    payload      jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    status       text        NOT NULL DEFAULT 'pending',
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text,
    available_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT outbox_retry_status_check CHECK (status IN ('pending', 'failed'))
);
CREATE INDEX outbox_retry_pending_key_idx ON outbox_retry (message_key, id)
    WHERE status = 'pending';

CREATE TRIGGER outbox_retry_notify
AFTER INSERT OR UPDATE ON outbox_retry
FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- `INSERT INTO outbox` as seed 002 writes it, onto the ring.
CREATE FUNCTION outbox_ring_insert() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO outbox_ring (topic, message_key, headers, payload)
    VALUES (NEW.topic, NEW.message_key, coalesce(NEW.headers, '{}'::jsonb), NEW.payload)
    RETURNING id, created_at INTO NEW.id, NEW.created_at;
    NEW.status := 'pending';
    NEW.attempts := 0;
    NEW.available_at := NEW.created_at;
    RETURN NEW;
END
$$;

-- The operator's repairs as seed 002 writes them: `UPDATE outbox SET status = 'pending' …` of a
-- failed row, or of a sent one (published again): onto the retry table.
CREATE FUNCTION outbox_ring_update() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NEW.status = 'pending' AND OLD.status IN ('failed', 'sent') THEN
        INSERT INTO outbox_retry (id, topic, message_key, headers, payload, created_at,
                                  attempts, available_at)
        VALUES (OLD.id, OLD.topic, OLD.message_key, OLD.headers, OLD.payload, OLD.created_at,
                NEW.attempts, NEW.available_at)
        ON CONFLICT (id) DO UPDATE
           SET status = 'pending', attempts = EXCLUDED.attempts,
               available_at = EXCLUDED.available_at, last_error = NULL;
        RETURN NEW;
    END IF;
    IF NEW.status IS NOT DISTINCT FROM OLD.status THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'outbox (ring storage): only failed or sent rows can be put back to pending'
        USING ERRCODE = 'feature_not_supported';
END
$$;

-- Moves this schema onto the ring: today's table becomes `outbox_legacy` and `outbox` a view.
-- Only while the table holds no unsent row (a new schema, or one drained first).
CREATE FUNCTION outbox_use_ring() RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    last_id bigint;
BEGIN
    IF (SELECT c.relkind FROM pg_class AS c WHERE c.oid = 'outbox'::regclass) = 'v' THEN
        RETURN;
    END IF;
    SET LOCAL lock_timeout = '5s';
    LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE;
    IF EXISTS (SELECT 1 FROM outbox WHERE status <> 'sent') THEN
        RAISE EXCEPTION 'outbox holds unsent rows: drain them before moving onto the ring'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    SELECT coalesce(max(id), 0) INTO last_id FROM outbox;
    PERFORM setval('outbox_ring_id_seq',
                   greatest(last_id, coalesce(pg_sequence_last_value(
                       pg_get_serial_sequence('outbox', 'id')), 0)) + 1, false);
    UPDATE outbox_lanes SET next_id = greatest(next_id, last_id + 1), moved_at = now();
    ALTER TABLE outbox RENAME TO outbox_legacy;
    -- A row is `failed` or `pending` while it is in the retry table; otherwise `sent` below its
    -- lane's cursor and `pending` above it. `sent_at` is not kept per row.
    CREATE VIEW outbox AS
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
      FROM outbox_retry AS t;
    CREATE TRIGGER outbox_insert INSTEAD OF INSERT ON outbox
        FOR EACH ROW EXECUTE FUNCTION outbox_ring_insert();
    CREATE TRIGGER outbox_update INSTEAD OF UPDATE ON outbox
        FOR EACH ROW EXECUTE FUNCTION outbox_ring_update();
END
$$;
