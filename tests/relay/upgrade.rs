//! The online move of a schema from seed 002's table onto ring storage (issue 33, point 4):
//! `outbox::storage::use_ring` while a service inserts and two relays publish.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{Message, Relay};
use outbox_testkit::*;

/// A service writing rows of keys `k0..k9` in transactions of 5, through `enqueue_batch` and
/// seed 002's plain SQL in turn, each row's `seq` higher than every row before it. Returns the
/// message ids it wrote.
struct Writer {
    seq: AtomicI64,
    ids: Mutex<Vec<String>>,
}

impl Writer {
    async fn write(&self, c: &mut tokio_postgres::Client, topic: &str, keys: &[&str]) {
        let tx = c.transaction().await.unwrap();
        let first = self.seq.fetch_add(keys.len() as i64, Ordering::SeqCst);
        let mut ids = Vec::new();
        if first % 2 == 0 {
            let msgs: Vec<Message> = keys
                .iter()
                .enumerate()
                .map(|(i, k)| {
                    Message::new(
                        topic,
                        "it_event",
                        *k,
                        serde_json::json!({"seq": first + i as i64}),
                    )
                })
                .collect();
            ids.extend(msgs.iter().map(|m| m.message_id().to_string()));
            // Unqualified: the connection's search_path names the test's schema.
            outbox::enqueue_batch(&tx, &msgs).await.unwrap();
        } else {
            for (i, k) in keys.iter().enumerate() {
                let id: String = tx
                    .query_one(
                        "INSERT INTO outbox (topic, message_key, headers, payload)
                         VALUES ($1, $2, jsonb_build_object('message_type', 'it_event',
                                                            'message_id', gen_random_uuid()::text),
                                 jsonb_build_object('seq', $3::bigint))
                         RETURNING headers->>'message_id'",
                        &[&topic, k, &(first + i as i64)],
                    )
                    .await
                    .unwrap()
                    .get(0);
                ids.push(id);
            }
        }
        tx.commit().await.unwrap();
        self.ids.lock().unwrap().extend(ids);
    }
}

