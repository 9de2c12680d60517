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
/// from errors the library can classify: Postgres errors by SQLSTATE
/// (`40001`, `40P01`, `53300`, connection failures ⇒ transient; constraint violations, bad data
/// ⇒ permanent), I/O errors by kind (timeouts, refused/reset connections ⇒ transient),
/// JSON errors ⇒ permanent. HTTP statuses: [`HandlerError::from_http_status`].
#[derive(Debug)]
pub struct HandlerError {
    kind: ErrorKind,
    message: String,
    /// The consumer's own database is unreachable.
    database_unavailable: bool,
    /// The downstream dependency that is unavailable (drives the shared circuit breaker).
    dependency: Option<String>,
    /// The error says "the other side is not answering" (connection refused, timeout, HTTP
    /// 502/503/504): [`HandlerError::on`] turns it into an outage of the named dependency.
    availability: bool,
    /// The error this one was made from, kept for `source()` (logs and callers can walk the
    /// chain; the classification above never reads its text).
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl HandlerError {
    fn new(kind: ErrorKind, message: String) -> Self {
        Self {
            kind,
            message,
            database_unavailable: false,
            dependency: None,
            availability: false,
            source: None,
        }
    }

    /// Keeps `source` as this error's [`std::error::Error::source`].
    #[must_use]
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// A failure worth retrying.
    pub fn transient(message: impl fmt::Display) -> Self {
        Self::new(ErrorKind::Transient, message.to_string())
    }

    /// A failure that retrying cannot fix.
    pub fn permanent(message: impl fmt::Display) -> Self {
        Self::new(ErrorKind::Permanent, message.to_string())
    }

    /// The downstream `dependency` (e.g. `"loyalty-api"`) is unavailable. With a
    /// [`super::BreakerConfig`], in-place retries are spent, then the group's shared circuit
    /// breaker for that dependency opens: every replica pauses, the message is parked in the
    /// DLQ and drained when the breaker closes. Without one it is a transient error.
    pub fn unavailable(dependency: &str, err: impl fmt::Display) -> Self {
        let mut e = Self::new(
            ErrorKind::Transient,
            format!("{dependency} unavailable: {err}"),
        );
        e.dependency = Some(dependency.to_owned());
        e.availability = true;
        e
    }

    /// Names the dependency a call failed on: connection refused, timeouts and HTTP
    /// 502/503/504 (from `?` on I/O and timeout errors, or [`HandlerError::from_http_status`])
    /// become [`HandlerError::unavailable`] for it; other errors are returned unchanged.
    ///
    /// ```
    /// # use outbox::consumer::HandlerError;
    /// let e = HandlerError::from_http_status(503, "busy").on("loyalty-api");
    /// assert_eq!(e.dependency(), Some("loyalty-api"));
    /// let e = HandlerError::from_http_status(400, "bad").on("loyalty-api");
    /// assert_eq!(e.dependency(), None);
    /// ```
    #[must_use]
    pub fn on(mut self, dependency: &str) -> Self {
        if self.availability && self.kind == ErrorKind::Transient {
            self.dependency = Some(dependency.to_owned());
            self.message = format!("{dependency} unavailable: {}", self.message);
        }
        self
    }

    /// The unavailable dependency, if this error names one.
    pub fn dependency(&self) -> Option<&str> {
        self.dependency.as_deref()
    }

    /// The consumer's own database is unreachable (connection refused or lost, server shutting
    /// down). The runtime waits it out with capped backoff *without* spending the message's
    /// retry budget: an outage must not push healthy messages into the dead-letter topic.
    pub fn database_unavailable(message: impl fmt::Display) -> Self {
        let mut e = Self::new(ErrorKind::Transient, message.to_string());
        e.database_unavailable = true;
        e
    }

    /// True for [`HandlerError::database_unavailable`] errors (and Postgres connection
    /// failures converted with `?`).
    pub fn is_database_unavailable(&self) -> bool {
        self.database_unavailable
    }

    /// Classifies an HTTP response status from a downstream API: 408, 425, 429 and 5xx are
    /// transient (502, 503 and 504 also count as the dependency being unavailable, see
    /// [`HandlerError::on`]); other 4xx are permanent.
    pub fn from_http_status(status: u16, message: impl fmt::Display) -> Self {
        if matches!(status, 408 | 425 | 429) || status >= 500 {
            let mut e = Self::transient(format!("HTTP {status}: {message}"));
            e.availability = matches!(status, 502..=504);
            e
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

impl std::error::Error for HandlerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<tokio_postgres::Error> for HandlerError {
    fn from(e: tokio_postgres::Error) -> Self {
        let text = match e.as_db_error() {
            Some(db) => format!("postgres {}: {}", db.code().code(), db.message()),
            None => format!("postgres: {e}"),
        };
        let h = if crate::classify::postgres_is_unavailable(&e) {
            Self::database_unavailable(text)
        } else if crate::classify::postgres_is_transient(&e) {
            Self::transient(text)
        } else {
            Self::permanent(text)
        };
        h.with_source(e)
    }
}

#[cfg(feature = "sqlx")]
impl From<sqlx::Error> for HandlerError {
    /// The same rule as for tokio-postgres errors: the SQLSTATE decides, a transport failure
    /// (I/O, a pool that timed out) means the database is unavailable, a row or column that
    /// does not decode is permanent (a bug in the handler).
    fn from(e: sqlx::Error) -> Self {
        let text = match &e {
            sqlx::Error::Database(db) => format!(
                "postgres {}: {}",
                db.code().as_deref().unwrap_or("?"),
                db.message()
            ),
            other => format!("postgres: {other}"),
        };
        let h = if crate::classify::sqlx_is_unavailable(&e) {
            Self::database_unavailable(text)
        } else if crate::classify::sqlx_is_transient(&e) {
            Self::transient(text)
        } else {
            Self::permanent(text)
        };
        h.with_source(e)
    }
}

impl From<crate::EnqueueError> for HandlerError {
    /// A handler that enqueues an event in its transaction: a database error is classified
    /// like any other; an invalid message is permanent (the same message fails again).
    fn from(e: crate::EnqueueError) -> Self {
        match e {
            crate::EnqueueError::Postgres(pg) => pg.into(),
            #[cfg(feature = "sqlx")]
            crate::EnqueueError::Sqlx(x) => x.into(),
            invalid => Self::permanent(format!("enqueue: {invalid}")).with_source(invalid),
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
            | K::AddrNotAvailable => {
                let mut h = Self::transient(format!("io: {e}"));
                h.availability = matches!(
                    e.kind(),
                    K::TimedOut
                        | K::ConnectionRefused
                        | K::ConnectionReset
                        | K::ConnectionAborted
                        | K::NotConnected
                );
                h.with_source(e)
            }
            _ => Self::permanent(format!("io: {e}")).with_source(e),
        }
    }
}

impl From<serde_json::Error> for HandlerError {
    fn from(e: serde_json::Error) -> Self {
        Self::permanent(format!("json: {e}")).with_source(e)
    }
}

impl From<tokio::time::error::Elapsed> for HandlerError {
    fn from(e: tokio::time::error::Elapsed) -> Self {
        let mut h = Self::transient(format!("timeout: {e}"));
        h.availability = true;
        h.with_source(e)
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
    /// The raw body (for a topic with a schema, the framed bytes as read).
    pub payload: Vec<u8>,
    /// The `message_type` header.
    pub message_type: String,
    /// The `message_id` header: the dedupe key.
    pub message_id: String,
    /// The body as JSON: parsed, or for a framed payload (Avro, Protobuf, JSON Schema in the
    /// Confluent wire format) decoded through the schema registry before dispatch.
    pub body: serde_json::Value,
    /// The registry's schema id, for a framed payload.
    pub schema_id: Option<u32>,
    /// Retry-topic hops so far (`x-retry-attempt`), 0 on the main topic.
    pub retry_attempt: u32,
    /// A tombstone (null value: the delete marker of a compacted topic). Its `payload` is
    /// empty and `body` is `null`; it reaches only the handler registered with
    /// `Consumer::on_tombstone`.
    pub tombstone: bool,
}

/// The handler table's key of the tombstone handler: no real `message_type` is empty.
pub(super) const TOMBSTONE_ROUTE: &str = "";

impl Delivered {
    /// Which registered handler takes this message: its `message_type`, or the tombstone
    /// handler's slot for a tombstone.
    pub(super) fn route(&self) -> &str {
        if self.tombstone {
            TOMBSTONE_ROUTE
        } else {
            &self.message_type
        }
    }

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

    /// The tenant whose outbox the event came from ([`X_TENANT`](crate::wire::X_TENANT), set
    /// by a fleet relay): with [`super::ConsumerConfig::tenants`], the handler's transaction
    /// runs in that tenant's database and schema.
    pub fn tenant(&self) -> Option<&str> {
        self.header(crate::wire::X_TENANT)
    }

    /// The event's sequence in its source ([`X_OUTBOX_SEQ`](crate::wire::X_OUTBOX_SEQ): the
    /// outbox row's id, added by the relay): per key it increases in publication order, and a
    /// retry, a dead letter and a replay keep it. `None` for a record that carries none (not
    /// published by our relay) or one that is not a number.
    pub fn sequence(&self) -> Option<i64> {
        self.header(crate::wire::X_OUTBOX_SEQ)?.trim().parse().ok()
    }

    /// The sequence and key [`newer_than_applied`](Self::newer_than_applied) compares and
    /// records; `None` when either is missing (nothing to compare).
    fn sequenced_key(&self) -> Option<(i64, &[u8])> {
        Some((self.sequence()?, self.key.as_deref()?))
    }

    /// Whether this delivery is newer than anything applied so far for its entity (its key) in
    /// `scope` (your consumer group's name, or any name the handlers that share a view of the
    /// entity agree on), recording its [`sequence`](Self::sequence) as the newest if so — in
    /// `tx`, the handler's transaction, so the record and the handler's changes commit
    /// together. A handler that must not apply older state over newer (a replayed dead letter
    /// whose key was handled meanwhile, a late committer published after newer rows of its key)
    /// returns early when this is `false`:
    ///
    /// ```no_run
    /// # use outbox::consumer::{Delivered, HandlerError};
    /// async fn on_balance(msg: &Delivered, tx: &tokio_postgres::Transaction<'_>) -> Result<(), HandlerError> {
    ///     if !msg.newer_than_applied(tx, "ledger").await? {
    ///         return Ok(()); // older than what this entity already shows: ignored
    ///     }
    ///     // … apply it
    ///     Ok(())
    /// }
    /// ```
    ///
    /// A delivery without a sequence or a key has nothing to compare: `true`, nothing
    /// recorded. The record is a row per entity in `applied_sequences` (the outbox schema, on
    /// the handlers' `search_path`).
    pub async fn newer_than_applied(
        &self,
        tx: &impl tokio_postgres::GenericClient,
        scope: &str,
    ) -> Result<bool, HandlerError> {
        let Some((seq, key)) = self.sequenced_key() else {
            return Ok(true);
        };
        let row = tx
            .query_opt(
                crate::sql::marks::APPLY_SEQUENCE,
                &[&scope, &self.topic, &key, &seq],
            )
            .await?;
        Ok(row.is_some())
    }

    /// [`newer_than_applied`](Self::newer_than_applied) for an sqlx handler, on its
    /// transaction's connection. The service's pool decides the `search_path`: the outbox
    /// schema must be on it (it is when that schema is `public`).
    #[cfg(feature = "sqlx")]
    pub async fn newer_than_applied_sqlx(
        &self,
        tx: &mut sqlx::PgConnection,
        scope: &str,
    ) -> Result<bool, HandlerError> {
        let Some((seq, key)) = self.sequenced_key() else {
            return Ok(true);
        };
        let row = sqlx::query(crate::sql::marks::APPLY_SEQUENCE)
            .bind(scope)
            .bind(&self.topic)
            .bind(key)
            .bind(seq)
            .fetch_optional(tx)
            .await?;
        Ok(row.is_some())
    }

    /// The key to send with an external call so that a repeated call is applied once: the
    /// message id, the same on every redelivery and replay of this message.
    pub fn idempotency_key(&self) -> &str {
        &self.message_id
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
/// Write it as a plain `async fn` (or an async closure that does not borrow from its captures),
/// or implement the trait on a struct:
///
/// ```no_run
/// use outbox::consumer::{Delivered, HandlerError};
/// async fn charge(msg: &Delivered, tx: &tokio_postgres::Transaction<'_>) -> Result<(), HandlerError> {
///     let total = msg.json()["total_cents"].as_i64()
///         .ok_or_else(|| HandlerError::permanent("total_cents missing"))?;
///     tx.execute("INSERT INTO charges (amount_cents) VALUES ($1)", &[&total]).await?;
///     Ok(())
/// }
/// # fn register(c: outbox::consumer::Consumer) -> outbox::consumer::Consumer {
/// c.handler("order_created", charge)
/// # }
/// ```
///
/// The older form, a function returning a [`BoxFuture`], still works.
pub trait Handler: Send + Sync + 'static {
    /// Handles one message within `tx`. Must not commit or roll back `tx` itself.
    fn handle<'a>(
        &'a self,
        msg: &'a Delivered,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// A function usable as a [`Handler`]: `async fn(&Delivered, &Transaction<'_>) ->
/// Result<(), HandlerError>`, or one returning a [`BoxFuture`]. (A helper trait: it names the
/// future per lifetime, which a plain `Fn` bound cannot.)
pub trait HandlerFn<'a>: Send + Sync + 'static {
    /// The future the function returns.
    type Fut: Future<Output = Result<(), HandlerError>> + Send + 'a;
    /// Calls the function.
    fn call(&self, msg: &'a Delivered, tx: &'a tokio_postgres::Transaction<'a>) -> Self::Fut;
}

impl<'a, F, Fut> HandlerFn<'a> for F
where
    F: Fn(&'a Delivered, &'a tokio_postgres::Transaction<'a>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'a,
{
    type Fut = Fut;
    fn call(&self, msg: &'a Delivered, tx: &'a tokio_postgres::Transaction<'a>) -> Fut {
        self(msg, tx)
    }
}

impl<F> Handler for F
where
    F: for<'a> HandlerFn<'a>,
{
    fn handle<'a>(
        &'a self,
        msg: &'a Delivered,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(HandlerFn::call(self, msg, tx))
    }
}

/// A handler for work that is a call to an external system: [`CallHandler::call`] runs with
/// no database connection held, then [`CallHandler::record`] runs in one short transaction
/// with the inbox mark. Register it with [`super::Consumer::call_handler`] (or, for a service on
/// sqlx, implement `SqlxCallHandler`, feature `sqlx`).
///
/// Use it when the handler waits on something other than its own database (HTTP, gRPC, a
/// payment provider, another queue): its Postgres sessions are a few mark writers (see the
/// module docs), not one per call in flight, and a slow dependency never holds a transaction
/// open. Use [`Handler`] when the work *is* in the database: its changes and the mark
/// commit together, with nothing outside to repeat.
///
/// ```no_run
/// use outbox::consumer::{BoxFuture, CallHandler, Delivered, HandlerError};
///
/// struct Notify(reqwest_like::Client);
/// # mod reqwest_like { #[derive(Clone)] pub struct Client; impl Client {
/// #   pub async fn post(&self, _key: &str, _order: &str) -> Result<u16, std::io::Error> { Ok(200) } } }
///
/// impl CallHandler for Notify {
///     type Reply = u16;
///     fn call<'a>(&'a self, msg: &'a Delivered) -> BoxFuture<'a, Result<u16, HandlerError>> {
///         Box::pin(async move {
///             let order = msg.json()["order_number"].as_str().unwrap_or_default();
///             // The message id is the idempotency key: a repeated call is applied once.
///             let status = self.0.post(msg.idempotency_key(), order).await.map_err(HandlerError::from)?;
///             if status >= 300 {
///                 return Err(HandlerError::from_http_status(status, "refused").on("loyalty-api"));
///             }
///             Ok(status)
///         })
///     }
///     fn record<'a>(
///         &'a self,
///         msg: &'a Delivered,
///         _status: &'a u16,
///         tx: &'a tokio_postgres::Transaction<'a>,
///     ) -> BoxFuture<'a, Result<(), HandlerError>> {
///         Box::pin(async move {
///             tx.execute("INSERT INTO notified (message_id) VALUES ($1)", &[&msg.message_id]).await?;
///             Ok(())
///         })
///     }
/// }
/// ```
pub trait CallHandler: Send + Sync + 'static {
    /// What a successful call answered, handed to [`CallHandler::record`].
    type Reply: Send + Sync + 'static;

    /// The external call. Runs outside any transaction with no connection held; send
    /// [`Delivered::idempotency_key`] with it. An error is classified like any handler's
    /// (transient ⇒ retried, permanent ⇒ dead letter, unavailable ⇒ the shared breaker).
    fn call<'a>(&'a self, msg: &'a Delivered) -> BoxFuture<'a, Result<Self::Reply, HandlerError>>;

    /// Records the call's outcome in the transaction that writes the inbox mark; keep it
    /// short (no calls out). A database outage here is waited out with the same `reply`; any
    /// other error rolls back the mark and the message is retried from its call.
    fn record<'a>(
        &'a self,
        msg: &'a Delivered,
        reply: &'a Self::Reply,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

impl<T: CallHandler + ?Sized> CallHandler for std::sync::Arc<T> {
    type Reply = T::Reply;
    fn call<'a>(&'a self, msg: &'a Delivered) -> BoxFuture<'a, Result<Self::Reply, HandlerError>> {
        (**self).call(msg)
    }
    fn record<'a>(
        &'a self,
        msg: &'a Delivered,
        reply: &'a Self::Reply,
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        (**self).record(msg, reply, tx)
    }
}

/// A handler that takes many messages in one transaction — the fast path for high-volume
/// streams (one commit per batch instead of per message).
///
/// The runtime gathers up to `max_batch` ready messages of one type (each the head of its key
/// lane, so per-key order holds), records them all in `processed_messages` with one multi-row
/// insert and passes only the first deliveries to `handle_batch`. If the batch fails, every
/// message is retried on its own (a batch of one) so one bad message cannot sink the others:
/// a permanent failure then dead-letters only that message. Like [`Handler`], a plain
/// `async fn(&[&Delivered], &Transaction<'_>)` works.
pub trait BatchHandler: Send + Sync + 'static {
    /// Handles `msgs` (first deliveries only, never empty) within `tx`.
    fn handle_batch<'a>(
        &'a self,
        msgs: &'a [&'a Delivered],
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// A function usable as a [`BatchHandler`] (see [`HandlerFn`]).
pub trait BatchHandlerFn<'a>: Send + Sync + 'static {
    /// The future the function returns.
    type Fut: Future<Output = Result<(), HandlerError>> + Send + 'a;
    /// Calls the function.
    fn call(&self, msgs: &'a [&'a Delivered], tx: &'a tokio_postgres::Transaction<'a>)
        -> Self::Fut;
}

impl<'a, F, Fut> BatchHandlerFn<'a> for F
where
    F: Fn(&'a [&'a Delivered], &'a tokio_postgres::Transaction<'a>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'a,
{
    type Fut = Fut;
    fn call(&self, msgs: &'a [&'a Delivered], tx: &'a tokio_postgres::Transaction<'a>) -> Fut {
        self(msgs, tx)
    }
}

impl<F> BatchHandler for F
where
    F: for<'a> BatchHandlerFn<'a>,
{
    fn handle_batch<'a>(
        &'a self,
        msgs: &'a [&'a Delivered],
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(BatchHandlerFn::call(self, msgs, tx))
    }
}

/// The outcome of a freshness check against the source of truth, run before a
/// parked letter is handled during a drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Freshness {
    /// The event still describes the entity: handle it.
    Match,
    /// The entity moved on (deleted, newer version): drop the letter as `event_obsolete`.
    Mismatch,
    /// The check itself failed: park the letter again (`x-dlq-retries` + 1).
    QueryFailed(String),
}

