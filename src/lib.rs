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
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | *(none)* | — | the core: [`Message`], [`enqueue`], [`migrate()`], [`DbConfig`], [`wire`], [`cleanup()`], [`status::status()`] — Postgres only, no Kafka client |
//! | `tls` | yes | TLS to Postgres through OpenSSL (`sslmode=require`, `verify-ca`, `verify-full`) |
//! | `kafka` | yes (by the parts below) | librdkafka clients, [`KafkaConfig`] producers, [`topics`] as code |
//! | `relay` | yes | [`Relay`]: claim, produce, mark; ordering lanes, the claim floor, the sweep |
//! | `consumer` | yes | [`consumer`]: idempotent handlers, retries, dead letters, the shared breaker |
//! | `dlq` | yes | [`dlq`]: the dead-letter archive, summary, replay jobs, drop, audit |
//! | `prometheus` | yes (by `admin`) | [`metrics::install`], [`metrics::router`], [`metrics::serve`] |
//! | `admin` | yes | [`admin`]: the HTTP admin API and the dashboard |
//! | `schemas` | no | `outbox::schemas`: per-topic Avro, Protobuf and JSON Schema in the Confluent wire format through a schema registry; the contract checked by `enqueue` (`Enqueuer::with_schemas`), encoded by the relay, decoded by the consumer |
//! | `sqlx` | no | `outbox::sqlx` (enqueue into an sqlx transaction), `Inbox::mark_sqlx`, and with `consumer` handler transactions on the service's `PgPool` (`consumer::Consumer::sqlx`) |
//!
//! A service that only writes events depends on
//! `outbox = { version = "…", default-features = false }` (add `features = ["tls"]` for TLS):
//! its build holds no librdkafka, HTTP server or CLI crates.
//!
//! # Layout
//!
//! The modules form a one-way graph: core ← `kafka` ← {`relay`, `dlq`} ← `consumer`;
//! {`relay`, `dlq`} ← `admin`. `tests/ops/layout.rs` fails on a cycle between them, and on a
//! file this map does not name.
//!
//! | module | feature | concept |
//! |---|---|---|
//! | `message` | core | [`Message`]: key = entity id, the four standard headers, JSON body |
//! | `topic` | core | [`wire::validate_topic`]: the topic naming rules |
//! | `schema` | core | [`Schema`]: the validated Postgres schema holding the tables |
//! | `sql` | core | every statement, grouped by table (`sql/outbox.rs`, `ring.rs` the append-only storage, `tenants.rs` a fleet's registry, `marks.rs`, `dead_letters.rs`, `replay_jobs.rs`, `holds.rs` strict per-key order's holds, `breakers.rs`, `instances.rs`, `locks.rs`), each with its reason |
//! | `enqueue` | core | [`enqueue`], [`enqueue_batch`], [`Enqueuer`]: write in the caller's transaction |
//! | `migrate` | core | [`migrate()`]: the embedded migrations (`migrations/`), kept in refinery's history table |
//! | `wire` | core | [`wire`]: framework headers, dead-letter kinds, retry-topic names, archived headers |
//! | `config` | core | [`DbConfig`], [`KafkaConfig`] (plain settings; the Kafka client comes with `kafka`) |
//! | `cleanup` | core | [`cleanup()`], [`CleanupConfig`]: retention deletes in bounded batches; on ring storage it rotates instead |
//! | `storage` | core | [`storage::use_ring`]: which storage a schema is on, and its online move onto append-only ring storage |
//! | `rotate` | core | ring storage's rotation: generations moved on and settled leaves reclaimed whole (TRUNCATE), each step its own transaction (private) |
//! | `status` | core | [`status::status()`] and [`status::requeue`]: operator views and repair |
//! | `instances` | core | [`instances::overview`]: heartbeats of every relay, consumer and archiver; breakers opened or closed by hand |
//! | `verdict` | core | [`verdict::verdicts`]: ok / warn / bad per part of the system, from the alert rules' thresholds, in words |
//! | `journey` | core | [`journey::trace`]: one message's journey (outbox row, each group's outcome, replays, audit) |
//! | `republish` | core | [`republish::requeue_sent`]: publish sent rows again (a topic lost by the broker) |
//! | `moved` | core | the names the root published before it kept only what a service uses (at most 30): deprecated aliases (and `consumer/moved.rs` for the consumer's old default constants) |
//! | `metrics` | core / `prometheus` | metric names; the recorder and `/metrics` with `prometheus` (`exporter.rs`) |
//! | `trace_context` | core | W3C `traceparent` (and its `tracestate`): carried to Kafka, parent of the consumer's handler span (`trace`, its old name, is a deprecated alias) |
//! | `health` | core | [`health::Health`]: liveness (loops beat) and readiness (dependencies looked at), served as `/healthz` and `/readyz` |
//! | `otel` | core / `otel` | OpenTelemetry spans by the messaging conventions v1.45 (`create`, `send`, `outbox wait`, `process`, `commit`, `replay`) through the API only; no-ops without the feature or a provider; [`otel::TraceParenting`] |
//! | `classify` | core | transient vs permanent Postgres errors (tokio-postgres and sqlx) |
//! | `sqlx` | `sqlx` | `outbox::sqlx::enqueue` into an sqlx transaction or connection; the consumer's sqlx driver lives in `consumer/driver/sqlx.rs`, its handler traits in `consumer/sqlx.rs` |
//! | `schemas` | `schemas` | `schemas::Schemas`: the registry client and its caches (`registry.rs`), the Confluent frame (`frame.rs`), one file per format (`avro.rs` over `binary.rs`'s primitives, `protobuf.rs`, `json_schema.rs`), schema files for `outbox schemas register/check` (`files.rs`), the parsers the property tests reach (`probe.rs`) |
//! | `db`, `backoff`, `outage`, `crash` | core | connections; capped backoff; one log line per outage; `OUTBOX_CRASH_AT`, the kill -9 test hook (private) |
//! | `kafka` | `kafka` | the idempotent producer preset, librdkafka callbacks, typed refusal reasons (private) |
//! | `topics` | `kafka` | [`topics::apply_file`]: topics as code (main, retry chain, DLQ): the plan (`mod.rs`), applied to the broker (`apply.rs`) |
//! | `relay` | `relay` | [`Relay`]: take → send → mark (`mod.rs`); `batch.rs` claimed rows and their fates, `producer.rs` its settings and error meanings, `reports.rs` delivery reports, `poll_thread.rs` the producers' polling thread, `pipeline.rs` batches overlapped, `tasks.rs` `run` and the background loops, `lanes.rs`, `floor.rs`, `config.rs`, `error.rs`, `send.rs` a batch handed to librdkafka and its fates, `exactly_once.rs` (exactly-once: a transactional producer per slot of lanes, the two-deep pipeline), `progress.rs` (progress records, fencing and recovery), `ring.rs` (append-only storage: read from the lanes' cursors, move them, copy what needs another attempt into the retry table), `schemas.rs` rows of topics with a schema encoded, `gate.rs` a fleet's gate (who runs the next pass: start-time fair queuing over tenants) and its tenants' gauges (labels capped) |
//! | `fleet` | core; `relay` for the fleet | one relay for many outboxes — the registry of tenants (`registry.rs`, `outbox_tenants`: core, a consumer routing by tenant reads it too), [`fleet::Fleet`] (`run.rs`, `relay`): a [`Relay`] per distinct outbox of the registry or a discovery rule, started and stopped as the registry changes, their passes shared fairly through the relay's gate; `shared.rs` what its relays of one database share (a pool, a lane-lock session, a LISTEN session) |
//! | `consumer` | `consumer` | [`consumer::Consumer`] (`mod.rs`), `config.rs` its settings, `setup.rs` what it builds before it runs, `handler.rs` what a handler sees and returns (the tokio-postgres handler traits), `sqlx.rs` the sqlx handler traits; `driver/` the one transaction interface (`driver/mod.rs`: every recipe — a message, a batch, a commit group, answered calls' marks — written once) with its tokio-postgres (`driver/pg.rs`) and sqlx (`driver/sqlx.rs`) implementations; `process.rs` the one processing path (tries, retries, parking, dead letters) for main-topic messages and drained letters, `letters.rs` what leaves it (dead letters until acknowledged, parked letters, the archive's settled rows), `inbox.rs` the marks, `commit_group.rs` commit groups, `offsets.rs` the offset to commit per partition, `retry.rs` retry strategies, `record.rs` where a record came from, `dead_letter.rs` retry and dead-letter headers and the dead-letter log, `schemas.rs` framed records decoded, `stats.rs` counters, `upkeep.rs` its marks' cleanup; strict per-key order: `holds.rs` (which keys are held; a failed head holds its key) and `held.rs` (messages waiting behind a head, let through when it is resolved, and the holds' upkeep); `call.rs` call handlers' runtime (the call outside any transaction) and their mark writers; `tenants.rs` routing by tenant (a message's `x-tenant` resolved through the fleet's registry to the database and schema its transaction and mark run in); `harness.rs` handlers run through the real path without a broker (`Consumer::harness`); `runtime.rs` the poll loop, `dispatch.rs` lanes to handler tasks, `context.rs` librdkafka callbacks; `envelope.rs` the data every stage passes along (a record on its way, its fate, a task's outcome), `tx.rs` what every handler try uses (the span, the timing, the counters), `moved.rs` its old default constants (deprecated); the shared breaker: its row, state and mode machine (`breaker.rs`, which decides), the runtime applying its decisions (`steer.rs`), the drain's policies and freshness check (`drain.rs`) |
//! | `dlq` | `dlq` | [`dlq::Dlq`]: the archiver (`archive.rs`, [`dlq::Archiver`]), the selection (`filter.rs`), errors grouped by cause (`normalize.rs`), read-only views and the audit log (`query.rs`), drop, restore and purge (`drop.rs`), held keys for operators (`holds.rs`), headers on the way back (`headers.rs`), replay straight from a topic (`from_topic.rs`), replay jobs (`replay/`: `select.rs` the selection and dry run, `runner.rs` sending and marking, `pacer.rs` the rate, `state.rs` a job's state, timeline and items, `edit.rs` edit and retry) |
//! | `admin` | `admin` | the HTTP admin API with bearer tokens and roles (`auth.rs`), the route table (`mod.rs`), `handlers.rs`, `jobs.rs` (replay jobs: timeline, items, audited pause/resume/cancel), `edit.rs` (edit and retry, through the topic's schema when known), `trace.rs` (a message's journey: ids for viewers, contents for operators), the dashboard (`ui/`: `app.js` views, `words.js` times, plurals and audit rows in words, `jobs.js` the jobs and a job's page, `edit.js` the editor, served as one script), `/metrics`; `server.rs` the server's options and middleware (in-flight limit, `Host` allow-list, panics answered 500), `input.rs` strict JSON bodies and query strings, `ready.rs` `/readyz` from the server's last look |
//! | `serve` | `prometheus` | HTTP/1 serving with bounds (connection cap, header and idle timeouts) for the admin server and the `/metrics` listener (private) |
//! | `proptests` | tests only | property tests of every parser that faces input (headers, filters, instants, bodies, frames, registry answers, Avro and Protobuf datums) |
//!
//! The `outbox` binary lives in its own package (`crates/outbox-cli`), so its dependencies
//! never reach a service that embeds the library.

