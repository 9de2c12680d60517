//! The one transaction interface of the consumer ([`Driver`]) and every transaction recipe
//! written once over it: a message in its transaction, a batch, a commit group, the marks and
//! records of answered calls. Two drivers implement it: tokio-postgres on the consumer's own
//! pool (`pg.rs`) and sqlx on the service's `PgPool` (`sqlx.rs`).
//!
//! A consumer's handlers are sorted into the table of its configured driver when it starts
//! ([`Routes`]): from then on a handler can only ever be handed its own driver's transaction,
//! so the runtime has no "wrong driver" path. Everything around the transactions
//! (classification, retries, dead letters, the breaker, drains, offsets) calls
//! [`Transactions`] and does not know which driver runs them.
//!
//! ```text
//! one message      BEGIN; mark; handler;               SELECT 1; COMMIT
//! a batch          BEGIN; mark many; handler(new ones); SELECT 1; COMMIT
//! a commit group   BEGIN; mark many; per new message: SAVEPOINT; handler
//!                  (failed: ROLLBACK TO SAVEPOINT; unmark);    SELECT 1; COMMIT
//! answered calls   BEGIN; mark many; record per new one;      SELECT 1; COMMIT
//! ```
//!
//! `SELECT 1` before `COMMIT` is the liveness check: a handler that swallowed its statement's
//! error left the transaction aborted, and `COMMIT` would then roll back without an error.

mod pg;
#[cfg(feature = "sqlx")]
mod sqlx;

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use tracing::Instrument as _;

use super::envelope::{Envelope, InGroup};
use super::handler::{BoxFuture, Delivered, HandlerError};
use super::inbox::{Inbox, InboxOutcome};
use super::tenants::{Target, TenantPool};
use super::tx::{handle_span, handler_seconds};
use super::{ConsumerError, HandlerRef, Shared};

pub(super) use pg::{ErasedCall as ErasedPgCall, Pg, PgCall};
#[cfg(feature = "sqlx")]
pub(super) use sqlx::{ErasedCall as ErasedSqlxCall, Sqlx, SqlxCall};

/// An answered call's reply, its type erased so call handlers of different replies share a
/// table.
pub(super) type Reply = Box<dyn Any + Send + Sync>;

/// What [`Driver::in_savepoint`] gives: the savepoint's result, and the handler's (a panic
/// is the outer `Err`).
pub(super) type SavepointAndHandled = (
    Result<(), HandlerError>,
    std::thread::Result<Result<(), HandlerError>>,
);

/// How writing one answered call's mark and record ended, when not with an outcome.
pub(super) enum NotRecorded {
    Failed(HandlerError),
    /// The handler's `record` panicked: re-raised in the message's own task, where it is
    /// dead-lettered like any handler panic.
    Panicked(Box<dyn Any + Send>),
}

/// What a registered handler is, whatever its driver: what the dispatcher needs to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// Per message, in a transaction with its mark (commit groups may take it).
    One,
    /// Many messages in one transaction, up to this many.
    Batch(usize),
    /// A call outside any transaction, then its mark and record (`call.rs`).
    Call,
}

impl Kind {
    /// Holds a pooled connection (and a transaction) for as long as the handler runs.
    pub(super) fn holds_transaction(self) -> bool {
        self != Kind::Call
    }
}

