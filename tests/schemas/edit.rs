//! Edit and retry on a topic with a registered schema, as an operator meets it in the
//! dashboard: the framed body shown decoded, an edit that breaks the schema refused with the
//! reason, a valid one encoded and framed as the relay would, through `outbox admin
//! --topics-file` and the real registry.

use std::process::{Command, Stdio};
use std::time::Duration;

use outbox::schemas::{Format, RegistryClient};
use outbox_testkit::*;

use super::contract::AVRO;
use super::*;

const TOKEN: &str = "schema-edit-token-0123456789";

/// (status, body) of one request with the admin token.
fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut c = Command::new("curl");
    c.args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", method])
        .args(["-H", &format!("Authorization: Bearer {TOKEN}")]);
    if let Some(b) = body {
        c.args(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    let out = c
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_retry_on_a_schema_topic_is_checked_against_its_schema_and_encoded() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let url = registry_url();
    let id = RegistryClient::new(&url)
        .unwrap()
        .register(&format!("{topic}-value"), Format::Avro, AVRO)
        .await
        .unwrap();
    let schemas = schemas_for(&url, &[(topic.as_str(), Format::Avro)]);
    // The poison letter: valid Avro, but an order its consumer refuses for good.
    let framed = schemas
        .for_topic(&topic)
        .await
        .unwrap()
        .unwrap()
        .encode(&serde_json::json!({"order_id": "A-1", "total_cents": -5, "note": null}))
        .unwrap();
    produce(
        &format!("{topic}.dlq"),
        Some(b"A-1"),
        &[
            ("message_id", format!("m-{}", hex(6)).as_bytes()),
            ("x-original-topic", topic.as_bytes()),
            ("x-consumer-group", b"billing"),
            ("x-error", b"total_cents must not be negative"),
            ("x-error-kind", b"permanent"),
        ],
        Some(&framed),
    )
    .await;
    archive_once(&db, vec![format!("{topic}.dlq")]).await;
    let letter: i64 = client(&db)
        .await
        .query_one("SELECT id FROM dead_letters", &[])
        .await
        .unwrap()
        .get(0);
    let topics = std::env::temp_dir().join(format!("outbox-topics-{}.toml", hex(6)));
    std::fs::write(
        &topics,
        format!("[[topic]]\nname = \"{topic}\"\nformat = \"avro\"\n"),
    )
    .unwrap();
    let port = free_port();
    let _admin = Kill(
        outbox_command(&db)
            .args(["admin", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--topics-file")
            .arg(&topics)
            .env("SCHEMA_REGISTRY_URL", &url)
            .env("OUTBOX_ADMIN_TOKEN", TOKEN)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until(Duration::from_secs(30), "admin listening", || async move {
        tokio::task::spawn_blocking(move || http(port, "GET", "/healthz", None).0 == 200)
            .await
            .unwrap()
    })
    .await;
    let call = |method: &'static str, path: String, body: Option<String>| {
        tokio::task::spawn_blocking(move || http(port, method, &path, body.as_deref()))
    };

    // The editor starts from the body decoded through its schema.
    let (code, b) = call("GET", format!("/api/dlq/messages/{letter}/editable"), None)
        .await
        .unwrap();
    assert_eq!(code, 200, "{b}");
    let e: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(e["format"], "schema");
    assert_eq!(e["schema_id"], id);
    let shown: serde_json::Value = serde_json::from_str(e["body_text"].as_str().unwrap()).unwrap();
    assert_eq!(shown["total_cents"], -5);

    // JSON that breaks the schema is refused with the schema's reason; nothing is sent.
    let edit = format!("/api/dlq/messages/{letter}/edit-retry");
    let bad = r#"{"body_text":"{\"order_id\":\"A-1\",\"total_cents\":\"lots\"}","reason":"fix the total"}"#;
    let (code, b) = call("POST", edit.clone(), Some(bad.into())).await.unwrap();
    assert_eq!(code, 400, "{b}");
    assert!(
        b.contains(&format!("does not match the schema of {topic} (id {id})")),
        "{b}"
    );
    assert_eq!(topic_len(&topic).await, 0);

    // A valid edit goes out framed with the registered id, decoding to what was typed.
    let good = r#"{"body_text":"{\"order_id\":\"A-1\",\"total_cents\":500,\"note\":\"corrected by hand\"}","reason":"the refund was booked as a charge"}"#;
    let (code, b) = call("POST", edit, Some(good.into())).await.unwrap();
    assert_eq!(code, 202, "{b}");
    wait_until(Duration::from_secs(30), "the edited record", || async {
        topic_len(&topic).await == 1
    })
    .await;
    let rec = read_all(&topic).await.remove(0);
    let d = schemas.decode(&rec.payload).await.unwrap();
    assert_eq!(d.schema_id, id);
    assert_eq!(d.json["total_cents"], 500);
    assert_eq!(d.json["note"], "corrected by hand");
    let _ = std::fs::remove_file(&topics);
}
