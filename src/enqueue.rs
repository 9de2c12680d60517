//! Writing events into the outbox inside the caller's transaction.
//!
//! ```no_run
//! # async fn demo(client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox::{enqueue, Message};
//! let tx = client.transaction().await?;
//! tx.execute("INSERT INTO orders (number, total) VALUES ($1, $2)", &[&"A-1024", &1500i64]).await?;
//! let msg = Message::new("orders.created", "order_created", "A-1024",
//!                        serde_json::json!({"total": 1500}));
//! enqueue(&tx, &msg).await?;
//! tx.commit().await?; // the order and its event become visible together, or not at all
//! # Ok(()) }
//! ```

use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

use crate::message::Message;
use crate::schema::Schema;
use crate::sql::Statements;
use crate::topic::{validate_topic, InvalidTopic};
use crate::wire::STANDARD_HEADERS;

/// Why a message was not enqueued. Nothing was written in any case.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnqueueError {
    /// The topic name breaks the naming rules.
    #[error(transparent)]
    InvalidTopic(#[from] InvalidTopic),
    /// `message_type` is empty.
    #[error("message_type must not be empty")]
    EmptyMessageType,
    /// The entity id (the key) is empty; use [`Message::keyless`] for a keyless message.
    #[error("entity_id (the Kafka key) must not be empty; use Message::keyless for no key")]
    EmptyKey,
    /// A user header tried to replace one of the four standard headers.
    #[error("header {0:?} is set by the library and cannot be overridden")]
    ReservedHeader(String),
    /// A header name is empty.
    #[error("header names must not be empty")]
    EmptyHeaderName,
    /// The INSERT failed; the caller's transaction is now aborted and must be rolled back.
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// The payload breaks its topic's schema, or the schema could not be had (the registry
    /// unreachable: [`crate::schemas::SchemaError::is_unavailable`]). Nothing was written;
    /// the caller's transaction is intact and may roll back or go on.
    #[cfg(feature = "schemas")]
    #[error("schema: {0}")]
    Schema(#[from] crate::schemas::SchemaError),
    /// The INSERT failed through sqlx (`outbox::sqlx`); the caller's transaction is now
    /// aborted and must be rolled back.
    #[cfg(feature = "sqlx")]
    #[error("postgres (sqlx): {0}")]
    Sqlx(#[from] sqlx::Error),
}

impl EnqueueError {
    /// True when retrying the whole transaction may succeed (serialization failure, deadlock,
    /// too many connections, lost connection); false for invalid messages.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Postgres(e) => crate::classify::postgres_is_transient(e),
            #[cfg(feature = "sqlx")]
            Self::Sqlx(e) => crate::classify::sqlx_is_transient(e),
            #[cfg(feature = "schemas")]
            Self::Schema(e) => e.is_unavailable(),
            _ => false,
        }
    }
}

pub(crate) fn validate(msg: &Message) -> Result<(), EnqueueError> {
    validate_topic(&msg.topic)?;
    if msg.message_type.is_empty() {
        return Err(EnqueueError::EmptyMessageType);
    }
    if msg.key.as_deref() == Some("") {
        return Err(EnqueueError::EmptyKey);
    }
    for name in msg.headers.keys() {
        if name.is_empty() {
            return Err(EnqueueError::EmptyHeaderName);
        }
        if STANDARD_HEADERS.contains(&name.as_str()) {
            return Err(EnqueueError::ReservedHeader(name.clone()));
        }
    }
    Ok(())
}

/// The `headers` column of a message. With tracing on (feature `otel` and a tracer provider)
/// and no `traceparent` from the caller, the `create` span's context is added as one, with
/// its `tracestate` when it carries vendor entries; a caller's own `traceparent` and
/// `tracestate` are kept byte for byte.
pub(crate) fn headers_json(msg: &Message) -> serde_json::Value {
    let mut h = msg.all_headers();
    if !h.contains_key(crate::trace_context::TRACEPARENT) {
        if let Some((tp, ts)) = crate::otel::create(&msg.topic, &msg.message_id) {
            h.insert(crate::trace_context::TRACEPARENT.to_owned(), tp);
            // A `tracestate` belongs to its `traceparent` (W3C): one the caller gave without
            // a `traceparent` is not the new context's and is replaced by that context's.
            match ts {
                Some(ts) => h.insert(crate::trace_context::TRACESTATE.to_owned(), ts),
                None => h.remove(crate::trace_context::TRACESTATE),
            };
        }
    }
    serde_json::Value::Object(
        h.into_iter()
            .map(|(k, v)| (k, serde_json::Value::String(v)))
            .collect(),
    )
}

/// Writes `msg` into the `outbox` table found by the client's `search_path` (normally `public`)
/// as part of the caller's transaction: if that transaction commits, the relay will publish the
/// message; if it rolls back, the message never existed.
///
/// Pass a [`tokio_postgres::Transaction`] (with deadpool, `&*tx`). The relay is woken at commit
/// by the table's `outbox_notify` trigger.
///
/// # Errors
/// [`EnqueueError`]: invalid messages are refused before any SQL runs; a database error aborts
/// the caller's transaction.
pub async fn enqueue<C: GenericClient>(client: &C, msg: &Message) -> Result<(), EnqueueError> {
    let (single, _) = Statements::unqualified_enqueue();
    insert_one(client, &single, msg).await
}

/// Writes several messages with one statement, in order, in the caller's transaction.
/// Either all are written or (on error) none.
///
/// # Errors
/// As [`enqueue`]; one invalid message refuses the whole batch.
pub async fn enqueue_batch<C: GenericClient>(
    client: &C,
    msgs: &[Message],
) -> Result<u64, EnqueueError> {
    let (_, batch) = Statements::unqualified_enqueue();
    insert_many(client, &batch, msgs).await
}

