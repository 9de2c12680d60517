//! The consumer runtime against real Kafka and Postgres.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::consumer::{
    BoxFuture, Consumer, ConsumerConfig, ConsumerError, ConsumerStats, Delivered, Handler,
    HandlerError, Inbox, RetryStrategy,
};
use outbox_testkit::*;

/// Test handler. The body decides: `{"fail": n}` fails transiently n times, `{"fail": -1}`
/// always; `{"permanent": true}`; `{"panic": true}`; `{"sleep_ms": n}`. Every attempt is
/// recorded in `attempts`, every success in `effects` (both with insertion order ids).
#[derive(Clone)]
struct Probe {
    tries: Arc<Mutex<HashMap<String, i64>>>,
    random_transient_pct: u32,
    /// Records attempts outside the handler's transaction, so failures leave a trace too.
    recorder: Arc<tokio_postgres::Client>,
}

impl Probe {
    async fn new(s: &Setup) -> Self {
        Self {
            tries: Arc::default(),
            random_transient_pct: 0,
            recorder: Arc::new(client(&s.db).await),
        }
    }
}

impl Handler for Probe {
    fn handle<'a>(
        &'a self,
        msg: &'a Delivered,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let b = msg.json();
            let n = {
                let mut t = self.tries.lock().unwrap();
                let e = t.entry(msg.message_id.clone()).or_default();
                *e += 1;
                *e
            };
            self.recorder
                .execute(
                    "INSERT INTO attempts (message_id, source_topic) VALUES ($1, $2)",
                    &[&msg.message_id, &msg.source_topic],
                )
                .await
                .unwrap();
            if let Some(ms) = b["sleep_ms"].as_u64() {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            if b["panic"].as_bool() == Some(true) {
                panic!("boom in handler");
            }
            if b["permanent"].as_bool() == Some(true) {
                return Err(HandlerError::permanent("card declined: permanently"));
            }
            let fail = b["fail"].as_i64().unwrap_or(0);
            if fail < 0 || n <= fail {
                return Err(HandlerError::transient(format!(
                    "downstream timeout (try {n})"
                )));
            }
            if self.random_transient_pct > 0 && fastrand::u32(0..100) < self.random_transient_pct {
                return Err(HandlerError::transient("random transient"));
            }
            tx.execute(
                "INSERT INTO effects (message_id, k, seq) VALUES ($1, $2, $3)",
                &[
                    &msg.message_id,
                    &msg.key_str().unwrap_or(""),
                    &b["seq"].as_i64().unwrap_or(-1),
                ],
            )
            .await?;
            Ok(())
        })
    }
}

struct Setup {
    db: outbox::DbConfig,
    topic: String,
    group: String,
    c: tokio_postgres::Client,
}

async fn setup(partitions: i32, retry_suffixes: &[&str]) -> Setup {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, partitions, retry_suffixes).await;
    let c = client(&db).await;
    c.batch_execute(
        "CREATE TABLE effects (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, message_id text NOT NULL, k text, seq bigint);
         CREATE TABLE attempts (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, message_id text NOT NULL,
                                source_topic text, at timestamptz NOT NULL DEFAULT clock_timestamp());",
    )
    .await
    .unwrap();
    Setup {
        db,
        topic,
        group: format!("it-group-{}", hex(8)),
        c,
    }
}

fn body(s: &Setup, v: serde_json::Value) -> serde_json::Value {
    let mut v = v;
    v["schema"] = serde_json::json!(s.db.schema.name());
    v
}

struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<Result<(), ConsumerError>>,
    stats: Arc<ConsumerStats>,
}

fn start(s: &Setup, config: ConsumerConfig, probe: Probe) -> Running {
    let consumer = Consumer::new(&s.db, &kafka(), config)
        .unwrap()
        .handler("it_event", probe);
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    Running {
        stop,
        handle,
        stats,
    }
}

impl Running {
    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.handle.await.unwrap().unwrap();
    }
}

fn get(c: &std::sync::atomic::AtomicU64) -> u64 {
    ConsumerStats::get(c)
}

fn in_place(attempts: u32, base_ms: u64) -> RetryStrategy {
    RetryStrategy::InPlace {
        attempts,
        base: Duration::from_millis(base_ms),
        max: Duration::from_secs(1),
    }
}

#[tokio::test]
async fn the_same_message_delivered_twice_has_its_effect_once() {
    let s = setup(1, &[]).await;
    let id = uuid::Uuid::now_v7().to_string();
    for _ in 0..2 {
        produce_event(
            &s.topic,
            "k1",
            "it_event",
            &id,
            &body(&s, serde_json::json!({"seq": 1})),
        )
        .await;
    }
    produce_event(
        &s.topic,
        "k2",
        "it_event",
        "other",
        &body(&s, serde_json::json!({"seq": 2})),
    )
    .await;
    let r = start(
        &s,
        ConsumerConfig::new(&s.group, [&s.topic]),
        Probe::new(&s).await,
    );
    wait_until(Duration::from_secs(30), "3 deliveries settled", || async {
        get(&r.stats.handled) + get(&r.stats.duplicates) == 3
    })
    .await;
    assert_eq!(get(&r.stats.duplicates), 1);
    assert_eq!(
        count(
            &s.c,
            &format!("SELECT count(*) FROM effects WHERE message_id = '{id}'")
        )
        .await,
        1
    );
    assert_eq!(
        count(&s.c, "SELECT count(*) FROM processed_messages").await,
        2
    );
    wait_until(
        Duration::from_secs(10),
        "offset committed past all",
        || async { committed(&s.group, &s.topic, 0).await == Some(3) },
    )
    .await;
    r.stop().await;
}

