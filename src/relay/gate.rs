//! A relay fleet's gate: which of its relays (one per tenant) may run a pass next.
//!
//! At most `capacity` passes run at once. A drainer asks before each pass and gets a
//! [`Permit`], released when dropped. Among those waiting, the one whose request carries the
//! lowest *start tag* goes first (start-time fair queuing): a request's tag is the later of the
//! gate's virtual time and the tenant's previous finish tag, and each pass moves the tenant's
//! finish tag on by `1 / weight`. A tenant that asks again and again (a large backlog) collects
//! ever higher tags; one that has been idle asks with the current virtual time and goes ahead
//! of it at the next release — fairness over passes, whatever each pass's size.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// A relay's place in a fleet: the gate it asks before each pass, under which tenant and
/// weight, and how many batches a pass may claim before it gives way.
#[derive(Clone)]
pub(crate) struct Seat {
    pub(crate) gate: Gate,
    pub(crate) id: u64,
    /// Changed by a reload without restarting the relay.
    pub(crate) weight: Arc<std::sync::atomic::AtomicU32>,
    pub(crate) quantum: usize,
    /// How long the relay sleeps when idle, unless a notification wakes it or its last claim
    /// saw rows not due yet (then `poll_interval`): hundreds of idle tenants polling every
    /// 500 ms kept Postgres busy (`FleetConfig::idle_poll`).
    pub(crate) idle_poll: std::time::Duration,
    /// The label of this relay's gauges.
    pub(crate) tenant: Arc<str>,
    /// Where its gauges go (the fleet publishes them, labels capped).
    pub(crate) gauges: Arc<TenantGauges>,
}

impl Seat {
    /// Where in `period` this seat's relay does its periodic work (gauges, heartbeat, sweep,
    /// cleanup, the idle poll): the same each time, spread evenly over the fleet's relays,
    /// since `id` is a hash of the outbox (`fleet::run::seat_id`).
    pub(crate) fn offset(&self, period: std::time::Duration) -> std::time::Duration {
        let ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX).max(1);
        std::time::Duration::from_millis(self.id % ms)
    }
}

/// One outbox's gauge values, as `refresh_outbox_gauges` reads them.
#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub(crate) struct GaugeValues {
    pub(crate) pending: f64,
    pub(crate) failed: f64,
    pub(crate) sent: f64,
    pub(crate) oldest: f64,
    pub(crate) bytes: f64,
    pub(crate) generations: f64,
    pub(crate) oldest_generation: f64,
}

impl GaugeValues {
    /// Sets the outbox gauges to these values, labelled with `tenant` when given.
    pub(crate) fn publish(&self, tenant: Option<&str>, storage: bool, counted: bool) {
        let gauge = |name: &'static str, status: Option<&'static str>| {
            let mut labels = Vec::new();
            if let Some(s) = status {
                labels.push(metrics::Label::new("status", s));
            }
            if let Some(t) = tenant {
                labels.push(metrics::Label::new("tenant", t.to_owned()));
            }
            metrics::gauge!(name, labels)
        };
        if storage {
            gauge(crate::metrics::OUTBOX_STORAGE_BYTES, None).set(self.bytes);
            gauge(crate::metrics::OUTBOX_RING_GENERATIONS, None).set(self.generations);
            gauge(crate::metrics::OUTBOX_RING_OLDEST_GENERATION_AGE, None)
                .set(self.oldest_generation);
        }
        if counted {
            gauge(crate::metrics::OUTBOX_ROWS, Some("pending")).set(self.pending);
            gauge(crate::metrics::OUTBOX_ROWS, Some("failed")).set(self.failed);
            gauge(crate::metrics::OUTBOX_ROWS, Some("sent")).set(self.sent);
            gauge(crate::metrics::OUTBOX_OLDEST_PENDING_AGE, None).set(self.oldest);
        }
    }

    /// `self` and `other` as one: counts and sizes add, ages take the older.
    fn merge(self, o: Self) -> Self {
        Self {
            pending: self.pending + o.pending,
            failed: self.failed + o.failed,
            sent: self.sent + o.sent,
            oldest: self.oldest.max(o.oldest),
            bytes: self.bytes + o.bytes,
            generations: self.generations + o.generations,
            oldest_generation: self.oldest_generation.max(o.oldest_generation),
        }
    }
}

