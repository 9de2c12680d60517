//! What an event costs the primary over its whole life, in WAL bytes: enqueued by plain SQL
//! (100 rows per transaction), published by the relay, reclaimed by cleanup, vacuumed — each
//! phase's share, and the total as a ratio to INSERTing the same rows, the same way, into a
//! plain table with the same columns and only a primary key (the floor any outbox pays),
//! measured in the same run. Also the dead tuples the outbox holds right after the drain
//! (`pgstattuple`, exact) and while a snapshot is held open.
//!
//! WAL is read as the distance between `pg_current_wal_insert_lsn()` before and after each
//! phase: the cluster's whole WAL, so run it with nothing else writing to that Postgres (the
//! smoke run inside `cargo test` shares it and its figures mean nothing). One `CHECKPOINT`
//! before the run, so both layouts start with the same full-page-image state; the checkpoints
//! that fall inside the run are reported (`checkpoints_during`), as one mid-phase inflates that
//! phase with full-page images. Autovacuum is off on both tables during the run, so vacuum's
//! WAL is the explicit `VACUUM` phase, not a background pass landing in another phase.
//!
//! A second line, `wal_per_event_ring_model`, measures the layout planned in
//! docs/design/append-only-storage.md *as SQL only* — no relay, no Kafka: the same rows
//! INSERTed into a ring leaf with only a primary key, read back in batches in id order with one
//! cursor UPDATE per lane per batch, the leaf TRUNCATEd, the lanes vacuumed. It bounds what the
//! design can cost, to judge it before it is built; it is not the feature.
//!
//! A third line, `wal_per_event_ring`, measures the ring as built so far, with the relay (see
//! `ring_relay`), and its drain rate against the table's.
//!
//! `cargo bench --bench wal` (env: ROWS=100000, PER_TX=100, KEYS=1000, BATCH=2000).

#[path = "support/mod.rs"]
mod support;

use std::time::Instant;

use support::*;

/// One `bigint` a statement returns.
async fn scalar(c: &tokio_postgres::Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).await.unwrap().get(0)
}

/// The WAL insert position, as bytes from the start of WAL.
async fn lsn(c: &tokio_postgres::Client) -> i64 {
    scalar(
        c,
        "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint",
    )
    .await
}

/// Checkpoints so far (one inside a phase inflates it with full-page images).
async fn checkpoints(c: &tokio_postgres::Client) -> i64 {
    scalar(
        c,
        "SELECT (checkpoints_timed + checkpoints_req)::bigint FROM pg_stat_bgwriter",
    )
    .await
}

/// Dead tuples in `table` (qualified), counted page by page; `None` without `pgstattuple`.
async fn dead_tuples(c: &tokio_postgres::Client, table: &str) -> Option<i64> {
    c.query_one(
        "SELECT dead_tuple_count FROM pgstattuple($1::text::regclass)",
        &[&table],
    )
    .await
    .ok()
    .map(|r| r.get(0))
}

/// A relay with default settings and no cleanup schedule (the bench runs cleanup itself).
fn bench_relay(db: &outbox::DbConfig) -> outbox::Relay {
    let mut cfg = outbox::RelayConfig::default();
    cfg.cleanup.interval = None;
    outbox::Relay::new(db, &kafka(), cfg).unwrap()
}

/// Passes until one comes back empty; the rows published.
async fn publish_all(relay: &outbox::Relay) -> usize {
    let mut published = 0;
    while let outbox::Outcome::Published(n) = relay.run_once().await.unwrap() {
        published += n.sent;
    }
    published
}

/// One cleanup run with no retention: today's table deletes every sent row, the ring rotates.
async fn cleanup_now(db: &outbox::DbConfig) -> outbox::CleanupReport {
    let mut cc = outbox::CleanupConfig::default();
    cc.interval = None;
    cc.sent_retention = std::time::Duration::ZERO;
    outbox::cleanup(db, &cc).await.unwrap()
}

