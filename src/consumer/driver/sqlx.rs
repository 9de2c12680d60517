//! The sqlx driver: transactions on the service's own `PgPool` (`Consumer::sqlx`), for
//! [`SqlxHandler`], [`SqlxBatchHandler`] and [`SqlxCallHandler`]. sqlx takes the connection
//! mutably, so a savepoint and the handler, or the records of a group, go one after another
//! where tokio-postgres pipelines them.

use std::any::Any;
use std::collections::HashSet;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use sqlx::{Connection as _, PgConnection, PgPool, Postgres};
use tracing::Instrument as _;

use super::{Driver, Reply, Route, SavepointAndHandled};
use crate::consumer::handler::{BoxFuture, Delivered, HandlerError};
use crate::consumer::inbox::Inbox;
use crate::consumer::sqlx::{SqlxBatchHandler, SqlxCallHandler, SqlxHandler};
use crate::consumer::tenants::TenantPool;
use crate::consumer::HandlerRef;

/// sqlx on the service's pool.
pub(in crate::consumer) struct Sqlx(pub(in crate::consumer) PgPool);

/// An [`SqlxCallHandler`] with its reply type erased.
pub(in crate::consumer) trait SqlxCall: Send + Sync {
    fn call<'a>(&'a self, msg: &'a Delivered) -> BoxFuture<'a, Result<Reply, HandlerError>>;
    fn record<'a>(
        &'a self,
        msg: &'a Delivered,
        reply: &'a (dyn Any + Send + Sync),
        tx: &'a mut PgConnection,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// A call handler behind [`SqlxCall`].
pub(in crate::consumer) struct ErasedCall<H>(pub(in crate::consumer) H);

impl<H: SqlxCallHandler> SqlxCall for ErasedCall<H> {
    fn call<'a>(&'a self, msg: &'a Delivered) -> BoxFuture<'a, Result<Reply, HandlerError>> {
        let fut = self.0.call(msg);
        Box::pin(async move { Ok(Box::new(fut.await?) as Reply) })
    }

    fn record<'a>(
        &'a self,
        msg: &'a Delivered,
        reply: &'a (dyn Any + Send + Sync),
        tx: &'a mut PgConnection,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        match reply.downcast_ref::<H::Reply>() {
            Some(r) => self.0.record(msg, r, tx),
            // Unreachable: the reply came from this handler's own `call`.
            None => Box::pin(async { Err(HandlerError::permanent("call reply of another type")) }),
        }
    }
}

impl Driver for Sqlx {
    const NAME: &'static str = "sqlx";
    type Conn = sqlx::pool::PoolConnection<Postgres>;
    type Tx<'c> = sqlx::Transaction<'c, Postgres>;
    type Arg<'a> = &'a mut PgConnection;
    type One = dyn SqlxHandler;
    type Batch = dyn SqlxBatchHandler;
    type Call = dyn SqlxCall;

    async fn connect(&self) -> Result<Self::Conn, HandlerError> {
        Ok(self.0.acquire().await?)
    }

    async fn begin(conn: &mut Self::Conn) -> Result<Self::Tx<'_>, HandlerError> {
        Ok(conn.begin().await?)
    }

    async fn commit(tx: Self::Tx<'_>) -> Result<(), HandlerError> {
        Ok(tx.commit().await?)
    }

    async fn rollback(tx: Self::Tx<'_>) -> Result<(), HandlerError> {
        Ok(tx.rollback().await?)
    }

    fn on_pool(pool: &TenantPool) -> Option<Self> {
        match pool {
            TenantPool::Sqlx(p) => Some(Self(p.clone())),
            TenantPool::Pg(_) => None,
        }
    }

    async fn execute(tx: &mut Self::Tx<'_>, sql: &str) -> Result<(), HandlerError> {
        sqlx::query(sql).execute(&mut **tx).await?;
        Ok(())
    }

    async fn mark<'a>(
        tx: &'a mut Self::Tx<'_>,
        inbox: &'a Inbox,
        topic: &'a str,
        message_id: &'a str,
    ) -> Result<bool, HandlerError> {
        Ok(inbox.mark_sqlx(tx, topic, message_id).await?)
    }

    async fn mark_many<'a>(
        tx: &'a mut Self::Tx<'_>,
        inbox: &'a Inbox,
        keys: &'a [(&'a str, &'a str)],
    ) -> Result<HashSet<(String, String)>, HandlerError> {
        Ok(inbox.mark_many_sqlx(tx, keys).await?)
    }

    async fn unmark<'a>(
        tx: &'a mut Self::Tx<'_>,
        inbox: &'a Inbox,
        topic: &'a str,
        message_id: &'a str,
    ) -> Result<(), HandlerError> {
        Ok(inbox.unmark_sqlx(tx, topic, message_id).await?)
    }

    fn arg<'a>(tx: &'a mut Self::Tx<'_>) -> Self::Arg<'a> {
        &mut **tx
    }

    fn handle<'a>(
        h: &'a Self::One,
        d: &'a Delivered,
        tx: Self::Arg<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        h.handle(d, tx)
    }

    fn handle_batch<'a>(
        h: &'a Self::Batch,
        ds: &'a [&'a Delivered],
        tx: Self::Arg<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        h.handle_batch(ds, tx)
    }

    fn call<'a>(h: &'a Self::Call, d: &'a Delivered) -> BoxFuture<'a, Result<Reply, HandlerError>> {
        h.call(d)
    }

    fn record<'a>(
        h: &'a Self::Call,
        d: &'a Delivered,
        reply: &'a (dyn Any + Send + Sync),
        tx: Self::Arg<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        h.record(d, reply, tx)
    }

    async fn record_all<'a>(
        tx: &'a mut Self::Tx<'_>,
        records: Vec<(&'a Self::Call, &'a Delivered, &'a (dyn Any + Send + Sync))>,
    ) -> Vec<std::thread::Result<Result<(), HandlerError>>> {
        let mut out = Vec::with_capacity(records.len());
        for (h, d, r) in records {
            let done = AssertUnwindSafe(h.record(d, r, tx)).catch_unwind().await;
            let failed = !matches!(done, Ok(Ok(())));
            out.push(done);
            if failed {
                // The group rolls back anyway: the rest need not run.
                break;
            }
        }
        out
    }

    async fn in_savepoint<'a>(
        tx: &'a mut Self::Tx<'_>,
        h: &'a Self::One,
        d: &'a Delivered,
        span: tracing::Span,
    ) -> SavepointAndHandled {
        if let Err(e) = sqlx::query("SAVEPOINT m").execute(&mut **tx).await {
            return (Err(e.into()), Ok(Ok(())));
        }
        let handled = AssertUnwindSafe(h.handle(d, tx))
            .catch_unwind()
            .instrument(span)
            .await;
        (Ok(()), handled)
    }

    fn route(h: HandlerRef) -> Result<Route<Self>, HandlerRef> {
        match h {
            HandlerRef::SqlxSingle(h) => Ok(Route::One(h)),
            HandlerRef::SqlxBatch(h, n) => Ok(Route::Batch(h, n)),
            HandlerRef::SqlxCall(h) => Ok(Route::Call(h)),
            other => Err(other),
        }
    }
}
