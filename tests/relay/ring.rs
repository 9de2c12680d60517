//! The relay on append-only storage (issue 33): a schema moved onto the ring with
//! `outbox_use_ring()`, written through the same enqueue paths and plain SQL, published from
//! the lanes' cursors with no UPDATE or DELETE of a ring row.

use std::collections::HashMap;
use std::time::Duration;

use outbox::{enqueue, Message, Outcome, Relay};
use outbox_testkit::*;

/// A fresh schema on ring storage.
async fn ring_db() -> (outbox::DbConfig, tokio_postgres::Client) {
    let db = fresh_db().await;
    let c = client(&db).await;
    c.batch_execute("SELECT outbox_use_ring()").await.unwrap();
    (db, c)
}

/// Inserts, updates and deletes counted by the statistics on the ring's leaves, once the
/// inserts of `rows` rows have been reported (statistics reach the view within a second).
async fn ring_writes(c: &tokio_postgres::Client, rows: i64) -> (i64, i64, i64) {
    let sql = "SELECT coalesce(sum(n_tup_ins), 0)::bigint, coalesce(sum(n_tup_upd), 0)::bigint,
                      coalesce(sum(n_tup_del), 0)::bigint
                 FROM pg_stat_user_tables
                WHERE schemaname = current_schema() AND relname LIKE 'outbox\\_ring\\_%'";
    let got = std::cell::Cell::new((0, 0, 0));
    wait_until(Duration::from_secs(20), "ring statistics", || async {
        c.batch_execute("SELECT pg_stat_clear_snapshot()")
            .await
            .unwrap();
        let r = c.query_one(sql, &[]).await.unwrap();
        got.set((r.get(0), r.get(1), r.get(2)));
        got.get().0 >= rows
    })
    .await;
    got.get()
}

/// Seed 002's plain-SQL insert of one row of `key` with `{"seq": seq}` into `topic`.
async fn insert_seq(c: &impl tokio_postgres::GenericClient, topic: &str, key: &str, seq: i32) {
    c.execute(
        "INSERT INTO outbox (topic, message_key, headers, payload)
         VALUES ($1, $2, '{\"message_type\":\"t\"}', jsonb_build_object('seq', $3::int))",
        &[&topic, &key, &seq],
    )
    .await
    .unwrap();
}

/// A service's transaction left open after writing one row of key `late` with `{"seq": seq}`
/// to `topic`: the open session and the row's id.
async fn open_writer(
    db: &outbox::DbConfig,
    topic: &str,
    seq: i32,
) -> (tokio_postgres::Client, i64) {
    let w = client(db).await;
    w.batch_execute("BEGIN").await.unwrap();
    let id: i64 = w
        .query_one(
            "INSERT INTO outbox (topic, message_key, payload)
             VALUES ($1, 'late', jsonb_build_object('seq', $2::int)) RETURNING id",
            &[&topic, &seq],
        )
        .await
        .unwrap()
        .get(0);
    (w, id)
}

/// Every record's `seq` by key, in topic order.
pub(crate) fn seqs_by_key(recs: &[Record]) -> HashMap<String, Vec<i64>> {
    let mut by: HashMap<String, Vec<i64>> = HashMap::new();
    for r in recs {
        let key = String::from_utf8(r.key.clone().unwrap_or_default()).unwrap();
        by.entry(key)
            .or_default()
            .push(r.json()["seq"].as_i64().unwrap());
    }
    by
}

