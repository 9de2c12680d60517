-- Failed rows are few and an operator (and the metrics gauge) asks for them often: a small
-- partial index keeps `count(*) WHERE status = 'failed'` off the whole table.
CREATE INDEX outbox_failed_idx ON outbox (id) WHERE status = 'failed';