#[tokio::test]
async fn transient_twice_then_success_is_handled_once_and_before_the_same_keys_later_messages() {
    let s = setup(1, &[]).await;
    produce_event(
        &s.topic,
        "k",
        "it_event",
        "m1",
        &body(&s, serde_json::json!({"seq": 1, "fail": 2})),
    )
    .await;
    for seq in 2..=4 {
        produce_event(
            &s.topic,
            "k",
            "it_event",
            &format!("m{seq}"),
            &body(&s, serde_json::json!({"seq": seq})),
        )
        .await;
    }
    produce_event(
        &s.topic,
        "other",
        "it_event",
        "o1",
        &body(&s, serde_json::json!({"seq": 100})),
    )
    .await;
    let mut cfg = ConsumerConfig::new(&s.group, [&s.topic]);
    cfg.retry = in_place(3, 100);
    let r = start(&s, cfg, Probe::new(&s).await);
    wait_until(Duration::from_secs(30), "all handled", || async {
        get(&r.stats.handled) == 5
    })
    .await;
    assert_eq!(get(&r.stats.in_place_retries), 2);
    assert_eq!(
        count(
            &s.c,
            "SELECT count(*) FROM attempts WHERE message_id = 'm1'"
        )
        .await,
        3
    );
    let seqs: Vec<i64> =
        s.c.query("SELECT seq FROM effects WHERE k = 'k' ORDER BY id", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
    assert_eq!(seqs, [1, 2, 3, 4], "m1 handled once and first");
    // Another key was not blocked by k's retries.
    let other_first: bool = s.c
        .query_one("SELECT (SELECT id FROM effects WHERE k = 'other') < (SELECT id FROM effects WHERE seq = 1)", &[])
        .await
        .unwrap()
        .get(0);
    assert!(other_first, "other keys flow while one key retries");
    r.stop().await;
}

fn header<'a>(r: &'a Record, k: &str) -> &'a str {
    r.headers.get(k).map_or_else(
        || panic!("header {k} missing in {:?}", r.headers),
        String::as_str,
    )
}