/// A Postgres driver of handler transactions: the steps every recipe below is made of.
///
/// The handler kinds are the driver's own types (`One`, `Batch`, `Call`), and a handler is
/// handed `Arg` — `&Transaction` for tokio-postgres, `&mut PgConnection` for sqlx — so a
/// handler of one driver cannot be called with the other's transaction.
pub(super) trait Driver: Send + Sync + Sized + 'static {
    /// For messages: `tokio-postgres` or `sqlx`.
    const NAME: &'static str;
    /// A pooled connection.
    type Conn: Send;
    /// A transaction on a connection.
    type Tx<'c>: Send;
    /// What a handler is handed.
    type Arg<'a>: Send;
    /// A per-message handler.
    type One: ?Sized + Send + Sync;
    /// A batch handler.
    type Batch: ?Sized + Send + Sync;
    /// A call handler, its reply type erased.
    type Call: ?Sized + Send + Sync;

    /// A pooled connection; none to be had means the database is down.
    fn connect(&self) -> impl Future<Output = Result<Self::Conn, HandlerError>> + Send + '_;
    /// This driver on a tenant's pool (`tenants.rs`); `None` for another driver's pool (the
    /// router holds the consumer's own driver's, so never).
    fn on_pool(pool: &TenantPool) -> Option<Self>;
    /// Opens a transaction.
    fn begin(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = Result<Self::Tx<'_>, HandlerError>> + Send;
    /// Commits.
    fn commit(tx: Self::Tx<'_>) -> impl Future<Output = Result<(), HandlerError>> + Send;
    /// Rolls back.
    fn rollback(tx: Self::Tx<'_>) -> impl Future<Output = Result<(), HandlerError>> + Send;
    /// Runs one statement without parameters.
    fn execute<'a>(
        tx: &'a mut Self::Tx<'_>,
        sql: &'a str,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send + 'a;
    /// Marks one message; `true` on its first delivery.
    fn mark<'a>(
        tx: &'a mut Self::Tx<'_>,
        inbox: &'a Inbox,
        topic: &'a str,
        message_id: &'a str,
    ) -> impl Future<Output = Result<bool, HandlerError>> + Send + 'a;
    /// Marks many with one statement; the new pairs back.
    fn mark_many<'a>(
        tx: &'a mut Self::Tx<'_>,
        inbox: &'a Inbox,
        keys: &'a [(&'a str, &'a str)],
    ) -> impl Future<Output = Result<HashSet<(String, String)>, HandlerError>> + Send + 'a;
    /// Takes back a mark made earlier in this transaction.
    fn unmark<'a>(
        tx: &'a mut Self::Tx<'_>,
        inbox: &'a Inbox,
        topic: &'a str,
        message_id: &'a str,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send + 'a;
    /// What a handler is handed from `tx`.
    fn arg<'a>(tx: &'a mut Self::Tx<'_>) -> Self::Arg<'a>;
    /// Calls a per-message handler.
    fn handle<'a>(
        h: &'a Self::One,
        d: &'a Delivered,
        tx: Self::Arg<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
    /// Calls a batch handler.
    fn handle_batch<'a>(
        h: &'a Self::Batch,
        ds: &'a [&'a Delivered],
        tx: Self::Arg<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
    /// A call handler's call (no transaction).
    fn call<'a>(h: &'a Self::Call, d: &'a Delivered) -> BoxFuture<'a, Result<Reply, HandlerError>>;
    /// A call handler's record of `reply`.
    fn record<'a>(
        h: &'a Self::Call,
        d: &'a Delivered,
        reply: &'a (dyn Any + Send + Sync),
        tx: Self::Arg<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
    /// Every answered call's record in `tx`, caught if one panics. tokio-postgres sends them
    /// all at once (pipelined on the one connection); sqlx one after another.
    fn record_all<'a>(
        tx: &'a mut Self::Tx<'_>,
        records: Vec<(&'a Self::Call, &'a Delivered, &'a (dyn Any + Send + Sync))>,
    ) -> impl Future<Output = Vec<std::thread::Result<Result<(), HandlerError>>>> + Send + 'a;
    /// `SAVEPOINT m`, then the handler, caught if it panics. tokio-postgres sends the
    /// savepoint ahead of the handler's first statement (pipelined); sqlx, which takes the
    /// connection mutably, waits for it first.
    fn in_savepoint<'a>(
        tx: &'a mut Self::Tx<'_>,
        h: &'a Self::One,
        d: &'a Delivered,
        span: tracing::Span,
    ) -> impl Future<Output = SavepointAndHandled> + Send + 'a;
    /// Sorts a registered handler into this driver's kinds; `Err` gives it back when it takes
    /// the other driver's transaction.
    fn route(h: HandlerRef) -> Result<Route<Self>, HandlerRef>;
}

