//! `outbox status`: Counts by status, oldest pending age, failed rows grouped by last_error.

use std::io::Write;

use anyhow::Context as _;
use clap::Args as ClapArgs;

use crate::args::*;

/// Counts by status, oldest pending age, failed rows grouped by last_error.
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    db: DbArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Processed marks older than this are reported as overdue for cleanup.
    #[arg(long, default_value = "35d", value_parser = humantime::parse_duration)]
    processed_retention: std::time::Duration,
    /// Instead: the status of the registry's tenants (`--tenants` all, `--tenant NAME` one),
    /// each from its own outbox.
    #[command(flatten)]
    tenants: TenantArgs,
}

pub async fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let Args {
        db,
        json,
        processed_retention,
        tenants,
    } = args;
    let db = db_config(&db)?;
    if let Some(targets) = tenants.targets(&db).await? {
        return per_tenant(&targets, processed_retention, json, out).await;
    }
    let s = outbox::status::status_with(&db, processed_retention)
        .await
        .context("status failed")?;
    let relays: Vec<Relay> = outbox::instances::overview(&db)
        .await
        .context("status failed")?
        .instances
        .into_iter()
        .filter(|i| i.kind == "relay" && i.alive)
        .map(|i| Relay {
            exactly_once: i.state["exactly_once"].as_bool().unwrap_or(false),
            instance: i.instance,
            seen_secs_ago: i.seen_secs_ago,
        })
        .collect();
    render_with_relays(&s, &relays, json, out)?;
    Ok(())
}

/// Each tenant's status under its name (JSON: `{"tenants": [{tenant, database, schema,
/// status | error}]}`); a tenant that cannot be read is said and makes the exit code 1.
async fn per_tenant(
    targets: &[TenantTarget],
    processed_retention: std::time::Duration,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    let mut docs = Vec::new();
    for t in targets {
        let got = match &t.db {
            Ok(conn) => outbox::status::status_with(conn, processed_retention)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.clone()),
        };
        if got.is_err() {
            failed.push(t.tenant.tenant.clone());
        }
        if json {
            let mut v = serde_json::json!({
                "tenant": t.tenant.tenant,
                "database": t.tenant.database,
                "schema": t.tenant.schema.name(),
                "enabled": t.tenant.enabled,
            });
            match got {
                Ok(s) => v["status"] = serde_json::to_value(&s)?,
                Err(e) => v["error"] = e.into(),
            }
            docs.push(v);
            continue;
        }
        writeln!(
            out,
            "== tenant {}{}",
            t.label(),
            if t.tenant.enabled { "" } else { " (disabled)" }
        )?;
        match got {
            Ok(s) => render(&s, false, out)?,
            Err(e) => writeln!(out, "status failed: {e}")?,
        }
    }
    if json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "tenants": docs }))?
        )?;
    }
    tenants_done(&failed, targets.len(), "could not be read")
}

/// A live relay and how it publishes.
pub(crate) struct Relay {
    instance: String,
    exactly_once: bool,
    seen_secs_ago: f64,
}

/// [`render`], then each live relay's mode (`relays` in the JSON document).
pub(crate) fn render_with_relays(
    s: &outbox::status::OutboxStatus,
    relays: &[Relay],
    json: bool,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    if json {
        let mut v = serde_json::to_value(s).map_err(std::io::Error::other)?;
        v["relays"] = relays
            .iter()
            .map(|r| {
                serde_json::json!({
                    "instance": r.instance,
                    "exactly_once": r.exactly_once,
                    "seen_secs_ago": r.seen_secs_ago,
                })
            })
            .collect();
        return writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&v).map_err(std::io::Error::other)?
        );
    }
    render(s, false, out)?;
    if relays.is_empty() {
        writeln!(out, "relays: none running")?;
    }
    for r in relays {
        writeln!(
            out,
            "relay {:<24} {:<14} seen {:.0} s ago",
            r.instance,
            if r.exactly_once {
                "exactly-once"
            } else {
                "at-least-once"
            },
            r.seen_secs_ago
        )?;
    }
    Ok(())
}

/// The status as a table (or one JSON document).
pub(crate) fn render(
    s: &outbox::status::OutboxStatus,
    json: bool,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    if json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(s).map_err(std::io::Error::other)?
        )?;
    } else {
        writeln!(out, "{:<8} {:>12}  oldest created_at", "status", "rows")?;
        for c in &s.counts {
            writeln!(
                out,
                "{:<8} {:>12}  {}",
                c.status,
                c.count,
                c.oldest.as_deref().unwrap_or("-")
            )?;
        }
        match s.oldest_pending_age_secs {
            Some(a) => writeln!(out, "oldest pending age: {a:.1} s")?,
            None => writeln!(out, "oldest pending age: - (no pending rows)")?,
        }
        if let Some(st) = &s.storage {
            storage_line(st, out)?;
        }
        if s.open_breakers.is_empty() {
            writeln!(out, "circuit breakers: none open")?;
        } else {
            writeln!(
                out,
                "circuit breakers OPEN (every replica of the group is paused):"
            )?;
            for b in &s.open_breakers {
                writeln!(
                    out,
                    "  {:<24} {:<20} closes in {:>6.1} s  opened {} time(s)  {}",
                    b.consumer_group,
                    b.dependency,
                    b.closes_in_secs,
                    b.generation,
                    b.reason.as_deref().unwrap_or("")
                )?;
            }
        }
        for m in &s.overdue_marks {
            writeln!(
                out,
                "processed marks OVERDUE: {} of group {} are past retention (is its cleanup off?)",
                m.count, m.consumer_group
            )?;
        }
        if !s.failed_by_error.is_empty() {
            writeln!(out, "failed rows by last_error:")?;
            for g in &s.failed_by_error {
                writeln!(
                    out,
                    "  {:>8}  ids {}..{}  {}",
                    g.count, g.min_id, g.max_id, g.last_error
                )?;
            }
        }
    }

    Ok(())
}

