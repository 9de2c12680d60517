//! A service that tells a loyalty API about every order, and survives that API going down.
//!
//! It consumes `orders.created` (from `order_service`) and POSTs each order to
//! `LOYALTY_URL` (`/points`) with a `CallHandler`: the call runs outside any database
//! transaction (a slow API holds no Postgres session), a message already processed is never
//! called again, and after the API answered one short transaction records the points together
//! with the inbox mark. The `Idempotency-Key: <message_id>` header lets the API dedupe the one
//! call that can repeat: after a crash between its answer and our commit.
//!
//! When the API is down (connection refused, timeout, 502/503/504), the breaker named
//! `loyalty-api` — shared by every replica of the group through Postgres — opens: all
//! replicas pause `orders.created`, failing orders are parked in `orders.created.dlq`; when
//! the breaker closes the replicas drain the parked orders first (throttled, the main topic
//! still paused), checking each against the `orders` table (an order that no longer exists
//! is dropped as obsolete), then resume.
//!
//! ```sh
//! DATABASE_URL=postgres://outbox:outbox@127.0.0.1:5432/outbox \
//! KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 LOYALTY_URL=http://127.0.0.1:8099 \
//! cargo run --example loyalty_notifier
//! ```
//!
//! Environment: `OUTBOX_SCHEMA` (`public`), `LOYALTY_TOPIC` (`orders.created`),
//! `LOYALTY_GROUP` (`loyalty-notifier`), `LOYALTY_URL`, `LOYALTY_TIMEOUT_MS` (2000),
//! `LOYALTY_CONCURRENCY` (64: calls in flight; at 100 ms per call ≈ 600 orders/s, with two
//! Postgres sessions for the marks),
//! `BREAKER_OPEN_FOR_MS` (30000), `BREAKER_CHECK_MS` (1000), `DRAIN_RATE` (10),
//! `MAX_DLQ_RETRIES` (5), `DLQ_DEADLINE_SECS` (86400), `OUTBOX_KAFKA_PROPERTIES`
//! (`name=value;…`).

use std::sync::Arc;
use std::time::Duration;

use outbox::consumer::{
    BoxFuture, BreakerConfig, CallHandler, Consumer, ConsumerConfig, Delivered, Freshness,
    FreshnessCheck, HandlerError,
};

struct App {
    http: reqwest::Client,
    url: String,
}

/// The handler holds the HTTP client (state: a struct implementing `CallHandler`; a stateless
/// in-transaction handler can be a plain `async fn`, as in `billing_consumer`).
struct Notify(Arc<App>);

impl CallHandler for Notify {
    /// The points the API granted.
    type Reply = i64;

    fn call<'a>(&'a self, msg: &'a Delivered) -> BoxFuture<'a, Result<i64, HandlerError>> {
        Box::pin(notify(&self.0, msg))
    }

    fn record<'a>(
        &'a self,
        msg: &'a Delivered,
        points: &'a i64,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let order = msg.json()["order_number"].as_str().unwrap_or_default();
            tx.execute(
                "INSERT INTO loyalty_points (order_number, points, message_id) VALUES ($1, $2, $3)",
                &[&order, points, &msg.message_id],
            )
            .await?;
            Ok(())
        })
    }
}

/// The freshness check: is the order still in the `orders` table of `order_service`?
struct OrderExists(tokio_postgres::Client);

impl FreshnessCheck for OrderExists {
    fn check<'a>(&'a self, msg: &'a Delivered) -> BoxFuture<'a, Freshness> {
        Box::pin(async move {
            let number = msg.json()["order_number"].as_str().unwrap_or_default();
            match self
                .0
                .query_opt("SELECT 1 FROM orders WHERE order_number = $1", &[&number])
                .await
            {
                Ok(Some(_)) => Freshness::Match,
                Ok(None) => Freshness::Mismatch,
                Err(e) => Freshness::QueryFailed(e.to_string()),
            }
        })
    }
}

