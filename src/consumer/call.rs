//! Handlers whose work is a call to an external system (a REST API, a payment provider):
//! the call runs outside any database transaction, and one short transaction afterwards
//! records the inbox mark with the handler's own writes.
//!
//! ```text
//! 1. SELECT … FROM processed_messages WHERE …     -- marked already: a duplicate, never
//!                                                    -- called again
//! 2. call(msg)   with idempotency key = message id   -- no connection held, no transaction
//! 3. BEGIN; INSERT marks … ON CONFLICT DO NOTHING;  -- the marks of every answered call
//!    record(msg, reply) for each new one;            -- waiting, with their records
//!    COMMIT
//! ```
//!
//! Steps 1 and 3 are done by a few mark writers ([`writers`]: 2, or one per 64 of
//! concurrency; one pooled connection each) for every message waiting at that moment, up to 32: one lookup for many checks, one
//! commit for many marks. That is what keeps hundreds of calls in flight cheap for Postgres:
//! per message about one statement (its record) instead of five and a commit. The records of a
//! group are sent together (pipelined); if any fails, the group rolls back and each of its
//! messages is written alone in its own transaction, so one bad record never costs the others
//! and each message still gets its own outcome.
//!
//! A call repeats — always **with the same idempotency key**, so an API that dedupes by it
//! (`Idempotency-Key` header, Stripe-style) applies it once — only when its mark did not
//! commit after it answered:
//! - a crash (or a shutdown past `shutdown_timeout`) between the answer and step 3's commit:
//!   the message is redelivered, finds no mark and is called again;
//! - a rebalance that moves the partition while the call is in flight: the new owner finds no
//!   mark yet and calls too (an in-transaction handler would wait on the mark's row lock);
//! - a `record` that fails with a transient error (a deadlock, a lock timeout): the message is
//!   retried from its call.
//!
//! A crash after step 3 committed finds the mark at step 1 and never calls. A database outage
//! between 2 and 3 waits for the database with the answer in hand instead of calling again.

use std::any::Any;
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;

use super::config::MAX_COMMIT_GROUP;
use super::handler::{BoxFuture, Delivered, HandlerError};
use super::inbox::InboxOutcome;
use super::tx::connection;
use super::Shared;
use crate::backoff::Backoff;

/// A handler for work that is a call to an external system: [`CallHandler::call`] runs with
/// no database connection held, then [`CallHandler::record`] runs in one short transaction
/// with the inbox mark. Register it with [`super::Consumer::call_handler`].
///
/// Use it when the handler waits on something other than its own database (HTTP, gRPC, a
/// payment provider, another queue): its Postgres sessions are a few mark writers (see the
/// module docs), not one per call in flight, and a slow dependency never holds a transaction
/// open. Use [`super::Handler`] when the work *is* in the database: its changes and the mark
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

/// A [`CallHandler`] with its reply type erased, so handlers of different reply types share
/// the handler table.
pub(super) trait ErasedCall: Send + Sync {
    fn call<'a>(
        &'a self,
        msg: &'a Delivered,
    ) -> BoxFuture<'a, Result<Box<dyn Any + Send + Sync>, HandlerError>>;
    fn record<'a>(
        &'a self,
        msg: &'a Delivered,
        reply: &'a (dyn Any + Send + Sync),
        tx: &'a tokio_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

pub(super) struct Erased<H>(pub(super) H);

impl<H: CallHandler> ErasedCall for Erased<H> {
    fn call<'a>(
        &'a self,
        msg: &'a Delivered,
    ) -> BoxFuture<'a, Result<Box<dyn Any + Send + Sync>, HandlerError>> {
        let fut = self.0.call(msg);
        Box::pin(async move { Ok(Box::new(fut.await?) as Box<dyn Any + Send + Sync>) })
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

/// How many mark writers (and pooled connections for them) a consumer of `concurrency` runs:
/// one per 64 messages in flight, at least 2. Fewer writers batch more: measured at 256 calls
/// of 100 ms in flight (`benches/slow_api.rs`), 3 writers wrote 2,337 marks/s, 8 wrote 2,115
/// and 32 wrote 1,987 — each commit then carries fewer marks for the same Postgres work.
pub(super) fn writers(concurrency: usize) -> usize {
    concurrency.div_ceil(64).max(2)
}

