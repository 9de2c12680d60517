//! The handler traits of the sqlx driver (a consumer built by `Consumer::sqlx`): the same kinds as the
//! tokio-postgres ones — per message, batch, call — handed the transaction's `PgConnection`
//! instead of a tokio-postgres `Transaction`, so a service on sqlx writes no tokio-postgres.
//! The transactions themselves are the consumer's one set of recipes (`driver/`).

use std::future::Future;

use sqlx::PgConnection;

use super::handler::{BoxFuture, Delivered, HandlerError};

/// A handler on sqlx: runs inside the transaction that also records the message in
/// `processed_messages`; returning `Ok` commits both, an error rolls both back.
///
/// It gets the transaction's connection: every statement on it is part of the message's
/// transaction (`conn.begin()` opens a savepoint). A plain `async fn` works:
///
/// ```no_run
/// use outbox::consumer::{Delivered, HandlerError};
/// async fn charge(msg: &Delivered, tx: &mut sqlx::PgConnection) -> Result<(), HandlerError> {
///     let total = msg.json()["total_cents"].as_i64()
///         .ok_or_else(|| HandlerError::permanent("total_cents missing"))?;
///     sqlx::query("INSERT INTO charges (amount_cents) VALUES ($1)")
///         .bind(total).execute(&mut *tx).await?;
///     Ok(())
/// }
/// # use outbox::consumer::{Consumer, SqlxHandlers};
/// # fn register(c: Consumer<SqlxHandlers>) -> Consumer<SqlxHandlers> {
/// c.sqlx_handler("order_created", charge)
/// # }
/// ```
pub trait SqlxHandler: Send + Sync + 'static {
    /// Handles one message within the transaction on `tx`. Must not commit or roll it back.
    fn handle<'a>(
        &'a self,
        msg: &'a Delivered,
        tx: &'a mut PgConnection,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// A function usable as an [`SqlxHandler`]: `async fn(&Delivered, &mut PgConnection) ->
/// Result<(), HandlerError>` (a helper trait that names the future per lifetime).
pub trait SqlxHandlerFn<'a>: Send + Sync + 'static {
    /// The future the function returns.
    type Fut: Future<Output = Result<(), HandlerError>> + Send + 'a;
    /// Calls the function.
    fn call(&self, msg: &'a Delivered, tx: &'a mut PgConnection) -> Self::Fut;
}

impl<'a, F, Fut> SqlxHandlerFn<'a> for F
where
    F: Fn(&'a Delivered, &'a mut PgConnection) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'a,
{
    type Fut = Fut;
    fn call(&self, msg: &'a Delivered, tx: &'a mut PgConnection) -> Fut {
        self(msg, tx)
    }
}

impl<F> SqlxHandler for F
where
    F: for<'a> SqlxHandlerFn<'a>,
{
    fn handle<'a>(
        &'a self,
        msg: &'a Delivered,
        tx: &'a mut PgConnection,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(SqlxHandlerFn::call(self, msg, tx))
    }
}

/// A batch handler on sqlx (see [`super::BatchHandler`]): many first deliveries, one
/// transaction.
pub trait SqlxBatchHandler: Send + Sync + 'static {
    /// Handles `msgs` (first deliveries only, never empty) within the transaction on `tx`.
    fn handle_batch<'a>(
        &'a self,
        msgs: &'a [&'a Delivered],
        tx: &'a mut PgConnection,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// A function usable as an [`SqlxBatchHandler`] (see [`SqlxHandlerFn`]).
pub trait SqlxBatchHandlerFn<'a>: Send + Sync + 'static {
    /// The future the function returns.
    type Fut: Future<Output = Result<(), HandlerError>> + Send + 'a;
    /// Calls the function.
    fn call(&self, msgs: &'a [&'a Delivered], tx: &'a mut PgConnection) -> Self::Fut;
}

impl<'a, F, Fut> SqlxBatchHandlerFn<'a> for F
where
    F: Fn(&'a [&'a Delivered], &'a mut PgConnection) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'a,
{
    type Fut = Fut;
    fn call(&self, msgs: &'a [&'a Delivered], tx: &'a mut PgConnection) -> Fut {
        self(msgs, tx)
    }
}

impl<F> SqlxBatchHandler for F
where
    F: for<'a> SqlxBatchHandlerFn<'a>,
{
    fn handle_batch<'a>(
        &'a self,
        msgs: &'a [&'a Delivered],
        tx: &'a mut PgConnection,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(SqlxBatchHandlerFn::call(self, msgs, tx))
    }
}

/// A [`super::CallHandler`] whose record is written through sqlx: [`SqlxCallHandler::call`]
/// runs with no database connection held, then [`SqlxCallHandler::record`] runs in one short
/// sqlx transaction with the inbox mark (on the consumer's sqlx pool). Register it
/// with [`super::Consumer::sqlx_call_handler`].
pub trait SqlxCallHandler: Send + Sync + 'static {
    /// What a successful call answered, handed to [`SqlxCallHandler::record`].
    type Reply: Send + Sync + 'static;

    /// The external call, outside any transaction; send [`Delivered::idempotency_key`] with it.
    fn call<'a>(&'a self, msg: &'a Delivered) -> BoxFuture<'a, Result<Self::Reply, HandlerError>>;

    /// Records the call's outcome in the transaction that writes the inbox mark (keep it
    /// short). Must not commit or roll back.
    fn record<'a>(
        &'a self,
        msg: &'a Delivered,
        reply: &'a Self::Reply,
        tx: &'a mut PgConnection,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

impl<T: SqlxCallHandler + ?Sized> SqlxCallHandler for std::sync::Arc<T> {
    type Reply = T::Reply;
    fn call<'a>(&'a self, msg: &'a Delivered) -> BoxFuture<'a, Result<Self::Reply, HandlerError>> {
        (**self).call(msg)
    }
    fn record<'a>(
        &'a self,
        msg: &'a Delivered,
        reply: &'a Self::Reply,
        tx: &'a mut PgConnection,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        (**self).record(msg, reply, tx)
    }
}
