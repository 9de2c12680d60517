//! What a fleet's relays of one database share: one pool, one session for their lane locks,
//! one LISTEN session for every tenant's channel (and, in the control database, the
//! registry's). A database costs the fleet `pool + 2` sessions whatever its tenant count.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::DbConfig;
use crate::relay::{LockSession, Relay, Waker};

use super::FleetError;

/// One database's shared sessions.
pub(super) struct Database {
    pub(super) pool: Pool,
    pub(super) locks: Arc<LockSession>,
    listeners: Arc<Listeners>,
}

/// The channels a database's LISTEN session follows and whom each wakes.
#[derive(Default)]
struct Listeners {
    by_channel: Mutex<HashMap<String, Target>>,
    /// The set of channels changed: LISTEN / UNLISTEN on the live session.
    changed: Notify,
}

#[derive(Clone)]
enum Target {
    Relay(Waker),
    Registry(Arc<Notify>),
}

impl Database {
    /// `db`'s pool of at most `pool_size` connections (with the relay's plan settings), a lock
    /// session, and a LISTEN session (started here, ended by `cancel`).
    pub(super) fn new(
        db: &DbConfig,
        pool_size: usize,
        cancel: CancellationToken,
    ) -> Result<Self, FleetError> {
        let mut sized = db.clone();
        sized.pool_size = pool_size;
        let pool = Relay::pool_for(&sized)?;
        let listeners = Arc::new(Listeners::default());
        tokio::spawn(listen(db.clone(), listeners.clone(), cancel));
        Ok(Self {
            pool,
            locks: LockSession::new(db),
            listeners,
        })
    }

    /// Wakes `waker` on `channel`'s notifications.
    pub(super) fn follow(&self, channel: String, waker: Waker) {
        self.set(channel, Some(Target::Relay(waker)));
    }

    /// Wakes the reload loop on the registry's channel.
    pub(super) fn follow_registry(&self, channel: String, wake: Arc<Notify>) {
        self.set(channel, Some(Target::Registry(wake)));
    }

    /// Stops following `channel`.
    pub(super) fn unfollow(&self, channel: &str) {
        self.set(channel.to_owned(), None);
    }

    fn set(&self, channel: String, target: Option<Target>) {
        {
            let mut m = self.listeners.by_channel.lock().expect("listeners");
            match target {
                Some(t) => m.insert(channel, t),
                None => m.remove(&channel),
            };
        }
        self.listeners.changed.notify_one();
    }
}

/// Keeps one LISTEN session on `db` following every channel in `listeners`; reconnects after a
/// failure and then wakes everyone (notifications sent meanwhile are lost, and each relay also
/// polls).
async fn listen(db: DbConfig, listeners: Arc<Listeners>, cancel: CancellationToken) {
    let mut backoff = crate::backoff::Backoff::default();
    while !cancel.is_cancelled() {
        let attempt = async {
            let (client, mut conn) = db.pg.connect(db.tls.clone()).await?;
            let l = listeners.clone();
            let driver = tokio::spawn(async move {
                use futures::StreamExt;
                let mut stream = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
                while let Some(msg) = stream.next().await {
                    match msg {
                        Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                            let t = l
                                .by_channel
                                .lock()
                                .expect("listeners")
                                .get(n.channel())
                                .cloned();
                            match t {
                                Some(Target::Relay(w)) => w.notified(n.payload()),
                                Some(Target::Registry(wake)) => wake.notify_one(),
                                None => {}
                            }
                        }
                        Ok(_) => {}
                        Err(_) => return,
                    }
                }
            });
            Ok::<_, tokio_postgres::Error>((client, driver))
        };
        let (client, mut driver) = match attempt.await {
            Ok(x) => x,
            Err(e) => {
                let d = backoff.next_delay();
                tracing::debug!(error = %e, retry_in = ?d, "fleet: cannot open the LISTEN session");
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(d) => continue,
                }
            }
        };
        backoff.reset();
        let mut listening: std::collections::HashSet<String> = Default::default();
        let mut woke = false;
        loop {
            let want: Vec<(String, Target)> = listeners
                .by_channel
                .lock()
                .expect("listeners")
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let mut sql = String::new();
            for (c, _) in &want {
                if !listening.contains(c) {
                    sql.push_str(&format!("LISTEN \"{}\";", c.replace('"', "")));
                }
            }
            let wanted: std::collections::HashSet<&String> = want.iter().map(|(c, _)| c).collect();
            for c in &listening {
                if !wanted.contains(c) {
                    sql.push_str(&format!("UNLISTEN \"{}\";", c.replace('"', "")));
                }
            }
            if !sql.is_empty() {
                if client.batch_execute(&sql).await.is_err() {
                    break;
                }
                listening = want.iter().map(|(c, _)| c.clone()).collect();
            }
            if !woke {
                // Connected (again): what was sent while no one listened is lost.
                for (_, t) in &want {
                    match t {
                        Target::Relay(w) => w.notified(""),
                        Target::Registry(wake) => wake.notify_one(),
                    }
                }
                woke = true;
            }
            tokio::select! {
                () = cancel.cancelled() => { driver.abort(); return; }
                _ = &mut driver => break,
                () = listeners.changed.notified() => {}
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}
