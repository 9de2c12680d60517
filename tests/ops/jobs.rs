//! Replay jobs and edited retries over the admin API, as an operator drives them: a job's
//! timeline and letters with their comebacks, pause/resume/cancel audited with the reason
//! given, and a poison letter edited by hand going out as a new message that names the
//! original.

use std::time::Duration;

use outbox_testkit::*;
use serde_json::Value;

use crate::admin::{http, start, OPERATOR, VIEWER};

/// Dead letters on `topic.dlq` (archived): `n` of them, each with `body`, kind `kind`.
pub(crate) async fn letters(
    db: &outbox::DbConfig,
    topic: &str,
    n: usize,
    kind: &str,
    body: &[u8],
) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let mid = format!("m-{i}-{}", hex(6));
        produce(
            &format!("{topic}.dlq"),
            Some(format!("key-{i}").as_bytes()),
            &[
                ("message_type", b"order_created"),
                ("message_id", mid.as_bytes()),
                ("tenant", b"t1"),
                ("x-original-topic", topic.as_bytes()),
                ("x-consumer-group", b"billing"),
                ("x-error", format!("customer {i} not found").as_bytes()),
                ("x-error-kind", kind.as_bytes()),
                ("x-failed-at", b"2026-11-30T08:00:00Z"),
            ],
            Some(body),
        )
        .await;
        ids.push(mid);
    }
    archive_once(db, vec![format!("{topic}.dlq")]).await;
    ids
}

