//! `dev/demo.sh`, the README's first command, as a newcomer runs it: every step prints its
//! line, every good order is charged once, the poison ones are archived and grouped by cause,
//! and the dashboard it leaves running answers with the token it printed; `dev/demo.sh stop`
//! ends what it started.

use std::process::Command;

use outbox_testkit::free_port;

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
    assert!(stop(&state).contains("demo stopped"));
    assert_eq!((with.as_str(), without.as_str()), ("200", "401"));
    // Stopped: nothing answers on the port any more.
    assert_eq!(curl(Some(&token)), "000");
}
