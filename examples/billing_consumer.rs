//! A billing service that consumes `orders.created` (from `order_service`) and charges each
//! order exactly once, however often Kafka delivers it.
//!
//! ```sh
//! DATABASE_URL=postgres://outbox:outbox@127.0.0.1:5432/outbox \
//! KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 cargo run --example billing_consumer
//! ```
//!
//! At-least-once delivery means redeliveries after a crash or rebalance; the runtime records
//! each message's id in `processed_messages` in the same transaction as the charge, so a
//! redelivered order is skipped instead of charged twice. Offsets are committed only past
//! messages whose outcome is final, so a `kill -9` loses nothing either. The `charges` table
//! deliberately has no unique constraint: exactly-once here is the inbox's doing.
//!
//! Environment: `OUTBOX_SCHEMA` (default `public`), `BILLING_TOPIC` (`orders.created`),
//! `BILLING_GROUP` (`billing-service`), `BILLING_CONCURRENCY` (16), `BILLING_INSTANCE_ID`
//! (static group membership: unset by default), `OUTBOX_KAFKA_PROPERTIES` (`name=value;…`,
//! passed to librdkafka), `BILLING_TOPICS_FILE` (the topics file: where its `strict_order`
//! names the group, a customer's orders are charged in order — one that is dead-lettered
//! holds the customer's later orders until it is resolved), `BILLING_REFUNDS` (`1`: negative totals are refunds; without it they are
//! refused — the bug a later version fixes, after which the refused orders are replayed),
//! `BILLING_RETRY_TOPICS` (`1s,10s`: retry topics instead of in-place retries),
//! `BILLING_FLAKY` (`n`: the first n orders fail once, transiently), `BILLING_TRACE_PARENTING`
//! (`link` or `parent`), `BILLING_METRICS_ADDR` (`/metrics`, `/healthz`, `/readyz`), and the
//! standard `OTEL_*` variables (OTLP export of the spans).

use outbox::consumer::{Consumer, ConsumerConfig, Delivered, HandlerError};

/// Charges one order: validation failures are permanent (dead-lettered), database trouble is
/// classified by SQLSTATE (serialization failures and lost connections are retried).
/// A handler is a plain `async fn`.
async fn charge(msg: &Delivered, tx: &tokio_postgres::Transaction<'_>) -> Result<(), HandlerError> {
    charge_with(msg, tx, false).await
}

/// `BILLING_FLAKY=n`: the first `n` valid orders seen fail once with a transient error (a payment
/// provider's hiccup), to show a retry in the traces and the metrics.
static FLAKY: std::sync::Mutex<(usize, Vec<String>)> = std::sync::Mutex::new((0, Vec::new()));

fn hiccup(msg: &Delivered) -> Result<(), HandlerError> {
    let mut f = FLAKY.lock().expect("flaky lock");
    if f.1.len() < f.0 && !f.1.contains(&msg.message_id) {
        f.1.push(msg.message_id.clone());
        return Err(HandlerError::transient("payment provider hiccup"));
    }
    Ok(())
}

/// [`charge`] by a version that knows refunds (negative totals).
async fn charge_or_refund(
    msg: &Delivered,
    tx: &tokio_postgres::Transaction<'_>,
) -> Result<(), HandlerError> {
    charge_with(msg, tx, true).await
}

