//! Every SQL statement the library runs, grouped by the table it is about, each with its
//! reason: `outbox` (the relay, enqueue, cleanup, status), `marks` (`processed_messages`,
//! `dead_lettered`), `dead_letters` (the archive and its audit), `replay_jobs`, `breakers`
//! (`circuit_breakers`), `locks` (the advisory locks relays and replay runners share) and
//! `ring` (the append-only storage: the ring's reads, the lanes' cursors, the retry table),
//! `tenants` (a relay fleet's registry).
//! The migration runner's own history statements stay with it (`migrate.rs`), and the admin
//! server's readiness probe is a bare `SELECT 1`.
//!
//! Statements are templates with `{s}` standing for the quoted schema. The outbox's are
//! rendered once per relay ([`Statements::new`]) so the hot paths only borrow strings; the
//! others with [`render`] where they are used. A few DLQ statements also take a `{where}`
//! (and `{limit}`, `{to}`, `{reason}`) that the DLQ filter renders with numbered parameters,
//! never with values. `tests/relay/plans.rs` explains the hot ones.

use crate::schema::Schema;

pub(crate) mod breakers;
pub(crate) mod dead_letters;
pub(crate) mod holds;
pub(crate) mod instances;
pub(crate) mod locks;
pub(crate) mod marks;
pub(crate) mod outbox;
pub(crate) mod replay_jobs;
pub(crate) mod ring;
#[cfg_attr(not(feature = "relay"), allow(dead_code))]
pub(crate) mod tenants;

use outbox::*;

/// A statement of the table modules with its schema filled in.
pub(crate) fn render(template: &str, schema: &Schema) -> String {
    template.replace("{s}", &schema.quoted())
}

/// Wakes the relays of a schema: `$1` its channel ([`Schema::notify_channel`]), `$2` the
/// payload (`rewind` after a requeue: rows below the claim floors are pending again).
pub(crate) const NOTIFY: &str = "SELECT pg_notify($1, $2)";

/// The statements of one schema, rendered.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    pub claim: String,
    pub claim_free: String,
    pub first_pending: String,
    pub sample: String,
    pub sample_lean: String,
    pub left_behind: String,
    pub sweep: String,
    pub mark_sent: String,
    pub recover_sent: String,
    pub mark_failed: String,
    pub enqueue: String,
    pub enqueue_batch: String,
    pub cleanup_outbox: String,
    pub cleanup_legacy: String,
    pub cleanup_processed: String,
    pub cleanup_dead_lettered: String,
    pub cleanup_dead_letters: String,
    pub gauges: String,
    pub status_counts: String,
    pub oldest_pending_age: String,
    pub failed_by_error: String,
    pub requeue_failed: String,
    pub requeue_id: String,
    pub open_breakers: String,
    pub ring_layout: String,
    pub ring_sample: String,
    pub ring_sample_known: String,
    pub ring_read: String,
    pub ring_read_passing: String,
    pub ring_begin_held: String,
    pub ring_recheck: String,
    pub ring_claim_retry: String,
    pub ring_retry_keys: String,
    pub ring_retry_sent: String,
    pub ring_retry_failed: String,
    pub ring_advance: String,
    pub ring_advance_lanes: String,
    pub ring_rotation_state: String,
    pub ring_recover: String,
    pub ring_pass: String,
    pub ring_gauges: String,
    pub ring_writers: String,
    pub ring_passed: String,
    pub ring_unpass: String,
    pub ring_hold_cursors: String,
    pub ring_copy_passed: String,
}

