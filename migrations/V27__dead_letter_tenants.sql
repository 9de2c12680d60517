-- Dead letters by tenant (issue 36): the tenant whose outbox a dead-lettered message came from,
-- read from its `x-tenant` header (set by a fleet relay, `outbox relay --tenants`), so letters
-- and replays can be listed and selected per tenant (`outbox dlq list --tenant NAME`). Filled
-- by a trigger, so every path that archives a letter (the archiver, a consumer that writes its
-- letters itself, a settled-letter upsert) records it the same way. NULL: no tenant.
ALTER TABLE dead_letters ADD COLUMN tenant text;

CREATE FUNCTION dead_letters_tenant() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.tenant IS NULL THEN
        NEW.tenant := (SELECT h->>'value' FROM jsonb_array_elements(NEW.headers) AS h
                        WHERE h->>'name' = 'x-tenant' LIMIT 1);
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER dead_letters_tenant
BEFORE INSERT ON dead_letters
FOR EACH ROW EXECUTE FUNCTION dead_letters_tenant();

-- Letters archived before this migration that carry the header.
UPDATE dead_letters
   SET tenant = (SELECT h->>'value' FROM jsonb_array_elements(headers) AS h
                  WHERE h->>'name' = 'x-tenant' LIMIT 1)
 WHERE headers @> '[{"name": "x-tenant"}]';

CREATE INDEX dead_letters_tenant_idx ON dead_letters (tenant, status) WHERE tenant IS NOT NULL;
