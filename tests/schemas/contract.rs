//! The contract in the write transaction, the relay's encoding and the consumer's decoding,
//! for each format, through the real registry.

use std::time::Duration;

use outbox::schemas::{Format, RegistryClient, SchemaError};
use outbox::{EnqueueError, Enqueuer, Message};
use serde_json::json;

use super::*;

pub(crate) const AVRO: &str = r#"{"type": "record", "name": "OrderCreated", "namespace": "com.acme",
  "fields": [{"name": "order_id", "type": "string"}, {"name": "total_cents", "type": "long"},
             {"name": "note", "type": ["null", "string"], "default": null}]}"#;
pub(crate) const PROTO: &str = r#"syntax = "proto3";
package acme;
message OrderCreated { string order_id = 1; int64 total_cents = 2; string note = 3; }
"#;
pub(crate) const JSON_SCHEMA: &str = r#"{"title": "OrderCreated", "type": "object",
  "required": ["order_id", "total_cents"],
  "properties": {"order_id": {"type": "string"}, "total_cents": {"type": "integer", "minimum": 0},
                 "note": {"type": "string"}},
  "additionalProperties": false}"#;

/// One format end to end: a broken payload refused by `enqueue` with nothing written (the
/// transaction goes on and commits the good one), the relay's record framed with the
/// registered id, our consumer handing the JSON view and the id to its handler, and a
/// consumer without the registry dead-lettering the framed record as a decode failure.
async fn end_to_end(format: Format, schema: &str) {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    create_topic(&format!("{topic}.dlq"), 1).await;
    let url = registry_url();
    let id = RegistryClient::new(&url)
        .unwrap()
        .register(&format!("{topic}-value"), format, schema)
        .await
        .unwrap();
    let schemas = schemas_for(&url, &[(topic.as_str(), format)]);

    let mut c = client(&db).await;
    let enq = Enqueuer::new(&db.schema).with_schemas(schemas.clone());
    let tx = c.transaction().await.unwrap();
    let good = Message::new(
        &topic,
        "order_created",
        "A-1",
        json!({"order_id": "A-1", "total_cents": 1500, "note": "hi"}),
    );
    enq.enqueue(&tx, &good).await.unwrap();
    let bad = Message::new(
        &topic,
        "order_created",
        "A-2",
        json!({"order_id": "A-2", "total_cents": "lots"}),
    );
    match enq.enqueue(&tx, &bad).await {
        Err(EnqueueError::Schema(SchemaError::Invalid(why))) => {
            assert!(why.contains("total_cents"), "{format:?}: {why}")
        }
        other => panic!("{format:?}: a broken contract must be refused, got {other:?}"),
    }
    // Refused before any SQL: the transaction is intact, holding the good row only.
    let rows = tx
        .query_one(
            &format!("SELECT count(*) FROM {}.outbox", db.schema.quoted()),
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(rows, 1, "{format:?}");
    tx.commit().await.unwrap();

    let mut cfg = relay_config();
    cfg.schemas = Some(schemas.clone());
    let relay = outbox::Relay::new(&db, &kafka(), cfg).unwrap();
    assert_eq!(drain(&relay).await, 1);

    let records = read_all(&topic).await;
    assert_eq!(records.len(), 1);
    let payload = &records[0].payload;
    assert_eq!(payload[0], 0, "{format:?}: magic byte");
    assert_eq!(
        u32::from_be_bytes(payload[1..5].try_into().unwrap()),
        id,
        "{format:?}: schema id"
    );
    let decoded = schemas.decode(payload).await.unwrap();
    assert_eq!(decoded.json["order_id"], "A-1");
    assert_eq!(decoded.json["total_cents"], 1500);

    let (seen, stats, stop, h) = run_consumer(&db, &topic, "order_created", Some(schemas.clone()));
    handled(&stats, 1).await;
    stop.send(()).unwrap();
    h.await.unwrap().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, good.message_id().to_string());
    assert_eq!(seen[0].1["order_id"], "A-1", "{format:?}: {:?}", seen[0].1);
    assert_eq!(seen[0].1["total_cents"], 1500);
    assert_eq!(seen[0].2, Some(id));

    // A consumer without the registry cannot read the framed record: a decode dead letter.
    let letters = undecodable(&db, &topic, None, 1).await;
    assert!(
        letters[0].headers["x-error"].contains("no schema registry"),
        "{:?}",
        letters[0].headers
    );
    assert_eq!(
        &letters[0].payload, payload,
        "the letter's body is the framed original"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_end_to_end() {
    end_to_end(Format::Avro, AVRO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_end_to_end() {
    end_to_end(Format::Protobuf, PROTO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_end_to_end() {
    end_to_end(Format::JsonSchema, JSON_SCHEMA).await;
}

/// A row written by a service that did not check (or before the schema changed) no longer
/// matches at relay time: it fails at once with the reason, nothing reaches the topic; once
/// the schema accepts it (a compatible new version), a requeue publishes it under the new id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_that_breaks_its_schema_fails_with_the_reason_and_goes_after_the_fix() {
    breaks_its_schema(false).await;
}

/// The same on ring storage: the refused row is copied into the retry table as `failed`, and
/// the requeue sends it from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_ring_storage_a_row_that_breaks_its_schema_fails_and_goes_after_the_fix() {
    breaks_its_schema(true).await;
}

async fn breaks_its_schema(ring: bool) {
    let db = fresh_db().await;
    if ring {
        outbox::storage::use_ring(&db, outbox::storage::MoveOptions::default())
            .await
            .unwrap();
    }
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let url = registry_url();
    let registry = RegistryClient::new(&url).unwrap();
    let subject = format!("{topic}-value");
    let v1 = registry
        .register(&subject, Format::Avro, AVRO)
        .await
        .unwrap();
    let mut config = outbox::schemas::SchemaConfig::from_topics_toml(&url, "").unwrap();
    config.topics.insert(
        topic.clone(),
        outbox::schemas::TopicSchema {
            format: Format::Avro,
            naming: outbox::schemas::SubjectNaming::Topic,
        },
    );
    config.refresh = Duration::ZERO;
    let schemas = outbox::schemas::Schemas::new(config).unwrap();

    // Enqueued without the check: total_cents is missing.
    let mut c = client(&db).await;
    let tx = c.transaction().await.unwrap();
    outbox::Enqueuer::new(&db.schema)
        .enqueue(
            &tx,
            &Message::new(&topic, "order_created", "A-3", json!({"order_id": "A-3"})),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut cfg = relay_config();
    cfg.schemas = Some(schemas.clone());
    let relay = outbox::Relay::new(&db, &kafka(), cfg).unwrap();
    let _ = relay.run_once().await.unwrap();
    let row = c
        .query_one(
            &format!(
                "SELECT status, attempts, last_error FROM {}.outbox",
                db.schema.quoted()
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, String>(0),
        "failed",
        "failed at once, no retries"
    );
    assert_eq!(row.get::<_, i32>(1), 1);
    let why: String = row.get(2);
    assert!(
        why.contains("total_cents") && why.contains(&format!("schema id {v1}")),
        "{why}"
    );
    assert_eq!(topic_len(&topic).await, 0);

    // The fix: a compatible version gives total_cents a default; then requeue.
    let v2 = registry
        .register(
            &subject,
            Format::Avro,
            &AVRO.replace(r#""type": "long"}"#, r#""type": "long", "default": 0}"#),
        )
        .await
        .unwrap();
    assert_ne!(v1, v2);
    outbox::status::requeue(&db, outbox::status::Requeue::AllFailed)
        .await
        .unwrap();
    // Below the claim floor now: a running relay's sweep (or the requeue's notice) brings
    // the next claim back down to it.
    relay.sweep().await.unwrap();
    assert_eq!(drain(&relay).await, 1);
    let records = read_all(&topic).await;
    assert_eq!(
        u32::from_be_bytes(records[0].payload[1..5].try_into().unwrap()),
        v2
    );
    assert_eq!(
        schemas.decode(&records[0].payload).await.unwrap().json["total_cents"],
        0
    );
}

/// A topic whose subject the registry does not hold: the row is backed off (attempts spent,
/// the reason kept), not failed for good and not sent as plain JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_the_registry_lacks_backs_the_row_off() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let schemas = schemas_for(&registry_url(), &[(topic.as_str(), Format::Avro)]);
    let c = client(&db).await;
    outbox::Enqueuer::new(&db.schema)
        .enqueue(
            &c,
            &Message::new(&topic, "order_created", "A-4", json!({"order_id": "A-4"})),
        )
        .await
        .unwrap();
    let mut cfg = relay_config();
    cfg.schemas = Some(schemas);
    let relay = outbox::Relay::new(&db, &kafka(), cfg).unwrap();
    let _ = relay.run_once().await.unwrap();
    let row = c
        .query_one(
            &format!(
                "SELECT status, attempts, last_error FROM {}.outbox",
                db.schema.quoted()
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "pending");
    assert_eq!(row.get::<_, i32>(1), 1);
    assert!(
        row.get::<_, String>(2).contains("40401"),
        "{}",
        row.get::<_, String>(2)
    );
    assert_eq!(topic_len(&topic).await, 0);
}

/// Framed records our consumer cannot decode — an id the registry does not know, and a datum
/// cut short — are decode dead letters naming why (the registry's error code for the first),
/// never handled, never retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_framed_records_are_decode_dead_letters_naming_why() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    create_topic(&format!("{topic}.dlq"), 1).await;
    let url = registry_url();
    let id = RegistryClient::new(&url)
        .unwrap()
        .register(&format!("{topic}-value"), Format::Avro, AVRO)
        .await
        .unwrap();
    let unknown_id = 2_000_000_000u32;
    let mut cut = vec![0u8];
    cut.extend_from_slice(&id.to_be_bytes());
    cut.extend_from_slice(&[0x08, b'A']); // a string of 4 bytes, 1 present
    let mut unknown = vec![0u8];
    unknown.extend_from_slice(&unknown_id.to_be_bytes());
    unknown.extend_from_slice(b"\x02A");
    for (key, payload) in [("u", &unknown), ("c", &cut)] {
        produce(
            &topic,
            Some(key.as_bytes()),
            &[
                ("message_type", b"order_created"),
                ("message_id", format!("m-{key}").as_bytes()),
            ],
            Some(payload),
        )
        .await;
    }
    let letters = undecodable(&db, &topic, Some(schemas_for(&url, &[])), 2).await;
    let error = |key: &str| {
        letters
            .iter()
            .find(|l| l.key.as_deref() == Some(key.as_bytes()))
            .map(|l| {
                (
                    l.headers["x-error"].clone(),
                    l.headers["x-error-kind"].clone(),
                )
            })
            .unwrap()
    };
    let (e, kind) = error("u");
    assert_eq!(kind, "decode");
    assert!(
        e.contains(&format!("schema id {unknown_id}")) && e.contains("40403"),
        "{e}"
    );
    let (e, kind) = error("c");
    assert_eq!(kind, "decode");
    assert!(
        e.contains(&format!("schema id {id}")) && e.contains("avro length of 4"),
        "{e}"
    );
}

/// Record naming: the subject is the record's full name (shared by every topic carrying that
/// record); the relay frames with that subject's id, and a subject holding another record is
/// refused, not published under the wrong contract.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_subject_naming() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let url = registry_url();
    let ns = format!("it.r{}", hex(6));
    let record = format!("{ns}.OrderCreated");
    let schema = AVRO.replace(
        "\"namespace\": \"com.acme\"",
        &format!("\"namespace\": \"{ns}\""),
    );
    let registry = RegistryClient::new(&url).unwrap();
    let id = registry
        .register(&record, Format::Avro, &schema)
        .await
        .unwrap();
    let mut config = outbox::schemas::SchemaConfig::from_topics_toml(
        &url,
        &format!("[[topic]]\nname = \"{topic}\"\nformat = \"avro\"\nsubject = \"record\"\nrecord = \"{record}\""),
    )
    .unwrap();
    config.refresh = Duration::ZERO;
    let schemas = outbox::schemas::Schemas::new(config).unwrap();
    let c = client(&db).await;
    let enq = Enqueuer::new(&db.schema).with_schemas(schemas.clone());
    enq.enqueue(
        &c,
        &Message::new(
            &topic,
            "order_created",
            "R-1",
            json!({"order_id": "R-1", "total_cents": 1}),
        ),
    )
    .await
    .unwrap();
    let mut cfg = relay_config();
    cfg.schemas = Some(schemas.clone());
    let relay = outbox::Relay::new(&db, &kafka(), cfg).unwrap();
    assert_eq!(drain(&relay).await, 1);
    let records = read_all(&topic).await;
    assert_eq!(
        u32::from_be_bytes(records[0].payload[1..5].try_into().unwrap()),
        id
    );

    // A subject that holds another record than the topic declares: refused with the
    // reason, nothing written.
    let wrong = format!("{ns}.OrderPlaced");
    registry
        .register(&wrong, Format::Avro, &schema)
        .await
        .unwrap();
    let other_topic = topic_name();
    let enq = Enqueuer::new(&db.schema).with_schemas(
        outbox::schemas::Schemas::new(
            outbox::schemas::SchemaConfig::from_topics_toml(
                &url,
                &format!("[[topic]]\nname = \"{other_topic}\"\nformat = \"avro\"\nsubject = \"record\"\nrecord = \"{wrong}\""),
            )
            .unwrap(),
        )
        .unwrap(),
    );
    match enq
        .enqueue(
            &c,
            &Message::new(
                &other_topic,
                "order_created",
                "R-2",
                json!({"order_id": "R-2", "total_cents": 2}),
            ),
        )
        .await
    {
        Err(EnqueueError::Schema(SchemaError::Schema(why))) => {
            assert!(
                why.contains(&format!("holds record {record}")) && why.contains("declares record"),
                "{why}"
            )
        }
        other => panic!("another record under the subject must be refused: {other:?}"),
    }
    assert_eq!(
        count(
            &c,
            &format!(
                "SELECT count(*) FROM {}.outbox WHERE topic = '{other_topic}'",
                db.schema.quoted()
            )
        )
        .await,
        0
    );
}
