//! One test matrix for both drivers of handler transactions (`Consumer::new` and `Consumer::sqlx`): the
//! same scenarios — dedupe, redelivery after a crash, commit groups, retries and dead
//! letters, a swallowed error — run with tokio-postgres handlers and with sqlx handlers on
//! the test's own `PgPool`. The handlers differ only in how they write their row; what the
//! runtime promises around them is asserted identically.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::consumer::{
    BoxFuture, CallHandler, Consumer, ConsumerConfig, ConsumerStats, Delivered, Driver, Handler,
    HandlerError, RetryStrategy, SqlxCallHandler, SqlxHandler,
};
use outbox_testkit::*;

#[derive(Clone, Copy, Debug)]
enum Drv {
    TokioPostgres,
    Sqlx,
}

/// What the body asks of the handler, before it writes: `{"fail": n}` fails transiently n
/// times, `{"fail": -1}` always; `{"permanent": true}`; `{"flaky": true}` fails once after
/// writing its row (so only a savepoint or a rollback keeps that row out).
#[derive(Default)]
struct Script(Mutex<HashMap<String, i64>>);

impl Script {
    fn before(&self, msg: &Delivered) -> Result<(), HandlerError> {
        let b = msg.json();
        let n = {
            let mut t = self.0.lock().unwrap();
            let e = t.entry(msg.message_id.clone()).or_default();
            *e += 1;
            *e
        };
        if b["permanent"].as_bool() == Some(true) {
            return Err(HandlerError::permanent("card declined"));
        }
        let fail = b["fail"].as_i64().unwrap_or(0);
        if fail < 0 || n <= fail {
            return Err(HandlerError::transient(format!(
                "downstream timeout (try {n})"
            )));
        }
        Ok(())
    }

    /// After the row is written: a flaky message fails on its first try.
    fn after(&self, msg: &Delivered) -> Result<(), HandlerError> {
        let first = self.0.lock().unwrap()[&msg.message_id] == 1;
        if msg.json()["flaky"].as_bool() == Some(true) && first {
            return Err(HandlerError::transient("flaky after writing"));
        }
        Ok(())
    }
}

const INSERT: &str =
    "INSERT INTO effects (message_id, k, seq, txid) VALUES ($1, $2, $3, txid_current())";
/// A statement that fails; the handler that swallows its error leaves the transaction aborted.
const BROKEN: &str = "SELECT 1/0";

struct PgProbe(Arc<Script>);

impl Handler for PgProbe {
    fn handle<'a>(
        &'a self,
        msg: &'a Delivered,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            self.0.before(msg)?;
            if msg.json()["swallow"].as_bool() == Some(true) {
                let _ = tx.execute(BROKEN, &[]).await;
                return Ok(());
            }
            let seq = msg.json()["seq"].as_i64().unwrap_or(-1);
            tx.execute(
                INSERT,
                &[&msg.message_id, &msg.key_str().unwrap_or(""), &seq],
            )
            .await?;
            self.0.after(msg)
        })
    }
}

struct SqlxProbe(Arc<Script>);

impl SqlxHandler for SqlxProbe {
    fn handle<'a>(
        &'a self,
        msg: &'a Delivered,
        tx: &'a mut sqlx::PgConnection,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            self.0.before(msg)?;
            if msg.json()["swallow"].as_bool() == Some(true) {
                let _ = sqlx::query(BROKEN).execute(&mut *tx).await;
                return Ok(());
            }
            let seq = msg.json()["seq"].as_i64().unwrap_or(-1);
            sqlx::query(INSERT)
                .bind(&msg.message_id)
                .bind(msg.key_str().unwrap_or(""))
                .bind(seq)
                .execute(&mut *tx)
                .await?;
            self.0.after(msg)
        })
    }
}

struct Setup {
    db: outbox::DbConfig,
    topic: String,
    c: tokio_postgres::Client,
}

async fn setup(partitions: i32) -> Setup {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, partitions, &[]).await;
    let c = client(&db).await;
    c.batch_execute(
        "CREATE TABLE effects (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                               message_id text NOT NULL, k text, seq bigint, txid bigint)",
    )
    .await
    .unwrap();
    Setup { db, topic, c }
}

