//! The handler harness (`Consumer::harness`): a consumer's handlers run through the runtime's
//! real path — inbox, classification, in-place retries, the retry-topic chain, dead letters,
//! the breaker, call handlers, the sqlx driver — against real Postgres and no broker.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox::consumer::{
    BoxFuture, BreakerConfig, CallHandler, Consumer, ConsumerConfig, Delivered, HandlerError,
    RetryStrategy,
};
use outbox::wire::DeadLetterKind;
use outbox::Message;
use outbox_testkit::*;

fn order(topic: &str, body: serde_json::Value) -> Delivered {
    Delivered::from_message(&Message::new(topic, "order_created", "A-1", body))
}

/// Writes a row per success; the body decides failures.
async fn handler(
    msg: &Delivered,
    tx: &tokio_postgres::Transaction<'_>,
) -> Result<(), HandlerError> {
    let b = msg.json();
    if b["panic"] == true {
        panic!("boom");
    }
    if b["timeout"] == true {
        return Err(HandlerError::transient("gateway timed out"));
    }
    if b["down"] == true {
        return Err(HandlerError::unavailable(
            "loyalty-api",
            "connection refused",
        ));
    }
    tx.execute(
        "INSERT INTO effects (message_id) VALUES ($1)",
        &[&msg.message_id],
    )
    .await?;
    Ok(())
}

async fn setup() -> (outbox::DbConfig, tokio_postgres::Client) {
    let db = fresh_db().await;
    let c = client(&db).await;
    c.batch_execute("CREATE TABLE effects (message_id text NOT NULL)")
        .await
        .unwrap();
    (db, c)
}