#[tokio::test]
async fn permanent_decode_and_panic_go_to_the_dlq_with_byte_identical_key_body_and_headers() {
    let s = setup(1, &[]).await;
    let perm_body =
        serde_json::to_vec(&body(&s, serde_json::json!({"seq": 1, "permanent": true}))).unwrap();
    produce(
        &s.topic,
        Some(b"key-perm"),
        &[
            ("message_type", b"it_event"),
            ("entity_id", b"key-perm"),
            ("message_id", b"perm-1"),
            ("timestamp", b"2026-01-15T12:34:56Z"),
            ("traceparent", b"00-abc-01"),
        ],
        Some(&perm_body),
    )
    .await;
    // Not JSON.
    produce(
        &s.topic,
        Some(b"key-decode"),
        &[("message_type", b"it_event"), ("message_id", b"dec-1")],
        Some(b"\xff\xfenot json"),
    )
    .await;
    // Missing message_id.
    produce(
        &s.topic,
        Some(b"key-noid"),
        &[("message_type", b"it_event")],
        Some(b"{}"),
    )
    .await;
    // Contradictory duplicated header.
    produce(
        &s.topic,
        None,
        &[
            ("message_type", b"it_event"),
            ("message_id", b"a"),
            ("message_id", b"b"),
        ],
        Some(b"{}"),
    )
    .await;
    produce_event(
        &s.topic,
        "key-panic",
        "it_event",
        "panic-1",
        &body(&s, serde_json::json!({"panic": true})),
    )
    .await;
    produce_event(
        &s.topic,
        "key-ok",
        "it_event",
        "ok-1",
        &body(&s, serde_json::json!({"seq": 9})),
    )
    .await;
    // No handler for this type: skipped and counted, not dead-lettered.
    produce_event(
        &s.topic,
        "key-unknown",
        "something_else",
        "unk-1",
        &serde_json::json!({}),
    )
    .await;

    let mut cfg = ConsumerConfig::new(&s.group, [&s.topic]);
    cfg.retry = in_place(3, 50);
    let r = start(&s, cfg, Probe::new(&s).await);
    wait_until(Duration::from_secs(30), "all settled", || async {
        get(&r.stats.dead_lettered) == 5
            && get(&r.stats.handled) == 1
            && get(&r.stats.skipped_unknown) == 1
    })
    .await;
    assert_eq!(get(&r.stats.panics), 1);
    assert_eq!(get(&r.stats.decode_errors), 3);
    assert_eq!(
        count(
            &s.c,
            "SELECT count(*) FROM attempts WHERE message_id = 'perm-1'"
        )
        .await,
        1,
        "permanent: no retry"
    );
    wait_until(
        Duration::from_secs(10),
        "offsets committed past everything",
        || async { committed(&s.group, &s.topic, 0).await == Some(7) },
    )
    .await;

    let dlq = read_all(&format!("{}.dlq", s.topic)).await;
    assert_eq!(dlq.len(), 5, "exactly one DLQ record each");
    let by_key = |k: &[u8]| {
        dlq.iter()
            .find(|r| r.key.as_deref() == Some(k))
            .unwrap()
            .clone()
    };
    let p = by_key(b"key-perm");
    assert_eq!(p.payload, perm_body, "body byte-identical");
    for (k, v) in [
        ("message_type", "it_event"),
        ("entity_id", "key-perm"),
        ("message_id", "perm-1"),
        ("traceparent", "00-abc-01"),
    ] {
        assert_eq!(header(&p, k), v, "original header {k} kept");
    }
    assert_eq!(header(&p, "x-original-topic"), s.topic);
    assert_eq!(header(&p, "x-original-partition"), "0");
    assert_eq!(header(&p, "x-original-offset"), "0");
    assert_eq!(header(&p, "x-consumer-group"), s.group);
    assert_eq!(header(&p, "x-attempts"), "1");
    assert_eq!(header(&p, "x-error-kind"), "permanent");
    assert!(header(&p, "x-error").contains("card declined"));
    assert!(humantime::parse_rfc3339(header(&p, "x-failed-at")).is_ok());

    let d = by_key(b"key-decode");
    assert_eq!(
        d.payload, b"\xff\xfenot json",
        "undecodable body forwarded byte-identical"
    );
    assert_eq!(header(&d, "x-error-kind"), "decode");
    assert_eq!(
        header(&d, "x-attempts"),
        "0",
        "decode errors spend no retries"
    );
    assert!(header(&d, "x-error").contains("not valid JSON"));
    assert!(header(&by_key(b"key-noid"), "x-error").contains("missing message_id"));
    let contradictory = dlq.iter().find(|r| r.key.is_none()).unwrap();
    assert!(header(contradictory, "x-error").contains("contradictory"));

    let pa = by_key(b"key-panic");
    assert_eq!(header(&pa, "x-error-kind"), "panic");
    assert!(header(&pa, "x-error").contains("boom in handler"));

    // Still alive after the panic: a new message is handled.
    produce_event(
        &s.topic,
        "key-ok",
        "it_event",
        "ok-2",
        &body(&s, serde_json::json!({"seq": 10})),
    )
    .await;
    wait_until(Duration::from_secs(20), "handled after panic", || async {
        get(&r.stats.handled) == 2
    })
    .await;
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_topic_chain_waits_each_hop_then_dead_letters_while_others_flow() {
    let s = setup(2, &[]).await;
    // The first hop waits 3 s: long enough that the 40 other messages are all handled before
    // it, also on a loaded machine.
    for hop in ["retry-3s", "retry-2s"] {
        create_topic(&format!("{}.{}.{hop}", s.topic, s.group), 2).await;
    }
    let mut cfg = ConsumerConfig::new(&s.group, [&s.topic]);
    cfg.retry = RetryStrategy::Topics {
        delays: vec![Duration::from_secs(3), Duration::from_secs(2)],
    };
    // Everything is produced before the consumer starts (it reads from the earliest offset):
    // produced one at a time while it ran, the 40 took longer than the 3 s hop on a loaded
    // CI machine, and the last of them arrived after the bad message's retry.
    produce_event(
        &s.topic,
        "bad",
        "it_event",
        "always-fails",
        &body(&s, serde_json::json!({"fail": -1})),
    )
    .await;
    produce_event(
        &s.topic,
        "flaky",
        "it_event",
        "fails-once",
        &body(&s, serde_json::json!({"fail": 1, "seq": 1})),
    )
    .await;
    for i in 0..40 {
        produce_event(
            &s.topic,
            &format!("k{i}"),
            "it_event",
            &format!("ok-{i}"),
            &body(&s, serde_json::json!({"seq": i})),
        )
        .await;
    }
    let r = start(&s, cfg, Probe::new(&s).await);
    wait_until(
        Duration::from_secs(40),
        "failing message dead-lettered, the 40 and the flaky one handled",
        // The flaky one's retry and the bad one's last hop race on a loaded machine (CI once
        // saw the dead letter first, with 40 handled): wait for both, the order is asserted
        // below from the attempts' timestamps.
        || async { get(&r.stats.dead_lettered) == 1 && get(&r.stats.handled) >= 41 },
    )
    .await;
    assert_eq!(get(&r.stats.handled), 41);
    assert_eq!(
        get(&r.stats.forwarded_to_retry),
        3,
        "2 hops for the bad one, 1 for the flaky one"
    );

    let rows = s.c
        .query("SELECT source_topic, extract(epoch FROM at)::float8 FROM attempts WHERE message_id = 'always-fails' ORDER BY id", &[])
        .await
        .unwrap();
    let topics: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(
        topics,
        [
            s.topic.clone(),
            format!("{}.{}.retry-3s", s.topic, s.group),
            format!("{}.{}.retry-2s", s.topic, s.group)
        ]
    );
    let at: Vec<f64> = rows.iter().map(|r| r.get(1)).collect();
    let (hop1, hop2) = (at[1] - at[0], at[2] - at[1]);
    eprintln!("measured hop delays: {hop1:.3}s (>= 3s), {hop2:.3}s (>= 2s)");
    assert!(hop1 >= 3.0, "first hop waited {hop1}");
    assert!(hop2 >= 2.0, "second hop waited {hop2}");
    // The others flowed meanwhile: all 40 were handled before the bad message's last attempt
    // (a consumer that retried in line would hold the partition through both hops, 5 s, and
    // handle them after it). Not "before its first retry": on a loaded CI machine the 40
    // handlings once took longer than that 3 s hop.
    let last_ok: f64 = s.c.query_one("SELECT extract(epoch FROM max(a.at))::float8 FROM attempts a WHERE message_id LIKE 'ok-%'", &[]).await.unwrap().get(0);
    eprintln!(
        "the 40 others handled within {:.3}s of the bad message's first attempt",
        last_ok - at[0]
    );
    assert!(
        last_ok < at[2],
        "other messages were not blocked by the retrying one: the last handled {:.3}s after its first attempt, its last attempt {:.3}s after",
        last_ok - at[0],
        at[2] - at[0]
    );

    let dlq = read_all(&format!("{}.dlq", s.topic)).await;
    assert_eq!(dlq.len(), 1);
    let d = &dlq[0];
    assert_eq!(header(d, "x-error-kind"), "transient-exhausted");
    assert_eq!(header(d, "x-attempts"), "3");
    assert_eq!(header(d, "x-original-topic"), s.topic);
    assert!(
        !d.headers.contains_key("x-retry-attempt"),
        "retry headers replaced in the DLQ"
    );
    let retry1 = read_all(&format!("{}.{}.retry-3s", s.topic, s.group)).await;
    let hop = retry1
        .iter()
        .find(|r| r.message_id() == "always-fails")
        .unwrap();
    assert_eq!(header(hop, "x-retry-attempt"), "1");
    assert_eq!(
        header(hop, "x-consumer-group"),
        s.group,
        "a retry record names its group"
    );
    assert_eq!(header(hop, "x-original-topic"), s.topic);
    assert!(header(hop, "x-error").contains("downstream timeout"));
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_unavailable_holds_the_offset_then_delivers_once_it_is_back() {
    use rdkafka::admin::{AdminClient, AdminOptions};
    let s = setup(1, &[]).await;
    let dlq = format!("{}.dlq", s.topic);
    let mut cfg = ConsumerConfig::new(&s.group, [&s.topic]);
    cfg.delivery_timeout = Duration::from_secs(2);
    let r = start(&s, cfg, Probe::new(&s).await);
    produce_event(
        &s.topic,
        "warmup",
        "it_event",
        "w",
        &body(&s, serde_json::json!({"seq": 0})),
    )
    .await;
    wait_until(Duration::from_secs(30), "consumer running", || async {
        get(&r.stats.handled) == 1
    })
    .await;

    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    admin
        .delete_topics(&[&dlq], &AdminOptions::new())
        .await
        .unwrap()[0]
        .as_ref()
        .unwrap();

    produce_event(
        &s.topic,
        "bad",
        "it_event",
        "perm",
        &body(&s, serde_json::json!({"permanent": true})),
    )
    .await; // offset 1
    produce_event(
        &s.topic,
        "good",
        "it_event",
        "after",
        &body(&s, serde_json::json!({"seq": 2})),
    )
    .await; // offset 2
    wait_until(
        Duration::from_secs(30),
        "other key handled, DLQ write failing",
        || async { get(&r.stats.handled) == 2 && get(&r.stats.forward_failures) >= 2 },
    )
    .await;
    // Wait past an auto-commit interval: the committed offset must not pass the failed message.
    let before = get(&r.stats.forward_failures);
    wait_until(
        Duration::from_secs(30),
        "more failed DLQ writes",
        || async { get(&r.stats.forward_failures) >= before + 2 },
    )
    .await;
    assert_eq!(
        committed(&s.group, &s.topic, 0).await,
        Some(1),
        "offset held at the undead-lettered message"
    );
    assert_eq!(get(&r.stats.dead_lettered), 0);

    create_topic(&dlq, 1).await;
    wait_until(
        Duration::from_secs(60),
        "dead letter written once the DLQ is back",
        || async { get(&r.stats.dead_lettered) == 1 },
    )
    .await;
    wait_until(Duration::from_secs(10), "offset moves on", || async {
        committed(&s.group, &s.topic, 0).await == Some(3)
    })
    .await;
    let recs = read_all(&dlq).await;
    // At least once: a write whose delivery report timed out on the client (2 s here, under
    // a loaded machine) after the broker had appended it is written again, the same letter
    // (CI saw two). Nothing else reaches the DLQ.
    assert!(!recs.is_empty());
    assert!(
        recs.iter().all(|r| r.message_id() == "perm"),
        "{:?}",
        recs.iter().map(|r| r.message_id()).collect::<Vec<_>>()
    );
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn per_key_order_holds_under_concurrency_16_with_retries() {
    let s = setup(3, &[]).await;
    let keys = 100;
    let per_key = 30;
    let ids = {
        // Through the real outbox: enqueue then relay, like production.
        let mut c = client(&s.db).await;
        let enq = outbox::Enqueuer::new(&s.db.schema);
        let tx = c.transaction().await.unwrap();
        let msgs: Vec<_> = (0..per_key)
            .flat_map(|seq| (0..keys).map(move |k| (k, seq)))
            .map(|(k, seq)| {
                outbox::Message::new(
                    &s.topic,
                    "it_event",
                    format!("key-{k}"),
                    body(&s, serde_json::json!({"seq": seq})),
                )
            })
            .collect();
        enq.enqueue_batch(&tx, &msgs).await.unwrap();
        tx.commit().await.unwrap();
        let relay = outbox::Relay::new(&s.db, &kafka(), relay_config()).unwrap();
        drain(&relay).await
    };
    assert_eq!(ids, keys * per_key);
    let mut cfg = ConsumerConfig::new(&s.group, [&s.topic]);
    cfg.concurrency = 16;
    cfg.retry = in_place(10, 5);
    let r = start(
        &s,
        cfg,
        Probe {
            random_transient_pct: 10,
            ..Probe::new(&s).await
        },
    );
    wait_until(Duration::from_secs(60), "all handled", || async {
        get(&r.stats.handled) == (keys * per_key) as u64
    })
    .await;
    assert!(get(&r.stats.in_place_retries) > 0, "retries were exercised");
    let violations = count(
        &s.c,
        "SELECT count(*) FROM (SELECT seq, lag(seq) OVER (PARTITION BY k ORDER BY id) AS prev FROM effects) x WHERE seq <= prev",
    )
    .await;
    assert_eq!(violations, 0, "per-key sequence numbers strictly increase");
    assert_eq!(
        count(&s.c, "SELECT count(DISTINCT message_id) FROM effects").await,
        (keys * per_key) as i64
    );
    assert_eq!(
        count(&s.c, "SELECT count(*) FROM effects").await,
        (keys * per_key) as i64
    );
    r.stop().await;
}

#[tokio::test]
async fn backpressure_pauses_instead_of_buffering_without_limit() {
    let s = setup(2, &[]).await;
    // A stalled downstream: each handler takes 250 ms, two at a time.
    for i in 0..24 {
        produce_event(
            &s.topic,
            &format!("k{i}"),
            "it_event",
            &format!("m{i}"),
            &body(&s, serde_json::json!({"seq": i, "sleep_ms": 250})),
        )
        .await;
    }
    let mut cfg = ConsumerConfig::new(&s.group, [&s.topic]);
    cfg.concurrency = 2;
    cfg.max_buffered = 8;
    cfg.pause_after = Duration::from_millis(100);
    let r = start(&s, cfg, Probe::new(&s).await);
    wait_until(Duration::from_secs(60), "all handled", || async {
        get(&r.stats.handled) == 24
    })
    .await;
    assert!(get(&r.stats.backpressure_pauses) > 0);
    r.stop().await;
}

#[tokio::test]
async fn missing_retry_or_dlq_topics_are_reported_at_startup() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await; // no .dlq, no retry topics
    let mut cfg = ConsumerConfig::new("g", [&topic]);
    cfg.retry = RetryStrategy::default_topics();
    let err = Consumer::new(&db, &kafka(), cfg)
        .unwrap()
        .run(async {})
        .await
        .unwrap_err();
    let text = err.to_string();
    for suffix in [".g.retry-5s", ".g.retry-30s", ".g.retry-5m", ".dlq"] {
        assert!(text.contains(&format!("{topic}{suffix}")), "{text}");
    }
    assert!(text.contains("outbox topics apply"), "{text}");
    assert!(matches!(err, ConsumerError::MissingTopics(ref v) if v.len() == 4));

    for bad in [
        ConsumerConfig::new("", [&topic]),
        ConsumerConfig::new("g", Vec::<String>::new()),
        ConsumerConfig::new("g", ["bad topic"]),
    ] {
        assert!(matches!(
            Consumer::new(&db, &kafka(), bad),
            Err(ConsumerError::Config(_))
        ));
    }
    let mut k = kafka();
    k.set_from_pair("enable.auto.offset.store=true").unwrap();
    assert!(matches!(
        Consumer::new(&db, &k, ConsumerConfig::new("g", [&topic])),
        Err(ConsumerError::Config(_))
    ));
}

#[tokio::test]
async fn inbox_alone_dedupes_and_rolls_back_with_the_work() {
    let db = fresh_db().await;
    let mut c = client(&db).await;
    let inbox = Inbox::new(&db.schema, "svc");
    let tx = c.transaction().await.unwrap();
    assert!(inbox.mark(&tx, "orders.created", "m1").await.unwrap());
    tx.rollback().await.unwrap();
    let tx = c.transaction().await.unwrap();
    assert!(
        inbox.mark(&tx, "orders.created", "m1").await.unwrap(),
        "rollback removed the mark"
    );
    tx.commit().await.unwrap();
    let tx = c.transaction().await.unwrap();
    assert!(
        !inbox.mark(&tx, "orders.created", "m1").await.unwrap(),
        "duplicate"
    );
    assert!(
        Inbox::new(&db.schema, "other-svc")
            .mark(&tx, "orders.created", "m1")
            .await
            .unwrap(),
        "groups dedupe separately"
    );
    tx.commit().await.unwrap();
}

/// Counts calls; used to show the consumer can be cancelled mid-retry without committing.
#[derive(Clone, Default)]
struct AlwaysTransient(Arc<AtomicU32>);
impl Handler for AlwaysTransient {
    fn handle<'a>(
        &'a self,
        _m: &'a Delivered,
        _tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Err(HandlerError::transient("down")) })
    }
}