/// A freshness check: `async fn(&Delivered) -> Freshness`, or a struct implementing it.
pub trait FreshnessCheck: Send + Sync + 'static {
    /// Checks one parked letter.
    fn check<'a>(&'a self, msg: &'a Delivered) -> BoxFuture<'a, Freshness>;
}

/// A function usable as a [`FreshnessCheck`] (see [`HandlerFn`]).
pub trait FreshnessFn<'a>: Send + Sync + 'static {
    /// The future the function returns.
    type Fut: Future<Output = Freshness> + Send + 'a;
    /// Calls the function.
    fn call(&self, msg: &'a Delivered) -> Self::Fut;
}

impl<'a, F, Fut> FreshnessFn<'a> for F
where
    F: Fn(&'a Delivered) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Freshness> + Send + 'a,
{
    type Fut = Fut;
    fn call(&self, msg: &'a Delivered) -> Fut {
        self(msg)
    }
}

impl<F> FreshnessCheck for F
where
    F: for<'a> FreshnessFn<'a>,
{
    fn check<'a>(&'a self, msg: &'a Delivered) -> BoxFuture<'a, Freshness> {
        Box::pin(FreshnessFn::call(self, msg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `x-outbox-seq` comes from whoever produced the record: anything but a number is no
    /// sequence (nothing to compare, the delivery counts as newer), never a panic.
    #[test]
    fn a_hostile_or_missing_sequence_header_is_no_sequence() {
        let with = |v: Option<&[u8]>| {
            let mut d = Delivered::from_message(&crate::Message::new(
                "t",
                "e",
                "k-1",
                serde_json::json!({}),
            ));
            d.headers.retain(|(k, _)| k != crate::wire::X_OUTBOX_SEQ);
            if let Some(v) = v {
                d.headers
                    .push((crate::wire::X_OUTBOX_SEQ.to_owned(), Some(v.to_vec())));
            }
            d
        };
        assert_eq!(with(Some(b" 42 ")).sequence(), Some(42));
        for bad in [
            &b"abc"[..],
            b"",
            b"1e9",
            b"99999999999999999999999",
            b"\xff\xfe",
            b"42; DROP TABLE applied_sequences",
        ] {
            assert_eq!(with(Some(bad)).sequence(), None, "{bad:?}");
            assert!(with(Some(bad)).sequenced_key().is_none());
        }
        assert_eq!(with(None).sequence(), None);
        // A value without a key has nothing to compare either.
        let mut d = with(Some(b"7"));
        d.key = None;
        assert!(d.sequenced_key().is_none());
    }

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
        // The error it was made from stays reachable.
        let src = std::error::Error::source(&e).expect("a source");
        assert!(src.downcast_ref::<serde_json::Error>().is_some(), "{src}");
        assert!(std::error::Error::source(&HandlerError::transient("x")).is_none());
        // Naming the dependency turns outages into `unavailable`, and nothing else.
        let e: HandlerError = std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
        assert_eq!(e.on("api").dependency(), Some("api"));
        let e: HandlerError = std::io::Error::from(std::io::ErrorKind::InvalidData).into();
        assert_eq!(e.on("api").dependency(), None);
        assert_eq!(
            HandlerError::from_http_status(504, "x")
                .on("api")
                .dependency(),
            Some("api")
        );
        assert_eq!(
            HandlerError::from_http_status(500, "x")
                .on("api")
                .dependency(),
            None
        );
        assert_eq!(
            HandlerError::from_http_status(404, "x")
                .on("api")
                .dependency(),
            None
        );
        assert!(HandlerError::unavailable("api", "down").is_transient());
    }

    async fn plain(
        _m: &Delivered,
        _tx: &tokio_postgres::Transaction<'_>,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn plain_batch(
        _m: &[&Delivered],
        _tx: &tokio_postgres::Transaction<'_>,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn fresh(_m: &Delivered) -> Freshness {
        Freshness::Match
    }
    fn boxed<'a>(
        _m: &'a Delivered,
        _tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async { Ok(()) })
    }

    #[test]
    fn async_fns_closures_and_the_boxed_form_are_handlers() {
        fn is_handler<H: Handler>(_: &H) {}
        fn is_batch<H: BatchHandler>(_: &H) {}
        fn is_check<H: FreshnessCheck>(_: &H) {}
        is_handler(&plain);
        is_handler(&boxed);
        is_handler(
            &async |m: &Delivered, _tx: &tokio_postgres::Transaction<'_>| {
                if m.message_id.is_empty() {
                    return Err(HandlerError::permanent("no id"));
                }
                Ok(())
            },
        );
        is_batch(&plain_batch);
        is_check(&fresh);
        is_check(&async |m: &Delivered| {
            if m.offset >= 0 {
                Freshness::Match
            } else {
                Freshness::Mismatch
            }
        });
    }
}