/// A consumer of `group` with the driver's probe for `it_event`, running.
async fn consumer(s: &Setup, drv: Drv, config: ConsumerConfig) -> Running {
    let script = Arc::new(Script::default());
    match drv {
        Drv::TokioPostgres => start(
            Consumer::new(&s.db, &kafka(), config)
                .unwrap()
                .handler("it_event", PgProbe(script)),
        ),
        Drv::Sqlx => start(
            Consumer::sqlx(&s.db, &kafka(), config, sqlx_pool(&s.db, 8).await)
                .unwrap()
                .sqlx_handler("it_event", SqlxProbe(script)),
        ),
    }
}

struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), outbox::consumer::ConsumerError>>,
    stats: Arc<ConsumerStats>,
}

fn start<D: 'static>(c: Consumer<D>) -> Running {
    let stats = c.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(c.run(async move {
        let _ = stopped.await;
    }));
    Running { stop, task, stats }
}

impl Running {
    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.task.await.unwrap().unwrap();
    }
}

fn get(c: &std::sync::atomic::AtomicU64) -> u64 {
    ConsumerStats::get(c)
}

async fn offsets_at_end(group: &str, topic: &str, partitions: i32, end: i64) {
    wait_until(
        Duration::from_secs(30),
        "offsets committed to the end",
        || async {
            let mut sum = 0;
            for p in 0..partitions {
                sum += committed(group, topic, p).await.unwrap_or(0);
            }
            sum == end
        },
    )
    .await;
}

/// Dedupe, retries, dead letters and a swallowed error; then the group's offsets are rewound
/// (a crash before the commit) and a new consumer redelivers everything: nothing is handled
/// twice.
async fn dedupe_retries_dead_letters_and_redelivery(drv: Drv) {
    let s = setup(2).await;
    let group = format!("drv-{}", hex(8));
    // 12 plain events, 3 of them sent twice (a producer's retry); one transient twice, one
    // permanent, one always transient, one that swallows its statement's error.
    let mut sent = 0;
    for i in 0..12 {
        let body = serde_json::json!({"seq": i});
        produce_event(
            &s.topic,
            &format!("k{i}"),
            "it_event",
            &format!("m{i}"),
            &body,
        )
        .await;
        sent += 1;
        if i % 4 == 0 {
            produce_event(
                &s.topic,
                &format!("k{i}"),
                "it_event",
                &format!("m{i}"),
                &body,
            )
            .await;
            sent += 1;
        }
    }
    let odd = [
        ("twice", serde_json::json!({"seq": 100, "fail": 2})),
        (
            "declined",
            serde_json::json!({"seq": 101, "permanent": true}),
        ),
        ("never", serde_json::json!({"seq": 102, "fail": -1})),
        ("swallow", serde_json::json!({"seq": 103, "swallow": true})),
    ];
    for (id, body) in &odd {
        produce_event(&s.topic, id, "it_event", id, body).await;
        sent += 1;
    }
    let mut config = ConsumerConfig::new(&group, [&s.topic]);
    config.retry = RetryStrategy::InPlace {
        attempts: 3,
        base: Duration::from_millis(10),
        max: Duration::from_millis(50),
    };
    let r = consumer(&s, drv, config.clone()).await;
    wait_until(Duration::from_secs(60), "all settled", || async {
        get(&r.stats.handled) == 13 && get(&r.stats.dead_lettered) == 3
    })
    .await;
    offsets_at_end(&group, &s.topic, 2, sent).await;
    assert_eq!(
        get(&r.stats.duplicates),
        3,
        "{drv:?}: the producer's repeats"
    );
    assert!(
        get(&r.stats.in_place_retries) >= 2 + 2 + 2,
        "{drv:?}: twice (2), never (2), swallow (2) retried in place"
    );
    r.stop().await;
    let c = &s.c;
    assert_eq!(count(c, "SELECT count(*) FROM effects").await, 13);
    assert_eq!(
        count(c, "SELECT count(DISTINCT message_id) FROM effects").await,
        13
    );
    assert_eq!(
        count(
            c,
            "SELECT count(*) FROM effects WHERE message_id IN ('declined', 'never', 'swallow')"
        )
        .await,
        0
    );
    let mut dlq: Vec<(String, String)> = read_all(&format!("{}.dlq", s.topic))
        .await
        .iter()
        .map(|r| (r.message_id(), r.headers["x-error-kind"].clone()))
        .collect();
    dlq.sort();
    assert_eq!(
        dlq,
        [
            ("declined".to_owned(), "permanent".to_owned()),
            ("never".to_owned(), "transient-exhausted".to_owned()),
            ("swallow".to_owned(), "transient-exhausted".to_owned()),
        ],
        "{drv:?}: what could not be handled is dead-lettered, once, with its class"
    );

    // The crash before the offsets were committed: everything comes again.
    rewind_group(&group, &s.topic, 2).await;
    let r = consumer(&s, drv, config).await;
    wait_until(
        Duration::from_secs(60),
        "redelivered and absorbed",
        || async { get(&r.stats.duplicates) == 16 },
    )
    .await;
    offsets_at_end(&group, &s.topic, 2, sent).await;
    assert_eq!(get(&r.stats.handled), 0, "{drv:?}: nothing handled twice");
    r.stop().await;
    assert_eq!(count(c, "SELECT count(*) FROM effects").await, 13);
}

