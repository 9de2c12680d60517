//! The relay against real Postgres and Kafka: enqueue paths, rollback, bad rows, two relays.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use outbox::{enqueue, Enqueuer, Message, Outcome, Relay};
use outbox_testkit::*;

#[tokio::test]
async fn committed_enqueue_publishes_exactly_one_message_with_key_headers_and_body() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 3).await;
    let mut c = client(&db).await;

    let msg = Message::new(
        &topic,
        "order_created",
        "A-1024",
        serde_json::json!({"items": 3, "total": 1500}),
    )
    .with_header(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    );
    let tx = c.transaction().await.unwrap();
    // The free function resolves `outbox` through search_path, like plain SQL does.
    enqueue(&tx, &msg).await.unwrap();
    tx.commit().await.unwrap();

    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 1);
    assert!(matches!(relay.run_once().await.unwrap(), Outcome::Empty));

    let recs = read_all(&topic).await;
    assert_eq!(recs.len(), 1, "exactly one message");
    let r = &recs[0];
    assert_eq!(r.key.as_deref(), Some(&b"A-1024"[..]));
    assert_eq!(r.headers["message_type"], "order_created");
    assert_eq!(r.headers["entity_id"], "A-1024");
    assert_eq!(r.headers["message_id"], msg.message_id().to_string());
    assert_eq!(
        uuid::Uuid::parse_str(&r.headers["message_id"])
            .unwrap()
            .get_version_num(),
        7
    );
    let ts = &r.headers["timestamp"];
    assert!(
        ts.ends_with('Z') && humantime::parse_rfc3339(ts).is_ok(),
        "timestamp {ts}"
    );
    assert!(r.headers["traceparent"].starts_with("00-4bf9"));
    assert_eq!(r.json(), serde_json::json!({"items": 3, "total": 1500}));

    let sent = count(
        &c,
        "SELECT count(*) FROM outbox WHERE status = 'sent' AND sent_at IS NOT NULL",
    )
    .await;
    assert_eq!(sent, 1);
}

#[tokio::test]
async fn batch_enqueue_keeps_order_and_keyless_must_be_explicit() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let mut c = client(&db).await;
    let enq = Enqueuer::new(&db.schema);
    let msgs: Vec<_> = (0..50)
        .map(|i| Message::new(&topic, "t", "same-key", serde_json::json!({"seq": i})))
        .collect();
    let tx = c.transaction().await.unwrap();
    assert_eq!(enq.enqueue_batch(&tx, &msgs).await.unwrap(), 50);
    enq.enqueue(
        &tx,
        &Message::keyless(&topic, "t", serde_json::json!({"seq": 50})),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 51);
    let recs = read_all(&topic).await;
    let seqs: Vec<i64> = recs
        .iter()
        .map(|r| r.json()["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, (0..51).collect::<Vec<_>>());
    assert!(recs[50].key.is_none());
    assert!(!recs[50].headers.contains_key("entity_id"));
}

#[tokio::test]
async fn rolled_back_enqueue_publishes_nothing() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let mut c = client(&db).await;
    let enq = Enqueuer::new(&db.schema);

    let tx = c.transaction().await.unwrap();
    enq.enqueue(
        &tx,
        &Message::new(&topic, "t", "rolled", serde_json::json!({"n": 1})),
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    {
        // Dropped without commit: rolled back too.
        let tx = c.transaction().await.unwrap();
        enq.enqueue(
            &tx,
            &Message::new(&topic, "t", "dropped", serde_json::json!({"n": 2})),
        )
        .await
        .unwrap();
    }
    let tx = c.transaction().await.unwrap();
    enq.enqueue(
        &tx,
        &Message::new(&topic, "t", "committed", serde_json::json!({"n": 3})),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 1);
    let recs = read_all(&topic).await;
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].key.as_deref(), Some(&b"committed"[..]));
    assert_eq!(count(&c, "SELECT count(*) FROM outbox").await, 1);
}

