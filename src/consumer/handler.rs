//! What a handler sees and returns: the decoded message and a typed outcome.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

/// A boxed, sendable future, the return type of [`Handler::handle`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Whether retrying can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Retry (in place or through the retry topics); dead-lettered once retries are exhausted.
    Transient,
    /// Dead-letter now: retrying cannot help (bad data, validation, constraint violation).
    Permanent,
}

/// A handler failure, classified.
///
/// Built with [`HandlerError::transient`] / [`HandlerError::permanent`], or converted with `?`
/// from errors the library can classify (seed 001's table): Postgres errors by SQLSTATE
/// (`40001`, `40P01`, `53300`, connection failures ⇒ transient; constraint violations, bad data
/// ⇒ permanent), I/O errors by kind (timeouts, refused/reset connections ⇒ transient),
/// JSON errors ⇒ permanent. HTTP statuses: [`HandlerError::from_http_status`].
#[derive(Debug)]
pub struct HandlerError {
    kind: ErrorKind,
    message: String,
    unavailable: bool,
}

impl HandlerError {
    /// A failure worth retrying.
    pub fn transient(message: impl fmt::Display) -> Self {
        Self {
            kind: ErrorKind::Transient,
            message: message.to_string(),
            unavailable: false,
        }
    }

    /// A failure that retrying cannot fix.
    pub fn permanent(message: impl fmt::Display) -> Self {
        Self {
            kind: ErrorKind::Permanent,
            message: message.to_string(),
            unavailable: false,
        }
    }

    /// The consumer's own database is unreachable (connection refused or lost, server shutting
    /// down). The runtime waits it out with capped backoff *without* spending the message's
    /// retry budget: an outage must not push healthy messages into the dead-letter topic.
    pub fn unavailable(message: impl fmt::Display) -> Self {
        Self {
            kind: ErrorKind::Transient,
            message: message.to_string(),
            unavailable: true,
        }
    }

    /// True for [`HandlerError::unavailable`] errors (and Postgres connection failures
    /// converted with `?`).
    pub fn is_unavailable(&self) -> bool {
        self.unavailable
    }

    /// Classifies an HTTP response status from a downstream API: 408, 425, 429 and 5xx are
    /// transient; other 4xx are permanent.
    pub fn from_http_status(status: u16, message: impl fmt::Display) -> Self {
        if matches!(status, 408 | 425 | 429) || status >= 500 {
            Self::transient(format!("HTTP {status}: {message}"))
        } else {
            Self::permanent(format!("HTTP {status}: {message}"))
        }
    }

    /// The classification.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// True for [`ErrorKind::Transient`].
    pub fn is_transient(&self) -> bool {
        self.kind == ErrorKind::Transient
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for HandlerError {}

impl From<tokio_postgres::Error> for HandlerError {
    fn from(e: tokio_postgres::Error) -> Self {
        let text = match e.as_db_error() {
            Some(db) => format!("postgres {}: {}", db.code().code(), db.message()),
            None => format!("postgres: {e}"),
        };
        if crate::classify::postgres_is_unavailable(&e) {
            Self::unavailable(text)
        } else if crate::classify::postgres_is_transient(&e) {
            Self::transient(text)
        } else {
            Self::permanent(text)
        }
    }
}

impl From<std::io::Error> for HandlerError {
    fn from(e: std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        match e.kind() {
            K::TimedOut
            | K::ConnectionRefused
            | K::ConnectionReset
            | K::ConnectionAborted
            | K::NotConnected
            | K::BrokenPipe
            | K::Interrupted
            | K::WouldBlock
            | K::UnexpectedEof
            | K::AddrNotAvailable => Self::transient(format!("io: {e}")),
            _ => Self::permanent(format!("io: {e}")),
        }
    }
}

impl From<serde_json::Error> for HandlerError {
    fn from(e: serde_json::Error) -> Self {
        Self::permanent(format!("json: {e}"))
    }
}

impl From<tokio::time::error::Elapsed> for HandlerError {
    fn from(e: tokio::time::error::Elapsed) -> Self {
        Self::transient(format!("timeout: {e}"))
    }
}

/// A consumed message, decoded and validated before any handler sees it.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// The topic the event was published to (for a message read from a retry topic, the
    /// original topic).
    pub topic: String,
    /// The topic actually read (a retry topic, or `topic`).
    pub source_topic: String,
    /// Partition read.
    pub partition: i32,
    /// Offset read.
    pub offset: i64,
    /// The key (the entity id), if any.
    pub key: Option<Vec<u8>>,
    /// Every header, in order, as sent.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The raw body.
    pub payload: Vec<u8>,
    /// The `message_type` header.
    pub message_type: String,
    /// The `message_id` header: the dedupe key.
    pub message_id: String,
    /// The body parsed as JSON.
    pub body: serde_json::Value,
    /// Retry-topic hops so far (`x-retry-attempt`), 0 on the main topic.
    pub retry_attempt: u32,
}

impl Delivered {
    /// The JSON body.
    pub fn json(&self) -> &serde_json::Value {
        &self.body
    }

