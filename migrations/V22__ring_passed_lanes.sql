-- Writers passed while open, listed per lane (issue 33).
--
-- V20 listed a passed writer once, by its transaction id; the sweep then copied every row of
-- it below the lanes' cursors. But a cursor may be below such a row when the writer commits
-- (a lane with nothing else to read keeps its cursor; exactly-once recovery listed every open
-- writer, moved or not): the row is then read as usual, and copied again by the sweep —
-- published twice. Now a writer is listed in each lane whose cursor may step over its rows,
-- with where that cursor was; while it is listed there, claims leave its rows of that lane
-- out, and the sweep copies the ones from there up to the cursor. Entries listed before this
-- migration keep their old meaning: every lane, from its start.
ALTER TABLE outbox_passed DROP CONSTRAINT outbox_passed_pkey;
ALTER TABLE outbox_passed
    ADD COLUMN lane integer NOT NULL DEFAULT 0 CHECK (lane BETWEEN 0 AND 63),
    ADD COLUMN from_id bigint NOT NULL DEFAULT 0;
INSERT INTO outbox_passed (xid, passed_at, lane, from_id)
SELECT p.xid, p.passed_at, l.lane, 0
  FROM outbox_passed AS p CROSS JOIN generate_series(1, 63) AS l(lane);
ALTER TABLE outbox_passed ALTER COLUMN lane DROP DEFAULT, ALTER COLUMN from_id DROP DEFAULT;
ALTER TABLE outbox_passed ADD PRIMARY KEY (xid, lane);
