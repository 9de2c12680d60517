-- Wake the relay at commit, whichever way a row was inserted (the Rust library or plain SQL from
-- another language). A statement-level trigger sends one notification per INSERT statement and
-- Postgres folds identical notifications of one transaction into one, delivered only at COMMIT:
-- a rolled-back enqueue wakes nobody. The channel carries the schema so that relays of other
-- schemas in the same database are not woken. Relays also poll, so a lost notification (e.g.
-- while the relay reconnects) only delays delivery by one poll interval.
CREATE FUNCTION outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox:' || TG_TABLE_SCHEMA, '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_notify
AFTER INSERT ON outbox
FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
