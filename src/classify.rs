//! Error classification shared by every boundary: is retrying worth it?
//!
//! The rule, one case each in `tests/consumer/classify.rs` against a real Postgres:
//!
//! | error | class |
//! |---|---|
//! | serialization failure `40001`, deadlock `40P01` | transient: the same statement can succeed next time |
//! | too many connections `53300` (and class `53`: out of resources) | transient |
//! | admin shutdown `57P01`, crash shutdown `57P02`, cannot connect now `57P03` | transient (unavailable) |
//! | connection exception class `08`, a closed connection, an I/O error | transient (unavailable) |
//! | statement timeout (`57014`), lock not available (`55P03`) | transient |
//! | constraint violations (class `23`), data exceptions (class `22`), syntax and undefined objects (class `42`) | permanent: retrying repeats them |
//! | a column that does not convert to the Rust type asked for (no SQLSTATE) | permanent: a bug in the handler |

use tokio_postgres::error::SqlState;

/// True when a Postgres error is worth retrying: the connection broke or was refused, or the
/// server reported a serialization failure, deadlock, resource shortage or shutdown.
pub fn postgres_is_transient(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        Some(code) => sqlstate_is_transient(code.code()),
        // No SQLSTATE: either the connection itself failed (closed, or an I/O error underneath:
        // refused, reset, timed out) — or the client could not convert a value (a column read
        // as the wrong type), which no retry fixes.
        None => e.is_closed() || source_is_io(e),
    }
}

/// The SQLSTATE rule behind [`postgres_is_transient`], whichever driver reported the code.
pub(crate) fn sqlstate_is_transient(code: &str) -> bool {
    code == SqlState::T_R_SERIALIZATION_FAILURE.code()
        || code == SqlState::T_R_DEADLOCK_DETECTED.code()
        || code == SqlState::LOCK_NOT_AVAILABLE.code()
        || code == SqlState::QUERY_CANCELED.code()
        || code.starts_with("53") // insufficient resources class (too many connections too)
        || sqlstate_is_unavailable(code)
}

/// The SQLSTATE rule behind [`postgres_is_unavailable`].
pub(crate) fn sqlstate_is_unavailable(code: &str) -> bool {
    code.starts_with("08") // connection exception class
        || code == SqlState::ADMIN_SHUTDOWN.code()
        || code == SqlState::CRASH_SHUTDOWN.code()
        || code == SqlState::CANNOT_CONNECT_NOW.code()
}

/// True when the error means the server is unreachable rather than the statement failing:
/// connection refused/lost/closed, SQLSTATE class `08`, or the server shutting down
/// (`57P01`, `57P02`, `57P03`).
pub fn postgres_is_unavailable(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        Some(code) => sqlstate_is_unavailable(code.code()),
        None => e.is_closed() || source_is_io(e),
    }
}

/// The error wraps an I/O error: the transport failed, not the statement.
fn source_is_io(e: &tokio_postgres::Error) -> bool {
    std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
}

/// As [`postgres_is_transient`], for an sqlx error: the same SQLSTATE rule, and a transport
/// failure (I/O, TLS, a pool that timed out or closed, a broken protocol) is transient.
#[cfg(feature = "sqlx")]
pub fn sqlx_is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db.code().is_some_and(|c| sqlstate_is_transient(&c)),
        _ => sqlx_is_unavailable(e),
    }
}

/// As [`postgres_is_unavailable`], for an sqlx error.
#[cfg(feature = "sqlx")]
pub fn sqlx_is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db.code().is_some_and(|c| sqlstate_is_unavailable(&c)),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        _ => false,
    }
}
