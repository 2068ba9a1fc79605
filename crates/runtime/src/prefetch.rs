//! Sequential-stream detection for prefetch.
//!
//! A fault on the page right after the previous run of a stream extends that stream, and the
//! next run doubles (up to the configured maximum); any other fault starts a new stream of one
//! page. Several streams are tracked at once, because STREAM-like loops and multi-threaded
//! programs walk several arrays in step: a single "last fault" detector sees their interleaved
//! faults as random.

/// Streams tracked at once.
const STREAMS: usize = 8;

#[derive(Debug, Clone, Copy)]
struct Stream {
    next_page: u64,
    run: usize,
    last_used: u64,
}

/// The detector.
#[derive(Debug, Clone)]
pub struct Streams {
    slots: [Stream; STREAMS],
    clock: u64,
}

impl Default for Streams {
    fn default() -> Self {
        Streams {
            slots: [Stream {
                next_page: u64::MAX,
                run: 0,
                last_used: 0,
            }; STREAMS],
            clock: 0,
        }
    }
}

impl Streams {
    /// The run length to fetch for a fault on `page` (at most `max`), and the slot to update.
    pub fn plan(&mut self, page: u64, max: usize) -> (usize, usize) {
        self.clock += 1;
        if let Some(i) = self.slots.iter().position(|s| s.next_page == page) {
            let s = &mut self.slots[i];
            s.run = (s.run * 2).max(2).min(max.max(1));
            s.last_used = self.clock;
            return (s.run, i);
        }
        let i = (0..STREAMS).min_by_key(|&i| self.slots[i].last_used).unwrap_or(0);
        self.slots[i] = Stream {
            next_page: u64::MAX,
            run: 1,
            last_used: self.clock,
        };
        (1, i)
    }

    /// Records that the run planned in `slot` ended before `next_page`.
    pub fn advance(&mut self, slot: usize, next_page: u64) {
        if let Some(s) = self.slots.get_mut(slot) {
            s.next_page = next_page;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_streams_are_each_detected() {
        let mut d = Streams::default();
        let (mut a, mut b) = (0u64, 1000u64);
        let mut runs = Vec::new();
        for _ in 0..5 {
            let (n, s) = d.plan(a, 16);
            a += n as u64;
            d.advance(s, a);
            let (m, t) = d.plan(b, 16);
            b += m as u64;
            d.advance(t, b);
            runs.push((n, m));
        }
        assert_eq!(runs, vec![(1, 1), (2, 2), (4, 4), (8, 8), (16, 16)]);
        assert_eq!(d.plan(5000, 16).0, 1, "a random fault starts a stream of one page");
        // Prefetch off: runs stay one page long even on a stream.
        let mut d = Streams::default();
        let (n, s) = d.plan(0, 1);
        d.advance(s, n as u64);
        assert_eq!(d.plan(1, 1).0, 1);
    }
}
