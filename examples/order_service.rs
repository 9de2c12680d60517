//! A domain service that writes an order and its `orders.created` event in ONE transaction.
//!
//! Run it after `outbox migrate` (the demo, `dev/demo.sh`, does all of it):
//!
//! ```sh
//! DATABASE_URL=postgres://outbox:outbox@127.0.0.1:5432/outbox cargo run --example order_service -- 5
//! ```
//!
//! The order row and the outbox row commit together: if anything fails before `commit`, neither
//! exists and no event is ever published. After `commit`, `outbox relay` publishes the event —
//! even if this process dies the next instant. Every fifth order here is deliberately rolled
//! back to show that a rolled-back order announces nothing.
//!
//! Each order carries a W3C `traceparent` header (a fresh trace per order here; a real service
//! passes its current request's trace), which the consumer's handler span takes as its parent.
//! Environment: `OUTBOX_SCHEMA` (default `public`), `ORDER_TOPIC` (`orders.created`),
//! `ORDER_POISON` (0): that many more orders whose event carries its total as text
//! (`"total": "12.50"`, an old producer's format) — what a consumer rejects as permanent and
//! dead-letters (the demo shows them arriving in the DLQ and grouped by cause).

use opentelemetry::context::FutureExt as _;
use opentelemetry::trace::TraceContextExt as _;
use outbox::{Enqueuer, Message, Schema};

/// Writes the order and its `order_created` event in the caller's transaction; returns the
/// event (its `message_id` is what consumers dedupe on).
async fn place_order(
    tx: &tokio_postgres::Transaction<'_>,
    outbox: &Enqueuer,
    topic: &str,
    number: &str,
    customer: &str,
    total_cents: i64,
    traceparent: Option<&str>,
) -> Result<Message, Box<dyn std::error::Error>> {
    tx.execute(
        "INSERT INTO orders (order_number, customer, total_cents) VALUES ($1, $2, $3)",
        &[&number, &customer, &total_cents],
    )
    .await?;
    let event = Message::new(
        topic,
        "order_created",
        number, // the entity id: the Kafka key, so one order's events stay in order
        serde_json::json!({ "order_number": number, "customer": customer, "total_cents": total_cents }),
    );
    // A caller's own trace context is kept byte for byte; without one, `enqueue` opens its
    // `create` span (when a tracer provider is installed) and records that context.
    let event = match traceparent {
        Some(tp) => event.with_header("traceparent", tp),
        None => event,
    };
    outbox.enqueue(tx, &event).await?;
    Ok(event)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // With OTEL_EXPORTER_OTLP_ENDPOINT set, each order is a real request span, exported with
    // the `create` span under it; otherwise a made-up traceparent stands for the request's.
    let otel = outbox_otlp::init("order-service")?;
    let count: usize = std::env::args().nth(1).map_or(Ok(5), |s| s.parse())?;
    let url = std::env::var("DATABASE_URL")?;
    let schema = std::env::var("OUTBOX_SCHEMA").unwrap_or_else(|_| "public".into());
    let db = outbox::DbConfig::new(&url, &schema)?;
    let mut client = outbox::connect(&db).await?;
    let outbox = Enqueuer::new(&Schema::new(&schema)?);
    let topic = std::env::var("ORDER_TOPIC").unwrap_or_else(|_| "orders.created".into());

    client
        // Several instances may start together: `CREATE TABLE IF NOT EXISTS` alone is not safe
        // against a concurrent one (it can fail on the catalog's unique index).
        .batch_execute(
            "BEGIN;
             SELECT pg_advisory_xact_lock(hashtext('orders'));
             CREATE TABLE IF NOT EXISTS orders (
                 order_number text PRIMARY KEY,
                 customer     text NOT NULL,
                 total_cents  bigint NOT NULL,
                 created_at   timestamptz NOT NULL DEFAULT now());
             COMMIT;",
        )
        .await?;

    let run = uuid::Uuid::now_v7().simple().to_string();
    for i in 1..=count {
        let number = format!("A-{}-{i}", &run[20..]);
        let customer = format!("customer-{}", i % 3);
        let total_cents = 1000 + 250 * i as i64;

        let (request, traceparent) = request_context(otel.is_exporting());
        let tx = client.transaction().await?;
        let event = place_order(
            &tx,
            &outbox,
            &topic,
            &number,
            &customer,
            total_cents,
            traceparent.as_deref(),
        )
        .with_context(request.clone())
        .await?;
        request.span().end();
        let traceparent = traceparent.unwrap_or_else(|| "(from the create span)".into());

        if i % 5 == 0 {
            tx.rollback().await?;
            println!("rolled back {number} (no order row, no event)");
        } else {
            tx.commit().await?;
            println!(
                "created {number}  message_id={}  traceparent={traceparent}",
                event.message_id()
            );
        }
    }
    // Poison: events an old version of this service would have written (a total as text).
    let poison: usize = std::env::var("ORDER_POISON").map_or(Ok(0), |s| s.parse())?;
    for i in 1..=poison {
        let number = format!("P-{}-{i}", &run[20..]);
        let (request, _) = request_context(otel.is_exporting());
        let tx = client.transaction().await?;
        tx.execute(
            "INSERT INTO orders (order_number, customer, total_cents) VALUES ($1, 'customer-old', 0)",
            &[&number],
        )
        .await?;
        let event = Message::new(
            &topic,
            "order_created",
            &number,
            serde_json::json!({ "order_number": number, "customer": "customer-old", "total": "12.50" }),
        );
        outbox
            .enqueue(&tx, &event)
            .with_context(request.clone())
            .await?;
        tx.commit().await?;
        request.span().end();
        println!(
            "created {number}  (poison: total as text)  message_id={}",
            event.message_id()
        );
    }
    otel.shutdown();
    Ok(())
}