#[tokio::test]
async fn invalid_messages_are_refused_and_nothing_is_written() {
    let db = fresh_db().await;
    let mut c = client(&db).await;
    let enq = Enqueuer::new(&db.schema);
    let tx = c.transaction().await.unwrap();
    let ok = Message::new("orders.created", "t", "k", serde_json::json!({}));
    for (bad, what) in [
        (
            Message::new("orders.created_v2", "t", "k", serde_json::json!({})),
            "mixes",
        ),
        (
            Message::new("orders created", "t", "k", serde_json::json!({})),
            "only ASCII",
        ),
        (Message::new("", "t", "k", serde_json::json!({})), "empty"),
        (
            Message::new("a".repeat(250), "t", "k", serde_json::json!({})),
            "249",
        ),
        (
            Message::new("orders.created", "", "k", serde_json::json!({})),
            "message_type",
        ),
        (
            Message::new("orders.created", "t", "", serde_json::json!({})),
            "keyless",
        ),
        (
            ok.clone().with_header("message_id", "forged"),
            "cannot be overridden",
        ),
    ] {
        let e = enq.enqueue(&tx, &bad).await.unwrap_err();
        assert!(e.to_string().contains(what), "{e} should mention {what}");
        assert!(!e.is_transient());
        // A batch with one bad message writes none of them.
        let e = enq
            .enqueue_batch(&tx, &[ok.clone(), bad])
            .await
            .unwrap_err();
        assert!(e.to_string().contains(what));
    }
    tx.commit().await.unwrap();
    assert_eq!(count(&c, "SELECT count(*) FROM outbox").await, 0);
}

#[tokio::test]
async fn plain_sql_enqueue_from_sql_dir_is_delivered() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let c = client(&db).await;
    c.batch_execute("CREATE TABLE orders (order_number text, total int, status text)")
        .await
        .unwrap();
    let script = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/enqueue.sql"))
        .unwrap()
        .replace("'orders.created'", &format!("'{topic}'"));
    c.batch_execute(&script).await.unwrap();

    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 1);
    let recs = read_all(&topic).await;
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    assert_eq!(r.key.as_deref(), Some(&b"A-1024"[..]));
    assert_eq!(r.headers["message_type"], "order_created");
    assert_eq!(r.headers["entity_id"], "A-1024");
    assert_eq!(
        uuid::Uuid::parse_str(&r.headers["message_id"])
            .unwrap()
            .get_version_num(),
        7
    );
    assert!(
        humantime::parse_rfc3339(&r.headers["timestamp"]).is_ok(),
        "{}",
        r.headers["timestamp"]
    );
    assert_eq!(r.json()["total"], 1500);
    assert_eq!(count(&c, "SELECT count(*) FROM orders").await, 1);
}

#[tokio::test]
async fn commit_wakes_the_relay_through_notify_for_both_enqueue_paths() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    // Polling once an hour: only the trigger's notification can make delivery quick.
    let cfg = {
        let mut c = relay_config();
        c.poll_interval = Duration::from_secs(3600);
        c
    };
    let relay = Relay::new(&db, &kafka(), cfg).unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(async move {
        let _ = stop_rx.await;
    }));
    // Let the relay's first (empty) pass and its LISTEN happen before enqueueing.
    let lc = client(&db).await;
    wait_until(Duration::from_secs(10), "relay LISTENs", || {
        let lc = &lc;
        let ch = db.schema.notify_channel();
        async move {
            count(
                lc,
                &format!("SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN \"{ch}\"'"),
            )
            .await
                > 0
        }
    })
    .await;

    let mut c = client(&db).await;
    let tx = c.transaction().await.unwrap();
    enqueue(
        &tx,
        &Message::new(&topic, "t", "lib", serde_json::json!({})),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    wait_until(
        Duration::from_secs(10),
        "library enqueue delivered",
        || async { topic_len(&topic).await == 1 },
    )
    .await;

    c.batch_execute(&format!(
        "INSERT INTO outbox (topic, message_key, headers, payload) VALUES ('{topic}', 'sql', \
         jsonb_build_object('message_type','t','entity_id','sql','message_id', outbox_uuidv7()::text, \
         'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')), '{{}}')"
    ))
    .await
    .unwrap();
    wait_until(
        Duration::from_secs(10),
        "plain SQL enqueue delivered",
        || async { topic_len(&topic).await == 2 },
    )
    .await;

    stop_tx.send(()).unwrap();
    running.await.unwrap().unwrap();
}

