//! Call handlers (seed 000's consumer): the external call runs with no transaction open and
//! no connection held, a processed message is never called again, a crash between the call
//! and its mark repeats that call alone and with the same idempotency key, and retries, dead
//! letters and per-key order hold as for any handler.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::consumer::{
    BoxFuture, CallHandler, Consumer, ConsumerConfig, ConsumerStats, Delivered, HandlerError,
    RetryStrategy,
};
use outbox_testkit::*;

/// The external API as the test sees it: every call it received, in order, with its
/// idempotency key.
#[derive(Clone, Default)]
struct Api {
    calls: Arc<Mutex<Vec<(String, i64, String)>>>,
}

impl Api {
    fn calls(&self) -> Vec<(String, i64, String)> {
        self.calls.lock().unwrap().clone()
    }
    fn per_message(&self) -> HashMap<String, Vec<String>> {
        let mut m: HashMap<String, Vec<String>> = HashMap::new();
        for (key, seq, idem) in self.calls() {
            m.entry(format!("{key}/{seq}")).or_default().push(idem);
        }
        m
    }
}

/// What the handler under test does, per message body: `{"seq": n, "act": …}`.
struct Service {
    api: Api,
    /// Watches the consumer's own sessions during each call.
    watch: Option<Watch>,
    /// A call that answered but whose process dies before the mark: the call never returns.
    hang_on: Option<(i64, Arc<AtomicBool>)>,
    transient_left: Arc<AtomicI64>,
}

struct Watch {
    pg: tokio_postgres::Client,
    app: String,
    /// Most of the consumer's sessions seen in a transaction older than the call so far.
    held: Arc<AtomicI64>,
    /// Most sessions of the consumer seen at once.
    sessions: Arc<AtomicI64>,
}

impl CallHandler for Service {
    type Reply = i64;

    fn call<'a>(&'a self, m: &'a Delivered) -> BoxFuture<'a, Result<i64, HandlerError>> {
        Box::pin(async move {
            let seq = m.json()["seq"].as_i64().unwrap_or(-1);
            let act = m.json()["act"].as_str().unwrap_or("ok");
            if act == "transient" && self.transient_left.fetch_sub(1, Ordering::SeqCst) > 0 {
                return Err(HandlerError::from_http_status(503, "busy"));
            }
            if act == "refused" {
                return Err(HandlerError::from_http_status(422, "unknown customer"));
            }
            if act == "panic" {
                panic!("the client library blew up");
            }
            tokio::time::sleep(Duration::from_millis(if self.watch.is_some() {
                400
            } else {
                150
            }))
            .await;
            if let Some(w) = &self.watch {
                // While this call waits: does any session of the consumer sit in a
                // transaction that began before the call?
                let r = w
                    .pg
                    .query_one(
                        "SELECT count(*) FILTER (WHERE xact_start < clock_timestamp() - interval '300 ms'),
                                count(*)
                           FROM pg_stat_activity WHERE application_name = $1",
                        &[&w.app],
                    )
                    .await
                    .unwrap();
                w.held.fetch_max(r.get(0), Ordering::SeqCst);
                w.sessions.fetch_max(r.get(1), Ordering::SeqCst);
            }
            self.api.calls.lock().unwrap().push((
                m.key_str().unwrap_or("").to_owned(),
                seq,
                m.idempotency_key().to_owned(),
            ));
            if let Some((n, armed)) = &self.hang_on {
                if *n == seq && armed.swap(false, Ordering::SeqCst) {
                    // The API applied it; this process dies before it hears back.
                    std::future::pending::<()>().await;
                }
            }
            Ok(if act == "negative" { -1 } else { seq })
        })
    }

