//! Hostile input: every bad thing gets a clear error or a dead letter; nothing crashes, nothing
//! is lost. (Invalid topic/schema names, oversize rows, unknown topics, garbage relay headers,
//! bad configuration and wrong credentials are covered in relay.rs, cli.rs, consumer.rs and
//! security.rs; this file adds the rest.)

use std::process::{Command, Stdio};
use std::time::Duration;

use outbox::consumer::{
    BoxFuture, Consumer, ConsumerConfig, ConsumerStats, Delivered, Handler, HandlerError,
};
use outbox_testkit::*;

struct Record2;
impl Handler for Record2 {
    fn handle<'a>(
        &'a self,
        m: &'a Delivered,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            tx.execute(
                "INSERT INTO seen (message_id, key) VALUES ($1, $2)",
                &[&m.message_id, &m.key],
            )
            .await?;
            Ok(())
        })
    }
}

#[tokio::test]
async fn odd_headers_keys_and_bodies_are_handled_or_dead_lettered_never_crash() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let c = client(&db).await;
    c.batch_execute("CREATE TABLE seen (message_id text, key bytea)")
        .await
        .unwrap();
    let huge = vec![b'h'; 600 * 1024];
    // Handled: a 600 KiB unknown header, binary header values, an empty header name, a null
    // header, a non-UTF-8 key; unknown headers are ignored.
    {
        use rdkafka::message::{Header, OwnedHeaders};
        use rdkafka::producer::{FutureProducer, FutureRecord};
        let p: FutureProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("message.max.bytes", "1000000")
            .create()
            .unwrap();
        let h = OwnedHeaders::new()
            .insert(Header {
                key: "message_type",
                value: Some(b"it_event".as_slice()),
            })
            .insert(Header {
                key: "message_id",
                value: Some(b"odd-1".as_slice()),
            })
            .insert(Header {
                key: "x-huge",
                value: Some(huge.as_slice()),
            })
            .insert(Header {
                key: "x-binary",
                value: Some(b"\x00\xff\xfe".as_slice()),
            })
            .insert(Header {
                key: "",
                value: Some(b"empty name".as_slice()),
            })
            .insert(Header::<&[u8]> {
                key: "x-null",
                value: None,
            });
        p.send(
            FutureRecord::<[u8], [u8]>::to(&topic)
                .key(b"\xff\x00key".as_slice())
                .payload(b"{\"a\":1}".as_slice())
                .headers(h),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    }
    // Dead-lettered as decode errors: non-UTF-8 message_type, empty message_id, a JSON body
    // that is only a prefix (truncated), a 201-byte message_id. A tombstone (null body) with no
    // tombstone handler is skipped and counted, never dead-lettered.
    produce(
        &topic,
        Some(b"k1"),
        &[("message_type", b"\xff\xfe"), ("message_id", b"d1")],
        Some(b"{}"),
    )
    .await;
    produce(
        &topic,
        Some(b"k2"),
        &[("message_type", b"it_event"), ("message_id", b"")],
        Some(b"{}"),
    )
    .await;
    produce(
        &topic,
        Some(b"k3"),
        &[("message_type", b"it_event"), ("message_id", b"d3")],
        Some(b"{\"order\": {\"id\": 1"),
    )
    .await;
    produce(
        &topic,
        Some(b"k4"),
        &[("message_type", b"it_event"), ("message_id", &[b'x'; 201])],
        Some(b"{}"),
    )
    .await;
    produce(
        &topic,
        Some(b"k5"),
        &[("message_type", b"it_event"), ("message_id", b"d5")],
        None,
    )
    .await;
    produce_event(
        &topic,
        "k6",
        "it_event",
        "ok-after",
        &serde_json::json!({"fine": true}),
    )
    .await;

    // A consumer group name that looks like SQL is just a value.
    let group = format!("g'; DROP TABLE processed_messages; -- {}", hex(4));
    let consumer = Consumer::new(&db, &kafka(), ConsumerConfig::new(&group, [&topic]))
        .unwrap()
        .handler("it_event", Record2);
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let h = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    wait_until(Duration::from_secs(30), "all settled", || async {
        ConsumerStats::get(&stats.handled) == 2
            && ConsumerStats::get(&stats.dead_lettered) == 4
            && ConsumerStats::get(&stats.tombstones_skipped) == 1
    })
    .await;
    stop.send(()).unwrap();
    h.await.unwrap().unwrap();
    assert_eq!(ConsumerStats::get(&stats.decode_errors), 4);
    let key: Vec<u8> = c
        .query_one("SELECT key FROM seen WHERE message_id = 'odd-1'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(key, b"\xff\x00key", "binary key passed through");
    assert_eq!(
        count(
            &c,
            &format!(
                "SELECT count(*) FROM processed_messages WHERE consumer_group = '{}'",
                group.replace('\'', "''")
            )
        )
        .await,
        2
    );
    let dlq = read_all(&format!("{topic}.dlq")).await;
    assert_eq!(dlq.len(), 4);
    let errors: Vec<&str> = dlq.iter().map(|r| r.headers["x-error"].as_str()).collect();
    for expected in [
        "message_type header is empty or not UTF-8",
        "message_id header is empty",
        "not valid JSON",
        "longer than 200",
    ] {
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "{expected:?} not in {errors:?}"
        );
    }
    assert!(
        !dlq.iter().any(|r| r.key.as_deref() == Some(b"k5")),
        "a tombstone is never a dead letter"
    );
}