/// A fleet's outbox gauges, per tenant, published with at most `cap` tenant labels: the
/// first `cap` tenants known (admitted by the fleet as it starts them, in name order within
/// one reload) keep a label of their own for the process's life (a label once given is never
/// given to another, so the series stay bounded), every other tenant is summed into
/// `tenant="other"`. 1,000 tenants cost `cap + 1` series per gauge. A labelled tenant is
/// published from its first recorded values on (its relay's first refresh comes at a
/// staggered moment, `Seat::offset`), so which tenants get a label does not depend
/// on which relay refreshed first.
pub(crate) struct TenantGauges {
    cap: usize,
    state: Mutex<GaugeState>,
}

#[derive(Default)]
struct GaugeState {
    values: std::collections::BTreeMap<String, GaugeValues>,
    /// Tenants the fleet runs (or ran), whether recorded yet or not.
    known: std::collections::BTreeSet<String>,
    labelled: std::collections::BTreeSet<String>,
    /// Tenants recorded at least once: a labelled one is published from then on.
    recorded: std::collections::BTreeSet<String>,
}

impl TenantGauges {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            cap,
            state: Mutex::default(),
        }
    }

    /// A tenant the fleet starts: it may take a label before its first values arrive.
    pub(crate) fn admit(&self, tenant: &str) {
        self.state
            .lock()
            .expect("tenant gauges")
            .known
            .insert(tenant.to_owned());
    }

    pub(crate) fn record(&self, tenant: &str, v: GaugeValues) {
        let mut s = self.state.lock().expect("tenant gauges");
        s.recorded.insert(tenant.to_owned());
        s.values.insert(tenant.to_owned(), v);
    }

    /// A tenant no longer published: its labelled series go to 0, its values leave `other`.
    pub(crate) fn forget(&self, tenant: &str) {
        let mut s = self.state.lock().expect("tenant gauges");
        s.values.remove(tenant);
        if !s.labelled.contains(tenant) {
            s.known.remove(tenant);
        }
    }

    /// What to publish: each labelled tenant's values (0 once gone) and the rest's sum.
    pub(crate) fn series(&self) -> (Vec<(String, GaugeValues)>, Option<GaugeValues>) {
        let mut s = self.state.lock().expect("tenant gauges");
        let GaugeState {
            values,
            known,
            labelled,
            recorded,
        } = &mut *s;
        let names: std::collections::BTreeSet<&String> =
            known.iter().chain(values.keys()).collect();
        for t in names {
            if labelled.len() >= self.cap {
                break;
            }
            labelled.insert(t.clone());
        }
        let own = labelled
            .iter()
            .filter(|t| recorded.contains(*t))
            .map(|t| (t.clone(), values.get(t).copied().unwrap_or_default()))
            .collect();
        let rest = values
            .iter()
            .filter(|(t, _)| !labelled.contains(*t))
            .map(|(_, v)| *v)
            .reduce(GaugeValues::merge);
        (own, rest)
    }

    /// Sets the gauges (see [`TenantGauges::series`]).
    pub(crate) fn publish(&self) {
        let (own, rest) = self.series();
        for (t, v) in own {
            v.publish(Some(&t), true, true);
        }
        if let Some(v) = rest {
            v.publish(Some("other"), true, true);
        }
    }
}

/// A shared gate; cheap to clone.
#[derive(Clone)]
pub(crate) struct Gate {
    inner: Arc<Mutex<State>>,
}

struct State {
    free: usize,
    /// The start tag of the pass granted last.
    virtual_time: f64,
    /// Each tenant's finish tag: where its next request starts at the earliest.
    finish: HashMap<u64, f64>,
    waiting: Vec<Waiter>,
    /// Order of arrival among equal tags.
    seq: u64,
    /// Passes granted per tenant (for tests and the status view).
    granted: HashMap<u64, u64>,
    /// Passes granted to all tenants so far.
    total: u64,
    /// Per tenant, `total` when it first asked and when it was first granted a pass: the
    /// passes others got while it waited for its first (what "drained within two rounds" is
    /// measured by).
    first: HashMap<u64, (u64, Option<u64>)>,
}

impl State {
    /// Counts a pass granted to `tenant`.
    fn grant(&mut self, tenant: u64) {
        *self.granted.entry(tenant).or_default() += 1;
        let total = self.total;
        if let Some((_, g @ None)) = self.first.get_mut(&tenant) {
            *g = Some(total);
        }
        self.total += 1;
    }
}