/// The replayed record `r` fails again: the consumer's dead letter, carrying the replay's
/// headers, archived.
pub(crate) async fn comes_back(db: &outbox::DbConfig, topic: &str, r: &Record) {
    let mut h: Vec<(&str, &[u8])> = r
        .raw_headers
        .iter()
        .filter(|(k, _)| !k.starts_with("x-error") && k != "x-failed-at")
        .filter_map(|(k, v)| v.as_deref().map(|v| (k.as_str(), v)))
        .collect();
    h.extend([
        ("x-original-topic", topic.as_bytes()),
        ("x-consumer-group", &b"billing"[..]),
        ("x-error", &b"customer still not found"[..]),
        ("x-error-kind", &b"permanent"[..]),
        ("x-failed-at", &b"2026-12-01T08:00:00Z"[..]),
    ]);
    produce(
        &format!("{topic}.dlq"),
        r.key.as_deref(),
        &h,
        Some(&r.payload),
    )
    .await;
    archive_once(db, vec![format!("{topic}.dlq")]).await;
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_timeline_letters_and_comebacks_are_served_and_each_action_is_audited_with_its_reason(
) {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    letters(&db, &topic, 4, "transient-exhausted", b"{}").await;
    let s = start(&db).await;
    let pg = client(&db).await;
    // 4 letters at 0.5/s: time to pause between two.
    let body = format!("{{\"topic\":\"{topic}\",\"rate\":0.5,\"canary\":0}}");
    let (code, b) = http(
        s.port,
        "POST",
        "/api/dlq/replay",
        Some(OPERATOR),
        Some(&body),
    )
    .await;
    assert_eq!(code, 202, "{b}");
    let id = json(&b)["id"].as_i64().unwrap();
    let path = |what: &str| format!("/api/dlq/jobs/{id}/{what}");
    wait_until(Duration::from_secs(30), "the first letter sent", || async {
        topic_len(&topic).await >= 1
    })
    .await;
    let (code, b) = http(
        s.port,
        "POST",
        &path("pause"),
        Some(OPERATOR),
        Some(r#"{"reason":"checking the billing dashboard first"}"#),
    )
    .await;
    assert_eq!(code, 200, "{b}");
    assert_eq!(
        json(&b)["status_reason"],
        "paused by olga: checking the billing dashboard first"
    );

    // Cancelling cannot be undone: no reason, no cancel; a viewer cannot act at all.
    for body in [None, Some("{}"), Some(r#"{"reason":"  "}"#)] {
        let (code, b) = http(s.port, "POST", &path("cancel"), Some(OPERATOR), body).await;
        assert_eq!(code, 400, "{body:?}: {b}");
        assert!(b.contains("needs a reason"), "{b}");
    }
    let (code, _) = http(
        s.port,
        "POST",
        &path("cancel"),
        Some(VIEWER),
        Some(r#"{"reason":"x"}"#),
    )
    .await;
    assert_eq!(code, 403);
    let (code, b) = http(
        s.port,
        "POST",
        &path("pause"),
        Some(OPERATOR),
        Some(r#"{"reason":"x","force":true}"#),
    )
    .await;
    assert_eq!(code, 400, "an unknown field is refused: {b}");

    let (code, b) = http(
        s.port,
        "POST",
        &path("resume"),
        Some(OPERATOR),
        Some(r#"{"reason":"billing is healthy"}"#),
    )
    .await;
    assert_eq!(code, 202, "{b}");
    wait_until(Duration::from_secs(60), "the job completed", || async {
        let (_, b) = http(
            s.port,
            "GET",
            &format!("/api/dlq/jobs/{id}"),
            Some(VIEWER),
            None,
        )
        .await;
        json(&b)["status"] == "completed"
    })
    .await;
    let (code, b) = http(
        s.port,
        "POST",
        &path("cancel"),
        Some(OPERATOR),
        Some(r#"{"reason":"late"}"#),
    )
    .await;
    assert_eq!(code, 409, "an ended job cannot be cancelled: {b}");
    // Nor paused: the same conflict, not a malformed request.
    let (code, b) = http(
        s.port,
        "POST",
        &path("pause"),
        Some(OPERATOR),
        Some(r#"{"reason":"late"}"#),
    )
    .await;
    assert_eq!(code, 409, "an ended job cannot be paused: {b}");
    assert!(
        b.contains("only pending or running jobs can be paused"),
        "{b}"
    );

    // The audit log has both actions, with the operator, the reason and the job's letters.
    let rows = pg
        .query(
            "SELECT action, actor, reason, filter->>'job', count FROM dlq_audit
                 WHERE action LIKE 'job-%' ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(String, String, Option<String>, Option<String>)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "job-pause".into(),
                "olga".into(),
                Some("checking the billing dashboard first".into()),
                Some(id.to_string())
            ),
            (
                "job-resume".into(),
                "olga".into(),
                Some("billing is healthy".into()),
                Some(id.to_string())
            ),
        ]
    );
    let unsent_at_pause: i64 = rows[0].get(4);
    assert!(
        (1..=3).contains(&unsent_at_pause),
        "the pause names the unsent letters: {unsent_at_pause}"
    );

    // One replayed letter fails again: its item links the comeback.
    let sent = read_all(&topic).await;
    assert_eq!(sent.len(), 4);
    comes_back(&db, &topic, &sent[1]).await;

    let (code, b) = http(s.port, "GET", &path("events"), Some(VIEWER), None).await;
    assert_eq!(code, 200, "{b}");
    let statuses: Vec<String> = json(&b)
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["status"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        statuses,
        ["running", "paused", "running", "completed"],
        "{b}"
    );
    assert!(
        b.contains("paused by olga: checking the billing dashboard first"),
        "{b}"
    );

    let (code, b) = http(s.port, "GET", &path("items"), Some(VIEWER), None).await;
    assert_eq!(code, 200, "{b}");
    let items = json(&b);
    let items = items.as_array().unwrap();
    assert_eq!(items.len(), 4);
    assert!(
        items
            .iter()
            .all(|i| i["state"] == "sent" && i["topic"] == topic.as_str()),
        "{b}"
    );
    let back: Vec<&Value> = items
        .iter()
        .filter(|i| !i["came_back_as"].is_null())
        .collect();
    assert_eq!(back.len(), 1, "{b}");
    assert_eq!(back[0]["came_back_error"], "customer still not found");
    assert_eq!(
        items
            .iter()
            .map(|i| i["seq"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );

    // Paging and bad input.
    let (_, b) = http(
        s.port,
        "GET",
        &format!("{}?from_seq=3&limit=1", path("items")),
        Some(VIEWER),
        None,
    )
    .await;
    assert_eq!(
        json(&b)
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["seq"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        [3]
    );
    for (q, want) in [("?limit=0", 400), ("?limit=abc", 400), ("?page=2", 400)] {
        let (code, b) = http(
            s.port,
            "GET",
            &format!("{}{q}", path("items")),
            Some(VIEWER),
            None,
        )
        .await;
        assert_eq!(code, want, "{q}: {b}");
    }
    let (code, _) = http(
        s.port,
        "GET",
        "/api/dlq/jobs/999999/events",
        Some(VIEWER),
        None,
    )
    .await;
    assert_eq!(code, 404);
    let (code, _) = http(s.port, "GET", "/api/dlq/jobs/abc/items", Some(VIEWER), None).await;
    assert_eq!(code, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_letter_goes_out_as_a_new_message_naming_the_original_and_both_are_audited() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    let mids = letters(&db, &topic, 2, "decode", b"{\"order\":").await;
    let s = start(&db).await;
    let pg = client(&db).await;
    let ids: Vec<i64> = pg
        .query("SELECT id FROM dead_letters ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let (letter, other) = (ids[0], ids[1]);

    // What the editor starts from: the body as it failed, the letter's headers.
    let (code, b) = http(
        s.port,
        "GET",
        &format!("/api/dlq/messages/{letter}/editable"),
        Some(OPERATOR),
        None,
    )
    .await;
    assert_eq!(code, 200, "{b}");
    let e = json(&b);
    assert_eq!(
        (e["body_text"].as_str(), e["format"].as_str()),
        (Some("{\"order\":"), Some("text"))
    );
    assert!(
        e["headers"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!(["tenant", "t1"])),
        "{b}"
    );
    let (code, _) = http(
        s.port,
        "GET",
        &format!("/api/dlq/messages/{letter}/editable"),
        Some(VIEWER),
        None,
    )
    .await;
    assert_eq!(code, 403, "a viewer never reads a body");

    let edit = |body: &str| format!("/api/dlq/messages/{body}/edit-retry");
    // Refused, with nothing sent and nothing audited: not JSON, no reason, a viewer, a NUL.
    for (token, body, want, says) in [
        (
            OPERATOR,
            r#"{"body_text":"{\"order\":","reason":"fix"}"#,
            400,
            "not valid JSON",
        ),
        (
            OPERATOR,
            r#"{"body_text":"{\"order\":\"A-1\"}"}"#,
            400,
            "needs a reason",
        ),
        (
            OPERATOR,
            r#"{"body_text":"{}","reason":"fix","headers":[["",null]]}"#,
            400,
            "invalid header name",
        ),
        (
            OPERATOR,
            r#"{"body_text":"{}","reason":"fix","extra":1}"#,
            400,
            "unknown field",
        ),
        (VIEWER, r#"{"body_text":"{}","reason":"fix"}"#, 403, ""),
    ] {
        let (code, b) = http(
            s.port,
            "POST",
            &edit(&letter.to_string()),
            Some(token),
            Some(body),
        )
        .await;
        assert_eq!(code, want, "{body}: {b}");
        assert!(b.contains(says), "{body}: {b}");
    }
    let (code, _) = http(
        s.port,
        "POST",
        &edit("abc"),
        Some(OPERATOR),
        Some(r#"{"body_text":"{}","reason":"x"}"#),
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(topic_len(&topic).await, 0);
    let audited: i64 = pg
        .query_one(
            "SELECT count(*) FROM dlq_audit WHERE action = 'edit-retry'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(audited, 0);

    // The fix by hand: a new body and a header changed; our own message_id header is ignored.
    let body = r#"{"body_text":"{\"order\":\"A-1\",\"total_cents\":1200}","reason":"the producer cut the body; rebuilt from the order","headers":[["tenant","t2"],["message_id","forged"],["message_type","order_created"]]}"#;
    let (code, b) = http(
        s.port,
        "POST",
        &edit(&letter.to_string()),
        Some(OPERATOR),
        Some(body),
    )
    .await;
    assert_eq!(code, 202, "{b}");
    let r = json(&b);
    let new_id = r["message_id"].as_str().unwrap().to_owned();
    assert_eq!(r["edited_from"], mids[0].as_str());
    assert_ne!(new_id, mids[0]);
    let job = r["job"]["id"].as_i64().unwrap();
    wait_until(
        Duration::from_secs(30),
        "the edited message sent",
        || async { topic_len(&topic).await == 1 },
    )
    .await;
    let sent = read_all(&topic).await;
    let rec = &sent[0];
    assert_eq!(rec.payload, br#"{"order":"A-1","total_cents":1200}"#);
    assert_eq!(rec.key.as_deref(), Some(&b"key-0"[..]));
    assert_eq!(rec.headers.get("message_id"), Some(&new_id));
    assert_eq!(rec.headers.get("x-edited-from"), Some(&mids[0]));
    assert_eq!(rec.headers.get("tenant").map(String::as_str), Some("t2"));
    assert_eq!(rec.headers.get("x-replay-job"), Some(&job.to_string()));
    assert_eq!(rec.headers.get("x-replay-of"), Some(&letter.to_string()));
    assert_eq!(
        rec.raw_headers
            .iter()
            .filter(|(k, _)| k == "message_id")
            .count(),
        1
    );

    // The original is kept as it failed (marked replayed); the audit row names both.
    let row = pg
        .query_one(
            "SELECT body, status FROM dead_letters WHERE id = $1",
            &[&letter],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, Vec<u8>>(0), b"{\"order\":");
    wait_until(
        Duration::from_secs(30),
        "the letter marked replayed",
        || async {
            pg.query_one("SELECT status FROM dead_letters WHERE id = $1", &[&letter])
                .await
                .unwrap()
                .get::<_, String>(0)
                == "replayed"
        },
    )
    .await;
    let a = pg
        .query_one("SELECT actor, reason, dead_letter_ids, filter FROM dlq_audit WHERE action = 'edit-retry'", &[])
        .await
        .unwrap();
    assert_eq!(a.get::<_, String>(0), "olga");
    assert_eq!(
        a.get::<_, String>(1),
        "the producer cut the body; rebuilt from the order"
    );
    assert_eq!(a.get::<_, Vec<i64>>(2), vec![letter]);
    let f: Value = a.get(3);
    assert_eq!(
        (
            f["message_id"].as_str(),
            f["edited_from"].as_str(),
            f["job"].as_i64()
        ),
        (Some(new_id.as_str()), Some(mids[0].as_str()), Some(job))
    );
    assert_eq!(f["changed"], serde_json::json!(["body", "headers"]));

    // The edited message fails too: its comeback is linked to the edit's job.
    comes_back(&db, &topic, rec).await;
    let (_, b) = http(
        s.port,
        "GET",
        &format!("/api/dlq/jobs/{job}/items"),
        Some(VIEWER),
        None,
    )
    .await;
    let items = json(&b);
    assert_eq!(items[0]["edited"], true, "{b}");
    assert!(items[0]["came_back_as"].is_i64(), "{b}");

    // A letter waiting in an unfinished job is not edited (the job would send it too).
    let dlq = outbox::dlq::Dlq::new(&db);
    let mut opts = outbox::dlq::ReplayOptions::default();
    opts.canary = 0;
    opts.confirm_kinds = true;
    let waiting = dlq
        .create_job(
            &outbox::dlq::Filter {
                ids: vec![other],
                ..Default::default()
            },
            &opts,
        )
        .await
        .unwrap();
    let (code, b) = http(
        s.port,
        "POST",
        &edit(&other.to_string()),
        Some(OPERATOR),
        Some(r#"{"body_text":"{}","reason":"x"}"#),
    )
    .await;
    assert_eq!(code, 400, "{b}");
    assert!(b.contains("waiting in an unfinished replay job"), "{b}");
    dlq.cancel_job(waiting.id, "t", Some("test")).await.unwrap();
    // Absurd input to the job actions and the editor: refused, nothing sent or audited.
    let long = "x".repeat(1001);
    let many: Vec<String> = (0..101).map(|i| format!("[\"h{i}\",\"v\"]")).collect();
    for (path, body, says) in [
        (
            format!("/api/dlq/jobs/{job}/pause"),
            format!("{{\"reason\":\"{long}\"}}"),
            "at most 1000",
        ),
        (
            format!("/api/dlq/jobs/{job}/cancel"),
            r#"{"reason":"a\u0000b"}"#.to_owned(),
            "NUL",
        ),
        (
            edit(&other.to_string()),
            format!("{{\"body_text\":\"{{}}\",\"reason\":\"{long}\"}}"),
            "at most 1000",
        ),
        (
            edit(&other.to_string()),
            format!(
                "{{\"body_text\":\"{{}}\",\"reason\":\"x\",\"headers\":[{}]}}",
                many.join(",")
            ),
            "at most 100 headers",
        ),
        (
            edit(&other.to_string()),
            r#"{"body_text":"{}","reason":"x","headers":[["h","a\u0000"]]}"#.to_owned(),
            "NUL",
        ),
    ] {
        let (code, b) = http(s.port, "POST", &path, Some(OPERATOR), Some(&body)).await;
        assert_eq!(code, 400, "{path}: {b}");
        assert!(b.contains(says), "{path}: {b}");
    }
    assert_eq!(topic_len(&topic).await, 1, "nothing more was sent");
    // A dropped letter is not edited.
    dlq.drop_letters(
        &outbox::dlq::Filter {
            ids: vec![other],
            ..Default::default()
        },
        false,
        "noise",
        "t",
    )
    .await
    .unwrap();
    let (code, b) = http(
        s.port,
        "POST",
        &edit(&other.to_string()),
        Some(OPERATOR),
        Some(r#"{"body_text":"{}","reason":"x"}"#),
    )
    .await;
    assert_eq!(code, 400, "{b}");
    assert!(b.contains("dropped"), "{b}");
}