#[tokio::test]
async fn unknown_topic_and_oversize_rows_back_off_then_fail_while_others_flow() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 3).await;
    let missing = topic_name(); // never created
    let c = client(&db).await;
    let big = "x".repeat(1_200_000); // > librdkafka's and the broker's default maximum (~1 MB)
    c.execute(
        "INSERT INTO outbox (topic, message_key, headers, payload) VALUES \
         ($1, 'm', '{\"message_type\":\"t\"}', '{}'), ($2, 'b', '{\"message_type\":\"t\"}', jsonb_build_object('big', $3::text))",
        &[&missing, &topic, &big],
    )
    .await
    .unwrap();
    let good = enqueue_n(&db, &topic, 20, 5, 20).await;

    let max_attempts = 3;
    let cfg = {
        let mut c = relay_config();
        c.max_attempts = max_attempts;
        c
    };
    let relay = Relay::new(&db, &kafka(), cfg).unwrap();
    let clock = "SELECT extract(epoch FROM clock_timestamp())::float8";
    let before: f64 = c.query_one(clock, &[]).await.unwrap().get(0);
    let Outcome::Published(r) = relay.run_once().await.unwrap() else {
        panic!("nothing claimed")
    };
    let after: f64 = c.query_one(clock, &[]).await.unwrap().get(0);
    assert_eq!(
        (r.claimed, r.sent, r.backed_off, r.deferred),
        (22, 20, 2, 0)
    );
    // The good rows went through in the same pass.
    let got: HashSet<String> = read_all(&topic)
        .await
        .iter()
        .map(Record::message_id)
        .collect();
    assert_eq!(got, good.iter().cloned().collect());

    // First failure: attempts 1, readable error, available_at = the mark's time + 1 s (±25 %
    // jitter); the mark happened between `before` and `after`.
    let rows = c
        .query(
            "SELECT message_key, attempts, status, last_error, \
             extract(epoch FROM available_at)::float8 FROM outbox WHERE status <> 'sent' ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 2);
    for row in &rows {
        assert_eq!(row.get::<_, i32>(1), 1);
        assert_eq!(row.get::<_, &str>(2), "pending");
        let due: f64 = row.get(4);
        assert!(
            due - before >= 0.75 && due - after <= 1.25,
            "first backoff: due {:.3} s after the pass began, {:.3} s after it ended",
            due - before,
            due - after
        );
    }
    let err_missing: &str = rows[0].get(3);
    let err_big: &str = rows[1].get(3);
    assert!(err_missing.contains("does not exist"), "{err_missing}");
    assert!(err_big.contains("too large"), "{err_big}");
    assert!(err_big.len() <= outbox::Relay::MAX_ERROR_LEN);

    // Not due yet: the next pass claims nothing.
    assert!(matches!(relay.run_once().await.unwrap(), Outcome::Empty));

    // Make them due (instead of sleeping) and fail them to the maximum.
    for attempt in 2..=max_attempts {
        c.batch_execute("UPDATE outbox SET available_at = now() WHERE status = 'pending'")
            .await
            .unwrap();
        let Outcome::Published(r) = relay.run_once().await.unwrap() else {
            panic!("nothing claimed")
        };
        assert_eq!(r.backed_off, 2, "attempt {attempt}");
        if attempt == 2 {
            let delay: f64 = c
                .query_one("SELECT min(extract(epoch FROM available_at - now()))::float8 FROM outbox WHERE status = 'pending'", &[])
                .await
                .unwrap()
                .get(0);
            assert!((1.2..=2.6).contains(&delay), "second backoff {delay}");
        }
    }
    let failed = c
        .query(
            "SELECT attempts, last_error FROM outbox WHERE status = 'failed' ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(failed.len(), 2);
    assert!(failed.iter().all(|r| r.get::<_, i32>(0) == max_attempts));
    c.batch_execute("UPDATE outbox SET available_at = now()")
        .await
        .unwrap();
    assert!(
        matches!(relay.run_once().await.unwrap(), Outcome::Empty),
        "failed rows are not retried"
    );

    let st = outbox::status::status(&db).await.unwrap();
    assert_eq!(
        (st.count("sent"), st.count("failed"), st.count("pending")),
        (20, 2, 0)
    );
    assert_eq!(st.failed_by_error.len(), 2);
}

#[tokio::test]
async fn broker_side_size_limit_is_reported_too() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let c = client(&db).await;
    c.execute(
        "INSERT INTO outbox (topic, message_key, headers, payload) VALUES ($1, 'b', '{}', jsonb_build_object('big', $2::text))",
        &[&topic, &"y".repeat(1_500_000)],
    )
    .await
    .unwrap();
    let mut k = kafka();
    // Let the client send it so the broker (message.max.bytes ≈ 1 MB) is the one that refuses.
    k.set_from_pair("message.max.bytes=10000000").unwrap();
    let relay = Relay::new(&db, &k, relay_config()).unwrap();
    let Outcome::Published(r) = relay.run_once().await.unwrap() else {
        panic!()
    };
    assert_eq!(r.backed_off, 1);
    let err: String = c
        .query_one("SELECT last_error FROM outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert!(err.to_lowercase().contains("too large"), "{err}");
}

#[tokio::test]
async fn garbage_headers_and_invalid_topic_rows_from_plain_sql_fail_cleanly() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let c = client(&db).await;
    c.execute(
        "INSERT INTO outbox (topic, message_key, headers, payload) VALUES \
         ($1, 'a', '[1,2]', '{}'), ('bad topic; drop table outbox', 'b', '{}', '{}'), \
         ($1, 'c', '{\"n\": 5, \"s\": \"x\", \"z\": null}', '\"just a string\"')",
        &[&topic],
    )
    .await
    .unwrap();
    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    let Outcome::Published(r) = relay.run_once().await.unwrap() else {
        panic!()
    };
    assert_eq!((r.sent, r.backed_off), (1, 2));
    let errs = texts(
        &c,
        "SELECT last_error FROM outbox WHERE status <> 'sent' ORDER BY id",
    )
    .await;
    assert!(errs[0].contains("JSON object"), "{}", errs[0]);
    assert!(errs[1].contains("invalid topic name"), "{}", errs[1]);
    let recs = read_all(&topic).await;
    assert_eq!(recs[0].headers["n"], "5");
    assert_eq!(recs[0].headers["s"], "x");
    assert_eq!(recs[0].json(), serde_json::json!("just a string"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_relays_over_20000_rows_send_each_exactly_once() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 6).await;
    let ids = enqueue_n(&db, &topic, 20_000, 1000, 1000).await;

    let cfg = {
        let mut c = relay_config();
        c.batch_size = 500;
        c
    };
    let relays = [
        Arc::new(Relay::new(&db, &kafka(), cfg.clone()).unwrap()),
        Arc::new(Relay::new(&db, &kafka(), cfg).unwrap()),
    ];
    // Converge lane ownership first (normally every rebalance interval): each takes half.
    for _ in 0..2 {
        for r in &relays {
            r.rebalance().await;
        }
    }
    let (a, b) = (relays[0].owned_lanes().await, relays[1].owned_lanes().await);
    assert_eq!((a.len(), b.len()), (32, 32), "fair share of the 64 lanes");
    assert!(a.iter().all(|l| !b.contains(l)), "no lane owned twice");
    let tasks: Vec<_> = relays
        .iter()
        .map(|r| {
            let r = r.clone();
            tokio::spawn(async move { drain(&r).await })
        })
        .collect();
    let mut per_relay = Vec::new();
    for t in tasks {
        per_relay.push(t.await.unwrap());
    }
    // A relay may see "empty" while the other still holds rows; finish with one more drain.
    let tail = drain(&relays[0]).await;
    assert_eq!(per_relay.iter().sum::<usize>() + tail, 20_000);
    assert!(
        per_relay.iter().all(|n| *n > 0),
        "both relays worked: {per_relay:?}"
    );

    let c = client(&db).await;
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox WHERE status = 'sent'").await,
        20_000
    );

    let recs = read_all(&topic).await;
    assert_eq!(recs.len(), 20_000, "no message twice");
    let mut seen: HashMap<String, usize> = HashMap::new();
    for r in &recs {
        *seen.entry(r.message_id()).or_default() += 1;
    }
    assert!(seen.values().all(|n| *n == 1));
    assert_eq!(
        seen.keys().cloned().collect::<HashSet<_>>(),
        ids.into_iter().collect::<HashSet<_>>()
    );
}