struct Waiter {
    tag: f64,
    seq: u64,
    tenant: u64,
    tx: oneshot::Sender<Permit>,
}

/// The right to run one pass; the next waiter goes when it is dropped.
pub(crate) struct Permit {
    gate: Option<Gate>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(g) = self.gate.take() {
            g.release();
        }
    }
}

impl Gate {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(State {
                free: capacity.max(1),
                virtual_time: 0.0,
                finish: HashMap::new(),
                waiting: Vec::new(),
                seq: 0,
                granted: HashMap::new(),
                total: 0,
                first: HashMap::new(),
            })),
        }
    }

    /// Waits for a pass for `tenant` at `weight` (1 – 100). Dropping the future while it waits
    /// gives its turn away; a permit already handed to it goes back through `Permit`'s drop.
    pub(crate) async fn acquire(&self, tenant: u64, weight: u32) -> Permit {
        let rx = {
            let mut s = self.inner.lock().expect("gate");
            let start = s
                .finish
                .get(&tenant)
                .copied()
                .unwrap_or(0.0)
                .max(s.virtual_time);
            s.finish
                .insert(tenant, start + 1.0 / f64::from(weight.clamp(1, 100)));
            let total = s.total;
            s.first.entry(tenant).or_insert((total, None));
            if s.free > 0 && s.waiting.is_empty() {
                s.free -= 1;
                s.virtual_time = start;
                s.grant(tenant);
                return Permit {
                    gate: Some(self.clone()),
                };
            }
            let (tx, rx) = oneshot::channel();
            s.seq += 1;
            let seq = s.seq;
            s.waiting.push(Waiter {
                tag: start,
                seq,
                tenant,
                tx,
            });
            rx
        };
        match rx.await {
            Ok(p) => p,
            // The gate is gone with its senders: only at shutdown, when no pass matters.
            Err(_) => Permit { gate: None },
        }
    }

    fn release(&self) {
        let mut s = self.inner.lock().expect("gate");
        loop {
            let next = s
                .waiting
                .iter()
                .enumerate()
                .min_by(|(_, a), (_, b)| a.tag.total_cmp(&b.tag).then(a.seq.cmp(&b.seq)))
                .map(|(i, _)| i);
            let Some(i) = next else {
                s.free += 1;
                return;
            };
            let w = s.waiting.swap_remove(i);
            if w.tx.is_closed() {
                continue;
            }
            s.virtual_time = s.virtual_time.max(w.tag);
            s.grant(w.tenant);
            let permit = Permit {
                gate: Some(self.clone()),
            };
            match w.tx.send(permit) {
                Ok(()) => return,
                // Its receiver went between the check and the send: the permit came back
                // and its drop would re-enter this lock, so take it apart here and go on.
                Err(mut p) => {
                    p.gate = None;
                    *s.granted.entry(w.tenant).or_default() -= 1;
                    s.total -= 1;
                    let total = s.total;
                    if let Some((_, g)) = s.first.get_mut(&w.tenant) {
                        if *g == Some(total) {
                            *g = None;
                        }
                    }
                }
            }
        }
    }

    /// Forgets a tenant that no longer runs (its finish tag).
    pub(crate) fn forget(&self, tenant: u64) {
        let mut s = self.inner.lock().expect("gate");
        s.finish.remove(&tenant);
        s.granted.remove(&tenant);
        s.first.remove(&tenant);
    }

    /// How many passes the gate had granted (to anyone) when `tenant` first asked, and when
    /// it was first granted one.
    pub(crate) fn first(&self, tenant: u64) -> Option<(u64, Option<u64>)> {
        self.inner.lock().expect("gate").first.get(&tenant).copied()
    }

    /// Passes granted to `tenant` so far.
    pub(crate) fn granted(&self, tenant: u64) -> u64 {
        self.inner
            .lock()
            .expect("gate")
            .granted
            .get(&tenant)
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_labels_are_capped_and_the_rest_summed_into_other() {
        let g = TenantGauges::new(2);
        let v = |pending: f64, oldest: f64| GaugeValues {
            pending,
            oldest,
            ..GaugeValues::default()
        };
        for (t, p, o) in [
            ("c", 3.0, 1.0),
            ("a", 1.0, 5.0),
            ("d", 4.0, 9.0),
            ("b", 2.0, 2.0),
        ] {
            g.record(t, v(p, o));
        }
        let (own, rest) = g.series();
        assert_eq!(
            own,
            [("a".to_owned(), v(1.0, 5.0)), ("b".to_owned(), v(2.0, 2.0))]
        );
        assert_eq!(rest, Some(v(7.0, 9.0)));
        // A labelled tenant that goes keeps its label (at 0): no label moves to another.
        g.forget("a");
        let (own, rest) = g.series();
        assert_eq!(
            own,
            [
                ("a".to_owned(), GaugeValues::default()),
                ("b".to_owned(), v(2.0, 2.0))
            ]
        );
        assert_eq!(rest, Some(v(7.0, 9.0)));
    }

    /// The fleet admits its tenants as it starts them; their relays' first refreshes come in
    /// any order. The labels still go to the first admitted by name, and a labelled tenant
    /// shows no series (not a 0) before its first values.
    #[test]
    fn labels_go_to_the_admitted_tenants_by_name_whichever_refreshes_first() {
        let g = TenantGauges::new(1);
        for t in ["globex", "acme", "initech"] {
            g.admit(t);
        }
        let v = |pending: f64| GaugeValues {
            pending,
            ..GaugeValues::default()
        };
        g.record("globex", v(5.0));
        let (own, rest) = g.series();
        assert!(own.is_empty(), "acme has no values yet: {own:?}");
        assert_eq!(rest, Some(v(5.0)));
        g.record("initech", v(2.0));
        g.record("acme", v(1.0));
        let (own, rest) = g.series();
        assert_eq!(own, [("acme".to_owned(), v(1.0))]);
        assert_eq!(rest, Some(v(7.0)));
        // An unlabelled tenant that goes leaves no claim on a label behind.
        g.forget("globex");
        g.forget("initech");
        let (own, rest) = g.series();
        assert_eq!(own, [("acme".to_owned(), v(1.0))]);
        assert_eq!(rest, None);
    }

    /// One pass at a time; a tenant that asked 50 times in a row and a tenant that arrives
    /// later: the newcomer is served at the next release, not after the 50.
    #[tokio::test]
    async fn an_idle_tenant_goes_ahead_of_a_busy_one() {
        let g = Gate::new(1);
        let first = g.acquire(1, 1).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (g, o) = (g.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _p = g.acquire(1, 1).await;
                o.lock().unwrap().push(1);
            }));
            tokio::task::yield_now().await;
        }
        let (g2, o) = (g.clone(), order.clone());
        let small = tokio::spawn(async move {
            let _p = g2.acquire(2, 1).await;
            o.lock().unwrap().push(2);
        });
        tokio::task::yield_now().await;
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        small.await.unwrap();
        let order = order.lock().unwrap();
        let pos = order.iter().position(|t| *t == 2).unwrap();
        assert!(pos <= 1, "the small tenant was served {pos}th: {order:?}");
        assert_eq!(g.granted(1), 51);
        assert_eq!(g.granted(2), 1);
    }

    /// Two busy tenants of weights 3 and 1 share passes 3:1.
    #[tokio::test]
    async fn weights_share_passes() {
        let g = Gate::new(1);
        let hold = g.acquire(0, 1).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..40 {
            let (tenant, weight) = if i % 2 == 0 { (1, 3) } else { (2, 1) };
            let (g, o) = (g.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _p = g.acquire(tenant, weight).await;
                o.lock().unwrap().push(tenant);
            }));
            tokio::task::yield_now().await;
        }
        drop(hold);
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap();
        // Of the first 16 passes, tenant 1 (weight 3) had about three quarters.
        let ones = order[..16].iter().filter(|t| **t == 1).count();
        assert!((11..=13).contains(&ones), "{order:?}");
    }

    /// A waiter that gives up does not take a pass with it.
    #[tokio::test]
    async fn a_waiter_that_gives_up_loses_no_permit() {
        let g = Gate::new(1);
        let p = g.acquire(1, 1).await;
        let waiting = tokio::spawn({
            let g = g.clone();
            async move {
                let _p = g.acquire(2, 1).await;
            }
        });
        tokio::task::yield_now().await;
        waiting.abort();
        let _ = waiting.await;
        drop(p);
        // The gate is free again: this does not wait.
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), g.acquire(3, 1)).await;
        assert!(got.is_ok());
    }
}