/// A handler in its driver's table.
pub(super) enum Route<D: Driver> {
    One(Arc<D::One>),
    Batch(Arc<D::Batch>, usize),
    Call(Arc<D::Call>),
}

impl<D: Driver> Route<D> {
    fn kind(&self) -> Kind {
        match self {
            Route::One(_) => Kind::One,
            Route::Batch(_, n) => Kind::Batch(*n),
            Route::Call(_) => Kind::Call,
        }
    }
}

/// What the runtime asks of the handler transactions, whatever the driver.
pub(super) trait Transactions: Send + Sync {
    /// The kind of the handler for `route`, if one is registered.
    fn kind(&self, route: &str) -> Option<Kind>;
    /// One message of a per-message or batch handler: mark first, then the handler; both
    /// commit or neither.
    fn one<'a>(
        &'a self,
        shared: &'a Shared,
        d: &'a Delivered,
    ) -> BoxFuture<'a, Result<InboxOutcome, HandlerError>>;
    /// Many messages of one batch handler, one multi-row mark, one commit: (handled,
    /// duplicates).
    fn batch<'a>(
        &'a self,
        shared: &'a Shared,
        ds: &'a [&'a Delivered],
    ) -> BoxFuture<'a, Result<(usize, usize), HandlerError>>;
    /// A commit group (`commit_group.rs`). An `Err` means it did not commit: nothing of it
    /// happened.
    fn group<'a>(
        &'a self,
        shared: &'a Shared,
        envs: &'a [&'a Envelope],
    ) -> BoxFuture<'a, Result<Vec<InGroup>, HandlerError>>;
    /// A call handler's call.
    fn call<'a>(&'a self, d: &'a Delivered) -> BoxFuture<'a, Result<Reply, HandlerError>>;
    /// The marks and records of answered calls in one transaction, every record sent at
    /// once. Any failure is an `Err`: nothing of the group committed.
    fn record_group<'a>(
        &'a self,
        shared: &'a Shared,
        answered: &'a [(&'a Delivered, &'a (dyn Any + Send + Sync))],
    ) -> BoxFuture<'a, Result<Vec<Result<InboxOutcome, NotRecorded>>, HandlerError>>;
    /// One answered call's mark and record in its own transaction.
    fn record_one<'a>(
        &'a self,
        shared: &'a Shared,
        d: &'a Delivered,
        reply: &'a (dyn Any + Send + Sync),
    ) -> BoxFuture<'a, Result<InboxOutcome, NotRecorded>>;
}

/// A driver and its handler table.
pub(super) struct Routes<D: Driver> {
    driver: D,
    routes: HashMap<String, Route<D>>,
}

impl<D: Driver> Routes<D> {
    /// Sorts `handlers` into `driver`'s table, refusing (by name) any of the other driver.
    pub(super) fn new(
        driver: D,
        handlers: HashMap<String, HandlerRef>,
    ) -> Result<Self, ConsumerError> {
        let mut routes = HashMap::new();
        let mut wrong = Vec::new();
        for (route, h) in handlers {
            match D::route(h) {
                Ok(r) => {
                    routes.insert(route, r);
                }
                Err(h) => wrong.push(format!(
                    "{} ({} handler)",
                    if route.is_empty() {
                        "tombstones"
                    } else {
                        &route
                    },
                    h.driver().unwrap_or_default()
                )),
            }
        }
        if !wrong.is_empty() {
            wrong.sort();
            return Err(ConsumerError::Config(format!(
                "the consumer's driver is {} (ConsumerConfig::driver), but these handlers take another driver's transaction: {}",
                D::NAME,
                wrong.join(", ")
            )));
        }
        Ok(Self { driver, routes })
    }

    /// The handler for `d`, or the error for a message no handler of that kind takes
    /// (unreachable: the runtime dispatches by [`Transactions::kind`]).
    fn route(&self, d: &Delivered) -> Result<&Route<D>, HandlerError> {
        self.routes
            .get(d.route())
            .ok_or_else(|| HandlerError::permanent("no handler is registered for the message"))
    }

