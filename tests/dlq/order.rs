//! Something to compare for a handler that does not hold a key behind its dead letter: every
//! record the relay publishes carries the outbox row's id as `x-outbox-seq`, and
//! `Delivered::newer_than_applied` tells a handler whether a delivery is older than what it
//! applied for the entity. A replayed dead letter whose key was handled meanwhile is then
//! ignored; without the check it lands behind the newer events and overwrites their state.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox::consumer::{
    Consumer, ConsumerConfig, ConsumerStats, Delivered, HandlerError, RetryStrategy,
};
use outbox::dlq::{Archiver, Dlq, Filter, ReplayOptions};
use outbox::{Enqueuer, Message, Relay};
use outbox_testkit::*;
use tokio_util::sync::CancellationToken;

/// An account's balance events: each sets the balance its `seq` names. The first is refused
/// until `fixed` (a bug deployed, then fixed); a handler that `guards` asks whether the event
/// is newer than what it applied. What it applied goes to `applied`, in order.
fn balance_handler(
    group: &'static str,
    guards: bool,
    fixed: Arc<AtomicBool>,
) -> impl for<'a> Fn(
    &'a Delivered,
    &'a tokio_postgres::Transaction<'a>,
) -> outbox::consumer::BoxFuture<'a, Result<(), HandlerError>>
       + Send
       + Sync
       + 'static {
    move |m, tx| {
        let fixed = fixed.clone();
        Box::pin(async move {
            let seq = m.json()["seq"].as_i64().unwrap();
            if seq == 0 && !fixed.load(Ordering::SeqCst) {
                return Err(HandlerError::permanent("balance rule 3 rejects the event"));
            }
            if guards && !m.newer_than_applied(tx, group).await? {
                return Ok(());
            }
            tx.execute(
                "INSERT INTO applied (grp, seq, outbox_seq) VALUES ($1, $2, $3)",
                &[&group, &seq, &m.sequence()],
            )
            .await?;
            Ok(())
        })
    }
}

