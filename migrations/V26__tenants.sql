-- The registry of a relay fleet (docs/design/many-databases.md): the outboxes one `outbox relay
-- --tenants` publishes, read from the relay's own (control) schema. `database` is a name the
-- relay maps to a connection (`default`: the control database; others from --database
-- NAME=URL), so no URL with a password is ever stored here. Created in every migrated schema;
-- only the control schema's is read.
CREATE TABLE outbox_tenants (
    tenant     text        PRIMARY KEY
               CHECK (tenant ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$'),
    database   text        NOT NULL DEFAULT 'default'
               CHECK (database ~ '^[a-z][a-z0-9_]{0,62}$'),
    schema     text        NOT NULL
               CHECK (schema ~ '^[a-z_][a-z0-9_]{0,62}$'),
    enabled    boolean     NOT NULL DEFAULT true,
    weight     integer     NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 100),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Relays reload at once on a change (and every few seconds regardless).
CREATE FUNCTION outbox_tenants_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_tenants:' || TG_TABLE_SCHEMA, '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_tenants_notify
AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON outbox_tenants
FOR EACH STATEMENT EXECUTE FUNCTION outbox_tenants_notify();
