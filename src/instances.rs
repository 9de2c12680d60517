//! The whole system's health from Postgres: every relay, consumer replica and DLQ archiver
//! writes a heartbeat row (`outbox_instances`) every few seconds with a small state, and the
//! admin server reads them with the outbox's status and the breakers into one overview.
//! Operators can open or close a breaker by hand, audited.

use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};

use crate::config::DbConfig;
#[cfg(feature = "kafka")]
use crate::schema::Schema;
use crate::sql::{breakers, dead_letters, instances, render};

/// How often a process writes its heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);
/// A process whose last heartbeat is older than this is shown as gone.
pub const ALIVE_WITHIN: Duration = Duration::from_secs(30);
/// An archiver that has not archived or checked in for this long is late (a banner, and
/// `/readyz` fails).
pub const ARCHIVER_LATE: Duration = Duration::from_secs(60);

/// This process's name in heartbeats and breaker rows: `host:pid`.
#[cfg(feature = "kafka")]
pub(crate) fn instance_name() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "local".into());
    format!("{host}:{}", std::process::id())
}

/// Writes one process's heartbeats.
#[cfg(feature = "kafka")]
#[derive(Clone)]
pub(crate) struct Heartbeat {
    pool: deadpool_postgres::Pool,
    sql: String,
    stopped: String,
    forget: String,
    kind: &'static str,
    name: String,
    instance: String,
}

#[cfg(feature = "kafka")]
impl Heartbeat {
    pub(crate) fn new(
        pool: deadpool_postgres::Pool,
        schema: &Schema,
        kind: &'static str,
        name: &str,
    ) -> Self {
        Self {
            pool,
            sql: render(instances::BEAT, schema),
            stopped: render(instances::STOPPED, schema),
            forget: render(instances::FORGET, schema),
            kind,
            name: name.to_owned(),
            instance: instance_name(),
        }
    }

    /// The last heartbeat of a clean stop: the overview shows the process stopped at once,
    /// instead of alive until its heartbeat ages out.
    pub(crate) async fn stopped(&self) {
        let Ok(c) = self.pool.get().await else {
            return;
        };
        if let Err(e) = c
            .execute(&self.stopped, &[&self.kind, &self.name, &self.instance])
            .await
        {
            tracing::debug!(error = %e, "stop not recorded");
        }
    }

    /// One heartbeat with `state`. A failure (Postgres down) is only logged at debug: the
    /// process's own outage line says it already, and the next beat retries.
    pub(crate) async fn beat(&self, state: Value) {
        let Ok(c) = self.pool.get().await else {
            return;
        };
        if let Err(e) = c
            .execute(&self.sql, &[&self.kind, &self.name, &self.instance, &state])
            .await
        {
            tracing::debug!(error = %e, "heartbeat not written");
        }
        if fastrand::u32(0..720) == 0 {
            let _ = c.execute(&self.forget, &[]).await;
        }
    }
}

/// One running (or recently gone) process.
#[derive(Debug, Clone, Serialize)]
pub struct Instance {
    /// `relay`, `consumer` or `archiver`.
    pub kind: String,
    /// The consumer group (consumers, archivers) or `relay`.
    pub name: String,
    /// `host:pid`.
    pub instance: String,
    /// What it reported: mode, paused partitions, lag, last archive…
    pub state: Value,
    /// Seconds since its last heartbeat.
    pub seen_secs_ago: f64,
    /// Heartbeat within [`ALIVE_WITHIN`] and not stopped.
    pub alive: bool,
    /// It stopped cleanly (its last heartbeat said so).
    pub stopped: bool,
}

/// An expired breaker waiting for its probe.
#[derive(Debug, Clone, Serialize)]
pub struct Untrusted {
    /// The consumer group.
    pub consumer_group: String,
    /// The dependency.
    pub dependency: String,
    /// The replica probing it, if any.
    pub probe_by: Option<String>,
}

/// The archiver's health.
#[derive(Debug, Clone, Serialize)]
pub struct ArchiverHealth {
    /// Archivers alive.
    pub alive: usize,
    /// Seconds since any archiver last checked in (`None`: never seen in the last hour).
    pub last_seen_secs: Option<f64>,
    /// No archiver checked in within [`ARCHIVER_LATE`]: new dead letters go unseen.
    pub late: bool,
}

/// The whole system at a glance.
#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    /// The outbox: counts, oldest pending age, failed rows, open breakers.
    pub outbox: crate::status::OutboxStatus,
    /// Every process seen in the last hour.
    pub instances: Vec<Instance>,
    /// Breakers expired but not trusted yet.
    pub untrusted: Vec<Untrusted>,
    /// The archiver.
    pub archiver: ArchiverHealth,
}

