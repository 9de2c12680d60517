//! An absolute send schedule: at most `rate` letters per second, without drift.

use tokio::time::Instant;

use std::time::Duration;

/// Sends on a schedule: message n at start + n / rate, so the rate holds over any window
/// however long acks and marks take. A send that fell behind its slot by more than
/// [`CATCH_UP`] (a stalled machine, a slow broker) moves the schedule instead of catching up:
/// the downstream the rate protects never sees more than `rate` a second plus that slack.
/// (Catching up whole once sent the rest of a stalled second in a burst: a replay at 200/s
/// put 133 letters in one second and about 250 in the next.)
pub(crate) struct Pacer {
    next: Option<Instant>,
    period: Duration,
}

/// How far behind its slot a send may be and still keep the schedule.
const CATCH_UP: Duration = Duration::from_millis(100);

impl Pacer {
    pub(crate) fn new(rate: f64) -> Self {
        Self {
            next: None,
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

    /// When the next send may go, asked at `now`.
    fn slot(&mut self, now: Instant) -> Instant {
        let at = match self.next {
            Some(at) if at + CATCH_UP >= now => at,
            _ => now,
        };
        self.next = Some(at.checked_add(self.period).unwrap_or(at));
        at
    }

    pub(crate) async fn wait(&mut self) {
        let at = self.slot(Instant::now());
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

    #[test]
    fn a_stalled_replay_keeps_its_rate_instead_of_catching_up_in_a_burst() {
        use std::time::Duration;
        let t0 = tokio::time::Instant::now();
        let mut p = super::Pacer::new(200.0);
        // On time for a second: 200 slots, 5 ms apart.
        let slots: Vec<_> = (0..200)
            .map(|i| p.slot(t0 + Duration::from_millis(5 * i)))
            .collect();
        assert_eq!(slots[199] - slots[0], Duration::from_millis(995));
        // Then the machine stalls for half a second: the next sends are asked for at once.
        let resumed = t0 + Duration::from_millis(1500);
        let after: Vec<_> = (0..300).map(|_| p.slot(resumed)).collect();
        // No one-second window from the resume holds more than the rate (+ the slack).
        let in_first_second = after
            .iter()
            .filter(|a| **a < resumed + Duration::from_secs(1))
            .count();
        assert!(
            in_first_second <= 201,
            "{in_first_second} sends in the second after a stall"
        );
        assert_eq!(after[0], resumed);
        // Within the slack it keeps the schedule (timer jitter does not slow the rate).
        let mut q = super::Pacer::new(200.0);
        let a = q.slot(t0);
        let b = q.slot(t0 + Duration::from_millis(50));
        assert_eq!(b - a, Duration::from_millis(5));
    }
}
