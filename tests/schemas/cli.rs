//! `outbox schemas check|register DIR` as an operator and a CI job run it: its lines and exit
//! codes against the real registry.

use std::process::{Command, Output};

use super::*;

fn outbox(args: &[&str], url: &str) -> Output {
    Command::new(outbox_bin())
        .args(args)
        .env("SCHEMA_REGISTRY_URL", url)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn check_gates_ci_and_register_deploys() {
    let dir = std::env::temp_dir().join(format!("outbox-schemas-{}", hex(8)));
    std::fs::create_dir_all(&dir).unwrap();
    let subject = format!("it.{}.created-value", hex(6));
    let v1 = r#"{"type": "record", "name": "Created", "namespace": "it",
        "fields": [{"name": "id", "type": "string"}]}"#;
    std::fs::write(dir.join(format!("{subject}.avsc")), v1).unwrap();
    std::fs::write(dir.join("README.txt"), "not a schema").unwrap();
    let url = registry_url();
    let d = dir.to_str().unwrap();

    let o = outbox(&["schemas", "check", d], &url);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("new subject  {subject}")),
        "{}",
        text(&o)
    );

    let o = outbox(&["schemas", "register", d], &url);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("registered   {subject} (id ")),
        "{}",
        text(&o)
    );

    // A compatible change (a field with a default) passes; a breaking one (a required field
    // old data lacks) fails the check with exit 1, and so does a file that does not compile.
    let compatible = v1.replace(
        r#"{"name": "id", "type": "string"}"#,
        r#"{"name": "id", "type": "string"}, {"name": "note", "type": "string", "default": ""}"#,
    );
    std::fs::write(dir.join(format!("{subject}.avsc")), &compatible).unwrap();
    let o = outbox(&["schemas", "check", d], &url);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("compatible   {subject}")),
        "{}",
        text(&o)
    );

    let breaking = v1.replace(
        r#"{"name": "id", "type": "string"}"#,
        r#"{"name": "id", "type": "string"}, {"name": "total", "type": "long"}"#,
    );
    std::fs::write(dir.join(format!("{subject}.avsc")), &breaking).unwrap();
    let o = outbox(&["schemas", "check", d], &url);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("INCOMPATIBLE {subject}")),
        "{}",
        text(&o)
    );
    let o = outbox(&["schemas", "register", d], &url);
    assert_eq!(
        o.status.code(),
        Some(1),
        "the registry refuses it too: {}",
        text(&o)
    );

    std::fs::write(dir.join("it.broken-value.proto"), "message {").unwrap();
    std::fs::write(dir.join(format!("{subject}.avsc")), &compatible).unwrap();
    let o = outbox(&["schemas", "check", d], &url);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("INVALID      it.broken-value"),
        "{}",
        text(&o)
    );

    // No registry answering: an error (exit 1), never a silent pass. No such directory: a
    // usage error (exit 2).
    let o = outbox(
        &["schemas", "check", d],
        &format!("http://127.0.0.1:{}/apis/ccompat/v7", free_port()),
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("unavailable"), "{}", text(&o));
    let o = outbox(&["schemas", "check", "/nonexistent/schemas"], &url);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}