/// Reads the overview of the outbox in `db.schema`.
///
/// # Errors
/// The Postgres error.
pub async fn overview(db: &DbConfig) -> Result<Overview, tokio_postgres::Error> {
    let c = crate::db::connect(db).await?;
    overview_on(&c, db).await
}

/// [`overview`] over a connection the caller holds.
pub(crate) async fn overview_on(
    c: &tokio_postgres::Client,
    db: &DbConfig,
) -> Result<Overview, tokio_postgres::Error> {
    let outbox =
        crate::status::status_on(c, db, crate::cleanup::DEFAULT_PROCESSED_RETENTION).await?;
    let instances = recent(c, db).await?;
    let untrusted = c
        .query(&render(breakers::UNTRUSTED_ALL, &db.schema), &[])
        .await?
        .iter()
        .map(|r| Untrusted {
            consumer_group: r.get(0),
            dependency: r.get(1),
            probe_by: r.get(2),
        })
        .collect();
    let archiver = archiver_of(&instances);
    Ok(Overview {
        outbox,
        instances,
        untrusted,
        archiver,
    })
}

fn archiver_of(instances: &[Instance]) -> ArchiverHealth {
    // A cleanly stopped archiver archives nothing: it does not count as seen.
    let archivers: Vec<&Instance> = instances
        .iter()
        .filter(|i| i.kind == "archiver" && !i.stopped)
        .collect();
    let last = archivers
        .iter()
        .map(|i| i.seen_secs_ago)
        .min_by(f64::total_cmp);
    ArchiverHealth {
        alive: archivers.iter().filter(|i| i.alive).count(),
        last_seen_secs: last,
        late: last.is_none_or(|s| s > ARCHIVER_LATE.as_secs_f64()),
    }
}

async fn recent(
    c: &tokio_postgres::Client,
    db: &DbConfig,
) -> Result<Vec<Instance>, tokio_postgres::Error> {
    Ok(c.query(&render(instances::RECENT, &db.schema), &[])
        .await?
        .iter()
        .map(|r| {
            let ago: f64 = r.get(4);
            let state: Value = r.get(3);
            let stopped = state.get("stopped").and_then(Value::as_bool) == Some(true);
            Instance {
                kind: r.get(0),
                name: r.get(1),
                instance: r.get(2),
                state,
                seen_secs_ago: ago,
                alive: ago <= ALIVE_WITHIN.as_secs_f64() && !stopped,
                stopped,
            }
        })
        .collect())
}

/// The archiver's health alone (for `/readyz`: one query, not the whole overview).
///
/// # Errors
/// The Postgres error.
pub async fn archiver_health(db: &DbConfig) -> Result<ArchiverHealth, tokio_postgres::Error> {
    let c = crate::db::connect(db).await?;
    archiver_health_on(&c, db).await
}

/// [`archiver_health`] over a connection the caller keeps.
pub(crate) async fn archiver_health_on(
    c: &tokio_postgres::Client,
    db: &DbConfig,
) -> Result<ArchiverHealth, tokio_postgres::Error> {
    Ok(archiver_of(&recent(c, db).await?))
}

/// Why a breaker action was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BreakerActionError {
    /// Bad input: empty names, no reason, a duration out of range.
    #[error("{0}")]
    Invalid(String),
    /// The group or dependency is not one live replicas declare (the message names those
    /// that are).
    #[error("{0}")]
    Unknown(String),
    /// No breaker row for that group and dependency.
    #[error("no breaker {1:?} for group {0:?}")]
    NotFound(String, String),
    /// Postgres failed.
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
}

/// The longest consumer group or dependency name a breaker action takes (Kafka's own limit
/// for a group id is 255).
pub const MAX_BREAKER_NAME: usize = 255;

pub(crate) fn check(group: &str, dependency: &str, reason: &str) -> Result<(), BreakerActionError> {
    if group.trim().is_empty() || dependency.trim().is_empty() {
        return Err(BreakerActionError::Invalid(
            "give the consumer group and the dependency".into(),
        ));
    }
    for (what, v) in [("group", group), ("dependency", dependency)] {
        if v.chars().count() > MAX_BREAKER_NAME || v.chars().any(char::is_control) {
            return Err(BreakerActionError::Invalid(format!(
                "the {what} name must be 1 to {MAX_BREAKER_NAME} characters without control \
                 characters"
            )));
        }
    }
    if reason.contains('\0') {
        return Err(BreakerActionError::Invalid(
            "the reason holds a NUL character".into(),
        ));
    }
    if reason.trim().is_empty() || reason.len() > 2000 {
        return Err(BreakerActionError::Invalid(
            "a breaker action needs a reason (1 to 2000 characters)".into(),
        ));
    }
    Ok(())
}