/// The lane gate: a relay alone holds all 64 lanes with one lock (a fleet of 200 tenants
/// held 12,800, and every commit on the lock session walked them); a second relay gets its
/// share lane by lane once the first gives way, and the survivor goes back to one lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_alone_holds_every_lane_with_one_lock_and_shares_them_when_another_joins() {
    let db = fresh_db().await;
    let c = client(&db).await;
    // (lane locks, gate held exclusively, gate held shared) in this schema.
    let locks = || async {
        let r = c
            .query_one(
                "SELECT count(*) FILTER (WHERE classid = (hashtext('outbox-lanes:' || current_schema()))::oid),
                        count(*) FILTER (WHERE classid = (hashtext('outbox-lane-gate:' || current_schema()))::oid
                                           AND mode = 'ExclusiveLock'),
                        count(*) FILTER (WHERE classid = (hashtext('outbox-lane-gate:' || current_schema()))::oid
                                           AND mode = 'ShareLock')
                   FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2",
                &[],
            )
            .await
            .unwrap();
        (r.get::<_, i64>(0), r.get::<_, i64>(1), r.get::<_, i64>(2))
    };
    let a = Relay::new(&db, &kafka(), relay_config()).unwrap();
    a.rebalance().await;
    assert_eq!(a.owned_lanes().await, (0..64).collect::<Vec<_>>());
    assert_eq!(locks().await, (0, 1, 0), "alone: one lock for the 64 lanes");

    let b = Relay::new(&db, &kafka(), relay_config()).unwrap();
    b.rebalance().await;
    assert!(
        b.owned_lanes().await.is_empty(),
        "the newcomer waits while the first holds the gate"
    );
    a.rebalance().await;
    b.rebalance().await;
    let (la, lb) = (a.owned_lanes().await, b.owned_lanes().await);
    assert_eq!((la.len(), lb.len()), (32, 32), "fair share");
    assert!(la.iter().all(|l| !lb.contains(l)), "no lane owned twice");
    assert_eq!(locks().await, (64, 0, 2), "two relays: lane by lane");

    // The second leaves (its lock session closes): the first holds all lanes by one lock again.
    drop(b);
    wait_until(
        Duration::from_secs(15),
        "the survivor holds every lane with one lock",
        || async {
            a.rebalance().await;
            a.owned_lanes().await.len() == 64 && locks().await == (0, 1, 0)
        },
    )
    .await;
}

