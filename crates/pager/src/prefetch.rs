//! Sequential-stream detection for prefetch.
//!
//! A fault on the page right after the previous run of a stream extends that stream, and the
//! next run doubles (up to the configured maximum); any other fault starts a new stream of one
//! page. Several streams are tracked at once, because STREAM-like loops and multi-threaded
//! programs walk several arrays in step: a single "last fault" detector sees their interleaved
//! faults as random.

/// Streams tracked at once.
const STREAMS: usize = 8;
/// Pages a stream's next fault may lie past the end of its last run and still continue it.
const SKIP: u64 = 16;

#[derive(Debug, Clone, Copy)]
struct Stream {
    /// The page after the last run (where an ascending stream faults next).
    next_page: u64,
    /// The first page of the last run (a descending stream faults on the page below it).
    first_page: u64,
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
                first_page: u64::MAX,
                run: 0,
                last_used: 0,
            }; STREAMS],
            clock: 0,
        }
    }
}

/// What to fetch for a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Pages in the run (at most the configured maximum).
    pub run: usize,
    /// The stream's slot, for [`Streams::advance`].
    pub slot: usize,
    /// The stream walks down (a backward `memmove` of a large buffer does): the run ends at the
    /// faulting page instead of starting there.
    pub down: bool,
}

impl Streams {
    /// Plans the run for a fault at `page`: `max` pages at most.
    pub fn plan(&mut self, page: u64, max: usize) -> Plan {
        self.clock += 1;
        // A stream also goes on a little past where its last run ended: pages there may be
        // resident (a run stops at a resident page, and a hot page kept by the eviction policy
        // sits in the middle of cold ones), and the stream's next fault is past them.
        let up = self.slots.iter().position(|s| s.next_page == page).or_else(|| {
            self.slots
                .iter()
                .position(|s| s.next_page < page && page - s.next_page <= SKIP)
        });
        let down = || {
            self.slots
                .iter()
                .position(|s| s.first_page != u64::MAX && s.first_page == page.wrapping_add(1))
        };
        if let Some((i, down)) = up.map(|i| (i, false)).or_else(|| down().map(|i| (i, true))) {
            let s = &mut self.slots[i];
            s.run = (s.run * 2).max(2).min(max.max(1));
            s.last_used = self.clock;
            return Plan {
                run: s.run,
                slot: i,
                down,
            };
        }
        let i = (0..STREAMS).min_by_key(|&i| self.slots[i].last_used).unwrap_or(0);
        self.slots[i] = Stream {
            next_page: u64::MAX,
            first_page: u64::MAX,
            run: 1,
            last_used: self.clock,
        };
        Plan {
            run: 1,
            slot: i,
            down: false,
        }
    }

    /// Records the run `[first, end)` the stream in `slot` got.
    pub fn advance(&mut self, slot: usize, first: u64, end: u64) {
        if let Some(s) = self.slots.get_mut(slot) {
            s.next_page = end;
            s.first_page = first;
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
            let p = d.plan(a, 16);
            d.advance(p.slot, a, a + p.run as u64);
            a += p.run as u64;
            let q = d.plan(b, 16);
            d.advance(q.slot, b, b + q.run as u64);
            b += q.run as u64;
            runs.push((p.run, q.run, p.down || q.down));
        }
        assert_eq!(
            runs,
            vec![
                (1, 1, false),
                (2, 2, false),
                (4, 4, false),
                (8, 8, false),
                (16, 16, false)
            ]
        );
        assert_eq!(d.plan(5000, 16).run, 1, "a random fault starts a stream of one page");
        // A stream whose next pages are resident goes on past them.
        let mut d = Streams::default();
        let p = d.plan(100, 16);
        d.advance(p.slot, 100, 101);
        let q = d.plan(101, 16);
        d.advance(q.slot, 101, 103);
        assert_eq!(d.plan(105, 16).run, 4, "two resident pages skipped");
        assert_eq!(d.plan(500, 16).run, 1, "too far: a new stream");
        // Prefetch off: runs stay one page long even on a stream.
        let mut d = Streams::default();
        let p = d.plan(0, 1);
        d.advance(p.slot, 0, p.run as u64);
        assert_eq!(d.plan(1, 1).run, 1);
    }

    #[test]
    fn descending_streams_are_detected_and_end_their_runs_at_the_fault() {
        // A backward copy of one array into another: two interleaved descending streams.
        let mut d = Streams::default();
        let (mut a, mut b) = (10_000u64, 50_000u64);
        let mut runs = Vec::new();
        for _ in 0..5 {
            let p = d.plan(a, 16);
            let first = a + 1 - p.run as u64;
            d.advance(p.slot, first, a + 1);
            a = first - 1;
            let q = d.plan(b, 16);
            let first_b = b + 1 - q.run as u64;
            d.advance(q.slot, first_b, b + 1);
            b = first_b - 1;
            runs.push((p.run, p.down, q.run, q.down));
        }
        assert_eq!(runs[0], (1, false, 1, false), "one page is no direction yet");
        assert_eq!(
            &runs[1..],
            &[
                (2, true, 2, true),
                (4, true, 4, true),
                (8, true, 8, true),
                (16, true, 16, true)
            ]
        );
        assert!(!d.plan(0, 16).down, "page 0 has no stream below it");
    }
}
