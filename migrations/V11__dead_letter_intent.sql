-- Dead letters written once, also across a crash between the broker's append and the record
-- above: the consumer first records its intent (written = false) with the dead-letter
-- partition it will write to and that partition's end offset, then writes, then marks the row
-- written. A redelivered record whose row is still an intent is looked for in that partition
-- from that offset on: found, it is not written again; not found, it is written.
ALTER TABLE dead_lettered
    ADD COLUMN written       boolean NOT NULL DEFAULT true,
    ADD COLUMN dlq_partition integer,
    ADD COLUMN dlq_from      bigint;
