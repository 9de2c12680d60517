//! The relay's lifecycle ([`Relay::run`]) and its background tasks, each a loop that ends with
//! the relay: the sweep below the
//! claim floor, LISTEN for the enqueue trigger, the outbox gauges and the cleanup schedule.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::*;

/// See [`Relay::sweep`].
pub(super) async fn sweep_with(
    pool: &Pool,
    stmts: &Statements,
    floor: &Mutex<ClaimFloor>,
) -> Result<Option<i64>, RelayError> {
    let (below, lanes) = {
        let f = floor.lock().expect("floor lock");
        (f.get(), f.lanes().to_vec())
    };
    if below <= 0 || lanes.is_empty() {
        return Ok(None);
    }
    let client = pool.get().await?;
    let found: Option<i64> = client
        .query_one(&stmts.sweep, &[&below, &lanes])
        .await?
        .get(0);
    if let Some(id) = found {
        info!(
            id,
            floor = below,
            "sweep found a pending row below the claim floor (a long transaction, or a row put back by hand); claiming from it"
        );
        floor.lock().expect("floor lock").rewind_to(id);
    }
    Ok(found)
}

/// Sweeps every `every` (first after one interval and `offset`: a fleet's relays, started
/// together, sweep at staggered moments) and wakes the relay when rows were found.
pub(super) async fn sweep_schedule(
    pool: Pool,
    stmts: Arc<Statements>,
    floor: Arc<Mutex<ClaimFloor>>,
    (every, offset): (Duration, Duration),
    wake: Arc<Notify>,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every + offset, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let on_ring = match pool.get().await {
            Ok(c) => c
                .query_one(&stmts.ring_layout, &[])
                .await
                .map(|r| r.get::<_, bool>(0))
                .unwrap_or(false),
            Err(_) => false,
        };
        if on_ring {
            match super::ring::sweep_passed(&pool, &stmts).await {
                Ok(0) => {}
                Ok(_) => wake.notify_one(),
                Err(e) => debug!(error = %e, "ring sweep failed; will retry at the next tick"),
            }
            continue;
        }
        match sweep_with(&pool, &stmts, &floor).await {
            Ok(Some(_)) => wake.notify_one(),
            Ok(None) => {}
            Err(e) => debug!(error = %e, "sweep failed; will retry at the next tick"),
        }
    }
}

/// Keeps a LISTEN connection open and turns notifications into wake-ups; reconnects with
/// backoff. Wakes once after each (re)connect, since notifications sent while disconnected
/// are lost. A [`REWIND_PAYLOAD`] notification also sends the next claim back to the head.
pub(super) async fn listen(
    db: DbConfig,
    wake: Arc<Notify>,
    floor: Arc<Mutex<ClaimFloor>>,
    cancel: CancellationToken,
    outages: Arc<Outages>,
) {
    let channel = db.schema.notify_channel();
    let mut backoff = Backoff::default();
    while !cancel.is_cancelled() {
        let attempt = async {
            let (client, mut conn) = db.pg.connect(db.tls.clone()).await?;
            let notify = wake.clone();
            let floor = floor.clone();
            let driver = tokio::spawn(async move {
                let mut stream = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
                use futures::StreamExt;
                while let Some(msg) = stream.next().await {
                    match msg {
                        Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                            if n.payload() == REWIND_PAYLOAD {
                                floor.lock().expect("floor lock").rewind_to(0);
                            }
                            notify.notify_one();
                        }
                        Ok(_) => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            });
            client
                .batch_execute(&format!("LISTEN \"{channel}\""))
                .await?;
            Ok::<_, tokio_postgres::Error>((client, driver))
        };
        match attempt.await {
            Ok((_client, mut driver)) => {
                backoff.reset();
                wake.notify_one();
                debug!(%channel, "listening for outbox notifications");
                tokio::select! {
                    () = cancel.cancelled() => { driver.abort(); return; }
                    ended = &mut driver => {
                        if let Ok(Err(e)) = ended {
                            outages.postgres.failed(&format!("notification connection lost; polling until it is back: {e}"));
                        }
                    }
                }
            }
            Err(e) => {
                let d = backoff.next_delay();
                debug!(error = %e, retry_in = ?d, "cannot open notification connection");
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(d) => {}
                }
            }
        }
    }
}

