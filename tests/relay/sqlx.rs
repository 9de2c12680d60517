//! Enqueue through sqlx (`outbox::sqlx`): the same validation and typed errors as the
//! tokio-postgres path, the same rows, published by the relay; and the `Inbox` on sqlx.

use outbox::{EnqueueError, Enqueuer, Message, Relay};
use outbox_testkit::*;

/// Committed through an sqlx transaction: published once with key, headers and body; rolled
/// back: nothing; a batch keeps its order; an invalid message is refused before any SQL.
#[tokio::test]
async fn sqlx_enqueue_publishes_what_commits_and_refuses_what_is_invalid() {
    sqlx_enqueue_on(false).await;
}

/// The same on ring storage: sqlx's INSERTs go through the view's rule onto the ring.
#[tokio::test]
async fn sqlx_enqueue_on_ring_storage_publishes_what_commits() {
    sqlx_enqueue_on(true).await;
}

async fn sqlx_enqueue_on(ring: bool) {
    let db = fresh_db().await;
    if ring {
        outbox::storage::use_ring(&db, outbox::storage::MoveOptions::default())
            .await
            .unwrap();
    }
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let pool = sqlx_pool(&db, 2).await;

    let one = Message::new(
        &topic,
        "order_created",
        "A-1",
        serde_json::json!({"total": 1}),
    )
    .with_header(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    );
    let mut tx = pool.begin().await.unwrap();
    outbox::sqlx::enqueue(&mut *tx, &one).await.unwrap();
    // Inside the transaction, before commit, the kit sees what it enqueued.
    let rows = enqueued_sqlx(&mut *tx, &db.schema).await;
    let row = only(&rows, &topic, "order_created");
    assert_eq!(
        (row.key.as_deref(), row.body.clone()),
        (Some("A-1"), Some(serde_json::json!({"total": 1})))
    );
    assert_eq!(row.message_id(), one.message_id().to_string());
    tx.commit().await.unwrap();

    let mut tx = pool.begin().await.unwrap();
    let ghost = Message::new(&topic, "order_created", "A-ghost", serde_json::json!({}));
    outbox::sqlx::enqueue(&mut *tx, &ghost).await.unwrap();
    tx.rollback().await.unwrap();

    let batch: Vec<Message> = (2..5)
        .map(|i| {
            Message::new(
                &topic,
                "order_created",
                format!("A-{i}"),
                serde_json::json!({"total": i}),
            )
        })
        .collect();
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        outbox::sqlx::enqueue_batch(&mut *tx, &batch).await.unwrap(),
        3
    );
    // Straight into a connection of the pool (no transaction of the caller's).
    let keyless = Message::keyless(&topic, "order_created", serde_json::json!({"total": 5}));
    outbox::sqlx::enqueue(&pool, &keyless).await.unwrap();
    tx.commit().await.unwrap();

    // Invalid: refused with the same typed errors, nothing written, the transaction usable.
    let mut tx = pool.begin().await.unwrap();
    let bad_topic = Message::new("bad topic!", "order_created", "A-9", serde_json::json!({}));
    assert!(matches!(
        outbox::sqlx::enqueue(&mut *tx, &bad_topic).await,
        Err(EnqueueError::InvalidTopic(_))
    ));
    let reserved =
        Message::new(&topic, "t", "A-9", serde_json::json!({})).with_header("message_id", "x");
    assert!(matches!(
        outbox::sqlx::enqueue_batch(&mut *tx, &[batch[0].clone(), reserved]).await,
        Err(EnqueueError::ReservedHeader(_))
    ));
    let empty_type = Message::new(&topic, "", "A-9", serde_json::json!({}));
    assert!(matches!(
        outbox::sqlx::enqueue(&mut *tx, &empty_type).await,
        Err(EnqueueError::EmptyMessageType)
    ));
    tx.commit().await.unwrap();

    let relay = Relay::new(&db, &kafka(), relay_config()).unwrap();
    assert_eq!(drain(&relay).await, 5);
    let recs = read_all(&topic).await;
    let keys: Vec<Option<String>> = recs
        .iter()
        .map(|r| {
            r.key
                .as_ref()
                .map(|k| String::from_utf8(k.clone()).unwrap())
        })
        .collect();
    assert_eq!(
        keys,
        [Some("A-1"), Some("A-2"), Some("A-3"), Some("A-4"), None].map(|k| k.map(str::to_owned))
    );
    assert_eq!(recs[0].headers["message_id"], one.message_id().to_string());
    assert_eq!(recs[0].headers["entity_id"], "A-1");
    assert!(recs[0].headers["traceparent"].starts_with("00-4bf9"));
    assert_eq!(recs[2].json(), serde_json::json!({"total": 3}));
    if ring {
        // Written to the ring's leaves, not to a table named `outbox`.
        let c = client(&db).await;
        assert_eq!(
            count(&c, "SELECT count(*) FROM outbox_ring").await,
            5,
            "the ring holds the committed rows"
        );
    }
}

