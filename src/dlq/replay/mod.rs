//! Replay is a job, not a loop.
//!
//! * **Frozen selection**: [`Dlq::create_job`] records the exact letters in `dlq_replay_items`
//!   in the same transaction as its audit row; letters dead-lettered later are never part of it.
//! * **Canary**: the first `canary` letters go first; the job waits `canary_wait` and pauses
//!   if any of them came back to the DLQ.
//! * **Refail stop**: when more than `max_refail` of the letters sent came back (same
//!   `message_id`, dead-lettered after the replay, seen by the archive), the job stops.
//! * **Throttle**: letters are sent on an absolute schedule of `rate` per second.
//! * **Ack before mark**: a letter becomes `replayed` only after the broker acknowledged it
//!   (idempotent producer, `acks=all`); a crash re-sends at most the letters acknowledged but
//!   not yet marked, which consumers' inboxes absorb (same `message_id`).
//! * **Durable**: jobs live in Postgres; one runner at a time (a session advisory lock); a job
//!   left `running` by a dead process is resumed with [`Dlq::run_job`].
//! * **Loop guard**: a letter whose message was already replayed `loop_guard` times is
//!   skipped (recorded as such) unless `force`.

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::filter::{Filter, Status};
use super::headers::{for_replay, from_json, HeaderValue};
use super::query::{ts, ts_opt, LetterRow};
use super::{check_actor, conflict, invalid, not_found, Dlq, DlqError};
use crate::config::KafkaConfig;
use crate::message::rfc3339;
use crate::wire::X_FIRST_FAILED_AT;

mod edit;
mod pacer;
mod runner;
mod select;
mod state;
pub(crate) use edit::framework_header;
pub use edit::{Edit, EditedRetry, MAX_EDITED_BODY};
pub(crate) use state::check_reason;
pub use state::MAX_JOB_REASON;

pub(crate) use pacer::Pacer;
pub(crate) use runner::enqueue;

/// The slowest replay: one letter every 1,000 s. Slower schedules cannot be paced (and are
/// better served by replaying fewer letters).
pub const MIN_RATE: f64 = 0.001;
/// The fastest replay, messages per second.
pub const MAX_RATE: f64 = 1_000_000.0;

/// Default replay rate, messages per second.
pub const DEFAULT_RATE: f64 = 100.0;
/// Default canary size.
pub const DEFAULT_CANARY: u32 = 10;
/// Default wait for the canary's outcome.
pub const DEFAULT_CANARY_WAIT: Duration = Duration::from_secs(30);
/// Default share of replayed letters that may come back before the job stops.
pub const DEFAULT_MAX_REFAIL: f64 = 0.10;
/// Default replay-loop guard: letters already replayed this often are skipped.
pub const DEFAULT_LOOP_GUARD: u32 = 3;
/// Default [`ReplayOptions::watch`]: comebacks are counted for an hour after a job ends.
pub const DEFAULT_WATCH: Duration = Duration::from_secs(3600);
/// How often a running job looks for letters that came back.
const REFAIL_CHECK: Duration = Duration::from_secs(1);