#[tokio::test]
async fn graceful_stop_mid_retry_commits_nothing_past_the_unfinished_message() {
    let s = setup(1, &[]).await;
    produce_event(
        &s.topic,
        "k",
        "it_event",
        "first",
        &body(&s, serde_json::json!({"seq": 1})),
    )
    .await;
    produce_event(&s.topic, "k2", "stuck", "second", &serde_json::json!({})).await;
    produce_event(
        &s.topic,
        "k3",
        "it_event",
        "third",
        &body(&s, serde_json::json!({"seq": 3})),
    )
    .await;
    let calls = AlwaysTransient::default();
    let mut cfg = ConsumerConfig::new(&s.group, [&s.topic]);
    cfg.retry = in_place(1000, 200);
    let consumer = Consumer::new(&s.db, &kafka(), cfg)
        .unwrap()
        .handler("it_event", Probe::new(&s).await)
        .handler("stuck", calls.clone());
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let h = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    wait_until(
        Duration::from_secs(30),
        "others handled, stuck one retrying",
        || async { get(&stats.handled) == 2 && calls.0.load(Ordering::SeqCst) >= 2 },
    )
    .await;
    stop.send(()).unwrap();
    h.await.unwrap().unwrap();
    assert_eq!(
        committed(&s.group, &s.topic, 0).await,
        Some(1),
        "commit stops at the unfinished message"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn billing_consumer_killed_with_sigkill_mid_run_charges_every_order_exactly_once() {
    let s = setup(6, &[]).await;
    let total: usize = 20_000;
    s.c.batch_execute(
        "CREATE TABLE charges (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, order_number text NOT NULL,
                               amount_cents bigint NOT NULL, message_id text NOT NULL, charged_at timestamptz NOT NULL DEFAULT now())",
    )
    .await
    .unwrap();
    {
        let mut c = client(&s.db).await;
        let enq = outbox::Enqueuer::new(&s.db.schema);
        for chunk in 0..(total / 2000) {
            let tx = c.transaction().await.unwrap();
            let msgs: Vec<_> = (chunk * 2000..(chunk + 1) * 2000)
                .map(|i| {
                    let order = format!("o-{i}");
                    outbox::Message::new(
                        &s.topic,
                        "order_created",
                        &order,
                        serde_json::json!({"order_number": order, "total_cents": 100 + i}),
                    )
                })
                .collect();
            enq.enqueue_batch(&tx, &msgs).await.unwrap();
            tx.commit().await.unwrap();
        }
        let relay = outbox::Relay::new(&s.db, &kafka(), relay_config()).unwrap();
        assert_eq!(drain(&relay).await, total);
    }
    let spawn = || {
        std::process::Command::new(example_binary("billing_consumer"))
            .env("DATABASE_URL", database_url())
            .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
            .env("OUTBOX_SCHEMA", s.db.schema.name())
            .env("BILLING_TOPIC", &s.topic)
            .env("BILLING_GROUP", &s.group)
            .env("BILLING_CONCURRENCY", "16")
            .env("RUST_LOG", "warn")
            // A SIGKILLed member stays in the group until its session times out; keep that short
            // (the broker's minimum is 6 s) so restarts rebalance quickly.
            .env(
                "OUTBOX_KAFKA_PROPERTIES",
                "session.timeout.ms=6000;heartbeat.interval.ms=1000",
            )
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let charged =
        || async { count(&s.c, "SELECT count(DISTINCT order_number) FROM charges").await };
    let mut kills = 0;
    let t0 = std::time::Instant::now();
    for threshold in [3_000i64, 9_000, 15_000] {
        let mut child = spawn();
        wait_until(
            Duration::from_secs(120),
            "consumer makes progress",
            || async { charged().await >= threshold },
        )
        .await;
        eprintln!("{:?}: {threshold} charged, killing", t0.elapsed());
        child.kill().unwrap(); // SIGKILL: no graceful stop, no final commit
        child.wait().unwrap();
        kills += 1;
    }
    let mut child = spawn();
    wait_until(Duration::from_secs(120), "every order charged", || async {
        charged().await == total as i64
    })
    .await;
    let charges = count(&s.c, "SELECT count(*) FROM charges").await;
    let marks = count(&s.c, "SELECT count(*) FROM processed_messages").await;
    std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "graceful stop after the run");
    eprintln!("billing consumer: {total} orders, {kills} SIGKILLs, {charges} charges, {marks} inbox marks");
    assert_eq!(
        charges, total as i64,
        "every order charged exactly once despite {kills} kills"
    );
    assert_eq!(marks, total as i64);
    assert_eq!(topic_len(&format!("{}.dlq", s.topic)).await, 0, "DLQ empty");
}

/// Batch handler for the test: fails the whole batch permanently when any message asks for it.
struct BatchProbe;
impl outbox::consumer::BatchHandler for BatchProbe {
    fn handle_batch<'a>(
        &'a self,
        ms: &'a [&'a Delivered],
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            if ms
                .iter()
                .any(|m| m.json()["permanent"].as_bool() == Some(true))
            {
                return Err(HandlerError::permanent("bad item in batch"));
            }
            let ids: Vec<&str> = ms.iter().map(|m| m.message_id.as_str()).collect();
            let keys: Vec<&str> = ms.iter().map(|m| m.key_str().unwrap_or("")).collect();
            let seqs: Vec<i64> = ms
                .iter()
                .map(|m| m.json()["seq"].as_i64().unwrap_or(-1))
                .collect();
            tx.execute("INSERT INTO effects (message_id, k, seq) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])", &[&ids, &keys, &seqs])
                .await?;
            Ok(())
        })
    }
}

