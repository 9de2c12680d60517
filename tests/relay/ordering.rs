//! Per-key order across several relays (DESIGN §3.6): for every message_key, first deliveries
//! follow outbox id order — with injected produce failures backing rows off, and with a relay
//! dying mid-run and its lanes taken over.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use outbox::Relay;
use outbox_testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_relays_with_injected_failures_and_a_dead_relay_keep_per_key_order() {
    let keys = 1000;
    let per_key = 50;
    let total = (keys * per_key) as i64;
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 6).await;
    let c = client(&db).await;
    // ids ascend with (seq, key): for each key, seq 0..49 in id order.
    c.execute(
        "INSERT INTO outbox (topic, message_key, headers, payload)
         SELECT $1, 'key-' || k, jsonb_build_object('message_type', 't', 'message_id', outbox_uuidv7()::text,
                'seq', s::text), jsonb_build_object('seq', s)
           FROM generate_series(0, $2 - 1) s, generate_series(0, $3 - 1) k ORDER BY s, k",
        &[&topic, &{ per_key }, &{ keys }],
    )
    .await
    .unwrap();

    let cfg = {
        let mut c = relay_config();
        c.batch_size = 500;
        c.max_attempts = 1000;
        // injected failures only back rows off
        c.rebalance_interval = Duration::from_millis(500);
        c
    };
    let relays: Vec<Relay> = (0..3)
        .map(|_| {
            let r = Relay::new(&db, &kafka(), cfg.clone()).unwrap();
            outbox::testing::inject_refusals(&r, 0.02);
            r
        })
        .collect();
    for _ in 0..2 {
        for r in &relays {
            r.rebalance().await;
        }
    }
    let mut shares: Vec<usize> = Vec::new();
    for r in &relays {
        shares.push(r.owned_lanes().await.len());
    }
    assert_eq!(
        shares.iter().sum::<usize>(),
        64,
        "every lane owned once: {shares:?}"
    );

    let mut tasks = Vec::new();
    let mut stops = Vec::new();
    for relay in relays {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        stops.push(Some(stop));
        tasks.push(Some(tokio::spawn(relay.run(async move {
            let _ = stopped.await;
        }))));
    }

    // (lanes held, relays holding them): 3 relays before the kill, 2 survivors with all 64 after.
    let lanes_held = || async {
        let r = c
            .query_one(
                "SELECT count(*), count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
                   AND classid = (hashtext('outbox-lanes:' || current_schema()))::oid",
                &[],
            )
            .await
            .unwrap();
        (r.get::<_, i64>(0), r.get::<_, i64>(1))
    };
    let sent = || async { count(&c, "SELECT count(*) FROM outbox WHERE status = 'sent'").await };
    wait_until(Duration::from_secs(60), "a fifth sent", || async {
        sent().await >= total / 5
    })
    .await;
    assert_eq!(lanes_held().await, (64, 3));

    // Kill relay 0 mid-run: its connections close, Postgres frees its lane locks.
    tasks[0].take().unwrap().abort();
    let killed_at = Instant::now();
    wait_until(
        Duration::from_secs(10),
        "survivors hold all 64 lanes",
        || async { lanes_held().await == (64, 2) },
    )
    .await;
    let takeover = killed_at.elapsed();

    wait_until(Duration::from_secs(120), "every row sent", || async {
        sent().await == total
    })
    .await;
    for (i, t) in tasks.iter_mut().enumerate() {
        if let Some(t) = t.take() {
            stops[i].take().unwrap().send(()).unwrap();
            t.await.unwrap().unwrap();
        }
    }
    let backed_off = count(&c, "SELECT count(*) FROM outbox WHERE attempts > 0").await;
    assert!(
        backed_off > 100,
        "injected failures exercised the backoff path ({backed_off} rows)"
    );

    // Consumer side: per key, the first delivery of each seq must come in seq order.
    let recs = read_all(&topic).await;
    let mut by_key: HashMap<Vec<u8>, Vec<(i32, i64, i64)>> = HashMap::new();
    for r in &recs {
        by_key.entry(r.key.clone().unwrap()).or_default().push((
            r.partition,
            r.offset,
            r.json()["seq"].as_i64().unwrap(),
        ));
    }
    let mut duplicates = 0;
    for (key, mut v) in by_key {
        v.sort();
        let parts: std::collections::HashSet<i32> = v.iter().map(|x| x.0).collect();
        assert_eq!(parts.len(), 1, "one key, one partition");
        let mut next = 0;
        for (_, _, seq) in v {
            if seq < next {
                duplicates += 1; // a re-send of an already delivered row
                continue;
            }
            assert_eq!(
                seq,
                next,
                "key {}: first delivery of seq {seq} before {next}",
                String::from_utf8_lossy(&key)
            );
            next += 1;
        }
        assert_eq!(next, per_key as i64, "every seq delivered");
    }
    eprintln!(
        "ordering: {total} rows, {keys} keys, 3 relays (1 killed), {backed_off} rows backed off, \
         {duplicates} duplicates, lanes taken over in {takeover:?}"
    );
}
