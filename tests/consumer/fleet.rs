//! Several services (consumer groups) on one topic, as a team runs them: each group's retries
//! stay its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::consumer::{
    BoxFuture, Consumer, ConsumerConfig, ConsumerStats, Delivered, Handler, HandlerError,
    RetryStrategy,
};
use outbox_testkit::*;

/// Records every handling as (group, message id, key, seq, the topic it came from) in the
/// handler's transaction; fails transiently on the first try of every `fail_every`-th seq.
#[derive(Clone)]
struct Service {
    group: String,
    fail_every: Option<i64>,
    tries: Arc<Mutex<HashMap<String, u32>>>,
}

impl Handler for Service {
    fn handle<'a>(
        &'a self,
        msg: &'a Delivered,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let seq = msg.json()["seq"].as_i64().unwrap_or(-1);
            let n = {
                let mut t = self.tries.lock().unwrap();
                let e = t.entry(msg.message_id.clone()).or_default();
                *e += 1;
                *e
            };
            if self.fail_every.is_some_and(|k| seq % k == 0) && n == 1 {
                return Err(HandlerError::transient("downstream timeout"));
            }
            tx.execute(
                "INSERT INTO handled (grp, message_id, k, seq, source_topic) VALUES ($1, $2, $3, $4, $5)",
                &[&self.group, &msg.message_id, &msg.key_str().unwrap_or(""), &seq, &msg.source_topic],
            )
            .await?;
            Ok(())
        })
    }
}

struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<Result<(), outbox::consumer::ConsumerError>>,
    stats: Arc<ConsumerStats>,
}