#[tokio::test]
async fn batched_handler_dedupes_keeps_key_order_and_dead_letters_only_the_bad_message() {
    let s = setup(2, &[]).await;
    for seq in 0..300 {
        produce_event(
            &s.topic,
            &format!("k{}", seq % 7),
            "it_event",
            &format!("m{seq}"),
            &serde_json::json!({"seq": seq}),
        )
        .await;
    }
    // A duplicate of m5 is a redelivery of the same record: same key (k5), same partition. (It
    // once had key k0: then, on another partition, it could win the race against the original
    // and land in k0's effects after seq 294 — a false order violation.)
    produce_event(
        &s.topic,
        "k5",
        "it_event",
        "m5",
        &serde_json::json!({"seq": 5}),
    )
    .await; // a duplicate
    produce_event(
        &s.topic,
        "bad",
        "it_event",
        "poison",
        &serde_json::json!({"permanent": true}),
    )
    .await;
    let consumer = Consumer::new(&s.db, &kafka(), ConsumerConfig::new(&s.group, [&s.topic]))
        .unwrap()
        .batch_handler("it_event", 50, BatchProbe);
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let h = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    wait_until(Duration::from_secs(30), "all settled", || async {
        get(&stats.handled) == 300 && get(&stats.duplicates) == 1 && get(&stats.dead_lettered) == 1
    })
    .await;
    assert_eq!(count(&s.c, "SELECT count(*) FROM effects").await, 300);
    let violations = count(&s.c, "SELECT count(*) FROM (SELECT seq, lag(seq) OVER (PARTITION BY k ORDER BY id) prev FROM effects) x WHERE seq <= prev").await;
    assert_eq!(violations, 0);
    let dlq = read_all(&format!("{}.dlq", s.topic)).await;
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].message_id(), "poison");
    stop.send(()).unwrap();
    h.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_consumer_joining_mid_run_rebalances_without_loss_or_double_effect() {
    let s = setup(6, &[]).await;
    let total = 3000;
    {
        let mut c = client(&s.db).await;
        let enq = outbox::Enqueuer::new(&s.db.schema);
        let tx = c.transaction().await.unwrap();
        let msgs: Vec<_> = (0..total)
            .map(|i| {
                outbox::Message::new(
                    &s.topic,
                    "it_event",
                    format!("key-{}", i % 300),
                    body(&s, serde_json::json!({"seq": i / 300, "sleep_ms": 20})),
                )
            })
            .collect();
        enq.enqueue_batch(&tx, &msgs).await.unwrap();
        tx.commit().await.unwrap();
        let relay = outbox::Relay::new(&s.db, &kafka(), relay_config()).unwrap();
        assert_eq!(drain(&relay).await, total);
    }
    let mut cfg = ConsumerConfig::new(&s.group, [&s.topic]);
    cfg.concurrency = 8;
    let a = start(&s, cfg.clone(), Probe::new(&s).await);
    wait_until(Duration::from_secs(30), "first consumer busy", || async {
        get(&a.stats.handled) >= 300
    })
    .await;
    // B joins: partitions are revoked from A and split; in-flight work of A on revoked
    // partitions finishes, their offsets are not stored, and B redelivers from the commit point.
    let b = start(&s, cfg, Probe::new(&s).await);
    wait_until(
        Duration::from_secs(120),
        "every message's effect",
        || async {
            count(&s.c, "SELECT count(DISTINCT message_id) FROM effects").await == total as i64
        },
    )
    .await;
    // ~7.5 s of work at 20 ms × 3,000 / 8: B joins long before A could finish alone.
    assert!(
        get(&b.stats.handled) > 0,
        "the second consumer took over partitions"
    );
    assert_eq!(
        count(&s.c, "SELECT count(*) FROM effects").await,
        total as i64,
        "no double effect"
    );
    let violations = count(&s.c, "SELECT count(*) FROM (SELECT seq, lag(seq) OVER (PARTITION BY k ORDER BY id) prev FROM effects) x WHERE seq <= prev").await;
    assert_eq!(violations, 0, "per-key order across the rebalance");
    // Redeliveries of what A had in flight when its partitions moved are still being found to
    // be duplicates after the last effect: stop once the group has committed everything.
    wait_until(
        Duration::from_secs(60),
        "offsets committed to the end",
        || async {
            let mut sum = 0;
            for p in 0..6 {
                sum += committed(&s.group, &s.topic, p).await.unwrap_or(0);
            }
            sum == total as i64
        },
    )
    .await;
    a.stop().await;
    b.stop().await;
    // Everything final is committed: the group's offsets reach the end of every partition.
    let mut committed_total = 0;
    for p in 0..6 {
        committed_total += committed(&s.group, &s.topic, p).await.unwrap_or(0);
    }
    assert_eq!(committed_total, total as i64);
}

