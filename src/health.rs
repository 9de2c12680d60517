//! Liveness and readiness of a long-running part, for probes (`/healthz`, `/readyz` next to
//! `/metrics`) and for a service that embeds the part and wires its own probes.
//!
//! - **Live**: every loop of the part has beaten within its allowance. It never looks at
//!   Postgres or Kafka: an outage of either must not turn into a restart storm (the part waits
//!   it out on its own).
//! - **Ready**: live, and each dependency answered its last look (kept fresh by a prober every
//!   [`PROBE_EVERY`]), and the part is not shutting down.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// How often a part's prober looks at its dependencies.
pub const PROBE_EVERY: Duration = Duration::from_secs(5);
/// How long one look may take.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// A dependency's look older than this is stale: the prober stopped, so not ready.
const STALE: Duration =
    Duration::from_secs(PROBE_EVERY.as_secs() * 3 + PROBE_TIMEOUT.as_secs() * 2);

/// A part's health: cheap to clone, read from any thread.
#[derive(Clone, Default)]
pub struct Health {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("live", &self.live().ok)
            .field("ready", &self.ready().ok)
            .finish()
    }
}

/// A dependency's state at a look, and when the look was.
type Look = (Result<(), String>, Instant);

#[derive(Default)]
struct Inner {
    /// Each loop's last beat and how long it may stay silent.
    loops: Mutex<BTreeMap<&'static str, (Instant, Duration)>>,
    /// Each dependency's last look.
    deps: Mutex<BTreeMap<&'static str, Look>>,
    /// Conditions the part itself reports as it works (never stale), e.g. an exactly-once
    /// relay's slots fenced by another producer.
    conditions: Mutex<BTreeMap<&'static str, Result<(), String>>>,
    /// Set once shutdown began: not ready any more (a load balancer stops sending work).
    stopping: std::sync::atomic::AtomicBool,
}

/// One answer: whether the check passed, and what it saw (JSON, for the probe's body).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// Passed.
    pub ok: bool,
    /// What was seen: each loop's silence in seconds, or each dependency's state.
    pub detail: Value,
}

impl Health {
    /// A part with no loop and no dependency yet (live, not ready).
    pub fn new() -> Self {
        Self::default()
    }

    /// Loop `name` is alive; it may stay silent for `allowance` before the part is not live.
    pub(crate) fn beat(&self, name: &'static str, allowance: Duration) {
        self.inner
            .loops
            .lock()
            .expect("health lock")
            .insert(name, (Instant::now(), allowance));
    }

    /// The last look at dependency `name`.
    pub(crate) fn looked(&self, name: &'static str, state: Result<(), String>) {
        self.inner
            .deps
            .lock()
            .expect("health lock")
            .insert(name, (state, Instant::now()));
    }

    /// A condition the part reports itself as it works (kept until it reports again).
    pub(crate) fn condition(&self, name: &'static str, state: Result<(), String>) {
        self.inner
            .conditions
            .lock()
            .expect("health lock")
            .insert(name, state);
    }

