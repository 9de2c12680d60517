//! The console's verdict on each part of the system — ok, warn or bad, and in words what is
//! wrong — from the same thresholds as the alert rules in `deploy/prometheus/alerts.yml` (a
//! test reads the rules and fails when a number here and there differ): on-call sees on the
//! home page what would page them.

use serde::Serialize;

use crate::instances::Overview;

/// `OutboxPendingTooOld`: the oldest pending row older than this is bad.
pub const PENDING_AGE_BAD_SECS: f64 = 60.0;
/// `OutboxFailedRows`: more failed rows than this is bad.
pub const FAILED_ROWS_BAD: i64 = 0;

/// How bad.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Nothing to do.
    Ok,
    /// Worth a look (a breaker open, no relay while nothing waits).
    Warn,
    /// What an alert would page for.
    Bad,
}

/// The verdict on one tile of the home page.
#[derive(Debug, Clone, Serialize)]
pub struct TileVerdict {
    /// The tile: `outbox`, `relays`, `consumers`, `breakers`, `archiver`.
    pub tile: &'static str,
    /// How bad.
    pub level: Level,
    /// What is wrong, in words (none when ok).
    pub says: Option<String>,
}

fn secs(v: f64) -> String {
    if v < 90.0 {
        format!("{v:.0} s")
    } else if v < 5400.0 {
        format!("{:.0} min", v / 60.0)
    } else {
        format!("{:.0} h", v / 3600.0)
    }
}

fn rows(n: i64) -> String {
    if n == 1 {
        "1 row".into()
    } else {
        format!("{n} rows")
    }
}

/// The verdict on each tile of `o`, worst first within the list's fixed tile order.
pub fn verdicts(o: &Overview) -> Vec<TileVerdict> {
    let v = |tile, level, says: Option<String>| TileVerdict { tile, level, says };
    let pending = o.outbox.count("pending");
    let failed = o.outbox.count("failed");
    let oldest = o.outbox.oldest_pending_age_secs.unwrap_or(0.0);
    let alive = |kind: &str| {
        o.instances
            .iter()
            .filter(|i| i.kind == kind && i.alive)
            .count()
    };
    let mut out = Vec::new();
    out.push(if failed > FAILED_ROWS_BAD {
        v(
            "outbox",
            Level::Bad,
            Some(format!(
                "{} of the outbox failed for good: fix the cause, then requeue them",
                rows(failed)
            )),
        )
    } else if pending > 0 && oldest > PENDING_AGE_BAD_SECS {
        v(
            "outbox",
            Level::Bad,
            Some(format!(
                "The outbox is behind: {} waiting, the oldest for {}",
                rows(pending),
                secs(oldest)
            )),
        )
    } else {
        v("outbox", Level::Ok, None)
    });
    let relays = alive("relay");
    out.push(if relays == 0 && pending > 0 {
        v(
            "relays",
            Level::Bad,
            Some(format!(
                "Nothing is publishing the outbox: {} waiting, oldest {}",
                rows(pending),
                secs(oldest)
            )),
        )
    } else if relays == 0 {
        v(
            "relays",
            Level::Warn,
            Some("No relay is running (nothing waits yet)".into()),
        )
    } else {
        v("relays", Level::Ok, None)
    });
    let not_normal: Vec<String> = {
        let mut g: Vec<String> = o
            .instances
            .iter()
            .filter(|i| i.kind == "consumer" && i.alive)
            .filter(|i| {
                i.state
                    .get("mode")
                    .and_then(|m| m.as_str())
                    .is_some_and(|m| m != "normal")
            })
            .map(|i| i.name.clone())
            .collect();
        g.sort_unstable();
        g.dedup();
        g
    };
    out.push(if not_normal.is_empty() {
        v("consumers", Level::Ok, None)
    } else {
        v(
            "consumers",
            Level::Warn,
            Some(format!("Not consuming normally: {}", not_normal.join(", "))),
        )
    });
    out.push(match o.outbox.open_breakers.as_slice() {
        [] => v("breakers", Level::Ok, None),
        open => v(
            "breakers",
            Level::Warn,
            Some(format!(
                "Circuit breaker{} open: {}",
                if open.len() == 1 { "" } else { "s" },
                open.iter()
                    .map(|b| format!("{} for {}", b.dependency, b.consumer_group))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        ),
    });
    out.push(if o.archiver.late {
        v("archiver", Level::Bad, Some(match o.archiver.last_seen_secs {
            None => "No DLQ archiver is running: new dead letters are not archived, nothing here shows them. Start `outbox dlq archive`.".into(),
            Some(s) => format!("The DLQ archiver last checked in {} ago: new dead letters are not being archived.", secs(s)),
        }))
    } else {
        v("archiver", Level::Ok, None)
    });
    out
}