impl Statements {
    /// Renders every statement for `schema`.
    pub fn new(schema: &Schema) -> Self {
        let q = schema.quoted();
        let r = |t: &str| t.replace("{s}", &q);
        let marks = |t: &str, at: &str| marks::CLEANUP.replace("{t}", t).replace("{at}", at);
        let qualified_prefix = format!("{q}.");
        Self {
            claim: r(CLAIM),
            claim_free: r(CLAIM_FREE),
            first_pending: r(FIRST_PENDING),
            sample: r(SAMPLE),
            sample_lean: r(SAMPLE_LEAN),
            left_behind: r(LEFT_BEHIND),
            sweep: r(SWEEP),
            mark_sent: r(MARK_SENT),
            recover_sent: r(RECOVER_SENT),
            mark_failed: r(MARK_FAILED),
            enqueue: ENQUEUE.replace("{s}", &qualified_prefix),
            enqueue_batch: ENQUEUE_BATCH.replace("{s}", &qualified_prefix),
            cleanup_outbox: r(CLEANUP_OUTBOX),
            cleanup_legacy: r(&ring::cleanup_legacy()),
            cleanup_processed: r(&marks("processed_messages", "processed_at")),
            cleanup_dead_lettered: r(&marks("dead_lettered", "dead_lettered_at")),
            cleanup_dead_letters: r(dead_letters::PURGE),
            gauges: r(GAUGES),
            status_counts: r(STATUS_COUNTS),
            oldest_pending_age: r(OLDEST_PENDING_AGE),
            failed_by_error: r(FAILED_BY_ERROR),
            requeue_failed: r(REQUEUE_FAILED),
            requeue_id: r(REQUEUE_ID),
            open_breakers: r(breakers::OPEN_ALL),
            ring_layout: r(ring::LAYOUT),
            ring_sample: r(ring::SAMPLE),
            ring_sample_known: r(ring::SAMPLE_KNOWN),
            ring_read: r(ring::READ),
            ring_read_passing: r(&ring::read_passing()),
            ring_begin_held: r(ring::BEGIN_HELD),
            ring_recheck: r(ring::RECHECK),
            ring_claim_retry: r(ring::CLAIM_RETRY),
            ring_retry_keys: r(ring::RETRY_KEYS),
            ring_retry_sent: r(ring::RETRY_SENT),
            ring_retry_failed: r(&ring::retry_failed()),
            ring_advance: r(ring::ADVANCE),
            ring_advance_lanes: r(ring::ADVANCE_LANES),
            ring_rotation_state: r(&ring::rotation_state()),
            ring_recover: r(ring::RECOVER),
            ring_pass: r(ring::PASS),
            ring_gauges: r(ring::GAUGES),
            ring_writers: r(ring::RING_WRITERS),
            ring_passed: r(ring::PASSED),
            ring_unpass: r(ring::UNPASS),
            ring_hold_cursors: r(ring::HOLD_CURSORS),
            ring_copy_passed: r(ring::COPY_PASSED),
        }
    }

    /// The enqueue statements with an unqualified table name, resolved by the caller's
    /// `search_path` like the plain-SQL path in `sql/enqueue.sql`.
    pub fn unqualified_enqueue() -> (String, String) {
        (ENQUEUE.replace("{s}", ""), ENQUEUE_BATCH.replace("{s}", ""))
    }
}

/// Exactly-once recovery waits at most this long for row locks (a frozen previous owner's)
/// before it gives up for this pass.
pub(crate) const RECOVER_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '5s'";

/// Session settings of the relay's connections: the planner may only use index scans and
/// nested loops, so no hot statement changes shape with the table's statistics (a never-
/// analyzed outbox with a backlog otherwise gets a bitmap scan of every pending row, a
/// per-row probe over all of them and a sort, measured at 15 s per claim). Every relay
/// statement is written for an index; the settings make that the only plan. JIT is off: a
/// disabled node that remains (a one-row table's scan) adds 10^10 to a plan's cost, far past
/// `jit_above_cost`, and compiling the plan took 200 – 300 ms of a 1 ms statement (measured on
/// ring storage's sample, `benches/wal.rs`).
pub(crate) const PLAN_SETTINGS: &str = "-c enable_seqscan=off -c enable_bitmapscan=off \
    -c enable_sort=off -c enable_hashjoin=off -c enable_mergejoin=off -c enable_hashagg=off \
    -c jit=off";
