//! The admin API as a client sees it: a real `outbox admin` process with a tokens file, curl
//! requests, real Postgres and Kafka behind it.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use outbox::admin::{Access, Role, ROUTES};
use outbox_testkit::*;

pub(crate) const VIEWER: &str = "viewer-token-aaaaaaaaaaaa";
pub(crate) const OPERATOR: &str = "operator-token-bbbbbbbbbbbb";
pub(crate) const OPERATOR2: &str = "operator-token-cccccccccccc";
pub(crate) const ADMIN: &str = "admin-token-dddddddddddd";

pub(crate) struct Server {
    child: Child,
    pub(crate) port: u16,
    dir: std::path::PathBuf,
}
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The tokens file is the test's own: nothing of a run stays in the temp directory.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) async fn start(db: &outbox::DbConfig) -> Server {
    let dir = std::env::temp_dir().join(format!("outbox-admin-{}", hex(8)));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join("tokens");
    std::fs::write(
        &tokens,
        format!(
            "# holder role sha256\nvera viewer {}\nolga operator {}\nomar operator {}\nada admin {}\n",
            outbox::admin::token_hash(VIEWER),
            outbox::admin::token_hash(OPERATOR),
            outbox::admin::token_hash(OPERATOR2),
            outbox::admin::token_hash(ADMIN)
        ),
    )
    .unwrap();
    let port = free_port();
    let child = outbox_command(db)
        .args([
            "admin",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--tokens-file",
            tokens.to_str().unwrap(),
        ])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let s = Server { child, port, dir };
    wait_until(Duration::from_secs(30), "admin listening", || async {
        http(s.port, "GET", "/healthz", None, None).await.0 == 200
    })
    .await;
    s
}