/// Steps 1–3 of the module docs for one message.
pub(super) async fn run_call(
    shared: &Shared,
    handler: &Arc<dyn ErasedCall>,
    d: &Delivered,
) -> Result<InboxOutcome, HandlerError> {
    let stopping = || HandlerError::database_unavailable("consumer stopping");
    let (done, seen) = oneshot::channel();
    if !shared.marks.push(Work::Check(Check {
        topic: d.topic.clone(),
        message_id: d.message_id.clone(),
        done,
    })) {
        return Err(stopping());
    }
    match seen.await {
        Ok(Ok(true)) => return Ok(InboxOutcome::Duplicate),
        Ok(Ok(false)) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err(stopping()),
    }
    let mut reply = handler.call(d).await?;
    // The answer is in hand: a database outage now is waited out, not answered by calling
    // the API again.
    let mut outage = Backoff::default();
    loop {
        let (done, back) = oneshot::channel();
        if !shared.marks.push(Work::Write(Box::new(Pending {
            d: d.clone(),
            handler: handler.clone(),
            reply,
            done,
        }))) {
            return Err(stopping());
        }
        let Ok((result, r)) = back.await else {
            // The writers stopped: the consumer is shutting down.
            return Err(stopping());
        };
        reply = r;
        match result {
            Err(Written::Panicked(p)) => std::panic::resume_unwind(p),
            Err(Written::Failed(e)) if e.is_database_unavailable() => {
                shared.pg_outage.failed(&format!(
                    "database unavailable: holding an answered call until it is back: {e}"
                ));
                tokio::select! {
                    () = shared.cancel.cancelled() => return Err(e),
                    () = tokio::time::sleep(outage.next_delay()) => {}
                }
            }
            Err(Written::Failed(e)) => return Err(e),
            Ok(outcome) => return Ok(outcome),
        }
    }
}

type Reply = Box<dyn Any + Send + Sync>;

/// How writing one message's mark ended, when not with an outcome.
enum Written {
    Failed(HandlerError),
    /// The handler's `record` panicked: re-raised in the message's own task, where it is
    /// dead-lettered like any handler panic.
    Panicked(Box<dyn Any + Send>),
}

/// An answered call waiting for its mark.
struct Pending {
    d: Delivered,
    handler: Arc<dyn ErasedCall>,
    reply: Reply,
    done: oneshot::Sender<(Result<InboxOutcome, Written>, Reply)>,
}

/// Step 1 for one message: is it marked?
struct Check {
    topic: String,
    message_id: String,
    done: oneshot::Sender<Result<bool, HandlerError>>,
}

/// What the mark writers do for call handlers.
enum Work {
    Check(Check),
    /// Step 3: its mark and record.
    Write(Box<Pending>),
}

/// Checks and writes waiting for a mark writer.
#[derive(Default)]
pub(super) struct Marks {
    queue: Mutex<VecDeque<Work>>,
    ready: Notify,
    /// The writers stopped: nothing is taken any more.
    closed: std::sync::atomic::AtomicBool,
}

impl Marks {
    /// Queues `w`; `false` once the writers stopped (the consumer is shutting down).
    fn push(&self, w: Work) -> bool {
        let mut q = self.queue.lock().expect("marks lock");
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        q.push_back(w);
        drop(q);
        self.ready.notify_one();
        true
    }

    /// After the runtime ended and the writers stopped: what is still queued is dropped, so
    /// every message waiting on it hears "stopping" at once, and nothing is queued again.
    pub(super) fn close(&self) {
        let mut q = self.queue.lock().expect("marks lock");
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        q.clear();
    }

    /// Up to [`MAX_COMMIT_GROUP`] checks and as many writes, and whether more wait.
    fn take(&self) -> (Vec<Check>, Vec<Pending>, bool) {
        let mut q = self.queue.lock().expect("marks lock");
        let (mut checks, mut writes, mut rest) = (Vec::new(), Vec::new(), VecDeque::new());
        while let Some(w) = q.pop_front() {
            match w {
                Work::Check(c) if checks.len() < MAX_COMMIT_GROUP => checks.push(c),
                Work::Write(p) if writes.len() < MAX_COMMIT_GROUP => writes.push(*p),
                other => rest.push_back(other),
            }
            if checks.len() == MAX_COMMIT_GROUP && writes.len() == MAX_COMMIT_GROUP {
                break;
            }
        }
        rest.extend(q.drain(..));
        *q = rest;
        let more = !q.is_empty();
        (checks, writes, more)
    }
}

