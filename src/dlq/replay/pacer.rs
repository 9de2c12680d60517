//! An absolute send schedule: at most `rate` letters per second, without drift.

use tokio::time::Instant;

use std::time::Duration;

/// Sends on an absolute schedule: message n at start + n / rate, so the rate holds over any
/// window however long acks and marks take.
pub(crate) struct Pacer {
    start: Instant,
    n: u64,
    period: Duration,
}

impl Pacer {
    pub(crate) fn new(rate: f64) -> Self {
        Self {
            start: Instant::now(),
            n: 0,
            period: Duration::from_secs_f64(1.0 / rate),
        }
    }

    pub(crate) async fn wait(&mut self) {
        let at = self.start + self.period.mul_f64(self.n as f64);
        self.n += 1;
        tokio::time::sleep_until(at).await;
    }
}