/// The relay's "cron module": runs cleanup at start and then every `every`.
/// How often a relay refreshes its outbox gauges.
const GAUGES_EVERY: Duration = Duration::from_secs(15);

/// Refreshes the outbox gauges every 15 s (cheap statements, see `sql::GAUGES`).
pub(super) async fn gauges_schedule(
    pool: Pool,
    schema: crate::schema::Schema,
    stmts: Arc<Statements>,
    tenant: Option<(Arc<super::gate::TenantGauges>, Arc<str>)>,
    first: Duration,
    cancel: CancellationToken,
) {
    // A fleet starts hundreds of relays at once: each refreshes first at its own moment
    // within the period (`first`, see `Seat::offset`), so their statements are spread over
    // it instead of all landing at start, and again every 15 s, beside the first passes.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + first, GAUGES_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        refresh_outbox_gauges(
            &pool,
            &schema,
            &stmts,
            tenant.as_ref().map(|(sink, t)| (&**sink, &**t)),
        )
        .await;
    }
}

/// Sets `outbox_rows{status}` and `outbox_oldest_pending_age_seconds` (see `sql::GAUGES`),
/// and the storage's gauges (`storage::state`: sizes from the files, the ring's leaves from
/// the ends of their primary keys). A fleet's relay hands them to the fleet instead
/// (`tenant`), which publishes them per tenant with the labels capped (`gate::TenantGauges`).
pub(crate) async fn refresh_outbox_gauges(
    pool: &Pool,
    schema: &crate::schema::Schema,
    stmts: &Statements,
    tenant: Option<(&super::gate::TenantGauges, &str)>,
) {
    let Ok(c) = pool.get().await else {
        return;
    };
    let mut v = super::gate::GaugeValues::default();
    let mut gauges = &stmts.gauges;
    let mut storage = false;
    match crate::storage::state_on(&c, schema).await {
        Ok(s) => {
            if s.layout == "ring" {
                gauges = &stmts.ring_gauges;
            }
            v.bytes = s.bytes as f64;
            v.generations = f64::from(s.generations.unwrap_or(0));
            v.oldest_generation = s.oldest_generation_age_secs.unwrap_or(0.0);
            storage = true;
        }
        Err(e) => debug!(error = %e, "storage gauges not refreshed"),
    }
    let row = c.query_one(gauges.as_str(), &[]).await;
    let counted = if let Ok(r) = row {
        let (pending, failed, total): (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
        let oldest: Option<f64> = r.get(3);
        v.pending = pending as f64;
        v.failed = failed as f64;
        v.sent = (total - pending - failed).max(0) as f64;
        v.oldest = oldest.unwrap_or(0.0);
        true
    } else {
        false
    };
    match tenant {
        Some((sink, t)) => {
            if storage && counted {
                sink.record(t, v);
            }
        }
        None => v.publish(None, storage, counted),
    }
}

pub(super) async fn cleanup_schedule(
    pool: Pool,
    schema: crate::schema::Schema,
    stmts: Arc<Statements>,
    config: crate::cleanup::CleanupConfig,
    (every, offset): (Duration, Duration),
    cancel: CancellationToken,
) {
    // First at start, or `offset` after it for a fleet's relay (staggered, as the gauges).
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + offset, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        match cleanup::run_with(&pool, &schema, &stmts, &config, &cancel, &mut |_| {}).await {
            Ok(r) => {
                let rotations = |result: &'static str| metrics::counter!(crate::metrics::OUTBOX_RING_ROTATIONS, "result" => result);
                rotations("reclaimed").increment(r.generations_reclaimed);
                rotations("busy").increment(r.generations_busy);
                rotations("advanced").increment(u64::from(r.generation_advanced));
                info!(
                    outbox_deleted = r.outbox_deleted,
                    processed_deleted = r.processed_deleted,
                    generations_reclaimed = r.generations_reclaimed,
                    generations_busy = r.generations_busy,
                    "scheduled cleanup done"
                );
            }
            Err(e) => {
                metrics::counter!(crate::metrics::OUTBOX_CLEANUP_FAILURES).increment(1);
                warn!(error = %e, "scheduled cleanup failed; will retry at the next tick");
            }
        }
    }
}

