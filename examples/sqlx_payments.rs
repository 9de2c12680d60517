//! A payments service written entirely with sqlx: it consumes `orders.created`, charges each
//! order exactly once, and announces the charge as `payment_captured` — the charge row, its
//! inbox mark and its outbox event in ONE sqlx transaction from the service's own `PgPool`.
//!
//! ```sh
//! DATABASE_URL=postgres://outbox:outbox@127.0.0.1:5432/outbox \
//! KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 cargo run --features sqlx --example sqlx_payments
//! ```
//!
//! No tokio-postgres code here: the consumer is built with `Consumer::sqlx(.., pool)`, the handler is an
//! `async fn(&Delivered, &mut PgConnection)`, and the event goes out through
//! `outbox::sqlx::enqueue`. A redelivered order (after a crash or a rebalance) finds its mark
//! and is skipped; an order without a positive total is dead-lettered as permanent.
//!
//! Environment: `OUTBOX_SCHEMA` (default `public`), `PAYMENTS_TOPIC` (`orders.created`),
//! `PAYMENTS_OUT_TOPIC` (`payments.captured`), `PAYMENTS_GROUP` (`payments-service`),
//! `PAYMENTS_CONCURRENCY` (16).

use std::str::FromStr as _;

use outbox::consumer::{Consumer, ConsumerConfig, Delivered, HandlerError};
use outbox::Message;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgConnection;

/// Where the `payment_captured` events go.
fn out_topic() -> String {
    std::env::var("PAYMENTS_OUT_TOPIC").unwrap_or_else(|_| "payments.captured".into())
}

/// Charges one order and enqueues its `payment_captured` event, in the message's transaction.
async fn charge(msg: &Delivered, tx: &mut PgConnection) -> Result<(), HandlerError> {
    let body = msg.json();
    let order = body["order_number"]
        .as_str()
        .ok_or_else(|| HandlerError::permanent("order_number missing"))?;
    let cents = body["total_cents"]
        .as_i64()
        .ok_or_else(|| HandlerError::permanent("total_cents missing"))?;
    if cents <= 0 {
        return Err(HandlerError::permanent(format!(
            "refusing to charge {cents} cents"
        )));
    }
    sqlx::query("INSERT INTO charges (order_number, amount_cents, message_id) VALUES ($1, $2, $3)")
        .bind(order)
        .bind(cents)
        .bind(&msg.message_id)
        .execute(&mut *tx)
        .await?;
    let event = Message::new(
        out_topic(),
        "payment_captured",
        order,
        serde_json::json!({"order_number": order, "amount_cents": cents}),
    );
    // A database error is classified like the handler's own; an invalid event is permanent.
    outbox::sqlx::enqueue(&mut *tx, &event).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
    let url = std::env::var("DATABASE_URL")?;
    let schema = env("OUTBOX_SCHEMA", "public");
    let concurrency: usize = env("PAYMENTS_CONCURRENCY", "16").parse()?;

    // The service's own pool; its search_path finds the outbox tables and `charges`.
    let pool = PgPoolOptions::new()
        .max_connections(concurrency as u32 + 2)
        .connect_with(
            PgConnectOptions::from_str(&url)?
                .options([("search_path", format!("{schema},public"))]),
        )
        .await?;
    let mut setup = pool.begin().await?;
    // Replicas start together: `CREATE TABLE IF NOT EXISTS` alone is not safe against a
    // concurrent one, so take a lock first.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('charges'))")
        .execute(&mut *setup)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS charges (
             id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             order_number text   NOT NULL,
             amount_cents bigint NOT NULL,
             message_id   text   NOT NULL,
             charged_at   timestamptz NOT NULL DEFAULT now())",
    )
    .execute(&mut *setup)
    .await?;
    setup.commit().await?;

    // The runtime's own bookkeeping (dead-letter records, heartbeats) uses the same database.
    let db = outbox::DbConfig::new(&url, &schema)?;
    let kafka = outbox::KafkaConfig::new(&std::env::var("KAFKA_BOOTSTRAP_SERVERS")?)?;
    let mut config = ConsumerConfig::new(
        env("PAYMENTS_GROUP", "payments-service"),
        [env("PAYMENTS_TOPIC", "orders.created")],
    );
    config.concurrency = concurrency;
    let consumer = Consumer::sqlx(&db, &kafka, config, pool)?.sqlx_handler("order_created", charge);
    let stats = consumer.stats();
    consumer
        .run(async {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        })
        .await?;
    eprintln!(
        "handled={} duplicates={} dead_lettered={}",
        outbox::consumer::ConsumerStats::get(&stats.handled),
        outbox::consumer::ConsumerStats::get(&stats.duplicates),
        outbox::consumer::ConsumerStats::get(&stats.dead_lettered)
    );
    Ok(())
}