/// Enqueues into the outbox of a given schema (when the tables are not on the `search_path`).
#[derive(Debug, Clone)]
pub struct Enqueuer {
    single: String,
    batch: String,
    #[cfg(feature = "schemas")]
    schemas: Option<crate::schemas::Schemas>,
}

impl Enqueuer {
    /// An enqueuer for the tables in `schema`.
    pub fn new(schema: &Schema) -> Self {
        let s = Statements::new(schema);
        Self {
            single: s.enqueue,
            batch: s.enqueue_batch,
            #[cfg(feature = "schemas")]
            schemas: None,
        }
    }

    /// Checks each payload against its topic's registered schema before writing (topics
    /// without a format are not checked): a broken contract is [`EnqueueError::Schema`] and
    /// nothing is written, so the business transaction can roll back. The schema is cached
    /// and refreshed on [`crate::schemas::SchemaConfig::refresh`]'s schedule.
    #[cfg(feature = "schemas")]
    pub fn with_schemas(mut self, schemas: crate::schemas::Schemas) -> Self {
        self.schemas = Some(schemas);
        self
    }

    /// The contract check of `msgs` (see [`Enqueuer::with_schemas`]).
    #[cfg_attr(
        not(feature = "schemas"),
        allow(clippy::unused_async, unused_variables)
    )]
    pub(crate) async fn check(&self, msgs: &[Message]) -> Result<(), EnqueueError> {
        #[cfg(feature = "schemas")]
        if let Some(s) = &self.schemas {
            for m in msgs {
                if let Some(p) = m.stored_payload() {
                    s.validate(&m.topic, p).await?;
                }
            }
        }
        Ok(())
    }

    /// As [`enqueue`], into this schema's outbox.
    ///
    /// # Errors
    /// As [`enqueue`].
    pub async fn enqueue<C: GenericClient>(
        &self,
        client: &C,
        msg: &Message,
    ) -> Result<(), EnqueueError> {
        validate(msg)?;
        self.check(std::slice::from_ref(msg)).await?;
        insert_one(client, &self.single, msg).await
    }

    /// As [`enqueue_batch`], into this schema's outbox.
    ///
    /// # Errors
    /// As [`enqueue_batch`].
    pub async fn enqueue_batch<C: GenericClient>(
        &self,
        client: &C,
        msgs: &[Message],
    ) -> Result<u64, EnqueueError> {
        for m in msgs {
            validate(m)?;
        }
        self.check(msgs).await?;
        insert_many(client, &self.batch, msgs).await
    }

    /// The single-message INSERT for this schema (also used by the sqlx path).
    #[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
    pub(crate) fn single_sql(&self) -> &str {
        &self.single
    }

    /// The batch INSERT for this schema.
    #[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
    pub(crate) fn batch_sql(&self) -> &str {
        &self.batch
    }
}

async fn insert_one<C: GenericClient>(
    client: &C,
    sql: &str,
    msg: &Message,
) -> Result<(), EnqueueError> {
    validate(msg)?;
    let headers = headers_json(msg);
    let payload = msg.stored_payload();
    // Typed parameters: Parse, Bind and Execute go in one round trip instead of two (an
    // untyped statement is first described to learn its parameters' types). The INSERT's
    // lock on the outbox is held from Parse to COMMIT, and every relay on ring storage waits
    // for the writers holding it before it reads past their ids, so a shorter transaction is
    // a shorter wait for every event behind it (docs/BENCHMARKS_HISTORY.md round 22).
    client
        .execute_typed(
            sql,
            &[
                (&msg.topic, Type::TEXT),
                (&msg.key, Type::TEXT),
                (&headers, Type::JSONB),
                (&payload, Type::JSONB),
            ],
        )
        .await?;
    Ok(())
}

async fn insert_many<C: GenericClient>(
    client: &C,
    sql: &str,
    msgs: &[Message],
) -> Result<u64, EnqueueError> {
    if msgs.is_empty() {
        return Ok(0);
    }
    let c = Columns::of(msgs)?;
    // Typed as the statement casts them: one round trip (see `insert_one`).
    Ok(client
        .execute_typed(
            sql,
            &[
                (&c.topics, Type::TEXT_ARRAY),
                (&c.keys, Type::TEXT_ARRAY),
                (&c.headers, Type::JSONB_ARRAY),
                (&c.payloads, Type::JSONB_ARRAY),
            ],
        )
        .await?)
}

/// A validated batch as the batch INSERT's four arrays (topic, key, headers, payload), for
/// either driver.
pub(crate) struct Columns<'m> {
    pub(crate) topics: Vec<&'m str>,
    pub(crate) keys: Vec<Option<&'m str>>,
    pub(crate) headers: Vec<serde_json::Value>,
    pub(crate) payloads: Vec<Option<&'m serde_json::Value>>,
}

impl<'m> Columns<'m> {
    /// Validates every message (one invalid message refuses the batch) and splits them.
    pub(crate) fn of(msgs: &'m [Message]) -> Result<Self, EnqueueError> {
        for m in msgs {
            validate(m)?;
        }
        Ok(Self {
            topics: msgs.iter().map(|m| m.topic.as_str()).collect(),
            keys: msgs.iter().map(|m| m.key.as_deref()).collect(),
            headers: msgs.iter().map(headers_json).collect(),
            payloads: msgs.iter().map(Message::stored_payload).collect(),
        })
    }
}