    fn record<'a>(
        &'a self,
        m: &'a Delivered,
        points: &'a i64,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            if m.json()["act"] == "record_panic" {
                panic!("the record blew up");
            }
            if m.json()["act"] == "swallow" {
                // A record that catches its statement's error and says all is well: the
                // transaction is aborted, and its COMMIT would roll back without a word.
                let _ = tx
                    .execute("INSERT INTO no_such_table VALUES (1)", &[])
                    .await;
                return Ok(());
            }
            tx.execute(
                "INSERT INTO notified (message_id, points) VALUES ($1, $2)",
                &[&m.message_id, points],
            )
            .await?;
            Ok(())
        })
    }
}

fn service(api: &Api) -> Service {
    Service {
        api: api.clone(),
        watch: None,
        hang_on: None,
        transient_left: Arc::new(AtomicI64::new(0)),
    }
}

async fn setup(partitions: i32) -> (outbox::DbConfig, tokio_postgres::Client, String) {
    let db = fresh_db().await;
    let c = client(&db).await;
    // Points are never negative: a record that breaks it fails in the mark's transaction.
    c.batch_execute(
        "CREATE TABLE notified (message_id text PRIMARY KEY, points bigint NOT NULL CHECK (points >= 0))",
    )
    .await
    .unwrap();
    let topic = topic_name();
    create_topic_family(&topic, partitions, &[]).await;
    (db, c, topic)
}

/// Sends `n` events per key, `seq` counting per key; returns their message ids in order.
async fn send(topic: &str, keys: &[&str], n: i64, act: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for seq in 0..n {
        for k in keys {
            let id = uuid::Uuid::now_v7().to_string();
            produce_event(
                topic,
                k,
                "order_created",
                &id,
                &serde_json::json!({ "seq": seq, "act": act }),
            )
            .await;
            ids.push(id);
        }
    }
    ids
}

struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), outbox::consumer::ConsumerError>>,
    stats: Arc<ConsumerStats>,
}