/// One line on the storage: its kind and size, and on the ring where rotation stands.
fn storage_line(st: &outbox::storage::StorageState, out: &mut dyn Write) -> std::io::Result<()> {
    let size = mebibytes(st.bytes);
    match (st.generation, st.generations) {
        (Some(current), Some(in_use)) => {
            let oldest = st.oldest_generation_age_secs.map_or_else(
                || "none waiting".to_owned(),
                |a| {
                    format!(
                        "the oldest waiting {}",
                        humantime::format_duration(std::time::Duration::from_secs(a as u64))
                    )
                },
            );
            writeln!(
                out,
                "storage: ring, {size}, {in_use} of 8 generations hold rows (current {current}), \
                 {oldest} to be reclaimed{}",
                if in_use >= 8 {
                    " - FULL: the next generation is not reclaimed (a relay behind, or cleanup not running)"
                } else {
                    ""
                }
            )
        }
        _ => writeln!(out, "storage: {}, {size}", st.layout),
    }
}

/// `bytes` as MiB with one decimal.
fn mebibytes(bytes: i64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_the_storage_and_a_full_ring() {
        let doc = |storage: serde_json::Value| -> String {
            let s: outbox::status::OutboxStatus = serde_json::from_value(serde_json::json!({
                "counts": [], "oldest_pending_age_secs": null, "failed_by_error": [],
                "open_breakers": [], "storage": storage
            }))
            .unwrap();
            let mut out = Vec::new();
            render(&s, false, &mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        let table = doc(serde_json::json!({"layout": "table", "bytes": 3_145_728,
            "generation": null, "generations": null, "oldest_generation_age_secs": null}));
        assert!(table.contains("storage: table, 3.0 MiB"), "{table}");
        let ring = doc(
            serde_json::json!({"layout": "ring", "bytes": 1_048_576, "generation": 3,
            "generations": 7, "oldest_generation_age_secs": 7260.0}),
        );
        assert!(
            ring.contains("storage: ring, 1.0 MiB, 7 of 8 generations hold rows (current 3), the oldest waiting 2h 1m to be reclaimed"),
            "{ring}"
        );
        assert!(!ring.contains("FULL"), "{ring}");
        let full = doc(
            serde_json::json!({"layout": "ring", "bytes": 0, "generation": 0,
            "generations": 8, "oldest_generation_age_secs": 1.0}),
        );
        assert!(
            full.contains("FULL: the next generation is not reclaimed"),
            "{full}"
        );
        // Older documents without the field still read.
        assert!(!doc(serde_json::Value::Null).contains("storage:"));
    }

    #[test]
    fn status_names_counts_age_breakers_and_failed_groups() {
        let s: outbox::status::OutboxStatus = serde_json::from_value(serde_json::json!({
            "counts": [{"status": "pending", "count": 3, "oldest": "2026-12-01T00:00:00Z"}],
            "oldest_pending_age_secs": 12.5,
            "failed_by_error": [{"last_error": "topic missing", "count": 2, "min_id": 4, "max_id": 9}],
            "open_breakers": [],
            "overdue_marks": [{"consumer_group": "billing", "count": 7}]
        }))
        .unwrap();
        let mut out = Vec::new();
        render(&s, false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        for want in [
            "pending             3  2026-12-01T00:00:00Z",
            "oldest pending age: 12.5 s",
            "circuit breakers: none open",
            "processed marks OVERDUE: 7 of group billing are past retention",
            "       2  ids 4..9  topic missing",
        ] {
            assert!(text.contains(want), "{want:?} missing in:\n{text}");
        }
        let mut out = Vec::new();
        render(&s, true, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["counts"][0]["count"], 3);
    }

    #[test]
    fn status_says_how_each_relay_publishes() {
        let s: outbox::status::OutboxStatus = serde_json::from_value(serde_json::json!({
            "counts": [], "oldest_pending_age_secs": null, "failed_by_error": [],
            "open_breakers": []
        }))
        .unwrap();
        let relays = [
            Relay {
                instance: "host-a:41".into(),
                exactly_once: true,
                seen_secs_ago: 2.0,
            },
            Relay {
                instance: "host-b:7".into(),
                exactly_once: false,
                seen_secs_ago: 4.0,
            },
        ];
        let mut out = Vec::new();
        render_with_relays(&s, &relays, false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("relay host-a:41                exactly-once   seen 2 s ago"),
            "{text}"
        );
        assert!(
            text.contains("relay host-b:7                 at-least-once  seen 4 s ago"),
            "{text}"
        );
        let mut out = Vec::new();
        render_with_relays(&s, &relays, true, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["relays"][0]["exactly_once"], true);
        let mut out = Vec::new();
        render_with_relays(&s, &[], false, &mut out).unwrap();
        assert!(String::from_utf8(out)
            .unwrap()
            .contains("relays: none running"));
    }
}
