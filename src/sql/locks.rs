//! Advisory locks the relays and the replay runners coordinate by. The lock keys are namespaced by schema (`$2` /
//! `$1`: the schema's name), so relays of different schemas never meet. Session locks: they
//! die with the connection, so a relay that crashes gives up its lanes at once.

/// Joins the schema's relays: relay `$1` holds its member lock while it runs.
pub(crate) const JOIN_RELAYS: &str =
    "SELECT pg_try_advisory_lock(hashtext('outbox-relays:' || $2::text), $1)";

/// Leaves the schema's relays (a fleet's relay stopped while its lock session lives on).
pub(crate) const LEAVE_RELAYS: &str =
    "SELECT pg_advisory_unlock(hashtext('outbox-relays:' || $2::text), $1)";

/// How many relays of schema `$1` hold their member lock now: each aims at
/// `ceil(lanes / members)` lanes.
pub(crate) const COUNT_RELAYS: &str = "SELECT count(*) FROM pg_locks
  WHERE locktype = 'advisory' AND granted
    AND classid = (hashtext('outbox-relays:' || $1::text))::oid AND objsubid = 2
    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";

/// Takes ordering lane `$1` if no other relay holds it: its keys' rows are this relay's alone.
pub(crate) const LOCK_LANE: &str =
    "SELECT pg_try_advisory_lock(hashtext('outbox-lanes:' || $2::text), $1)";

/// Gives lane `$1` up (the relay holds more than its share).
pub(crate) const UNLOCK_LANE: &str =
    "SELECT pg_advisory_unlock(hashtext('outbox-lanes:' || $2::text), $1)";

/// Serialises job creation in schema `$1` (a transaction lock) so two jobs never freeze the
/// same letters.
pub(crate) const CREATE_JOB: &str =
    "SELECT pg_advisory_xact_lock(hashtext('outbox-dlq-jobs:' || $1))";

/// One runner per job `$2` of schema `$1`: a session lock on a connection taken out of the
/// pool, released when the run ends or its process dies.
pub(crate) const RUN_JOB: &str = "SELECT pg_try_advisory_lock(hashtext('outbox-dlq-job:' || $1),
        ($2::bigint % 2147483647)::int)";