/// `rows` rows in transactions of `per_tx`, by plain SQL from a procedure loop (one round trip,
/// so the phase measures what Postgres writes, not the client), the same body as the bench
/// fill: ≈200-byte JSON payloads, `keys` keys, the four standard headers.
fn insert_sql(table: &str, s: &str, rows: usize, per_tx: usize, keys: usize) -> String {
    format!(
        "DO $$
         BEGIN
           FOR t IN 0..{txs} - 1 LOOP
             INSERT INTO {table} (topic, message_key, headers, payload)
             SELECT 'bench.wal', 'key-' || (g % {keys}),
                    jsonb_build_object('message_type', 'order_created', 'entity_id', 'key-' || (g % {keys}),
                                       'message_id', {s}.outbox_uuidv7()::text,
                                       'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')),
                    jsonb_build_object('order_number', 'A-' || g, 'customer', 'customer-' || (g % 977),
                                       'total_cents', g * 7 % 100000, 'currency', 'EUR', 'note', repeat('x', 90))
               FROM generate_series(t::bigint * {per_tx}, t::bigint * {per_tx} + {per_tx} - 1) g;
             COMMIT;
           END LOOP;
         END $$",
        txs = rows / per_tx,
    )
}

#[tokio::main]
async fn main() {
    let per_tx = param("PER_TX", 100);
    let rows = param("ROWS", if full() { 100_000 } else { 2_000 }) / per_tx * per_tx;
    let keys = param("KEYS", 1000);
    let db = fresh_db().await;
    let c = outbox::connect(&db).await.unwrap();
    let s = db.schema.quoted();
    let have_pgstattuple = c
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        .await
        .is_ok();
    let topic = format!("bench.{}.wal", rand_name(8));
    create_topic(&topic, 6).await;
    // The reference: the outbox's columns and defaults, a primary key, nothing else.
    c.batch_execute(&format!(
        "CREATE TABLE {s}.plain (LIKE {s}.outbox INCLUDING DEFAULTS INCLUDING IDENTITY);
         ALTER TABLE {s}.plain ADD PRIMARY KEY (id);
         ALTER TABLE {s}.plain SET (autovacuum_enabled = false);
         ALTER TABLE {s}.outbox SET (autovacuum_enabled = false);"
    ))
    .await
    .unwrap();
    let relay = bench_relay(&db);
    // The relay's first pass (lanes, producer id) before anything is measured.
    relay.rebalance().await;
    relay.run_once().await.unwrap();

    c.batch_execute("CHECKPOINT").await.unwrap();
    let checkpoints_before = checkpoints(&c).await;

    let a = lsn(&c).await;
    c.batch_execute(&insert_sql(&format!("{s}.plain"), &s, rows, per_tx, keys))
        .await
        .unwrap();
    let plain_insert = lsn(&c).await - a;

    // The outbox's rows go to the topic the relay publishes to.
    let a = lsn(&c).await;
    c.batch_execute(
        &insert_sql(&format!("{s}.outbox"), &s, rows, per_tx, keys)
            .replace("'bench.wal'", &format!("'{topic}'")),
    )
    .await
    .unwrap();
    let enqueue = lsn(&c).await - a;

    let a = lsn(&c).await;
    let started = Instant::now();
    let published = publish_all(&relay).await;
    let drain_secs = started.elapsed().as_secs_f64();
    let relay_wal = lsn(&c).await - a;
    assert_eq!(published, rows, "the relay published every row");
    let dead_after_drain = if have_pgstattuple {
        dead_tuples(&c, &format!("{s}.outbox")).await
    } else {
        None
    };

    let a = lsn(&c).await;
    let cleanup = cleanup_now(&db).await;
    let cleanup_wal = lsn(&c).await - a;
    assert_eq!(
        cleanup.outbox_deleted as usize, rows,
        "cleanup reclaimed every sent row"
    );

    let a = lsn(&c).await;
    c.batch_execute(&format!("VACUUM {s}.outbox"))
        .await
        .unwrap();
    let vacuum_wal = lsn(&c).await - a;
    let checkpoints_during = checkpoints(&c).await - checkpoints_before;

    // A snapshot held open (a report, a long migration) while a tenth of the volume goes
    // through: what no vacuum can remove until it ends.
    let held_rows = (rows / 10).max(per_tx) / per_tx * per_tx;
    let holder = outbox::connect(&db).await.unwrap();
    holder
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .await
        .unwrap();
    c.batch_execute(
        &insert_sql(&format!("{s}.outbox"), &s, held_rows, per_tx, keys)
            .replace("'bench.wal'", &format!("'{topic}'")),
    )
    .await
    .unwrap();
    let held_published = publish_all(&relay).await;
    assert_eq!(held_published, held_rows);
    cleanup_now(&db).await;
    c.batch_execute(&format!("VACUUM {s}.outbox"))
        .await
        .unwrap();
    let dead_while_held = if have_pgstattuple {
        dead_tuples(&c, &format!("{s}.outbox")).await
    } else {
        None
    };
    holder.batch_execute("COMMIT").await.unwrap();

    let per = |b: i64| round2(b as f64 / rows as f64);
    let total = enqueue + relay_wal + cleanup_wal + vacuum_wal;
    emit(
        "wal_per_event",
        serde_json::json!({"rows": rows, "per_tx": per_tx, "keys": keys, "storage": "table (claim, sent UPDATE, cleanup DELETE)"}),
        serde_json::json!({
            "plain_insert_bytes_per_event": per(plain_insert),
            "enqueue_bytes_per_event": per(enqueue),
            "relay_bytes_per_event": per(relay_wal),
            "cleanup_bytes_per_event": per(cleanup_wal),
            "vacuum_bytes_per_event": per(vacuum_wal),
            "total_bytes_per_event": per(total),
            "total_to_plain_insert": round2(total as f64 / plain_insert as f64),
            "dead_tuples_after_drain": dead_after_drain,
            "dead_tuples_after_drain_per_row": dead_after_drain.map(|d| round2(d as f64 / rows as f64)),
            "held_snapshot_rows": held_rows,
            "dead_tuples_left_by_vacuum_while_held": dead_while_held,
            "drain_msgs_per_sec": (rows as f64 / drain_secs).round(),
            "checkpoints_during": checkpoints_during,
        }),
    );
    drop(relay);
    delete_topic(&topic).await;
    ring_model(&c, &s, rows, per_tx, keys, param("BATCH", 2000)).await;
    drop_schema(&db).await;
    ring_relay(rows, per_tx, keys, rows as f64 / drain_secs).await;
}