impl Relay {
    /// When in `period` this relay does its periodic work: at once alone, at its seat's own
    /// moment in a fleet (`Seat::offset`).
    fn staggered(&self, period: Duration) -> Duration {
        self.seat
            .as_ref()
            .map_or(Duration::ZERO, |s| s.offset(period))
    }

    /// Runs passes until `shutdown` resolves, then finishes the current batch, flushes the
    /// producer and returns. Wakes on the `outbox_notify` trigger (LISTEN) and polls every
    /// `poll_interval` as a fallback; runs cleanup on its schedule. Postgres and Kafka outages
    /// are logged and waited out with capped backoff; this returns only on shutdown.
    ///
    /// # Errors
    /// None at present; the `Result` leaves room for fatal conditions.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), RelayError> {
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        let wake = self.wake.clone();
        {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                shutdown.await;
                cancel.cancel();
            });
        }
        if self.config.listen {
            tracker.spawn(listen(
                self.db.clone(),
                wake.clone(),
                self.floor.clone(),
                cancel.clone(),
                self.outages.clone(),
            ));
        }
        tracker.spawn(sweep_schedule(
            self.pool.clone(),
            self.stmts.clone(),
            self.floor.clone(),
            (
                self.config.sweep_interval,
                self.staggered(self.config.sweep_interval),
            ),
            wake.clone(),
            cancel.clone(),
        ));
        if let Some(every) = self.config.cleanup.interval {
            tracker.spawn(cleanup_schedule(
                self.pool.clone(),
                self.db.schema.clone(),
                self.stmts.clone(),
                self.config.cleanup.clone(),
                (every, self.staggered(every)),
                cancel.clone(),
            ));
        }
        // The counters exist from the start (at 0), so a rule's `increase()` sees the first
        // failure, also on a relay that leaves cleanup to a cron job.
        metrics::counter!(crate::metrics::OUTBOX_CLEANUP_FAILURES).increment(0);
        for result in ["reclaimed", "busy", "advanced"] {
            metrics::counter!(crate::metrics::OUTBOX_RING_ROTATIONS, "result" => result)
                .increment(0);
        }
        tracker.spawn(gauges_schedule(
            self.pool.clone(),
            self.db.schema.clone(),
            self.stmts.clone(),
            self.seat
                .as_ref()
                .map(|s| (s.gauges.clone(), s.tenant.clone())),
            self.staggered(GAUGES_EVERY),
            cancel.clone(),
        ));
        {
            // The heartbeat the admin server's overview reads: this relay is alive, and where
            // its next claim starts.
            let beat = crate::instances::Heartbeat::new(
                self.pool.clone(),
                &self.db.schema,
                "relay",
                "relay",
            );
            let (floor, c) = (self.floor_probe(), cancel.clone());
            let exactly_once = self.config.exactly_once.is_some();
            // A fleet's relays beat at staggered moments (see `gauges_schedule`).
            let first = self.staggered(crate::instances::HEARTBEAT_EVERY);
            tracker.spawn(async move {
                tokio::select! {
                    () = c.cancelled() => return,
                    () = tokio::time::sleep(first) => {}
                }
                loop {
                    beat.beat(
                        serde_json::json!({ "claim_floor": floor(), "exactly_once": exactly_once }),
                    )
                    .await;
                    tokio::select! {
                        () = c.cancelled() => {
                            beat.stopped().await;
                            return;
                        }
                        () = tokio::time::sleep(crate::instances::HEARTBEAT_EVERY) => {}
                    }
                }
            });
        }
        metrics::gauge!(crate::metrics::RELAY_EXACTLY_ONCE).set(
            if self.config.exactly_once.is_some() {
                1.0
            } else {
                0.0
            },
        );
        {
            // The series exist from the start (at 0, in either mode), so the abort alert's
            // sums and the dashboard see them.
            metrics::counter!(crate::metrics::RELAY_TXN_COMMITTED).increment(0);
            for reason in ["fenced", "fatal", "ambiguous"] {
                metrics::counter!(crate::metrics::RELAY_TXN_UNKNOWN, "reason" => reason)
                    .increment(0);
            }
            for reason in ["undelivered", "refused", "commit_failed"] {
                metrics::counter!(crate::metrics::RELAY_TXN_ABORTED, "reason" => reason)
                    .increment(0);
            }
        }
        if self.seat.is_none() {
            // A fleet's relays answer to the fleet's probes: a tenant's database being down
            // must not make the whole process unready.
            tracker.spawn(crate::health::spawn_prober(
                self.health.clone(),
                self.pool.clone(),
                self.db.clone(),
                self.kafka.clone(),
                cancel.clone(),
            ));
        }
        // A pass may wait out a whole delivery timeout (Kafka down) and a backoff: silent
        // longer than that, the loop is stuck.
        let allowance = self.config.delivery_timeout + REPORT_MARGIN + Duration::from_secs(60);
        info!(schema = %self.db.schema, batch_size = self.config.batch_size, exactly_once = self.config.exactly_once.is_some(), "relay started");

        let mut backoff = Backoff::default();
        let mut total_sent: u64 = 0;
        while !cancel.is_cancelled() {
            self.health.beat("relay", allowance);
            // In a fleet, a pass waits its turn among the tenants (`gate.rs`); the permit is
            // dropped before any wait below, so a tenant backing off holds no one up.
            let permit = match &self.seat {
                Some(seat) => {
                    let weight = seat.weight.load(std::sync::atomic::Ordering::Relaxed);
                    tokio::select! {
                        () = cancel.cancelled() => break,
                        p = seat.gate.acquire(seat.id, weight) => Some(p),
                    }
                }
                None => None,
            };
            // Batches back to back (pipelined) until one comes back short.
            let pumped = self
                .pump(&cancel, self.seat.as_ref().map(|s| s.quantum))
                .await;
            drop(permit);
            let wait = match pumped {
                Ok((Outcome::Published(r), cut)) => {
                    total_sent += r.sent as u64;
                    if r.deferred > 0 {
                        Some(backoff.next_delay())
                    } else {
                        backoff.reset();
                        // Stopped for the quantum with more to do: at once, behind whoever
                        // waits at the gate.
                        cut.then_some(Duration::ZERO)
                    }
                }
                Ok((Outcome::Empty, _)) => {
                    backoff.reset();
                    None
                }
                Err(e) => {
                    let d = backoff.next_delay();
                    match &e {
                        RelayError::Postgres(_) | RelayError::Pool(_) => self
                            .outages
                            .postgres
                            .failed(&format!("relay pass failed; backing off: {e}")),
                        _ => {
                            warn!(error = %e, retry_in = ?d, failures = backoff.failures(), "relay pass failed; backing off")
                        }
                    }
                    Some(d)
                }
            };
            match wait {
                Some(d) => {
                    tokio::select! {
                        () = cancel.cancelled() => {}
                        () = tokio::time::sleep(d) => {}
                    }
                }
                None => {
                    // A fleet's idle tenant waits longer for a notification (at a pace of its
                    // own, so hundreds of them do not look at once), unless rows of it are
                    // backed off and must go when due.
                    let poll = match &self.seat {
                        Some(s)
                            if !self.rows_waiting.load(std::sync::atomic::Ordering::Relaxed) =>
                        {
                            (s.idle_poll / 2 + s.offset(s.idle_poll)).max(self.config.poll_interval)
                        }
                        _ => self.config.poll_interval,
                    };
                    tokio::select! {
                        () = cancel.cancelled() => {}
                        () = wake.notified() => {}
                        () = tokio::time::sleep(poll) => {}
                    }
                }
            }
        }

        self.health.stopping();
        info!(total_sent, "relay stopping: flushing producer");
        cancel.cancel();
        tracker.close();
        let producer = self.producer();
        let budget = self.config.shutdown_timeout;
        let flushed =
            tokio::task::spawn_blocking(move || producer.flush(Timeout::After(budget))).await;
        if let Ok(Err(e)) = flushed {
            warn!(error = %e, "producer flush incomplete at shutdown; unacked rows stay pending");
        }
        // Its lanes go back now: on a fleet's shared session they would otherwise stay taken.
        self.lanes.lock().await.release().await;
        if tokio::time::timeout(budget, tracker.wait()).await.is_err() {
            warn!("background tasks did not stop in time");
        }
        info!("relay stopped");
        Ok(())
    }
}