#[tokio::test]
async fn on_the_ring_every_row_is_published_once_in_key_order_and_no_ring_row_is_updated_or_deleted(
) {
    let (db, c) = ring_db().await;
    let topic = topic_name();
    create_topic(&topic, 3).await;
    assert_eq!(
        texts(
            &c,
            "SELECT relkind::text FROM pg_class WHERE oid = 'outbox'::regclass"
        )
        .await,
        ["v"]
    );
    // Both enqueue paths and seed 002's plain SQL land in the ring.
    let ids = enqueue_n(&db, &topic, 3_000, 40, 50).await;
    let mut tx_client = client(&db).await;
    let tx = tx_client.transaction().await.unwrap();
    enqueue(
        &tx,
        &Message::new(&topic, "it_event", "k0", serde_json::json!({"seq": 3_000})),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let plain: i64 = c
        .query_one(
            "INSERT INTO outbox (topic, message_key, headers, payload)
             VALUES ($1, 'k1', '{\"message_type\":\"it_event\"}', '{\"seq\": 3001}') RETURNING id",
            &[&topic],
        )
        .await
        .unwrap()
        .get(0);
    assert!(plain > 0);
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox_ring").await,
        3_002,
        "every path wrote the ring"
    );

    let mut cfg = relay_config();
    cfg.batch_size = 500;
    cfg.in_flight_batches = 3;
    let relay = Relay::new(&db, &kafka(), cfg).unwrap();
    let sent = std::cell::Cell::new(0);
    wait_until(Duration::from_secs(60), "the ring drains", || async {
        if let Outcome::Published(r) = relay.run_pipeline().await.unwrap() {
            sent.set(sent.get() + r.sent);
        }
        count(&c, "SELECT count(*) FROM outbox WHERE status = 'pending'").await == 0
    })
    .await;
    assert_eq!(sent.get(), 3_002);
    assert!(matches!(relay.run_once().await.unwrap(), Outcome::Empty));

    let recs = read_all(&topic).await;
    assert_eq!(recs.len(), 3_002, "each row once");
    let got: std::collections::HashSet<String> = recs.iter().map(Record::message_id).collect();
    assert!(ids.iter().all(|id| got.contains(id)));
    for (key, seqs) in seqs_by_key(&recs) {
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{key}: {seqs:?}");
    }
    // Seed 002's operator statement reads the view.
    let st = c
        .query(
            "SELECT status, count(*) FROM outbox GROUP BY status ORDER BY status",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(st.len(), 1);
    assert_eq!(
        (st[0].get::<_, &str>(0), st[0].get::<_, i64>(1)),
        ("sent", 3_002)
    );
    let (ins, upd, del) = ring_writes(&c, 3_002).await;
    assert_eq!((ins, upd, del), (3_002, 0, 0), "inserted, updated, deleted");
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox_retry").await,
        0,
        "nothing needed a second attempt"
    );
}

