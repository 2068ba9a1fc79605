//! The rate limiter of one link: a token bucket the control plane sets through the agent.
//!
//! Seed 004 places rate limiters at the memory controller so that no memory brick receives more
//! than it can serve; here each process limits its own links to the rate the control plane gave
//! its segment. A request of `n` bytes takes `n` tokens; tokens refill at the rate, up to a burst
//! of 10 ms worth (at least one largest batch), so a limited link still moves whole batches.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Smallest burst: one largest batched request.
const MIN_BURST: f64 = (16 << 20) as f64;

/// A token bucket; a rate of 0 means unlimited.
#[derive(Debug)]
pub struct RateLimiter {
    rate_bps: AtomicU64,
    /// Tokens (bytes) available and when they were last counted.
    bucket: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    /// A limiter at `rate_bps` bytes per second (0: unlimited).
    pub fn new(rate_bps: u64) -> RateLimiter {
        RateLimiter {
            rate_bps: AtomicU64::new(rate_bps),
            bucket: Mutex::new((Self::burst(rate_bps), Instant::now())),
        }
    }

    fn burst(rate: u64) -> f64 {
        (rate as f64 / 100.0).max(MIN_BURST)
    }

    /// The current rate (0: unlimited).
    pub fn rate(&self) -> u64 {
        self.rate_bps.load(Ordering::Relaxed)
    }

    /// Changes the rate; takes effect for the next request.
    pub fn set_rate(&self, rate_bps: u64) {
        self.rate_bps.store(rate_bps, Ordering::Relaxed);
    }

    /// How long a request of `bytes` must wait before it may go, taking its tokens now (the
    /// bucket may go negative: the next requests wait for the debt).
    pub fn reserve(&self, bytes: u64) -> Duration {
        let rate = self.rate();
        if rate == 0 {
            return Duration::ZERO;
        }
        let mut b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let burst = Self::burst(rate);
        b.0 = (b.0 + now.duration_since(b.1).as_secs_f64() * rate as f64).min(burst);
        b.1 = now;
        b.0 -= bytes as f64;
        if b.0 >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-b.0 / rate as f64)
        }
    }

    /// Waits until a request of `bytes` may go.
    pub fn acquire(&self, bytes: u64) {
        let d = self.reserve(bytes);
        if !d.is_zero() {
            std::thread::sleep(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_never_waits() {
        let r = RateLimiter::new(0);
        assert_eq!(r.reserve(u64::MAX / 2), Duration::ZERO);
    }

    #[test]
    fn a_debt_is_paid_at_the_rate() {
        // 100 MB/s with a 16 MiB burst: the first 16 MiB go at once, the next 100 MB wait ~1 s.
        let r = RateLimiter::new(100_000_000);
        assert_eq!(r.reserve(16 << 20), Duration::ZERO);
        let wait = r.reserve(100_000_000);
        assert!(
            wait > Duration::from_millis(900) && wait <= Duration::from_millis(1001),
            "{wait:?}"
        );
        r.set_rate(0);
        assert_eq!(r.reserve(1 << 30), Duration::ZERO, "rate 0 lifts the limit");
    }
}
