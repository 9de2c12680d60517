-- The circuit breaker shared by every replica of a consumer group (seed 000's Redis marker,
-- kept in the Postgres every consumer already has). One row per (group, dependency); a
-- breaker is open while open_until is in the future, so a row left by a dead process simply
-- expires. `streak` counts opens since the last completed drain: each re-open doubles
-- open_for up to the configured cap.
CREATE TABLE circuit_breakers (
    consumer_group text        NOT NULL,
    name           text        NOT NULL,
    open_until     timestamptz NOT NULL,
    opened_at      timestamptz NOT NULL DEFAULT now(),
    opened_by      text        NOT NULL,
    reason         text,
    generation     bigint      NOT NULL DEFAULT 1,
    streak         integer     NOT NULL DEFAULT 1,
    PRIMARY KEY (consumer_group, name)
);
