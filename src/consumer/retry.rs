//! Retry strategies for transient handler failures.

use std::time::Duration;

/// Default in-place attempts before a transient failure is dead-lettered.
pub const DEFAULT_IN_PLACE_ATTEMPTS: u32 = 3;
/// Default first in-place backoff; each later wait doubles.
pub const DEFAULT_IN_PLACE_BASE: Duration = Duration::from_millis(500);
/// Longest in-place backoff.
pub const DEFAULT_IN_PLACE_MAX: Duration = Duration::from_secs(30);
pub(crate) use crate::wire::DEFAULT_RETRY_DELAYS;

/// How a transient failure is retried. Permanent failures, decode errors and panics are never
/// retried: they go to `<topic>.dlq` at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryStrategy {
    /// Retry within the consumer, holding the message's key (order-preserving, blocking that
    /// key only): attempt `n` (1-based) waits `min(max, base * 2^(n-1))` ± 25 % jitter before
    /// attempt `n+1`; after `attempts` attempts the message is dead-lettered as
    /// `transient-exhausted`. With the defaults: 0.5 s, 1 s, then the DLQ.
    InPlace {
        /// Total attempts, at least 1.
        attempts: u32,
        /// First backoff.
        base: Duration,
        /// Backoff cap.
        max: Duration,
    },
    /// Non-blocking retry topics: a transient failure forwards the message to
    /// `<topic>.retry-<delays[0]>`, then `.retry-<delays[1]>`, …, then `<topic>.dlq`. The
    /// consumer reads the retry topics too and handles a record only once `delay` has passed
    /// since it was written, pausing that retry partition meanwhile. Per-key order is not kept
    /// across a retry (the price of not blocking the partition).
    Topics {
        /// Delay of each hop; whole seconds, at least 1 s.
        delays: Vec<Duration>,
    },
}

impl Default for RetryStrategy {
    fn default() -> Self {
        Self::InPlace {
            attempts: DEFAULT_IN_PLACE_ATTEMPTS,
            base: DEFAULT_IN_PLACE_BASE,
            max: DEFAULT_IN_PLACE_MAX,
        }
    }
}

impl RetryStrategy {
    /// Default in-place attempts before a transient failure is dead-lettered.
    pub const DEFAULT_IN_PLACE_ATTEMPTS: u32 = DEFAULT_IN_PLACE_ATTEMPTS;
    /// Default first in-place backoff; each later wait doubles.
    pub const DEFAULT_IN_PLACE_BASE: Duration = DEFAULT_IN_PLACE_BASE;
    /// Default longest in-place backoff.
    pub const DEFAULT_IN_PLACE_MAX: Duration = DEFAULT_IN_PLACE_MAX;
}

impl RetryStrategy {
    /// The default retry-topic schedule: 5 s, 30 s, 5 min.
    pub fn default_topics() -> Self {
        Self::Topics {
            delays: DEFAULT_RETRY_DELAYS.to_vec(),
        }
    }

    /// The in-place wait after failed attempt `n` (1-based).
    pub(crate) fn in_place_delay(base: Duration, max: Duration, n: u32) -> Duration {
        let raw = base
            .saturating_mul(1u32 << (n.saturating_sub(1)).min(20))
            .min(max);
        raw.mul_f64(0.75 + fastrand::f64() * 0.5)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_delays_grow_and_cap() {
        let b = Duration::from_millis(500);
        let m = Duration::from_secs(2);
        let d1 = RetryStrategy::in_place_delay(b, m, 1);
        let d3 = RetryStrategy::in_place_delay(b, m, 3);
        let d9 = RetryStrategy::in_place_delay(b, m, 9);
        assert!(d1 >= Duration::from_millis(375) && d1 <= Duration::from_millis(625));
        assert!(d3 >= Duration::from_millis(1500));
        assert!(d9 <= Duration::from_millis(2500));
    }
}