/// Records each message with the id of the transaction it ran in, then fails when the body
/// asks — after its insert, so a failure leaves partial work to roll back: permanently, or
/// (`flaky`) transiently on its first try only.
struct TxProbe(&'static str, Mutex<std::collections::HashSet<String>>);
impl Handler for TxProbe {
    fn handle<'a>(
        &'a self,
        m: &'a Delivered,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let b = m.json();
            tx.execute(
                "INSERT INTO tx_effects (run, message_id, k, seq, txid) VALUES ($1, $2, $3, $4, txid_current())",
                &[&self.0, &m.message_id, &m.key_str().unwrap_or(""), &b["seq"].as_i64().unwrap_or(-1)],
            )
            .await?;
            if b["permanent"].as_bool() == Some(true) {
                return Err(HandlerError::permanent("declined after writing"));
            }
            if b["flaky"].as_bool() == Some(true)
                && self.1.lock().unwrap().insert(m.message_id.clone())
            {
                return Err(HandlerError::transient("timeout after writing"));
            }
            Ok(())
        })
    }
}

/// Commit groups (`consumer/group.rs`): a backlog of per-message work shares transactions,
/// and still each message's work and mark commit together or not at all — a handler that
/// fails after writing loses only its own rows (savepoint) and is dead-lettered alone; every
/// other message's effect is there exactly once, in per-key order. With `commit_group = 1`
/// every message has its own transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_per_message_work_shares_transactions_and_a_failure_rolls_back_only_its_own() {
    let s = setup(3, &[]).await;
    s.c.batch_execute(
        "CREATE TABLE tx_effects (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, run text,
                                  message_id text, k text, seq bigint, txid bigint)",
    )
    .await
    .unwrap();
    let (n, poison) = (400, [37, 150, 151, 333]);
    for seq in 0..n {
        let body = if poison.contains(&seq) {
            serde_json::json!({"seq": seq, "permanent": true})
        } else if seq % 50 == 7 {
            // Fails once, then succeeds alone: its mark must have left with its work.
            serde_json::json!({"seq": seq, "flaky": true})
        } else {
            serde_json::json!({"seq": seq})
        };
        produce_event(
            &s.topic,
            &format!("k{}", seq % 40),
            "it_event",
            &format!("m{seq}"),
            &body,
        )
        .await;
    }
    for (run, commit_group) in [("grouped", 16), ("alone", 1)] {
        let config = {
            let mut c = ConsumerConfig::new(format!("{}-{run}", s.group), [&s.topic]);
            c.concurrency = 2;
            c.commit_group = commit_group;
            c
        };
        let consumer = Consumer::new(&s.db, &kafka(), config)
            .unwrap()
            .handler("it_event", TxProbe(run, Mutex::default()));
        let stats = consumer.stats();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let h = tokio::spawn(consumer.run(async move {
            let _ = stopped.await;
        }));
        wait_until(Duration::from_secs(60), "all settled", || async {
            get(&stats.handled) == (n - 4) as u64 && get(&stats.dead_lettered) == 4
        })
        .await;
        let group = format!("{}-{run}", s.group);
        wait_until(
            Duration::from_secs(30),
            "offsets committed to the end",
            || async {
                let mut sum = 0;
                for p in 0..3 {
                    sum += committed(&group, &s.topic, p).await.unwrap_or(0);
                }
                sum == n as i64
            },
        )
        .await;
        stop.send(()).unwrap();
        h.await.unwrap().unwrap();
        let q = |sql: &str| sql.replace("$run", &format!("'{run}'"));
        let c = &s.c;
        assert_eq!(
            count(c, &q("SELECT count(*) FROM tx_effects WHERE run = $run")).await,
            (n - 4) as i64,
            "{run}: one row per good message, none of the failed ones"
        );
        assert_eq!(
            count(c, &q("SELECT count(DISTINCT message_id) FROM tx_effects WHERE run = $run AND message_id IN ('m37', 'm150', 'm151', 'm333')")).await,
            0
        );
        let violations = count(c, &q("SELECT count(*) FROM (SELECT seq, lag(seq) OVER (PARTITION BY k ORDER BY id) prev FROM tx_effects WHERE run = $run) x WHERE seq <= prev")).await;
        assert_eq!(violations, 0, "{run}: per-key order");
        let txs = count(
            c,
            &q("SELECT count(DISTINCT txid) FROM tx_effects WHERE run = $run"),
        )
        .await;
        println!("{run}: {} messages in {txs} transactions", n - 4);
        if commit_group == 1 {
            assert_eq!(txs, (n - 4) as i64, "a transaction per message");
        } else {
            assert!(
                txs < (n as i64) / 3,
                "{txs} transactions: groups formed from the backlog"
            );
        }
    }
    let dlq = read_all(&format!("{}.dlq", s.topic)).await;
    assert_eq!(
        dlq.len(),
        8,
        "each poison message dead-lettered once per group"
    );
}

