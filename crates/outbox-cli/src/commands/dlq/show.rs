//! `outbox dlq show`: One letter: headers, key, body.

use std::io::Write;

use clap::Args as ClapArgs;
use outbox::dlq::Dlq;

use super::*;
use crate::args::*;

/// One letter: headers, key, body.
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    db: DbArgs,
    /// Archive id.
    #[arg(value_parser = parse_id)]
    id: i64,
    /// JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let Args { db, id, json } = args;
    let dlq = Dlq::new(&db_config(&db)?);
    let d = dlq.show(id).await.map_err(lift)?;
    let j = d.to_json(false);
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&j)?)?;
        return Ok(());
    }
    render(&j, out)?;
    Ok(())
}

/// One letter as text: its fields, key, headers and body (the archive's JSON view of it).
pub(crate) fn render(j: &serde_json::Value, out: &mut dyn Write) -> std::io::Result<()> {
    for k in [
        "id",
        "status",
        "status_reason",
        "original_topic",
        "original_partition",
        "original_offset",
        "consumer_group",
        "dlq_topic",
        "partition",
        "offset",
        "message_type",
        "message_id",
        "error_kind",
        "error",
        "attempts",
        "dlq_retries",
        "first_failed_at",
        "failed_at",
        "archived_at",
        "times_replayed",
    ] {
        let v = &j[k];
        let text = match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => "-".into(),
            other => other.to_string(),
        };
        writeln!(out, "{k:<19} {text}")?;
    }
    let bytes = |v: &serde_json::Value| match (v.get("text"), v.get("base64")) {
        (Some(t), _) => t.as_str().unwrap_or("").to_owned(),
        (_, Some(b)) => format!("(base64) {}", b.as_str().unwrap_or("")),
        _ => "(none)".into(),
    };
    writeln!(out, "key                 {}", bytes(&j["key"]))?;
    writeln!(out, "headers:")?;
    for h in j["headers"].as_array().into_iter().flatten() {
        let v = &h["value"];
        writeln!(
            out,
            "  {:<24} {}",
            h["name"].as_str().unwrap_or(""),
            if v.is_null() {
                "(null)".into()
            } else {
                bytes(v)
            }
        )?;
    }
    writeln!(out, "body:")?;
    writeln!(out, "{}", bytes(&j["body"]))?;

    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_letter_renders_its_fields_key_headers_and_body() {
        let j = serde_json::json!({
            "id": 7, "status": "new", "original_topic": "orders.created",
            "error": "boom", "attempts": 3,
            "key": {"text": "A-1"},
            "headers": [{"name": "message_id", "value": {"text": "m1"}},
                        {"name": "bin", "value": {"base64": "AAE="}},
                        {"name": "none", "value": null}],
            "body": {"text": "{\"total\":1}"}
        });
        let mut out = Vec::new();
        render(&j, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        for want in [
            "id                  7",
            "original_topic      orders.created",
            "status_reason       -",
            "key                 A-1",
            "  message_id               m1",
            "  bin                      (base64) AAE=",
            "  none                     (null)",
            "body:\n{\"total\":1}",
        ] {
            assert!(text.contains(want), "{want:?} missing in:\n{text}");
        }
    }
}