    /// A connection for the transaction of `d` (and of the messages grouped with it, which
    /// share its tenant: `dispatch.rs`): in its tenant's database when the consumer routes by
    /// tenant and it carries one, else in the consumer's own.
    async fn connect_for(
        &self,
        shared: &Shared,
        d: Option<&Delivered>,
    ) -> Result<(D::Conn, Option<Arc<Target>>), HandlerError> {
        let Some((router, tenant)) = shared.tenants.as_ref().zip(d.and_then(Delivered::tenant))
        else {
            return Ok((self.driver.connect().await?, None));
        };
        let target = router.target(tenant).await?;
        // Unreachable: the router holds the pools of the consumer's own driver.
        let driver = D::on_pool(&target.pool).ok_or_else(|| {
            HandlerError::permanent(format!("tenant {tenant}: no {} pool", D::NAME))
        })?;
        // The tenant's database down is this message's transient failure, not the consumer's
        // outage: the breaker and the pause are for the consumer's own database.
        let conn = driver.connect().await.map_err(|e| {
            HandlerError::transient(format!(
                "tenant {tenant}: database {}: {}",
                target.database,
                e.message()
            ))
        })?;
        Ok((conn, Some(target)))
    }

    /// Opens the transaction on `conn`, in the tenant's schema when there is one.
    async fn begin_in<'c>(
        conn: &'c mut D::Conn,
        target: Option<&Target>,
    ) -> Result<D::Tx<'c>, HandlerError> {
        let mut tx = D::begin(conn).await?;
        if let Some(t) = target {
            D::execute(&mut tx, &t.set_path).await?;
        }
        Ok(tx)
    }

    async fn live(tx: &mut D::Tx<'_>) -> Result<(), HandlerError> {
        D::execute(tx, "SELECT 1").await.map_err(|e| {
            HandlerError::transient(format!(
                "the transaction was aborted by a statement whose error was not returned: {e}"
            ))
        })
    }

    async fn one_tx(&self, shared: &Shared, d: &Delivered) -> Result<InboxOutcome, HandlerError> {
        let route = self.route(d)?;
        let (mut conn, target) = self.connect_for(shared, Some(d)).await?;
        let inbox = target.as_ref().map_or(&shared.inbox, |t| &t.inbox);
        let mut tx = Self::begin_in(&mut conn, target.as_deref()).await?;
        if !D::mark(&mut tx, inbox, &d.topic, &d.message_id).await? {
            D::rollback(tx).await?;
            return Ok(InboxOutcome::Duplicate);
        }
        match route {
            Route::One(h) => D::handle(h, d, D::arg(&mut tx)).await?,
            Route::Batch(h, _) => D::handle_batch(h, &[d], D::arg(&mut tx)).await?,
            Route::Call(_) => {
                return Err(HandlerError::permanent(
                    "a call handler has no transaction of its own",
                ))
            }
        }
        Self::live(&mut tx).await?;
        D::commit(tx).await?;
        Ok(InboxOutcome::Processed)
    }

    async fn batch_tx(
        &self,
        shared: &Shared,
        ds: &[&Delivered],
    ) -> Result<(usize, usize), HandlerError> {
        let Some(first) = ds.first() else {
            return Ok((0, 0));
        };
        let Route::Batch(h, _) = self.route(first)? else {
            return Err(HandlerError::permanent("not a batch handler"));
        };
        let (mut conn, target) = self.connect_for(shared, Some(first)).await?;
        let inbox = target.as_ref().map_or(&shared.inbox, |t| &t.inbox);
        let mut tx = Self::begin_in(&mut conn, target.as_deref()).await?;
        let keys = keys(ds.iter().copied());
        let mut fresh = D::mark_many(&mut tx, inbox, &keys).await?;
        // The first occurrence of each new pair, in batch order.
        let new: Vec<&Delivered> = ds
            .iter()
            .copied()
            .filter(|d| fresh.remove(&(d.topic.clone(), d.message_id.clone())))
            .collect();
        if !new.is_empty() {
            D::handle_batch(h, &new, D::arg(&mut tx)).await?;
        }
        Self::live(&mut tx).await?;
        D::commit(tx).await?;
        Ok((new.len(), ds.len() - new.len()))
    }

    async fn group_tx(
        &self,
        shared: &Shared,
        envs: &[&Envelope],
    ) -> Result<Vec<InGroup>, HandlerError> {
        let members: Vec<Option<(&Delivered, &D::One)>> = envs
            .iter()
            .map(|env| {
                let d = env.decoded.as_ref().ok()?;
                match self.routes.get(d.route())? {
                    Route::One(h) => Some((d, &**h)),
                    _ => None,
                }
            })
            .collect();
        let first = members.iter().flatten().map(|(d, _)| *d).next();
        let (mut conn, target) = self.connect_for(shared, first).await?;
        let inbox = target.as_ref().map_or(&shared.inbox, |t| &t.inbox);
        let mut tx = Self::begin_in(&mut conn, target.as_deref()).await?;
        // Every mark of the group in one statement; a message that fails has its mark taken
        // back.
        let keys = keys(members.iter().flatten().map(|(d, _)| *d));
        let mut fresh = D::mark_many(&mut tx, inbox, &keys).await?;
        let mut outcomes = Vec::with_capacity(envs.len());
        for (i, (env, member)) in envs.iter().zip(members).enumerate() {
            let Some((d, h)) = member else {
                outcomes.push(InGroup::Alone);
                continue;
            };
            // The first of a repeated pair is the delivery; the rest are duplicates.
            if !fresh.remove(&(d.topic.clone(), d.message_id.clone())) {
                outcomes.push(InGroup::Duplicate);
                continue;
            }
            let started = std::time::Instant::now();
            let (savepoint, handled) =
                crate::otel::as_member(i, D::in_savepoint(&mut tx, h, d, handle_span(d, shared)))
                    .await;
            handler_seconds(shared, &env.origin.topic, started);
            savepoint?;
            match handled {
                Ok(Ok(())) => outcomes.push(InGroup::Processed),
                failed => {
                    D::execute(&mut tx, "ROLLBACK TO SAVEPOINT m").await?;
                    D::unmark(&mut tx, inbox, &d.topic, &d.message_id).await?;
                    outcomes.push(InGroup::Failed(
                        failed.map(|r| r.map(|()| InboxOutcome::Processed)),
                    ));
                }
            }
        }
        Self::live(&mut tx).await?;
        D::commit(tx).await?;
        shared.pg_outage.ok();
        Ok(outcomes)
    }

    fn call_handler(&self, d: &Delivered) -> Result<&D::Call, HandlerError> {
        match self.route(d)? {
            Route::Call(h) => Ok(h),
            _ => Err(HandlerError::permanent("not a call handler")),
        }
    }

    async fn record_group_tx(
        &self,
        shared: &Shared,
        answered: &[(&Delivered, &(dyn Any + Send + Sync))],
    ) -> Result<Vec<Result<InboxOutcome, NotRecorded>>, HandlerError> {
        let (mut conn, target) = self
            .connect_for(shared, answered.first().map(|(d, _)| *d))
            .await?;
        let inbox = target.as_ref().map_or(&shared.inbox, |t| &t.inbox);
        let mut tx = Self::begin_in(&mut conn, target.as_deref()).await?;
        let keys = keys(answered.iter().map(|(d, _)| *d));
        let mut fresh = D::mark_many(&mut tx, inbox, &keys).await?;
        // Another replica recorded it meanwhile (a rebalance), or it is twice in this group.
        let new: Vec<bool> = answered
            .iter()
            .map(|(d, _)| fresh.remove(&(d.topic.clone(), d.message_id.clone())))
            .collect();
        let mut records = Vec::new();
        for ((d, reply), n) in answered.iter().zip(&new) {
            if *n {
                records.push((self.call_handler(d)?, *d, *reply));
            }
        }
        for r in D::record_all(&mut tx, records).await {
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_panic) => return Err(HandlerError::transient("a record panicked")),
            }
        }
        Self::live(&mut tx).await?;
        D::commit(tx).await?;
        shared.pg_outage.ok();
        Ok(new
            .into_iter()
            .map(|n| {
                Ok(if n {
                    InboxOutcome::Processed
                } else {
                    InboxOutcome::Duplicate
                })
            })
            .collect())
    }

    async fn record_one_tx(
        &self,
        shared: &Shared,
        d: &Delivered,
        reply: &(dyn Any + Send + Sync),
    ) -> Result<InboxOutcome, NotRecorded> {
        let run = async {
            let h = self.call_handler(d)?;
            let (mut conn, target) = self.connect_for(shared, Some(d)).await?;
            let inbox = target.as_ref().map_or(&shared.inbox, |t| &t.inbox);
            let mut tx = Self::begin_in(&mut conn, target.as_deref()).await?;
            if !D::mark(&mut tx, inbox, &d.topic, &d.message_id).await? {
                D::rollback(tx).await?;
                return Ok(Ok(InboxOutcome::Duplicate));
            }
            match AssertUnwindSafe(D::record(h, d, reply, D::arg(&mut tx)))
                .catch_unwind()
                .await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(panic) => return Ok(Err(panic)),
            }
            Self::live(&mut tx).await?;
            D::commit(tx).await?;
            Ok::<_, HandlerError>(Ok(InboxOutcome::Processed))
        };
        match run.await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(panic)) => Err(NotRecorded::Panicked(panic)),
            Err(e) => Err(NotRecorded::Failed(e)),
        }
    }
}

