//! Error classification shared by every boundary: is retrying worth it?
//!
//! The rule: timeouts, connection errors, serialization failures (`40001`), deadlocks
//! (`40P01`), too many connections (`53300`) are transient; constraint violations, bad data and
//! type errors are permanent.

use tokio_postgres::error::SqlState;

/// True when a Postgres error is worth retrying: the connection broke or was refused, or the
/// server reported a serialization failure, deadlock, resource shortage or shutdown.
pub fn postgres_is_transient(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        Some(code) => {
            *code == SqlState::T_R_SERIALIZATION_FAILURE
                || *code == SqlState::T_R_DEADLOCK_DETECTED
                || *code == SqlState::TOO_MANY_CONNECTIONS
                || *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CRASH_SHUTDOWN
                || *code == SqlState::CANNOT_CONNECT_NOW
                || *code == SqlState::LOCK_NOT_AVAILABLE
                || *code == SqlState::QUERY_CANCELED
                || code.code().starts_with("08") // connection exception class
                || code.code().starts_with("53") // insufficient resources class
        }
        // No SQLSTATE: the connection itself failed (I/O, closed, timeout).
        None => e.is_closed() || std::error::Error::source(e).is_some(),
    }
}

/// True when the error means the server is unreachable rather than the statement failing:
/// connection refused/lost/closed, SQLSTATE class `08`, or the server shutting down
/// (`57P01`, `57P02`, `57P03`).
pub fn postgres_is_unavailable(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        Some(code) => {
            code.code().starts_with("08")
                || *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CRASH_SHUTDOWN
                || *code == SqlState::CANNOT_CONNECT_NOW
        }
        None => {
            e.is_closed() || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
        }
    }
}