    /// The first header named `name`, when it is valid UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The key as UTF-8, if any.
    pub fn key_str(&self) -> Option<&str> {
        self.key
            .as_deref()
            .and_then(|k| std::str::from_utf8(k).ok())
    }
}

/// An event handler: runs inside the Postgres transaction that also records the message in
/// `processed_messages`; returning `Ok` commits both, an error rolls both back.
///
/// Implement it on a struct, or pass a function item with the signature of
/// [`Handler::handle`]:
///
/// ```no_run
/// use outbox::consumer::{BoxFuture, Delivered, HandlerError};
/// fn charge<'a>(msg: &'a Delivered, tx: &'a tokio_postgres::Transaction<'a>)
///     -> BoxFuture<'a, Result<(), HandlerError>> {
///     Box::pin(async move {
///         let total = msg.json()["total_cents"].as_i64()
///             .ok_or_else(|| HandlerError::permanent("total_cents missing"))?;
///         tx.execute("INSERT INTO charges (amount_cents) VALUES ($1)", &[&total]).await?;
///         Ok(())
///     })
/// }
/// ```
pub trait Handler: Send + Sync + 'static {
    /// Handles one message within `tx`. Must not commit or roll back `tx` itself.
    fn handle<'a>(
        &'a self,
        msg: &'a Delivered,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

impl<F> Handler for F
where
    F: for<'a> Fn(
            &'a Delivered,
            &'a tokio_postgres::Transaction<'a>,
        ) -> BoxFuture<'a, Result<(), HandlerError>>
        + Send
        + Sync
        + 'static,
{
    fn handle<'a>(
        &'a self,
        msg: &'a Delivered,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        self(msg, tx)
    }
}

/// A handler that takes many messages in one transaction — the fast path for high-volume
/// streams (one commit per batch instead of per message).
///
/// The runtime gathers up to `max_batch` ready messages of one type (each the head of its key
/// lane, so per-key order holds), records them all in `processed_messages` with one multi-row
/// insert and passes only the first deliveries to `handle_batch`. If the batch fails, every
/// message is retried on its own (a batch of one) so one bad message cannot sink the others:
/// a permanent failure then dead-letters only that message.
pub trait BatchHandler: Send + Sync + 'static {
    /// Handles `msgs` (first deliveries only, never empty) within `tx`.
    fn handle_batch<'a>(
        &'a self,
        msgs: &'a [&'a Delivered],
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_and_io_classification() {
        assert!(HandlerError::from_http_status(503, "x").is_transient());
        assert!(HandlerError::from_http_status(429, "x").is_transient());
        assert!(!HandlerError::from_http_status(400, "x").is_transient());
        assert!(!HandlerError::from_http_status(404, "x").is_transient());
        let e: HandlerError = std::io::Error::from(std::io::ErrorKind::TimedOut).into();
        assert!(e.is_transient());
        let e: HandlerError = std::io::Error::from(std::io::ErrorKind::InvalidData).into();
        assert!(!e.is_transient());
        let e: HandlerError = serde_json::from_str::<i32>("x").unwrap_err().into();
        assert!(!e.is_transient());
    }
}
