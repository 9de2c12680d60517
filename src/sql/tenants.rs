//! `outbox_tenants`: the registry of a relay fleet, in the control schema (`docs/design/
//! many-databases.md`). Read by every fleet relay at each reload; written by `outbox tenants`.

/// Every registered tenant, in name order (the reload diffs it against what runs).
pub(crate) const LIST: &str = "SELECT tenant, database, schema, enabled, weight
  FROM {s}.outbox_tenants ORDER BY tenant";

/// One tenant's database and schema (`$1` tenant), whether or not it is enabled: a consumer
/// routes a message of a disabled tenant all the same (disabling stops publishing, not
/// handling what was published).
pub(crate) const FIND: &str = "SELECT database, schema FROM {s}.outbox_tenants WHERE tenant = $1";

/// Whether tenant `$1` is found by the discovery rule (the LIKE pattern `$2`): its name
/// matches and a schema of that name holds the consumer's inbox (`processed_messages`).
pub(crate) const DISCOVERED: &str = "SELECT $1::text LIKE $2::text AND EXISTS (
  SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
   WHERE n.nspname = $1::text AND c.relname = 'processed_messages')";

/// Adds a tenant or changes one (`$1` tenant, `$2` database, `$3` schema, `$4` enabled,
/// `$5` weight).
pub(crate) const PUT: &str =
    "INSERT INTO {s}.outbox_tenants (tenant, database, schema, enabled, weight)
  VALUES ($1, $2, $3, $4, $5)
  ON CONFLICT (tenant) DO UPDATE SET database = EXCLUDED.database, schema = EXCLUDED.schema,
    enabled = EXCLUDED.enabled, weight = EXCLUDED.weight, updated_at = now()";

/// Removes tenant `$1`; its outbox stays where it is.
pub(crate) const REMOVE: &str = "DELETE FROM {s}.outbox_tenants WHERE tenant = $1";

/// The schemas of the database that hold an `outbox` relation and match the LIKE pattern `$1`
/// (discovery by rule, `outbox relay --discover`), in name order.
pub(crate) const DISCOVER: &str = "SELECT n.nspname::text FROM pg_namespace n
  WHERE n.nspname LIKE $1
    AND EXISTS (SELECT 1 FROM pg_class c
                 WHERE c.relnamespace = n.oid AND c.relname = 'outbox' AND c.relkind IN ('r', 'v', 'p'))
  ORDER BY 1";
