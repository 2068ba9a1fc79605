//! Pacing: the rates a brick enforces itself, so that a node ignoring its own limit cannot take
//! more than the control plane gave it (seed 004, section III: a rate limiter in front of every
//! transceiver, so no brick receives more than its memory controllers can serve).
//!
//! Two token buckets stand in front of every READ and WRITE: the segment's (the rate its grant
//! carries, updated by the control plane's heartbeat replies) and the brick's total
//! ([`BrickLimits::serve_bps`](crate::BrickLimits::serve_bps)). A request takes its bytes from
//! both at once and, when either runs into debt, its connection thread sleeps until both are
//! paid off before serving it. Buckets may run into debt by one request (a READ can be larger
//! than a bucket's burst), so a request is never refused for its size.
//!
//! What waits is bounded without a queue of its own: a connection serves its requests in order on
//! its own thread, so at most one request per authenticated connection waits (the connection
//! cap bounds them), and its later requests stay in the socket, pushing back on the node. A
//! request waits at most [`MAX_WAIT`]: a bucket's debt beyond that is forgiven rather than
//! slept on (it can only come from rates lowered under a burst already taken, or from many
//! connections paying into one bucket at once), so a stalled request never trips a node's
//! timeout. A stop of the brick cuts every wait short.

use crate::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How much a bucket may save up: this long at its rate (and at least [`MIN_BURST`]). Short, so
/// that an idle segment cannot later burst far past its share; long enough that the sleeps it
/// causes are coarse enough for the scheduler (a few milliseconds each).
pub const BURST: Duration = Duration::from_millis(20);
/// The smallest burst: one request of 256 KiB (a readahead batch) goes through at once.
pub const MIN_BURST: u64 = 256 << 10;
/// The longest one request waits for its buckets (see the module's documentation).
pub const MAX_WAIT: Duration = Duration::from_secs(2);

/// One token bucket. A rate of 0 means unpaced.
pub(crate) struct Bucket {
    rate_bps: AtomicU64,
    state: Mutex<Tokens>,
}

struct Tokens {
    /// May be negative: a request larger than what was saved up runs the bucket into debt.
    tokens: f64,
    last: Instant,
}

impl Bucket {
    pub(crate) fn new(rate_bps: u64) -> Bucket {
        Bucket {
            rate_bps: AtomicU64::new(rate_bps),
            state: Mutex::new(Tokens {
                tokens: burst_of(rate_bps) as f64,
                last: Instant::now(),
            }),
        }
    }

    pub(crate) fn rate(&self) -> u64 {
        self.rate_bps.load(Relaxed)
    }

    /// Sets the rate; saved-up tokens beyond the new burst are dropped.
    pub(crate) fn set_rate(&self, rate_bps: u64) {
        let mut t = lock(&self.state);
        self.refill(&mut t, Instant::now());
        self.rate_bps.store(rate_bps, Relaxed);
        t.tokens = t.tokens.min(burst_of(rate_bps) as f64);
    }

    fn refill(&self, t: &mut Tokens, now: Instant) {
        let rate = self.rate();
        // Takers read the clock before the lock: one that read it earlier than the last one
        // to refill must not move `last` back, or the interval between would be counted twice.
        if now <= t.last {
            return;
        }
        let dt = now.duration_since(t.last).as_secs_f64();
        t.last = now;
        if rate == 0 {
            t.tokens = 0.0;
            return;
        }
        t.tokens = (t.tokens + dt * rate as f64).min(burst_of(rate) as f64);
    }

    /// Takes `bytes`; returns how long the taker must wait for the bucket to be out of debt
    /// (zero when unpaced or in credit), at most [`MAX_WAIT`].
    fn take(&self, bytes: u64, now: Instant) -> Duration {
        let rate = self.rate();
        if rate == 0 {
            return Duration::ZERO;
        }
        let mut t = lock(&self.state);
        self.refill(&mut t, now);
        t.tokens -= bytes as f64;
        let floor = -(MAX_WAIT.as_secs_f64() * rate as f64);
        if t.tokens < floor {
            // Forgiven: see the module's documentation.
            t.tokens = floor;
        }
        if t.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-t.tokens / rate as f64)
        }
    }
}

fn burst_of(rate_bps: u64) -> u64 {
    ((rate_bps as f64 * BURST.as_secs_f64()) as u64).max(MIN_BURST)
}

