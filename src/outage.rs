//! One log line per outage: when it starts, at most once a minute while it lasts, and when it
//! ends (with its duration). Background loops report every failure and every success here
//! instead of logging each retry: a 20 s Kafka outage used to print hundreds of lines.

use std::fmt::Display;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::{info, warn};

/// How often a lasting outage is logged again.
const REPEAT: Duration = Duration::from_secs(60);

struct Ongoing {
    since: Instant,
    logged: Instant,
    failures: u64,
}

/// The state of one dependency (Postgres, Kafka) as seen by one component.
pub(crate) struct Outage {
    what: &'static str,
    who: &'static str,
    state: Mutex<Option<Ongoing>>,
}

impl Outage {
    pub(crate) const fn new(what: &'static str, who: &'static str) -> Self {
        Self {
            what,
            who,
            state: Mutex::new(None),
        }
    }

    /// A failure: logged if it starts an outage, or if the last line is a minute old.
    pub(crate) fn failed(&self, error: &dyn Display) {
        let mut s = self.state.lock().expect("outage lock");
        match s.as_mut() {
            None => {
                warn!(dependency = self.what, component = self.who, error = %error, "{} unreachable: outage started (retrying with backoff; logged again once a minute)", self.what);
                *s = Some(Ongoing {
                    since: Instant::now(),
                    logged: Instant::now(),
                    failures: 1,
                });
            }
            Some(o) => {
                o.failures += 1;
                if o.logged.elapsed() >= REPEAT {
                    o.logged = Instant::now();
                    warn!(dependency = self.what, component = self.who, error = %error, lasted = ?o.since.elapsed(), failures = o.failures, "{} still unreachable", self.what);
                }
            }
        }
    }

    /// A success: ends an outage (one line with its duration).
    pub(crate) fn ok(&self) {
        let mut s = self.state.lock().expect("outage lock");
        if let Some(o) = s.take() {
            info!(dependency = self.what, component = self.who, lasted = ?o.since.elapsed(), failures = o.failures, "{} reachable again: outage ended", self.what);
        }
    }

    /// Whether an outage is ongoing.
    #[cfg(test)]
    pub(crate) fn is_down(&self) -> bool {
        self.state.lock().expect("outage lock").is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_down_until_a_success() {
        let o = Outage::new("kafka", "test");
        assert!(!o.is_down());
        o.failed(&"refused");
        o.failed(&"refused");
        assert!(o.is_down());
        o.ok();
        assert!(!o.is_down());
    }
}
