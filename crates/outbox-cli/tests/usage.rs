//! The binary's usage contract without any service: help, version, exit code 2 for bad usage.
//! (Its commands against real Postgres and Kafka are tested from the library's `tests/`, which
//! run this same binary; this file also makes `cargo test` build it first.)

use std::process::Command;

fn outbox(args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("KAFKA_BOOTSTRAP_SERVERS")
        .output()
        .expect("run outbox");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code(), text)
}

#[test]
fn help_lists_every_command() {
    let (code, text) = outbox(&["--help"]);
    assert_eq!(code, Some(0), "{text}");
    for cmd in [
        "migrate", "relay", "status", "requeue", "cleanup", "topics", "dlq", "admin",
    ] {
        assert!(text.contains(cmd), "{cmd} missing from:\n{text}");
    }
}

#[test]
fn bad_usage_exits_2_with_a_message() {
    let (code, text) = outbox(&["no-such-command"]);
    assert_eq!(code, Some(2), "{text}");
    let (code, text) = outbox(&["migrate"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("DATABASE_URL") || text.contains("database-url"),
        "{text}"
    );
}
