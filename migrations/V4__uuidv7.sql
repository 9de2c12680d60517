-- UUIDv7 for services that enqueue with plain SQL (sql/enqueue.sql): `message_id` must be a
-- time-ordered UUIDv7 (seed 002). Postgres 18 has uuidv7(); earlier versions do not, so this
-- builds one from the millisecond clock and gen_random_uuid()'s random bits (RFC 9562 §5.7).
CREATE FUNCTION outbox_uuidv7() RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;