fn start(db: &outbox::DbConfig, cfg: ConsumerConfig, s: Service) -> Running {
    let consumer = Consumer::new(db, &kafka(), cfg)
        .unwrap()
        .call_handler("order_created", s);
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    Running { stop, task, stats }
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_wait_with_no_transaction_open_keep_key_order_and_a_processed_message_is_never_called_again(
) {
    let (mut db, c, topic) = setup(3).await;
    let watcher = client(&db).await;
    let app = format!("call-{}", hex(6));
    db.set_application_name(&app);
    let api = Api::default();
    let (held, sessions) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicI64::new(0)));
    let keys = ["k1", "k2", "k3", "k4", "k5", "k6"];
    let ids = send(&topic, &keys, 10, "ok").await;
    let mut cfg = ConsumerConfig::new(format!("g-{}", hex(6)), [topic.clone()]);
    cfg.concurrency = 32;
    let s = Service {
        watch: Some(Watch {
            pg: watcher,
            app: app.clone(),
            held: held.clone(),
            sessions: sessions.clone(),
        }),
        ..service(&api)
    };
    let r = start(&db, cfg, s);
    wait_until(Duration::from_secs(60), "60 notified", || async {
        count(&c, "SELECT count(*) FROM notified").await == 60
    })
    .await;
    assert_eq!(
        held.load(Ordering::SeqCst),
        0,
        "a session of the consumer sat in a transaction during a call"
    );
    // Two mark writers and the runtime's own two: bounded by the marks, not by the 32 calls.
    let peak = sessions.load(Ordering::SeqCst);
    assert!(peak <= 4, "{peak} sessions for 32 calls in flight");
    let calls = api.calls();
    assert_eq!(calls.len(), 60);
    // Every call carried its message id as the idempotency key; each key's calls in order.
    let sent: HashSet<&String> = ids.iter().collect();
    assert!(calls.iter().all(|(_, _, idem)| sent.contains(idem)));
    for k in keys {
        let seqs: Vec<i64> = calls
            .iter()
            .filter(|(key, _, _)| key == k)
            .map(|c| c.1)
            .collect();
        assert_eq!(seqs, (0..10).collect::<Vec<_>>(), "order of {k}");
    }

    // The same 60 messages again (a producer retry, a replay): duplicates, no call.
    for (i, id) in ids.iter().enumerate() {
        let (k, seq) = (keys[i % 6], (i / 6) as i64);
        produce_event(
            &topic,
            k,
            "order_created",
            id,
            &serde_json::json!({ "seq": seq, "act": "ok" }),
        )
        .await;
    }
    wait_until(Duration::from_secs(60), "60 duplicates", || async {
        ConsumerStats::get(&r.stats.duplicates) == 60
    })
    .await;
    assert_eq!(
        api.calls().len(),
        60,
        "a processed message was called again"
    );
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_a_call_and_its_mark_repeats_that_call_alone_with_the_same_key() {
    let (db, c, topic) = setup(1).await;
    let group = format!("g-{}", hex(6));
    let api = Api::default();
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    // One event per key: seq 0 each; the fifth key's call never returns in the first process.
    send(&topic, &key_refs, 1, "ok").await;
    let hang = Arc::new(AtomicBool::new(true));
    let k5 = "k5/0".to_owned();

    // The first process runs on its own runtime, so dropping that runtime ends all of it at
    // once — consumer, handler tasks, mark writers, connections — as a crash would.
    let crashed = {
        let (db, topic, group, api, hang) = (
            db.clone(),
            topic.clone(),
            group.clone(),
            api.clone(),
            hang.clone(),
        );
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.spawn(async move {
            let mut cfg = ConsumerConfig::new(group, [topic]);
            cfg.concurrency = 8;
            let s = Service {
                hang_on: Some((0, hang)),
                ..service(&api)
            };
            // Only the fifth key's event hangs: `hang_on` is per seq, so gate it by key.
            let consumer = Consumer::new(&db, &kafka(), cfg)
                .unwrap()
                .call_handler("order_created", OnlyKey("k5", s));
            let _ = consumer.run(std::future::pending::<()>()).await;
        });
        rt
    };
    wait_until(
        Duration::from_secs(60),
        "19 notified, k5 hanging",
        || async {
            count(&c, "SELECT count(*) FROM notified").await == 19
                && api.per_message().contains_key(&k5)
        },
    )
    .await;
    let marked_at_crash: HashSet<String> = texts(&c, "SELECT message_id FROM notified")
        .await
        .into_iter()
        .collect();
    // Let librdkafka's auto-commit store what it may (only offsets before k5: it is not final).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    crashed.shutdown_background();

    // A new process of the same group.
    let mut cfg = ConsumerConfig::new(group, [topic.clone()]);
    cfg.concurrency = 8;
    let r = start(&db, cfg, service(&api));
    wait_until(Duration::from_secs(60), "20 notified", || async {
        count(&c, "SELECT count(*) FROM notified").await == 20
    })
    .await;
    let calls = api.per_message();
    assert_eq!(calls.len(), 20);
    let k5_calls = &calls[&k5];
    assert_eq!(k5_calls.len(), 2, "the call in the window repeats once");
    assert_eq!(k5_calls[0], k5_calls[1], "with the same idempotency key");
    for (m, keys) in &calls {
        if m != &k5 {
            assert_eq!(keys.len(), 1, "{m} was called again although it was marked");
        }
    }
    // The events after k5 were marked but not committed: redelivered, found marked, not called.
    let dups = ConsumerStats::get(&r.stats.duplicates);
    assert!(dups >= 14, "only {dups} redelivered duplicates");
    assert_eq!(marked_at_crash.len(), 19);
    assert_eq!(
        count(&c, "SELECT count(DISTINCT message_id) FROM notified").await,
        20
    );
    r.stop().await;
}