/// One mark writer, until `stop` (after the runtime ended: messages still finishing at
/// shutdown get their marks).
pub(super) async fn write_marks(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let (checks, writes, more) = shared.marks.take();
        if checks.is_empty() && writes.is_empty() {
            tokio::select! {
                () = stop.cancelled() => return,
                () = shared.marks.ready.notified() => continue,
            }
        }
        if more {
            // More waiting than one writer takes: wake another for them.
            shared.marks.ready.notify_one();
        }
        if !checks.is_empty() {
            check(&shared, checks).await;
        }
        if !writes.is_empty() {
            let outcomes = match write_group(&shared, &writes).await {
                Ok(o) => o,
                // The database is down: every message waits it out with its answer in hand;
                // writing them one by one would only wait for the pool once per message.
                Err(e) if e.is_database_unavailable() => writes
                    .iter()
                    .map(|_| Err(Written::Failed(same_error(&e))))
                    .collect(),
                // The group did not commit: each message alone, each with its own outcome.
                Err(_) => {
                    let mut o = Vec::with_capacity(writes.len());
                    for p in &writes {
                        o.push(write_one(&shared, p).await);
                    }
                    o
                }
            };
            for (p, outcome) in writes.into_iter().zip(outcomes) {
                let _ = p.done.send((outcome, p.reply));
            }
        }
    }
}

/// Step 1 for many messages: one lookup.
async fn check(shared: &Shared, checks: Vec<Check>) {
    let found = async {
        let conn = connection(shared).await?;
        let seen = conn.prepare_cached(shared.inbox.seen_sql()).await?;
        let topics: Vec<&str> = checks.iter().map(|c| c.topic.as_str()).collect();
        let ids: Vec<&str> = checks.iter().map(|c| c.message_id.as_str()).collect();
        let rows = conn
            .query(&seen, &[&shared.inbox.group(), &topics, &ids])
            .await?;
        Ok::<_, HandlerError>(
            rows.iter()
                .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
                .collect::<std::collections::HashSet<_>>(),
        )
    }
    .await;
    for c in checks {
        let _ = c.done.send(match &found {
            Ok(set) => Ok(set.contains(&(c.topic, c.message_id))),
            Err(e) => Err(same_error(e)),
        });
    }
}

/// `e` again, for every message that shared the failed statement.
fn same_error(e: &HandlerError) -> HandlerError {
    if e.is_database_unavailable() {
        HandlerError::database_unavailable(e.message())
    } else if e.is_transient() {
        HandlerError::transient(e.message())
    } else {
        HandlerError::permanent(e.message())
    }
}

/// Step 3 for a group: one transaction, every mark in one statement, then every new
/// message's record sent at once (pipelined on the one connection). Any failure is an `Err`:
/// nothing of the group committed.
async fn write_group(
    shared: &Shared,
    group: &[Pending],
) -> Result<Vec<Result<InboxOutcome, Written>>, HandlerError> {
    let mut conn = connection(shared).await?;
    let tx = conn.transaction().await?;
    let keys: Vec<(&str, &str)> = group
        .iter()
        .map(|p| (p.d.topic.as_str(), p.d.message_id.as_str()))
        .collect();
    let mut fresh = shared.inbox.mark_many(&*tx, &keys).await?;
    // Another replica recorded it meanwhile (a rebalance), or it is twice in this group.
    let new: Vec<bool> = group
        .iter()
        .map(|p| fresh.remove(&(p.d.topic.clone(), p.d.message_id.clone())))
        .collect();
    let records = group
        .iter()
        .zip(&new)
        .filter(|(_, n)| **n)
        .map(|(p, _)| AssertUnwindSafe(p.handler.record(&p.d, &*p.reply, &tx)).catch_unwind());
    for r in futures::future::join_all(records).await {
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_panic) => return Err(HandlerError::transient("a record panicked")),
        }
    }
    // A record that caught its own statement's error and returned `Ok` left the transaction
    // aborted, and `COMMIT` would then roll back without an error: every message of the group
    // would be reported done with nothing written. A statement fails in an aborted transaction.
    super::tx::live(&tx).await?;
    tx.commit().await?;
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

/// Step 3 for one message in its own transaction (after its group failed).
async fn write_one(shared: &Shared, p: &Pending) -> Result<InboxOutcome, Written> {
    let run = async {
        let mut conn = connection(shared).await?;
        let mark = conn.prepare_cached(shared.inbox.insert_sql()).await?;
        let tx = conn.transaction().await?;
        let group = shared.inbox.group();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
            [&group, &p.d.topic, &p.d.message_id];
        if tx.query_opt(&mark, &params).await?.is_none() {
            tx.rollback().await?;
            return Ok(Ok(InboxOutcome::Duplicate));
        }
        match AssertUnwindSafe(p.handler.record(&p.d, &*p.reply, &tx))
            .catch_unwind()
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(panic) => return Ok(Err(panic)),
        }
        super::tx::live(&tx).await?;
        tx.commit().await?;
        Ok::<_, HandlerError>(Ok(InboxOutcome::Processed))
    };
    match run.await {
        Ok(Ok(outcome)) => Ok(outcome),
        Ok(Err(panic)) => Err(Written::Panicked(panic)),
        Err(e) => Err(Written::Failed(e)),
    }
}