/// Commit groups: a backlog shares transactions; a failure rolls back only its own row.
async fn commit_groups(drv: Drv) {
    let s = setup(3).await;
    let group = format!("drv-{}", hex(8));
    let (n, poison) = (240, [37, 150, 151, 233]);
    for seq in 0..n {
        let body = if poison.contains(&seq) {
            serde_json::json!({"seq": seq, "permanent": true})
        } else if seq % 50 == 7 {
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
    let mut config = ConsumerConfig::new(&group, [&s.topic]);
    config.concurrency = 2;
    config.commit_group = 16;
    let r = consumer(&s, drv, config).await;
    wait_until(Duration::from_secs(60), "all settled", || async {
        get(&r.stats.handled) == (n - 4) as u64 && get(&r.stats.dead_lettered) == 4
    })
    .await;
    offsets_at_end(&group, &s.topic, 3, n as i64).await;
    r.stop().await;
    let c = &s.c;
    assert_eq!(
        count(c, "SELECT count(*) FROM effects").await,
        (n - 4) as i64
    );
    assert_eq!(
        count(
            c,
            "SELECT count(*) FROM effects WHERE message_id IN ('m37', 'm150', 'm151', 'm233')"
        )
        .await,
        0
    );
    let flaky = count(c, "SELECT count(*) FROM effects WHERE seq % 50 = 7").await;
    assert_eq!(
        flaky, 5,
        "{drv:?}: each flaky message's row once, its failed try rolled back"
    );
    let violations = count(c, "SELECT count(*) FROM (SELECT seq, lag(seq) OVER (PARTITION BY k ORDER BY id) prev FROM effects) x WHERE seq <= prev").await;
    assert_eq!(violations, 0, "{drv:?}: per-key order");
    let txs = count(c, "SELECT count(DISTINCT txid) FROM effects").await;
    println!("{drv:?}: {} messages in {txs} transactions", n - 4);
    assert!(
        txs < n as i64 / 3,
        "{drv:?}: {txs} transactions: groups formed"
    );
    let marks = count(c, "SELECT count(*) FROM processed_messages").await;
    assert_eq!(
        marks,
        (n - 4) as i64,
        "{drv:?}: a mark exactly for each handled message"
    );
}

/// A configuration naming a pool in the deprecated `ConsumerConfig::driver` is refused by both
/// constructors, naming the one to use: the driver is the consumer's type, so a handler of
/// the other driver does not compile (the doctests of `Consumer::sqlx` show both sides).
#[allow(deprecated)]
async fn a_pool_in_the_configuration_is_refused_by_both_constructors(drv: Drv) {
    let s = setup(1).await;
    let mut config = ConsumerConfig::new(format!("drv-{}", hex(8)), [&s.topic]);
    config.driver = Driver::Sqlx(sqlx_pool(&s.db, 2).await);
    let err = match drv {
        Drv::TokioPostgres => Consumer::new(&s.db, &kafka(), config).err(),
        Drv::Sqlx => Consumer::sqlx(&s.db, &kafka(), config, sqlx_pool(&s.db, 2).await).err(),
    }
    .expect("refused")
    .to_string();
    assert!(err.contains("Consumer::sqlx"), "{drv:?}: {err}");
}

/// A call handler of either driver: `call` (no transaction) answers the message's `seq` and is
/// counted per message; `record` writes the answer in the mark's transaction, through the
/// consumer's driver — on sqlx with no tokio-postgres at all.
struct Caller(Arc<Script>, Arc<Mutex<HashMap<String, u32>>>);

impl Caller {
    fn call_now(&self, msg: &Delivered) -> Result<i64, HandlerError> {
        *self
            .1
            .lock()
            .unwrap()
            .entry(msg.message_id.clone())
            .or_default() += 1;
        self.0.before(msg)?;
        Ok(msg.json()["seq"].as_i64().unwrap_or(-1))
    }
}

impl CallHandler for Caller {
    type Reply = i64;
    fn call<'a>(&'a self, msg: &'a Delivered) -> BoxFuture<'a, Result<i64, HandlerError>> {
        Box::pin(async move { self.call_now(msg) })
    }
    fn record<'a>(
        &'a self,
        msg: &'a Delivered,
        seq: &'a i64,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            if msg.json()["swallow"].as_bool() == Some(true) {
                let _ = tx.execute(BROKEN, &[]).await;
                return Ok(());
            }
            tx.execute(
                INSERT,
                &[&msg.message_id, &msg.key_str().unwrap_or(""), seq],
            )
            .await?;
            Ok(())
        })
    }
}