    /// Shutdown began: not ready from now on.
    pub(crate) fn stopping(&self) {
        self.inner
            .stopping
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Live: every loop beat within its allowance.
    pub fn live(&self) -> Answer {
        let loops = self.inner.loops.lock().expect("health lock");
        let mut ok = true;
        let mut detail = serde_json::Map::new();
        for (name, (at, allowance)) in loops.iter() {
            let silent = at.elapsed();
            ok &= silent <= *allowance;
            detail.insert(
                (*name).to_owned(),
                json!({"silent_secs": round1(silent), "allowance_secs": round1(*allowance)}),
            );
        }
        Answer {
            ok,
            detail: json!({"live": ok, "loops": detail}),
        }
    }

    /// Ready: live, not stopping, and every dependency's fresh look passed.
    pub fn ready(&self) -> Answer {
        let live = self.live();
        let stopping = self
            .inner
            .stopping
            .load(std::sync::atomic::Ordering::Relaxed);
        let deps = self.inner.deps.lock().expect("health lock");
        let detail_empty = deps.is_empty();
        let mut ok = live.ok && !stopping && !detail_empty;
        let mut detail = serde_json::Map::new();
        for (name, (state, at)) in deps.iter() {
            let fresh = at.elapsed() <= STALE;
            ok &= fresh && state.is_ok();
            detail.insert(
                (*name).to_owned(),
                match (state, fresh) {
                    (_, false) => json!("stale: the prober stopped looking"),
                    (Ok(()), true) => json!("ok"),
                    (Err(e), true) => json!(e),
                },
            );
        }
        drop(deps);
        let mut conditions = serde_json::Map::new();
        for (name, state) in self.inner.conditions.lock().expect("health lock").iter() {
            ok &= state.is_ok();
            conditions.insert(
                (*name).to_owned(),
                match state {
                    Ok(()) => json!("ok"),
                    Err(e) => json!(e),
                },
            );
        }
        let mut v = json!({"ready": ok, "live": live.ok, "dependencies": detail});
        if !conditions.is_empty() {
            v["conditions"] = Value::Object(conditions);
        }
        if stopping {
            v["stopping"] = json!(true);
        }
        if detail_empty {
            v["dependencies"] = json!("not looked at yet");
        }
        Answer { ok, detail: v }
    }
}

fn round1(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

/// The client a prober keeps for its life (librdkafka reconnects by itself).
#[cfg(feature = "kafka")]
pub(crate) fn kafka_client(
    kafka: &crate::config::KafkaConfig,
) -> Result<Arc<rdkafka::producer::BaseProducer>, String> {
    kafka
        .client_config()
        .create()
        .map(Arc::new)
        .map_err(|e| kafka.redact(&e.to_string()))
}

/// One look at Kafka through `client` (its metadata, bounded by [`PROBE_TIMEOUT`]), secrets
/// taken out of the error.
#[cfg(feature = "kafka")]
pub(crate) async fn kafka_look(
    client: &Result<Arc<rdkafka::producer::BaseProducer>, String>,
    kafka: &crate::config::KafkaConfig,
) -> Result<(), String> {
    let p = client.as_ref().map_err(Clone::clone)?.clone();
    tokio::task::spawn_blocking(move || {
        use rdkafka::producer::Producer as _;
        // Serve the client's own events (errors, statistics, token refreshes), or they pile up.
        p.poll(Duration::ZERO);
        p.client()
            .fetch_metadata(None, PROBE_TIMEOUT)
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()))
    .map_err(|e| kafka.redact(&e))
}

/// Looks at Postgres (through `pool`) and Kafka (through one client kept for the prober's life:
/// librdkafka reconnects by itself) every [`PROBE_EVERY`] until `stop`, recording each look in
/// `health` as `postgres` and `kafka`. Errors are recorded with secrets taken out.
#[cfg(feature = "kafka")]
pub(crate) fn spawn_prober(
    health: Health,
    pool: deadpool_postgres::Pool,
    db: crate::config::DbConfig,
    kafka: crate::config::KafkaConfig,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = kafka_client(&kafka);
        loop {
            let pg = async {
                let c = pool.get().await.map_err(|e| e.to_string())?;
                c.simple_query("SELECT 1")
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<(), String>(())
            };
            let pg = match tokio::time::timeout(PROBE_TIMEOUT, pg).await {
                Ok(r) => r.map_err(|e| db.redact(&e)),
                Err(_) => Err("timed out".into()),
            };
            let k = kafka_look(&client, &kafka).await;
            // Both recorded together: never ready on a first look at one of them alone.
            health.looked("postgres", pg);
            health.looked("kafka", k);
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(PROBE_EVERY) => {}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_follows_the_loops_and_ready_the_dependencies() {
        let h = Health::new();
        assert!(h.live().ok, "no loop yet: nothing has stopped");
        assert!(!h.ready().ok, "no look yet: not ready");
        h.beat("relay", Duration::from_secs(60));
        h.looked("postgres", Ok(()));
        h.looked("kafka", Ok(()));
        assert!(h.live().ok && h.ready().ok, "{:?}", h.ready());
        h.looked("kafka", Err("broker down".into()));
        let r = h.ready();
        assert!(!r.ok && h.live().ok, "an outage is not a liveness failure");
        assert_eq!(r.detail["dependencies"]["kafka"], "broker down");
        h.looked("kafka", Ok(()));
        h.beat("stuck", Duration::ZERO);
        std::thread::sleep(Duration::from_millis(5));
        assert!(!h.live().ok && !h.ready().ok, "a silent loop is not live");
        h.beat("stuck", Duration::from_secs(60));
        assert!(h.ready().ok);
        h.condition("exactly_once", Err("slot 3 fenced".into()));
        assert!(!h.ready().ok && h.live().ok);
        assert_eq!(
            h.ready().detail["conditions"]["exactly_once"],
            "slot 3 fenced"
        );
        h.condition("exactly_once", Ok(()));
        assert!(h.ready().ok);
        h.stopping();
        assert!(!h.ready().ok && h.live().ok, "stopping: live, not ready");
        assert_eq!(h.ready().detail["stopping"], true);
    }
}
