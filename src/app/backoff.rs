//! The restart supervisor's back-off between runs.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.

use std::time::Duration;

/// Exponential back-off between transient failures, capped, with "equal jitter", reset after a healthy run.
///
/// The ceiling starts at `initial` and doubles up to `max`; each delay is drawn uniformly from
/// `[ceiling / 2, ceiling]`.
///
/// # Why jitter
/// Connectors that share a database or a broker fail together when it goes away, and without jitter
/// they would retry in lockstep: every attempt a burst of reconnects (and binlog dumps) against a server that
/// is just coming back, for as long as the outage lasts. Each back-off draws from its own random source
/// (seeded per process), so the bursts spread out within a few attempts.
///
/// # Why equal jitter, not full jitter
/// Full jitter (uniform in `[0, ceiling]`) spreads retries best, but draws delays near zero at any ceiling:
/// a connector would now and then retry at once however long the outage has lasted, and its log and the
/// server would see it. Equal jitter keeps half the ceiling as a floor that still doubles, so back-off
/// still backs off, and spreads the other half.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    /// The ceiling of the next delay.
    ceiling: Duration,
    /// SplitMix64 state: the jitter's random source.
    rng: u64,
}

impl Backoff {
    /// A back-off starting at `initial` and doubling up to `max`, its jitter seeded from the process's
    /// randomness (see [`Backoff::seeded`]).
    pub fn new(initial: Duration, max: Duration) -> Self {
        // The standard library's hash keys are drawn from the OS's random source once per thread, then
        // stepped: a random seed per back-off without a dependency.
        use std::hash::{BuildHasher, Hasher};
        let seed = std::collections::hash_map::RandomState::new().build_hasher().finish();
        Backoff::seeded(initial, max, seed)
    }

    /// Like [`Backoff::new`] with the jitter drawn from `seed`: the same seed gives the same delays.
    pub fn seeded(initial: Duration, max: Duration, seed: u64) -> Self {
        Backoff { initial, max, ceiling: initial, rng: seed }
    }

    /// The next delay: uniform in `[ceiling / 2, ceiling]`; the ceiling then doubles, up to `max`.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling;
        self.ceiling = (self.ceiling * 2).min(self.max);
        let floor = ceiling / 2;
        let span = (ceiling - floor).as_nanos() as u64;
        floor + Duration::from_nanos(self.random() % (span + 1))
    }

    /// Back to the initial ceiling.
    pub fn reset(&mut self) {
        self.ceiling = self.initial;
    }

    /// SplitMix64 (Steele, Lea, Flood 2014): a few arithmetic steps, full period, every seed usable.
    fn random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delays_ms(b: &mut Backoff, n: usize) -> Vec<u128> {
        (0..n).map(|_| b.next_delay().as_millis()).collect()
    }

    /// Each delay lies in the upper half of a ceiling that doubles to the cap, and `reset` starts over.
    #[test]
    fn backoff_doubles_caps_and_resets() {
        let ceilings = [100, 200, 350, 350, 350];
        for seed in 0..200 {
            let mut b = Backoff::seeded(Duration::from_millis(100), Duration::from_millis(350), seed);
            for (delay, ceiling) in delays_ms(&mut b, ceilings.len()).into_iter().zip(ceilings) {
                assert!((ceiling / 2..=ceiling).contains(&delay), "seed {seed}: {delay} ms for ceiling {ceiling}");
            }
            b.reset();
            let first = b.next_delay().as_millis();
            assert!((50..=100).contains(&first), "seed {seed}: {first} ms after reset");
        }
    }

    /// The same seed gives the same delays (tests and reproductions can pin them).
    #[test]
    fn a_seed_fixes_the_delays() {
        let mut a = Backoff::seeded(Duration::from_millis(100), Duration::from_secs(30), 42);
        let mut b = Backoff::seeded(Duration::from_millis(100), Duration::from_secs(30), 42);
        assert_eq!(delays_ms(&mut a, 12), delays_ms(&mut b, 12));
    }

    /// Regression guard for connectors that lost the same server retrying in lockstep: a hundred back-offs
    /// (seeds as different processes would draw them) spread their retries over the whole upper half of the
    /// ceiling instead of landing on one instant.
    #[test]
    fn connectors_failing_together_do_not_retry_together() {
        let ceiling = Duration::from_secs(8);
        let delays: Vec<Duration> = (0..100).map(|_| Backoff::new(ceiling, ceiling).next_delay()).collect();
        let (min, max) = (delays.iter().min().unwrap(), delays.iter().max().unwrap());
        assert!(*min >= ceiling / 2 && *max <= ceiling, "{min:?}..{max:?}");
        // 100 uniform draws over 4 s leave a gap above 2 s at either end with probability ~2^-100.
        assert!(*max - *min >= Duration::from_secs(2), "{min:?}..{max:?}: the retries stay bunched");
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() >= 95, "{} distinct delays of 100", distinct.len());
    }
}
