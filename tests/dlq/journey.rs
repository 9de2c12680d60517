//! One message's journey, across relay, two consumer groups, the DLQ, a replay and a drop:
//! `outbox trace`, as an operator would use it, by message id, key and business id.

use std::time::Duration;

use outbox::consumer::{
    Consumer, ConsumerConfig, ConsumerStats, Delivered, HandlerError, RetryStrategy,
};
use outbox::dlq::{Archiver, Dlq, Filter, ReplayOptions};
use outbox::{Enqueuer, Message, Relay};
use outbox_testkit::*;
use tokio_util::sync::CancellationToken;

async fn billed(_m: &Delivered, _tx: &tokio_postgres::Transaction<'_>) -> Result<(), HandlerError> {
    Ok(())
}

async fn broken(_m: &Delivered, _tx: &tokio_postgres::Transaction<'_>) -> Result<(), HandlerError> {
    Err(HandlerError::permanent("loyalty rule 7 rejects the order"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_shows_outbox_row_each_groups_outcome_the_replay_its_comeback_and_the_drop() {
    let db = fresh_db().await;
    let c = client(&db).await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let msg = Message::new(
        &topic,
        "order_created",
        "customer-77",
        serde_json::json!({ "order": { "number": "A-1024", "total_cents": 1500 } }),
    );
    let id = msg.message_id().to_string();
    Enqueuer::new(&db.schema).enqueue(&c, &msg).await.unwrap();
    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 1);

    // Two services read the topic: billing handles it, loyalty refuses it.
    let stop = CancellationToken::new();
    let mut stats = Vec::new();
    for (group, ok) in [("billing", true), ("loyalty", false)] {
        let mut cfg = ConsumerConfig::new(format!("{group}-{}", hex(4)), [&topic]);
        cfg.retry = RetryStrategy::InPlace {
            attempts: 1,
            base: Duration::from_millis(10),
            max: Duration::from_millis(10),
        };
        let consumer = Consumer::new(&db, &kafka(), cfg).unwrap();
        let consumer = if ok {
            consumer.handler("order_created", billed)
        } else {
            consumer.handler("order_created", broken)
        };
        stats.push(consumer.stats());
        let s = stop.clone();
        tokio::spawn(async move { consumer.run(async move { s.cancelled().await }).await });
    }
    wait_until(
        Duration::from_secs(30),
        "billed once, dead-lettered once",
        || async {
            ConsumerStats::get(&stats[0].handled) == 1
                && ConsumerStats::get(&stats[1].dead_lettered) == 1
        },
    )
    .await;
    let archiver = Archiver::new(&db, &kafka(), vec![format!("{topic}.dlq")])
        .unwrap()
        .group(&format!("it-arch-{}", hex(6)));
    archiver.run_once(&mut |_, _| {}).await.unwrap();

    // Replayed before the loyalty fix: it comes back, then an operator drops it.
    let dlq = Dlq::new(&db);
    let f = Filter {
        topic: Some(topic.clone()),
        ..Filter::default()
    };
    let mut o = ReplayOptions::default();
    o.canary = 0;
    o.confirm_kinds = true;
    o.actor = "oncall".into();
    let job = dlq.create_job(&f, &o).await.unwrap();
    dlq.run_job(&kafka(), job.id, &CancellationToken::new(), &mut |_| {})
        .await
        .unwrap();
    wait_until(Duration::from_secs(30), "dead-lettered again", || async {
        ConsumerStats::get(&stats[1].dead_lettered) == 2
    })
    .await;
    archiver.run_once(&mut |_, _| {}).await.unwrap();
    assert_eq!(
        dlq.job(job.id).await.unwrap().came_back,
        1,
        "the comeback is matched"
    );
    let f = Filter {
        topic: Some(topic.clone()),
        status: Some(outbox::dlq::Status::New),
        ..Filter::default()
    };
    dlq.drop_letters(&f, false, "loyalty rule 7 is right: no points", "oncall")
        .await
        .unwrap();
    stop.cancel();

    // By message id, by key, by the order number inside the body: the same one journey.
    for q in [id.as_str(), "customer-77", "A-1024"] {
        let o = outbox_command(&db).args(["trace", q]).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{q}: {out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(
            out.matches("message ").count(),
            1,
            "{q}: one message\n{out}"
        );
        for want in [
            format!("message {id}"),
            format!("sent     {topic} key=customer-77 type=order_created attempts=0"),
            "handled  by billing-".to_owned(),
            "(permanent)".to_owned(),
            "loyalty rule 7 rejects the order".to_owned(),
            format!("replay   job {} (completed, by oncall)", job.id),
            "— came back as #".to_owned(),
            format!("came back from job {}", job.id),
            "drop by oncall via outbox".to_owned(),
        ] {
            assert!(out.contains(&want), "{q}: {want:?} missing:\n{out}");
        }
    }
    let o = outbox_command(&db)
        .args(["trace", "no-such-thing"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("nothing found"));
    let j = outbox::journey::trace(&db, &id).await.unwrap();
    assert_eq!(j.len(), 1);
    let j = &j[0];
    assert_eq!(
        (
            j.outbox.len(),
            j.handled.len(),
            j.dead_letters.len(),
            j.replays.len()
        ),
        (1, 1, 2, 1)
    );
    assert_eq!(j.dead_letters[0].original.0, topic, "where it failed");
    assert!(
        j.dead_letters[0].original.2.is_some(),
        "its offset is known"
    );
}