#[tokio::test]
async fn a_refused_row_backs_off_in_the_retry_table_and_its_key_follows_it_there_in_order() {
    let (db, c) = ring_db().await;
    let topic = topic_name();
    create_topic(&topic, 3).await;
    let missing = topic_name(); // created later
                                // Key `m`: four rows to a topic that does not exist yet; keys k*: rows that flow.
    for seq in 0..4 {
        insert_seq(&c, &missing, "m", seq).await;
    }
    let good = enqueue_n(&db, &topic, 30, 5, 10).await;

    let mut cfg = relay_config();
    cfg.max_attempts = 5;
    let relay = Relay::new(&db, &kafka(), cfg).unwrap();
    let Outcome::Published(r) = relay.run_once().await.unwrap() else {
        panic!("nothing read")
    };
    assert_eq!((r.sent, r.backed_off), (30, 1), "{r:?}");
    assert_eq!(read_all(&topic).await.len(), good.len());
    // The head backed off with its error, the rows behind it wait, all in the retry table.
    let rows = c
        .query(
            "SELECT (payload->>'seq')::int, status, attempts, last_error IS NOT NULL
               FROM outbox WHERE message_key = 'm' ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    let seen: Vec<(i32, String, i32, bool)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        seen,
        vec![
            (0, "pending".into(), 1, true),
            (1, "pending".into(), 0, false),
            (2, "pending".into(), 0, false),
            (3, "pending".into(), 0, false),
        ]
    );
    assert_eq!(count(&c, "SELECT count(*) FROM outbox_retry").await, 4);
    // Rows of `m` written from now on queue behind them too, not ahead.
    insert_seq(&c, &missing, "m", 4).await;
    assert!(matches!(
        relay.run_once().await.unwrap(),
        Outcome::Empty | Outcome::Published(_)
    ));
    assert_eq!(count(&c, "SELECT count(*) FROM outbox_retry").await, 5);
    assert_eq!(
        topic_len(&missing).await,
        0,
        "nothing of m overtook its head"
    );

    // The topic appears and the head is due: the key goes out in order, and leaves the table.
    create_topic(&missing, 1).await;
    c.batch_execute("UPDATE outbox_retry SET available_at = now()")
        .await
        .unwrap();
    wait_until(Duration::from_secs(30), "m is published", || async {
        drain(&relay).await;
        count(&c, "SELECT count(*) FROM outbox_retry").await == 0
    })
    .await;
    let m: Vec<i64> = read_all(&missing)
        .await
        .iter()
        .map(|r| r.json()["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(m, vec![0, 1, 2, 3, 4]);
    let (_, upd, del) = ring_writes(&c, 35).await;
    assert_eq!((upd, del), (0, 0));
}

#[tokio::test]
async fn failed_rows_on_the_ring_are_requeued_by_seed_002s_update() {
    let (db, c) = ring_db().await;
    let missing = topic_name();
    insert_seq(&c, &missing, "f", 0).await;
    let mut cfg = relay_config();
    cfg.max_attempts = 1;
    let relay = Relay::new(&db, &kafka(), cfg).unwrap();
    drain(&relay).await;
    assert_eq!(
        texts(&c, "SELECT status FROM outbox").await,
        ["failed"],
        "one attempt allowed"
    );
    let st = outbox::status::status(&db).await.unwrap();
    assert_eq!((st.count("failed"), st.count("pending")), (1, 0));

    create_topic(&missing, 1).await;
    let n = c
        .execute(
            "UPDATE outbox SET status = 'pending', attempts = 0, available_at = now()
              WHERE status = 'failed'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    drain(&relay).await;
    assert_eq!(topic_len(&missing).await, 1);
    assert_eq!(count(&c, "SELECT count(*) FROM outbox_retry").await, 0);
    assert_eq!(texts(&c, "SELECT status FROM outbox").await, ["sent"]);
}

#[tokio::test]
async fn on_the_ring_a_row_committed_after_newer_rows_were_sent_is_published_once() {
    let (db, c) = ring_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let mut cfg = relay_config();
    cfg.long_transaction = Duration::from_secs(1);
    let relay = Relay::new(&db, &kafka(), cfg).unwrap();
    enqueue_n(&db, &topic, 5, 1, 5).await;
    drain(&relay).await;

    let (w, late) = open_writer(&db, &topic, -1).await;
    // Newer rows commit while it is open, and passes run; no cursor passes it while it has
    // been open less than `long_transaction` (1 s here; a writer open longer is passed and
    // listed: `a_writer_left_open_…`).
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_millis(700) {
        enqueue_n(&db, &topic, 2, 1, 2).await;
        relay.run_once().await.unwrap();
        let behind = count(
            &c,
            &format!("SELECT count(*) FROM outbox_lanes WHERE next_id > {late}"),
        )
        .await;
        assert_eq!(behind, 0, "a cursor passed an open transaction's row");
    }
    w.batch_execute("COMMIT").await.unwrap();
    drain(&relay).await;
    let recs = read_all(&topic).await;
    let late_recs = recs
        .iter()
        .filter(|r| r.key.as_deref() == Some(b"late".as_slice()))
        .count();
    assert_eq!(late_recs, 1);
    let written = count(&c, "SELECT count(*) FROM outbox_ring").await;
    assert_eq!(recs.len() as i64, written, "every row once");
}

#[tokio::test]
async fn rows_committed_while_a_writer_with_a_lower_id_is_open_go_out_at_once_and_only_once() {
    // The ring's cursors wait for the proof that no lower id is still to commit; the rows do
    // not: committed rows are read ahead of it, as the table sends any committed row. A
    // refused one cannot be copied into the retry table before its lane's cursor moves: it
    // is read again (and refused again) meanwhile, its key's later rows never ahead of it.
    let (db, c) = ring_db().await;
    let topic = topic_name();
    create_topic(&topic, 3).await;
    let missing = topic_name(); // created later
    let mut cfg = relay_config();
    cfg.max_attempts = 5;
    let relay = Relay::new(&db, &kafka(), cfg).unwrap();
    let (w, late) = open_writer(&db, &topic, 0).await;
    for seq in 0..3 {
        insert_seq(&c, &missing, "m", seq).await;
    }
    let good = enqueue_n(&db, &topic, 10, 5, 10).await;
    let Outcome::Published(r) = relay.run_once().await.unwrap() else {
        panic!("nothing read while a writer was open")
    };
    assert_eq!((r.sent, r.backed_off), (10, 1), "{r:?}");
    assert_eq!(topic_len(&topic).await, good.len() as i64);
    let behind = format!("SELECT count(*) FROM outbox_lanes WHERE next_id > {late}");
    assert_eq!(
        count(&c, &behind).await,
        0,
        "a cursor passed an open writer's row"
    );
    // A later row of `m`; more passes: nothing read ahead goes out twice, nothing of `m`
    // goes out or is copied while no cursor can move.
    insert_seq(&c, &missing, "m", 3).await;
    relay.run_once().await.unwrap();
    relay.run_once().await.unwrap();
    assert_eq!(topic_len(&topic).await, good.len() as i64, "nothing twice");
    assert_eq!(
        topic_len(&missing).await,
        0,
        "nothing of m overtook its head"
    );
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox_retry").await,
        0,
        "copied only with a cursor move"
    );
    assert_eq!(count(&c, &behind).await, 0);

    // The writer commits: its row goes, once; the cursors pass everything, `m` goes to the
    // retry table in order, its head backed off.
    w.batch_execute("COMMIT").await.unwrap();
    wait_until(Duration::from_secs(30), "m copied", || async {
        relay.run_once().await.unwrap();
        count(
            &c,
            "SELECT count(*) FROM outbox_retry WHERE message_key = 'm'",
        )
        .await
            == 4
    })
    .await;
    assert_eq!(topic_len(&missing).await, 0);
    create_topic(&missing, 1).await;
    c.batch_execute("UPDATE outbox_retry SET available_at = now()")
        .await
        .unwrap();
    wait_until(Duration::from_secs(30), "all published", || async {
        drain(&relay).await;
        count(&c, "SELECT count(*) FROM outbox WHERE status <> 'sent'").await == 0
    })
    .await;
    let recs = read_all(&topic).await;
    assert_eq!(recs.len(), good.len() + 1, "every row once");
    assert_eq!(seqs_by_key(&recs)["late"], vec![0]);
    let m: Vec<i64> = read_all(&missing)
        .await
        .iter()
        .map(|r| r.json()["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(m, vec![0, 1, 2, 3]);
    let (_, upd, del) = ring_writes(&c, 15).await;
    assert_eq!((upd, del), (0, 0));
}

/// Cleanup with no retention: on the ring, one rotation.
async fn rotate(db: &outbox::DbConfig) -> outbox::CleanupReport {
    let mut cc = outbox::CleanupConfig::default();
    cc.interval = None;
    cc.sent_retention = Duration::ZERO;
    outbox::cleanup(db, &cc).await.unwrap()
}

#[tokio::test]
async fn rotation_moves_generations_and_reclaims_only_leaves_the_relays_have_read() {
    let (db, c) = ring_db().await;
    let topic = topic_name();
    create_topic(&topic, 3).await;
    let leaf_rows = "SELECT gen::int, count(*)::int FROM outbox_ring GROUP BY gen ORDER BY gen";
    let leaves = |rows: Vec<tokio_postgres::Row>| -> Vec<(i32, i32)> {
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    };
    enqueue_n(&db, &topic, 100, 10, 20).await;
    // Leaf 0 is current: it stays; the generation moves on.
    let r = rotate(&db).await;
    assert_eq!(
        (
            r.generations_reclaimed,
            r.generation_advanced,
            r.outbox_deleted
        ),
        (0, true, 0)
    );
    // Leaf 0 is old enough but unread: it stays.
    let r = rotate(&db).await;
    assert_eq!((r.generations_reclaimed, r.generation_advanced), (0, true));
    assert_eq!(leaves(c.query(leaf_rows, &[]).await.unwrap()), [(0, 100)]);
    enqueue_n(&db, &topic, 50, 10, 25).await;
    assert_eq!(
        leaves(c.query(leaf_rows, &[]).await.unwrap()),
        [(0, 100), (2, 50)]
    );

    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 150);
    // Read, and not current: leaf 0 goes whole, leaf 2 (current) stays.
    let r = rotate(&db).await;
    assert_eq!((r.generations_reclaimed, r.generation_advanced), (1, true));
    assert_eq!(leaves(c.query(leaf_rows, &[]).await.unwrap()), [(2, 50)]);
    let r = rotate(&db).await;
    assert_eq!(r.generations_reclaimed, 1);
    assert_eq!(count(&c, "SELECT count(*) FROM outbox_ring").await, 0);
    assert_eq!(read_all(&topic).await.len(), 150, "each row once");
    // The ring goes round: new rows land in a reused leaf and are published.
    for _ in 0..8 {
        rotate(&db).await;
    }
    enqueue_n(&db, &topic, 10, 10, 10).await;
    assert_eq!(drain(&relay).await, 10);
    assert_eq!(read_all(&topic).await.len(), 160);
    let (_, upd, del) = ring_writes(&c, 160).await;
    assert_eq!(
        (upd, del),
        (0, 0),
        "rows are reclaimed by TRUNCATE, never deleted"
    );
}

#[tokio::test]
async fn a_kill_9_at_each_step_of_a_rotation_loses_nothing_and_the_next_run_finishes_it() {
    let (db, c) = ring_db().await;
    let topic = topic_name();
    create_topic(&topic, 3).await;
    enqueue_n(&db, &topic, 40, 4, 10).await;
    rotate(&db).await; // generation 0 → 1
    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 40);
    let gen = "SELECT gen::bigint FROM outbox_generation";
    for (point, leaf_after, gen_after) in [
        ("rotate_locked", 40, 1),
        ("rotate_truncated", 40, 1),
        ("rotate_advanced", 0, 2),
    ] {
        let out = outbox_command(&db)
            .args(["cleanup", "--sent-retention", "0s"])
            .env("OUTBOX_CRASH_AT", point)
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "{point}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(&format!("OUTBOX_CRASH_AT={point}")),
            "{point}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            count(&c, "SELECT count(*) FROM outbox_ring_0").await,
            leaf_after,
            "{point}: the leaf is whole or gone, never in between"
        );
        assert_eq!(count(&c, gen).await, gen_after, "{point}");
    }
    // The cursor log's swap: killed with the inactive half truncated (not committed: the half
    // is whole again) or after the flip, every lane keeps its position.
    let positions =
        "SELECT string_agg(lane || ':' || next_id, ',' ORDER BY lane) FROM outbox_lanes";
    let before = texts(&c, positions).await;
    for point in ["cursors_truncated", "cursors_flipped"] {
        let out = outbox_command(&db)
            .args(["cleanup", "--sent-retention", "0s"])
            .env("OUTBOX_CRASH_AT", point)
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(&format!("OUTBOX_CRASH_AT={point}")),
            "{point}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(texts(&c, positions).await, before, "{point}");
    }
    // Nothing was published twice or lost, and a run without the hook goes on from there.
    let out = outbox_command(&db)
        .args(["cleanup", "--sent-retention", "0s"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ring storage:"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    enqueue_n(&db, &topic, 5, 4, 5).await;
    assert_eq!(drain(&relay).await, 5);
    assert_eq!(read_all(&topic).await.len(), 45);
}

#[tokio::test]
async fn a_reclaim_never_waits_long_on_a_reader_and_never_blocks_an_insert() {
    let (db, c) = ring_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    enqueue_n(&db, &topic, 10, 2, 10).await;
    rotate(&db).await; // generation 0 → 1
    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 10);
    // A reader holds leaf 0 (as a relay's open batch does): the reclaim gives up in 50 ms.
    let reader = client(&db).await;
    reader
        .batch_execute("BEGIN; SELECT count(*) FROM outbox_ring_0")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let r = rotate(&db).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!((r.generations_reclaimed, r.generations_busy), (0, 1));
    reader.batch_execute("COMMIT").await.unwrap();
    // While a reclaim holds its lock, the services write the current leaf without waiting on
    // it: through both enqueue paths (bounded here, so a wait fails the test, not hangs it).
    let locker = client(&db).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE outbox_ring_0 IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), enqueue_n(&db, &topic, 2, 1, 2))
        .await
        .expect("enqueue waited on a leaf being reclaimed");
    let w = client(&db).await;
    w.batch_execute(&format!(
        "SET lock_timeout = '1s';
         INSERT INTO outbox (topic, message_key, payload) VALUES ('{topic}', 'w', '{{}}')"
    ))
    .await
    .expect("plain-SQL insert waited on a leaf being reclaimed");
    locker.batch_execute("ROLLBACK").await.unwrap();
    let r = rotate(&db).await;
    assert_eq!(r.generations_reclaimed, 1);
    assert_eq!(drain(&relay).await, 3);
    assert_eq!(read_all(&topic).await.len(), 13);
    drop(c);
}