const KEYS: [&str; 10] = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9"];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_table_with_pending_backed_off_failed_and_sent_rows_moves_onto_the_ring_online() {
    let db = fresh_db().await;
    let mut c = client(&db).await;
    let topic = topic_name();
    create_topic(&topic, 3).await;
    let w = Arc::new(Writer {
        seq: AtomicI64::new(0),
        ids: Mutex::new(Vec::new()),
    });

    // Sent rows: written and relayed on the table.
    for _ in 0..40 {
        w.write(&mut c, &topic, &KEYS[..5]).await;
    }
    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 200);
    drop(relay);
    // Pending rows, and on key `kb` a head backed off by the relay (attempts, error, due in
    // 4 s) with two rows behind it; on key `kf` a row that failed for good.
    for _ in 0..150 {
        w.write(&mut c, &topic, &KEYS).await;
    }
    w.write(&mut c, &topic, &["kb", "kb", "kf"]).await;
    w.write(&mut c, &topic, &["kb"]).await;
    c.batch_execute(
        "UPDATE outbox SET attempts = 3, last_error = 'broker timed out',
                           available_at = now() + interval '4 s'
          WHERE id = (SELECT min(id) FROM outbox WHERE message_key = 'kb');
         UPDATE outbox SET status = 'failed', attempts = 10, last_error = 'refused: too large'
          WHERE message_key = 'kf'",
    )
    .await
    .unwrap();
    let failed_id: String = c
        .query_one(
            "SELECT headers->>'message_id' FROM outbox WHERE message_key = 'kf'",
            &[],
        )
        .await
        .unwrap()
        .get(0);

    // A service keeps writing and two relays keep publishing through the move.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (w, stop, db, topic) = (w.clone(), stop.clone(), db.clone(), topic.clone());
        tokio::spawn(async move {
            let mut c = client(&db).await;
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let keys = &KEYS[n % 6..n % 6 + 4];
                w.write(&mut c, &topic, keys).await;
                n += 1;
            }
        })
    };
    let mut config = relay_config();
    config.batch_size = 20;
    let relays = [
        spawn_relay(Relay::new(&db, &kafka(), config.clone()).unwrap()),
        spawn_relay(Relay::new(&db, &kafka(), config).unwrap()),
    ];
    wait_until(
        Duration::from_secs(30),
        "the relays publish on the table",
        || async { count(&c, "SELECT count(*) FROM outbox WHERE status = 'sent'").await > 220 },
    )
    .await;

    let moved = outbox::storage::use_ring(&db, outbox::storage::MoveOptions::default())
        .await
        .unwrap();
    eprintln!("moved: {moved:?}");
    assert!(moved.moved);
    assert!(
        moved.carried >= 100,
        "a backlog is carried over, with the failed row and key kb's three: {moved:?}"
    );
    assert_eq!(
        texts(
            &c,
            "SELECT relkind::text FROM pg_class WHERE oid = 'outbox'::regclass"
        )
        .await,
        ["v"]
    );
    wait_until(
        Duration::from_secs(30),
        "the service writes the ring",
        || async { count(&c, "SELECT count(*) FROM outbox_ring").await >= 300 },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    writer.await.unwrap();
    wait_until(Duration::from_secs(60), "everything published", || async {
        count(&c, "SELECT count(*) FROM outbox WHERE status = 'pending'").await == 0
    })
    .await;
    for r in relays {
        r.stop().await;
    }

    // Every row written before, during and after the move reached Kafka once, in its key's
    // order (kb's backed-off head before the rows behind it); the failed row did not.
    let written: Vec<String> = w.ids.lock().unwrap().clone();
    let recs = read_all(&topic).await;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for r in &recs {
        *seen.entry(r.message_id()).or_default() += 1;
    }
    let doubled: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "published twice: {doubled:?}");
    let expected: HashSet<&String> = written.iter().filter(|id| **id != failed_id).collect();
    let got: HashSet<&String> = seen.keys().collect();
    assert_eq!(got, expected, "each written row once, the failed one not");
    for (key, seqs) in super::ring::seqs_by_key(&recs) {
        assert!(seqs.windows(2).all(|p| p[0] < p[1]), "{key}: {seqs:?}");
    }
    // Seed 002's view of it: the failed row is still failed, with its error.
    let by_status: Vec<(String, i64)> = c
        .query(
            "SELECT status, count(*) FROM outbox GROUP BY status ORDER BY status",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let total = written.len() as i64;
    assert_eq!(
        by_status,
        [("failed".to_owned(), 1), ("sent".to_owned(), total - 1)]
    );
    assert_eq!(
        texts(&c, "SELECT last_error FROM outbox WHERE status = 'failed'").await,
        ["refused: too large"]
    );
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM outbox_legacy WHERE status <> 'sent'"
        )
        .await,
        0,
        "nothing in the old table is left to send"
    );

    // `outbox trace` finds a row sent on the table before the move, one written to the ring,
    // and the failed one, each with its state.
    let ring_id: String = c
        .query_one(
            "SELECT headers->>'message_id' FROM outbox_ring ORDER BY id DESC LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    for (id, status) in [
        (written[0].as_str(), "sent"),
        (ring_id.as_str(), "sent"),
        (failed_id.as_str(), "failed"),
    ] {
        let j = outbox::journey::trace(&db, id).await.unwrap();
        assert_eq!(j.len(), 1, "{id}");
        assert_eq!(j[0].outbox.len(), 1, "{id}");
        assert_eq!(j[0].outbox[0].status, status, "{id}");
    }

    // The operator's repairs work as before: seed 002's requeue of the failed row ...
    c.batch_execute(
        "UPDATE outbox SET status = 'pending', attempts = 0, available_at = now()
          WHERE status = 'failed'",
    )
    .await
    .unwrap();
    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 1);
    // ... and a re-publish of every sent row, on the table before the move and on the ring.
    let report = outbox::republish::requeue_sent(
        &db,
        &outbox::republish::RequeueSent::topic(&topic),
        "test",
    )
    .await
    .unwrap();
    assert_eq!(report.rows as i64, total);
    assert_eq!(drain(&relay).await as i64, total);
    let again = read_all(&topic).await;
    assert_eq!(again.len() as i64, 2 * total, "each row once more");
    // Cleanup deletes the table's sent rows past retention; the ring's go by rotation.
    let mut cc = outbox::CleanupConfig::default();
    cc.interval = None;
    cc.sent_retention = Duration::ZERO;
    let done = outbox::cleanup(&db, &cc).await.unwrap();
    assert!(done.outbox_deleted > 0, "{done:?}");
    assert_eq!(count(&c, "SELECT count(*) FROM outbox_legacy").await, 0);
}
