//! Consumers back in seconds after a crash, and dead letters written once: `billing_consumer`
//! processes SIGKILLed and restarted against the real broker.

use std::collections::HashSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox_testkit::*;

struct Billing {
    child: Child,
}

impl Billing {
    fn start(
        db: &outbox::DbConfig,
        topic: &str,
        group: &str,
        instance: Option<&str>,
        extra: &str,
    ) -> Self {
        let mut c = Command::new(example_binary("billing_consumer"));
        c.env("DATABASE_URL", database_url())
            .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
            .env("OUTBOX_SCHEMA", db.schema.name())
            .env("BILLING_TOPIC", topic)
            .env("BILLING_GROUP", group)
            .env("BILLING_CONCURRENCY", "4")
            .env("OUTBOX_KAFKA_PROPERTIES", extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(id) = instance {
            c.env("BILLING_INSTANCE_ID", id);
        }
        Self {
            child: c.spawn().unwrap(),
        }
    }

    fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Billing {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn orders(topic: &str, from: usize, n: usize, poison_every: usize) -> usize {
    let mut poison = 0;
    for i in from..from + n {
        let cents = if poison_every > 0 && i % poison_every == 0 {
            poison += 1;
            -1 // refused: a permanent error, dead-lettered
        } else {
            100 + i as i64
        };
        produce_event(
            topic,
            &format!("c{}", i % 50),
            "order_created",
            &uuid::Uuid::now_v7().to_string(),
            &serde_json::json!({"order_number": format!("A-{i}"), "total_cents": cents}),
        )
        .await;
    }
    poison
}

async fn charges(c: &tokio_postgres::Client) -> i64 {
    if count(c, "SELECT count(*) FROM pg_tables WHERE tablename = 'charges' AND schemaname = current_schema()").await == 0 {
        return 0;
    }
    count(c, "SELECT count(*) FROM charges").await
}

/// Seconds from the restart after three SIGKILLs to the first new order charged.
async fn recovery(instance: Option<&str>, extra: &str) -> f64 {
    let db = fresh_db().await;
    let c = client(&db).await;
    let topic = topic_name();
    create_topic_family(&topic, 3, &[]).await;
    let group = format!("billing-{}", hex(6));
    orders(&topic, 0, 30, 0).await;
    let b = Billing::start(&db, &topic, &group, instance, extra);
    wait_until(Duration::from_secs(60), "30 charged", || async {
        charges(&c).await == 30
    })
    .await;
    // Three kills a few seconds apart, each after the process had rejoined.
    b.kill9();
    for _ in 0..2 {
        let b = Billing::start(&db, &topic, &group, instance, extra);
        tokio::time::sleep(Duration::from_secs(2)).await;
        b.kill9();
    }
    let restarted = Instant::now();
    let _b = Billing::start(&db, &topic, &group, instance, extra);
    orders(&topic, 30, 6, 0).await;
    wait_until(Duration::from_secs(240), "a new order charged", || async {
        charges(&c).await > 30
    })
    .await;
    let secs = restarted.elapsed().as_secs_f64();
    wait_until(
        Duration::from_secs(60),
        "all new orders charged",
        || async { charges(&c).await == 36 },
    )
    .await;
    assert_eq!(
        count(&c, "SELECT count(DISTINCT message_id) FROM charges").await,
        36
    );
    secs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_consumer_handles_again_within_seconds_after_three_sigkills() {
    let with_id = recovery(Some(&format!("billing-{}", hex(4))), "").await;
    let without = recovery(None, "").await;
    eprintln!("first order charged after the restart: {with_id:.1} s with an instance id, {without:.1} s without (session timeout 6 s)");
    assert!(with_id <= 5.0, "with an instance id: {with_id:.1} s");
    assert!(without <= 15.0, "without an instance id: {without:.1} s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_are_dead_lettered_once_across_repeated_sigkills() {
    let db = fresh_db().await;
    let c = client(&db).await;
    let topic = topic_name();
    create_topic_family(&topic, 3, &[]).await;
    let group = format!("billing-{}", hex(6));
    // 3,000 orders, every 25th refused: 120 poison messages among them.
    let poison = orders(&topic, 0, 3000, 25).await;
    assert_eq!(poison, 120);
    let mut kills = 0;
    let mut dlq_at_kill = Vec::new();
    while kills < 3 {
        let b = Billing::start(&db, &topic, &group, Some("billing-poison"), "");
        // Killed while it writes dead letters, not between them.
        let before = topic_len(&format!("{topic}.dlq")).await;
        wait_until(
            Duration::from_secs(60),
            "dead letters being written",
            || async { topic_len(&format!("{topic}.dlq")).await >= before + 10 },
        )
        .await;
        b.kill9();
        kills += 1;
        dlq_at_kill.push(topic_len(&format!("{topic}.dlq")).await);
    }
    let _b = Billing::start(&db, &topic, &group, Some("billing-poison"), "");
    wait_until(
        Duration::from_secs(120),
        "every good order charged",
        || async { charges(&c).await == 2880 },
    )
    .await;
    // Poison messages settle on their own clock (a dead letter is final once acknowledged):
    // wait for all of them, then look for duplicates.
    let started = Instant::now();
    wait_until(
        Duration::from_secs(60),
        "every poison message dead-lettered",
        || async { topic_len(&format!("{topic}.dlq")).await >= 120 },
    )
    .await;
    eprintln!(
        "last dead letters {:.1} s after the last charge",
        started.elapsed().as_secs_f64()
    );
    let dlq = read_all(&format!("{topic}.dlq")).await;
    let distinct: HashSet<String> = dlq.iter().map(Record::message_id).collect();
    eprintln!("DLQ records after 3 SIGKILLs: {} ({} distinct poison messages); DLQ size at each kill: {dlq_at_kill:?}", dlq.len(), distinct.len());
    assert_eq!(distinct.len(), 120);
    assert_eq!(dlq.len(), 120, "a poison message was dead-lettered twice");
    assert_eq!(
        count(&c, "SELECT count(DISTINCT message_id) FROM charges").await,
        2880
    );
}

/// The evaluation of Kafka 4's consumer group protocol (KIP-848) with the bundled librdkafka:
/// `cargo test --test consumer recovery::kip848 -- --ignored --nocapture` (figures in docs/BENCHMARKS_HISTORY.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "an evaluation, run by hand"]
async fn kip848_consumer_protocol_recovery() {
    let classic = recovery(None, "").await;
    let kip848 = recovery(None, "group.protocol=consumer").await;
    let kip848_static = recovery(
        Some(&format!("billing-{}", hex(4))),
        "group.protocol=consumer",
    )
    .await;
    eprintln!("first order after the restart: classic {classic:.1} s, consumer protocol {kip848:.1} s, consumer protocol + instance id {kip848_static:.1} s");
}

/// Members of `group` while it is stable (empty while it rebalances or is unknown).
async fn stable_members(group: &str) -> usize {
    let group = group.to_owned();
    tokio::task::spawn_blocking(move || {
        use rdkafka::consumer::{BaseConsumer, Consumer as _};
        let c: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .create()
            .unwrap();
        c.fetch_group_list(Some(&group), Duration::from_secs(5))
            .ok()
            .and_then(|l| {
                l.groups()
                    .iter()
                    .find(|g| g.name() == group && g.state() == "Stable")
                    .map(|g| g.members().len())
            })
            .unwrap_or(0)
    })
    .await
    .unwrap()
}

/// A replica scaled down for good (SIGKILLed, never restarted; static membership as in a
/// StatefulSet): its partitions go to the survivor once the session timeout (6 s) expires,
/// and the orders written to them are handled then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scaled_down_replicas_partitions_are_handled_by_the_survivor_after_the_session_timeout() {
    let db = fresh_db().await;
    let c = client(&db).await;
    let topic = topic_name();
    create_topic_family(&topic, 6, &[]).await;
    let group = format!("billing-{}", hex(6));
    orders(&topic, 0, 60, 0).await;
    // Both replicas start at the same moment, as a deployment starts them (each creates its
    // table at startup: this once left one replica dead before the example took a lock).
    let _a = Billing::start(&db, &topic, &group, Some("billing-a"), "");
    let b = Billing::start(&db, &topic, &group, Some("billing-b"), "");
    wait_until(Duration::from_secs(60), "two members", || async {
        stable_members(&group).await == 2
    })
    .await;
    wait_until(Duration::from_secs(60), "60 charged", || async {
        charges(&c).await == 60
    })
    .await;
    b.kill9();
    let killed = Instant::now();
    // 60 orders over 50 keys: every partition gets some, the dead replica's three included.
    orders(&topic, 60, 60, 0).await;
    wait_until(
        Duration::from_secs(60),
        "every new order charged",
        || async { charges(&c).await == 120 },
    )
    .await;
    let secs = killed.elapsed().as_secs_f64();
    eprintln!("the scaled-down replica's orders charged by the survivor {secs:.1} s after the kill (session timeout 6 s)");
    // Not sooner than the session could expire (heartbeats go every 2 s): proof the dead
    // replica held partitions; not much later than the expiry plus one rebalance.
    assert!(
        secs >= 3.0,
        "{secs:.1} s: the dead member's partitions should have waited for its session to expire"
    );
    assert!(secs <= 12.0, "{secs:.1} s after the kill");
    assert_eq!(stable_members(&group).await, 1);
}