#[tokio::test]
async fn pipelined_batches_with_due_retry_rows_send_each_ring_row_once() {
    let (db, c) = ring_db().await;
    let topic = topic_name();
    create_topic(&topic, 3).await;
    let missing = topic_name();
    // Key `r`: a head refused (its topic is missing) and 29 rows behind it, all in the retry
    // table.
    for seq in 0..30 {
        insert_seq(&c, &missing, "r", seq).await;
    }
    let mut cfg = relay_config();
    cfg.batch_size = 20;
    cfg.in_flight_batches = 3;
    let relay = Relay::new(&db, &kafka(), cfg).unwrap();
    while let Outcome::Published(_) = relay.run_once().await.unwrap() {}
    assert_eq!(count(&c, "SELECT count(*) FROM outbox_retry").await, 30);
    create_topic(&missing, 1).await;
    c.batch_execute("UPDATE outbox_retry SET available_at = now()")
        .await
        .unwrap();
    // A short ring read beside a full batch of retry rows: the batch is full, the pipeline
    // claims the next one while it is in flight, and that one must not read the same ring
    // rows again. The first batch's settle is held (its DELETE from the retry table waits on
    // a lock) until the second has produced, so the second surely ran while the first was in
    // flight.
    let ids = enqueue_n(&db, &topic, 10, 5, 10).await;
    let locker = client(&db).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE outbox_retry IN SHARE MODE")
        .await
        .unwrap();
    let relay = std::sync::Arc::new(relay);
    let pass = tokio::spawn({
        let relay = relay.clone();
        async move { relay.run_pipeline().await.unwrap() }
    });
    wait_until(
        Duration::from_secs(30),
        "both batches produced while the first waits to settle",
        || async { topic_len(&missing).await >= 30 },
    )
    .await;
    locker.batch_execute("COMMIT").await.unwrap();
    pass.await.unwrap();
    wait_until(
        Duration::from_secs(60),
        "everything is published",
        || async {
            relay.run_pipeline().await.unwrap();
            count(&c, "SELECT count(*) FROM outbox WHERE status <> 'sent'").await == 0
        },
    )
    .await;
    let recs = read_all(&topic).await;
    let got: Vec<String> = recs.iter().map(Record::message_id).collect();
    let unique: std::collections::HashSet<&String> = got.iter().collect();
    assert_eq!(
        (got.len(), unique.len()),
        (ids.len(), ids.len()),
        "each once"
    );
    let r: Vec<i64> = read_all(&missing)
        .await
        .iter()
        .map(|r| r.json()["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(r, (0..30).collect::<Vec<i64>>(), "key r in order, once");
}

#[tokio::test]
async fn moving_a_schema_onto_the_ring_by_plain_sql_carries_its_unsent_rows_and_a_second_call_does_nothing(
) {
    // The online move with relays running is `upgrade.rs`; here the SQL function alone.
    let db = fresh_db().await;
    let c = client(&db).await;
    let topic = topic_name();
    insert_seq(&c, &topic, "u", 0).await;
    let carried: Option<i64> = c
        .query_one("SELECT outbox_use_ring()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(carried, Some(1));
    let again: Option<i64> = c
        .query_one("SELECT outbox_use_ring()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(again, None, "already moved: nothing done");
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox WHERE status = 'pending'").await,
        1
    );
    assert_eq!(count(&c, "SELECT count(*) FROM outbox_retry").await, 1);
}

#[tokio::test]
async fn a_writer_left_open_does_not_stop_publishing_and_its_rows_go_out_once_after_it_commits() {
    let (db, c) = ring_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    // A service's transaction writes a row and stays open (a forgotten BEGIN).
    let mut late = client(&db).await;
    let open = late.transaction().await.unwrap();
    insert_seq(&open, &topic, "late", 0).await;
    // Rows written after it, some of its key: its lane's cursor moves past its row (an idle
    // lane's would not, and the row would simply be read once it commits).
    for i in 1..=20 {
        let key = if i % 2 == 0 {
            "late".to_owned()
        } else {
            format!("k{i}")
        };
        insert_seq(&c, &topic, &key, i).await;
    }
    let mut cfg = relay_config();
    cfg.long_transaction = Duration::from_secs(1);
    let relay = Relay::new(&db, &kafka(), cfg).unwrap();
    // The 20 rows written after it go out (read ahead of the proof); once it has been open
    // longer than `long_transaction`, the relay passes it: it is listed.
    wait_until(
        Duration::from_secs(20),
        "the rows after the open writer published, and the writer passed",
        || async {
            relay.run_once().await.unwrap();
            topic_len(&topic).await == 20
                && count(&c, "SELECT count(*) FROM outbox_passed").await > 0
        },
    )
    .await;
    assert_eq!(
        count(&c, "SELECT count(DISTINCT xid) FROM outbox_passed").await,
        1
    );
    assert_eq!(
        relay.sweep().await.unwrap(),
        None,
        "still open: nothing to copy"
    );
    open.commit().await.unwrap();
    // Its row is now below its lane's cursor. While it is listed, rotation reclaims nothing:
    // the leaf holding that row must stay until the row is copied.
    rotate(&db).await;
    let r = rotate(&db).await;
    assert_eq!(r.generations_reclaimed, 0, "{r:?}");
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM outbox_ring WHERE payload->>'seq' = '0'"
        )
        .await,
        1
    );
    // The sweep sends it through the retry table, once.
    assert_eq!(relay.sweep().await.unwrap(), Some(0));
    assert_eq!(
        relay.sweep().await.unwrap(),
        None,
        "a second sweep copies nothing"
    );
    wait_until(
        Duration::from_secs(20),
        "the late row published",
        || async {
            relay.run_once().await.unwrap();
            topic_len(&topic).await == 21
        },
    )
    .await;
    assert!(matches!(relay.run_once().await.unwrap(), Outcome::Empty));
    let recs = read_all(&topic).await;
    assert_eq!(recs.len(), 21, "each row once");
    assert_eq!(recs.iter().filter(|r| r.json()["seq"] == 0).count(), 1);
    assert_eq!(count(&c, "SELECT count(*) FROM outbox_passed").await, 0);
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox WHERE status <> 'sent'").await,
        0
    );
    // Nothing is listed any more: rotation reclaims the leaf.
    assert!(rotate(&db).await.generations_reclaimed >= 1);
}

