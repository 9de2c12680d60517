-- ANALYZE gathers no statistics for an outbox row's payload and headers. No statement filters
-- or joins on them, yet ANALYZE sorted their sampled jsonb values and wrote them, compressed,
-- into pg_statistic: most of an autoanalyze of the outbox. The outbox is analyzed every 2 % of
-- changes (V5), so a schema per tenant pays that per tenant: 200 tenants of 500 rows each
-- spent some 7 % of the machine's CPU in those analyzes during a fleet drain
-- (BENCHMARKS_HISTORY round 24). The columns the planner reads (status, available_at, id,
-- message_key) keep their statistics. SET STATISTICS takes a SHARE UPDATE EXCLUSIVE lock,
-- which does not wait for or block the services' INSERTs.
DO $$
DECLARE
    t text;
BEGIN
    -- Whichever holds rows here: today's table, or after a move onto ring storage the old
    -- table (outbox_legacy) and the retry table; `outbox` is then a view.
    FOREACH t IN ARRAY ARRAY['outbox', 'outbox_legacy', 'outbox_retry'] LOOP
        IF EXISTS (SELECT 1 FROM pg_class WHERE oid = to_regclass(t) AND relkind IN ('r', 'p')) THEN
            EXECUTE format(
                'ALTER TABLE %I ALTER COLUMN payload SET STATISTICS 0, '
                'ALTER COLUMN headers SET STATISTICS 0', t);
        END IF;
    END LOOP;
END
$$;