/// A lock statement that fails on a live session (here: cancelled while it waits) leaves
/// unknown which locks the session holds; the relay ends that session, so Postgres frees
/// them all, and takes its lanes again on a new one — never a gate or lane left held by a
/// session nobody tracks (which would stop every relay of the schema).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_statement_failing_on_a_live_session_ends_it_and_the_lanes_are_taken_again() {
    let db = fresh_db().await;
    let c = client(&db).await;
    let gate_holder = || async {
        c.query_opt(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
                AND classid = (hashtext('outbox-lane-gate:' || current_schema()))::oid",
            &[],
        )
        .await
        .unwrap()
        .map(|r| r.get::<_, i32>(0))
    };
    let relay = Arc::new(Relay::new(&db, &kafka(), relay_config()).unwrap());
    relay.rebalance().await;
    let old = gate_holder()
        .await
        .expect("alone: the relay holds the gate");

    // The relay's next count of relays reads pg_database: hold it, and cancel the count
    // while it waits.
    let blocker = client(&db).await;
    blocker
        .batch_execute("BEGIN; LOCK TABLE pg_catalog.pg_database IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let r = relay.clone();
    let rebalance = tokio::spawn(async move { r.rebalance().await });
    wait_until(Duration::from_secs(10), "the count waits on pg_database", || async {
        // Not pg_stat_activity: the view joins pg_database, and would wait too.
        count(&c, &format!("SELECT count(*) FROM pg_stat_get_activity({old}) WHERE wait_event_type = 'Lock'")).await == 1
    })
    .await;
    c.execute("SELECT pg_cancel_backend($1)", &[&old])
        .await
        .unwrap();
    blocker.batch_execute("ROLLBACK").await.unwrap();
    rebalance.await.unwrap();
    assert!(
        relay.owned_lanes().await.is_empty(),
        "no lanes while the session is gone"
    );
    wait_until(
        Duration::from_secs(10),
        "the failed session ended",
        || async {
            count(
                &c,
                &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {old}"),
            )
            .await
                == 0
        },
    )
    .await;
    wait_until(Duration::from_secs(10), "every lane again", || async {
        relay.rebalance().await;
        relay.owned_lanes().await.len() == 64
    })
    .await;
    let new = gate_holder().await.expect("the gate again");
    assert_ne!(new, old, "on a new session");
}

/// Enqueues one row in its own transaction and drains it: a claim that lets the floor move.
async fn tick(db: &outbox::DbConfig, relay: &Relay, topic: &str) {
    enqueue_n(db, topic, 1, 1, 1).await;
    drain(relay).await;
}

/// Claims single rows until the relay's claim floor has left the head of the index.
async fn floor_moves(db: &outbox::DbConfig, relay: &Relay, topic: &str) {
    wait_until(Duration::from_secs(20), "the claim floor moves", || async {
        tick(db, relay, topic).await;
        relay.claim_floor() > 0
    })
    .await;
}

/// Inserts one row in an open transaction (not committed); returns the transaction's client
/// and the row's id.
async fn open_writer(db: &outbox::DbConfig, topic: &str) -> (tokio_postgres::Client, i64) {
    let c = client(db).await;
    c.batch_execute("BEGIN").await.unwrap();
    let id: i64 = c
        .query_one(
            "INSERT INTO outbox (topic, message_key, payload) VALUES ($1, 'late', '{\"late\":true}') RETURNING id",
            &[&topic],
        )
        .await
        .unwrap()
        .get(0);
    (c, id)
}

