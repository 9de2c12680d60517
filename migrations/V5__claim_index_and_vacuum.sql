-- The relay claims in id order (per-key order follows outbox id order). With only the seed's
-- index on (available_at, id), `ORDER BY id LIMIT n` must read and sort every due pending row
-- for each batch, so a backlog of N rows costs O(N) per claim. A partial index on id keeps the
-- claim at O(batch): the scan walks pending ids in order and stops after n due rows. Like the
-- seed's index it holds only pending rows, so it stays the size of the send queue no matter
-- how many sent rows are kept for retention.
CREATE INDEX outbox_pending_id_idx ON outbox (id) WHERE status = 'pending';

-- Every row is inserted once and updated once (pending -> sent): vacuum early so dead tuples
-- and index bloat stay bounded under a steady stream, instead of waiting for 20 % of the table.
ALTER TABLE outbox SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);
ALTER TABLE processed_messages SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.05
);