/// Dead letters written once across a crash *between* the broker's append and the consumer's
/// record of it (`dead_lettered`, V11): the row is put back to the state such a crash leaves —
/// an intent naming the dead-letter partition and its end offset before the write — and the
/// group re-reads the poison message. With the letter present after that offset it is not
/// written again; with the intent's offset past the letter (the crash came before the append)
/// it is written, so nothing is lost either way.
#[tokio::test]
async fn an_intent_left_by_a_crash_mid_write_is_resolved_from_the_dead_letter_partition() {
    let s = setup(1, &[]).await;
    produce_event(
        &s.topic,
        "k",
        "it_event",
        "poison-1",
        &body(&s, serde_json::json!({"permanent": true})),
    )
    .await;
    let dlq = format!("{}.dlq", s.topic);
    let run_once = |expect_dead: u64| {
        let s = &s;
        async move {
            let r = start(
                s,
                ConsumerConfig::new(&s.group, [&s.topic]),
                Probe::new(s).await,
            );
            wait_until(Duration::from_secs(30), "poison settled", || async {
                get(&r.stats.dead_lettered) == expect_dead
                    && committed(&s.group, &s.topic, 0).await == Some(1)
            })
            .await;
            r.stop().await;
        }
    };
    run_once(1).await;
    assert_eq!(topic_len(&dlq).await, 1);
    let letter = read_all(&dlq).await.remove(0);
    let state = "SELECT written, dlq_partition, dlq_from FROM dead_lettered";
    let row = s.c.query_one(state, &[]).await.unwrap();
    assert_eq!(
        (row.get::<_, bool>(0), row.get::<_, Option<i32>>(1)),
        (true, Some(letter.partition)),
        "written, and the intent named the partition the letter went to"
    );
    assert!(row.get::<_, Option<i64>>(2).unwrap() <= letter.offset);

    // A crash after the intent: the row is put back to an intent from `from` on, and the
    // poison message is read again.
    let crash_with_intent_from = |from: i64| {
        let (s, letter) = (&s, &letter);
        async move {
            s.c.execute(
                "UPDATE dead_lettered SET written = false, dlq_partition = $1, dlq_from = $2",
                &[&letter.partition, &from],
            )
            .await
            .unwrap();
            rewind_group(&s.group, &s.topic, 1).await;
        }
    };

    // 1. The crash came after the append: the letter is found and not written again.
    crash_with_intent_from(letter.offset).await;
    run_once(0).await;
    assert_eq!(
        topic_len(&dlq).await,
        1,
        "found in the partition: not written twice"
    );
    assert!(
        s.c.query_one(state, &[]).await.unwrap().get::<_, bool>(0),
        "marked written"
    );

    // 2. The crash came before the append: nothing after the intent's offset, so it is written.
    crash_with_intent_from(letter.offset + 1).await;
    run_once(1).await;
    assert_eq!(
        topic_len(&dlq).await,
        2,
        "not found after the intent: written, not lost"
    );
}

