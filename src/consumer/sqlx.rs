//! The sqlx driver of handler transactions ([`super::Driver::Sqlx`]): the same steps as the
//! tokio-postgres path in `process.rs` and `commit_group.rs` — mark first, the handler, a liveness
//! check, commit — on a connection of the service's `PgPool`. Everything around them
//! (classification, retries, dead letters, the breaker, drains, offsets) is the runtime's and
//! does not know which driver ran the transaction.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use sqlx::PgConnection;
use tracing::Instrument as _;

use super::envelope::Envelope;
use super::envelope::InGroup;
use super::handler::{BoxFuture, Delivered, HandlerError};
use super::inbox::InboxOutcome;
use super::tx::{handle_span, handler_seconds};
use super::{HandlerRef, Shared};

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
/// # fn register(c: outbox::consumer::Consumer) -> outbox::consumer::Consumer {
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

/// A tokio-postgres handler met the sqlx driver or the other way round (refused at start).
pub(super) fn wrong_driver() -> HandlerError {
    HandlerError::permanent("the handler takes another driver's transaction than the consumer's")
}

/// As `process::live`: an aborted transaction's `COMMIT` would roll back silently.
async fn live(tx: &mut PgConnection) -> Result<(), HandlerError> {
    sqlx::query("SELECT 1")
        .execute(tx)
        .await
        .map(|_| ())
        .map_err(|e| {
            HandlerError::transient(format!(
                "the transaction was aborted by a statement whose error was not returned: {e}"
            ))
        })
}

/// One message: mark first, then the handler; both commit or neither (`process::run_in_tx`).
pub(super) async fn run_in_tx(
    shared: &Shared,
    pool: &sqlx::PgPool,
    handler: &HandlerRef,
    d: &Delivered,
) -> Result<InboxOutcome, HandlerError> {
    let mut tx = pool.begin().await?;
    if !shared
        .inbox
        .mark_sqlx(&mut tx, &d.topic, &d.message_id)
        .await?
    {
        tx.rollback().await?;
        return Ok(InboxOutcome::Duplicate);
    }
    match handler {
        HandlerRef::SqlxSingle(h) => h.handle(d, &mut tx).await?,
        HandlerRef::SqlxBatch(h, _) => h.handle_batch(&[d], &mut tx).await?,
        _ => return Err(wrong_driver()),
    }
    live(&mut tx).await?;
    tx.commit().await?;
    Ok(InboxOutcome::Processed)
}

/// Many messages, one multi-row mark, one commit (`process::run_batch_in_tx`).
pub(super) async fn run_batch_in_tx(
    shared: &Shared,
    pool: &sqlx::PgPool,
    handler: &dyn SqlxBatchHandler,
    ds: &[&Delivered],
) -> Result<(usize, usize), HandlerError> {
    let mut tx = pool.begin().await?;
    let keys: Vec<(&str, &str)> = ds
        .iter()
        .map(|d| (d.topic.as_str(), d.message_id.as_str()))
        .collect();
    let mut fresh = shared.inbox.mark_many_sqlx(&mut tx, &keys).await?;
    let first: Vec<&Delivered> = ds
        .iter()
        .copied()
        .filter(|d| fresh.remove(&(d.topic.clone(), d.message_id.clone())))
        .collect();
    if !first.is_empty() {
        handler.handle_batch(&first, &mut tx).await?;
    }
    live(&mut tx).await?;
    tx.commit().await?;
    Ok((first.len(), ds.len() - first.len()))
}

/// A commit group's transaction (`commit_group.rs`): one statement for the marks, a savepoint per
/// handler. sqlx takes the connection mutably, so each savepoint is its own round trip before
/// the handler (tokio-postgres pipelines it). An `Err` means nothing of the group happened.
pub(super) async fn run_group(
    envs: &[&Envelope],
    shared: &Shared,
    pool: &sqlx::PgPool,
) -> Result<Vec<InGroup>, HandlerError> {
    let mut tx = pool.begin().await?;
    let singles: Vec<Option<(&Delivered, &Arc<dyn SqlxHandler>)>> = envs
        .iter()
        .map(|env| {
            let d = env.decoded.as_ref().ok()?;
            match shared.handlers.get(d.route())? {
                HandlerRef::SqlxSingle(h) => Some((d, h)),
                _ => None,
            }
        })
        .collect();
    let keys: Vec<(&str, &str)> = singles
        .iter()
        .flatten()
        .map(|(d, _)| (d.topic.as_str(), d.message_id.as_str()))
        .collect();
    let mut fresh = shared.inbox.mark_many_sqlx(&mut tx, &keys).await?;
    let mut outcomes = Vec::with_capacity(envs.len());
    for (env, single) in envs.iter().zip(singles) {
        let Some((d, h)) = single else {
            outcomes.push(InGroup::Alone);
            continue;
        };
        if !fresh.remove(&(d.topic.clone(), d.message_id.clone())) {
            outcomes.push(InGroup::Duplicate);
            continue;
        }
        sqlx::query("SAVEPOINT m").execute(&mut *tx).await?;
        let started = std::time::Instant::now();
        let handled = AssertUnwindSafe(h.handle(d, &mut tx))
            .catch_unwind()
            .instrument(handle_span(d, shared))
            .await;
        handler_seconds(shared, &env.origin.topic, started);
        match handled {
            Ok(Ok(())) => outcomes.push(InGroup::Processed),
            failed => {
                sqlx::query("ROLLBACK TO SAVEPOINT m")
                    .execute(&mut *tx)
                    .await?;
                shared
                    .inbox
                    .unmark_sqlx(&mut tx, &d.topic, &d.message_id)
                    .await?;
                outcomes.push(InGroup::Failed(
                    failed.map(|r| r.map(|()| InboxOutcome::Processed)),
                ));
            }
        }
    }
    live(&mut tx).await?;
    tx.commit().await?;
    shared.pg_outage.ok();
    Ok(outcomes)
}
