-- A breaker row that expired is not yet trusted: the dependency has not answered since it
-- opened. One replica of the group holds the probe (probe_by until probe_until, renewed on
-- every check): it alone calls the dependency, one call at a time. The first successful call
-- confirms the row (confirmed_at after opened_at) and every replica drains; the drain that
-- completes after it resets the streak. A failure re-opens the row for twice as long, and a
-- re-opened row is untrusted again (its opened_at is newer than confirmed_at).
ALTER TABLE circuit_breakers
    ADD COLUMN probe_by     text,
    ADD COLUMN probe_until  timestamptz,
    ADD COLUMN confirmed_at timestamptz;