/// What pacing did, brick-wide and per segment ([`PaceStats`]).
#[derive(Default)]
struct Counters {
    delayed: AtomicU64,
    delayed_ns: AtomicU64,
    waiting: AtomicU64,
}

/// A segment's pacing: its bucket and what went through it.
pub(crate) struct SegmentPace {
    pub(crate) bucket: Bucket,
    bytes: AtomicU64,
    requests: AtomicU64,
    delayed: AtomicU64,
    /// When the entry was made: a heartbeat reply drawn up before it cannot forget it.
    created: Instant,
}

impl SegmentPace {
    /// Pacing for a segment the pacer does not track (a standalone brick's, freed with its last
    /// connection): the brick's total alone holds it back.
    pub(crate) fn untracked() -> Arc<SegmentPace> {
        Arc::new(SegmentPace::new(0))
    }

    fn new(rate_bps: u64) -> SegmentPace {
        SegmentPace {
            bucket: Bucket::new(rate_bps),
            bytes: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            delayed: AtomicU64::new(0),
            created: Instant::now(),
        }
    }
}

/// Per segment figures ([`crate::BrickHandle::pace_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentPaceStats {
    /// Segment id.
    pub segment_id: u64,
    /// Its rate now (bytes/s; 0: unpaced but for the brick's total).
    pub rate_bps: u64,
    /// Bytes read and written through it.
    pub bytes: u64,
    /// Requests served.
    pub requests: u64,
    /// Requests that waited for a bucket (this segment's or the total).
    pub delayed: u64,
}

/// What pacing did ([`crate::BrickHandle::pace_stats`]): counters, never timings to assert on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PaceStats {
    /// The brick's total rate now (bytes/s; 0: unpaced).
    pub serve_bps: u64,
    /// Requests that waited, brick-wide.
    pub delayed: u64,
    /// Their waits, summed (nanoseconds).
    pub delayed_ns: u64,
    /// Requests waiting now (at most one per connection).
    pub waiting: u64,
    /// Segments known to the pacer, by id.
    pub segments: Vec<SegmentPaceStats>,
}

/// The brick's buckets.
pub(crate) struct Pacer {
    total: Bucket,
    segments: Mutex<HashMap<u64, Arc<SegmentPace>>>,
    counters: Counters,
}

impl Pacer {
    pub(crate) fn new(serve_bps: Option<u64>) -> Pacer {
        Pacer {
            total: Bucket::new(serve_bps.unwrap_or(0)),
            segments: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        }
    }

    /// The pacing of `segment_id`, created with `rate_bps` (the grant's) when new. An existing
    /// one keeps its rate: a grant's rate is the one of the moment it was signed, which the
    /// heartbeat replies since may have changed (another segment came or went), and a node may
    /// attach with an old grant.
    pub(crate) fn segment(&self, segment_id: u64, rate_bps: u64) -> Arc<SegmentPace> {
        lock(&self.segments)
            .entry(segment_id)
            .or_insert_with(|| Arc::new(SegmentPace::new(rate_bps)))
            .clone()
    }

    /// Sets the brick's total rate (0: unpaced).
    pub(crate) fn set_total(&self, serve_bps: u64) {
        if self.total.rate() != serve_bps {
            self.total.set_rate(serve_bps);
        }
    }

    /// Applies the rates of a heartbeat reply (`(segment id, rate)`, 0: unpaced) sent at
    /// `listed_at`; forgets the segments it no longer lists, unless they are newer than it.
    pub(crate) fn set_rates(&self, rates: &[(u64, u64)], listed_at: Instant) {
        let listed: HashMap<u64, u64> = rates.iter().copied().collect();
        let mut m = lock(&self.segments);
        // A connection still attached keeps its Arc: it goes on at the last rate it had until
        // it detaches (the brick releases unlisted segments at once anyway).
        m.retain(|id, p| listed.contains_key(id) || p.created >= listed_at);
        for (&id, &rate) in &listed {
            match m.get(&id) {
                Some(p) if p.bucket.rate() != rate => p.bucket.set_rate(rate),
                Some(_) => {}
                None => {
                    m.insert(id, Arc::new(SegmentPace::new(rate)));
                }
            }
        }
    }