/// A database error is `EnqueueError::Sqlx`, classified like a tokio-postgres one: a missing
/// table is permanent; an `Enqueuer` for a schema writes there whatever the search_path.
#[tokio::test]
async fn sqlx_enqueue_errors_are_typed_and_an_enqueuer_names_its_schema() {
    let db = fresh_db().await;
    let topic = topic_name();
    let url = database_url();
    // A pool whose search_path has no outbox table.
    let bare = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap();
    sqlx::query("SET search_path TO pg_catalog")
        .execute(&bare)
        .await
        .unwrap();
    let mut conn = bare.acquire().await.unwrap();
    sqlx::query("SET search_path TO pg_catalog")
        .execute(&mut *conn)
        .await
        .unwrap();
    let msg = Message::new(&topic, "order_created", "A-1", serde_json::json!({}));
    let err = outbox::sqlx::enqueue(&mut *conn, &msg).await.unwrap_err();
    assert!(matches!(err, EnqueueError::Sqlx(_)), "{err}");
    assert!(
        !err.is_transient(),
        "an undefined table is not worth retrying: {err}"
    );
    assert!(err.to_string().contains("outbox"), "{err}");

    let enq = Enqueuer::new(&db.schema);
    enq.enqueue_sqlx(&mut *conn, &msg).await.unwrap();
    enq.enqueue_batch_sqlx(&mut *conn, std::slice::from_ref(&msg))
        .await
        .unwrap();
    let c = client(&db).await;
    assert_eq!(count(&c, "SELECT count(*) FROM outbox").await, 2);
}

/// The inbox on sqlx: the first mark is a first delivery, the repeat a duplicate, and a
/// rolled-back mark leaves with its work.
#[tokio::test]
async fn the_inbox_on_sqlx_marks_once_and_a_rollback_takes_the_mark_back() {
    let db = fresh_db().await;
    let pool = sqlx_pool(&db, 2).await;
    let inbox = outbox::consumer::Inbox::new(&db.schema, "billing");
    let mut tx = pool.begin().await.unwrap();
    assert!(inbox
        .mark_sqlx(&mut tx, "orders", "m-rolled")
        .await
        .unwrap());
    tx.rollback().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(
        inbox
            .mark_sqlx(&mut tx, "orders", "m-rolled")
            .await
            .unwrap(),
        "rolled back: new again"
    );
    assert!(
        !inbox
            .mark_sqlx(&mut tx, "orders", "m-rolled")
            .await
            .unwrap(),
        "now a duplicate"
    );
    let fresh = inbox
        .mark_many_sqlx(
            &mut tx,
            &[("orders", "m-rolled"), ("orders", "m-2"), ("orders", "m-2")],
        )
        .await
        .unwrap();
    assert_eq!(
        fresh,
        [("orders".to_owned(), "m-2".to_owned())]
            .into_iter()
            .collect()
    );
    tx.commit().await.unwrap();
    let c = client(&db).await;
    assert_eq!(
        count(&c, "SELECT count(*) FROM processed_messages").await,
        2
    );
}