#[tokio::test]
async fn a_row_committed_after_newer_rows_were_sent_is_published_at_commit() {
    // The claim floor must not pass a row whose transaction is still open, however many newer
    // rows commit and are sent meanwhile: ids are not committed in order.
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    floor_moves(&db, &relay, &topic).await;

    let (writer, late_id) = open_writer(&db, &topic).await;
    // Keep claiming newer rows for a while: every chance for the floor to move past it.
    let started = std::time::Instant::now();
    let ticks = std::cell::Cell::new(0);
    wait_until(
        Duration::from_secs(20),
        "ten claims over a second",
        || async {
            tick(&db, &relay, &topic).await;
            ticks.set(ticks.get() + 1);
            assert!(
                relay.claim_floor() <= late_id,
                "the floor passed an open transaction's row"
            );
            ticks.get() >= 10 && started.elapsed() > Duration::from_secs(1)
        },
    )
    .await;
    writer.batch_execute("COMMIT").await.unwrap();
    // No sweep: the very next claims see it.
    assert_eq!(drain(&relay).await, 1);
    let late: Vec<Record> = read_all(&topic)
        .await
        .into_iter()
        .filter(|r| r.key.as_deref() == Some(b"late".as_slice()))
        .collect();
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].json(), serde_json::json!({"late": true}));
}

#[tokio::test]
async fn a_transaction_open_longer_than_long_transaction_is_published_by_the_sweep() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let cfg = {
        let mut c = relay_config();
        c.long_transaction = Duration::from_secs(1);
        c
    };
    let relay = Relay::new(&db, &kafka(), cfg).unwrap();
    let (writer, late_id) = open_writer(&db, &topic).await;
    wait_until(
        Duration::from_secs(20),
        "the floor passes the open transaction",
        || async {
            tick(&db, &relay, &topic).await;
            relay.claim_floor() > late_id
        },
    )
    .await;
    writer.batch_execute("COMMIT").await.unwrap();
    // Below the floor: claims do not see it, the sweep does.
    assert_eq!(relay.run_once().await.unwrap(), Outcome::Empty);
    assert_eq!(relay.sweep().await.unwrap(), Some(late_id));
    assert_eq!(drain(&relay).await, 1);
    let c = client(&db).await;
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox WHERE status <> 'sent'").await,
        0
    );
    assert_eq!(relay.sweep().await.unwrap(), None);
}

#[tokio::test]
async fn requeue_sends_a_running_relay_back_below_its_floor() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let later = topic_name(); // created only after the row failed
    let c = client(&db).await;
    let failed_id: i64 = c
        .query_one(
            "INSERT INTO outbox (topic, message_key, payload) VALUES ($1, 'x', '{}') RETURNING id",
            &[&later],
        )
        .await
        .unwrap()
        .get(0);
    let cfg = {
        let mut c = relay_config();
        c.max_attempts = 1;
        // Only the requeue notification can bring the relay back below its floor in time.
        c.sweep_interval = Duration::from_secs(3600);
        c
    };
    let relay = Relay::new(&db, &kafka(), cfg).unwrap();
    let floor = outbox::testing::floor_probe(&relay);
    let running = spawn_relay(relay);
    wait_until(
        Duration::from_secs(20),
        "the row fails and the floor passes it",
        || async {
            enqueue_n(&db, &topic, 1, 1, 1).await;
            floor() > failed_id
        },
    )
    .await;
    assert_eq!(
        count(
            &c,
            &format!("SELECT count(*) FROM outbox WHERE id = {failed_id} AND status = 'failed'")
        )
        .await,
        1
    );
    create_topic(&later, 1).await;
    assert_eq!(
        outbox::status::requeue(&db, outbox::status::Requeue::Id(failed_id))
            .await
            .unwrap(),
        1
    );
    wait_until(
        Duration::from_secs(20),
        "the requeued row is sent",
        || async {
            count(
                &c,
                &format!("SELECT count(*) FROM outbox WHERE id = {failed_id} AND status = 'sent'"),
            )
            .await
                == 1
        },
    )
    .await;
    running.stop().await;
    assert_eq!(topic_len(&later).await, 1);
}

