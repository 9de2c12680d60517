//! The relay's hot statements use the partial indexes, so their cost follows the queue, not the
//! number of sent rows kept for retention. Plans are printed for docs/BENCHMARKS_HISTORY.md
//! (`cargo test --test relay plans:: -- --nocapture`).

use std::time::Duration;

use outbox_testkit::*;

async fn explain(
    c: &tokio_postgres::Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> String {
    let rows = c.query(&format!("EXPLAIN {sql}"), params).await.unwrap();
    // Literal id arrays make lines huge; shorten them for reading.
    rows.iter()
        .map(|r| {
            let l: String = r.get(0);
            if l.len() > 160 {
                format!("{}…", l.chars().take(160).collect::<String>())
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn claim_mark_and_cleanup_use_indexes_not_table_scans() {
    let db = fresh_db().await;
    let c = client(&db).await;
    // 200,000 sent rows kept for retention, 2,000 pending: the shape of a healthy outbox.
    c.batch_execute(
        "INSERT INTO outbox (topic, message_key, payload, status, sent_at)
           SELECT 'a.b', 'k' || (g % 100), '{}', 'sent', now() - interval '1 day' FROM generate_series(1, 200000) g;
         INSERT INTO outbox (topic, message_key, payload) SELECT 'a.b', 'k' || (g % 100), '{}' FROM generate_series(1, 2000) g;
         INSERT INTO processed_messages (consumer_group, topic, message_id, processed_at)
           SELECT 'g', 'a.b', 'm' || g, now() - interval '1 day' FROM generate_series(1, 100000) g;
         ANALYZE outbox; ANALYZE processed_messages;",
    )
    .await
    .unwrap();
    let stmts: std::collections::HashMap<_, _> = outbox::testing::hot_statements(&db.schema)
        .into_iter()
        .collect();
    let ids: Vec<i64> = (200_001..202_001).collect();
    let errs: Vec<String> = ids.iter().map(|_| "e".to_string()).collect();
    let keys: Vec<String> = (0..100).map(|k| format!("k{k}")).collect();
    let from_zero = vec![0i64; keys.len()];
    // Up to each key's first claimed row: here, anywhere.
    let before = vec![i64::MAX; keys.len()];
    let lanes: Vec<i32> = (0..outbox::testing::LANES).collect();
    let plans = [
        (
            "claim",
            explain(&c, &stmts["claim"], &[&2000i64, &lanes, &0i64]).await,
            "outbox_pending_id_idx",
        ),
        (
            "first_pending",
            explain(&c, &stmts["first_pending"], &[&keys, &from_zero, &before]).await,
            "outbox_pending_key_idx",
        ),
        (
            "sample",
            explain(&c, &stmts["sample"], &[]).await,
            "outbox_pkey",
        ),
        (
            "left_behind",
            explain(&c, &stmts["left_behind"], &[&0i64, &200_001i64, &lanes]).await,
            "outbox_pending_id_idx",
        ),
        (
            "sweep",
            explain(&c, &stmts["sweep"], &[&200_001i64, &lanes]).await,
            "outbox_pending",
        ),
        (
            "mark_sent",
            explain(&c, &stmts["mark_sent"], &[&ids]).await,
            "outbox_pkey",
        ),
        (
            "mark_failed",
            explain(&c, &stmts["mark_failed"], &[&ids, &errs, &10i32]).await,
            "outbox_pkey",
        ),
        (
            "cleanup_outbox",
            explain(
                &c,
                &stmts["cleanup_outbox"],
                &[&(7.0 * 86400.0), &5000i64, &0i64],
            )
            .await,
            "outbox_pkey",
        ),
        (
            "cleanup_processed",
            explain(
                &c,
                &stmts["cleanup_processed"],
                &[&(14.0 * 86400.0), &5000i64],
            )
            .await,
            "processed_messages_processed_at_idx",
        ),
    ];
    for (name, plan, index) in &plans {
        println!("--- {name}\n{plan}\n");
        assert!(plan.contains(index), "{name} does not use {index}:\n{plan}");
    }
    // The claim never scans the table or the sent rows; its "earlier row backed off" check reads
    // a pending-only index (the planner picks the seed's (available_at, id) index for the few
    // not-yet-due rows, or the per-key index).
    // No statement on the claim path scans the outbox (the sample's one sequential scan is of
    // the tiny `pg_database` catalog).
    for (name, plan, _) in &plans[..6] {
        assert!(!plan.contains("Seq Scan on outbox"), "{name}:\n{plan}");
    }
    assert!(
        plans[0].1.contains("outbox_pending_idx") || plans[0].1.contains("outbox_pending_key_idx"),
        "{}",
        plans[0].1
    );
}

/// Sets the relay's session settings on `c` (index scans and nested loops only) and returns
/// the relay's hot statements for `db`'s schema, by name.
async fn as_the_relay(
    c: &tokio_postgres::Client,
    db: &outbox::DbConfig,
) -> std::collections::HashMap<&'static str, String> {
    for kv in outbox::testing::relay_session_settings()
        .split_whitespace()
        .filter(|w| *w != "-c")
    {
        c.batch_execute(&format!("SET {kv}")).await.unwrap();
    }
    outbox::testing::hot_statements(&db.schema)
        .into_iter()
        .collect()
}

/// Shared buffers (hit + read) of the top node of `EXPLAIN (ANALYZE, BUFFERS)`.
async fn buffers(
    c: &mut tokio_postgres::Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> (u64, String) {
    // ANALYZE runs the claim (it locks rows): inside a transaction that is rolled back.
    let tx = c.transaction().await.unwrap();
    let rows = tx
        .query(&format!("EXPLAIN (ANALYZE, BUFFERS) {sql}"), params)
        .await
        .unwrap();
    let plan: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    tx.rollback().await.unwrap();
    let line = plan
        .iter()
        .find(|l| l.trim_start().starts_with("Buffers:"))
        .cloned()
        .unwrap_or_default();
    let n = line
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("hit=").or_else(|| w.strip_prefix("read=")))
        .map(|v| v.trim_end_matches(',').parse::<u64>().unwrap())
        .sum();
    (n, plan.join("\n"))
}

/// The plan-cache modes a statement is checked under: a fresh statement is planned for its
/// parameters; the relay's prepared statements switch to a generic plan after five runs.
const PLAN_MODES: [&str; 2] = ["force_custom_plan", "force_generic_plan"];

/// Runs `stmt` (SQL, parameters) under `EXPLAIN (ANALYZE, BUFFERS)` and asserts its plan uses
/// `index`, holds none of `bad` and reads fewer than `max` buffers; returns the plan, labelled.
async fn plan_walks(
    c: &mut tokio_postgres::Client,
    label: &str,
    (sql, params): (&str, &[&(dyn tokio_postgres::types::ToSql + Sync)]),
    index: &str,
    bad: &[&str],
    max: u64,
) -> String {
    let (n, plan) = buffers(c, sql, params).await;
    assert!(
        plan.contains(index),
        "{label} does not use {index}:\n{plan}"
    );
    for b in bad {
        assert!(!plan.contains(b), "{label} plan has {b}:\n{plan}");
    }
    assert!(n < max, "{label}: {n} buffers\n{plan}");
    format!("--- {label}: {n} buffers\n{plan}")
}

#[tokio::test]
async fn a_held_snapshot_does_not_make_the_claim_walk_the_rows_sent_since() {
    // A forgotten REPEATABLE READ transaction: while it is open, the pending indexes keep an
    // entry for every row sent after it began, and nothing can remove them.
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 3).await;
    let holder = client(&db).await;
    holder
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM outbox")
        .await
        .unwrap();
    let relay = outbox::Relay::new(&db, &kafka(), relay_config()).unwrap();
    enqueue_n(&db, &topic, 20_000, 1_000, 500).await;
    assert_eq!(drain(&relay).await, 20_000);
    wait_until(
        Duration::from_secs(20),
        "the claim floor passes the sent rows",
        || async {
            enqueue_n(&db, &topic, 1, 1, 1).await;
            drain(&relay).await;
            relay.claim_floor() > 20_000
        },
    )
    .await;
    let stmts: std::collections::HashMap<_, _> = outbox::testing::hot_statements(&db.schema)
        .into_iter()
        .collect();
    let lanes = relay.owned_lanes().await;
    let keys: Vec<String> = (0..1_000).map(|k| format!("k{k}")).collect();
    let mut c = client(&db).await;
    let floor = relay.claim_floor();
    let (from_floor, plan) = buffers(&mut c, &stmts["claim"], &[&2000i64, &lanes, &floor]).await;
    let (from_head, head_plan) = buffers(&mut c, &stmts["claim"], &[&2000i64, &lanes, &0i64]).await;
    let (from_floors, from_zero) = (vec![floor; keys.len()], vec![0i64; keys.len()]);
    let before = vec![i64::MAX; keys.len()];
    let (probe_floor, _) = buffers(
        &mut c,
        &stmts["first_pending"],
        &[&keys, &from_floors, &before],
    )
    .await;
    let (probe_head, _) = buffers(
        &mut c,
        &stmts["first_pending"],
        &[&keys, &from_zero, &before],
    )
    .await;
    println!("claim from the floor ({floor}): {from_floor} buffers\n{plan}\n\nfrom the head: {from_head} buffers\n{head_plan}");
    println!("per-key probe of 1,000 keys: from the floor {probe_floor} buffers, from the head {probe_head}");
    // From the head the claim reads the 20,000 unremovable entries (proof that the snapshot
    // really pins them); from the floor it reads a handful of pages.
    assert!(from_head > 100, "{head_plan}");
    assert!(from_floor < 20, "{plan}");
    assert!(
        probe_head > 2 * probe_floor,
        "{probe_head} vs {probe_floor}"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}

#[tokio::test]
async fn a_never_analyzed_backlog_is_claimed_by_walking_the_index_whatever_the_statistics() {
    // A bulk import (or a relay outage) leaves 200,000 pending rows in an outbox that autovacuum
    // never analyzed: the planner knows nothing about them.
    let db = fresh_db().await;
    let mut c = client(&db).await;
    c.batch_execute(
        "ALTER TABLE outbox SET (autovacuum_enabled = false);
         INSERT INTO outbox (topic, message_key, payload)
           SELECT 'a.b', 'k' || (g % 1000), jsonb_build_object('n', g, 'pad', repeat('x', 150))
           FROM generate_series(1, 200000) g;",
    )
    .await
    .unwrap();
    let analyzed: Option<std::time::SystemTime> = c
        .query_one(
            "SELECT last_analyze FROM pg_stat_user_tables WHERE relid = 'outbox'::regclass",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        analyzed.is_none(),
        "the outbox must never have been analyzed"
    );
    // The relay's session settings (index scans and nested loops only).
    let stmts = as_the_relay(&c, &db).await;
    let lanes: Vec<i32> = (0..outbox::testing::LANES).collect();
    let keys: Vec<String> = (0..1000).map(|k| format!("k{k}")).collect();
    let from_zero = vec![0i64; keys.len()];
    // Up to each key's first claimed row: here, anywhere.
    let before = vec![i64::MAX; keys.len()];
    // One row of a key backed off, so the claim with the hold-back check is exercised too.
    c.batch_execute(
        "UPDATE outbox SET attempts = 1, available_at = now() + interval '1 minute' WHERE id = 5",
    )
    .await
    .unwrap();
    let mut report = Vec::new();
    for (name, sql, params) in [
        (
            "claim",
            &stmts["claim"],
            vec![
                &2000i64 as &(dyn tokio_postgres::types::ToSql + Sync),
                &lanes,
                &0i64,
            ],
        ),
        (
            "claim_free",
            &stmts["claim_free"],
            vec![&2000i64, &lanes, &0i64],
        ),
        (
            "first_pending",
            &stmts["first_pending"],
            vec![&keys, &from_zero, &before],
        ),
        ("sample", &stmts["sample"], vec![]),
        (
            "left_behind",
            &stmts["left_behind"],
            vec![&0i64, &2001i64, &lanes],
        ),
        ("sweep", &stmts["sweep"], vec![&0i64, &lanes]),
    ] {
        let (n, plan) = buffers(&mut c, sql, &params).await;
        report.push(format!("--- {name}: {n} buffers\n{plan}"));
        for bad in ["Sort", "Bitmap Heap Scan", "Seq Scan on outbox", "Hash"] {
            assert!(!plan.contains(bad), "{name} plan has {bad}:\n{plan}");
        }
        // Bounded by the batch (2,000 rows, 1,000 keys), not by the 200,000-row backlog.
        assert!(n < 12_000, "{name}: {n} buffers\n{plan}");
    }
    println!("{}", report.join("\n\n"));
}

#[tokio::test]
async fn a_backlog_behind_statistics_of_an_idle_outbox_is_checked_key_by_key() {
    // The usual life of an outbox: everything sent, then (auto)vacuumed and analyzed while idle,
    // so the statistics say no row is pending and both pending-only indexes are empty. Then a
    // bulk job commits 100,000 rows, and the relay drains them before the next autoanalyze.
    // The per-key check of each batch (`first_pending`) must then still probe the key index
    // once per key: with the id index (which the planner, seeing two "empty" indexes, picked)
    // each key walked every row of the batch before its own, a 2,000-row batch took 50 – 120 ms
    // instead of 3 – 10, and a running relay drained such a burst at a quarter of its speed
    // (benches/fleet.rs `burst_msgs_per_sec`, BENCHMARKS_HISTORY round 26).
    let db = fresh_db().await;
    let mut c = client(&db).await;
    c.batch_execute(
        "ALTER TABLE outbox SET (autovacuum_enabled = false);
         INSERT INTO outbox (topic, message_key, payload, status, sent_at)
           SELECT 'a.b', 'k' || (g % 1000), jsonb_build_object('n', g), 'sent', now()
           FROM generate_series(1, 100000) g;",
    )
    .await
    .unwrap();
    // (Statements of their own: VACUUM refuses to run inside the implicit transaction of a
    // multi-statement string.)
    c.batch_execute("VACUUM ANALYZE outbox").await.unwrap();
    c.batch_execute(
        "INSERT INTO outbox (topic, message_key, payload)
           SELECT 'a.b', 'k' || (g % 1000), jsonb_build_object('n', g)
           FROM generate_series(1, 100000) g;",
    )
    .await
    .unwrap();
    let stmts = as_the_relay(&c, &db).await;
    let first: i64 = c
        .query_one("SELECT min(id) FROM outbox WHERE status = 'pending'", &[])
        .await
        .unwrap()
        .get(0);
    // One row backed off (a refused send), so the claim with the hold-back check runs.
    c.execute(
        "UPDATE outbox SET attempts = 1, available_at = now() + interval '1 minute' WHERE id = $1",
        &[&(first + 5)],
    )
    .await
    .unwrap();
    // The first batch: 2,000 rows from the floor, each of the 1,000 keys first met at
    // `first + k` (the fill cycles through the keys in id order).
    let keys: Vec<String> = (0..1000)
        .map(|k| format!("k{}", (first + k) % 1000))
        .collect();
    let from = vec![first; keys.len()];
    let before: Vec<i64> = (0..1000).map(|k| first + k).collect();
    let lanes: Vec<i32> = (0..outbox::testing::LANES).collect();
    let mut report = Vec::new();
    // A fresh statement is planned for its parameters; the relay's prepared statements switch
    // to a generic plan after five runs. Both must hold.
    for mode in PLAN_MODES {
        c.batch_execute(&format!("SET plan_cache_mode = {mode}"))
            .await
            .unwrap();
        for (name, sql, params, index) in [
            (
                "first_pending",
                &stmts["first_pending"],
                vec![
                    &keys as &(dyn tokio_postgres::types::ToSql + Sync),
                    &from,
                    &before,
                ],
                "outbox_pending_key_idx",
            ),
            (
                "claim_free",
                &stmts["claim_free"],
                vec![&2000i64, &lanes, &first],
                "outbox_pending_id_idx",
            ),
            (
                "claim",
                &stmts["claim"],
                vec![&2000i64, &lanes, &first],
                "outbox_pending_id_idx",
            ),
            (
                "left_behind",
                &stmts["left_behind"],
                vec![&first, &(first + 2000), &lanes],
                "outbox_pending_id_idx",
            ),
            ("sample", &stmts["sample"], vec![], "outbox_pkey"),
            (
                "sweep",
                &stmts["sweep"],
                vec![&first, &lanes],
                "outbox_pending",
            ),
        ] {
            // Bounded by the batch (2,000 rows, one index probe per row or key), not by the
            // backlog: before, the per-key check read 20,000 buffers and the claim 3.4 million.
            report.push(
                plan_walks(
                    &mut c,
                    &format!("{name} ({mode})"),
                    (sql, &params),
                    index,
                    &["Sort", "Bitmap Heap Scan", "Seq Scan on outbox", "Hash"],
                    12_000,
                )
                .await,
            );
        }
    }
    println!("{}", report.join("\n\n"));
}

#[tokio::test]
async fn the_retry_claim_probes_the_key_index_behind_statistics_of_an_empty_table() {
    // Ring storage's retry table is empty most of the time, and analyzed so. A refusal that
    // lasts (a topic the producer may not write, a payload too large) fills it with the
    // refused rows and the rows of their keys behind them; the claim of its due rows must
    // still probe each row's key once, not walk the table for every row. (Its `NOT EXISTS`
    // does: the other index, the primary key, would walk every row below the claimed one and
    // the planner does not take it. The outbox's own claim did, with two pending-only
    // indexes it saw as empty: the test above.)
    let db = fresh_db().await;
    let mut c = client(&db).await;
    c.batch_execute(
        "SELECT outbox_use_ring();
         ALTER TABLE outbox_retry SET (autovacuum_enabled = false);",
    )
    .await
    .unwrap();
    c.batch_execute("VACUUM ANALYZE outbox_retry")
        .await
        .unwrap();
    c.batch_execute(
        "INSERT INTO outbox_retry (id, topic, message_key, payload)
           SELECT g, 'a.b', 'k' || (g % 1000), jsonb_build_object('n', g)
           FROM generate_series(1, 50000) g;
         UPDATE outbox_retry SET attempts = 1, available_at = now() + interval '1 minute'
          WHERE id = 5;",
    )
    .await
    .unwrap();
    let stmts = as_the_relay(&c, &db).await;
    let lanes: Vec<i32> = (0..outbox::testing::LANES).collect();
    for mode in PLAN_MODES {
        c.batch_execute(&format!("SET plan_cache_mode = {mode}"))
            .await
            .unwrap();
        // The hold-back check probes the key index; bounded by the batch, not by the 50,000
        // rows waiting.
        let line = plan_walks(
            &mut c,
            &format!("ring_claim_retry ({mode})"),
            (&stmts["ring_claim_retry"], &[&2000i64, &lanes]),
            "outbox_retry_pending_key_idx",
            &["Sort", "Seq Scan on outbox_retry", "Hash"],
            12_000,
        )
        .await;
        println!("{line}");
    }
}

#[tokio::test]
async fn the_ring_read_walks_one_batch_of_a_backlog_not_the_backlog() {
    // 100,000 rows on ring storage waiting for the relay (an outage, a bulk import), analyzed
    // or not: a batch reads its 2,000 rows from the leaves' primary keys in id order and stops.
    // With the lanes as a join the planner, not knowing every row matches, read and sorted the
    // whole backlog for every batch, or (with the relay's settings) hashed each key 64 times.
    let db = fresh_db().await;
    let mut c = client(&db).await;
    c.batch_execute(
        "SELECT outbox_use_ring();
         INSERT INTO outbox (topic, message_key, payload)
           SELECT 'a.b', 'k' || (g % 1000), jsonb_build_object('n', g, 'pad', repeat('x', 100))
           FROM generate_series(1, 100000) g;",
    )
    .await
    .unwrap();
    let stmts = as_the_relay(&c, &db).await;
    let read = stmts["ring_read"].replace("{gens}", "0,1");
    // Every lane owned, every cursor at the start; half the lanes owned by another relay.
    let all: Vec<Option<i64>> = vec![Some(0); outbox::testing::LANES as usize];
    let half: Vec<Option<i64>> = (0..outbox::testing::LANES)
        .map(|l| (l % 2 == 0).then_some(0))
        .collect();
    let mut report = Vec::new();
    for analyzed in [false, true] {
        if analyzed {
            c.batch_execute("ANALYZE outbox_ring").await.unwrap();
        }
        for (owned, cursors) in [("all lanes", &all), ("half the lanes", &half)] {
            let (n, plan) = buffers(
                &mut c,
                &read,
                &[&2000i64, &0i64, &i64::MAX, cursors, &Vec::<i64>::new()],
            )
            .await;
            report.push(format!(
                "--- analyzed {analyzed}, {owned}: {n} buffers\n{plan}"
            ));
            // No join either: under the relay's settings a join on the lanes became a nested
            // loop that hashed every row's key once per lane (64 times), 18 ms a batch for
            // the same buffers.
            for bad in [
                "Sort  (",
                "Seq Scan",
                "Hash",
                "Gather",
                "Nested Loop",
                "Join",
            ] {
                assert!(!plan.contains(bad), "ring read plan has {bad}:\n{plan}");
            }
            // Bounded by the batch (2,000 rows, or 4,000 walked for half the lanes), not by
            // the 100,000-row backlog (about 2,000 pages).
            assert!(n < 400, "ring read, {owned}: {n} buffers\n{plan}");
        }
    }
    println!("{}", report.join("\n\n"));
}

#[tokio::test]
async fn the_ring_reads_each_lane_cursor_once_per_statement() {
    // A cursor log as a busy relay leaves it (30,000 moves since the last swap of its halves):
    // a claim's sample reads its lanes' cursors, a settle moves them, the gauges read them all.
    // Each is one probe of the log's primary key per lane: joined with the `outbox_lanes`
    // view instead, every row joined evaluated all 64 probes (4,096 for a sample, 0.7 ms).
    let db = fresh_db().await;
    let mut c = client(&db).await;
    c.batch_execute(
        "SELECT outbox_use_ring();
         INSERT INTO outbox_cursor_log (lane, next_id)
           SELECT g % 64, g FROM generate_series(100, 30000) g;
         INSERT INTO outbox (topic, message_key, payload)
           SELECT 'a.b', 'k' || g, '{}' FROM generate_series(1, 31000) g;",
    )
    .await
    .unwrap();
    let stmts = as_the_relay(&c, &db).await;
    let lanes: Vec<i32> = (0..outbox::testing::LANES).collect();
    let start: Vec<i64> = vec![0; lanes.len()];
    let next: Vec<i64> = vec![40_000; lanes.len()];
    let mut report = Vec::new();
    for (name, sql, params) in [
        (
            "ring_sample",
            stmts["ring_sample"].replace("{gens}", "0,1"),
            vec![&lanes as &(dyn tokio_postgres::types::ToSql + Sync)],
        ),
        (
            "ring_advance_lanes",
            stmts["ring_advance_lanes"].clone(),
            vec![&lanes, &start, &next],
        ),
        ("ring_gauges", stmts["ring_gauges"].clone(), vec![]),
    ] {
        let (n, plan) = buffers(&mut c, &sql, &params).await;
        report.push(format!("--- {name}: {n} buffers\n{plan}"));
        // A lane's newest entry is found by walking its key backwards, so no probe reads more
        // than one entry, and no join throws rows away.
        for line in plan.lines() {
            if let Some(loops) = line
                .contains("outbox_cursor_log")
                .then(|| line.split("loops=").nth(1))
                .flatten()
            {
                let loops: u64 = loops.trim_end_matches(')').parse().unwrap();
                assert!(
                    loops <= 64,
                    "{name}: {loops} probes of the cursor log\n{plan}"
                );
            }
        }
        assert!(
            !plan.contains("Rows Removed by Join Filter"),
            "{name} joins the cursors:\n{plan}"
        );
    }
    println!("{}", report.join("\n\n"));
}

/// The columns ANALYZE gathered statistics for on `table` of the current schema.
async fn analyzed_columns(c: &tokio_postgres::Client, table: &str) -> Vec<String> {
    c.batch_execute(&format!("ANALYZE {table}")).await.unwrap();
    c.query(
        "SELECT attname::text FROM pg_stats
          WHERE schemaname = current_schema() AND tablename = $1 ORDER BY 1",
        &[&table],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// ANALYZE of an outbox (every 2 % of its changes, per tenant in a fleet) sorted and stored its
/// jsonb payloads and headers, which no statement filters on: migration 28 turns their
/// statistics off, on today's table and, after a move onto the ring, on its retry table and the
/// old one. The columns the planner reads keep theirs.
#[tokio::test]
async fn analyze_skips_the_payload_and_headers_of_the_outbox_on_either_storage() {
    let db = fresh_db().await;
    let c = client(&db).await;
    c.batch_execute(
        "INSERT INTO outbox (topic, message_key, headers, payload)
         SELECT 't', 'k' || (g % 10), jsonb_build_object('n', g), jsonb_build_object('seq', g)
           FROM generate_series(1, 200) g",
    )
    .await
    .unwrap();
    let cols = analyzed_columns(&c, "outbox").await;
    assert!(
        cols.iter().any(|c| c == "status") && cols.iter().any(|c| c == "message_key"),
        "{cols:?}"
    );
    assert!(
        !cols.iter().any(|c| c == "payload" || c == "headers"),
        "{cols:?}"
    );
    c.batch_execute(
        "UPDATE outbox SET status = 'failed' WHERE id % 7 = 0; SELECT outbox_use_ring()",
    )
    .await
    .unwrap();
    for table in ["outbox_retry", "outbox_legacy"] {
        let cols = analyzed_columns(&c, table).await;
        assert!(cols.iter().any(|c| c == "status"), "{table}: {cols:?}");
        assert!(
            !cols.iter().any(|c| c == "payload" || c == "headers"),
            "{table}: {cols:?}"
        );
    }
}
