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

/// Every record's `seq` by key, in topic order.
fn seqs_by_key(recs: &[Record]) -> HashMap<String, Vec<i64>> {
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
        c.execute(
            "INSERT INTO outbox (topic, message_key, headers, payload)
             VALUES ($1, 'm', '{\"message_type\":\"t\"}', jsonb_build_object('seq', $2::int))",
            &[&missing, &seq],
        )
        .await
        .unwrap();
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
    c.execute(
        "INSERT INTO outbox (topic, message_key, headers, payload)
         VALUES ($1, 'm', '{\"message_type\":\"t\"}', '{\"seq\": 4}')",
        &[&missing],
    )
    .await
    .unwrap();
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
    c.execute(
        "INSERT INTO outbox (topic, message_key, headers, payload)
         VALUES ($1, 'f', '{\"message_type\":\"t\"}', '{\"seq\": 0}')",
        &[&missing],
    )
    .await
    .unwrap();
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

    let w = client(&db).await;
    w.batch_execute("BEGIN").await.unwrap();
    let late: i64 = w
        .query_one(
            "INSERT INTO outbox (topic, message_key, payload) VALUES ($1, 'late', '{\"seq\": -1}')
             RETURNING id",
            &[&topic],
        )
        .await
        .unwrap()
        .get(0);
    // Newer rows commit while it is open, and passes run; no cursor passes it (today's
    // `long_transaction` escape hatch is off on the ring: 1 s here).
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
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