/// How a replay job is made and run.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReplayOptions {
    /// Send to this topic instead of each letter's original topic.
    pub to_topic: Option<String>,
    /// Messages per second (default [`DEFAULT_RATE`]).
    pub rate: f64,
    /// At most this many letters (oldest first).
    pub limit: Option<i64>,
    /// Letters sent first, before the rest waits for their outcome (0 skips the canary).
    pub canary: u32,
    /// How long to wait for the canary's outcome.
    pub canary_wait: Duration,
    /// Stop when more than this share of sent letters came back (0.1 = 10 %).
    pub max_refail: f64,
    /// Skip letters already replayed this many times.
    pub loop_guard: u32,
    /// Replay letters the loop guard would skip.
    pub force: bool,
    /// Allow an unselective filter (every new letter).
    pub all: bool,
    /// How long the groups reading the target topics keep processed marks (default 35 days,
    /// the cleanup default). Letters that first failed longer ago are refused.
    pub marks_retention: Duration,
    /// Replay decode, permanent and panic letters (the fix is deployed). Recorded in the audit.
    pub confirm_kinds: bool,
    /// Replay letters whose group has handled newer messages of their key since it
    /// dead-lettered them (it was not in strict order): each lands behind those. Recorded in
    /// the audit.
    pub confirm_order: bool,
    /// How long after the job ends a letter coming back to the DLQ still counts as its
    /// comeback (default [`DEFAULT_WATCH`]).
    pub watch: Duration,
    /// Replay letters older than `marks_retention` anyway: a group whose mark expired handles
    /// them again. Recorded in the audit row.
    pub accept_duplicates: bool,
    /// Who asked (audit).
    pub actor: String,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            to_topic: None,
            rate: DEFAULT_RATE,
            limit: None,
            canary: DEFAULT_CANARY,
            canary_wait: DEFAULT_CANARY_WAIT,
            max_refail: DEFAULT_MAX_REFAIL,
            loop_guard: DEFAULT_LOOP_GUARD,
            force: false,
            all: false,
            marks_retention: crate::cleanup::DEFAULT_PROCESSED_RETENTION,
            accept_duplicates: false,
            watch: DEFAULT_WATCH,
            confirm_kinds: false,
            confirm_order: false,
            actor: super::default_actor(),
        }
    }
}

impl ReplayOptions {
    fn validate(&self) -> Result<(), DlqError> {
        check_actor(&self.actor)?;
        if !(self.rate.is_finite() && (MIN_RATE..=MAX_RATE).contains(&self.rate)) {
            return invalid(format!(
                "invalid rate {}: give messages per second, {MIN_RATE} to {MAX_RATE}",
                self.rate
            ));
        }
        if !(self.max_refail.is_finite() && (0.0..=1.0).contains(&self.max_refail)) {
            return invalid(format!(
                "invalid max refail {}: give a share between 0 and 1 (0.1 = 10 %)",
                self.max_refail
            ));
        }
        if self.limit.is_some_and(|l| l < 1) {
            return invalid("invalid limit: give at least 1");
        }
        if let Some(t) = &self.to_topic {
            crate::topic::validate_topic(t).map_err(|e| DlqError::Invalid(e.to_string()))?;
        }
        if self.canary_wait > Duration::from_secs(24 * 3600) {
            return invalid("invalid canary wait: at most 24h");
        }
        Ok(())
    }
}

/// What a replay would do, changing nothing.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DryRun {
    /// Letters that would be sent.
    pub count: i64,
    /// Letters the loop guard would skip.
    pub skipped_loop_guard: i64,
    /// Letters older than the marks retention: the job needs `accept_duplicates`.
    pub older_than_marks: i64,
    /// Letters per kind a replay alone does not fix (decode, permanent, panic): the job needs
    /// `confirm_kinds`.
    pub risky_kinds: Vec<(String, i64)>,
    /// Letters whose group has handled a newer message of their key since it dead-lettered
    /// them (a group not in strict order): replayed, each lands behind newer events of its
    /// entity. The job needs `confirm_order`.
    pub passed_by_newer: i64,
    /// Their ids (at most 20).
    pub passed_sample: Vec<i64>,
    /// Letters per target topic.
    pub by_topic: Vec<(String, i64)>,
    /// Letters per consumer group that dead-lettered them, most first (at most 10; "" for
    /// none).
    pub by_group: Vec<(String, i64)>,
    /// Letters per cause (normalised error), most first (at most 10).
    pub by_cause: Vec<(String, i64)>,
    /// The first letters, oldest first (at most 20).
    pub sample: Vec<LetterRow>,
}

/// A replay job's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    /// Created, not started.
    Pending,
    /// Being run (or its runner died: resume it).
    Running,
    /// Paused by an operator, Ctrl-C or a failed canary; resumable.
    Paused,
    /// Cancelled; its unsent letters stay `new`.
    Cancelled,
    /// Stopped because too many letters came back.
    Stopped,
    /// Every letter sent (or failed/skipped).
    Completed,
}

