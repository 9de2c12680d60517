//! The tokio-postgres driver: transactions on the consumer's own pool (sized by
//! `ConsumerConfig::transactions`), for [`Handler`], [`BatchHandler`] and [`CallHandler`].

use std::any::Any;
use std::collections::HashSet;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use deadpool_postgres::Pool;
use futures::FutureExt;
use tracing::Instrument as _;

use super::{Driver, Reply, Route, SavepointAndHandled};
use crate::consumer::handler::{
    BatchHandler, BoxFuture, CallHandler, Delivered, Handler, HandlerError,
};
use crate::consumer::inbox::Inbox;
use crate::consumer::tenants::TenantPool;
use crate::consumer::HandlerRef;

/// tokio-postgres on the consumer's pool.
pub(in crate::consumer) struct Pg(pub(in crate::consumer) Pool);

/// A [`CallHandler`] with its reply type erased.
pub(in crate::consumer) trait PgCall: Send + Sync {
    fn call<'a>(&'a self, msg: &'a Delivered) -> BoxFuture<'a, Result<Reply, HandlerError>>;
    fn record<'a>(
        &'a self,
        msg: &'a Delivered,
        reply: &'a (dyn Any + Send + Sync),
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// A call handler behind [`PgCall`].
pub(in crate::consumer) struct ErasedCall<H>(pub(in crate::consumer) H);

impl<H: CallHandler> PgCall for ErasedCall<H> {
    fn call<'a>(&'a self, msg: &'a Delivered) -> BoxFuture<'a, Result<Reply, HandlerError>> {
        let fut = self.0.call(msg);
        Box::pin(async move { Ok(Box::new(fut.await?) as Reply) })
    }

    fn record<'a>(
        &'a self,
        msg: &'a Delivered,
        reply: &'a (dyn Any + Send + Sync),
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        match reply.downcast_ref::<H::Reply>() {
            Some(r) => self.0.record(msg, r, tx),
            // Unreachable: the reply came from this handler's own `call`.
            None => Box::pin(async { Err(HandlerError::permanent("call reply of another type")) }),
        }
    }
}

impl Driver for Pg {
    const NAME: &'static str = "tokio-postgres";
    type Conn = deadpool_postgres::Object;
    type Tx<'c> = deadpool_postgres::Transaction<'c>;
    type Arg<'a> = &'a tokio_postgres::Transaction<'a>;
    type One = dyn Handler;
    type Batch = dyn BatchHandler;
    type Call = dyn PgCall;

    async fn connect(&self) -> Result<Self::Conn, HandlerError> {
        self.0
            .get()
            .await
            .map_err(|e| HandlerError::database_unavailable(format!("postgres pool: {e}")))
    }

    async fn begin(conn: &mut Self::Conn) -> Result<Self::Tx<'_>, HandlerError> {
        Ok(conn.transaction().await?)
    }

    async fn commit(tx: Self::Tx<'_>) -> Result<(), HandlerError> {
        Ok(tx.commit().await?)
    }

    async fn rollback(tx: Self::Tx<'_>) -> Result<(), HandlerError> {
        Ok(tx.rollback().await?)
    }

    fn on_pool(pool: &TenantPool) -> Option<Self> {
        match pool {
            TenantPool::Pg(p) => Some(Self(p.clone())),
            #[cfg(feature = "sqlx")]
            TenantPool::Sqlx(_) => None,
        }
    }

    async fn execute(tx: &mut Self::Tx<'_>, sql: &str) -> Result<(), HandlerError> {
        Ok(tx.batch_execute(sql).await?)
    }

    async fn mark<'a>(
        tx: &'a mut Self::Tx<'_>,
        inbox: &'a Inbox,
        topic: &'a str,
        message_id: &'a str,
    ) -> Result<bool, HandlerError> {
        // Prepared once per connection: one round trip per message instead of a parse
        // round trip and an execute round trip.
        let mark = tx.prepare_cached(inbox.insert_sql()).await?;
        Ok(tx
            .query_opt(&mark, &[&inbox.group(), &topic, &message_id])
            .await?
            .is_some())
    }

    async fn mark_many<'a>(
        tx: &'a mut Self::Tx<'_>,
        inbox: &'a Inbox,
        keys: &'a [(&'a str, &'a str)],
    ) -> Result<HashSet<(String, String)>, HandlerError> {
        Ok(inbox.mark_many(&**tx, keys).await?)
    }

    async fn unmark<'a>(
        tx: &'a mut Self::Tx<'_>,
        inbox: &'a Inbox,
        topic: &'a str,
        message_id: &'a str,
    ) -> Result<(), HandlerError> {
        Ok(inbox.unmark(&**tx, topic, message_id).await?)
    }

    fn arg<'a>(tx: &'a mut Self::Tx<'_>) -> Self::Arg<'a> {
        &**tx
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

    fn record_all<'a>(
        tx: &'a mut Self::Tx<'_>,
        records: Vec<(&'a Self::Call, &'a Delivered, &'a (dyn Any + Send + Sync))>,
    ) -> impl Future<Output = Vec<std::thread::Result<Result<(), HandlerError>>>> + Send + 'a {
        let t: &'a tokio_postgres::Transaction<'a> = tx;
        futures::future::join_all(
            records
                .into_iter()
                .map(move |(h, d, r)| AssertUnwindSafe(h.record(d, r, t)).catch_unwind()),
        )
    }

    fn in_savepoint<'a>(
        tx: &'a mut Self::Tx<'_>,
        h: &'a Self::One,
        d: &'a Delivered,
        span: tracing::Span,
    ) -> impl Future<Output = SavepointAndHandled> + Send + 'a {
        let t: &'a tokio_postgres::Transaction<'a> = tx;
        async move {
            // Sent ahead of the handler's first statement, not waited for: tokio-postgres
            // pipelines requests polled together, and the server runs them in order.
            let (savepoint, handled) = futures::join!(
                t.batch_execute("SAVEPOINT m"),
                AssertUnwindSafe(h.handle(d, t))
                    .catch_unwind()
                    .instrument(span)
            );
            (savepoint.map_err(HandlerError::from), handled)
        }
    }

    fn route(h: HandlerRef) -> Result<Route<Self>, HandlerRef> {
        match h {
            HandlerRef::Single(h) => Ok(Route::One(h)),
            HandlerRef::Batch(h, n) => Ok(Route::Batch(h, n)),
            HandlerRef::Call(h) => Ok(Route::Call(h)),
            #[allow(unreachable_patterns)]
            other => Err(other),
        }
    }
}
