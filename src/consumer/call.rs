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
//! group are sent together (pipelined on tokio-postgres; in turn on sqlx); if any fails, the group rolls back and each of its
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
use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;

use super::config::MAX_COMMIT_GROUP;
use super::driver::{NotRecorded, Reply};
use super::handler::{Delivered, HandlerError};
use super::inbox::InboxOutcome;
use super::tenants::TenantPool;
use super::Shared;
use crate::backoff::Backoff;

/// How many mark writers (and pooled connections for them) a consumer of `concurrency` runs:
/// one per 64 messages in flight, at least 2. Fewer writers batch more: measured at 256 calls
/// of 100 ms in flight (`benches/slow_api.rs`), 3 writers wrote 2,337 marks/s, 8 wrote 2,115
/// and 32 wrote 1,987 — each commit then carries fewer marks for the same Postgres work.
pub(super) fn writers(concurrency: usize) -> usize {
    concurrency.div_ceil(64).max(2)
}

/// Steps 1–3 of the module docs for one message.
pub(super) async fn run_call(shared: &Shared, d: &Delivered) -> Result<InboxOutcome, HandlerError> {
    let stopping = || HandlerError::database_unavailable("consumer stopping");
    let (done, seen) = oneshot::channel();
    if !shared.marks.push(Work::Check(Check {
        tenant: d.tenant().map(str::to_owned),
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
    let mut reply = shared.tx.call(d).await?;
    // The answer is in hand: a database outage now is waited out, not answered by calling
    // the API again.
    let mut outage = Backoff::default();
    loop {
        let (done, back) = oneshot::channel();
        if !shared.marks.push(Work::Write(Box::new(Pending {
            d: d.clone(),
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
            Err(NotRecorded::Panicked(p)) => std::panic::resume_unwind(p),
            Err(NotRecorded::Failed(e)) if e.is_database_unavailable() => {
                shared.pg_outage.failed(&format!(
                    "database unavailable: holding an answered call until it is back: {e}"
                ));
                tokio::select! {
                    () = shared.cancel.cancelled() => return Err(e),
                    () = tokio::time::sleep(outage.next_delay()) => {}
                }
            }
            Err(NotRecorded::Failed(e)) => return Err(e),
            Ok(outcome) => return Ok(outcome),
        }
    }
}

/// An answered call waiting for its mark.
struct Pending {
    d: Delivered,
    reply: Reply,
    done: oneshot::Sender<(Result<InboxOutcome, NotRecorded>, Reply)>,
}

/// Step 1 for one message: is it marked?
struct Check {
    /// Its tenant (`x-tenant`): looked up in that tenant's inbox under tenant routing.
    tenant: Option<String>,
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

impl Work {
    /// The tenant of its message: one round of a writer serves one tenant (one database).
    fn tenant(&self) -> Option<&str> {
        match self {
            Work::Check(c) => c.tenant.as_deref(),
            Work::Write(p) => p.d.tenant(),
        }
    }
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
        let tenant = q.front().and_then(Work::tenant).map(str::to_owned);
        while let Some(w) = q.pop_front() {
            if w.tenant() != tenant.as_deref() {
                rest.push_back(w);
                continue;
            }
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
            let answered: Vec<(&Delivered, &(dyn Any + Send + Sync))> =
                writes.iter().map(|p| (&p.d, &*p.reply)).collect();
            let outcomes = match shared.tx.record_group(&shared, &answered).await {
                Ok(o) => o,
                // The database is down: every message waits it out with its answer in hand;
                // writing them one by one would only wait for the pool once per message.
                Err(e) if e.is_database_unavailable() => writes
                    .iter()
                    .map(|_| Err(NotRecorded::Failed(same_error(&e))))
                    .collect(),
                // The group did not commit: each message alone, each with its own outcome.
                Err(_) => {
                    let mut o = Vec::with_capacity(writes.len());
                    for p in &writes {
                        o.push(shared.tx.record_one(&shared, &p.d, &*p.reply).await);
                    }
                    o
                }
            };
            drop(answered);
            for (p, outcome) in writes.into_iter().zip(outcomes) {
                let _ = p.done.send((outcome, p.reply));
            }
        }
    }
}

/// Step 1 for many messages: one lookup.
async fn check(shared: &Shared, checks: Vec<Check>) {
    let found = async {
        // Every check of a round is of one tenant (`Marks::take`).
        let target = match shared
            .tenants
            .as_ref()
            .zip(checks.first().and_then(|c| c.tenant.as_deref()))
        {
            Some((router, tenant)) => Some(router.target(tenant).await?),
            None => None,
        };
        let inbox = target.as_ref().map_or(&shared.inbox, |t| &t.inbox);
        let topics: Vec<&str> = checks.iter().map(|c| c.topic.as_str()).collect();
        let ids: Vec<&str> = checks.iter().map(|c| c.message_id.as_str()).collect();
        let unavailable = |e: &dyn std::fmt::Display| match &target {
            Some(t) => HandlerError::transient(format!("database {}: {e}", t.database)),
            None => HandlerError::database_unavailable(format!("postgres pool: {e}")),
        };
        let pool = match target.as_ref().map(|t| &t.pool) {
            None => &shared.pool,
            Some(TenantPool::Pg(p)) => p,
            // A consumer on sqlx routing by tenant: the tenant's database through the
            // service's pool.
            #[cfg(feature = "sqlx")]
            Some(TenantPool::Sqlx(p)) => {
                let rows: Vec<(String, String)> = sqlx::query_as(inbox.seen_sql())
                    .bind(inbox.group())
                    .bind(&topics)
                    .bind(&ids)
                    .fetch_all(p)
                    .await
                    .map_err(|e| unavailable(&e))?;
                return Ok(rows.into_iter().collect());
            }
        };
        let conn = pool.get().await.map_err(|e| unavailable(&e))?;
        let seen = conn.prepare_cached(inbox.seen_sql()).await?;
        let rows = conn.query(&seen, &[&inbox.group(), &topics, &ids]).await?;
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
