//! # outbox
//!
//! Lossless event publishing from Postgres to Kafka (the transactional outbox and its relay)
//! and idempotent event handling.
//!
//! A service writes its business change and an outbox row in one transaction with
//! [`enqueue`]; the `outbox relay` sidecar ([`Relay`]) claims committed rows with
//! `FOR UPDATE SKIP LOCKED`, produces them with an idempotent producer (`acks=all`), waits for
//! the broker's acknowledgements and marks them `sent`. A rolled-back transaction publishes
//! nothing; a crash between ack and mark re-sends (at-least-once), never loses.
//!
//! ```no_run
//! # async fn demo(client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let tx = client.transaction().await?;
//! // ... the business change ...
//! let msg = outbox::Message::new("orders.created", "order_created", "A-1024",
//!                                serde_json::json!({"total": 1500}));
//! outbox::enqueue(&tx, &msg).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! | module | concept |
//! |---|---|
//! | `message` | [`Message`]: key = entity id, the four standard headers, JSON body |
//! | `topic` | [`validate_topic`]: seed 002's topic naming rules |
//! | `topics` | [`topics::apply_file`]: topics as code (main, retry chain, DLQ) |
//! | `schema` | [`Schema`]: the validated Postgres schema holding the tables |
//! | `sql` | every SQL statement, rendered once per schema |
//! | `enqueue` | [`enqueue`], [`enqueue_batch`], [`Enqueuer`]: write in the caller's transaction |
//! | `migrate` | [`migrate()`]: embedded refinery migrations (`migrations/`) |
//! | `relay` | [`Relay`]: take → send → mark, [`Relay::run_once`]; `relay/pipeline.rs`: batches overlapped, [`Relay::run_pipeline`] and [`Relay::run`]; `relay/reports.rs`: delivery reports filed per batch |
//! | `consumer` | [`consumer::Consumer`]: idempotent handlers, offsets, retries, dead letters, commit groups (`consumer/group.rs`); [`consumer::Inbox`] |
//! | `dlq` | [`dlq::Dlq`]: the dead-letter archive, summary by cause, replay jobs, drop, audit; [`dlq::Archiver`] |
//! | `metrics` | Prometheus metric names, the recorder and `/metrics` ([`metrics::serve`], [`metrics::router`]) |
//! | `trace` | W3C `traceparent`: carried to Kafka, parent of the consumer's handler span |
//! | `admin` | `outbox admin`: the HTTP admin API with bearer tokens and roles, the dashboard, `/metrics` |
//! | `cleanup` | [`cleanup()`]: retention deletes in bounded batches |
//! | `status` | [`status()`] and [`requeue`]: operator views and repair |
//! | `config` | [`DbConfig`], [`KafkaConfig`], [`RelayConfig`], [`CleanupConfig`] with named defaults |
//! | `lanes` | ordering lanes: advisory-lock ownership so per-key order holds across relays |
//! | `floor` | the claim floor: where a claim may start so held snapshots do not slow it; the sweep |
//! | `outage` | one log line per outage (start, once a minute, end) instead of one per retry |
//! | `backoff` | [`Backoff`]: capped exponential backoff for outages |
//! | `classify` | transient vs permanent errors (seed 001's table) |
//! | `db` | connection pool and single connections |
//!
//! The binary (`src/bin/outbox.rs`) only parses arguments and calls these.

#![warn(missing_docs)]

pub mod admin;
mod backoff;
pub mod classify;
mod cleanup;
mod config;
pub mod consumer;
mod db;
pub mod dlq;
mod enqueue;
mod floor;
mod lanes;
mod message;
pub mod metrics;
mod migrate;
mod outage;
mod relay;
mod schema;
mod sql;
mod status;
mod topic;
pub mod topics;
pub mod trace;

pub use backoff::{Backoff, DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_MAX};
pub use cleanup::{cleanup, cleanup_with_progress, CleanupError, CleanupReport};
pub use config::*;
pub use db::{connect, pool};
pub use enqueue::{enqueue, enqueue_batch, EnqueueError, Enqueuer};
pub use lanes::{DEFAULT_REBALANCE_INTERVAL, LANES};
pub use message::{
    rfc3339, Message, HEADER_ENTITY_ID, HEADER_MESSAGE_ID, HEADER_MESSAGE_TYPE, HEADER_TIMESTAMP,
    STANDARD_HEADERS,
};
pub use migrate::{embedded_migrations, migrate, MigrateError, MigrateReport};
pub use relay::{BatchReport, Outcome, Relay, RelayError, MAX_ERROR_LEN};
pub use schema::{InvalidSchema, Schema, DEFAULT_SCHEMA};
pub use status::{requeue, status, FailedGroup, OpenBreakerRow, Requeue, Status, StatusCount};
pub use topic::{validate_topic, InvalidTopic, MAX_TOPIC_LEN};

/// The relay's and cleanup's hot statements for `schema`, by name, for plan inspection
/// (`EXPLAIN`) in tests and benchmarks. Not a stable API.
#[doc(hidden)]
pub fn hot_statements(schema: &Schema) -> Vec<(&'static str, String)> {
    hot_statements_of(schema)
}

/// The session settings of the relay's connections (see `sql::PLAN_SETTINGS`), for tests that
/// explain its statements as it runs them. Not a stable API.
#[doc(hidden)]
pub fn relay_session_settings() -> &'static str {
    sql::PLAN_SETTINGS
}

fn hot_statements_of(schema: &Schema) -> Vec<(&'static str, String)> {
    let s = sql::Statements::new(schema);
    vec![
        ("claim", s.claim),
        ("claim_free", s.claim_free),
        ("first_pending", s.first_pending),
        ("sample", s.sample),
        ("left_behind", s.left_behind),
        ("sweep", s.sweep),
        ("mark_sent", s.mark_sent),
        ("mark_failed", s.mark_failed),
        ("cleanup_outbox", s.cleanup_outbox),
        ("cleanup_processed", s.cleanup_processed),
    ]
}
