//! A compacted state topic end to end: updates and a tombstone through the outbox and the
//! relay, a consumer that applies both, and the broker's compaction removing the deleted key.

use std::time::Duration;

use outbox::consumer::{Consumer, ConsumerConfig, ConsumerStats, Delivered, HandlerError};
use outbox::{Enqueuer, Message};
use outbox_testkit::*;

async fn upsert(msg: &Delivered, tx: &tokio_postgres::Transaction<'_>) -> Result<(), HandlerError> {
    tx.execute(
        "INSERT INTO customers (id, name) VALUES ($1, $2)
         ON CONFLICT (id) DO UPDATE SET name = excluded.name",
        &[
            &msg.key_str().unwrap_or(""),
            &msg.json()["name"].as_str().unwrap_or(""),
        ],
    )
    .await?;
    Ok(())
}

async fn delete(msg: &Delivered, tx: &tokio_postgres::Transaction<'_>) -> Result<(), HandlerError> {
    assert!(msg.tombstone && msg.body.is_null() && msg.payload.is_empty());
    tx.execute(
        "DELETE FROM customers WHERE id = $1",
        &[&msg.key_str().unwrap_or("")],
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tombstone_is_published_null_handled_as_a_delete_and_compaction_removes_the_key() {
    let db = fresh_db().await;
    let topic = format!("it.{}.customers", hex(8));
    // Compaction as soon as possible: tiny segments, no lag, tombstones kept 100 ms.
    let file = format!(
        "[[topic]]\nname = \"{topic}\"\npartitions = 1\nretry_delays = []\nconfig = {{ \"cleanup.policy\" = \"compact\", \"segment.ms\" = \"100\", \"min.cleanable.dirty.ratio\" = \"0.01\", \"delete.retention.ms\" = \"100\", \"min.compaction.lag.ms\" = \"0\" }}\n"
    );
    let applied = outbox::topics::apply(&kafka(), &outbox::topics::plan(&file).unwrap(), false)
        .await
        .unwrap();
    assert_eq!(applied.len(), 2);
    let mut c = client(&db).await;
    c.batch_execute("CREATE TABLE customers (id text PRIMARY KEY, name text NOT NULL)")
        .await
        .unwrap();

    let enq = Enqueuer::new(&db.schema);
    let tx = c.transaction().await.unwrap();
    let update = |k: &str, name: &str| {
        Message::new(
            &topic,
            "customer_updated",
            k,
            serde_json::json!({ "name": name }),
        )
    };
    let tomb = Message::tombstone(&topic, "c1");
    assert!(tomb.is_tombstone());
    enq.enqueue_batch(
        &tx,
        &[
            update("c1", "Ann"),
            update("c2", "Bob"),
            update("c1", "Ann B."),
        ],
    )
    .await
    .unwrap();
    enq.enqueue(&tx, &tomb).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        count(&c, "SELECT count(*) FROM outbox WHERE payload IS NULL").await,
        1,
        "the tombstone's row has no payload"
    );
    let relay = outbox::Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 4);
    let records = read_all(&topic).await;
    let last = records.last().unwrap();
    assert_eq!(last.key.as_deref(), Some(&b"c1"[..]));
    assert!(last.payload.is_empty(), "published with no value");
    assert_eq!(last.headers["message_type"], "tombstone");

    let consumer = Consumer::new(
        &db,
        &kafka(),
        ConsumerConfig::new(format!("it-{}", hex(6)), [&topic]),
    )
    .unwrap()
    .handler("customer_updated", upsert)
    .on_tombstone(delete);
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let h = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    wait_until(
        Duration::from_secs(30),
        "updates and the delete applied",
        || async { ConsumerStats::get(&stats.handled) == 4 },
    )
    .await;
    stop.send(()).unwrap();
    h.await.unwrap().unwrap();
    assert_eq!(ConsumerStats::get(&stats.tombstones_handled), 1);
    assert_eq!(ConsumerStats::get(&stats.dead_lettered), 0);
    assert_eq!(
        texts(&c, "SELECT id || '=' || name FROM customers ORDER BY id").await,
        ["c2=Bob"]
    );

    // The broker compacts: once a later record rolls the segment, c1 (its values and then its
    // tombstone) is gone; c2 stays.
    wait_until(Duration::from_secs(120), "c1 compacted away", || async {
        enq.enqueue(&c, &update("filler", "roll the segment"))
            .await
            .unwrap();
        drain(&relay).await;
        let now = read_all(&topic).await;
        !now.iter().any(|r| r.key.as_deref() == Some(&b"c1"[..]))
            && now.iter().any(|r| r.key.as_deref() == Some(&b"c2"[..]))
    })
    .await;
}