#![warn(missing_docs)]
// Helpers shared by several parts are unused when only some parts are built; the full build
// (the default features) still reports dead code.
#![cfg_attr(
    not(all(feature = "relay", feature = "consumer", feature = "admin")),
    allow(dead_code, unused_imports, rustdoc::broken_intra_doc_links)
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "admin")]
pub mod admin;
mod backoff;
pub mod classify;
mod cleanup;
mod config;
#[cfg(feature = "consumer")]
pub mod consumer;
mod crash;
mod db;
#[cfg(feature = "dlq")]
pub mod dlq;
mod enqueue;
pub mod fleet;
pub mod health;
pub mod instances;
pub mod journey;
#[cfg(feature = "kafka")]
mod kafka;
mod message;
pub mod metrics;
mod migrate;
pub mod otel;
mod outage;
#[cfg(feature = "relay")]
mod relay;
pub mod republish;
mod rotate;
mod schema;
#[cfg(feature = "schemas")]
pub mod schemas;
pub mod storage;
pub mod verdict;

/// The schema id of a payload in the Confluent wire format (magic byte 0, 4-byte id); a JSON
/// text never starts with byte 0.
#[cfg_attr(not(feature = "consumer"), allow(dead_code))]
pub(crate) fn schemas_frame_id(payload: &[u8]) -> Option<u32> {
    (payload.len() >= 5 && payload[0] == 0)
        .then(|| u32::from_be_bytes([payload[1], payload[2], payload[3], payload[4]]))
}
mod sql;
#[cfg(feature = "sqlx")]
pub mod sqlx;
pub mod status;
mod topic;
#[cfg(feature = "kafka")]
pub mod topics;
/// Renamed [`trace_context`]: W3C trace context, not to be confused with [`journey::trace`]
/// (a message's journey).
#[deprecated(since = "0.2.0", note = "renamed `outbox::trace_context`")]
pub mod trace {
    pub use crate::trace_context::*;
}
pub mod trace_context;
pub mod wire;

