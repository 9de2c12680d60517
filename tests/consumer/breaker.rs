//! The shared circuit breaker (seed 000) against real Postgres and Kafka and a local HTTP stub
//! the test switches between 200, 503 and "hang": replicas pause together, drain parked letters
//! first and throttled, re-open for longer, apply the envelope policies, never drain what is
//! not theirs, and survive a replica killed mid-cycle.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use outbox::consumer::{
    BoxFuture, BreakerConfig, BreakerMode, Consumer, ConsumerConfig, Delivered, Freshness,
    FreshnessCheck, Handler, HandlerError, RetryStrategy,
};
use outbox_testkit::*;

// ---- the stub loyalty API ----

#[derive(Clone, Debug)]
struct Call {
    at: Instant,
    order: String,
    status: u16,
}

#[derive(Clone, Default)]
struct Stub {
    /// 0 up, 1 down (503), 2 hang.
    mode: Arc<AtomicU8>,
    /// In mode "up": after this many more successes, switch to down (-1: never).
    fail_after: Arc<AtomicI64>,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Stub {
    fn up(&self) {
        self.fail_after.store(-1, Ordering::SeqCst);
        self.mode.store(0, Ordering::SeqCst);
    }
    fn down(&self) {
        self.mode.store(1, Ordering::SeqCst);
    }
    fn hang(&self) {
        self.mode.store(2, Ordering::SeqCst);
    }
    fn up_for(&self, n: i64) {
        self.fail_after.store(n, Ordering::SeqCst);
        self.mode.store(0, Ordering::SeqCst);
    }
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
    fn calls_between(&self, from: Instant, to: Instant) -> usize {
        self.calls()
            .iter()
            .filter(|c| c.at >= from && c.at < to)
            .count()
    }

    async fn start(&self) -> SocketAddr {
        let stub = self.clone();
        stub.fail_after.store(-1, Ordering::SeqCst);
        let app = axum::Router::new().route(
            "/points",
            axum::routing::post(move |body: axum::Json<serde_json::Value>| {
                let stub = stub.clone();
                async move {
                    let mut mode = stub.mode.load(Ordering::SeqCst);
                    if mode == 0 {
                        let left = stub.fail_after.load(Ordering::SeqCst);
                        if left == 0 {
                            stub.mode.store(1, Ordering::SeqCst);
                            mode = 1;
                        } else if left > 0 {
                            stub.fail_after.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                    let status = match mode {
                        0 => 200,
                        1 => 503,
                        _ => {
                            tokio::time::sleep(Duration::from_secs(30)).await;
                            504
                        }
                    };
                    stub.calls.lock().unwrap().push(Call {
                        at: Instant::now(),
                        order: body["order"].as_str().unwrap_or_default().to_owned(),
                        status,
                    });
                    axum::http::StatusCode::from_u16(status).unwrap()
                }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        addr
    }
}

// ---- the service under test (what examples/loyalty_notifier does) ----

struct Notify {
    http: reqwest::Client,
    url: String,
}

impl Handler for Notify {
    fn handle<'a>(
        &'a self,
        msg: &'a Delivered,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let order = msg.json()["order_number"]
                .as_str()
                .ok_or_else(|| HandlerError::permanent("order_number missing"))?;
            let res = self
                .http
                .post(format!("{}/points", self.url))
                .json(&serde_json::json!({ "order": order }))
                .send()
                .await
                .map_err(|e| HandlerError::unavailable("loyalty-api", e))?;
            if !res.status().is_success() {
                return Err(
                    HandlerError::from_http_status(res.status().as_u16(), "refused")
                        .on("loyalty-api"),
                );
            }
            tx.execute(
                "INSERT INTO loyalty_points (order_number, message_id) VALUES ($1, $2)",
                &[&order, &msg.message_id],
            )
            .await?;
            Ok(())
        })
    }
}

/// Orders "deleted" in the source of truth are obsolete.
#[derive(Clone, Default)]
struct Known(Arc<Mutex<HashSet<String>>>);
impl FreshnessCheck for Known {
    fn check<'a>(&'a self, msg: &'a Delivered) -> BoxFuture<'a, Freshness> {
        Box::pin(async move {
            let order = msg.json()["order_number"].as_str().unwrap_or_default();
            if order.starts_with("gone-") {
                Freshness::Mismatch
            } else {
                let _ = &self.0;
                Freshness::Match
            }
        })
    }
}

struct World {
    db: outbox::DbConfig,
    c: tokio_postgres::Client,
    topic: String,
    group: String,
    stub: Stub,
    url: String,
}

async fn world(partitions: i32) -> World {
    let db = fresh_db().await;
    let c = client(&db).await;
    c.batch_execute(
        "CREATE TABLE loyalty_points (id bigserial PRIMARY KEY, order_number text NOT NULL, message_id text NOT NULL);
         CREATE TABLE orders (order_number text PRIMARY KEY);",
    )
    .await
    .unwrap();
    let topic = topic_name();
    create_topic_family(&topic, partitions, &[]).await;
    let stub = Stub::default();
    let addr = stub.start().await;
    World {
        db,
        c,
        topic,
        group: format!("loyalty-{}", hex(6)),
        stub,
        url: format!("http://{addr}"),
    }
}

fn breaker(open_for_ms: u64) -> BreakerConfig {
    {
        let mut c = BreakerConfig::default();
        c.check_interval = Duration::from_secs(1);
        c.open_for = Duration::from_millis(open_for_ms);
        c.attempts = 2;
        c.retry_delay = Duration::from_millis(100);
        c.drain_rate = 5.0;
        c.drain_concurrency = 2;
        c
    }
}

struct Replica {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), outbox::consumer::ConsumerError>>,
    state: outbox::consumer::StateHandle,
}

impl Replica {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

fn replica(w: &World, b: BreakerConfig) -> Replica {
    let mut cfg = ConsumerConfig::new(w.group.clone(), [w.topic.clone()]);
    cfg.breaker = Some(b);
    cfg.retry = RetryStrategy::InPlace {
        attempts: 2,
        base: Duration::from_millis(50),
        max: Duration::from_millis(50),
    };
    let consumer = Consumer::new(&w.db, &kafka(), cfg)
        .unwrap()
        .handler(
            "order_created",
            Notify {
                http: reqwest::Client::builder()
                    .timeout(Duration::from_secs(2))
                    .build()
                    .unwrap(),
                url: w.url.clone(),
            },
        )
        .freshness(Known::default());
    let state = consumer.state();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    Replica { stop, task, state }
}

async fn order(w: &World, key: &str, number: &str) -> String {
    let id = uuid::Uuid::now_v7().to_string();
    produce_event(
        &w.topic,
        key,
        "order_created",
        &id,
        &serde_json::json!({ "order_number": number }),
    )
    .await;
    id
}

async fn effects(w: &World) -> i64 {
    count(&w.c, "SELECT count(*) FROM loyalty_points").await
}

/// (opened_at as Instant estimate, open duration, generation) of the group's breaker row.
async fn breaker_row(w: &World) -> Option<(f64, f64, i64)> {
    w.c.query_opt(
        "SELECT extract(epoch FROM now() - opened_at)::float8,
                extract(epoch FROM open_until - opened_at)::float8, generation
         FROM circuit_breakers WHERE consumer_group = $1 AND name = 'loyalty-api'",
        &[&w.group],
    )
    .await
    .unwrap()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_pause_together_drain_parked_letters_first_and_handle_every_order_once() {
    let w = world(4).await;
    w.stub.up();
    let a = replica(&w, breaker(6000));
    let b = replica(&w, breaker(6000));
    for i in 0..20 {
        order(&w, &format!("k{i}"), &format!("o{i}")).await;
    }
    wait_until(Duration::from_secs(60), "20 orders handled", || async {
        effects(&w).await == 20
    })
    .await;

    // The API goes down while orders keep coming. Also a message that does not decode and
    // an order the handler refuses: dead-lettered, never drained.
    w.stub.down();
    for i in 20..40 {
        order(&w, &format!("k{i}"), &format!("o{i}")).await;
    }
    produce(
        &w.topic,
        Some(b"bad"),
        &[("message_id", b"no-type")],
        Some(b"{}"),
    )
    .await;
    produce_event(
        &w.topic,
        "k-perm",
        "order_created",
        &uuid::Uuid::now_v7().to_string(),
        &serde_json::json!({"no_order": 1}),
    )
    .await;
    wait_until(Duration::from_secs(30), "the breaker opens", || async {
        breaker_row(&w).await.is_some()
    })
    .await;
    let opened = Instant::now() - Duration::from_secs_f64(breaker_row(&w).await.unwrap().0);
    // When each replica paused, by its own account (not when this test's polling saw it: on
    // a loaded CI machine the poll itself can lag by a second). Each is looked at on its own:
    // both stay paused for the rest of the 6 s open period, but a test thread starved for a
    // while under the full suite can miss the moment they are paused together.
    let paused_at = |s: outbox::consumer::ConsumerState| {
        (s.mode == BreakerMode::Paused)
            .then(|| Instant::now() - Duration::from_secs_f64(s.mode_for_secs))
    };
    let (mut pa, mut pb) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    while pa.is_none() || pb.is_none() {
        pa = pa.or_else(|| paused_at(a.state.get()));
        pb = pb.or_else(|| paused_at(b.state.get()));
        // On a timeout, what each replica was doing says why (it failed twice under CI load).
        assert!(
            Instant::now() < deadline,
            "both replicas paused: not within 20 s of seeing the breaker open {:?} ago; \
             replica A {:?} (seen paused: {}), replica B {:?} (seen paused: {})",
            opened.elapsed(),
            a.state.get(),
            pa.is_some(),
            b.state.get(),
            pb.is_some()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (pa, pb) = (pa.unwrap(), pb.unwrap());
    let last = pa.max(pb);
    let lag = last.saturating_duration_since(opened);
    // The replica that did not open the breaker learns of it at its next check (every 1 s);
    // 2 s more for a scheduler that lags under a full test suite.
    assert!(
        lag < Duration::from_secs(3),
        "both paused within check_interval + 2 s of the open: the later paused {lag:?} after"
    );
    // Newer events of keys that have a parked letter: they must reach the API after it.
    for i in 20..25 {
        order(&w, &format!("k{i}"), &format!("o{i}-second")).await;
    }
    // While open: no call reaches the API once both replicas have paused.
    let quiet_from = last + Duration::from_millis(100);
    tokio::time::sleep_until((opened + Duration::from_millis(5500)).into()).await;
    let during_open = w.stub.calls_between(quiet_from, Instant::now());
    assert_eq!(during_open, 0, "calls while the breaker was open");
    let parked = a.state.get().parked + b.state.get().parked;
    assert!(parked >= 2, "parked {parked}");

    // The API is back before the breaker closes: drain first, then the main topic.
    w.stub.up();
    wait_until(Duration::from_secs(90), "every order handled", || async {
        effects(&w).await == 45
    })
    .await;
    wait_until(
        Duration::from_secs(30),
        "both replicas back to normal",
        || async {
            a.state.get().mode == BreakerMode::Normal && b.state.get().mode == BreakerMode::Normal
        },
    )
    .await;
    assert_eq!(
        count(
            &w.c,
            "SELECT count(DISTINCT message_id) FROM loyalty_points"
        )
        .await,
        45
    );
    let calls = w.stub.calls();
    let ok: Vec<&Call> = calls.iter().filter(|c| c.status == 200).collect();
    // Parked letters before any newer main-topic message of the same key.
    for i in 20..25 {
        let first = ok.iter().position(|c| c.order == format!("o{i}"));
        let second = ok.iter().position(|c| c.order == format!("o{i}-second"));
        assert!(
            first.is_some() && second.is_some() && first < second,
            "o{i}: {first:?} {second:?}"
        );
    }
    // The drain is throttled: 2 replicas × 5/s, counted over 1-s windows of the calls made
    // for parked letters (o20..o39 that the API did not take the first time).
    let parked_orders: HashSet<String> = read_all(&format!("{}.dlq", w.topic))
        .await
        .iter()
        .filter(|r| r.headers.get("x-error-kind").map(String::as_str) == Some("unavailable"))
        .map(|r| {
            r.json()["order_number"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert!(!parked_orders.is_empty());
    let drained: Vec<Instant> = ok
        .iter()
        .filter(|c| parked_orders.contains(&c.order))
        .map(|c| c.at)
        .collect();
    for t in &drained {
        let n = drained
            .iter()
            .filter(|u| **u >= *t && **u < *t + Duration::from_secs(1))
            .count();
        assert!(n <= 12, "{n} drained calls within 1 s");
    }
    let s = (a.state.get(), b.state.get());
    eprintln!("replica A {:?}\nreplica B {:?}", s.0, s.1);
    assert!(s.0.drained + s.1.drained >= parked);
    // The undecodable and the refused message are in the DLQ and were never drained.
    let dlq = read_all(&format!("{}.dlq", w.topic)).await;
    let kinds: Vec<&str> = dlq
        .iter()
        .map(|r| r.headers["x-error-kind"].as_str())
        .collect();
    assert!(
        kinds.contains(&"decode") && kinds.contains(&"permanent"),
        "{kinds:?}"
    );
    assert_eq!(
        count(
            &w.c,
            "SELECT count(*) FROM dead_letters WHERE error_kind IN ('decode', 'permanent')"
        )
        .await,
        0
    );
    // Offsets: every main-topic partition committed to its end.
    for p in 0..4 {
        let hi = read_all(&w.topic)
            .await
            .iter()
            .filter(|r| r.partition == p)
            .map(|r| r.offset + 1)
            .max()
            .unwrap_or(0);
        wait_until(Duration::from_secs(10), "offsets committed", || async {
            committed(&w.group, &w.topic, p).await.unwrap_or(0) == hi
        })
        .await;
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_during_the_drain_reopens_for_longer_and_retries_past_the_limit_are_dropped() {
    let w = world(1).await;
    let mut cfg = breaker(4000);
    cfg.max_dlq_retries = 0;
    cfg.drain_concurrency = 1;
    let r = replica(&w, cfg);
    // The API hangs: each call times out (2 s), which counts as unavailable.
    w.stub.hang();
    for i in 0..6 {
        order(&w, &format!("key-{i}"), &format!("o{i}")).await;
    }
    wait_until(Duration::from_secs(30), "opened", || async {
        breaker_row(&w).await.is_some()
    })
    .await;
    let (_, first_open, g1) = breaker_row(&w).await.unwrap();
    // Back for two calls only: the third drained letter fails and re-opens the breaker.
    w.stub.up_for(2);
    wait_until(Duration::from_secs(60), "re-opened", || async {
        breaker_row(&w).await.is_some_and(|(_, _, g)| g > g1)
    })
    .await;
    let (_, second_open, _) = breaker_row(&w).await.unwrap();
    eprintln!("open for {first_open:.2} s, then {second_open:.2} s");
    assert!(
        second_open >= first_open * 1.8,
        "re-open doubles: {first_open} → {second_open}"
    );
    // The operator's view while it is open.
    let st = outbox_command(&w.db).arg("status").output().unwrap();
    let st = String::from_utf8_lossy(&st.stdout).into_owned();
    assert!(
        st.contains("circuit breakers OPEN") && st.contains(&w.group) && st.contains("loyalty-api"),
        "{st}"
    );
    let reparked = || async {
        read_all(&format!("{}.dlq", w.topic))
            .await
            .into_iter()
            .filter(|m| m.headers.get("x-dlq-retries").is_some_and(|v| v != "0"))
            .map(|m| {
                assert!(m.headers.contains_key("x-first-failed-at"));
                m.message_id()
            })
            .collect::<HashSet<String>>()
    };
    wait_until(Duration::from_secs(10), "a re-parked letter", || async {
        !reparked().await.is_empty()
    })
    .await;
    w.stub.up();
    // Letters parked twice are past max_dlq_retries = 0: dropped and recorded; the rest handled.
    wait_until(Duration::from_secs(90), "the cycle completes", || async {
        r.state.get().mode == BreakerMode::Normal
            && effects(&w).await
                + count(&w.c, "SELECT count(*) FROM dead_letters WHERE status = 'dropped' AND status_reason = 'max_dlq_retries'").await
                == 6
    })
    .await;
    let dropped: HashSet<String> = texts(
        &w.c,
        "SELECT message_id FROM dead_letters WHERE status = 'dropped' AND status_reason = 'max_dlq_retries'",
    )
    .await
    .into_iter()
    .collect();
    let reparked = reparked().await;
    assert!(
        !dropped.is_empty() && dropped.is_subset(&reparked),
        "dropped {dropped:?}, re-parked {reparked:?}"
    );
    let handled: HashSet<String> =
        w.c.query("SELECT message_id FROM loyalty_points", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
    assert_eq!(
        handled.len() as i64,
        effects(&w).await,
        "none handled twice"
    );
    assert!(handled.is_disjoint(&dropped));
    let s = r.state.get();
    assert!(
        s.dropped as usize == dropped.len() && s.reparked >= 1,
        "{s:?}"
    );
    r.stop().await;
}

/// A letter as a replica of `group` parks it.
async fn parked_letter(
    w: &World,
    group: &str,
    kind: &str,
    order: &str,
    first_failed: SystemTime,
    retries: u32,
) -> String {
    let id = uuid::Uuid::now_v7().to_string();
    let ff = outbox::testing::rfc3339(first_failed);
    produce(
        &format!("{}.dlq", w.topic),
        Some(order.as_bytes()),
        &[
            ("message_type", b"order_created"),
            ("message_id", id.as_bytes()),
            ("x-original-topic", w.topic.as_bytes()),
            ("x-consumer-group", group.as_bytes()),
            ("x-error", b"loyalty-api unavailable: 503"),
            ("x-error-kind", kind.as_bytes()),
            ("x-failed-at", ff.as_bytes()),
            ("x-first-failed-at", ff.as_bytes()),
            ("x-dlq-retries", retries.to_string().as_bytes()),
        ],
        Some(
            serde_json::json!({ "order_number": order })
                .to_string()
                .as_bytes(),
        ),
    )
    .await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envelope_policies_drop_with_a_reason_and_only_this_groups_outage_letters_are_drained() {
    let w = world(1).await;
    w.stub.up();
    let now = SystemTime::now();
    let good = parked_letter(&w, &w.group, "unavailable", "fine-1", now, 0).await;
    let good2 = parked_letter(&w, &w.group, "transient-exhausted", "fine-2", now, 1).await;
    parked_letter(
        &w,
        &w.group,
        "unavailable",
        "old-1",
        now - Duration::from_secs(3 * 86_400),
        0,
    )
    .await;
    parked_letter(&w, &w.group, "unavailable", "tired-1", now, 9).await;
    parked_letter(&w, &w.group, "unavailable", "gone-1", now, 0).await;
    parked_letter(&w, &w.group, "decode", "never-1", now, 0).await;
    parked_letter(&w, &w.group, "permanent", "never-2", now, 0).await;
    parked_letter(&w, "someone-else", "unavailable", "never-3", now, 0).await;
    // A replica starting up drains what was parked before it.
    let r = replica(&w, breaker(2000));
    wait_until(Duration::from_secs(60), "the startup drain", || async {
        count(
            &w.c,
            "SELECT count(*) FROM dead_letters WHERE status IN ('replayed', 'dropped')",
        )
        .await
            == 5
            && r.state.get().mode == BreakerMode::Normal
    })
    .await;
    let rows: HashMap<String, (String, String)> =
        w.c.query(
            "SELECT convert_from(message_key, 'UTF8'), status, status_reason FROM dead_letters",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    assert_eq!(rows["fine-1"], ("replayed".into(), "drain".into()));
    assert_eq!(rows["fine-2"], ("replayed".into(), "drain".into()));
    assert_eq!(
        rows["old-1"],
        ("dropped".into(), "deadline_exceeded".into())
    );
    assert_eq!(
        rows["tired-1"],
        ("dropped".into(), "max_dlq_retries".into())
    );
    assert_eq!(rows["gone-1"], ("dropped".into(), "event_obsolete".into()));
    assert_eq!(
        rows.len(),
        5,
        "decode, permanent and other groups' letters are not touched: {rows:?}"
    );
    let ids: HashSet<String> =
        w.c.query("SELECT message_id FROM loyalty_points", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
    assert_eq!(ids, HashSet::from([good, good2]));
    let called: HashSet<String> = w.stub.calls().into_iter().map(|c| c.order).collect();
    assert_eq!(
        called,
        HashSet::from(["fine-1".to_owned(), "fine-2".to_owned()])
    );
    let s = r.state.get();
    assert_eq!((s.drained, s.dropped), (2, 3), "{s:?}");
    r.stop().await;
}

fn notifier(w: &World) -> Kill {
    Kill(
        std::process::Command::new(example_binary("loyalty_notifier"))
            .env("DATABASE_URL", database_url())
            .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
            .env("OUTBOX_SCHEMA", w.db.schema.name())
            .env("LOYALTY_TOPIC", &w.topic)
            .env("LOYALTY_GROUP", &w.group)
            .env("LOYALTY_URL", &w.url)
            .env("BREAKER_OPEN_FOR_MS", "6000")
            .env("DRAIN_RATE", "20")
            .env(
                "OUTBOX_KAFKA_PROPERTIES",
                "session.timeout.ms=6000;heartbeat.interval.ms=1000",
            )
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_while_paused_leaves_the_survivor_to_complete_the_cycle() {
    let w = world(4).await;
    w.c.batch_execute("ALTER TABLE loyalty_points ADD COLUMN points bigint")
        .await
        .unwrap();
    w.stub.up();
    let mut a = Some(notifier(&w));
    let _b = notifier(&w);
    let mut orders = Vec::new();
    for i in 0..10 {
        orders.push(format!("o{i}"));
        w.c.execute("INSERT INTO orders VALUES ($1)", &[&format!("o{i}")])
            .await
            .unwrap();
        order(&w, &format!("k{i}"), &format!("o{i}")).await;
    }
    wait_until(Duration::from_secs(60), "10 handled", || async {
        effects(&w).await == 10
    })
    .await;
    w.stub.down();
    for i in 10..30 {
        w.c.execute("INSERT INTO orders VALUES ($1)", &[&format!("o{i}")])
            .await
            .unwrap();
        order(&w, &format!("k{i}"), &format!("o{i}")).await;
    }
    wait_until(Duration::from_secs(30), "the breaker opens", || async {
        breaker_row(&w).await.is_some()
    })
    .await;
    // One replica dies with SIGKILL while both are paused.
    drop(a.take());
    w.stub.up();
    wait_until(
        Duration::from_secs(90),
        "the survivor handles every order",
        || async { effects(&w).await >= 30 },
    )
    .await;
    assert_eq!(
        count(
            &w.c,
            "SELECT count(DISTINCT message_id) FROM loyalty_points"
        )
        .await,
        30
    );
    assert_eq!(
        count(&w.c, "SELECT count(*) FROM loyalty_points").await,
        30,
        "no order handled twice"
    );
}

/// Watches the group's breaker row: the open duration of each generation, until `gens`
/// generations were seen (or the deadline).
async fn open_durations(w: &World, gens: i64, within: Duration) -> Vec<f64> {
    let mut seen: Vec<(i64, f64)> = Vec::new();
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some((_, dur, g)) = breaker_row(w).await {
            if seen.last().is_none_or(|(last, _)| *last != g) {
                seen.push((g, dur));
            }
            if g >= gens {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    seen.into_iter().map(|(_, d)| d).collect()
}

/// Orders produced in the background, one every `every`, until the returned flag is set.
fn keep_ordering(w: &World, every: Duration) -> Arc<std::sync::atomic::AtomicBool> {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (topic, flag) = (w.topic.clone(), stop.clone());
    tokio::spawn(async move {
        let mut i = 0;
        while !flag.load(Ordering::SeqCst) {
            produce_event(
                &topic,
                &format!("bg-{}", i % 7),
                "order_created",
                &uuid::Uuid::now_v7().to_string(),
                &serde_json::json!({ "order_number": format!("bg{i}") }),
            )
            .await;
            i += 1;
            tokio::time::sleep(every).await;
        }
    });
    stop
}

/// The parked letters' `x-attempts`, summed: every call that failed must be counted.
async fn parked_attempts(w: &World) -> usize {
    read_all(&format!("{}.dlq", w.topic))
        .await
        .iter()
        .filter(|m| m.headers.get("x-error-kind").map(String::as_str) == Some("unavailable"))
        .map(|m| m.headers["x-attempts"].parse::<usize>().unwrap())
        .sum()
}

/// The group's breaker row, as another replica would have opened it: for `secs` seconds.
async fn opened_by_another_replica(w: &World, secs: i32) {
    w.c.execute(
        "INSERT INTO circuit_breakers (consumer_group, name, open_until, opened_by, reason)
         VALUES ($1, 'loyalty-api', now() + make_interval(secs => $2), 'other-replica', 'down')",
        &[&w.group, &f64::from(secs)],
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_nothing_to_drain_probes_once_per_cycle_and_open_times_keep_doubling() {
    let w = world(1).await;
    // Another replica of the group opened the breaker and parked its letters; this one has
    // none of its own, but its main topic keeps receiving orders while the API is down.
    w.stub.down();
    opened_by_another_replica(&w, 1).await;
    let r = replica(&w, breaker(1000));
    let orders = keep_ordering(&w, Duration::from_millis(100));
    let durations = open_durations(&w, 4, Duration::from_secs(40)).await;
    let calls = w.stub.calls().len();
    eprintln!("open for {durations:?} s; {calls} calls to the API");
    assert!(durations.len() >= 4, "{durations:?}");
    for pair in durations.windows(2) {
        assert!(
            pair[1] >= pair[0] * 1.8,
            "open times keep doubling: {durations:?}"
        );
    }
    // One probe call per expiry (3 expiries so far), never a burst against a dead API.
    assert!(
        calls <= 4,
        "{calls} calls against a down API: {:?}",
        w.stub.calls()
    );
    assert!(calls >= 3, "each expiry was probed: {calls}");
    // Back up: the next probe succeeds, the group trusts the API again, every order is handled.
    w.stub.up();
    orders.store(true, Ordering::SeqCst);
    wait_until(Duration::from_secs(60), "back to normal", || async {
        r.state.get().mode == BreakerMode::Normal
            && count(
                &w.c,
                "SELECT count(*) FROM circuit_breakers WHERE streak = 0",
            )
            .await
                == 1
    })
    .await;
    let failed = w.stub.calls().iter().filter(|c| c.status != 200).count();
    assert_eq!(
        parked_attempts(&w).await,
        failed,
        "x-attempts counts every failed call"
    );
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn letters_all_dropped_by_policy_are_no_success_the_probe_still_decides() {
    let w = world(1).await;
    w.stub.down();
    let mut cfg = breaker(1000);
    // Every parked letter is past its deadline by the time the drain reads it.
    cfg.deadline = Duration::from_millis(1);
    let r = replica(&w, cfg);
    let orders = keep_ordering(&w, Duration::from_millis(100));
    wait_until(Duration::from_secs(30), "opened", || async {
        breaker_row(&w).await.is_some()
    })
    .await;
    // Calls in flight when it opened finish within a moment; after that, only probes.
    let opened = Instant::now() + Duration::from_millis(500);
    let durations = open_durations(&w, 4, Duration::from_secs(40)).await;
    orders.store(true, Ordering::SeqCst);
    let calls = w.stub.calls().len();
    let later = w.stub.calls_between(opened, Instant::now());
    eprintln!("open for {durations:?} s; {calls} calls to the API, {later} after it opened");
    assert!(durations.len() >= 4, "{durations:?}");
    for pair in durations.windows(2) {
        assert!(
            pair[1] >= pair[0] * 1.8,
            "open times keep doubling: {durations:?}"
        );
    }
    // One probe per expiry (3 so far): the drain dropped every letter, which proves nothing.
    assert!(
        later <= 4,
        "{later} calls against a down API: {:?}",
        w.stub.calls()
    );
    let dropped = count(
        &w.c,
        "SELECT count(*) FROM dead_letters WHERE status = 'dropped' AND status_reason = 'deadline_exceeded'",
    )
    .await;
    assert!(dropped >= 1, "letters were dropped by policy");
    // The letters that opened the breaker were tried twice (breaker attempts = 2) before they
    // were parked, and say so; every call to the API is in some letter's x-attempts.
    // (Letters of messages in flight when it opened are parked after one call; which is
    // written first depends on timing.)
    let letters = read_all(&format!("{}.dlq", w.topic)).await;
    assert!(
        letters.iter().any(|l| l.headers["x-attempts"] == "2"),
        "the opening letter counts both calls: {:?}",
        letters
            .iter()
            .map(|l| &l.headers["x-attempts"])
            .collect::<Vec<_>>()
    );
    wait_until(Duration::from_secs(10), "the last calls parked", || async {
        parked_attempts(&w).await == w.stub.calls().len()
    })
    .await;
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiry_read_while_the_probe_is_being_claimed_is_never_taken_for_a_closed_breaker() {
    // CI caught it under load: a refresh read the expired row as "not open" and published that
    // before it read the row as "untrusted"; a steer in between saw the breaker closed and
    // trusted, drained nothing and resumed the main topic, and a burst of calls hit the dead
    // API. Here the gap is held open on purpose: the row is locked from before it expires, so
    // the replica's claim of the probe waits for seconds.
    let w = world(1).await;
    w.stub.down();
    opened_by_another_replica(&w, 2).await;
    let r = replica(&w, breaker(1000));
    let orders = keep_ordering(&w, Duration::from_millis(100));
    wait_until(Duration::from_secs(20), "paused", || async {
        r.state.get().mode == BreakerMode::Paused
    })
    .await;
    let mut locker = client(&w.db).await;
    let lock = locker.transaction().await.unwrap();
    let locked = lock
        .execute(
            "SELECT 1 FROM circuit_breakers WHERE consumer_group = $1 AND open_until > now() FOR UPDATE",
            &[&w.group],
        )
        .await
        .unwrap();
    assert_eq!(locked, 1, "locked before it expired");
    let modes = Arc::new(Mutex::new(HashSet::new()));
    wait_until(
        Duration::from_secs(20),
        "expired three checks ago",
        || async {
            modes.lock().unwrap().insert(format!("{:?}", r.state.get().mode));
            count(
                &w.c,
                "SELECT count(*) FROM circuit_breakers WHERE open_until < now() - interval '3 seconds'",
            )
            .await
                == 1
        },
    )
    .await;
    let during = w.stub.calls();
    let seen = modes.lock().unwrap().clone();
    assert!(
        during.is_empty(),
        "calls while the row was expired but its probe unclaimed: {during:?} (modes {seen:?})"
    );
    assert_eq!(seen, HashSet::from(["Paused".to_owned()]), "modes seen");
    // Released: the replica claims the probe, makes one call, and re-opens for twice as long.
    lock.rollback().await.unwrap();
    wait_until(Duration::from_secs(20), "re-opened", || async {
        breaker_row(&w).await.is_some_and(|(_, _, g)| g >= 2)
    })
    .await;
    orders.store(true, Ordering::SeqCst);
    let calls = w.stub.calls();
    assert_eq!(calls.len(), 1, "one probe call: {calls:?}");
    r.stop().await;
}