    /// Charges `bytes` of one request on `seg` to its bucket and the total, and sleeps until
    /// both are out of debt (or `stop` is set).
    pub(crate) fn pace(&self, seg: &SegmentPace, bytes: u64, stop: &AtomicBool) {
        seg.bytes.fetch_add(bytes, Relaxed);
        seg.requests.fetch_add(1, Relaxed);
        let now = Instant::now();
        let wait = seg.bucket.take(bytes, now).max(self.total.take(bytes, now));
        if wait.is_zero() {
            return;
        }
        seg.delayed.fetch_add(1, Relaxed);
        let c = &self.counters;
        c.delayed.fetch_add(1, Relaxed);
        c.delayed_ns
            .fetch_add(u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX), Relaxed);
        c.waiting.fetch_add(1, Relaxed);
        let until = now + wait;
        while !stop.load(Relaxed) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            // Slices, so a stopping brick does not wait out a long debt.
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
        c.waiting.fetch_sub(1, Relaxed);
    }

    pub(crate) fn stats(&self) -> PaceStats {
        let mut segments: Vec<SegmentPaceStats> = lock(&self.segments)
            .iter()
            .map(|(&id, p)| SegmentPaceStats {
                segment_id: id,
                rate_bps: p.bucket.rate(),
                bytes: p.bytes.load(Relaxed),
                requests: p.requests.load(Relaxed),
                delayed: p.delayed.load(Relaxed),
            })
            .collect();
        segments.sort_by_key(|s| s.segment_id);
        PaceStats {
            serve_bps: self.total.rate(),
            delayed: self.counters.delayed.load(Relaxed),
            delayed_ns: self.counters.delayed_ns.load(Relaxed),
            waiting: self.counters.waiting.load(Relaxed),
            segments,
        }
    }
}

/// Measures what this host's memory can serve: the best of a few copies of 32 MiB (a READ is
/// one copy out of the pool, a WRITE one into it), in bytes/s. The best round, not the mean,
/// so that a busy moment on a shared host does not set the brick's rate low for its whole
/// life; takes a few tens of milliseconds.
pub fn probe_serve_rate() -> u64 {
    const BYTES: usize = 32 << 20;
    let src: Vec<u8> = (0..BYTES).map(|i| i as u8).collect();
    let mut dst = vec![0u8; BYTES];
    // Fault both in before timing.
    dst.copy_from_slice(&src);
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        best = best.min(t.elapsed());
    }
    (BYTES as f64 / best.as_secs_f64().max(1e-9)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_lets_its_burst_through_then_charges_debt_at_its_rate() {
        let b = Bucket::new(1 << 20);
        let now = Instant::now();
        assert_eq!(b.take(MIN_BURST, now), Duration::ZERO, "the burst is saved up at start");
        let wait = b.take(1 << 20, now);
        assert_eq!(wait, Duration::from_secs(1), "1 MiB of debt at 1 MiB/s");
        // Debt beyond MAX_WAIT is forgiven.
        assert_eq!(b.take(64 << 20, now), MAX_WAIT);
        b.set_rate(0);
        assert_eq!(b.take(1 << 30, now), Duration::ZERO, "rate 0: unpaced");
    }

    #[test]
    fn heartbeat_rates_replace_grant_rates_and_forget_unlisted_segments() {
        let before = Instant::now();
        let p = Pacer::new(Some(4000));
        let s = p.segment(7, 1000);
        assert_eq!(s.bucket.rate(), 1000, "a new segment starts at its grant's rate");
        p.set_rates(&[(7, 500), (8, 0)], Instant::now());
        assert_eq!(s.bucket.rate(), 500);
        let st = p.stats();
        assert_eq!(st.serve_bps, 4000);
        assert_eq!(
            st.segments
                .iter()
                .map(|s| (s.segment_id, s.rate_bps))
                .collect::<Vec<_>>(),
            vec![(7, 500), (8, 0)]
        );
        assert_eq!(
            p.segment(7, 0).bucket.rate(),
            500,
            "a grant without a rate keeps the one set"
        );
        p.set_rates(&[], before);
        assert_eq!(
            p.stats().segments.len(),
            2,
            "a reply older than the entries forgets nothing"
        );
        p.set_rates(&[], Instant::now());
        assert!(p.stats().segments.is_empty());
    }
}