/// A handler that catches its own statement's error and returns `Ok` leaves its transaction
/// aborted; `COMMIT` would then roll back without an error. Alone and in a commit group, the
/// message must not count as handled with nothing written: it is retried, then dead-lettered,
/// and the others of its group still commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_swallows_its_own_error_is_not_reported_done() {
    async fn swallow(
        m: &outbox::consumer::Delivered,
        tx: &tokio_postgres::Transaction<'_>,
    ) -> Result<(), HandlerError> {
        if m.json()["bad"] == true {
            let _ = tx
                .execute("INSERT INTO no_such_table VALUES (1)", &[])
                .await;
            return Ok(());
        }
        tx.execute(
            "INSERT INTO effects (message_id) VALUES ($1)",
            &[&m.message_id],
        )
        .await?;
        Ok(())
    }
    let s = setup(1, &[]).await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let id = format!("m{i}-{}", hex(6));
        produce_event(
            &s.topic,
            &format!("k{i}"),
            "it_event",
            &id,
            &serde_json::json!({ "bad": i == 7 }),
        )
        .await;
        ids.push(id);
    }
    let mut cfg = ConsumerConfig::new(s.group.clone(), [s.topic.clone()]);
    cfg.retry = in_place(3, 20);
    // One slot: the backlog forms commit groups, so the bad one is tried in a group first.
    cfg.concurrency = 1;
    let consumer = Consumer::new(&s.db, &kafka(), cfg)
        .unwrap()
        .handler("it_event", swallow);
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    wait_until(
        Duration::from_secs(60),
        "19 handled, 1 dead letter",
        || async { get(&stats.handled) == 19 && get(&stats.dead_lettered) == 1 },
    )
    .await;
    assert_eq!(count(&s.c, "SELECT count(*) FROM effects").await, 19);
    assert_eq!(
        count(&s.c, "SELECT count(*) FROM processed_messages").await,
        19
    );
    let letters = read_all(&format!("{}.dlq", s.topic)).await;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].headers.get("message_id"), Some(&ids[7]));
    assert_eq!(
        letters[0].headers.get("x-error-kind").map(String::as_str),
        Some("transient-exhausted")
    );
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// The consumer reads `read_committed`: a record of an aborted Kafka transaction (what an
/// exactly-once relay's aborted batch leaves in the log) never reaches a handler, the
/// committed one does; a configuration asking for `read_uncommitted` is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_aborted_transactions_never_reach_a_handler() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};
    let s = setup(1, &[]).await;
    let topic = s.topic.clone();
    tokio::task::spawn_blocking(move || {
        let p: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("transactional.id", format!("it-txn-{}", hex(8)))
            .create()
            .unwrap();
        p.init_transactions(Duration::from_secs(30)).unwrap();
        for (id, commit) in [("aborted-1", false), ("committed-1", true)] {
            p.begin_transaction().unwrap();
            let headers = rdkafka::message::OwnedHeaders::new()
                .insert(rdkafka::message::Header {
                    key: "message_type",
                    value: Some("it_event"),
                })
                .insert(rdkafka::message::Header {
                    key: "message_id",
                    value: Some(id),
                });
            p.send(
                BaseRecord::to(&topic)
                    .key("k")
                    .payload(r#"{"seq": 1}"#)
                    .headers(headers),
            )
            .unwrap();
            p.flush(Duration::from_secs(10)).unwrap();
            if commit {
                p.commit_transaction(Duration::from_secs(30)).unwrap();
            } else {
                p.abort_transaction(Duration::from_secs(30)).unwrap();
            }
        }
    })
    .await
    .unwrap();
    let probe = Probe::new(&s).await;
    let consumer = Consumer::new(&s.db, &kafka(), ConsumerConfig::new(&s.group, [&s.topic]))
        .unwrap()
        .handler("it_event", probe);
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let h = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    wait_until(
        Duration::from_secs(60),
        "the committed record handled",
        || async { get(&stats.handled) == 1 },
    )
    .await;
    // Past both records (and the markers): the aborted one was skipped, not pending.
    wait_until(
        Duration::from_secs(30),
        "offset past everything",
        || async { committed(&s.group, &s.topic, 0).await.unwrap_or(0) >= 3 },
    )
    .await;
    stop.send(()).unwrap();
    h.await.unwrap().unwrap();
    assert_eq!(
        texts(&s.c, "SELECT message_id FROM attempts").await,
        ["committed-1"],
        "the aborted record never reached the handler"
    );

    let mut uncommitted = kafka();
    uncommitted
        .set_from_pair("isolation.level=read_uncommitted")
        .unwrap();
    let err = Consumer::new(
        &s.db,
        &uncommitted,
        ConsumerConfig::new(&s.group, [&s.topic]),
    )
    .err()
    .expect("refused");
    assert!(err.to_string().contains("read_committed"), "{err}");
}