/// [`balance_handler`] on sqlx (always compares).
struct SqlxBalance(&'static str, Arc<AtomicBool>);

impl outbox::consumer::SqlxHandler for SqlxBalance {
    fn handle<'a>(
        &'a self,
        m: &'a Delivered,
        tx: &'a mut sqlx::PgConnection,
    ) -> outbox::consumer::BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let seq = m.json()["seq"].as_i64().unwrap();
            if seq == 0 && !self.1.load(Ordering::SeqCst) {
                return Err(HandlerError::permanent("balance rule 3 rejects the event"));
            }
            if !m.newer_than_applied_sqlx(&mut *tx, self.0).await? {
                return Ok(());
            }
            sqlx::query("INSERT INTO applied (grp, seq, outbox_seq) VALUES ($1, $2, $3)")
                .bind(self.0)
                .bind(seq)
                .bind(m.sequence())
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_letter_older_than_what_its_entity_shows_is_ignored_by_a_handler_that_compares()
{
    let db = fresh_db().await;
    let c = client(&db).await;
    c.batch_execute("CREATE TABLE applied (n serial, grp text, seq bigint, outbox_seq bigint)")
        .await
        .unwrap();
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let enq = Enqueuer::new(&db.schema);
    let mut ids = Vec::new();
    for seq in 0..3 {
        let m = Message::new(
            &topic,
            "balance_set",
            "acct-1",
            serde_json::json!({ "seq": seq }),
        );
        enq.enqueue(&c, &m).await.unwrap();
    }
    for r in c
        .query("SELECT id FROM outbox ORDER BY id", &[])
        .await
        .unwrap()
    {
        ids.push(r.get::<_, i64>(0));
    }
    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 3);
    // Every record names its outbox row's id.
    let recs = read_all(&topic).await;
    let seqs: Vec<i64> = recs
        .iter()
        .map(|r| r.headers["x-outbox-seq"].parse().unwrap())
        .collect();
    assert_eq!(
        seqs, ids,
        "x-outbox-seq is the row's id, in publication order"
    );

    // Two services: "ledger" compares, "report" does not. Both refuse event 0 at first.
    let fixed = Arc::new(AtomicBool::new(false));
    let stop = CancellationToken::new();
    let mut stats = Vec::new();
    for (group, guards) in [("ledger", true), ("report", false), ("ledger-sqlx", true)] {
        let mut cfg = ConsumerConfig::new(format!("{group}-{}", hex(4)), [&topic]);
        cfg.retry = RetryStrategy::InPlace {
            attempts: 1,
            base: Duration::from_millis(10),
            max: Duration::from_millis(10),
        };
        let s = stop.clone();
        let shutdown = async move { s.cancelled().await };
        if group == "ledger-sqlx" {
            let consumer = Consumer::sqlx(&db, &kafka(), cfg, sqlx_pool(&db, 2).await)
                .unwrap()
                .sqlx_handler("balance_set", SqlxBalance(group, fixed.clone()));
            stats.push(consumer.stats());
            tokio::spawn(consumer.run(shutdown));
        } else {
            let consumer = Consumer::new(&db, &kafka(), cfg)
                .unwrap()
                .handler("balance_set", balance_handler(group, guards, fixed.clone()));
            stats.push(consumer.stats());
            tokio::spawn(consumer.run(shutdown));
        }
    }
    wait_until(
        Duration::from_secs(30),
        "events 1 and 2 handled, event 0 dead-lettered, by each group",
        || async {
            stats.iter().all(|s| {
                ConsumerStats::get(&s.handled) == 2 && ConsumerStats::get(&s.dead_lettered) == 1
            })
        },
    )
    .await;

    // The fix is deployed; an operator replays the letters.
    fixed.store(true, Ordering::SeqCst);
    Archiver::new(&db, &kafka(), vec![format!("{topic}.dlq")])
        .unwrap()
        .group(&format!("it-arch-{}", hex(6)))
        .run_once(&mut |_, _| {})
        .await
        .unwrap();
    let dlq = Dlq::new(&db);
    let mut o = ReplayOptions::default();
    o.canary = 0;
    o.confirm_kinds = true;
    o.actor = "oncall".into();
    let f = Filter {
        topic: Some(topic.clone()),
        ..Filter::default()
    };
    // Every group handled newer events of the key after dead-lettering event 0: the replay
    // says so and asks to confirm (the groups that compare are safe either way).
    let dry = dlq.dry_run(&f, &o).await.unwrap();
    assert_eq!((dry.count, dry.passed_by_newer), (3, 3));
    let refused = dlq.create_job(&f, &o).await.unwrap_err().to_string();
    assert!(refused.contains("--confirm-order"), "{refused}");
    o.confirm_order = true;
    let job = dlq.create_job(&f, &o).await.unwrap();
    dlq.run_job(&kafka(), job.id, &CancellationToken::new(), &mut |_| {})
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(30),
        "the replay handled by both",
        || async { stats.iter().all(|s| ConsumerStats::get(&s.handled) == 3) },
    )
    .await;
    stop.cancel();

    let applied = |grp: &'static str| {
        let c = &c;
        async move {
            c.query("SELECT seq FROM applied WHERE grp = $1 ORDER BY n", &[&grp])
                .await
                .unwrap()
                .iter()
                .map(|r| r.get::<_, i64>(0))
                .collect::<Vec<_>>()
        }
    };
    // The replay came back after the newer events: the service that compares ignored it (the
    // balance stays the newest), the other applied the old balance over the new one.
    assert_eq!(applied("ledger").await, [1, 2]);
    assert_eq!(applied("ledger-sqlx").await, [1, 2], "the same on sqlx");
    assert_eq!(
        applied("report").await,
        [1, 2, 0],
        "the break the check prevents"
    );
    assert_eq!(
        count(
            &c,
            "SELECT seq FROM applied_sequences WHERE scope = 'ledger' AND entity_key = 'acct-1'"
        )
        .await,
        ids[2],
        "the newest applied sequence is the last event's"
    );
}
