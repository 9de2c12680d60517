//! `circuit_breakers`: the breaker a consumer group's replicas share. `{s}` stands for the
//! quoted schema.

/// Circuit breakers open now, for `outbox status`: group, dependency, seconds until the row
/// expires, reason, generation.
pub(crate) const OPEN_ALL: &str = "SELECT consumer_group, name,
        extract(epoch FROM open_until - now())::float8, reason, generation, opened_by,
        extract(epoch FROM now() - opened_at)::float8
   FROM {s}.circuit_breakers WHERE open_until > now() ORDER BY 1, 2";

/// An operator opens dependency `$2`'s breaker of group `$1` for `$3` seconds (reason `$4`, by
/// `$5`): every replica pauses within a check. Returns the row's generation.
pub(crate) const OPEN_BY_HAND: &str = "INSERT INTO {s}.circuit_breakers AS b
        (consumer_group, name, open_until, opened_by, reason)
 VALUES ($1, $2, now() + make_interval(secs => $3), $5, $4)
 ON CONFLICT (consumer_group, name) DO UPDATE
   SET open_until = now() + make_interval(secs => $3), opened_at = now(), opened_by = $5,
       reason = $4, generation = b.generation + 1, streak = b.streak + 1,
       probe_by = NULL, probe_until = NULL
 RETURNING generation";

/// An operator closes dependency `$2`'s breaker of group `$1` and trusts it again (the
/// dependency is known to be back): replicas drain and resume. Returns the row if there was one.
pub(crate) const CLOSE_BY_HAND: &str = "UPDATE {s}.circuit_breakers
    SET open_until = least(open_until, now()), confirmed_at = now() + interval '1 millisecond',
        streak = 0, probe_by = NULL, probe_until = NULL
  WHERE consumer_group = $1 AND name = $2 RETURNING generation";

/// Expired breakers not yet trusted again (a probe is pending), for the overview.
pub(crate) const UNTRUSTED_ALL: &str = "SELECT consumer_group, name, probe_by
   FROM {s}.circuit_breakers
  WHERE open_until <= now() AND streak > 0 AND (confirmed_at IS NULL OR confirmed_at < opened_at)
  ORDER BY 1, 2";

/// The group's breakers as every replica reads them on each check, in one statement so that
/// one `now()` decides each row: open (name, seconds left, reason, opener, generation), or
/// expired but untrusted (the dependency has not answered since it opened) with whether the
/// probe is held by replica `$2` / by anyone. Two reads would let a row expire between them and
/// be seen as neither: closed and trusted, while its dependency is still down.
pub(crate) const STATE_OF_GROUP: &str = "SELECT name, open_until > now(),
        extract(epoch FROM open_until - now())::float8, reason, opened_by, generation,
        coalesce(probe_by = $2 AND probe_until > now(), false),
        coalesce(probe_until > now(), false)
   FROM {s}.circuit_breakers
  WHERE consumer_group = $1
    AND (open_until > now()
         OR (streak > 0 AND (confirmed_at IS NULL OR confirmed_at < opened_at)))";

/// Opens the breaker of dependency `$2` for group `$1`, unless it is open already (so a crowd
/// of replicas opening at once opens it once): for `$3` seconds the first time, doubling with
/// each re-open up to `$4`. Returns how long it stays open, or no row when another replica won.
pub(crate) const OPEN: &str = "INSERT INTO {s}.circuit_breakers AS b
        (consumer_group, name, open_until, opened_by, reason)
 VALUES ($1, $2, now() + make_interval(secs => $3), $5, $6)
 ON CONFLICT (consumer_group, name) DO UPDATE
   SET open_until = now() + make_interval(secs => least($4, $3 * power(2, b.streak))),
       opened_at = now(), opened_by = $5, reason = $6,
       generation = b.generation + 1, streak = b.streak + 1, probe_by = NULL, probe_until = NULL
   WHERE b.open_until <= now()
 RETURNING extract(epoch FROM open_until - now())::float8";

/// Takes (or renews) the probe of dependency `$2` for replica `$3` for `$4` seconds, unless
/// another replica holds it. A row back means this replica probes.
pub(crate) const CLAIM_PROBE: &str = "UPDATE {s}.circuit_breakers
    SET probe_by = $3, probe_until = now() + make_interval(secs => $4)
  WHERE consumer_group = $1 AND name = $2 AND open_until <= now() AND streak > 0
    AND (confirmed_at IS NULL OR confirmed_at < opened_at)
    AND (probe_until IS NULL OR probe_until <= now() OR probe_by = $3)
 RETURNING 1";

/// A call succeeded after the breakers expired (the probe): the group's expired breakers are
/// trusted again, for every replica.
pub(crate) const CONFIRM: &str = "UPDATE {s}.circuit_breakers
    SET confirmed_at = now(), probe_by = NULL, probe_until = NULL
  WHERE consumer_group = $1 AND open_until <= now() AND streak > 0
    AND (confirmed_at IS NULL OR confirmed_at < opened_at)";

/// A drain completed after the dependency answered: the group's confirmed breakers start
/// doubling from the base again. A row never confirmed keeps its streak: an empty drain proves
/// nothing.
pub(crate) const RESET_STREAK: &str = "UPDATE {s}.circuit_breakers SET streak = 0
  WHERE consumer_group = $1 AND open_until <= now() AND streak > 0 AND confirmed_at >= opened_at";
