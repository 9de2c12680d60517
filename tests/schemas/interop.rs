//! Interop proven by the other side's own code: what our relay publishes is read by
//! Confluent's deserializers (Python's confluent-kafka with fastavro, protobuf and
//! jsonschema), and what Confluent's serializers write is handled by our consumer — each
//! format, against the real registry (`tests/interop/confluent.py`, `dev/python.sh`).

use std::process::Command;

use outbox::schemas::{Format, RegistryClient};
use outbox::{Enqueuer, Message};
use serde_json::json;

use super::contract::{AVRO, JSON_SCHEMA, PROTO};
use super::*;

fn repo(path: &str) -> String {
    format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))
}

/// Runs `confluent.py VERB FORMAT TOPIC N`; its JSON lines.
async fn confluent(verb: &str, format: &str, topic: &str, n: usize) -> Vec<serde_json::Value> {
    let (verb, format, topic) = (verb.to_owned(), format.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let py = Command::new("bash")
            .arg(repo("dev/python.sh"))
            .output()
            .unwrap();
        assert!(
            py.status.success(),
            "{}",
            String::from_utf8_lossy(&py.stderr)
        );
        let python = String::from_utf8(py.stdout).unwrap().trim().to_owned();
        let out = Command::new(python)
            .arg(repo("tests/interop/confluent.py"))
            .args([&verb, &format, &topic, &n.to_string()])
            .env("SCHEMA_REGISTRY_URL", registry_url())
            .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "confluent.py {verb} {format}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    })
    .await
    .unwrap()
}

/// A number the other side may print as a string (Protobuf's JSON for int64).
fn int(v: &serde_json::Value) -> i64 {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| panic!("not an integer: {v}"))
}

async fn both_ways(format: Format, name: &str, schema: &str) {
    // Ours → theirs: the relay's records read by Confluent's deserializer.
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic(&topic, 1).await;
    let id = RegistryClient::new(&registry_url())
        .unwrap()
        .register(&format!("{topic}-value"), format, schema)
        .await
        .unwrap();
    let schemas = schemas_for(&registry_url(), &[(topic.as_str(), format)]);
    let c = client(&db).await;
    let enq = Enqueuer::new(&db.schema).with_schemas(schemas.clone());
    let mut ids = Vec::new();
    for i in 1..=3 {
        let m = Message::new(
            &topic,
            "order_created",
            format!("A-{i}"),
            json!({"order_id": format!("A-{i}"), "total_cents": 100 * i, "note": "from rust"}),
        );
        ids.push(m.message_id().to_string());
        enq.enqueue(&c, &m).await.unwrap();
    }
    let mut cfg = relay_config();
    cfg.schemas = Some(schemas.clone());
    assert_eq!(
        drain(&outbox::Relay::new(&db, &kafka(), cfg).unwrap()).await,
        3
    );
    let read = confluent("decode", name, &topic, 3).await;
    assert_eq!(read.len(), 3, "{name}");
    for (i, r) in read.iter().enumerate() {
        assert_eq!(r["message_id"], ids[i], "{name}");
        assert_eq!(r["schema_id"], id, "{name}");
        assert_eq!(
            r["value"]["order_id"],
            format!("A-{}", i + 1),
            "{name}: {r}"
        );
        assert_eq!(
            int(&r["value"]["total_cents"]),
            100 * (i as i64 + 1),
            "{name}: {r}"
        );
        assert_eq!(r["value"]["note"], "from rust", "{name}: {r}");
    }

    // Theirs → ours: Confluent's serializer writes (registering its own schema), our consumer
    // handles.
    let theirs = topic_name();
    create_topic(&theirs, 1).await;
    create_topic(&format!("{theirs}.dlq"), 1).await;
    let produced = confluent("produce", name, &theirs, 3).await;
    let their_id = u32::try_from(produced[0]["schema_id"].as_u64().unwrap()).unwrap();
    let consumer_schemas = schemas_for(&registry_url(), &[]);
    let (seen, stats, stop, h) =
        run_consumer(&db, &theirs, "order_created", Some(consumer_schemas));
    handled(&stats, 3).await;
    stop.send(()).unwrap();
    h.await.unwrap().unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_by_key(|s| s.1["order_id"].as_str().unwrap_or_default().to_owned());
    assert_eq!(seen.len(), 3, "{name}");
    for (i, (_, body, schema_id)) in seen.iter().enumerate() {
        assert_eq!(*schema_id, Some(their_id), "{name}");
        assert_eq!(body["order_id"], format!("PY-{i}"), "{name}: {body}");
        assert_eq!(int(&body["total_cents"]), 100 * i as i64, "{name}: {body}");
        assert_eq!(body["note"], "from python", "{name}: {body}");
    }
    assert_eq!(
        stats
            .dead_lettered
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_with_confluents_own_serdes() {
    both_ways(Format::Avro, "avro", AVRO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_with_confluents_own_serdes() {
    both_ways(Format::Protobuf, "protobuf", PROTO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_with_confluents_own_serdes() {
    both_ways(Format::JsonSchema, "json-schema", JSON_SCHEMA).await;
}
