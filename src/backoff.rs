//! Capped exponential backoff with jitter, for waiting out an unavailable Postgres or Kafka.

use std::time::Duration;

/// First wait after a failure.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(100);
/// Longest wait between two tries.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Capped exponential backoff: the n-th consecutive failure waits
/// `min(max, base * 2^(n-1))`, scaled by a random factor in [0.5, 1.0] so that several relays
/// that lost the same server do not come back in lockstep. [`Backoff::reset`] after a success.
///
/// With the defaults: ~100 ms, 200 ms, 400 ms, … 3.2 s, then 5 s per try while the outage lasts:
/// no busy loop, and recovery within ~5 s of the service coming back.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    /// A backoff starting at `base` and never exceeding `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: 0,
        }
    }

    /// The wait before the next try; each call counts one more consecutive failure.
    pub fn next_delay(&mut self) -> Duration {
        let exp = self.failures.min(20);
        self.failures = self.failures.saturating_add(1);
        let raw = self.base.saturating_mul(1u32 << exp).min(self.max);
        raw.mul_f64(0.5 + fastrand::f64() * 0.5)
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Forget past failures (call after a success).
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_MAX)
    }
}

/// Runs `f` until it succeeds, waiting a [`Backoff`] between tries and logging the first
/// failure of a run as `"{what}; retrying"`; `None` when `cancel` fires first (shutdown). For
/// work that must not be skipped, e.g. a consumer's record of what it did.
pub(crate) async fn until_ok<T, E, F, Fut>(
    cancel: &tokio_util::sync::CancellationToken,
    what: &str,
    mut f: F,
) -> Option<T>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut backoff = Backoff::default();
    loop {
        match f().await {
            Ok(v) => return Some(v),
            Err(e) => {
                if backoff.failures() == 0 {
                    tracing::warn!(error = %e, "{what}; retrying");
                }
                tokio::select! {
                    () = cancel.cancelled() => return None,
                    () = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_then_caps_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let d: Vec<_> = (0..8).map(|_| b.next_delay()).collect();
        assert!(d[0] <= Duration::from_millis(100) && d[0] >= Duration::from_millis(50));
        assert!(d[3] >= Duration::from_millis(400));
        for x in &d {
            assert!(*x <= Duration::from_secs(1));
        }
        assert!(d[7] >= Duration::from_millis(500));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