fn start(db: &outbox::DbConfig, topic: &str, group: &str, fail_every: Option<i64>) -> Running {
    let mut cfg = ConsumerConfig::new(group, [topic]);
    cfg.retry = RetryStrategy::Topics {
        delays: vec![Duration::from_secs(1), Duration::from_secs(2)],
    };
    let service = Service {
        group: group.into(),
        fail_every,
        tries: Arc::default(),
    };
    let consumer = Consumer::new(db, &kafka(), cfg)
        .unwrap()
        .handler("it_event", service);
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

/// Per key, pairs of handlings (in commit order) whose seqs go backwards.
async fn order_breaks(c: &tokio_postgres::Client, group: &str, skip_retried: bool) -> usize {
    let rows = c
        .query(
            "SELECT k, seq, source_topic FROM handled WHERE grp = $1 ORDER BY id",
            &[&group],
        )
        .await
        .unwrap();
    let mut last: HashMap<String, i64> = HashMap::new();
    let mut breaks = 0;
    for r in rows {
        let (k, seq, source): (String, i64, String) = (r.get(0), r.get(1), r.get(2));
        if skip_retried && source.contains(".retry-") {
            continue;
        }
        if last.get(&k).is_some_and(|&prev| prev > seq) {
            breaks += 1;
        }
        last.insert(k, seq);
    }
    breaks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_services_on_one_topic_each_retry_only_their_own() {
    const N: i64 = 500;
    let db = fresh_db().await;
    let topic = topic_name();
    let (a, b) = (format!("svc-a-{}", hex(6)), format!("svc-b-{}", hex(6)));
    let mut file = format!(
        "[defaults]\npartitions = 3\nretry_delays = [\"1s\", \"2s\"]\n[[topic]]\nname = \"{topic}\"\ngroups = [\"{a}\", \"{b}\"]\n"
    );
    file.push('\n');
    let specs = outbox::topics::plan(&file).unwrap();
    let applied = outbox::topics::apply(&kafka(), &specs, false)
        .await
        .unwrap();
    assert_eq!(applied.len(), 6, "main, 2 retry topics per group, dlq");
    let c = client(&db).await;
    c.batch_execute(
        "CREATE TABLE handled (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, grp text NOT NULL,
                               message_id text NOT NULL, k text NOT NULL, seq bigint NOT NULL,
                               source_topic text NOT NULL)",
    )
    .await
    .unwrap();

    let ra = start(&db, &topic, &a, Some(7));
    for seq in 0..N {
        produce_event(
            &topic,
            &format!("k{}", seq % 50),
            "it_event",
            &format!("m{seq}"),
            &serde_json::json!({"seq": seq}),
        )
        .await;
    }
    // B starts once A has retries in flight, as the second service of a team would.
    wait_until(Duration::from_secs(60), "A forwarded retries", || async {
        ConsumerStats::get(&ra.stats.forwarded_to_retry) >= 20
    })
    .await;
    let rb = start(&db, &topic, &b, None);
    let retried = (0..N).filter(|s| s % 7 == 0).count() as i64;
    wait_until(
        Duration::from_secs(90),
        "both groups handled everything",
        || async {
            count(
                &c,
                &format!("SELECT count(*) FROM handled WHERE grp = '{a}'"),
            )
            .await
                == N
                && count(
                    &c,
                    &format!("SELECT count(*) FROM handled WHERE grp = '{b}'"),
                )
                .await
                    == N
        },
    )
    .await;
    assert_eq!(
        ConsumerStats::get(&ra.stats.forwarded_to_retry) as i64,
        retried
    );

    // Exactly one handling per group and message.
    for g in [&a, &b] {
        let distinct = count(
            &c,
            &format!("SELECT count(DISTINCT message_id) FROM handled WHERE grp = '{g}'"),
        )
        .await;
        assert_eq!(distinct, N, "{g} handled each message once");
    }
    // B never failed: nothing of B's came from a retry topic, its order is intact.
    let from_retry = count(
        &c,
        &format!(
            "SELECT count(*) FROM handled WHERE grp = '{b}' AND source_topic LIKE '%.retry-%'"
        ),
    )
    .await;
    assert_eq!(from_retry, 0, "B was handed retries that were not its own");
    assert_eq!(order_breaks(&c, &b, false).await, 0, "B's per-key order");
    assert_eq!(ConsumerStats::get(&rb.stats.forwarded_to_retry), 0);
    // A's retried messages came back from A's own retry topic; the rest kept per-key order.
    let a_retry = texts(
        &c,
        &format!("SELECT DISTINCT source_topic FROM handled WHERE grp = '{a}' AND source_topic LIKE '%.retry-%'"),
    )
    .await;
    assert_eq!(a_retry, [format!("{topic}.{a}.retry-1s")]);
    assert_eq!(
        order_breaks(&c, &a, true).await,
        0,
        "A's per-key order outside retries"
    );
    for r in read_all(&format!("{topic}.{a}.retry-1s")).await {
        assert_eq!(
            r.headers.get("x-consumer-group").map(String::as_str),
            Some(a.as_str())
        );
    }
    assert_eq!(topic_len(&format!("{topic}.{b}.retry-1s")).await, 0);

    // A retry record of another group on A's retry topic (a hand-made mistake): ignored and
    // counted, not handled.
    let body = serde_json::to_vec(&serde_json::json!({"seq": 9999})).unwrap();
    produce(
        &format!("{topic}.{a}.retry-1s"),
        Some(b"k1"),
        &[
            ("message_type", b"it_event".as_slice()),
            ("entity_id", b"k1"),
            ("message_id", b"foreign-1"),
            ("timestamp", b"2026-01-15T12:34:56Z"),
            ("x-retry-attempt", b"1"),
            ("x-original-topic", topic.as_bytes()),
            ("x-consumer-group", b.as_bytes()),
        ],
        Some(&body),
    )
    .await;
    wait_until(Duration::from_secs(30), "foreign retry ignored", || async {
        ConsumerStats::get(&ra.stats.foreign_retries) == 1
    })
    .await;
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM handled WHERE message_id = 'foreign-1'"
        )
        .await,
        0
    );
    ra.stop().await;
    rb.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_only_service_cleans_its_own_old_marks_and_status_shows_what_is_overdue() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let (a, b) = (format!("svc-a-{}", hex(6)), format!("svc-b-{}", hex(6)));
    let c = client(&db).await;
    // Months of a consumer-only service: 120 marks of A and 30 of B older than 14 days, 10
    // fresh ones of A, and 5 old dead-letter records of A.
    c.execute(
        "INSERT INTO processed_messages (consumer_group, topic, message_id, processed_at)
         SELECT $1, $3, 'old-' || g, now() - interval '40 days' FROM generate_series(1, 120) g
         UNION ALL SELECT $2, $3, 'old-' || g, now() - interval '40 days' FROM generate_series(1, 30) g
         UNION ALL SELECT $1, $3, 'new-' || g, now() FROM generate_series(1, 10) g",
        &[&a, &b, &topic],
    )
    .await
    .unwrap();
    c.execute(
        "INSERT INTO dead_lettered (consumer_group, topic, \"partition\", \"offset\", dead_lettered_at)
         SELECT $1, $2, 0, g, now() - interval '40 days' FROM generate_series(1, 5) g",
        &[&a, &topic],
    )
    .await
    .unwrap();
    let s = outbox::status::status(&db).await.unwrap();
    assert_eq!(
        s.overdue_marks
            .iter()
            .map(|m| (m.consumer_group.as_str(), m.count))
            .collect::<Vec<_>>(),
        [(a.as_str(), 120), (b.as_str(), 30)]
    );

    let mut cfg = ConsumerConfig::new(&a, [&topic]);
    let mut cleanup = outbox::consumer::MarksCleanup::default();
    cleanup.batch = 50;
    cfg.cleanup = Some(cleanup);
    let consumer = Consumer::new(&db, &kafka(), cfg).unwrap();
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let h = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    wait_until(
        Duration::from_secs(30),
        "A's old marks cleaned at start",
        || async { ConsumerStats::get(&stats.marks_deleted) == 125 },
    )
    .await;
    stop.send(()).unwrap();
    h.await.unwrap().unwrap();
    assert_eq!(
        count(
            &c,
            &format!("SELECT count(*) FROM processed_messages WHERE consumer_group = '{a}'")
        )
        .await,
        10,
        "fresh marks stay"
    );
    assert_eq!(count(&c, "SELECT count(*) FROM dead_lettered").await, 0);
    // B's marks are B's business: its own consumer (here: none, or cleanup off) decides.
    let s = outbox::status::status(&db).await.unwrap();
    assert_eq!(
        s.overdue_marks
            .iter()
            .map(|m| (m.consumer_group.as_str(), m.count))
            .collect::<Vec<_>>(),
        [(b.as_str(), 30)]
    );
    let o = outbox_command(&db).arg("status").output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!("processed marks OVERDUE: 30 of group {b}")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_whose_marks_die_before_its_dead_letters_is_refused_at_start() {
    let db = fresh_db().await;
    let topic = topic_name();
    // A DLQ kept 60 days, against marks kept 35 (the default).
    let file = format!("[[topic]]\nname = \"{topic}\"\npartitions = 1\nretry_delays = []\ndlq_retention = \"60d\"\n");
    outbox::topics::apply(&kafka(), &outbox::topics::plan(&file).unwrap(), false)
        .await
        .unwrap();
    let err = Consumer::new(&db, &kafka(), ConsumerConfig::new("svc", [&topic]))
        .unwrap()
        .run(async {})
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("processed marks are kept 35.0 days")
            && text.contains(&format!("{topic}.dlq keeps dead letters 60.0 days")),
        "{text}"
    );
    // Marks kept longer than the letters: starts.
    let mut cfg = ConsumerConfig::new("svc", [&topic]);
    let mut cleanup = outbox::consumer::MarksCleanup::default();
    cleanup.retention = Duration::from_secs(90 * 86_400);
    cfg.cleanup = Some(cleanup);
    Consumer::new(&db, &kafka(), cfg)
        .unwrap()
        .run(async {})
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_consumers_and_the_archiver_report_in_and_the_overview_shows_them() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 2, &[]).await;
    let relay = spawn_relay(outbox::Relay::new(&db, &kafka(), relay_config()).unwrap());
    let group = format!("svc-{}", hex(6));
    let mut cfg = ConsumerConfig::new(&group, [&topic]);
    cfg.breaker = Some(outbox::consumer::BreakerConfig::default());
    let consumer = Consumer::new(&db, &kafka(), cfg).unwrap().handler(
        "it_event",
        Service {
            group: group.clone(),
            fail_every: None,
            tries: Arc::default(),
        },
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    let archiver = outbox::dlq::Archiver::new(&db, &kafka(), vec![format!("{topic}.dlq")])
        .unwrap()
        .group(&format!("it-arch-{}", hex(6)));
    let arch_stop = tokio_util::sync::CancellationToken::new();
    let s = arch_stop.clone();
    let arch = tokio::spawn(async move { archiver.run(async move { s.cancelled().await }).await });
    let c = client(&db).await;
    c.batch_execute(
        "CREATE TABLE handled (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, grp text NOT NULL,
                               message_id text NOT NULL, k text NOT NULL, seq bigint NOT NULL,
                               source_topic text NOT NULL)",
    )
    .await
    .unwrap();
    enqueue_n(&db, &topic, 20, 4, 10).await;
    wait_until(Duration::from_secs(60), "everyone reports in", || async {
        let o = outbox::instances::overview(&db).await.unwrap();
        let alive = |k: &str| {
            o.instances
                .iter()
                .filter(|i| i.kind == k && i.alive)
                .count()
        };
        let consumer = o
            .instances
            .iter()
            .find(|i| i.kind == "consumer" && i.name == group);
        alive("relay") == 1
            && alive("archiver") == 1
            && !o.archiver.late
            && consumer.is_some_and(|i| {
                i.state["mode"] == "normal"
                    && i.state["handled"] == 20
                    && i.state["lag"]
                        .as_object()
                        .is_some_and(|l| l.keys().any(|k| k.starts_with(&format!("{topic}/"))))
            })
    })
    .await;
    // An operator opens the group's breaker by hand: the replica pauses; closes it: it resumes.
    outbox::instances::open_breaker(
        &db,
        &group,
        "loyalty-api",
        Duration::from_secs(600),
        "API maintenance",
        "ops",
    )
    .await
    .unwrap();
    wait_until(
        Duration::from_secs(30),
        "the replica reports paused",
        || async {
            let o = outbox::instances::overview(&db).await.unwrap();
            o.instances
                .iter()
                .any(|i| i.name == group && i.state["mode"] == "paused")
                && o.outbox.open_breakers.len() == 1
        },
    )
    .await;
    outbox::instances::close_breaker(&db, &group, "loyalty-api", "maintenance over", "ops")
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(30),
        "the replica reports normal",
        || async {
            let o = outbox::instances::overview(&db).await.unwrap();
            o.instances
                .iter()
                .any(|i| i.name == group && i.state["mode"] == "normal")
                && o.outbox.open_breakers.is_empty()
                && o.untrusted.is_empty()
        },
    )
    .await;
    assert_eq!(
        texts(
            &c,
            "SELECT action || ' by ' || actor FROM dlq_audit ORDER BY id"
        )
        .await,
        ["breaker-open by ops", "breaker-close by ops"]
    );
    // Bad input is refused with a reason, and closing what does not exist is not found.
    assert!(matches!(
        outbox::instances::close_breaker(&db, &group, "nope", "x", "ops").await,
        Err(outbox::instances::BreakerActionError::NotFound(..))
    ));
    assert!(matches!(
        outbox::instances::open_breaker(&db, &group, "api", Duration::from_secs(5), " ", "ops")
            .await,
        Err(outbox::instances::BreakerActionError::Invalid(_))
    ));
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
    arch_stop.cancel();
    arch.await.unwrap().unwrap();
    relay.stop().await;
}