#[tokio::test]
async fn enqueue_refuses_what_postgres_cannot_store_and_writes_nothing() {
    let db = fresh_db().await;
    let mut c = client(&db).await;
    let enq = outbox::Enqueuer::new(&db.schema);
    let tx = c.transaction().await.unwrap();
    // jsonb cannot hold U+0000: a typed, permanent error, and the transaction is aborted.
    let e = enq
        .enqueue(
            &tx,
            &outbox::Message::new(
                "orders.created",
                "t",
                "k",
                serde_json::json!({"s": "nul\u{0}byte"}),
            ),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, outbox::EnqueueError::Postgres(_)), "{e}");
    assert!(!e.is_transient());
    tx.rollback().await.unwrap();
    assert_eq!(count(&c, "SELECT count(*) FROM outbox").await, 0);
}

fn run_cli(args: &[&str], envs: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Command::new(outbox_testkit::outbox_bin());
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .env_remove("KAFKA_BOOTSTRAP_SERVERS")
        .stdin(Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let o = cmd.output().unwrap();
    (
        o.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

#[test]
fn truncated_missing_and_contradictory_configuration_exit_2_with_a_message() {
    let url = database_url();
    // (arguments, environment, expected text in the error)
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (vec!["status"], vec![], "DATABASE_URL"), // missing entirely
        (
            vec!["status"],
            vec![("DATABASE_URL", "postgres://outbox:pw@")],
            "DATABASE_URL",
        ), // truncated: no host
        (
            vec!["status"],
            vec![("DATABASE_URL", "postgres://outbox:pw@127.0.0.1:54x")],
            "DATABASE_URL",
        ), // truncated port
        (
            vec!["status"],
            vec![("DATABASE_URL", "host=127.0.0.1 port=")],
            "DATABASE_URL",
        ), // truncated key=value
        (
            vec!["relay"],
            vec![("DATABASE_URL", &url)],
            "KAFKA_BOOTSTRAP_SERVERS",
        ), // missing Kafka
        (
            vec!["requeue", "--failed", "--id", "3"],
            vec![("DATABASE_URL", &url)],
            "cannot be used with",
        ),
        (
            vec!["cleanup", "--sent-retention", "banana"],
            vec![("DATABASE_URL", &url)],
            "invalid value",
        ),
        (
            vec!["relay", "--batch-size", "-5"],
            vec![
                ("DATABASE_URL", &url),
                ("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
            ],
            "unexpected argument",
        ),
        (
            vec!["relay", "--batch-size", "999999999"],
            vec![
                ("DATABASE_URL", &url),
                ("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
            ],
            "batch size",
        ),
        (
            vec!["relay"],
            vec![
                ("DATABASE_URL", &url),
                ("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092,"),
            ],
            "not host:port",
        ),
        (
            vec!["relay", "-X", "=x"],
            vec![
                ("DATABASE_URL", &url),
                ("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
            ],
            "empty name",
        ),
        (
            vec!["migrate", "--schema", ""],
            vec![("DATABASE_URL", &url)],
            "invalid schema name",
        ),
        (
            vec!["migrate", "--schema", "pg_catalog"],
            vec![("DATABASE_URL", &url)],
            "reserved",
        ),
    ];
    // Wrong credentials are a runtime failure (exit 1) with the server's reason.
    let (code, text) = run_cli(
        &["status"],
        &[(
            "DATABASE_URL",
            "postgres://outbox:wrong-pw@127.0.0.1:5432/outbox",
        )],
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("password authentication failed") && !text.contains("wrong-pw"),
        "{text}"
    );
    for (args, envs, expect) in cases {
        let (code, text) = run_cli(&args, &envs);
        assert_eq!(code, Some(2), "{args:?} {envs:?}: {text}");
        assert!(
            text.contains(expect),
            "{args:?}: expected {expect:?} in {text}"
        );
        assert!(!text.contains("panicked"), "{text}");
    }
}

#[tokio::test]
async fn a_consumer_with_a_misspelt_kafka_property_refuses_to_start_without_showing_its_value() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let mut k = kafka();
    k.set_from_pair("sasl.passwrd=S3cret-consumer-probe")
        .unwrap();
    let consumer = Consumer::new(
        &db,
        &k,
        ConsumerConfig::new(format!("g-{}", hex(6)), [&topic]),
    )
    .unwrap()
    .handler("t", Record2);
    let e = tokio::time::timeout(
        Duration::from_secs(30),
        consumer.run(std::future::pending()),
    )
    .await
    .expect("a refused property fails at start, not later")
    .unwrap_err()
    .to_string();
    assert!(e.contains("sasl.passwrd"), "{e}");
    assert!(!e.contains("S3cret-consumer-probe"), "{e}");
}