/// The `(topic, message_id)` pairs of `ds`, for a multi-row mark.
fn keys<'a>(ds: impl Iterator<Item = &'a Delivered>) -> Vec<(&'a str, &'a str)> {
    ds.map(|d| (d.topic.as_str(), d.message_id.as_str()))
        .collect()
}

impl<D: Driver> Transactions for Routes<D> {
    fn kind(&self, route: &str) -> Option<Kind> {
        self.routes.get(route).map(Route::kind)
    }

    fn one<'a>(
        &'a self,
        shared: &'a Shared,
        d: &'a Delivered,
    ) -> BoxFuture<'a, Result<InboxOutcome, HandlerError>> {
        Box::pin(self.one_tx(shared, d))
    }

    fn batch<'a>(
        &'a self,
        shared: &'a Shared,
        ds: &'a [&'a Delivered],
    ) -> BoxFuture<'a, Result<(usize, usize), HandlerError>> {
        Box::pin(self.batch_tx(shared, ds))
    }

    fn group<'a>(
        &'a self,
        shared: &'a Shared,
        envs: &'a [&'a Envelope],
    ) -> BoxFuture<'a, Result<Vec<InGroup>, HandlerError>> {
        Box::pin(self.group_tx(shared, envs).instrument(tracing::debug_span!(
            "outbox.commit_group",
            size = envs.len()
        )))
    }

    fn call<'a>(&'a self, d: &'a Delivered) -> BoxFuture<'a, Result<Reply, HandlerError>> {
        match self.call_handler(d) {
            Ok(h) => D::call(h, d),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    fn record_group<'a>(
        &'a self,
        shared: &'a Shared,
        answered: &'a [(&'a Delivered, &'a (dyn Any + Send + Sync))],
    ) -> BoxFuture<'a, Result<Vec<Result<InboxOutcome, NotRecorded>>, HandlerError>> {
        Box::pin(self.record_group_tx(shared, answered))
    }

    fn record_one<'a>(
        &'a self,
        shared: &'a Shared,
        d: &'a Delivered,
        reply: &'a (dyn Any + Send + Sync),
    ) -> BoxFuture<'a, Result<InboxOutcome, NotRecorded>> {
        Box::pin(self.record_one_tx(shared, d, reply))
    }
}