#[tokio::test]
async fn a_row_locked_by_another_session_holds_the_floor_and_its_key() {
    // SKIP LOCKED passes over a row someone else holds (an operator's UPDATE, a foreign key's
    // share lock, a relay that lost its lane mid-batch). The floor must stop at it, and later
    // rows of its key must wait for it.
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    floor_moves(&db, &relay, &topic).await;
    let c = client(&db).await;
    let insert =
        "INSERT INTO outbox (topic, message_key, payload) VALUES ($1, 'held', $2) RETURNING id";
    let first: i64 = c
        .query_one(insert, &[&topic, &serde_json::json!({"n": 1})])
        .await
        .unwrap()
        .get(0);
    let locker = client(&db).await;
    locker
        .batch_execute(&format!(
            "BEGIN; SELECT id FROM outbox WHERE id = {first} FOR UPDATE"
        ))
        .await
        .unwrap();
    c.query_one(insert, &[&topic, &serde_json::json!({"n": 2})])
        .await
        .unwrap();
    // Claims go on around the locked row for over a second.
    let started = std::time::Instant::now();
    let mut passes = 0;
    while passes < 10 || started.elapsed() < Duration::from_secs(1) {
        enqueue_n(&db, &topic, 1, 1, 1).await;
        while let Outcome::Published(r) = relay.run_once().await.unwrap() {
            if r.claimed == r.held_back {
                break; // only the second "held" row is left, waiting
            }
        }
        passes += 1;
        assert!(
            relay.claim_floor() <= first,
            "the floor passed a locked row"
        );
    }
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM outbox WHERE message_key = 'held' AND status = 'sent'"
        )
        .await,
        0,
        "the second row of the key went out before the locked first one"
    );
    locker.batch_execute("COMMIT").await.unwrap();
    assert_eq!(drain(&relay).await, 2);
    let held: Vec<i64> = read_all(&topic)
        .await
        .iter()
        .filter(|r| r.key.as_deref() == Some(b"held".as_slice()))
        .map(|r| r.json()["n"].as_i64().unwrap())
        .collect();
    assert_eq!(held, vec![1, 2]);
}

/// Pipelining (two batches in flight): batch 2 is claimed while batch 1 waits for Kafka, and
/// both hold a row of key `k`. Batch 1's row of `k` is refused; batch 2's later row of `k`
/// must then stay pending, never overtake it — held back by the hand-over when batch 2 was
/// claimed while batch 1 was in flight (the usual timing), or not claimed when batch 1 had
/// already settled. Once the first row can go, both reach the topic in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_in_one_batch_holds_back_the_key_in_the_batch_claimed_behind_it() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 3).await;
    let missing = topic_name(); // never created: the row is refused
    let c = client(&db).await;
    // ids 1..20: 1 = (missing, k); 2..10 = fillers; 11 = (topic, k); 12..20 = fillers.
    c.execute(
        "INSERT INTO outbox (topic, message_key, headers, payload)
         SELECT CASE WHEN g = 1 THEN $2 ELSE $1 END,
                CASE WHEN g IN (1, 11) THEN 'k' ELSE 'f' || g END,
                jsonb_build_object('message_type', 't', 'message_id', outbox_uuidv7()::text),
                jsonb_build_object('g', g)
           FROM generate_series(1, 20) g ORDER BY g",
        &[&topic, &missing],
    )
    .await
    .unwrap();
    let cfg = {
        let mut c = relay_config();
        c.batch_size = 10;
        c.in_flight_batches = 2;
        c.max_attempts = 5;
        c
    };
    let relay = Relay::new(&db, &kafka(), cfg).unwrap();
    let Outcome::Published(r) = relay.run_pipeline().await.unwrap() else {
        panic!("nothing claimed")
    };
    // Row 11 is either claimed by batch 2 and held back (batch 1 still in flight: the hand-over
    // blocks its key), or not claimed at all (batch 1 had already backed row 1 off, so the claim
    // skips later rows of its key). Never sent.
    assert_eq!((r.sent, r.backed_off), (18, 1), "{r:?}");
    assert!(
        (r.claimed, r.held_back) == (20, 1) || (r.claimed, r.held_back) == (19, 0),
        "{r:?}"
    );
    let state = |id: i64| {
        let c = &c;
        async move {
            let row = c
                .query_one("SELECT status, attempts FROM outbox WHERE id = $1", &[&id])
                .await
                .unwrap();
            (row.get::<_, String>(0), row.get::<_, i32>(1))
        }
    };
    assert_eq!(state(1).await, ("pending".into(), 1), "refused, backed off");
    assert_eq!(
        state(11).await,
        ("pending".into(), 0),
        "held back, no attempt spent"
    );
    let keys_on_topic = |recs: &[Record]| {
        recs.iter()
            .filter(|r| r.key.as_deref() == Some(b"k".as_slice()))
            .map(|r| r.json()["g"].as_i64().unwrap())
            .collect::<Vec<_>>()
    };
    assert!(keys_on_topic(&read_all(&topic).await).is_empty());

    // Row 1 becomes sendable: both rows of k go, in id order.
    c.execute(
        "UPDATE outbox SET topic = $1, available_at = now() WHERE id = 1",
        &[&topic],
    )
    .await
    .unwrap();
    let Outcome::Published(r) = relay.run_pipeline().await.unwrap() else {
        panic!("nothing claimed")
    };
    assert_eq!(r.sent, 2, "{r:?}");
    let mut recs = read_all(&topic).await;
    recs.sort_by_key(|r| (r.partition, r.offset));
    assert_eq!(keys_on_topic(&recs), vec![1, 11]);
}