/// One order's request: with export on, a span of this service (the ambient context of the
/// `create` span); otherwise no context and a made-up `traceparent`.
fn request_context(exporting: bool) -> (opentelemetry::Context, Option<String>) {
    use opentelemetry::trace::Tracer as _;
    if exporting {
        let span = opentelemetry::global::tracer("order-service").start("place order");
        return (opentelemetry::Context::current_with_span(span), None);
    }
    let trace = uuid::Uuid::now_v7().simple().to_string();
    let span = &uuid::Uuid::now_v7().simple().to_string()[16..];
    (
        opentelemetry::Context::new(),
        Some(format!("00-{trace}-{span}-01")),
    )
}

/// The service's own tests, with `outbox-testkit`: "placing an order writes its
/// `order_created` event in the same transaction", and the relay publishes it.
/// `cargo test --example order_service` (Postgres and Kafka from `DATABASE_URL`,
/// `KAFKA_BOOTSTRAP_SERVERS`).
#[cfg(test)]
mod tests {
    use super::place_order;
    use outbox::Enqueuer;
    use outbox_testkit::{
        client, create_topic, enqueued, fresh_db, kafka, only, relay_once, topic_name,
    };

    #[tokio::test]
    async fn an_order_and_its_event_commit_together_and_the_relay_publishes_it() {
        let db = fresh_db().await;
        let topic = topic_name();
        create_topic(&topic, 3).await;
        let mut c = client(&db).await;
        c.batch_execute(
            "CREATE TABLE orders (order_number text PRIMARY KEY, customer text, total_cents bigint)",
        )
        .await
        .unwrap();
        let outbox = Enqueuer::new(&db.schema);
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

        // Rolled back: neither the order nor its event.
        let tx = c.transaction().await.unwrap();
        place_order(&tx, &outbox, &topic, "A-0", "c-1", 900, Some(tp))
            .await
            .unwrap();
        assert_eq!(
            enqueued(&tx, &db.schema).await.len(),
            1,
            "visible inside its transaction"
        );
        tx.rollback().await.unwrap();
        assert!(enqueued(&c, &db.schema).await.is_empty());

        let tx = c.transaction().await.unwrap();
        let event = place_order(&tx, &outbox, &topic, "A-1", "c-1", 1500, Some(tp))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let rows = enqueued(&c, &db.schema).await;
        let row = only(&rows, &topic, "order_created");
        assert_eq!(row.key.as_deref(), Some("A-1"));
        assert_eq!(row.body.as_ref().unwrap()["total_cents"], 1500);
        assert_eq!(row.headers["traceparent"], tp);

        let sent = relay_once(&db, &kafka()).await;
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].message_id(), event.message_id().to_string());
        assert_eq!(sent[0].key.as_deref(), Some(&b"A-1"[..]));
    }
}