/// The ring as built so far (`outbox_use_ring()`), with the relay: the same rows INSERTed into
/// `outbox` (the view, through its trigger), published by the relay from the lanes' cursors,
/// the leaf reclaimed by rotation (two cleanup runs: the generation moves on, the read leaf is
/// truncated), the lanes vacuumed; the drain rate as a ratio to the table's in the same run
/// (`table_drain_per_sec`).
async fn ring_relay(rows: usize, per_tx: usize, keys: usize, table_drain_per_sec: f64) {
    let db = fresh_db().await;
    let c = outbox::connect(&db).await.unwrap();
    let s = db.schema.quoted();
    let have_pgstattuple = c
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        .await
        .is_ok();
    c.batch_execute(&format!(
        "SET search_path TO {s}; SELECT outbox_use_ring(); RESET search_path;
         CREATE TABLE {s}.plain (LIKE {s}.outbox_legacy INCLUDING DEFAULTS INCLUDING IDENTITY);
         ALTER TABLE {s}.plain ADD PRIMARY KEY (id);
         ALTER TABLE {s}.plain SET (autovacuum_enabled = false);"
    ))
    .await
    .unwrap();
    let topic = format!("bench.{}.wal", rand_name(8));
    create_topic(&topic, 6).await;
    let relay = bench_relay(&db);
    relay.rebalance().await;
    relay.run_once().await.unwrap();
    c.batch_execute("CHECKPOINT").await.unwrap();

    let a = lsn(&c).await;
    c.batch_execute(&insert_sql(&format!("{s}.plain"), &s, rows, per_tx, keys))
        .await
        .unwrap();
    let plain_insert = lsn(&c).await - a;

    let a = lsn(&c).await;
    c.batch_execute(
        &insert_sql(&format!("{s}.outbox"), &s, rows, per_tx, keys)
            .replace("'bench.wal'", &format!("'{topic}'")),
    )
    .await
    .unwrap();
    let enqueue = lsn(&c).await - a;

    let a = lsn(&c).await;
    let started = Instant::now();
    let published = publish_all(&relay).await;
    let drain_secs = started.elapsed().as_secs_f64();
    let relay_wal = lsn(&c).await - a;
    assert_eq!(published, rows, "the relay published every row");
    let leaf = format!("{s}.outbox_ring_0");
    let dead_after_drain = if have_pgstattuple {
        dead_tuples(&c, &leaf).await
    } else {
        None
    };

    // Rotation, as cleanup runs it (retention 0): the first run moves the generation on, the
    // second reclaims the leaf the relay has read.
    let a = lsn(&c).await;
    let first = cleanup_now(&db).await;
    let second = cleanup_now(&db).await;
    assert!(first.generation_advanced);
    assert_eq!(
        second.generations_reclaimed, 1,
        "the read leaf is reclaimed"
    );
    assert_eq!(scalar(&c, &format!("SELECT count(*) FROM {leaf}")).await, 0);
    let reclaim = lsn(&c).await - a;
    let a = lsn(&c).await;
    c.batch_execute(&format!(
        "VACUUM {s}.outbox_cursor_log, {s}.outbox_generation, {s}.outbox_retry"
    ))
    .await
    .unwrap();
    let vacuum_wal = lsn(&c).await - a;

    // A snapshot held open while a tenth of the volume goes through: the ring keeps no dead
    // tuple, nor does the lanes' cursor log (appended to; trimmed only when no snapshot is held).
    let held_rows = (rows / 10).max(per_tx) / per_tx * per_tx;
    let holder = outbox::connect(&db).await.unwrap();
    holder
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .await
        .unwrap();
    c.batch_execute(
        &insert_sql(&format!("{s}.outbox"), &s, held_rows, per_tx, keys)
            .replace("'bench.wal'", &format!("'{topic}'")),
    )
    .await
    .unwrap();
    let held_published = publish_all(&relay).await;
    assert_eq!(held_published, held_rows);
    c.batch_execute(&format!("VACUUM {s}.outbox_cursor_log"))
        .await
        .unwrap();
    let (ring_dead_held, lanes_dead_held) = if have_pgstattuple {
        (
            dead_tuples(&c, &format!("{s}.outbox_ring_1")).await,
            match (
                dead_tuples(&c, &format!("{s}.outbox_cursor_log_0")).await,
                dead_tuples(&c, &format!("{s}.outbox_cursor_log_1")).await,
            ) {
                (Some(a), Some(b)) => Some(a + b),
                _ => None,
            },
        )
    } else {
        (None, None)
    };
    holder.batch_execute("COMMIT").await.unwrap();

    let per = |b: i64| round2(b as f64 / rows as f64);
    let total = enqueue + relay_wal + reclaim + vacuum_wal;
    let drain_per_sec = rows as f64 / drain_secs;
    emit(
        "wal_per_event_ring",
        serde_json::json!({"rows": rows, "per_tx": per_tx, "keys": keys,
                           "storage": "ring (outbox_use_ring()): the relay, rotation by cleanup"}),
        serde_json::json!({
            "plain_insert_bytes_per_event": per(plain_insert),
            "enqueue_bytes_per_event": per(enqueue),
            "relay_bytes_per_event": per(relay_wal),
            "reclaim_bytes_per_event": per(reclaim),
            "vacuum_bytes_per_event": per(vacuum_wal),
            "total_bytes_per_event": per(total),
            "total_to_plain_insert": round2(total as f64 / plain_insert as f64),
            "dead_tuples_after_drain": dead_after_drain,
            "held_snapshot_rows": held_rows,
            "ring_dead_tuples_while_held": ring_dead_held,
            "lanes_dead_tuples_while_held": lanes_dead_held,
            "drain_msgs_per_sec": drain_per_sec.round(),
            "drain_to_table": round2(drain_per_sec / table_drain_per_sec),
        }),
    );
    drop(relay);
    delete_topic(&topic).await;
    drop_schema(&db).await;
}