#[cfg(test)]
mod proptests;
#[cfg(feature = "prometheus")]
mod serve;

pub use cleanup::{cleanup, cleanup_with_progress, CleanupConfig, CleanupError, CleanupReport};
pub use config::{ConfigError, DbConfig, KafkaConfig, TlsVerify};
pub use db::connect;
pub use enqueue::{enqueue, enqueue_batch, EnqueueError, Enqueuer};
#[cfg(feature = "kafka")]
pub use kafka::RefusalReason;
pub use message::{parse_instant, InvalidInstant, Message};
pub use migrate::{embedded_migrations, migrate, MigrateError, MigrateReport};
#[cfg(feature = "relay")]
pub use relay::{BatchReport, ExactlyOnce, Outcome, Relay, RelayConfig, RelayError};
pub use schema::{InvalidSchema, Schema};
// What the root held before it kept only what a service uses: deprecated aliases.
mod moved;
#[allow(deprecated)]
pub use moved::*;

/// Hooks for the project's own tests and benchmarks: plan inspection and fault injection.
/// Not part of the stable API: anything here may change in any release.
#[doc(hidden)]
pub mod testing {
    use crate::schema::Schema;
    use crate::sql;

    /// The relay's and cleanup's hot statements for `schema`, by name, for `EXPLAIN`.
    pub fn hot_statements(schema: &Schema) -> Vec<(&'static str, String)> {
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
            ("ring_read", s.ring_read),
            ("ring_sample", s.ring_sample),
            ("ring_advance_lanes", s.ring_advance_lanes),
            ("ring_gauges", s.ring_gauges),
            ("ring_claim_retry", s.ring_claim_retry),
        ]
    }

    /// The session settings of the relay's connections, for tests that explain its
    /// statements as it runs them.
    pub fn relay_session_settings() -> &'static str {
        sql::PLAN_SETTINGS
    }

    /// Formats a time as RFC 3339 UTC with a `Z`, as the `timestamp` header carries it.
    pub fn rfc3339(t: std::time::SystemTime) -> String {
        crate::message::rfc3339(t)
    }

    /// The checksum the migration runner records for migration `name` (`V1__outbox`) with
    /// contents `sql`; `None` when the name is not `V{n}__{name}`.
    pub fn migration_checksum(name: &str, sql: &str) -> Option<u64> {
        crate::migrate::checksum_of(name, sql)
    }

    /// The number of ordering lanes the relays share.
    #[cfg(feature = "relay")]
    pub const LANES: i32 = crate::relay::LANES;

    /// A handle reading the relay's claim floor after the relay has been moved into `run`.
    #[cfg(feature = "relay")]
    pub fn floor_probe(relay: &crate::Relay) -> impl Fn() -> i64 + Send + Sync + 'static {
        relay.floor_probe()
    }

    /// The relay's connection pool, for tests that query alongside it.
    #[cfg(feature = "relay")]
    pub fn relay_pool(relay: &crate::Relay) -> &deadpool_postgres::Pool {
        relay.pool()
    }

    /// Makes the relay refuse each row with this probability ("injected produce failure"),
    /// to exercise the backoff path.
    #[cfg(feature = "relay")]
    pub fn inject_refusals(relay: &crate::Relay, probability: f64) {
        relay.inject_refusals(probability);
    }

    /// How many rows [`inject_refusals`] has refused so far, as a handle that stays valid
    /// after the relay is moved into [`Relay::run`](crate::Relay::run).
    #[cfg(feature = "relay")]
    pub fn injected_refusals(relay: &crate::Relay) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        relay.injected_refusals()
    }
}
