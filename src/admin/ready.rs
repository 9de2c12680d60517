//! `/readyz` answered from state the server keeps: one task probes Postgres (over one kept
//! connection), Kafka (one kept client) and the archiver's heartbeat every
//! [`PROBE_EVERY`], and the route reads the last result. However often, and by however
//! many, `/readyz` is called, it costs no connection and no client of its own.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::{DbConfig, KafkaConfig};

/// How often the prober looks.
pub const PROBE_EVERY: Duration = crate::health::PROBE_EVERY;
/// How long one look at Postgres or Kafka may take.
use crate::health::PROBE_TIMEOUT;

/// One look at each dependency: `Ok` or why not (secrets taken out).
#[derive(Debug, Clone)]
pub(crate) struct Report {
    pub postgres: Result<(), String>,
    pub kafka: Result<(), String>,
    pub archiver: Result<(), String>,
    /// When the look was taken.
    pub at: std::time::Instant,
}

impl Report {
    /// A look older than this means the prober stopped: not ready, whatever it saw.
    const STALE: Duration =
        Duration::from_secs(PROBE_EVERY.as_secs() * 3 + PROBE_TIMEOUT.as_secs() * 2);

    fn fresh(&self) -> bool {
        self.at.elapsed() < Self::STALE
    }

    pub(crate) fn ready(&self) -> bool {
        self.fresh() && self.postgres.is_ok() && self.kafka.is_ok() && self.archiver.is_ok()
    }

    pub(crate) fn to_json(&self) -> Value {
        let show = |r: &Result<(), String>| match r {
            Ok(()) => json!("ok"),
            Err(e) => json!(e),
        };
        let mut v = json!({"ready": self.ready(), "postgres": show(&self.postgres),
               "kafka": show(&self.kafka), "archiver": show(&self.archiver),
               "checked_secs_ago": (self.at.elapsed().as_secs_f64() * 10.0).round() / 10.0});
        if !self.fresh() {
            v["stale"] = json!("the readiness probe has stopped looking");
        }
        v
    }
}

/// Starts the prober (once, by the first reader).
type Start = Box<dyn FnOnce() + Send>;

/// The last report, and the prober that keeps it (started by the first reader).
#[derive(Clone)]
pub(crate) struct Readiness {
    rx: watch::Receiver<Option<Report>>,
    start: Arc<Mutex<Option<Start>>>,
}

impl Readiness {
    /// A prober over `db` and `kafka` that stops with `stop`; it starts on first use.
    pub(crate) fn new(db: &DbConfig, kafka: &KafkaConfig, stop: CancellationToken) -> Self {
        let (tx, rx) = watch::channel(None);
        let (db, kafka) = (db.clone(), kafka.clone());
        let start: Start = Box::new(move || {
            tokio::spawn(probe_loop(db, kafka, tx, stop));
        });
        Self {
            rx,
            start: Arc::new(Mutex::new(Some(start))),
        }
    }

    /// The last report; right after start, waits (briefly) for the first.
    pub(crate) async fn report(&self) -> Option<Report> {
        if let Some(start) = self
            .start
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            start();
        }
        let mut rx = self.rx.clone();
        let first = rx.wait_for(Option::is_some);
        let _ = tokio::time::timeout(PROBE_TIMEOUT * 3, first).await;
        self.rx.borrow().clone()
    }
}

async fn probe_loop(
    db: DbConfig,
    kafka: KafkaConfig,
    tx: watch::Sender<Option<Report>>,
    stop: CancellationToken,
) {
    let mut pg: Option<tokio_postgres::Client> = None;
    let producer = crate::health::kafka_client(&kafka);
    loop {
        let (postgres, archiver) = probe_postgres(&db, &mut pg).await;
        let kafka_state = crate::health::kafka_look(&producer, &kafka).await;
        let report = Report {
            postgres: postgres.map_err(|e| db.redact(&e)),
            kafka: kafka_state,
            archiver: archiver.map_err(|e| db.redact(&e)),
            at: std::time::Instant::now(),
        };
        if tx.send(Some(report)).is_err() {
            return;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(PROBE_EVERY) => {}
        }
    }
}

/// Postgres and the archiver's heartbeat, over one connection kept between looks.
async fn probe_postgres(
    db: &DbConfig,
    pg: &mut Option<tokio_postgres::Client>,
) -> (Result<(), String>, Result<(), String>) {
    if pg.as_ref().is_none_or(tokio_postgres::Client::is_closed) {
        *pg = match tokio::time::timeout(PROBE_TIMEOUT, crate::db::connect(db)).await {
            Ok(Ok(c)) => Some(c),
            Ok(Err(e)) => return (Err(e.to_string()), Err("postgres unreachable".into())),
            Err(_) => return (Err("timed out".into()), Err("postgres unreachable".into())),
        };
    }
    let Some(c) = pg.as_ref() else {
        return (
            Err("no connection".into()),
            Err("postgres unreachable".into()),
        );
    };
    let look = async {
        c.simple_query("SELECT 1")
            .await
            .map_err(|e| e.to_string())?;
        crate::instances::archiver_health_on(c, db)
            .await
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(PROBE_TIMEOUT, look).await {
        Err(_) => {
            *pg = None;
            (Err("timed out".into()), Err("postgres timed out".into()))
        }
        Ok(Err(e)) => {
            *pg = None;
            (Err(e), Err("postgres unreachable".into()))
        }
        // A DLQ nobody archives is a black hole: without a live archiver, not ready.
        Ok(Ok(a)) if !a.late => (Ok(()), Ok(())),
        Ok(Ok(a)) => (
            Ok(()),
            Err(match a.last_seen_secs {
                Some(secs) => format!("late: last seen {secs:.0} s ago"),
                None => {
                    "missing: no archiver seen in the last hour (run `outbox dlq archive`)".into()
                }
            }),
        ),
    }
}
