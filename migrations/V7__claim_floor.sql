-- The relay's claim floor (DESIGN §3.7). A relay remembers the id below which every row of its
-- lanes is already settled and starts each claim there, so a long-open snapshot elsewhere in
-- the database (which keeps the index entries of every row sent since it began) no longer makes
-- each claim walk those entries. Rows that wait for a retry are the one kind of pending row the
-- floor may pass; this index finds the oldest of them in one probe. It holds only rows that
-- failed at least once and are still pending, so it stays tiny.
CREATE INDEX outbox_retrying_idx ON outbox (id) WHERE status = 'pending' AND attempts > 0;