impl JobStatus {
    fn parse(s: &str) -> Self {
        match s {
            "pending" => Self::Pending,
            "running" => Self::Running,
            "paused" => Self::Paused,
            "cancelled" => Self::Cancelled,
            "stopped" => Self::Stopped,
            _ => Self::Completed,
        }
    }
}

/// A replay job and its counts.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Job {
    /// Job id.
    pub id: i64,
    /// When it was created.
    pub created_at: String,
    /// Who created it.
    pub created_by: String,
    /// Its audit row.
    pub audit_id: i64,
    /// The selection and options, as applied.
    pub filter: Value,
    /// Target topic override.
    pub to_topic: Option<String>,
    /// Messages per second.
    pub rate: f64,
    /// Canary size.
    pub canary: i32,
    /// Canary wait in milliseconds.
    pub canary_wait_ms: i64,
    /// Whether the canary phase is over.
    pub canary_done: bool,
    /// Refail share that stops the job.
    pub max_refail: f64,
    /// State.
    pub status: JobStatus,
    /// Why it is in that state.
    pub status_reason: Option<String>,
    /// Last change.
    pub updated_at: String,
    /// Letters in the job.
    pub total: i64,
    /// Not yet sent.
    pub pending: i64,
    /// Sent and acknowledged.
    pub sent: i64,
    /// Could not be sent.
    pub failed: i64,
    /// Skipped by the loop guard.
    pub skipped: i64,
    /// Sent and dead-lettered again afterwards.
    pub came_back: i64,
    /// Paused by its canary: letters it sent came back, so the cause is not fixed. Cancel is
    /// the advice; resuming sends the rest into the same failure.
    pub canary_failed: bool,
}

/// One status a job took: its timeline on the job page.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct JobEvent {
    /// When (RFC 3339).
    pub at: String,
    /// The status it took.
    pub status: String,
    /// Why: who paused or cancelled it and their reason, what the canary saw.
    pub reason: Option<String>,
}

/// One letter of a job and what became of it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct JobItem {
    /// Send order, from 1.
    pub seq: i32,
    /// The dead letter it sends.
    pub letter: i64,
    /// `pending`, `sent`, `failed` or `skipped`.
    pub state: String,
    /// When the broker acknowledged it.
    pub sent_at: Option<String>,
    /// Why it failed or was skipped.
    pub error: Option<String>,
    /// The dead letter it came back as.
    pub came_back_as: Option<i64>,
    /// When that comeback was linked.
    pub came_back_at: Option<String>,
    /// The comeback's error.
    pub came_back_error: Option<String>,
    /// Sent with an operator's edited body or headers (edit and retry).
    pub edited: bool,
    /// The letter's original topic.
    pub topic: String,
    /// The group that dead-lettered it.
    pub group: Option<String>,
    /// Its error kind.
    pub kind: Option<String>,
    /// Its cause (the normalised error).
    pub cause: Option<String>,
    /// Its message id.
    pub message_id: Option<String>,
}

/// How a runner takes a job up.
pub(crate) enum Start {
    /// Just created: a pause given before the runner started holds.
    New,
    /// Resumed (or first run by a caller that means it): paused → running, audited as
    /// `job-resume` by (actor, reason) when given.
    Resume(Option<(String, Option<String>)>),
}

/// The start of the status reason of a job its canary paused.
pub(crate) const CANARY_FAILED: &str = "canary: ";

/// A running job's counts, reported after each chunk.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Progress {
    /// The job.
    pub job_id: i64,
    /// Letters in the job (skipped ones included).
    pub total: u64,
    /// Sent and acknowledged (over the job's life).
    pub sent: u64,
    /// Could not be sent.
    pub failed: u64,
    /// Skipped by the loop guard.
    pub skipped: u64,
    /// Came back to the DLQ.
    pub came_back: u64,
}

/// How a run of a job ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", content = "reason", rename_all = "lowercase")]
pub enum RunOutcome {
    /// Every letter handled.
    Completed,
    /// Paused (operator, Ctrl-C, canary); resume later.
    Paused(String),
    /// Cancelled by an operator.
    Cancelled,
    /// Stopped: too many letters came back.
    Stopped(String),
}