/// A key whose lane (`hashtext(key) & 63`) differs from `other`'s.
async fn key_off_the_lane_of(c: &tokio_postgres::Client, other: &str) -> String {
    for i in 0.. {
        let key = format!("idle-{i}");
        let r = c
            .query_one(
                "SELECT (hashtext($1) & 63) <> (hashtext($2) & 63)",
                &[&key, &other],
            )
            .await
            .unwrap();
        if r.get::<_, bool>(0) {
            return key;
        }
    }
    unreachable!()
}

/// The same open writer with a row in a lane nothing else writes to: an idle lane keeps its
/// cursor below that row, so the row is read once its writer commits. The sweep once copied
/// every row of a passed writer below the cursors at the time it ran — this one too, after it
/// had been read: published twice.
#[tokio::test]
async fn a_passed_writer_with_a_row_in_an_idle_lane_is_published_once() {
    let (db, c) = ring_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let idle = key_off_the_lane_of(&c, "busy").await;
    let mut late = client(&db).await;
    let open = late.transaction().await.unwrap();
    insert_seq(&open, &topic, "busy", 0).await;
    insert_seq(&open, &topic, &idle, 1).await;
    for i in 2..22 {
        insert_seq(&c, &topic, "busy", i).await;
    }
    let mut cfg = relay_config();
    cfg.long_transaction = Duration::from_secs(1);
    let relay = Relay::new(&db, &kafka(), cfg).unwrap();
    wait_until(
        Duration::from_secs(20),
        "the rows after the open writer published",
        || async {
            relay.run_once().await.unwrap();
            topic_len(&topic).await == 20
        },
    )
    .await;
    open.commit().await.unwrap();
    // The relay reads what it reads, then the sweep runs, then the relay again (the sweep runs
    // on its own interval: this order happens).
    while !matches!(relay.run_once().await.unwrap(), Outcome::Empty) {}
    relay.sweep().await.unwrap();
    while !matches!(relay.run_once().await.unwrap(), Outcome::Empty) {}
    relay.sweep().await.unwrap();
    while !matches!(relay.run_once().await.unwrap(), Outcome::Empty) {}
    assert_eq!(count(&c, "SELECT count(*) FROM outbox_passed").await, 0);
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox WHERE status <> 'sent'").await,
        0
    );
    let recs = read_all(&topic).await;
    let seqs = seqs_by_key(&recs);
    assert_eq!(seqs[&idle], [1], "the idle lane's row once: {seqs:?}");
    assert_eq!(
        seqs["busy"],
        (2..22).chain([0]).collect::<Vec<i64>>(),
        "the busy lane's rows once each (the passed writer's after the others: it went out \
         through the retry table)"
    );
}