/// Checks that a replica of consumer `group` has checked in within the hour and declares
/// `dependency` ([`crate::consumer::BreakerConfig::dependencies`]): a breaker opened by hand
/// for a misspelt group or a dependency the group never calls protects nothing.
///
/// # Errors
/// [`BreakerActionError::Unknown`] naming what exists; Postgres errors.
pub async fn check_breaker_target(
    db: &DbConfig,
    group: &str,
    dependency: &str,
) -> Result<(), BreakerActionError> {
    let c = crate::db::connect(db).await?;
    check_breaker_target_on(&c, db, group, dependency).await
}

/// [`check_breaker_target`] over a connection the caller holds.
pub(crate) async fn check_breaker_target_on(
    c: &tokio_postgres::Client,
    db: &DbConfig,
    group: &str,
    dependency: &str,
) -> Result<(), BreakerActionError> {
    check(group, dependency, "-")?;
    let declared: Vec<Option<String>> = c
        .query(&render(instances::DECLARED, &db.schema), &[&group])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if declared.is_empty() {
        let groups: Vec<String> = c
            .query(&render(instances::GROUPS, &db.schema), &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        return Err(BreakerActionError::Unknown(format!(
            "no replica of group {group:?} has checked in within the hour (groups that have: {}); \
             confirm to open it anyway",
            if groups.is_empty() {
                "none".into()
            } else {
                groups.join(", ")
            }
        )));
    }
    let mut names: Vec<String> = declared.into_iter().flatten().collect();
    names.sort_unstable();
    names.dedup();
    if !names.iter().any(|n| n == dependency) {
        return Err(BreakerActionError::Unknown(format!(
            "group {group:?} declares no dependency {dependency:?} (it declares: {}); confirm to \
             open it anyway",
            if names.is_empty() {
                "none".into()
            } else {
                names.join(", ")
            }
        )));
    }
    Ok(())
}

/// Opens `dependency`'s breaker of `group` for `open_for` (an operator who knows the API is
/// down, or wants the group to stop calling it), audited with `actor` and `reason`.
///
/// # Errors
/// [`BreakerActionError`].
pub async fn open_breaker(
    db: &DbConfig,
    group: &str,
    dependency: &str,
    open_for: Duration,
    reason: &str,
    actor: &str,
) -> Result<i64, BreakerActionError> {
    check(group, dependency, reason)?;
    if open_for.is_zero() || open_for > Duration::from_secs(24 * 3600) {
        return Err(BreakerActionError::Invalid(
            "open_for must be between 1 s and 24 h".into(),
        ));
    }
    let mut c = crate::db::connect(db).await?;
    let tx = c.transaction().await?;
    let generation: i64 = tx
        .query_one(
            &render(breakers::OPEN_BY_HAND, &db.schema),
            &[
                &group,
                &dependency,
                &open_for.as_secs_f64(),
                &reason,
                &format!("operator {actor}"),
            ],
        )
        .await?
        .get(0);
    audit(&tx, db, actor, "breaker-open", group, dependency, reason).await?;
    tx.commit().await?;
    tracing::warn!(%group, %dependency, %actor, ?open_for, %reason, "circuit breaker opened by an operator");
    Ok(generation)
}

/// Closes `dependency`'s breaker of `group` and trusts the dependency again (no probe): every
/// replica drains its parked letters and resumes. Audited.
///
/// # Errors
/// [`BreakerActionError::NotFound`] when there is no such breaker; others as above.
pub async fn close_breaker(
    db: &DbConfig,
    group: &str,
    dependency: &str,
    reason: &str,
    actor: &str,
) -> Result<(), BreakerActionError> {
    check(group, dependency, reason)?;
    let mut c = crate::db::connect(db).await?;
    let tx = c.transaction().await?;
    let closed = tx
        .query_opt(
            &render(breakers::CLOSE_BY_HAND, &db.schema),
            &[&group, &dependency],
        )
        .await?;
    if closed.is_none() {
        return Err(BreakerActionError::NotFound(
            group.into(),
            dependency.into(),
        ));
    }
    audit(&tx, db, actor, "breaker-close", group, dependency, reason).await?;
    tx.commit().await?;
    tracing::info!(%group, %dependency, %actor, %reason, "circuit breaker closed by an operator");
    Ok(())
}

async fn audit(
    tx: &tokio_postgres::Transaction<'_>,
    db: &DbConfig,
    actor: &str,
    action: &str,
    group: &str,
    dependency: &str,
    reason: &str,
) -> Result<(), tokio_postgres::Error> {
    tx.query_one(
        &render(dead_letters::AUDIT_BREAKER, &db.schema),
        &[
            &actor,
            &action,
            &json!({"group": group, "dependency": dependency}),
            &reason,
        ],
    )
    .await?;
    Ok(())
}