/// POSTs one order, outside any transaction; returns the points granted.
async fn notify(app: &App, msg: &Delivered) -> Result<i64, HandlerError> {
    let order = msg.json()["order_number"]
        .as_str()
        .ok_or_else(|| HandlerError::permanent("order_number missing"))?;
    let cents = msg.json()["total_cents"].as_i64().unwrap_or(0);
    let res = app
        .http
        .post(format!("{}/points", app.url))
        .header("Idempotency-Key", msg.idempotency_key())
        .json(&serde_json::json!({ "order": order, "key": msg.key_str(), "points": cents / 100 }))
        .send()
        .await
        // Refused, reset or timed out: the API is unavailable, not the order's fault.
        .map_err(|e| HandlerError::unavailable("loyalty-api", e))?;
    let status = res.status().as_u16();
    if !res.status().is_success() {
        // 502/503/504 become `unavailable` for loyalty-api; 4xx are permanent.
        return Err(
            HandlerError::from_http_status(status, "loyalty API refused").on("loyalty-api"),
        );
    }
    Ok(cents / 100)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
    let ms = |k: &str, d: &str| -> Result<Duration, std::num::ParseIntError> {
        Ok(Duration::from_millis(env(k, d).parse()?))
    };
    let db = outbox::DbConfig::new(
        &std::env::var("DATABASE_URL")?,
        &env("OUTBOX_SCHEMA", "public"),
    )?;
    let mut kafka = outbox::KafkaConfig::new(&std::env::var("KAFKA_BOOTSTRAP_SERVERS")?)?;
    for pair in env("OUTBOX_KAFKA_PROPERTIES", "")
        .split(';')
        .filter(|p| !p.trim().is_empty())
    {
        kafka.set_from_pair(pair.trim())?;
    }
    let client = outbox::connect(&db).await?;
    client
        // Replicas start together: `CREATE TABLE IF NOT EXISTS` alone is not safe against a
        // concurrent one (it can fail on the catalog's unique index), so take a lock first.
        .batch_execute(&format!(
            "BEGIN;
             SELECT pg_advisory_xact_lock(hashtext('loyalty_points'));
             CREATE TABLE IF NOT EXISTS {}.loyalty_points (
                 id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                 order_number text   NOT NULL,
                 points       bigint NOT NULL,
                 message_id   text   NOT NULL,
                 granted_at   timestamptz NOT NULL DEFAULT now());
             COMMIT;",
            db.schema.quoted()
        ))
        .await?;

    let app = Arc::new(App {
        http: reqwest::Client::builder()
            .timeout(ms("LOYALTY_TIMEOUT_MS", "2000")?)
            .build()?,
        url: std::env::var("LOYALTY_URL")?,
    });
    let mut config = ConsumerConfig::new(
        env("LOYALTY_GROUP", "loyalty-notifier"),
        [env("LOYALTY_TOPIC", "orders.created")],
    );
    config.concurrency = env("LOYALTY_CONCURRENCY", "64").parse()?;
    config.breaker = Some({
        let mut c = BreakerConfig::default();
        c.open_for = ms("BREAKER_OPEN_FOR_MS", "30000")?;
        c.check_interval = ms("BREAKER_CHECK_MS", "1000")?;
        c.drain_rate = env("DRAIN_RATE", "10").parse()?;
        c.max_dlq_retries = env("MAX_DLQ_RETRIES", "5").parse()?;
        c.deadline = Duration::from_secs(env("DLQ_DEADLINE_SECS", "86400").parse()?);
        // What the handler names in `HandlerError::unavailable`: operators see it in the
        // dashboard's "Open a breaker…".
        c.dependencies = vec!["loyalty-api".into()];
        c
    });
    let consumer = Consumer::new(&db, &kafka, config)?
        .call_handler("order_created", Notify(app))
        .freshness(OrderExists({
            let c = outbox::connect(&db).await?;
            // Like the handlers' connections: the service's schema first.
            c.batch_execute(&format!(
                "SET search_path TO {}, public",
                db.schema.quoted()
            ))
            .await?;
            c
        }));
    let state = consumer.state();
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
    let s = state.get();
    eprintln!(
        "handled={} parked={} drained={} dropped={} reparked={}",
        outbox::consumer::ConsumerStats::get(&stats.handled),
        s.parked,
        s.drained,
        s.dropped,
        s.reparked
    );
    Ok(())
}