#[tokio::test]
async fn a_trickle_of_one_row_batches_moves_only_the_lanes_it_touches() {
    // Each settle used to move all 64 lanes' cursors: 64 updated rows per batch, and as many
    // dead tuples while a snapshot is held. Now a batch with no pipelining moves the lanes it
    // read rows of (an idle lane only once it lags by more than a few hundred ids).
    let (db, c) = ring_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    for i in 0..40 {
        insert_seq(&c, &topic, "one-key", i).await;
        assert!(matches!(
            relay.run_once().await.unwrap(),
            Outcome::Published(_)
        ));
    }
    assert_eq!(topic_len(&topic).await, 40);
    let updated = std::cell::Cell::new(0);
    wait_until(Duration::from_secs(20), "lanes statistics", || async {
        c.batch_execute("SELECT pg_stat_clear_snapshot()")
            .await
            .unwrap();
        updated.set(
            count(
                &c,
                "SELECT coalesce(sum(n_tup_ins), 0)::bigint FROM pg_stat_user_tables
                  WHERE relid IN (SELECT relid FROM pg_partition_tree('outbox_cursor_log'))",
            )
            .await,
        );
        updated.get() >= 2 * 64 + 40
    })
    .await;
    // 40 batches of one lane each (the migration and the move onto the ring wrote an entry
    // per lane before).
    assert!(
        updated.get() <= 2 * 64 + 48,
        "{} cursor moves",
        updated.get()
    );
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox WHERE status <> 'sent'").await,
        0
    );
}

