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
            // A job stored before rates were bounded (or edited by hand) may hold any rate:
            // pace it at the bounds rather than panic on a period no Duration can hold.
            period: Duration::from_secs_f64(
                1.0 / if rate.is_nan() {
                    super::MIN_RATE
                } else {
                    rate.clamp(super::MIN_RATE, super::MAX_RATE)
                },
            ),
        }
    }

    pub(crate) async fn wait(&mut self) {
        let at = self
            .period
            .checked_mul(u32::try_from(self.n).unwrap_or(u32::MAX))
            .and_then(|d| self.start.checked_add(d))
            .unwrap_or_else(Instant::now);
        self.n += 1;
        tokio::time::sleep_until(at).await;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn any_stored_rate_paces_without_panicking() {
        for rate in [1e-300, 0.0, -1.0, f64::NAN, f64::INFINITY, 1e300] {
            let p = super::Pacer::new(rate);
            assert!(p.period >= std::time::Duration::from_micros(1), "{rate}");
        }
    }
}
