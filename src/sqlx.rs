//! sqlx as the service's driver: the same enqueue, validation and typed errors as
//! [`crate::enqueue`], into an sqlx transaction or connection.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox::Message;
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO orders (number, total) VALUES ($1, $2)")
//!     .bind("A-1024").bind(1500i64).execute(&mut *tx).await?;
//! let msg = Message::new("orders.created", "order_created", "A-1024",
//!                        serde_json::json!({"total": 1500}));
//! outbox::sqlx::enqueue(&mut *tx, &msg).await?;
//! tx.commit().await?; // the order and its event become visible together, or not at all
//! # Ok(()) }
//! ```
//!
//! The consumer side: [`crate::consumer::Inbox::mark_sqlx`] for hand-written consumers, and
//! with the `consumer` feature `consumer::Consumer::sqlx` runs the consumer runtime's handler
//! transactions on the service's `PgPool`.

use sqlx::{Executor, Postgres};

use crate::enqueue::{headers_json, validate, Columns, EnqueueError, Enqueuer};
use crate::message::Message;
use crate::sql::Statements;

/// As [`crate::enqueue()`], into an sqlx transaction (`&mut *tx`) or connection: if the
/// transaction commits, the relay publishes the message; if it rolls back, it never existed.
/// The `outbox` table is found by the connection's `search_path`.
///
/// # Errors
/// [`EnqueueError`]: invalid messages are refused before any SQL runs
/// ([`EnqueueError::InvalidTopic`], [`EnqueueError::EmptyKey`], …); a database error is
/// [`EnqueueError::Sqlx`] and aborts the caller's transaction.
pub async fn enqueue<'c, E>(executor: E, msg: &Message) -> Result<(), EnqueueError>
where
    E: Executor<'c, Database = Postgres>,
{
    let (single, _) = Statements::unqualified_enqueue();
    insert_one(executor, &single, msg).await
}

/// As [`crate::enqueue_batch`]: several messages with one statement, in order, all or none.
///
/// # Errors
/// As [`enqueue`]; one invalid message refuses the whole batch.
pub async fn enqueue_batch<'c, E>(executor: E, msgs: &[Message]) -> Result<u64, EnqueueError>
where
    E: Executor<'c, Database = Postgres>,
{
    let (_, batch) = Statements::unqualified_enqueue();
    insert_many(executor, &batch, msgs).await
}

impl Enqueuer {
    /// As [`Enqueuer::enqueue`], into an sqlx transaction or connection.
    ///
    /// # Errors
    /// As [`enqueue`].
    pub async fn enqueue_sqlx<'c, E>(&self, executor: E, msg: &Message) -> Result<(), EnqueueError>
    where
        E: Executor<'c, Database = Postgres>,
    {
        crate::enqueue::validate(msg)?;
        self.check(std::slice::from_ref(msg)).await?;
        insert_one(executor, self.single_sql(), msg).await
    }

    /// As [`Enqueuer::enqueue_batch`], into an sqlx transaction or connection.
    ///
    /// # Errors
    /// As [`enqueue_batch`].
    pub async fn enqueue_batch_sqlx<'c, E>(
        &self,
        executor: E,
        msgs: &[Message],
    ) -> Result<u64, EnqueueError>
    where
        E: Executor<'c, Database = Postgres>,
    {
        for m in msgs {
            crate::enqueue::validate(m)?;
        }
        self.check(msgs).await?;
        insert_many(executor, self.batch_sql(), msgs).await
    }
}

async fn insert_one<'c, E>(executor: E, sql: &str, msg: &Message) -> Result<(), EnqueueError>
where
    E: Executor<'c, Database = Postgres>,
{
    validate(msg)?;
    sqlx::query(sql)
        .bind(&msg.topic)
        .bind(msg.key.as_deref())
        .bind(headers_json(msg))
        .bind(msg.stored_payload())
        .execute(executor)
        .await?;
    Ok(())
}

async fn insert_many<'c, E>(executor: E, sql: &str, msgs: &[Message]) -> Result<u64, EnqueueError>
where
    E: Executor<'c, Database = Postgres>,
{
    if msgs.is_empty() {
        return Ok(0);
    }
    let c = Columns::of(msgs)?;
    // sqlx binds owned array elements.
    let payloads: Vec<Option<serde_json::Value>> =
        c.payloads.into_iter().map(Option::<&_>::cloned).collect();
    Ok(sqlx::query(sql)
        .bind(c.topics)
        .bind(c.keys)
        .bind(c.headers)
        .bind(payloads)
        .execute(executor)
        .await?
        .rows_affected())
}