/// The retry-topic chain played hop by hop: each hop's record names its origin, the last
/// one is dead-lettered as exhausted; a record that does not decode is a decode letter; a
/// panic and an unknown type are what a running consumer makes of them.
#[tokio::test]
async fn the_retry_chain_decode_panic_and_skip_outcomes_are_the_runtimes() {
    let (db, c) = setup().await;
    let topic = "orders.created";
    let mut config = ConsumerConfig::new("billing", [topic]);
    config.retry = RetryStrategy::Topics {
        delays: vec![Duration::from_secs(5), Duration::from_secs(30)],
    };
    let h = Consumer::new(&db, &kafka(), config)
        .unwrap()
        .handler("order_created", handler)
        .harness()
        .await
        .unwrap();
    let first = order(topic, serde_json::json!({"timeout": true}));
    let Verdict::Retried { record: hop1 } = h.deliver(first.clone()).await else {
        panic!("a transient failure goes to the first retry topic");
    };
    assert!(
        hop1.topic.starts_with("orders.created.billing.retry"),
        "{}",
        hop1.topic
    );
    assert_eq!(hop1.header("x-retry-attempt"), Some("1"));
    assert_eq!(hop1.header("x-original-topic"), Some(topic));
    assert_eq!(hop1.header("message_id"), Some(first.message_id.as_str()));
    let Verdict::Retried { record: hop2 } = h.redeliver(&hop1).await else {
        panic!("the second hop");
    };
    assert_ne!(hop2.topic, hop1.topic);
    assert_eq!(hop2.header("x-retry-attempt"), Some("2"));
    match h.redeliver(&hop2).await {
        Verdict::DeadLettered {
            kind,
            error,
            record,
            ..
        } => {
            assert_eq!(kind, DeadLetterKind::TransientExhausted);
            assert!(error.contains("gateway timed out"), "{error}");
            assert_eq!(record.topic, "orders.created.dlq");
            assert_eq!(record.payload, hop1.payload, "the body byte-identical");
        }
        other => panic!("{other:?}"),
    }
    // A record without a message id: a decode letter, no handler call.
    let mut garbage = hop1.clone();
    garbage.headers.retain(|(k, _)| k != "message_id");
    match h.redeliver(&garbage).await {
        Verdict::DeadLettered {
            kind,
            error,
            attempts,
            ..
        } => {
            assert_eq!(kind, DeadLetterKind::Decode);
            assert!(error.contains("message_id"), "{error}");
            assert_eq!(attempts, 0);
        }
        other => panic!("{other:?}"),
    }
    match h
        .deliver(order(topic, serde_json::json!({"panic": true})))
        .await
    {
        Verdict::DeadLettered { kind, error, .. } => {
            assert_eq!(kind, DeadLetterKind::Panic);
            assert!(error.contains("boom"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    let unknown = Delivered::from_message(&Message::new(
        topic,
        "order_shipped",
        "A-1",
        serde_json::json!({}),
    ));
    assert_eq!(h.deliver(unknown).await, Verdict::Skipped);
    let good = order(topic, serde_json::json!({}));
    assert_eq!(
        h.deliver(good.clone()).await,
        Verdict::Handled { attempts: 1 }
    );
    assert_eq!(h.deliver(good).await, Verdict::Duplicate);
    assert_eq!(count(&c, "SELECT count(*) FROM effects").await, 1);
    assert_eq!(h.written().len(), 5, "two hops and three letters, in order");
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM processed_messages WHERE consumer_group = 'billing'"
        )
        .await,
        1
    );
}

/// A dependency outage with a breaker: the quick retries are spent, the group's breaker
/// opens (its row in Postgres) and the message is parked as `unavailable`.
#[tokio::test]
async fn an_outage_opens_the_breaker_and_parks_the_message() {
    let (db, c) = setup().await;
    let mut config = ConsumerConfig::new("loyalty", ["orders.created"]);
    let mut b = BreakerConfig::default();
    b.attempts = 2;
    b.retry_delay = Duration::from_millis(5);
    config.breaker = Some(b);
    let h = Consumer::new(&db, &kafka(), config)
        .unwrap()
        .handler("order_created", handler)
        .harness()
        .await
        .unwrap();
    match h
        .deliver(order("orders.created", serde_json::json!({"down": true})))
        .await
    {
        Verdict::DeadLettered {
            kind,
            attempts,
            error,
            ..
        } => {
            assert_eq!(kind, DeadLetterKind::Unavailable);
            assert_eq!(attempts, 2);
            assert!(error.contains("loyalty-api"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        count(&c, "SELECT count(*) FROM circuit_breakers WHERE consumer_group = 'loyalty' AND name = 'loyalty-api' AND open_until > now()").await,
        1,
        "the shared breaker's row"
    );
}

/// In-place retries count their attempts; a call handler's call is not repeated for a
/// duplicate; an sqlx handler runs through the same path.
#[tokio::test]
async fn in_place_retries_call_handlers_and_the_sqlx_driver() {
    let (db, c) = setup().await;
    let tries = Arc::new(AtomicU32::new(0));
    struct Flaky(Arc<AtomicU32>);
    impl CallHandler for Flaky {
        type Reply = String;
        fn call<'a>(&'a self, _: &'a Delivered) -> BoxFuture<'a, Result<String, HandlerError>> {
            Box::pin(async move {
                if self.0.fetch_add(1, Ordering::SeqCst) < 2 {
                    return Err(HandlerError::transient("503"));
                }
                Ok("receipt-7".into())
            })
        }
        fn record<'a>(
            &'a self,
            msg: &'a Delivered,
            reply: &'a String,
            tx: &'a tokio_postgres::Transaction<'a>,
        ) -> BoxFuture<'a, Result<(), HandlerError>> {
            Box::pin(async move {
                tx.execute(
                    "INSERT INTO effects (message_id) VALUES ($1)",
                    &[&format!("{}:{reply}", msg.message_id)],
                )
                .await?;
                Ok(())
            })
        }
    }
    let mut config = ConsumerConfig::new("notify", ["orders.created"]);
    config.retry = RetryStrategy::InPlace {
        attempts: 5,
        base: Duration::from_millis(1),
        max: Duration::from_millis(5),
    };
    let h = Consumer::new(&db, &kafka(), config.clone())
        .unwrap()
        .call_handler("order_created", Flaky(tries.clone()))
        .harness()
        .await
        .unwrap();
    let m = order("orders.created", serde_json::json!({}));
    assert_eq!(h.deliver(m.clone()).await, Verdict::Handled { attempts: 3 });
    assert_eq!(h.deliver(m.clone()).await, Verdict::Duplicate);
    assert_eq!(tries.load(Ordering::SeqCst), 3, "no call for the duplicate");
    assert_eq!(
        texts(&c, "SELECT message_id FROM effects").await,
        [format!("{}:receipt-7", m.message_id)]
    );

    async fn sqlx_charge(msg: &Delivered, tx: &mut sqlx::PgConnection) -> Result<(), HandlerError> {
        if msg.json()["total_cents"].as_i64().unwrap_or(0) <= 0 {
            return Err(HandlerError::permanent("refusing to charge"));
        }
        sqlx::query("INSERT INTO effects (message_id) VALUES ($1)")
            .bind(&msg.message_id)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
    let config = ConsumerConfig::new("billing-sqlx", ["orders.created"]);
    async fn sqlx_forget(msg: &Delivered, tx: &mut sqlx::PgConnection) -> Result<(), HandlerError> {
        assert!(msg.tombstone);
        sqlx::query("INSERT INTO effects (message_id) VALUES ('forgotten ' || $1)")
            .bind(msg.key_str().unwrap_or_default())
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
    let h = Consumer::sqlx(&db, &kafka(), config, sqlx_pool(&db, 2).await)
        .unwrap()
        .sqlx_handler("order_created", sqlx_charge)
        .on_tombstone_sqlx(sqlx_forget)
        .harness()
        .await
        .unwrap();
    let gone = Delivered::from_message(&Message::tombstone("orders.created", "A-9"));
    assert_eq!(h.deliver(gone).await, Verdict::Handled { attempts: 1 });
    let good = order("orders.created", serde_json::json!({"total_cents": 5}));
    assert_eq!(
        h.deliver(good.clone()).await,
        Verdict::Handled { attempts: 1 }
    );
    assert_eq!(h.deliver(good).await, Verdict::Duplicate);
    assert!(matches!(
        h.deliver(order(
            "orders.created",
            serde_json::json!({"total_cents": -1})
        ))
        .await,
        Verdict::DeadLettered {
            kind: DeadLetterKind::Permanent,
            ..
        }
    ));
    assert_eq!(count(&c, "SELECT count(*) FROM effects").await, 3);
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM effects WHERE message_id = 'forgotten A-9'"
        )
        .await,
        1
    );
}

/// Registers `tenant` in `control`'s registry: `schema`'s outbox, in the database named
/// `database`.
async fn register(
    control: &outbox::DbConfig,
    tenant: &str,
    schema: &outbox::DbConfig,
    database: &str,
) {
    let mut t = outbox::fleet::Tenant::new(tenant, schema.schema.clone()).unwrap();
    t.database = database.into();
    outbox::fleet::put_tenant(control, &t).await.unwrap();
}

/// A `kind` message of `topic` naming `tenant` in `x-tenant`.
fn of_tenant(topic: &str, kind: &str, tenant: &str) -> Delivered {
    let mut d = Delivered::from_message(&Message::new(topic, kind, "A-1", serde_json::json!({})));
    d.headers
        .push(("x-tenant".into(), Some(tenant.as_bytes().to_vec())));
    d
}

/// Tenant routing (`ConsumerConfig::tenants`) as a stranger would probe it: an `x-tenant`
/// that is no tenant name (empty, a path, a control character, 100,000 bytes), one nobody
/// registered, and one whose database this consumer was not given are dead-lettered saying
/// why (a long value shown cut), never a panic; a tenant whose database is down (a closed
/// loopback port) fails that message transiently, for its retry; a registered one is handled
/// in its schema. `default` as a database name and tenant routing on the sqlx driver are
/// refused at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_routing_refuses_what_it_cannot_route_and_handles_the_rest_in_their_schema() {
    use outbox::consumer::TenantRouting;
    let (db, _c) = setup().await;
    let acme = fresh_db().await;
    client(&acme)
        .await
        .batch_execute("CREATE TABLE seen (id text PRIMARY KEY)")
        .await
        .unwrap();
    register(&db, "acme", &acme, "default").await;
    register(&db, "far", &acme, "shard9").await;
    register(&db, "down", &acme, "closed").await;

    async fn seen(
        msg: &Delivered,
        tx: &tokio_postgres::Transaction<'_>,
    ) -> Result<(), HandlerError> {
        tx.execute("INSERT INTO seen VALUES ($1)", &[&msg.message_id])
            .await?;
        Ok(())
    }
    let topic = "orders.created";
    let mut config = ConsumerConfig::new("billing", [topic]);
    config.retry = RetryStrategy::Topics {
        delays: vec![Duration::from_secs(5)],
    };
    let mut routing = TenantRouting::default();
    let closed = format!(
        "postgres://outbox:outbox@127.0.0.1:{}/outbox?connect_timeout=2",
        free_port()
    );
    routing.databases.insert(
        "closed".into(),
        outbox::DbConfig::new(&closed, "public").unwrap(),
    );
    config.tenants = Some(routing.clone());
    let h = Consumer::new(&db, &kafka(), config.clone())
        .unwrap()
        .handler("order_created", seen)
        .harness()
        .await
        .unwrap();
    let with_tenant = |t: &str| of_tenant(topic, "order_created", t);
    let long = "t".repeat(100_000);
    for (tenant, says) in [
        ("", "is not a tenant name"),
        ("../etc", "is not a tenant name"),
        ("a\u{7}b", "is not a tenant name"),
        (long.as_str(), "is not a tenant name"),
        ("ghost", "tenant ghost is not in the registry"),
        (
            "far",
            "its database shard9 is not configured on this consumer",
        ),
    ] {
        match h.deliver(with_tenant(tenant)).await {
            Verdict::DeadLettered { kind, error, .. } => {
                assert_eq!(kind, DeadLetterKind::Permanent, "{error}");
                assert!(error.contains(says), "{error}");
                assert!(error.len() < 1_000, "{} bytes of error", error.len());
            }
            other => panic!("{:?}: {other:?}", &tenant[..tenant.len().min(20)]),
        }
    }
    match h.deliver(with_tenant("down")).await {
        Verdict::Retried { record } => {
            let e = record.header("x-error").unwrap_or_default();
            assert!(e.contains("tenant down: database closed"), "{e}");
            assert!(!e.contains("outbox:outbox@"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let ok = with_tenant("acme");
    assert!(matches!(
        h.deliver(ok.clone()).await,
        Verdict::Handled { .. }
    ));
    assert!(matches!(h.deliver(ok.clone()).await, Verdict::Duplicate));
    assert_eq!(
        texts(&client(&acme).await, "SELECT id FROM seen").await,
        std::slice::from_ref(&ok.message_id)
    );

    let mut bad = routing.clone();
    bad.databases.insert(
        "default".into(),
        outbox::DbConfig::new(&closed, "public").unwrap(),
    );
    config.tenants = Some(bad);
    let refused = Consumer::new(&db, &kafka(), config.clone())
        .unwrap()
        .handler("order_created", seen)
        .harness()
        .await;
    assert!(refused.is_err_and(|e| e.to_string().contains("\"default\" is the consumer's own")),);
    // An sqlx consumer names its databases' sqlx pools, not tokio-postgres connections.
    config.tenants = Some(routing);
    async fn seen_sqlx(msg: &Delivered, tx: &mut sqlx::PgConnection) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO seen VALUES ($1)")
            .bind(&msg.message_id)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
    let refused = Consumer::sqlx(&db, &kafka(), config, sqlx_pool(&db, 2).await)
        .unwrap()
        .sqlx_handler("order_created", seen_sqlx)
        .harness()
        .await;
    assert!(
        refused.is_err_and(|e| e.to_string().contains("TenantRouting::sqlx_databases")),
        "sqlx with tokio-postgres databases"
    );
}

/// Tenant routing on sqlx (`TenantRouting::sqlx_databases`): a tenant of the consumer's own
/// database is handled through the consumer's sqlx pool, one of a named database through the
/// pool the service gave for it, each in its schema (`search_path`) with the mark in its own
/// inbox — an in-transaction handler and a call handler (whose check for an earlier answer
/// reads the tenant's inbox) alike; a tenant whose database has no pool here is
/// dead-lettered saying why, one whose database is down (a closed loopback port) is retried
/// without the URL's password in the reason; `default` among the sqlx pools, and sqlx pools
/// on a tokio-postgres consumer, are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_routing_on_sqlx_uses_the_services_pool_of_each_database() {
    use outbox::consumer::{BoxFuture, SqlxCallHandler, TenantRouting};
    use std::str::FromStr as _;
    let (db, _c) = setup().await;
    let (acme, umbrella) = (fresh_db().await, fresh_db().await);
    for t in [&acme, &umbrella] {
        client(t)
            .await
            .batch_execute("CREATE TABLE seen (id text, pool text, how text)")
            .await
            .unwrap();
    }
    register(&db, "acme", &acme, "default").await;
    register(&db, "umbrella", &umbrella, "shard2").await;
    register(&db, "far", &umbrella, "shard9").await;
    register(&db, "down", &umbrella, "closed").await;
    // The named database's pool: the same server here, told apart by its application_name.
    let pool_named = |name: &'static str| async move {
        let opts = sqlx::postgres::PgConnectOptions::from_str(&database_url())
            .unwrap()
            .application_name(name);
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect_with(opts)
            .await
            .unwrap()
    };
    async fn in_tx(msg: &Delivered, tx: &mut sqlx::PgConnection) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO seen VALUES ($1, current_setting('application_name'), 'tx')")
            .bind(&msg.message_id)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
    struct Call(Arc<AtomicU32>);
    impl SqlxCallHandler for Call {
        type Reply = ();
        fn call<'a>(&'a self, _: &'a Delivered) -> BoxFuture<'a, Result<(), HandlerError>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(()) })
        }
        fn record<'a>(
            &'a self,
            msg: &'a Delivered,
            _: &'a (),
            tx: &'a mut sqlx::PgConnection,
        ) -> BoxFuture<'a, Result<(), HandlerError>> {
            Box::pin(async move {
                sqlx::query(
                    "INSERT INTO seen VALUES ($1, current_setting('application_name'), 'call')",
                )
                .bind(&msg.message_id)
                .execute(&mut *tx)
                .await?;
                Ok(())
            })
        }
    }
    let topic = "orders.created";
    let mut config = ConsumerConfig::new("billing-sqlx-tenants", [topic]);
    let own = pool_named("own-pool").await;
    config.retry = RetryStrategy::Topics {
        delays: vec![Duration::from_secs(5)],
    };
    let mut routing = TenantRouting::default();
    routing
        .sqlx_databases
        .insert("shard2".into(), pool_named("shard2-pool").await);
    // A database on a closed loopback port, its URL with a password.
    let closed = sqlx::postgres::PgConnectOptions::from_str(&format!(
        "postgres://outbox:outbox@127.0.0.1:{}/outbox",
        free_port()
    ))
    .unwrap();
    routing.sqlx_databases.insert(
        "closed".into(),
        sqlx::postgres::PgPoolOptions::new()
            .acquire_timeout(Duration::from_secs(2))
            .connect_lazy_with(closed),
    );
    config.tenants = Some(routing.clone());
    let calls = Arc::new(AtomicU32::new(0));
    let h = Consumer::sqlx(&db, &kafka(), config.clone(), own.clone())
        .unwrap()
        .sqlx_handler("order_created", in_tx)
        .sqlx_call_handler("points_due", Call(calls.clone()))
        .harness()
        .await
        .unwrap();
    let with_tenant = |kind: &str, t: &str| of_tenant(topic, kind, t);
    let mut want = std::collections::BTreeMap::<&str, Vec<String>>::new();
    for (tenant, pool) in [("acme", "own-pool"), ("umbrella", "shard2-pool")] {
        for kind in ["order_created", "points_due"] {
            let d = with_tenant(kind, tenant);
            assert!(
                matches!(h.deliver(d.clone()).await, Verdict::Handled { .. }),
                "{tenant} {kind}"
            );
            assert!(
                matches!(h.deliver(d.clone()).await, Verdict::Duplicate),
                "{tenant} {kind}"
            );
            let how = if kind == "order_created" {
                "tx"
            } else {
                "call"
            };
            want.entry(tenant)
                .or_default()
                .push(format!("{} {pool} {how}", d.message_id));
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2, "no call for a duplicate");
    for (tenant, t) in [("acme", &acme), ("umbrella", &umbrella)] {
        let c = client(t).await;
        let mut got = texts(&c, "SELECT id || ' ' || pool || ' ' || how FROM seen").await;
        got.sort();
        let mut w = want[tenant].clone();
        w.sort();
        assert_eq!(
            got, w,
            "{tenant}: handled in its schema through its database's pool"
        );
        assert_eq!(
            count(
                &c,
                "SELECT count(*) FROM processed_messages WHERE consumer_group = 'billing-sqlx-tenants'"
            )
            .await,
            2,
            "{tenant}'s marks in its own inbox"
        );
    }
    match h.deliver(with_tenant("order_created", "far")).await {
        Verdict::DeadLettered { kind, error, .. } => {
            assert_eq!(kind, DeadLetterKind::Permanent, "{error}");
            assert!(
                error.contains("its database shard9 is not configured"),
                "{error}"
            );
        }
        other => panic!("{other:?}"),
    }

    // A tenant whose database is down: this message's transient failure, without the URL.
    match h.deliver(with_tenant("order_created", "down")).await {
        Verdict::Retried { record } => {
            let e = record.header("x-error").unwrap_or_default();
            assert!(e.contains("tenant down: database closed"), "{e}");
            assert!(!e.contains("outbox:outbox@"), "{e}");
        }
        other => panic!("{other:?}"),
    }

    // `default` is the consumer's own pool, not one of the named.
    let mut bad = routing.clone();
    bad.sqlx_databases
        .insert("default".into(), pool_named("other").await);
    let mut with_default = config.clone();
    with_default.tenants = Some(bad);
    let refused = Consumer::sqlx(&db, &kafka(), with_default, own)
        .unwrap()
        .sqlx_handler("order_created", in_tx)
        .harness()
        .await;
    assert!(
        refused.is_err_and(|e| e.to_string().contains("\"default\" is the consumer's own")),
        "default among the sqlx databases"
    );

    // sqlx pools on a tokio-postgres consumer: refused at start.
    let refused = Consumer::new(&db, &kafka(), config)
        .unwrap()
        .handler("order_created", handler)
        .harness()
        .await;
    assert!(
        refused.is_err_and(|e| e
            .to_string()
            .contains("sqlx_databases is for a consumer on sqlx")),
        "tokio-postgres with sqlx pools"
    );
}