/// (status, body) of one request.
pub(crate) async fn http(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    let mut args: Vec<String> = vec![
        "-s".into(),
        "-o".into(),
        "-".into(),
        "-w".into(),
        "\n%{http_code}".into(),
        "-X".into(),
        method.into(),
    ];
    if let Some(t) = token {
        args.extend(["-H".into(), format!("Authorization: Bearer {t}")]);
    }
    let mut body_file = None;
    if let Some(b) = body {
        let f = std::env::temp_dir().join(format!("outbox-body-{}", hex(8)));
        std::fs::write(&f, b).unwrap();
        args.extend([
            "-H".into(),
            "Content-Type: application/json".into(),
            "--data-binary".into(),
            format!("@{}", f.display()),
        ]);
        body_file = Some(f);
    }
    args.push(format!("http://127.0.0.1:{port}{path}"));
    let out =
        tokio::task::spawn_blocking(move || Command::new("curl").args(&args).output().unwrap())
            .await
            .unwrap();
    if let Some(f) = body_file {
        let _ = std::fs::remove_file(f);
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn concrete(path: &str) -> String {
    path.replace("{id}", "1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_protected_route_refuses_missing_wrong_and_too_weak_tokens() {
    let db = fresh_db().await;
    let s = start(&db).await;
    let mut checked = 0;
    for r in ROUTES {
        let path = concrete(r.path);
        let body = (r.method == "POST").then_some("{}");
        match r.access {
            Access::Public => {
                let (code, _) = http(s.port, r.method, &path, None, None).await;
                assert!(
                    code == 200 || code == 503,
                    "{} {path}: public route answered {code}",
                    r.method
                );
            }
            Access::At(need) => {
                let (code, b) = http(s.port, r.method, &path, None, body).await;
                assert_eq!(code, 401, "{} {path} without a token: {b}", r.method);
                let e: serde_json::Value = serde_json::from_str(&b).expect("JSON error");
                assert!(e["error"].is_string());
                let (code, _) =
                    http(s.port, r.method, &path, Some("not-a-token-at-all-xx"), body).await;
                assert_eq!(code, 401, "{} {path} with a wrong token", r.method);
                let weaker = match need {
                    Role::Viewer => None,
                    Role::Operator => Some(VIEWER),
                    Role::Admin => Some(OPERATOR),
                };
                if let Some(t) = weaker {
                    let (code, b) = http(s.port, r.method, &path, Some(t), body).await;
                    assert_eq!(code, 403, "{} {path} with a weaker role: {b}", r.method);
                }
                // The table and the router agree: with the strongest token the route exists
                // and has an access rule (whatever its answer to an empty request).
                let (code, b) = http(s.port, r.method, &path, Some(ADMIN), body).await;
                assert!(
                    code != 401 && code != 403 && !(code == 404 && b.contains("no such route")),
                    "{} {path}: {code} {b}",
                    r.method
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 14, "{checked}");
    // Anything not in the table is not served.
    let (code, _) = http(s.port, "GET", "/api/secret", Some(ADMIN), None).await;
    assert_eq!(code, 404);
    let (code, _) = http(s.port, "DELETE", "/api/dlq/summary", Some(ADMIN), None).await;
    assert_eq!(code, 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewers_never_see_bodies_bad_bodies_get_4xx_and_api_replays_are_audited_with_the_holder() {
    let db = fresh_db().await;
    let c = client(&db).await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    // Two dead letters, as the consumer writes them.
    for i in 0..2 {
        produce(
            &format!("{topic}.dlq"),
            Some(format!("key-{i}").as_bytes()),
            &[
                ("message_type", b"order_created"),
                ("message_id", format!("m-{i}-{}", hex(6)).as_bytes()),
                ("x-original-topic", topic.as_bytes()),
                ("x-consumer-group", b"billing"),
                ("x-error", b"card 42 declined"),
                ("x-error-kind", b"permanent"),
                ("x-failed-at", b"2026-11-30T08:00:00Z"),
            ],
            Some(format!("{{\"secret_body\":{i}}}").as_bytes()),
        )
        .await;
    }
    archive_once(&db, vec![format!("{topic}.dlq")]).await;
    let id: i64 = c
        .query_one("SELECT min(id) FROM dead_letters", &[])
        .await
        .unwrap()
        .get(0);
    let s = start(&db).await;

    let (code, b) = http(
        s.port,
        "GET",
        &format!("/api/dlq/messages/{id}"),
        Some(VIEWER),
        None,
    )
    .await;
    assert_eq!(code, 200);
    assert!(
        !b.contains("secret_body"),
        "a viewer received the body: {b}"
    );
    let v: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["body"]["redacted"], true);
    assert_eq!(v["key"]["redacted"], true, "{b}");
    assert!(
        v["headers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["value"]["redacted"] == true),
        "{b}"
    );
    assert!(!b.contains("key-0"), "a viewer received the key: {b}");
    let (_, b) = http(
        s.port,
        "GET",
        &format!("/api/dlq/messages/{id}"),
        Some(OPERATOR),
        None,
    )
    .await;
    assert!(b.contains("secret_body"), "{b}");
    let (code, b) = http(
        s.port,
        "GET",
        "/api/dlq/messages?limit=1",
        Some(VIEWER),
        None,
    )
    .await;
    assert_eq!(code, 200);
    assert!(!b.contains("secret_body"));
    let page: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(page["messages"].as_array().unwrap().len(), 1);
    let next = page["next_before_id"].as_i64().expect("a next page");
    let (_, b) = http(
        s.port,
        "GET",
        &format!("/api/dlq/messages?limit=1&before_id={next}"),
        Some(VIEWER),
        None,
    )
    .await;
    let page2: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(
        page2["messages"][0]["id"].as_i64(),
        Some(id),
        "keyset pagination"
    );
    // Oldest first pages the other way, with its own cursor; a wrong order or cursor is a 400.
    let (_, b) = http(
        s.port,
        "GET",
        "/api/dlq/messages?limit=1&order=oldest",
        Some(VIEWER),
        None,
    )
    .await;
    let oldest: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(oldest["messages"][0]["id"].as_i64(), Some(id), "{b}");
    let after = oldest["next_after_id"]
        .as_i64()
        .expect("a next page oldest first");
    let (_, b) = http(
        s.port,
        "GET",
        &format!("/api/dlq/messages?limit=1&order=oldest&after_id={after}"),
        Some(VIEWER),
        None,
    )
    .await;
    let second: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(
        second["messages"][0]["id"], page["messages"][0]["id"],
        "{b}"
    );
    for (q, says) in [
        ("order=sideways", "unknown order"),
        (
            "order=oldest&before_id=1",
            "before_id does not page this order",
        ),
        ("after_id=1", "after_id does not page this order"),
    ] {
        let (code, b) = http(
            s.port,
            "GET",
            &format!("/api/dlq/messages?{q}"),
            Some(VIEWER),
            None,
        )
        .await;
        assert_eq!(code, 400, "{q}: {b}");
        assert!(b.contains(says), "{q}: {b}");
    }

    // Oversize, malformed, wrong type, unknown field, bad filter: 4xx with a JSON error.
    let big = format!("{{\"reason\":\"{}\"}}", "x".repeat(70 * 1024));
    for (path, body, want) in [
        ("/api/dlq/drop", big.as_str(), 413),
        ("/api/dlq/drop", "{not json", 400),
        ("/api/dlq/replay", "[1,2]", 422),
        ("/api/outbox/requeue", "{\"id\":1,\"bogus\":true}", 400),
        (
            "/api/dlq/replay",
            "{\"since\":\"whenever\",\"topic\":\"a.b\"}",
            400,
        ),
        ("/api/dlq/replay", "{\"canary\":0}", 400),
        // The order confirmation is a boolean, nothing that looks like one.
        (
            "/api/dlq/replay",
            "{\"topic\":\"a.b\",\"confirm_order\":\"yes\\u0000\"}",
            400,
        ),
        ("/api/dlq/drop", "{\"ids\":[999999],\"reason\":\"x\"}", 404),
    ] {
        let (code, b) = http(s.port, "POST", path, Some(OPERATOR), Some(body)).await;
        assert_eq!(code, want, "{path} {}: {b}", &body[..body.len().min(40)]);
        let e: serde_json::Value =
            serde_json::from_str(&b).unwrap_or_else(|_| panic!("not JSON: {b}"));
        assert!(e["error"].is_string(), "{b}");
    }
    // A typo never widens a selection: every body refuses an unknown field with 400 naming
    // it, on every mutating route (the job actions take an optional body).
    let with_body = [
        (
            "/api/outbox/requeue",
            "{\"failed\":true,\"eror_group\":\"x\"}",
        ),
        (
            "/api/dlq/replay",
            "{\"topic\":\"a.b\",\"eror_group\":\"x\",\"dry_run\":true}",
        ),
        (
            "/api/dlq/drop",
            "{\"topic\":\"a.b\",\"eror_group\":\"x\",\"reason\":\"r\"}",
        ),
        (
            "/api/dlq/restore",
            "{\"topic\":\"a.b\",\"eror_group\":\"x\",\"reason\":\"r\"}",
        ),
        (
            "/api/dlq/purge",
            "{\"retention_secs\":60,\"eror_group\":\"x\"}",
        ),
        (
            "/api/breakers/open",
            "{\"group\":\"g\",\"dependency\":\"d\",\"reason\":\"r\",\"eror_group\":\"x\"}",
        ),
        (
            "/api/breakers/close",
            "{\"group\":\"g\",\"dependency\":\"d\",\"reason\":\"r\",\"eror_group\":\"x\"}",
        ),
        (
            "/api/dlq/jobs/{id}/pause",
            "{\"reason\":\"r\",\"eror_group\":\"x\"}",
        ),
        (
            "/api/dlq/jobs/{id}/resume",
            "{\"reason\":\"r\",\"eror_group\":\"x\"}",
        ),
        (
            "/api/dlq/jobs/{id}/cancel",
            "{\"reason\":\"r\",\"eror_group\":\"x\"}",
        ),
        (
            "/api/dlq/messages/{id}/edit-retry",
            "{\"body_text\":\"{}\",\"reason\":\"r\",\"eror_group\":\"x\"}",
        ),
    ];
    for r in ROUTES.iter().filter(|r| r.method == "POST") {
        assert!(
            with_body.iter().any(|(p, _)| *p == r.path),
            "{} is not covered by the unknown-field check",
            r.path
        );
    }
    for (path, body) in with_body {
        let (code, b) = http(s.port, "POST", &concrete(path), Some(ADMIN), Some(body)).await;
        assert_eq!(code, 400, "{path}: {b}");
        assert!(
            b.contains("unknown field \\\"eror_group\\\""),
            "{path}: {b}"
        );
    }
    assert_eq!(
        http(s.port, "GET", "/api/dlq/messages/abc", Some(VIEWER), None)
            .await
            .0,
        400
    );

    // Replay through the API lands on the original topic and is audited with the holder.
    let (code, b) = http(
        s.port,
        "POST",
        "/api/dlq/replay",
        Some(OPERATOR),
        Some(&format!(
            "{{\"ids\":[{id}],\"canary\":0,\"rate\":50,\"confirm_kinds\":true}}"
        )),
    )
    .await;
    assert_eq!(code, 202, "{b}");
    let job: serde_json::Value = serde_json::from_str(&b).unwrap();
    let job_id = job["id"].as_i64().unwrap();
    wait_until(Duration::from_secs(30), "the replay lands", || async {
        topic_len(&topic).await == 1
    })
    .await;
    let back = read_all(&topic).await;
    assert_eq!(back[0].key.as_deref(), Some(&b"key-0"[..]));
    assert_eq!(back[0].payload, b"{\"secret_body\":0}");
    assert!(
        back[0].headers.contains_key("x-replayed-at") && !back[0].headers.contains_key("x-error")
    );
    let (_, b) = http(s.port, "GET", "/api/dlq/audit", Some(VIEWER), None).await;
    let audit: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(audit[0]["actor"], "olga");
    assert_eq!(audit[0]["action"], "replay");
    assert_eq!(audit[0]["via"], "outbox-admin", "an API action says so");
    assert_eq!(audit[0]["dead_letter_ids"][0].as_i64(), Some(id));
    wait_until(Duration::from_secs(30), "the job completes", || async {
        let (_, b) = http(
            s.port,
            "GET",
            &format!("/api/dlq/jobs/{job_id}"),
            Some(VIEWER),
            None,
        )
        .await;
        b.contains("\"status\":\"completed\"")
    })
    .await;
    // Another operator may not act on olga's job; an admin may.
    let (code, _) = http(
        s.port,
        "POST",
        &format!("/api/dlq/jobs/{job_id}/cancel"),
        Some(OPERATOR2),
        None,
    )
    .await;
    assert_eq!(code, 403);
    let (code, b) = http(
        s.port,
        "POST",
        &format!("/api/dlq/jobs/{job_id}/cancel"),
        Some(ADMIN),
        Some("{\"reason\":\"too late\"}"),
    )
    .await;
    assert_eq!(code, 409, "a completed job cannot be cancelled: {b}");
    assert!(b.contains("has ended"), "{b}");
    // Drop through the API: audited with the holder and the reason.
    let (code, b) = http(
        s.port,
        "POST",
        "/api/dlq/drop",
        Some(OPERATOR2),
        Some("{\"topic\":\"__none__\",\"reason\":\"nothing\"}"),
    )
    .await;
    assert_eq!((code, b.contains("\"dropped\":0")), (200, true), "{b}");
    let (code, _) = http(
        s.port,
        "POST",
        "/api/dlq/drop",
        Some(OPERATOR2),
        Some(&format!(
            "{{\"topic\":\"{topic}\",\"reason\":\"obsolete\"}}"
        )),
    )
    .await;
    assert_eq!(code, 200);
    let (_, b) = http(s.port, "GET", "/api/dlq/audit", Some(VIEWER), None).await;
    let audit: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(
        (
            audit[0]["actor"].as_str(),
            audit[0]["action"].as_str(),
            audit[0]["reason"].as_str()
        ),
        (Some("omar"), Some("drop"), Some("obsolete"))
    );
    // Readiness reports both dependencies and the archiver: none running is not ready (the
    // DLQ would be a black hole); once one checks in, ready.
    let (code, b) = http(s.port, "GET", "/readyz", None, None).await;
    assert_eq!(code, 503, "{b}");
    assert!(
        b.contains("\"postgres\":\"ok\"")
            && b.contains("\"kafka\":\"ok\"")
            && b.contains("\"archiver\":\"missing"),
        "{b}"
    );
    let c = client(&db).await;
    c.execute(
        "INSERT INTO outbox_instances (kind, name, instance) VALUES ('archiver', 'outbox-dlq-archive', 'h:1')",
        &[],
    )
    .await
    .unwrap();
    // Readiness is the server's last look (every 5 s), not a look per call.
    wait_until(
        Duration::from_secs(20),
        "ready with an archiver",
        || async {
            let (code, b) = http(s.port, "GET", "/readyz", None, None).await;
            code == 200 && b.contains("\"archiver\":\"ok\"")
        },
    )
    .await;
    // Security headers on every answer; API answers are never stored; HEAD works.
    let r = reqwest::Client::new()
        .head(format!("http://127.0.0.1:{}/api/dlq/summary", s.port))
        .bearer_auth(VIEWER)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let h = r.headers();
    assert!(h["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("frame-ancestors 'none'"));
    assert_eq!(h["x-frame-options"], "DENY");
    assert_eq!(h["cache-control"], "no-store");
}

#[test]
fn the_admin_server_refuses_to_start_without_authentication_unless_told() {
    let db = outbox::DbConfig::new(&database_url(), "public").unwrap();
    let o = outbox_command(&db)
        .args(["admin", "--listen", "127.0.0.1:0"])
        .env_remove("OUTBOX_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("needs authentication"));
    let o = outbox_command(&db)
        .args(["admin", "--listen", "127.0.0.1:0"])
        .env("OUTBOX_ADMIN_TOKEN", "short")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("at least 16"));
    let help = outbox_command(&db)
        .args(["admin", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("[default: 127.0.0.1:8080]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_paused_through_the_api_resumes_at_once() {
    let db = fresh_db().await;
    let topic = topic_name();
    create_topic_family(&topic, 1, &[]).await;
    for i in 0..3 {
        produce(
            &format!("{topic}.dlq"),
            Some(format!("key-{i}").as_bytes()),
            &[
                ("message_type", b"order_created"),
                ("message_id", format!("p-{i}-{}", hex(6)).as_bytes()),
                ("x-original-topic", topic.as_bytes()),
                ("x-error-kind", b"transient-exhausted"),
            ],
            Some(b"{}"),
        )
        .await;
    }
    archive_once(&db, vec![format!("{topic}.dlq")]).await;
    let s = start(&db).await;
    // 3 letters at 0.2/s: the runner spends most of its time waiting for the pacer.
    let body = format!("{{\"topic\":\"{topic}\",\"rate\":0.2,\"canary\":0}}");
    let (code, b) = http(
        s.port,
        "POST",
        "/api/dlq/replay",
        Some(OPERATOR),
        Some(&body),
    )
    .await;
    assert_eq!(code, 202, "{b}");
    let job: serde_json::Value = serde_json::from_str(&b).unwrap();
    let path = |what: &str| format!("/api/dlq/jobs/{}/{what}", job["id"]);
    wait_until(Duration::from_secs(30), "the first letter sent", || async {
        topic_len(&topic).await == 1
    })
    .await;
    let (code, b) = http(s.port, "POST", &path("pause"), Some(OPERATOR), None).await;
    assert_eq!(code, 200, "{b}");
    // Before, this answered 409 "already running here" until the runner noticed the pause.
    let (code, b) = http(s.port, "POST", &path("resume"), Some(OPERATOR), None).await;
    assert_eq!(code, 202, "{b}");
    wait_until(Duration::from_secs(30), "all three sent", || async {
        topic_len(&topic).await == 3
    })
    .await;
}