impl SqlxCallHandler for Caller {
    type Reply = i64;
    fn call<'a>(&'a self, msg: &'a Delivered) -> BoxFuture<'a, Result<i64, HandlerError>> {
        Box::pin(async move { self.call_now(msg) })
    }
    fn record<'a>(
        &'a self,
        msg: &'a Delivered,
        seq: &'a i64,
        tx: &'a mut sqlx::PgConnection,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            if msg.json()["swallow"].as_bool() == Some(true) {
                let _ = sqlx::query(BROKEN).execute(&mut *tx).await;
                return Ok(());
            }
            sqlx::query(INSERT)
                .bind(&msg.message_id)
                .bind(msg.key_str().unwrap_or(""))
                .bind(*seq)
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
    }
}

/// Call handlers record through the consumer's driver: every answered call's mark and record
/// commit together (several per transaction under load), a repeat is never called again, a
/// failed call or a swallowed record error is dead-lettered with nothing recorded; a call
/// handler of the other driver is refused at start.
async fn call_handlers_record_through_the_driver(drv: Drv) {
    let s = setup(2).await;
    let group = format!("drv-{}", hex(8));
    let n = 40;
    let mut sent = 0;
    for i in 0..n {
        let body = serde_json::json!({"seq": i});
        let (key, id) = (format!("k{i}"), format!("m{i}"));
        produce_event(&s.topic, &key, "it_event", &id, &body).await;
        sent += 1;
        if i % 10 == 0 {
            // A producer's retry: same key, so it waits in the lane behind the first.
            produce_event(&s.topic, &key, "it_event", &id, &body).await;
            sent += 1;
        }
    }
    for (id, body) in [
        (
            "declined",
            serde_json::json!({"seq": 101, "permanent": true}),
        ),
        ("swallow", serde_json::json!({"seq": 103, "swallow": true})),
    ] {
        produce_event(&s.topic, id, "it_event", id, &body).await;
        sent += 1;
    }
    let mut config = ConsumerConfig::new(&group, [&s.topic]);
    config.retry = RetryStrategy::InPlace {
        attempts: 2,
        base: Duration::from_millis(10),
        max: Duration::from_millis(50),
    };
    let calls = Arc::new(Mutex::new(HashMap::new()));
    let caller = || Caller(Arc::default(), calls.clone());
    let r = match drv {
        Drv::TokioPostgres => start(
            Consumer::new(&s.db, &kafka(), config.clone())
                .unwrap()
                .call_handler("it_event", Arc::new(caller())),
        ),
        Drv::Sqlx => start(
            Consumer::sqlx(&s.db, &kafka(), config.clone(), sqlx_pool(&s.db, 4).await)
                .unwrap()
                .sqlx_call_handler("it_event", Arc::new(caller())),
        ),
    };
    wait_until(Duration::from_secs(60), "all settled", || async {
        get(&r.stats.handled) == n && get(&r.stats.dead_lettered) == 2
    })
    .await;
    offsets_at_end(&group, &s.topic, 2, sent).await;
    r.stop().await;
    let c = &s.c;
    assert_eq!(count(c, "SELECT count(*) FROM effects").await, n as i64);
    assert_eq!(
        count(c, "SELECT count(DISTINCT message_id) FROM effects").await,
        n as i64,
        "{drv:?}: one record per message"
    );
    assert_eq!(
        count(c, "SELECT count(*) FROM processed_messages").await,
        n as i64,
        "{drv:?}: a mark exactly for each recorded message"
    );
    let calls = calls.lock().unwrap().clone();
    for i in 0..n {
        assert_eq!(
            calls[&format!("m{i}")],
            1,
            "{drv:?}: m{i} called once, its repeat never"
        );
    }
    assert_eq!(
        calls["declined"], 1,
        "{drv:?}: a permanent failure is not retried"
    );
    assert_eq!(
        calls["swallow"], 2,
        "{drv:?}: an aborted record is retried from its call"
    );
    let mut dlq: Vec<(String, String)> = read_all(&format!("{}.dlq", s.topic))
        .await
        .iter()
        .map(|r| (r.message_id(), r.headers["x-error-kind"].clone()))
        .collect();
    dlq.sort();
    assert_eq!(
        dlq,
        [
            ("declined".to_owned(), "permanent".to_owned()),
            ("swallow".to_owned(), "transient-exhausted".to_owned()),
        ],
        "{drv:?}"
    );
}

