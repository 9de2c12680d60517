//! `dev/demo.sh`, the README's first command, as a newcomer runs it: every step prints its
//! line, every good order is charged once, the poison ones are archived and grouped by cause,
//! and the dashboard it leaves running answers with the token it printed — and fixes a poison
//! order by hand (edit and retry), which the running consumer then charges once;
//! `dev/demo.sh stop` ends what it started.

use std::process::Command;

use std::time::{Duration, Instant};

use outbox_testkit::{database_url, free_port};

/// `dev/demo.sh stop` for this test's own state directory.
fn stop(state: &str) -> String {
    let s = Command::new("bash")
        .arg(format!("{}/dev/demo.sh", env!("CARGO_MANIFEST_DIR")))
        .arg("stop")
        .env("DEMO_STATE", state)
        .output()
        .unwrap();
    String::from_utf8_lossy(&s.stdout).into_owned()
}

/// Stops what the demo left running however the test ends.
struct Stop(String);
impl Drop for Stop {
    fn drop(&mut self) {
        stop(&self.0);
    }
}

#[test]
fn the_demo_shows_the_whole_job_and_leaves_a_dashboard_that_answers_its_token() {
    let root = env!("CARGO_MANIFEST_DIR");
    let port = free_port();
    // Its own state directory: a developer's own demo keeps running.
    let state = std::env::temp_dir()
        .join(format!("outbox-demo-{port}"))
        .display()
        .to_string();
    let _stop = Stop(state.clone());
    let out = Command::new("bash")
        .arg(format!("{root}/dev/demo.sh"))
        // dev/test.sh built the binaries already; the demo builds them itself otherwise.
        .env("DEMO_SKIP_BUILD", "1")
        .env("DEMO_ADMIN_PORT", port.to_string())
        .env("DEMO_STATE", &state)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "demo failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "rolled back",
        "(poison: total as text)",
        "10 events sent, none pending",
        "8 charges for 8 orders (no order twice)",
        "total_cents missing",
        "stop everything with: dev/demo.sh stop",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    // The summary counts the 2 poison orders as one cause.
    assert!(
        text.lines()
            .any(|l| l.contains("permanent") && l.trim_start().starts_with('2')),
        "{text}"
    );
    // The dashboard answers with the printed token, and refuses without it.
    let token = text
        .split("sign in with the token ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .expect("a token")
        .to_owned();
    let curl = |auth: Option<&str>| {
        let mut c = Command::new("curl");
        c.args(["-s", "-o", "/dev/null", "-w", "%{http_code}"]);
        if let Some(t) = auth {
            c.args(["-H", &format!("Authorization: Bearer {t}")]);
        }
        let o = c
            .arg(format!("http://127.0.0.1:{port}/api/dlq/summary"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let with = curl(Some(&token));
    let without = curl(None);

    // The poison order no code fix will make valid (an old client sent the total as text):
    // an operator edits it in the console and retries it; the billing consumer the demo left
    // running charges it, once.
    let api = |method: &str, path: &str, body: Option<&str>| -> serde_json::Value {
        let mut c = Command::new("curl");
        c.args([
            "-s",
            "-X",
            method,
            "-H",
            &format!("Authorization: Bearer {token}"),
        ]);
        if let Some(b) = body {
            c.args(["-H", "Content-Type: application/json", "--data-binary", b]);
        }
        let o = c
            .arg(format!("http://127.0.0.1:{port}{path}"))
            .output()
            .unwrap();
        serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{path}: {e}: {}", String::from_utf8_lossy(&o.stdout)))
    };
    let letter = api("GET", "/api/dlq/messages?limit=1", None)["messages"][0]["id"].clone();
    let editable = api("GET", &format!("/api/dlq/messages/{letter}/editable"), None);
    let mut order: serde_json::Value =
        serde_json::from_str(editable["body_text"].as_str().expect("the body as text")).unwrap();
    let total: f64 = order["total"]
        .as_str()
        .expect("the total as text")
        .parse()
        .unwrap();
    let number = order["order_number"].as_str().unwrap().to_owned();
    order.as_object_mut().unwrap().remove("total");
    order["total_cents"] = ((total * 100.0).round() as i64).into();
    let edit =
        serde_json::json!({"body_text": order.to_string(), "reason": "old client: total as text"});
    let r = api(
        "POST",
        &format!("/api/dlq/messages/{letter}/edit-retry"),
        Some(&edit.to_string()),
    );
    assert!(r["job"]["id"].is_i64(), "{r}");
    let schema = text
        .split("== schema ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .expect("the demo's schema")
        .to_owned();
    let charged = || {
        let o = Command::new("psql")
            .args([&database_url(), "-Atc"])
            .arg(format!(
                "SELECT count(*) || ' ' || count(*) FILTER (WHERE order_number = '{number}') FROM {schema}.charges"
            ))
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while charged() != "9 1" {
        assert!(
            Instant::now() < deadline,
            "the edited order was not charged once: {}",
            charged()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(stop(&state).contains("demo stopped"));
    assert_eq!((with.as_str(), without.as_str()), ("200", "401"));
    // Stopped: nothing answers on the port any more.
    assert_eq!(curl(Some(&token)), "000");
}