/// Pipelining with a row locked by another session in the middle of a backlog: the claims
/// behind a full batch in flight start past it, yet the locked row is not lost (the floor stops
/// at it and claims go back to the floor) and the later row of its key waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_drain_around_a_locked_row_sends_everything_else_and_keeps_its_key_in_order() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 3).await;
    let c = client(&db).await;
    // ids 1..60, rows 25 and 45 share key `held`, every other row has a key of its own.
    c.execute(
        "INSERT INTO outbox (topic, message_key, headers, payload)
         SELECT $1, CASE WHEN g IN (25, 45) THEN 'held' ELSE 'f' || g END,
                jsonb_build_object('message_type', 't', 'message_id', outbox_uuidv7()::text),
                jsonb_build_object('g', g)
           FROM generate_series(1, 60) g ORDER BY g",
        &[&topic],
    )
    .await
    .unwrap();
    let locker = client(&db).await;
    locker
        .batch_execute("BEGIN; SELECT id FROM outbox WHERE id = 25 FOR UPDATE")
        .await
        .unwrap();
    let cfg = {
        let mut c = relay_config();
        c.batch_size = 10;
        c.in_flight_batches = 2;
        c
    };
    let relay = Relay::new(&db, &kafka(), cfg).unwrap();
    let mut sent = 0;
    for _ in 0..20 {
        match relay.run_pipeline().await.unwrap() {
            Outcome::Published(r) if r.sent > 0 => sent += r.sent,
            _ => break,
        }
    }
    assert_eq!(
        sent, 58,
        "every row but the locked one and the one behind it"
    );
    assert!(relay.claim_floor() <= 25, "the floor passed a locked row");
    let held = |recs: &[Record]| {
        recs.iter()
            .filter(|r| r.key.as_deref() == Some(b"held".as_slice()))
            .map(|r| r.json()["g"].as_i64().unwrap())
            .collect::<Vec<_>>()
    };
    assert!(
        held(&read_all(&topic).await).is_empty(),
        "row 45 overtook row 25"
    );

    locker.batch_execute("COMMIT").await.unwrap();
    let Outcome::Published(r) = relay.run_pipeline().await.unwrap() else {
        panic!("nothing claimed")
    };
    assert_eq!(r.sent, 2, "{r:?}");
    let mut recs = read_all(&topic).await;
    assert_eq!(recs.len(), 60);
    recs.sort_by_key(|r| (r.partition, r.offset));
    assert_eq!(held(&recs), vec![25, 45]);
}

#[tokio::test]
async fn the_relay_pool_hands_out_the_session_returned_last() {
    // A fleet's relays share one pool: handing out the least recently used session spread
    // every tenant over every session, and each session then paid for the tenant's catalog
    // entries, prepared statements and its own page-table entries for the shared memory it
    // touched (a 200-tenant drain: 91,500 minor page faults in Postgres against 72,000 with
    // the session used last handed out first; BENCHMARKS_HISTORY round 27).
    let db = fresh_db().await;
    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    let pool = outbox::testing::relay_pool(&relay);
    let a = pool.get().await.unwrap();
    let b = pool.get().await.unwrap();
    let c = pool.get().await.unwrap();
    let (pa, pb, pc) = (
        backend_pid(&a).await,
        backend_pid(&b).await,
        backend_pid(&c).await,
    );
    assert!(pa != pb && pb != pc && pa != pc, "three sessions");
    // Returned in the order a, b, c: the next checkouts are c, then b.
    drop(a);
    drop(b);
    drop(c);
    let first = pool.get().await.unwrap();
    assert_eq!(
        backend_pid(&first).await,
        pc,
        "the session returned last goes out first"
    );
    let second = pool.get().await.unwrap();
    assert_eq!(backend_pid(&second).await, pb);
}

async fn backend_pid(c: &tokio_postgres::Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}
