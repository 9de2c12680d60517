//! Relay crashes: `kill -9` of relay processes every couple of seconds while messages are being
//! enqueued → zero lost, duplicates only from batches in flight at the kills, and with the
//! idempotent consumer downstream the business effect is exactly once.
//!
//! CI size: 20,000 messages. Full size (100,000): `OUTBOX_FAULT_SCALE=full cargo test --test relay crash:: -- --nocapture`.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox::consumer::{
    BoxFuture, Consumer, ConsumerConfig, ConsumerStats, Delivered, Handler, HandlerError,
};
use outbox_testkit::*;

struct Effect;
impl Handler for Effect {
    fn handle<'a>(
        &'a self,
        m: &'a Delivered,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            tx.execute(
                "INSERT INTO effects (message_id) VALUES ($1)",
                &[&m.message_id],
            )
            .await?;
            Ok(())
        })
    }
}

fn spawn_relay(db: &outbox::DbConfig, batch: usize) -> Child {
    Command::new(outbox_testkit::outbox_bin())
        .args([
            "relay",
            "--batch-size",
            &batch.to_string(),
            "--cleanup-interval",
            "off",
            "--rebalance-interval",
            "500ms",
        ])
        .env("DATABASE_URL", database_url())
        .env("OUTBOX_SCHEMA", db.schema.name())
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_killed_with_sigkill_lose_nothing_and_the_effect_is_exactly_once() {
    let full = std::env::var("OUTBOX_FAULT_SCALE").is_ok_and(|v| v == "full");
    let total: usize = if full { 100_000 } else { 20_000 };
    let batch = 500;
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 6).await;
    create_topic(&format!("{topic}.dlq"), 6).await;
    let c = client(&db).await;
    c.batch_execute(
        "CREATE TABLE effects (id bigint GENERATED ALWAYS AS IDENTITY, message_id text NOT NULL)",
    )
    .await
    .unwrap();

    // The idempotent consumer downstream, for the whole run.
    let group = format!("crash-{}", hex(6));
    let consumer = Consumer::new(&db, &kafka(), ConsumerConfig::new(&group, [&topic]))
        .unwrap()
        .handler("it_event", Effect);
    let stats = consumer.stats();
    let (stop_consumer, consumer_stopped) = tokio::sync::oneshot::channel::<()>();
    let consumer_task = tokio::spawn(consumer.run(async move {
        let _ = consumer_stopped.await;
    }));

    // Writer: enqueues the messages over ~15 s (CI) or ~60 s (full), 250 / 500 per transaction.
    let writer = {
        let (db, topic) = (db.clone(), topic.clone());
        tokio::spawn(async move {
            let per_tx = if full { 500 } else { 250 };
            let mut ids = Vec::with_capacity(total);
            for _ in 0..total / per_tx {
                ids.extend(enqueue_n(&db, &topic, per_tx, 1000, per_tx).await);
                tokio::time::sleep(Duration::from_millis(if full { 280 } else { 170 })).await;
            }
            ids
        })
    };

    // Two relays; every ~2 s one of them is SIGKILLed and replaced.
    let mut relays = vec![spawn_relay(&db, batch), spawn_relay(&db, batch)];
    let mut kills = 0;
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(1000 + fastrand::u64(0..1000))).await;
        let sent = count(&c, "SELECT count(*) FROM outbox WHERE status = 'sent'").await as usize;
        if sent >= total || writer.is_finished() && sent + batch * 2 >= total {
            break;
        }
        let victim = fastrand::usize(0..relays.len());
        relays[victim].kill().unwrap(); // SIGKILL
        relays[victim].wait().unwrap();
        kills += 1;
        relays[victim] = spawn_relay(&db, batch);
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "run took too long"
        );
    }
    let ids = writer.await.unwrap();
    wait_until(Duration::from_secs(60), "every row sent", || async {
        count(&c, "SELECT count(*) FROM outbox WHERE status = 'sent'").await as usize == total
    })
    .await;
    for mut r in relays {
        Command::new("kill")
            .args(["-TERM", &r.id().to_string()])
            .status()
            .unwrap();
        assert!(r.wait().unwrap().success());
    }

    let recs = read_all(&topic).await;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for r in &recs {
        *seen.entry(r.message_id()).or_default() += 1;
    }
    let lost = ids.iter().filter(|i| !seen.contains_key(*i)).count();
    let duplicates = recs.len() - seen.len();
    wait_until(Duration::from_secs(60), "consumer caught up", || async {
        ConsumerStats::get(&stats.handled) as usize >= total
    })
    .await;
    let effects = count(&c, "SELECT count(*) FROM effects").await as usize;
    let distinct = count(&c, "SELECT count(DISTINCT message_id) FROM effects").await as usize;
    stop_consumer.send(()).unwrap();
    consumer_task.await.unwrap().unwrap();
    eprintln!(
        "relay crashes: {total} messages, {kills} SIGKILLs, {} records in Kafka, {duplicates} duplicates, {lost} lost, \
         {effects} effects ({} duplicates absorbed by the consumer)",
        recs.len(),
        ConsumerStats::get(&stats.duplicates)
    );
    assert!(kills >= 3, "the run saw kills ({kills})");
    assert_eq!(lost, 0, "zero lost");
    assert!(
        duplicates <= kills * batch,
        "duplicates ({duplicates}) only from batches in flight at the kills"
    );
    assert_eq!(
        (effects, distinct),
        (total, total),
        "business effect exactly once"
    );
    assert_eq!(topic_len(&format!("{topic}.dlq")).await, 0);
}