async fn charge_with(
    msg: &Delivered,
    tx: &tokio_postgres::Transaction<'_>,
    refunds: bool,
) -> Result<(), HandlerError> {
    {
        let body = msg.json();
        let order = body["order_number"]
            .as_str()
            .ok_or_else(|| HandlerError::permanent("order_number missing"))?;
        let cents = body["total_cents"]
            .as_i64()
            .ok_or_else(|| HandlerError::permanent("total_cents missing"))?;
        if cents == 0 || (cents < 0 && !refunds) {
            return Err(HandlerError::permanent(format!(
                "refusing to charge {cents} cents"
            )));
        }
        hiccup(msg)?;
        tx.execute(
            "INSERT INTO charges (order_number, amount_cents, message_id) VALUES ($1, $2, $3)",
            &[&order, &cents, &msg.message_id],
        )
        .await?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    // Spans over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT (or the other OTEL_* switches) say so.
    let otel = outbox_otlp::init("billing-service")?;
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
    let db = outbox::DbConfig::new(
        &std::env::var("DATABASE_URL")?,
        &env("OUTBOX_SCHEMA", "public"),
    )?;
    let mut kafka = outbox::KafkaConfig::new(&std::env::var("KAFKA_BOOTSTRAP_SERVERS")?)?;
    // Extra librdkafka properties, `name=value;name=value` (e.g. SASL settings).
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
             SELECT pg_advisory_xact_lock(hashtext('charges'));
             CREATE TABLE IF NOT EXISTS {}.charges (
                 id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                 order_number text   NOT NULL,
                 amount_cents bigint NOT NULL,
                 message_id   text   NOT NULL,
                 charged_at   timestamptz NOT NULL DEFAULT now());
             COMMIT;",
            db.schema.quoted()
        ))
        .await?;

    let mut config = ConsumerConfig::new(
        env("BILLING_GROUP", "billing-service"),
        [env("BILLING_TOPIC", "orders.created")],
    );
    config.concurrency = env("BILLING_CONCURRENCY", "16").parse()?;
    // Static membership: a restarted replica gets its partitions back at once (KIP-345).
    // Set it to something stable and unique per replica, e.g. a StatefulSet pod name.
    config.instance_id = std::env::var("BILLING_INSTANCE_ID")
        .ok()
        .filter(|s| !s.is_empty());
    // Strict order where the deployment's topics file says so (`strict_order =
    // ["billing-service"]` on a topic).
    let strict = match std::env::var("BILLING_TOPICS_FILE") {
        Ok(path) => {
            outbox::topics::strict_order_topics(&std::fs::read_to_string(path)?, &config.group)?
        }
        Err(_) => Vec::new(),
    };
    if !strict.is_empty() {
        config.strict_order = Some(outbox::consumer::StrictOrder::new(strict));
    }
    // `parent`: each delivery's span is a child of the order's `create` span, so one trace
    // holds the whole journey (the default links them instead).
    config.trace_parenting = env("BILLING_TRACE_PARENTING", "link").parse()?;
    // Non-blocking retries through retry topics, e.g. `1s,10s` (created by `outbox topics
    // apply`); in-place retries without it.
    let delays = env("BILLING_RETRY_TOPICS", "");
    if !delays.trim().is_empty() {
        config.retry = outbox::consumer::RetryStrategy::Topics {
            delays: delays
                .split(',')
                .map(|d| humantime::parse_duration(d.trim()))
                .collect::<Result<_, _>>()?,
        };
    }
    FLAKY.lock().expect("flaky lock").0 = env("BILLING_FLAKY", "0").parse()?;
    // `/metrics`, and the probes `/healthz` (the poll loop turns) and `/readyz` (Postgres and
    // Kafka answer, not shutting down), e.g. `0.0.0.0:9188` for a Kubernetes pod.
    config.metrics_addr = std::env::var("BILLING_METRICS_ADDR")
        .ok()
        .filter(|s| !s.is_empty())
        .map(|a| a.parse())
        .transpose()?;
    let consumer = Consumer::new(&db, &kafka, config)?;
    let consumer = if env("BILLING_REFUNDS", "") == "1" {
        consumer.handler("order_created", charge_or_refund)
    } else {
        consumer.handler("order_created", charge)
    };
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
    otel.shutdown();
    Ok(())
}

/// The service's own tests, with `outbox-testkit`: the handler through the consumer's real
/// path (inbox, classification, dead letter) on a fresh schema, no broker needed.
/// `cargo test --example billing_consumer` (Postgres from `DATABASE_URL`).
#[cfg(test)]
mod tests {
    use super::charge;
    use outbox::consumer::{Consumer, ConsumerConfig, Delivered};
    use outbox::wire::DeadLetterKind;
    use outbox::Message;
    use outbox_testkit::{client, count, fresh_db, kafka, Verdict};

    fn order(body: serde_json::Value) -> Delivered {
        Delivered::from_message(&Message::new(
            "orders.created",
            "order_created",
            "A-1",
            body,
        ))
    }

    #[tokio::test]
    async fn an_order_is_charged_once_and_a_bad_total_is_dead_lettered() {
        let db = fresh_db().await;
        let c = client(&db).await;
        c.batch_execute(
            "CREATE TABLE charges (order_number text, amount_cents bigint, message_id text)",
        )
        .await
        .unwrap();
        let billing = Consumer::new(
            &db,
            &kafka(),
            ConsumerConfig::new("billing", ["orders.created"]),
        )
        .unwrap()
        .handler("order_created", charge)
        .harness()
        .await
        .unwrap();

        let good = order(serde_json::json!({"order_number": "A-1", "total_cents": 1500}));
        assert_eq!(
            billing.deliver(good.clone()).await,
            Verdict::Handled { attempts: 1 }
        );
        // Kafka redelivers it (a crash, a rebalance): not charged twice.
        assert_eq!(billing.deliver(good).await, Verdict::Duplicate);
        assert_eq!(count(&c, "SELECT count(*) FROM charges").await, 1);

        for (body, reason) in [
            (
                serde_json::json!({"order_number": "A-2", "total_cents": -5}),
                "refusing to charge -5 cents",
            ),
            (
                serde_json::json!({"order_number": "A-3", "total": "12.50"}),
                "total_cents missing",
            ),
        ] {
            match billing.deliver(order(body)).await {
                Verdict::DeadLettered {
                    kind,
                    error,
                    record,
                    ..
                } => {
                    assert_eq!(kind, DeadLetterKind::Permanent);
                    assert_eq!(error, reason);
                    assert_eq!(record.topic, "orders.created.dlq");
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            count(&c, "SELECT count(*) FROM charges").await,
            1,
            "nothing charged for them"
        );
    }
}
