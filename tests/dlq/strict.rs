//! Strict per-key order: a keyed message that is dead-lettered holds its key; the key's later
//! messages wait behind it (durably, in order) while other keys and the partition's offsets
//! move on, and follow it when it is resolved — replayed and handled, dropped by an operator,
//! or expired. The same runs without strict order show the breaks the holds prevent.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox::consumer::{
    Consumer, ConsumerConfig, ConsumerStats, Delivered, HandlerError, OnHoldExpiry, RetryStrategy,
    StrictOrder,
};
use outbox::dlq::{Archiver, Dlq, Filter, ReplayOptions};
use outbox::{DbConfig, Enqueuer, Message, Relay};
use outbox_testkit::*;
use tokio_util::sync::CancellationToken;

/// Records (group, key, seq) in `applied`, in the order handled. Events whose body says
/// `poison` are refused until `fixed`.
fn recorder(
    group: String,
    fixed: Arc<AtomicBool>,
) -> impl for<'a> Fn(
    &'a Delivered,
    &'a tokio_postgres::Transaction<'a>,
) -> outbox::consumer::BoxFuture<'a, Result<(), HandlerError>>
       + Send
       + Sync
       + 'static {
    move |m, tx| {
        let (group, fixed) = (group.clone(), fixed.clone());
        Box::pin(async move {
            let b = m.json();
            if b["poison"].as_bool() == Some(true) && !fixed.load(Ordering::SeqCst) {
                return Err(HandlerError::permanent("rule 7 rejects the event"));
            }
            if b["flaky"].as_bool() == Some(true) && m.retry_attempt == 0 {
                return Err(HandlerError::transient("the ledger API timed out"));
            }
            let key = String::from_utf8(m.key.clone().unwrap_or_default()).unwrap();
            tx.execute(
                "INSERT INTO applied (grp, k, seq) VALUES ($1, $2, $3)",
                &[&group, &key, &b["seq"].as_i64().unwrap()],
            )
            .await?;
            Ok(())
        })
    }
}

struct Run {
    stop: CancellationToken,
    stats: Arc<ConsumerStats>,
    task: tokio::task::JoinHandle<Result<(), outbox::consumer::ConsumerError>>,
}