#[tokio::test]
async fn a_full_first_batch_moves_every_lane_so_the_batch_read_past_it_can_settle() {
    // A first batch (nothing in flight before it) that is full has the next batch read past
    // it before it settles. Had it kept an idle lane's cursor, that next batch would find the
    // lane short of where it started reading, leave it, and send its rows again.
    let (db, c) = ring_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    for i in 0..5 {
        insert_seq(&c, &topic, "a", i).await;
    }
    for i in 5..8 {
        insert_seq(&c, &topic, "m", i).await;
    }
    let mut cfg = relay_config();
    cfg.batch_size = 5;
    cfg.in_flight_batches = 2;
    let relay = Relay::new(&db, &kafka(), cfg).unwrap();
    wait_until(Duration::from_secs(20), "drained", || async {
        relay.run_pipeline().await.unwrap();
        count(&c, "SELECT count(*) FROM outbox WHERE status <> 'sent'").await == 0
    })
    .await;
    for _ in 0..3 {
        relay.run_pipeline().await.unwrap();
    }
    let recs = read_all(&topic).await;
    assert_eq!(recs.len(), 8, "each row once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_relay_with_writers_committing_alongside_sends_every_row_once_in_key_order() {
    // The steady state a service sees: transactions commit while the relay's loop runs, so
    // most batches come back short (read up to what their sample proved committed), pipeline
    // behind one another, and read past lanes the batch before them kept or moved. Small
    // batches and three in flight make every case frequent. Each key is written by one writer,
    // in `seq` order, so its records must come out in that order.
    let (db, c) = ring_db().await;
    let topic = topic_name();
    create_topic(&topic, 3).await;
    let mut cfg = relay_config();
    cfg.batch_size = 7;
    cfg.in_flight_batches = 3;
    let relay = Relay::new(&db, &kafka(), cfg).unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(async move {
        let _ = stop_rx.await;
    }));
    const WRITERS: i32 = 4;
    const PER_WRITER: i32 = 300;
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (db, topic) = (db.clone(), topic.clone());
        writers.push(tokio::spawn(async move {
            let mut c = client(&db).await;
            for seq in 0..PER_WRITER {
                // 1 – 3 rows a transaction, over 16 keys of this writer's own.
                let tx = c.transaction().await.unwrap();
                for k in 0..=(seq % 3) {
                    let key = format!("w{w}-k{}", (seq * 3 + k) % 16);
                    insert_seq(&tx, &topic, &key, seq * 3 + k).await;
                }
                tx.commit().await.unwrap();
                if seq % 50 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let written = count(&c, "SELECT count(*) FROM outbox_ring").await;
    assert_eq!(written, i64::from(WRITERS) * i64::from(PER_WRITER) * 2);
    wait_until(
        Duration::from_secs(60),
        "every row reaches Kafka",
        || async { topic_len(&topic).await >= written },
    )
    .await;
    let _ = stop_tx.send(());
    running.await.unwrap().unwrap();
    let recs = read_all(&topic).await;
    assert_eq!(recs.len() as i64, written, "each row once");
    for (key, seqs) in seqs_by_key(&recs) {
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{key}: {seqs:?}");
    }
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox WHERE status <> 'sent'").await,
        0
    );
    assert_eq!(count(&c, "SELECT count(*) FROM outbox_retry").await, 0);
}

/// A service's INSERT through the view reads the generation in its own statement
/// (`V29__ring_insert_gen.sql`), not through the ring's DEFAULT function, which Postgres parsed
/// and planned again at every INSERT; the rows still land in the generation in use, before and
/// after a rotation moves it.
#[tokio::test]
async fn an_insert_through_the_view_reads_its_generation_without_a_function_call() {
    let (db, c) = ring_db().await;
    let sql = "INSERT INTO outbox (topic, message_key, headers, payload)
               VALUES ('t', 'k', '{}', '{\"n\": 1}')";
    let plan: Vec<String> = c
        .query(&format!("EXPLAIN VERBOSE {sql}"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let plan = plan.join("\n");
    assert!(plan.contains("outbox_generation"), "{plan}");
    assert!(!plan.contains("outbox_current_gen"), "{plan}");
    let s = db.schema.quoted();
    for next in [1i16, 2] {
        c.batch_execute(sql).await.unwrap();
        c.execute(
            &format!("UPDATE {s}.outbox_generation SET gen = $1"),
            &[&next],
        )
        .await
        .unwrap();
    }
    c.batch_execute(sql).await.unwrap();
    let gens: Vec<i16> = c
        .query(&format!("SELECT gen FROM {s}.outbox_ring ORDER BY id"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(gens, [0, 1, 2]);
}