macro_rules! matrix {
    ($($scenario:ident),*) => {
        mod tokio_postgres_driver {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Drv::TokioPostgres).await;
                }
            )*
        }
        mod sqlx_driver {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Drv::Sqlx).await;
                }
            )*
        }
    };
}

matrix!(
    dedupe_retries_dead_letters_and_redelivery,
    commit_groups,
    a_pool_in_the_configuration_is_refused_by_both_constructors,
    sigkilled_service_charges_every_order_once,
    call_handlers_record_through_the_driver
);

/// The example services, SIGKILLed mid-stream twice and restarted: `billing_consumer`
/// (tokio-postgres) and `sqlx_payments` (sqlx, which also enqueues an event per charge in the
/// same transaction). Every order is charged once, and the sqlx service's outbox holds one
/// `payment_captured` per charge.
async fn sigkilled_service_charges_every_order_once(drv: Drv) {
    let s = setup(3).await;
    let group = format!("svc-{}", hex(8));
    let spawn = || {
        let (bin, prefix) = match drv {
            Drv::TokioPostgres => ("billing_consumer", "BILLING"),
            Drv::Sqlx => ("sqlx_payments", "PAYMENTS"),
        };
        let mut c = std::process::Command::new(example_binary(bin));
        c.env("DATABASE_URL", database_url())
            .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
            .env("OUTBOX_SCHEMA", s.db.schema.name())
            .env(format!("{prefix}_TOPIC"), &s.topic)
            .env(format!("{prefix}_GROUP"), &group)
            .env(format!("{prefix}_CONCURRENCY"), "4")
            .env("PAYMENTS_OUT_TOPIC", format!("{}.payments", s.topic))
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        Kill(c.spawn().unwrap())
    };
    let charges = || async {
        if count(&s.c, "SELECT count(*) FROM pg_tables WHERE tablename = 'charges' AND schemaname = current_schema()").await == 0 {
            return 0;
        }
        count(&s.c, "SELECT count(*) FROM charges").await
    };
    let n = 90;
    for i in 0..n {
        let body = serde_json::json!({"order_number": format!("A-{i}"), "total_cents": 100 + i});
        produce_event(
            &s.topic,
            &format!("c{}", i % 30),
            "order_created",
            &format!("o{i}"),
            &body,
        )
        .await;
    }
    for kill_after in [10, 40] {
        let p = spawn();
        wait_until(Duration::from_secs(60), "some orders charged", || async {
            charges().await >= kill_after
        })
        .await;
        drop(p); // SIGKILL
    }
    let _p = spawn();
    wait_until(Duration::from_secs(120), "every order charged", || async {
        charges().await >= n
    })
    .await;
    let c = &s.c;
    assert_eq!(
        count(c, "SELECT count(*) FROM charges").await,
        n,
        "{drv:?}: none charged twice"
    );
    assert_eq!(
        count(c, "SELECT count(DISTINCT message_id) FROM charges").await,
        n
    );
    if let Drv::Sqlx = drv {
        assert_eq!(
            count(
                c,
                "SELECT count(*) FROM outbox WHERE headers->>'message_type' = 'payment_captured'"
            )
            .await,
            n,
            "one event per charge, written in the charge's transaction"
        );
    }
}
