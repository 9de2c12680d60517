//! Advisory locks the relays and the replay runners coordinate by. The lock keys are namespaced by schema (`$2` /
//! `$1`: the schema's name), so relays of different schemas never meet. Session locks: they
//! die with the connection, so a relay that crashes gives up its lanes at once.

/// Joins the schema's relays: relay `$1` holds its member lock while it runs.
pub(crate) const JOIN_RELAYS: &str =
    "SELECT pg_try_advisory_lock(hashtext('outbox-relays:' || $2::text), $1)";

/// Leaves the schema's relays (a fleet's relay stopped while its lock session lives on).
pub(crate) const LEAVE_RELAYS: &str =
    "SELECT pg_advisory_unlock(hashtext('outbox-relays:' || $2::text), $1)";

/// How many relays hold their member lock now, for each schema of `$1` (one look at the lock
/// table for every schema a session serves: a fleet's relays of one database share it).
pub(crate) const COUNT_RELAYS_OF: &str = "SELECT s.name, count(l.pid)
  FROM unnest($1::text[]) AS s(name)
  LEFT JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
   AND l.classid = (hashtext('outbox-relays:' || s.name))::oid
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  GROUP BY s.name";

/// The lane gate of schema `$1`, exclusively: granted only while no other relay holds lanes
/// (each holds the gate shared while it does). Its holder owns all 64 lanes with this one lock
/// instead of 64: a fleet of 200 tenants held 12,800 lane locks, and every commit on the lock
/// session walked them all, as did every look at `pg_locks`.
pub(crate) const TAKE_ALL_LANES: &str =
    "SELECT pg_try_advisory_lock(hashtext('outbox-lane-gate:' || $1::text), 0)";

/// Gives the exclusive gate of schema `$1` up (its holder took the gate shared and its share
/// of lanes first, so no lane is ever unowned in between).
pub(crate) const RELEASE_ALL_LANES: &str =
    "SELECT pg_advisory_unlock(hashtext('outbox-lane-gate:' || $1::text), 0)";

/// The lane gate of schema `$1`, shared: held by every relay that holds lanes one by one.
/// Refused while one relay holds all lanes through the gate.
pub(crate) const SHARE_LANES: &str =
    "SELECT pg_try_advisory_lock_shared(hashtext('outbox-lane-gate:' || $1::text), 0)";

/// Gives the shared gate of schema `$1` up.
pub(crate) const UNSHARE_LANES: &str =
    "SELECT pg_advisory_unlock_shared(hashtext('outbox-lane-gate:' || $1::text), 0)";

/// Ends the session it runs on, so Postgres frees every lock the session holds: what a relay
/// does when a lock statement failed and it no longer knows which it holds.
pub(crate) const END_SESSION: &str = "SELECT pg_terminate_backend(pg_backend_pid())";

/// Takes up to `$3` of the lanes `$1` (in that order) that no other relay holds, in one round
/// trip: the scan stops at the `$3`th lane taken, so no lane past it is tried. No ORDER BY: a
/// sort would pull, and so lock, every row first. Returns the lanes taken.
pub(crate) const LOCK_LANES: &str = "SELECT l FROM unnest($1::int4[]) AS l
  WHERE pg_try_advisory_lock(hashtext('outbox-lanes:' || $2::text), l)
  LIMIT $3";

/// Gives lanes `$1` up in one round trip.
pub(crate) const UNLOCK_LANES: &str = "SELECT count(*) FROM unnest($1::int4[]) AS l
  WHERE pg_advisory_unlock(hashtext('outbox-lanes:' || $2::text), l)";

/// Serialises job creation in schema `$1` (a transaction lock) so two jobs never freeze the
/// same letters.
pub(crate) const CREATE_JOB: &str =
    "SELECT pg_advisory_xact_lock(hashtext('outbox-dlq-jobs:' || $1))";

/// One runner per job `$2` of schema `$1`: a session lock on a connection taken out of the
/// pool, released when the run ends or its process dies.
pub(crate) const RUN_JOB: &str = "SELECT pg_try_advisory_lock(hashtext('outbox-dlq-job:' || $1),
        ($2::bigint % 2147483647)::int)";