/// The planned layout as SQL (see the module docs): what its WAL and dead tuples come to.
async fn ring_model(
    c: &tokio_postgres::Client,
    s: &str,
    rows: usize,
    per_tx: usize,
    keys: usize,
    batch: usize,
) {
    c.batch_execute(&format!(
        "CREATE SEQUENCE {s}.ring_id_seq;
         CREATE TABLE {s}.ring_state (gen int NOT NULL);
         INSERT INTO {s}.ring_state VALUES (0);
         CREATE FUNCTION {s}.ring_gen() RETURNS int LANGUAGE sql STABLE
             AS 'SELECT gen FROM {s}.ring_state';
         CREATE TABLE {s}.ring (
             id           bigint      NOT NULL DEFAULT nextval('{s}.ring_id_seq'),
             gen          int         NOT NULL DEFAULT {s}.ring_gen(),
             xid          xid8        NOT NULL DEFAULT pg_current_xact_id(),
             topic        text        NOT NULL,
             message_key  text,
             headers      jsonb       NOT NULL DEFAULT '{{}}'::jsonb,
             payload      jsonb       NOT NULL,
             created_at   timestamptz NOT NULL DEFAULT now()
         ) PARTITION BY LIST (gen);
         CREATE TABLE {s}.ring_0 PARTITION OF {s}.ring FOR VALUES IN (0)
             WITH (fillfactor = 100, autovacuum_enabled = false);
         CREATE TABLE {s}.ring_1 PARTITION OF {s}.ring FOR VALUES IN (1)
             WITH (fillfactor = 100, autovacuum_enabled = false);
         ALTER TABLE {s}.ring_0 ADD PRIMARY KEY (id);
         ALTER TABLE {s}.ring_1 ADD PRIMARY KEY (id);
         CREATE TABLE {s}.ring_lanes (lane int PRIMARY KEY, cursor bigint NOT NULL)
             WITH (fillfactor = 20);
         INSERT INTO {s}.ring_lanes SELECT g, 0 FROM generate_series(0, 63) g;
         CREATE TRIGGER ring_notify AFTER INSERT ON {s}.ring
             FOR EACH STATEMENT EXECUTE FUNCTION {s}.outbox_notify();
         CHECKPOINT;"
    ))
    .await
    .unwrap();
    let a = lsn(c).await;
    c.batch_execute(&insert_sql(&format!("{s}.ring"), s, rows, per_tx, keys))
        .await
        .unwrap();
    let enqueue = lsn(c).await - a;

    // Reading in id order, a batch at a time; after each batch every lane's cursor moves
    // past it (the relay would do that after Kafka's acknowledgements).
    let a = lsn(c).await;
    let mut from = 0i64;
    let mut read = 0usize;
    loop {
        let got = c
            .query(
                &format!(
                    "SELECT id, topic, message_key, headers::text, payload::text,
                            hashtext(coalesce(message_key, '')) & 63
                       FROM {s}.ring WHERE id >= $1 ORDER BY id LIMIT $2"
                ),
                &[&from, &(batch as i64)],
            )
            .await
            .unwrap();
        let Some(last) = got.last() else { break };
        let next: i64 = last.get::<_, i64>(0) + 1;
        read += got.len();
        c.execute(
            &format!("UPDATE {s}.ring_lanes SET cursor = $1 WHERE cursor < $1"),
            &[&next],
        )
        .await
        .unwrap();
        from = next;
    }
    let relay_wal = lsn(c).await - a;
    assert_eq!(read, rows, "the model read every row");
    let dead_after_drain = dead_tuples(c, &format!("{s}.ring_0")).await;

    // Reclaim: the generation moves on, the settled leaf is truncated.
    let a = lsn(c).await;
    c.batch_execute(&format!(
        "UPDATE {s}.ring_state SET gen = 1;
         SET lock_timeout = '50ms';
         LOCK TABLE {s}.ring_0 IN ACCESS EXCLUSIVE MODE NOWAIT;
         TRUNCATE {s}.ring_0;
         RESET lock_timeout;"
    ))
    .await
    .unwrap();
    let reclaim = lsn(c).await - a;
    let a = lsn(c).await;
    c.batch_execute(&format!("VACUUM {s}.ring_lanes, {s}.ring_state"))
        .await
        .unwrap();
    let vacuum_wal = lsn(c).await - a;

    // The plain table again, in this part of the run, as the ratio's base.
    c.batch_execute(&format!("TRUNCATE {s}.plain; CHECKPOINT"))
        .await
        .unwrap();
    let a = lsn(c).await;
    c.batch_execute(&insert_sql(&format!("{s}.plain"), s, rows, per_tx, keys))
        .await
        .unwrap();
    let plain_insert = lsn(c).await - a;

    let per = |b: i64| round2(b as f64 / rows as f64);
    let total = enqueue + relay_wal + reclaim + vacuum_wal;
    emit(
        "wal_per_event_ring_model",
        serde_json::json!({"rows": rows, "per_tx": per_tx, "keys": keys, "batch": batch,
                           "storage": "ring model, SQL only (no relay, no Kafka): leaf with a primary key only, lane cursors, TRUNCATE"}),
        serde_json::json!({
            "plain_insert_bytes_per_event": per(plain_insert),
            "enqueue_bytes_per_event": per(enqueue),
            "read_and_cursor_bytes_per_event": per(relay_wal),
            "reclaim_bytes_per_event": per(reclaim),
            "vacuum_bytes_per_event": per(vacuum_wal),
            "total_bytes_per_event": per(total),
            "total_to_plain_insert": round2(total as f64 / plain_insert as f64),
            "dead_tuples_after_drain": dead_after_drain,
        }),
    );
}
