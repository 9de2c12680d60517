//! The consumer's own upkeep: deleting its group's old processed marks and dead-letter records
//! on a schedule, so a service that only consumes does not grow them without bound, and the
//! `outbox_marks_overdue` gauge that shows when cleanup falls behind (or is off).

use std::time::Duration;

use deadpool_postgres::Pool;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::cleanup::{
    CleanupError, DEFAULT_CLEANUP_BATCH, DEFAULT_CLEANUP_INTERVAL, DEFAULT_PROCESSED_RETENTION,
};
use crate::schema::Schema;
use crate::sql::{marks, render};

/// The consumer's cleanup of its own group's marks ([`super::ConsumerConfig::cleanup`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MarksCleanup {
    /// Marks older than this are deleted (default 35 days). Keep it longer than anything that
    /// can bring a message back: the topic's and the DLQ's retention, and replay windows.
    pub retention: Duration,
    /// Rows per DELETE statement (default 5,000).
    pub batch: usize,
    /// How often it runs (default 1 h; the first run is at start).
    pub interval: Duration,
}

impl Default for MarksCleanup {
    fn default() -> Self {
        Self {
            retention: DEFAULT_PROCESSED_RETENTION,
            batch: DEFAULT_CLEANUP_BATCH,
            interval: DEFAULT_CLEANUP_INTERVAL,
        }
    }
}

/// What one cleanup run deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MarksCleaned {
    /// Processed marks deleted.
    pub processed: u64,
    /// Dead-letter records (`dead_lettered`) deleted.
    pub dead_lettered: u64,
    /// Notes of keyed letters (`consumer_passed`, for the replay's order check) deleted.
    pub passed: u64,
}

/// Deletes `group`'s processed marks and dead-letter records older than `c.retention`, in
/// batches of `c.batch`, until none is left (other groups' rows are never touched).
///
/// # Errors
/// [`CleanupError`] when Postgres fails; batches already deleted stay deleted.
pub async fn cleanup_marks(
    pool: &Pool,
    schema: &Schema,
    group: &str,
    c: &MarksCleanup,
) -> Result<MarksCleaned, CleanupError> {
    let conn = pool.get().await?;
    let secs = c.retention.as_secs_f64();
    let batch = c.batch.max(1) as i64;
    let mut done = MarksCleaned::default();
    for (table, at) in [
        ("processed_messages", "processed_at"),
        ("dead_lettered", "dead_lettered_at"),
        ("consumer_passed", "dead_at"),
    ] {
        let sql = render(
            &marks::CLEANUP_GROUP
                .replace("{t}", table)
                .replace("{at}", at),
            schema,
        );
        loop {
            let n = conn
                .query_one(&sql, &[&secs, &batch, &group])
                .await?
                .get::<_, i64>(0) as u64;
            match table {
                "processed_messages" => done.processed += n,
                "dead_lettered" => done.dead_lettered += n,
                _ => done.passed += n,
            }
            if n < batch as u64 {
                break;
            }
        }
    }
    Ok(done)
}

/// Overdue processed marks of `group` (older than `retention`).
async fn overdue(pool: &Pool, schema: &Schema, group: &str, retention: Duration) -> Option<i64> {
    let conn = pool.get().await.ok()?;
    let rows = conn
        .query(&render(marks::OVERDUE, schema), &[&retention.as_secs_f64()])
        .await
        .ok()?;
    Some(
        rows.iter()
            .find(|r| r.get::<_, &str>(0) == group)
            .map_or(0, |r| r.get(1)),
    )
}

/// The schedule: a run at start and every `interval`, until `cancel`. With cleanup off, the
/// overdue gauge is still measured (against the default retention) so that it shows.
pub(super) async fn run(
    pool: Pool,
    schema: Schema,
    group: String,
    cleanup: Option<MarksCleanup>,
    stats: std::sync::Arc<super::ConsumerStats>,
    cancel: CancellationToken,
) {
    let measure = cleanup.clone().unwrap_or_default();
    loop {
        if let Some(c) = &cleanup {
            match cleanup_marks(&pool, &schema, &group, c).await {
                Ok(done) => {
                    stats.marks_deleted.fetch_add(
                        done.processed + done.dead_lettered,
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    debug!(%group, processed = done.processed, dead_lettered = done.dead_lettered, "marks cleanup");
                }
                Err(e) => {
                    warn!(%group, error = %e, "marks cleanup failed; retried at the next interval")
                }
            }
        }
        if let Some(n) = overdue(&pool, &schema, &group, measure.retention).await {
            metrics::gauge!(crate::metrics::MARKS_OVERDUE, "group" => group.clone()).set(n as f64);
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(measure.interval) => {}
        }
    }
}

/// Processed marks must outlive what can bring a message back: a consumer whose marks are
/// deleted before its dead-letter topics drop their letters would handle a letter replayed or
/// drained from there a second time. Checked at start against the broker's `retention.ms` of
/// each dead-letter topic; a lookup that fails (ACLs) only warns.
pub(super) async fn check_retention(
    kafka: &crate::config::KafkaConfig,
    dlq_topics: &[String],
    cleanup: Option<&MarksCleanup>,
) -> Result<(), super::ConsumerError> {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    let Some(c) = cleanup else {
        return Ok(());
    };
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        kafka.client_config().create()?;
    let specs: Vec<ResourceSpecifier<'_>> = dlq_topics
        .iter()
        .map(|t| ResourceSpecifier::Topic(t))
        .collect();
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(15)));
    let described = match admin.describe_configs(specs.iter(), &opts).await {
        Ok(d) => d,
        Err(e) => {
            warn!(error = %e, "cannot read the dead-letter topics' retention; marks retention not checked");
            return Ok(());
        }
    };
    for (topic, r) in dlq_topics.iter().zip(described) {
        let Ok(resource) = r else { continue };
        let Some(ms) = resource
            .get("retention.ms")
            .and_then(|e| e.value.as_deref())
            .and_then(|v| v.parse::<i64>().ok())
        else {
            continue;
        };
        let days = |d: f64| format!("{:.1} days", d / 86_400.0);
        let kept = if ms < 0 {
            "forever".to_owned()
        } else {
            days(ms as f64 / 1000.0)
        };
        if ms < 0 || Duration::from_millis(ms as u64) > c.retention {
            return Err(super::ConsumerError::Config(format!(
                "processed marks are kept {} but {topic} keeps dead letters {kept}: a letter \
                 replayed or drained from it after the marks are gone would be handled twice. \
                 Raise ConsumerConfig::cleanup's retention above the DLQ's, or lower the DLQ \
                 topic's retention.ms (topics.toml dlq_retention)",
                days(c.retention.as_secs_f64())
            )));
        }
    }
    Ok(())
}