impl Run {
    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

fn start(
    db: &DbConfig,
    topic: &str,
    group: &str,
    strict: Option<StrictOrder>,
    fixed: &Arc<AtomicBool>,
) -> Run {
    let mut cfg = ConsumerConfig::new(group, [topic]);
    cfg.retry = RetryStrategy::InPlace {
        attempts: 1,
        base: Duration::from_millis(10),
        max: Duration::from_millis(10),
    };
    cfg.strict_order = strict;
    let consumer = Consumer::new(db, &kafka(), cfg)
        .unwrap()
        .handler("it_event", recorder(group.to_owned(), fixed.clone()));
    let stats = consumer.stats();
    let stop = CancellationToken::new();
    let s = stop.clone();
    let task = tokio::spawn(async move { consumer.run(async move { s.cancelled().await }).await });
    Run { stop, stats, task }
}

/// Enqueues `per_key` events for each key, round robin (k0:0, k1:0, …, k0:1, …); the events
/// `poison` names (key, seq) are refused until fixed. Relayed to `topic`.
async fn publish(
    db: &DbConfig,
    topic: &str,
    keys: usize,
    per_key: usize,
    poison: &[(usize, usize)],
) {
    let mut c = client(db).await;
    let enq = Enqueuer::new(&db.schema);
    for seq in 0..per_key {
        let tx = c.transaction().await.unwrap();
        let msgs: Vec<Message> = (0..keys)
            .map(|k| {
                Message::new(
                    topic,
                    "it_event",
                    format!("k{k}"),
                    serde_json::json!({"seq": seq, "poison": poison.contains(&(k, seq))}),
                )
            })
            .collect();
        enq.enqueue_batch(&tx, &msgs).await.unwrap();
        tx.commit().await.unwrap();
    }
    let relay = Relay::new(db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, keys * per_key);
}

/// Waits until `group` has committed every partition of `topic` to its end.
async fn committed_to_end(group: &str, topic: &str, partitions: i32, what: &str) {
    let records = read_all(topic).await;
    for p in 0..partitions {
        let hi = records
            .iter()
            .filter(|r| r.partition == p)
            .map(|r| r.offset + 1)
            .max()
            .unwrap_or(0);
        wait_until(Duration::from_secs(20), what, || async {
            committed(group, topic, p).await.unwrap_or(0) == hi
        })
        .await;
    }
}

/// Per key, the sequence numbers `group` applied, in the order applied.
async fn applied(c: &tokio_postgres::Client, group: &str) -> HashMap<String, Vec<i64>> {
    let mut m: HashMap<String, Vec<i64>> = HashMap::new();
    for r in c
        .query(
            "SELECT k, seq FROM applied WHERE grp = $1 ORDER BY n",
            &[&group],
        )
        .await
        .unwrap()
    {
        m.entry(r.get(0)).or_default().push(r.get(1));
    }
    m
}

/// Archives the DLQ, then replays `group`'s letters of `topic` at `rate`.
async fn replay_all(
    db: &DbConfig,
    topic: &str,
    group: &str,
    rate: f64,
    confirm_order: bool,
) -> i64 {
    Archiver::new(db, &kafka(), vec![format!("{topic}.dlq")])
        .unwrap()
        .group(&format!("it-arch-{}", hex(6)))
        .run_once(&mut |_, _| {})
        .await
        .unwrap();
    let dlq = Dlq::new(db);
    let mut o = ReplayOptions::default();
    o.canary = 0;
    o.confirm_kinds = true;
    o.actor = "oncall".into();
    o.rate = rate;
    o.confirm_order = confirm_order;
    let f = Filter {
        topic: Some(topic.to_owned()),
        group: Some(group.to_owned()),
        ..Filter::default()
    };
    let job = dlq.create_job(&f, &o).await.unwrap();
    dlq.run_job(&kafka(), job.id, &CancellationToken::new(), &mut |_| {})
        .await
        .unwrap();
    job.id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_message_holds_its_key_across_a_restart_until_its_replay_and_the_rest_follow_in_order(
) {
    let db = fresh_db().await;
    let c = client(&db).await;
    c.batch_execute("CREATE TABLE applied (n bigserial, grp text, k text, seq bigint, at timestamptz DEFAULT clock_timestamp())")
        .await
        .unwrap();
    let topic = topic_name();
    create_topic_family(&topic, 2, &[]).await;
    let fixed = Arc::new(AtomicBool::new(false));
    let (strict, loose) = (format!("strict-{}", hex(4)), format!("loose-{}", hex(4)));
    // k3 fails at its first event, k7 at its third; 10 keys × 5 events.
    let poison = [(3, 0), (7, 2)];
    publish(&db, &topic, 10, 3, &poison).await;

    let a = start(
        &db,
        &topic,
        &strict,
        Some(StrictOrder::new([&topic])),
        &fixed,
    );
    let b = start(&db, &topic, &loose, None, &fixed);
    // Strict: k3's seq 1, 2 and k7's nothing after seq 2 wait; the others are handled.
    wait_until(
        Duration::from_secs(60),
        "the first 30 events settled by both",
        || async {
            let s = (&a.stats, &b.stats);
            ConsumerStats::get(&s.0.handled) == 26
                && ConsumerStats::get(&s.0.dead_lettered) == 2
                && ConsumerStats::get(&s.1.handled) == 28
                && ConsumerStats::get(&s.1.dead_lettered) == 2
                // A held message's row is written by its own task: the counters of the other
                // keys can reach their figures first.
                && count(
                    &c,
                    &format!("SELECT count(*) FROM consumer_held WHERE consumer_group = '{strict}'"),
                )
                .await
                    >= 2
                && count(
                    &c,
                    &format!("SELECT count(*) FROM consumer_holds WHERE consumer_group = '{strict}'"),
                )
                .await
                    >= 2
        },
    )
    .await;
    assert_eq!(
        count(
            &c,
            &format!("SELECT count(*) FROM consumer_holds WHERE consumer_group = '{strict}'")
        )
        .await,
        2,
        "k3 and k7 are held"
    );
    assert_eq!(
        count(
            &c,
            &format!("SELECT count(*) FROM consumer_held WHERE consumer_group = '{strict}'")
        )
        .await,
        2,
        "k3's seq 1 and 2 wait behind its head"
    );
    // A restart with holds: the next events of held keys are held by the new process too.
    a.stop().await;
    publish(&db, &topic, 10, 2, &[]).await; // seq 0..1 again: treat as seq 3..4 below
    let _ = &c;
    let a = start(
        &db,
        &topic,
        &strict,
        Some(StrictOrder::new([&topic])),
        &fixed,
    );
    wait_until(
        Duration::from_secs(60),
        "the next 20 events settled",
        || async {
            count(
                &c,
                &format!("SELECT count(*) FROM applied WHERE grp = '{strict}'"),
            )
            .await
                == 26 + 16
                && count(
                    &c,
                    &format!(
                        "SELECT count(*) FROM consumer_held WHERE consumer_group = '{strict}'"
                    ),
                )
                .await
                    == 6
        },
    )
    .await;
    // Offsets move past held messages: every partition committed to its end.
    committed_to_end(&strict, &topic, 2, "offsets committed past held messages").await;
    // Every record again (offsets rewound: what a crash before a commit does at large): the
    // messages before a head are duplicates, the held ones are not held twice.
    a.stop().await;
    rewind_group(&strict, &topic, 2).await;
    let a = start(
        &db,
        &topic,
        &strict,
        Some(StrictOrder::new([&topic])),
        &fixed,
    );
    wait_until(
        Duration::from_secs(60),
        "the redelivered records settled",
        || async {
            ConsumerStats::get(&a.stats.duplicates) + ConsumerStats::get(&a.stats.dead_lettered)
                >= 42
                && count(
                    &c,
                    &format!(
                        "SELECT count(*) FROM consumer_held WHERE consumer_group = '{strict}'"
                    ),
                )
                .await
                    == 6
        },
    )
    .await;
    committed_to_end(&strict, &topic, 2, "offsets committed again").await;
    assert_eq!(
        count(
            &c,
            &format!("SELECT count(*) FROM consumer_held WHERE consumer_group = '{strict}'")
        )
        .await,
        6,
        "a redelivered message before its key's head is not held"
    );
    assert_eq!(
        count(
            &c,
            &format!("SELECT count(*) FROM applied WHERE grp = '{strict}'")
        )
        .await,
        42
    );

    // The fix is deployed; the letters are replayed; the held messages follow their heads.
    fixed.store(true, Ordering::SeqCst);
    // The strict group's heads hold back what came after them: nothing passed them.
    let dlq = Dlq::new(&db);
    archive_once(&db, vec![format!("{topic}.dlq")]).await;
    let of = |g: &str| Filter {
        topic: Some(topic.clone()),
        group: Some(g.to_owned()),
        ..Filter::default()
    };
    let mut o = ReplayOptions::default();
    o.confirm_kinds = true;
    o.canary = 0;
    let dry = dlq.dry_run(&of(&strict), &o).await.unwrap();
    assert_eq!((dry.count, dry.passed_by_newer), (2, 0));
    // The loose group handled newer events of both keys: the dry run says so and a replay
    // needs the confirmation.
    let dry = dlq.dry_run(&of(&loose), &o).await.unwrap();
    assert_eq!(
        (dry.count, dry.passed_by_newer),
        (2, 2),
        "letters passed by newer events"
    );
    let refused = dlq
        .create_job(&of(&loose), &o)
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("--confirm-order"), "{refused}");
    let cli = outbox_command(&db)
        .args([
            "dlq",
            "replay",
            "--dry-run",
            "--confirm-kinds",
            "--topic",
            &topic,
            "--group",
            &loose,
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&cli.stdout);
    assert!(
        cli.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    assert!(
        said.contains("2 letter(s)")
            && said.contains("newer messages of their key already handled")
            && said.contains("needs --confirm-order"),
        "{said}"
    );
    // The strict group's replay goes at 5 letters/s: its released messages follow no faster.
    replay_all(&db, &topic, &strict, 5.0, false).await;
    replay_all(&db, &topic, &loose, 50.0, true).await;
    wait_until(
        Duration::from_secs(60),
        "every event applied by both groups",
        || async {
            count(
                &c,
                &format!("SELECT count(*) FROM applied WHERE grp = '{strict}'"),
            )
            .await
                == 50
                && count(
                    &c,
                    &format!("SELECT count(*) FROM applied WHERE grp = '{loose}'"),
                )
                .await
                    == 50
        },
    )
    .await;
    a.stop().await;
    b.stop().await;
    let want_order = |seqs: &Vec<i64>| {
        // Publication order per key: 0, 1, 2 then the second batch's 0, 1.
        seqs == &vec![0, 1, 2, 0, 1]
    };
    let s = applied(&c, &strict).await;
    for (k, seqs) in &s {
        assert!(want_order(seqs), "strict: {k} applied {seqs:?}");
    }
    assert_eq!(s.len(), 10);
    let l = applied(&c, &loose).await;
    assert_eq!(
        l["k3"],
        vec![1, 2, 0, 1, 0],
        "without strict order the replay lands last"
    );
    assert_eq!(l["k7"], vec![0, 1, 0, 1, 2]);
    // k3's four held events followed its replayed head at the job's rate (5/s).
    let at: Vec<f64> = c
        .query(
            "SELECT extract(epoch FROM at)::float8 FROM applied WHERE grp = $1 AND k = 'k3' ORDER BY n",
            &[&strict],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let gaps: Vec<f64> = at.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter().all(|g| *g >= 0.18),
        "released faster than the job's rate: {gaps:?}"
    );
    assert_eq!(
        count(&c, "SELECT count(*) FROM consumer_holds").await
            + count(&c, "SELECT count(*) FROM consumer_held").await,
        0,
        "every hold ended"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_head_lets_its_key_go_on_and_an_expired_hold_follows_its_head_to_the_dlq() {
    let db = fresh_db().await;
    let c = client(&db).await;
    c.batch_execute("CREATE TABLE applied (n bigserial, grp text, k text, seq bigint, at timestamptz DEFAULT clock_timestamp())")
        .await
        .unwrap();
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let fixed = Arc::new(AtomicBool::new(false));
    let (dropping, expiring) = (format!("drop-{}", hex(4)), format!("expire-{}", hex(4)));
    publish(&db, &topic, 2, 4, &[(0, 1)]).await;

    let mut s = StrictOrder::new([&topic]);
    s.check_interval = Duration::from_millis(200);
    let a = start(&db, &topic, &dropping, Some(s.clone()), &fixed);
    s.expiry = Some(Duration::from_secs(2));
    // A third group lets its held messages go on when the hold expires (the default).
    let releasing = format!("release-{}", hex(4));
    let r = start(&db, &topic, &releasing, Some(s.clone()), &fixed);
    s.on_expiry = OnHoldExpiry::DeadLetter;
    let b = start(&db, &topic, &expiring, Some(s), &fixed);
    wait_until(
        Duration::from_secs(60),
        "k0 held behind seq 1 in the dropping group",
        || async {
            count(
                &c,
                &format!("SELECT count(*) FROM consumer_held WHERE consumer_group = '{dropping}'"),
            )
            .await
                == 2
        },
    )
    .await;
    // The operator drops the head with a reason: k0's seq 2 and 3 go on, in order.
    Archiver::new(&db, &kafka(), vec![format!("{topic}.dlq")])
        .unwrap()
        .group(&format!("it-arch-{}", hex(6)))
        .run_once(&mut |_, _| {})
        .await
        .unwrap();
    let dlq = Dlq::new(&db);
    let f = Filter {
        topic: Some(topic.clone()),
        group: Some(dropping.clone()),
        ..Filter::default()
    };
    let dropped = dlq
        .drop_letters(&f, false, "obsolete: superseded by seq 2", "oncall")
        .await
        .unwrap();
    assert_eq!(dropped.dropped, 1);
    wait_until(
        Duration::from_secs(30),
        "k0 released after the drop",
        || async { applied(&c, &dropping).await.get("k0") == Some(&vec![0, 2, 3]) },
    )
    .await;
    // The expiring group: past 2 s the held messages follow the head into the DLQ, in order.
    wait_until(
        Duration::from_secs(30),
        "k0's held messages dead-lettered on expiry",
        || async {
            read_all(&format!("{topic}.dlq"))
                .await
                .iter()
                .filter(|r| r.headers.get("x-consumer-group") == Some(&expiring))
                .count()
                == 3
        },
    )
    .await;
    let letters: Vec<(String, i64)> = read_all(&format!("{topic}.dlq"))
        .await
        .iter()
        .filter(|r| r.headers.get("x-consumer-group") == Some(&expiring))
        .map(|r| {
            (
                r.headers["x-error-kind"].clone(),
                r.json()["seq"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        letters,
        [
            ("permanent".to_owned(), 1),
            ("held-expired".to_owned(), 2),
            ("held-expired".to_owned(), 3)
        ]
    );
    assert_eq!(applied(&c, &expiring).await.get("k0"), Some(&vec![0]));
    assert_eq!(
        applied(&c, &expiring).await.get("k1"),
        Some(&vec![0, 1, 2, 3])
    );
    wait_until(Duration::from_secs(30), "k0 released on expiry", || async {
        applied(&c, &releasing).await.get("k0") == Some(&vec![0, 2, 3])
    })
    .await;
    // The hold goes in upkeep's release transaction, after the handlers' commits.
    wait_until(Duration::from_secs(30), "every hold gone", || async {
        count(&c, "SELECT count(*) FROM consumer_holds").await == 0
    })
    .await;
    a.stop().await;
    b.stop().await;
    r.stop().await;
}

/// `billing_consumer` as a process (kill -9 is a real one).
struct Billing(Child);

impl Billing {
    fn start(db: &DbConfig, topic: &str, group: &str, strict: bool, refunds: bool) -> Self {
        let flag = |b: bool| if b { "1" } else { "" };
        let mut cmd = Command::new(example_binary("billing_consumer"));
        if strict {
            // The deployment's topics file names the group strict on the topic.
            let path = std::env::temp_dir().join(format!("topics-{group}.toml"));
            std::fs::write(
                &path,
                format!("[[topic]]\nname = \"{topic}\"\nstrict_order = [\"{group}\"]\n"),
            )
            .unwrap();
            cmd.env("BILLING_TOPICS_FILE", path);
        }
        Self(
            cmd.env("DATABASE_URL", database_url())
                .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
                .env("OUTBOX_SCHEMA", db.schema.name())
                .env("BILLING_TOPIC", topic)
                .env("BILLING_GROUP", group)
                .env("BILLING_CONCURRENCY", "16")
                .env("BILLING_REFUNDS", flag(refunds))
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    fn kill9(mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for Billing {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn charges(c: &tokio_postgres::Client) -> i64 {
    if count(c, "SELECT count(*) FROM pg_tables WHERE tablename = 'charges' AND schemaname = current_schema()").await == 0 {
        return 0;
    }
    count(c, "SELECT count(*) FROM charges").await
}

/// Per customer, the orders charged, in the order charged.
async fn charged(c: &tokio_postgres::Client) -> HashMap<String, Vec<String>> {
    let mut m: HashMap<String, Vec<String>> = HashMap::new();
    for r in c
        .query("SELECT order_number FROM charges ORDER BY id", &[])
        .await
        .unwrap()
    {
        let o: String = r.get(0);
        m.entry(o.split('-').next().unwrap().to_owned())
            .or_default()
            .push(o);
    }
    m
}

async fn replay_group(db: &DbConfig, topic: &str, group: &str, confirm_order: bool) {
    replay_all(db, topic, group, 100.0, confirm_order).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_keys_with_poison_heads_keep_their_order_through_a_kill_9_and_a_rebalance() {
    const KEYS: usize = 1000;
    const PER_KEY: usize = 20;
    // 3 % of the customers have one refused order (a refund the service does not know yet),
    // somewhere in their first 17.
    let poison: HashMap<usize, usize> = (0..KEYS)
        .filter(|k| k % 33 == 5)
        .map(|k| (k, 2 + k % 15))
        .collect();
    assert_eq!(poison.len() * 100 / KEYS, 3);
    let strict_db = fresh_db().await;
    let loose_db = fresh_db().await;
    let (sc, lc) = (client(&strict_db).await, client(&loose_db).await);
    let topic = topic_name();
    create_topic_family(&topic, 4, &[]).await;
    {
        let mut c = client(&strict_db).await;
        let enq = Enqueuer::new(&strict_db.schema);
        for seq in 0..PER_KEY {
            let tx = c.transaction().await.unwrap();
            let msgs: Vec<Message> = (0..KEYS)
                .map(|k| {
                    let cents = if poison.get(&k) == Some(&seq) { -500 } else { 100 + seq as i64 };
                    Message::new(
                        &topic,
                        "order_created",
                        format!("c{k}"),
                        serde_json::json!({"order_number": format!("c{k}-{seq:02}"), "total_cents": cents}),
                    )
                })
                .collect();
            enq.enqueue_batch(&tx, &msgs).await.unwrap();
            tx.commit().await.unwrap();
        }
        let relay = Relay::new(&strict_db, &kafka(), relay_config()).unwrap();
        assert_eq!(drain(&relay).await, KEYS * PER_KEY);
    }
    let (strict, loose) = (
        format!("billing-strict-{}", hex(4)),
        format!("billing-{}", hex(4)),
    );
    let a = Billing::start(&strict_db, &topic, &strict, true, false);
    let b = Billing::start(&strict_db, &topic, &strict, true, false);
    let l = Billing::start(&loose_db, &topic, &loose, false, false);
    // Mid-hold: keys are held and a third of the orders charged; then replica A dies.
    wait_until(
        Duration::from_secs(120),
        "holds exist and a third charged",
        || async {
            charges(&sc).await >= (KEYS * PER_KEY / 3) as i64
                && count(&sc, "SELECT count(*) FROM consumer_holds").await >= 5
        },
    )
    .await;
    a.kill9();
    // Replica B takes A's partitions (a rebalance after the session timeout); then a new A
    // joins (another rebalance) while holds exist.
    let reached = charges(&sc).await;
    wait_until(Duration::from_secs(120), "B goes on alone", || async {
        charges(&sc).await >= reached + 2000
    })
    .await;
    let a2 = Billing::start(&strict_db, &topic, &strict, true, false);
    let before_fix: i64 = (0..KEYS)
        .map(|k| poison.get(&k).map_or(PER_KEY, |p| *p) as i64)
        .sum();
    let held: i64 = poison.values().map(|p| (PER_KEY - p - 1) as i64).sum();
    wait_until(
        Duration::from_secs(180),
        "every order not behind a refused one charged; the rest held",
        || async {
            charges(&sc).await == before_fix
                && count(&sc, "SELECT count(*) FROM consumer_held").await == held
                && charges(&lc).await == (KEYS * PER_KEY - poison.len()) as i64
        },
    )
    .await;
    assert_eq!(
        count(&sc, "SELECT count(*) FROM consumer_holds").await,
        poison.len() as i64
    );
    // The version that knows refunds is deployed; the refused orders are replayed.
    a2.kill9();
    b.kill9();
    l.kill9();
    let fixed = Billing::start(&strict_db, &topic, &strict, true, true);
    let fixed_loose = Billing::start(&loose_db, &topic, &loose, false, true);
    replay_group(&strict_db, &topic, &strict, false).await;
    replay_group(&loose_db, &topic, &loose, true).await;
    wait_until(
        Duration::from_secs(180),
        "every order charged by both",
        || async {
            charges(&sc).await == (KEYS * PER_KEY) as i64
                && charges(&lc).await == (KEYS * PER_KEY) as i64
        },
    )
    .await;
    wait_until(Duration::from_secs(30), "every hold ended", || async {
        count(&sc, "SELECT count(*) FROM consumer_holds").await == 0
    })
    .await;
    drop((fixed, fixed_loose));
    let want = |k: usize| {
        (0..PER_KEY)
            .map(|s| format!("c{k}-{s:02}"))
            .collect::<Vec<_>>()
    };
    let s = charged(&sc).await;
    let breaks = |m: &HashMap<String, Vec<String>>| {
        (0..KEYS)
            .filter(|k| m.get(&format!("c{k}")) != Some(&want(*k)))
            .count()
    };
    let (strict_breaks, loose_breaks) = (breaks(&s), breaks(&charged(&lc).await));
    eprintln!(
        "order breaks: strict {strict_breaks} of {KEYS} keys, without strict order {loose_breaks}"
    );
    assert_eq!(
        strict_breaks, 0,
        "strict order: every customer charged in order, once each"
    );
    assert_eq!(
        loose_breaks,
        poison.len(),
        "without it, every customer with a refused order is out of order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_on_its_retry_topic_holds_its_key_until_its_retry_is_handled() {
    let db = fresh_db().await;
    let c = client(&db).await;
    c.batch_execute("CREATE TABLE applied (n bigserial, grp text, k text, seq bigint, at timestamptz DEFAULT clock_timestamp())")
        .await
        .unwrap();
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let fixed = Arc::new(AtomicBool::new(true));
    let (strict, loose) = (format!("strict-{}", hex(4)), format!("loose-{}", hex(4)));
    let mut runs = Vec::new();
    for (group, strict_order) in [(&strict, true), (&loose, false)] {
        create_topic(&format!("{topic}.{group}.retry-2s"), 1).await;
        let mut cfg = ConsumerConfig::new(group.as_str(), [&topic]);
        cfg.retry = RetryStrategy::Topics {
            delays: vec![Duration::from_secs(2)],
        };
        cfg.strict_order = strict_order.then(|| StrictOrder::new([&topic]));
        let consumer = Consumer::new(&db, &kafka(), cfg)
            .unwrap()
            .handler("it_event", recorder(group.clone(), fixed.clone()));
        let stop = CancellationToken::new();
        let s = stop.clone();
        let stats = consumer.stats();
        let task =
            tokio::spawn(async move { consumer.run(async move { s.cancelled().await }).await });
        runs.push(Run { stop, stats, task });
    }
    // k0's first event times out once (it succeeds from its retry topic 2 s later).
    for seq in 0..3 {
        produce_event(
            &topic,
            "k0",
            "it_event",
            &uuid::Uuid::now_v7().to_string(),
            &serde_json::json!({"seq": seq, "flaky": seq == 0}),
        )
        .await;
    }
    wait_until(
        Duration::from_secs(60),
        "k0 applied three times by both",
        || async { count(&c, "SELECT count(*) FROM applied").await == 6 },
    )
    .await;
    for r in runs {
        r.stop().await;
    }
    assert_eq!(
        applied(&c, &strict).await["k0"],
        vec![0, 1, 2],
        "held behind its retry"
    );
    assert_eq!(
        applied(&c, &loose).await["k0"],
        vec![1, 2, 0],
        "without: the retry lands last"
    );
    assert_eq!(count(&c, "SELECT count(*) FROM consumer_holds").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_message_that_does_not_decode_becomes_the_head_and_can_be_dropped_by_its_letter() {
    let db = fresh_db().await;
    let c = client(&db).await;
    c.batch_execute("CREATE TABLE applied (n bigserial, grp text, k text, seq bigint, at timestamptz DEFAULT clock_timestamp())")
        .await
        .unwrap();
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let fixed = Arc::new(AtomicBool::new(false));
    let group = format!("strict-{}", hex(4));
    let mut s = StrictOrder::new([&topic]);
    s.check_interval = Duration::from_millis(200);
    let a = start(&db, &topic, &group, Some(s), &fixed);
    let event = |seq: i64, poison: bool| serde_json::json!({"seq": seq, "poison": poison});
    produce_event(
        &topic,
        "k0",
        "it_event",
        &uuid::Uuid::now_v7().to_string(),
        &event(0, false),
    )
    .await;
    produce_event(
        &topic,
        "k0",
        "it_event",
        &uuid::Uuid::now_v7().to_string(),
        &event(1, true),
    )
    .await;
    // No message_type: it cannot be decoded, and has no message id to be known by.
    produce(
        &topic,
        Some(b"k0"),
        &[("entity_id", b"k0")],
        Some(b"{\"seq\": 2}"),
    )
    .await;
    produce_event(
        &topic,
        "k0",
        "it_event",
        &uuid::Uuid::now_v7().to_string(),
        &event(3, false),
    )
    .await;
    wait_until(
        Duration::from_secs(60),
        "seq 2 and 3 held behind seq 1",
        || async { count(&c, "SELECT count(*) FROM consumer_held").await == 2 },
    )
    .await;
    let dlq = Dlq::new(&db);
    let drop_head = |reason: &'static str| {
        let (db, topic, dlq) = (db.clone(), topic.clone(), dlq.clone());
        async move {
            archive_once(&db, vec![format!("{topic}.dlq")]).await;
            let held = dlq.held_keys(10).await.unwrap();
            assert_eq!(held.len(), 1, "{held:?}");
            let letter = held[0].head_letter.expect("the head's letter is known");
            let f = Filter {
                ids: vec![letter],
                ..Filter::default()
            };
            assert_eq!(
                dlq.drop_letters(&f, false, reason, "oncall")
                    .await
                    .unwrap()
                    .dropped,
                1
            );
            held[0].waiting
        }
    };
    assert_eq!(drop_head("seq 1 is obsolete").await, 2);
    // Released: the undecodable one is dead-lettered and becomes the head; seq 3 waits.
    wait_until(
        Duration::from_secs(30),
        "the undecodable message is the new head",
        || async {
            count(
                &c,
                "SELECT count(*) FROM consumer_holds WHERE head_message_id IS NULL",
            )
            .await
                == 1
                && count(&c, "SELECT count(*) FROM consumer_held").await == 1
        },
    )
    .await;
    assert_eq!(drop_head("garbage from a test producer").await, 1);
    wait_until(Duration::from_secs(30), "seq 3 handled", || async {
        applied(&c, &group).await.get("k0") == Some(&vec![0, 3])
    })
    .await;
    // The hold goes in upkeep's release transaction, after the handler's commit.
    wait_until(Duration::from_secs(30), "the hold gone", || async {
        count(&c, "SELECT count(*) FROM consumer_holds").await == 0
    })
    .await;
    a.stop().await;
}