/// `Service`, hanging only for the events of one key.
struct OnlyKey(&'static str, Service);

impl CallHandler for OnlyKey {
    type Reply = i64;
    fn call<'a>(&'a self, m: &'a Delivered) -> BoxFuture<'a, Result<i64, HandlerError>> {
        if m.key_str() == Some(self.0) {
            self.1.call(m)
        } else {
            Box::pin(async move {
                let seq = m.json()["seq"].as_i64().unwrap_or(-1);
                self.1.api.calls.lock().unwrap().push((
                    m.key_str().unwrap_or("").to_owned(),
                    seq,
                    m.idempotency_key().to_owned(),
                ));
                Ok(seq)
            })
        }
    }
    fn record<'a>(
        &'a self,
        m: &'a Delivered,
        r: &'a i64,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        self.1.record(m, r, tx)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_calls_and_records_are_retried_or_dead_lettered_and_never_marked() {
    let (db, c, topic) = setup(1).await;
    let api = Api::default();
    let s = Service {
        transient_left: Arc::new(AtomicI64::new(2)),
        ..service(&api)
    };
    let retried = send(&topic, &["a"], 1, "transient").await;
    let refused = send(&topic, &["b"], 1, "refused").await;
    let negative = send(&topic, &["c"], 1, "negative").await;
    let panicked = send(&topic, &["d"], 1, "panic").await;
    let record_panicked = send(&topic, &["h"], 1, "record_panic").await;
    let swallowed = send(&topic, &["i"], 1, "swallow").await;
    let fine = send(&topic, &["e", "f", "g"], 1, "ok").await;
    let mut cfg = ConsumerConfig::new(format!("g-{}", hex(6)), [topic.clone()]);
    cfg.retry = RetryStrategy::InPlace {
        attempts: 5,
        base: Duration::from_millis(50),
        max: Duration::from_millis(100),
    };
    let r = start(&db, cfg, s);
    wait_until(Duration::from_secs(60), "5 dead letters", || async {
        topic_len(&format!("{topic}.dlq")).await == 5
    })
    .await;
    wait_until(Duration::from_secs(60), "4 notified", || async {
        count(&c, "SELECT count(*) FROM notified").await == 4
    })
    .await;
    let notified: HashSet<String> = texts(&c, "SELECT message_id FROM notified")
        .await
        .into_iter()
        .collect();
    let want: HashSet<String> = retried.iter().chain(&fine).cloned().collect();
    assert_eq!(notified, want);
    // The transient call failed twice, then answered: three calls, one effect.
    assert_eq!(
        api.calls().iter().filter(|c| c.0 == "a").count(),
        1,
        "only the answered call reaches the API log"
    );
    // Two for the transient call, four for the swallowed record (5 attempts).
    assert_eq!(ConsumerStats::get(&r.stats.in_place_retries), 2 + 4);
    // A refused call, a record that breaks a CHECK, a panic in the call and one in the record:
    // one dead letter each, the right kind.
    let letters = read_all(&format!("{topic}.dlq")).await;
    let kind_of = |id: &str| {
        letters
            .iter()
            .find(|l| l.headers.get("message_id").map(String::as_str) == Some(id))
            .and_then(|l| l.headers.get("x-error-kind").cloned())
    };
    assert_eq!(kind_of(&refused[0]).as_deref(), Some("permanent"));
    assert_eq!(kind_of(&negative[0]).as_deref(), Some("permanent"));
    assert_eq!(kind_of(&panicked[0]).as_deref(), Some("panic"));
    // A panic in `record` (in the mark writer) is the message's own panic letter.
    assert_eq!(kind_of(&record_panicked[0]).as_deref(), Some("panic"));
    // The swallowed error is caught before COMMIT: retried, then dead-lettered, never
    // reported done with nothing written.
    assert_eq!(
        kind_of(&swallowed[0]).as_deref(),
        Some("transient-exhausted")
    );
    // Nothing dead-lettered is marked: a fixed consumer can take a replay of them.
    assert_eq!(
        count(&c, "SELECT count(*) FROM processed_messages").await,
        4
    );
    r.stop().await;
}
