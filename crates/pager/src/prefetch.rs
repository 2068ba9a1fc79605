//! Stream detection for prefetch: sequential streams, and strided ones.
//!
//! A fault on the page right after the previous run of a stream extends that stream, and the
//! next run doubles (up to the configured maximum); any other fault starts a new stream of one
//! page. Several streams are tracked at once, because STREAM-like loops and multi-threaded
//! programs walk several arrays in step: a single "last fault" detector sees their interleaved
//! faults as random.
//!
//! A stream whose faults come at a constant stride of 2 to [`MAX_STRIDE`] pages (a column of a
//! row-major matrix: OpenBLAS packing a panel of NumPy's 4000 × 4000 doubles faults once a row,
//! every 7.8125 pages) is *strided*: its run is the pages the stride predicts ([`Stride`]), not
//! the contiguous pages covering them, which the program skips (fetching those took NumPy's
//! read-ahead accuracy down to 40%, `docs/benchmarks.md`). The stride is a ratio (the rise from
//! the stream's first fault over the steps taken since), so a fractional stride such as 7.8125
//! predicts the 7s and 8s between rows; and the stream keeps the range of where within its last
//! faulting page the rows fall (narrowed by every fault), which decides which rows land on a 7
//! and which on an 8: predicting from within that range, a model of OpenBLAS's rows used 90% of
//! what it fetched, against 60% rounding from the first fault. A fault on a step that was
//! predicted wrong (or evicted) is a step of the stream all the same, and corrects it. Three
//! faults make a stride: the third at the same distance (±1 page) from the second as the second
//! from the first.

/// Streams tracked at once.
const STREAMS: usize = 8;
/// Pages a stream's next fault may lie past the end of its last run and still continue it.
const SKIP: u64 = 16;
/// Longest stride detected, in pages (NumPy's solve walks columns 16 rows of 4000 doubles, 125
/// pages, apart).
pub const MAX_STRIDE: u64 = 128;
/// Steps of a strided stream fetched at one fault at most, for strides of more than 1/16 of the
/// prefetch maximum; shorter strides take as many steps as span the maximum, as a sequential
/// run would (one page in two at 16 steps a fault faulted 52% more often than the run of 128
/// pages covering them, and ran slower). So one run spans at most `MAX_STRIDE * MAX_STEPS`
/// pages, or the prefetch maximum if that is more.
pub const MAX_STEPS: usize = 16;

#[derive(Debug, Clone, Copy)]
struct Stream {
    /// The page after the last run (where an ascending stream faults next).
    next_page: u64,
    /// The first page of the last run (a descending stream faults on the page below it).
    first_page: u64,
    run: usize,
    last_used: u64,
    /// The last two faults of the stream (`u64::MAX`: none), to detect a stride.
    last_fault: u64,
    prev_fault: u64,
    /// A strided stream: its first fault, and how many steps past its last fault its next
    /// fault may be (its run's steps and one; 0: not strided).
    anchor: u64,
    next_step: u64,
    /// The rise from `anchor` to the last fault, and the steps it took.
    rise: u64,
    steps: u64,
    /// Where within the last fault's page the stream's position lies, `[lo, hi)` of a page.
    lo: f64,
    hi: f64,
}

const IDLE: Stream = Stream {
    next_page: u64::MAX,
    first_page: u64::MAX,
    run: 0,
    last_used: 0,
    last_fault: u64::MAX,
    prev_fault: u64::MAX,
    anchor: 0,
    next_step: 0,
    rise: 0,
    steps: 0,
    lo: 0.0,
    hi: 1.0,
};

/// The detector.
#[derive(Debug, Clone)]
pub struct Streams {
    slots: [Stream; STREAMS],
    clock: u64,
}

impl Default for Streams {
    fn default() -> Self {
        Streams {
            slots: [IDLE; STREAMS],
            clock: 0,
        }
    }
}

/// The pages a strided stream predicts: `j` steps after its fault at `last`, the page
/// `last + floor(phase + j × stride)`, for `j` in `1..=count`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stride {
    last: u64,
    phase: f64,
    stride: f64,
    count: u64,
}

impl Stride {
    /// The page `j` steps after the fault.
    pub fn page(&self, j: u64) -> u64 {
        at(self.last, self.phase, self.stride, j)
    }

    /// The predicted pages, ascending.
    pub fn pages(&self) -> impl Iterator<Item = u64> + '_ {
        (1..=self.count).map(|j| self.page(j))
    }

    /// Steps predicted.
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// `last + floor(phase + j × stride)`.
fn at(last: u64, phase: f64, stride: f64, j: u64) -> u64 {
    // Within u64 for any window: j ≤ MAX_STEPS and stride ≤ MAX_STRIDE + 1.
    last.saturating_add((phase + j as f64 * stride).floor().max(0.0) as u64)
}

impl Stream {
    /// The stream's stride in pages (rise over steps since its first fault).
    fn stride(&self) -> f64 {
        self.rise as f64 / self.steps.max(1) as f64
    }

    /// Where within the last faulting page to predict from: just below the top of the range
    /// the faults allow. On a trace of NumPy's faults at 25% local (every miss, prefetch off)
    /// replayed through this detector, the top used 77% of the strided pages fetched, the middle
    /// 72%, the bottom 64%: the faults more often come late in a row's page than early.
    fn phase(&self) -> f64 {
        (self.hi - 0.01).max(self.lo)
    }

    /// The step after the last fault at which a strided stream's prediction is `page` (±1
    /// page), among the steps its last run fetched.
    fn step_of(&self, page: u64) -> Option<u64> {
        if self.next_step == 0 || page <= self.last_fault {
            return None;
        }
        let (stride, phase) = (self.stride(), self.phase());
        let guess = ((page - self.last_fault) as f64 / stride).round() as u64;
        (guess.saturating_sub(1)..=guess + 1)
            .filter(|&j| j >= 1 && j <= self.next_step)
            .map(|j| (j, at(self.last_fault, phase, stride, j)))
            .filter(|&(_, q)| near(q, page))
            .min_by_key(|&(_, q)| q.abs_diff(page))
            .map(|(j, _)| j)
    }

    /// The strided stream's fault at `page`, `j` steps after its last: the position within the
    /// page narrows to what both faults allow (or starts over if they disagree), and the stride
    /// is taken again from the first fault.
    fn stepped(&mut self, page: u64, j: u64) {
        let moved = j as f64 * self.stride() - (page - self.last_fault) as f64;
        let (lo, hi) = ((self.lo + moved).max(0.0), (self.hi + moved).min(1.0));
        (self.lo, self.hi) = if lo < hi { (lo, hi) } else { (0.0, 1.0) };
        self.steps += j;
        self.rise = page - self.anchor;
    }
}

/// What to fetch for a fault.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    /// Pages in the run (at most the configured maximum); for a strided stream, steps.
    pub run: usize,
    /// The stream's slot, for [`Streams::advance`].
    pub slot: usize,
    /// The stream walks down (a backward `memmove` of a large buffer does): the run ends at the
    /// faulting page instead of starting there.
    pub down: bool,
    /// The stream is strided: fetch the pages it predicts after the fault, not a contiguous run.
    pub stride: Option<Stride>,
}

/// True if `a` and `b` differ by at most one page.
fn near(a: u64, b: u64) -> bool {
    a.abs_diff(b) <= 1
}

impl Streams {
    /// True if a fault at `page` now would be planned as that page alone (no sequential or
    /// strided stream continues there): what [`Streams::plan`] would say, without changing any
    /// stream. Eight slots of a few words: a copy is cheaper than a second planner to keep in
    /// step with this one.
    pub fn plans_one(&self, page: u64, max: usize) -> bool {
        let p = self.clone().plan(page, max);
        p.run == 1 && p.stride.is_none()
    }

    /// Plans the run for a fault at `page`: `max` pages at most.
    pub fn plan(&mut self, page: u64, max: usize) -> Plan {
        self.clock += 1;
        let clock = self.clock;
        // A step of a strided stream: the one after its run, or one of its run that was
        // predicted wrong or did not stay (±1 page: a fractional stride's rounding).
        let strided = (0..STREAMS).find_map(|i| self.slots[i].step_of(page).map(|j| (i, j)));
        if let Some((i, j)) = strided {
            let s = &mut self.slots[i];
            s.stepped(page, j);
            return Self::strided(s, i, page, max, clock);
        }
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
            if !down && s.next_page != page && Self::is_stride(s, page) {
                Self::begin_stride(s, page);
                return Self::strided(s, i, page, max, clock);
            }
            if !down && s.next_page != page && s.run == 1 {
                // A second fault past a gap is as likely a stride's as a sequential stream's
                // (which would have faulted on the page after its first): one page until a third
                // fault tells. Replayed on NumPy's fault trace, one page here instead of two took
                // the share of pages fetched ahead that were used from 80% to 84%.
                s.last_used = clock;
                s.prev_fault = s.last_fault;
                s.last_fault = page;
                return Plan {
                    run: 1,
                    slot: i,
                    down: false,
                    stride: None,
                };
            }
            s.run = (s.run * 2).max(2).min(max.max(1));
            s.last_used = clock;
            s.prev_fault = s.last_fault;
            s.last_fault = page;
            return Plan {
                run: s.run,
                slot: i,
                down,
                stride: None,
            };
        }
        // Too far past any stream's run for a sequential one: a stride longer than `SKIP`, from
        // the most recent lone fault below within `MAX_STRIDE`.
        let lone = (0..STREAMS)
            .filter(|&i| {
                let s = &self.slots[i];
                s.run == 1 && s.last_fault < page && page - s.last_fault <= MAX_STRIDE
            })
            .max_by_key(|&i| self.slots[i].last_used);
        if let Some(i) = lone {
            let s = &mut self.slots[i];
            if Self::is_stride(s, page) {
                Self::begin_stride(s, page);
                return Self::strided(s, i, page, max, clock);
            }
            // A second fault: a stride, if a third comes at the same distance. The slot still
            // starts a sequential stream at this page.
            *s = Stream {
                next_page: u64::MAX,
                first_page: u64::MAX,
                run: 1,
                last_used: clock,
                last_fault: page,
                prev_fault: s.last_fault,
                ..IDLE
            };
            return Plan {
                run: 1,
                slot: i,
                down: false,
                stride: None,
            };
        }
        let i = (0..STREAMS).min_by_key(|&i| self.slots[i].last_used).unwrap_or(0);
        self.slots[i] = Stream {
            run: 1,
            last_used: clock,
            last_fault: page,
            ..IDLE
        };
        Plan {
            run: 1,
            slot: i,
            down: false,
            stride: None,
        }
    }

    /// True if the fault at `page` is the third of a stream's faults at one stride (±1 page, as
    /// a fractional stride goes) of 2 to `MAX_STRIDE` pages.
    fn is_stride(s: &Stream, page: u64) -> bool {
        if s.prev_fault == u64::MAX || s.last_fault == u64::MAX || s.prev_fault >= s.last_fault || s.last_fault >= page
        {
            return false;
        }
        let (d, before) = (page - s.last_fault, s.last_fault - s.prev_fault);
        d >= 2 && before >= 2 && d <= MAX_STRIDE && before <= MAX_STRIDE && near(d, before)
    }

    /// The stream becomes strided at its third fault, `page`.
    fn begin_stride(s: &mut Stream, page: u64) {
        s.anchor = s.prev_fault;
        s.steps = 2;
        s.rise = page - s.prev_fault;
        s.run = 1;
        (s.lo, s.hi) = (0.0, 1.0);
    }

    /// The plan of strided stream `s` (in slot `i`) at its fault `page`, step `s.steps`: the
    /// next steps, twice as many as last time, up to `max` pages and `MAX_STEPS`.
    fn strided(s: &mut Stream, i: usize, page: u64, max: usize, clock: u64) -> Plan {
        let steps = MAX_STEPS.max((max as f64 / s.stride()) as usize);
        s.run = (s.run * 2).max(2).min(max.max(1)).min(steps);
        s.last_used = clock;
        s.prev_fault = s.last_fault;
        s.last_fault = page;
        // Not a sequential stream: its next fault is a step away, not past a run.
        s.next_page = u64::MAX;
        s.first_page = u64::MAX;
        let stride = Stride {
            last: page,
            phase: s.phase(),
            stride: s.stride(),
            count: s.run as u64,
        };
        // The step after the run: where the next fault is expected.
        s.next_step = s.run as u64 + 1;
        Plan {
            run: s.run,
            slot: i,
            down: false,
            stride: Some(stride),
        }
    }

    /// Records the run `[first, end)` the stream in `slot` got. For a strided stream, `steps`
    /// is how many of its predicted steps the run took (its next fault is expected after them).
    pub fn advance(&mut self, slot: usize, first: u64, end: u64) {
        if let Some(s) = self.slots.get_mut(slot) {
            if s.next_step != 0 {
                return;
            }
            s.next_page = end;
            s.first_page = first;
        }
    }

    /// A strided stream's run took only `steps` of the steps planned (it stopped at a page on
    /// its way out, or the region ended): its next fault is expected after them.
    pub fn advance_strided(&mut self, slot: usize, steps: u64) {
        if let Some(s) = self.slots.get_mut(slot) {
            if s.next_step != 0 {
                s.next_step = steps + 1;
            }
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

    /// A program touching `touch` in order with this detector planning its faults: (faults,
    /// pages fetched ahead, of those the pages touched later).
    fn replay(touch: &[u64], max: usize) -> (usize, usize, usize) {
        let mut d = Streams::default();
        let mut fetched = std::collections::HashSet::new();
        let (mut faults, mut ahead) = (0, Vec::new());
        for &page in touch {
            if fetched.contains(&page) {
                continue;
            }
            faults += 1;
            fetched.insert(page);
            let p = d.plan(page, max);
            match p.stride {
                Some(s) => {
                    for q in s.pages() {
                        if fetched.insert(q) {
                            ahead.push(q);
                        }
                    }
                }
                None => {
                    for q in page + 1..page + p.run as u64 {
                        if fetched.insert(q) {
                            ahead.push(q);
                        }
                    }
                    d.advance(p.slot, page, page + p.run as u64);
                }
            }
        }
        let touched: std::collections::HashSet<u64> = touch.iter().copied().collect();
        let used = ahead.iter().filter(|q| touched.contains(q)).count();
        (faults, ahead.len(), used)
    }

    #[test]
    fn strided_streams_fetch_what_the_stride_predicts() {
        // One page in eight (a row of 32 KiB, one page of it read).
        let touch: Vec<u64> = (0..512).map(|i| 1000 + 8 * i).collect();
        let (faults, ahead, used) = replay(&touch, 128);
        // Wasted: the second fault's run of two (not yet a stride), and the steps past the end.
        assert!(ahead - used <= 1 + MAX_STEPS, "{used} of {ahead} fetched ahead read");
        assert!(faults <= 40, "{faults} faults for 512 pages");
        // OpenBLAS packing a panel of NumPy's 4000 x 4000 doubles: 32,000-byte rows, 7.8125
        // pages apart, so 7s and 8s.
        let touch: Vec<u64> = (0..4000u64).map(|i| (i * 32_000 + 1_000) / 4096).collect();
        let (faults, ahead, used) = replay(&touch, 128);
        assert!(used * 100 >= ahead * 85, "fractional stride: {used} of {ahead} used");
        assert!(faults <= 600, "{faults} faults for 4000 rows");
        // The solve's columns, 16 rows of 4000 doubles apart: 125 pages.
        let touch: Vec<u64> = (0..400).map(|i| 125 * i).collect();
        let (faults, ahead, used) = replay(&touch, 128);
        assert!(ahead - used <= MAX_STEPS, "{used} of {ahead} fetched ahead read");
        assert!(faults <= 60, "{faults} faults for 400 pages");
        // Two threads walking columns of two matrices in turn.
        let touch: Vec<u64> = (0..1000u64)
            .flat_map(|i| [(i * 32_000) / 4096, 1_000_000 + (i * 24_000) / 4096])
            .collect();
        let (faults, ahead, used) = replay(&touch, 128);
        // (A run covering their pages would use one in six to eight.)
        assert!(used * 100 >= ahead * 70, "interleaved strides: {used} of {ahead} used");
        assert!(faults <= 400, "{faults} faults for 2000 rows");
        // Sequential reads are what they were: runs doubling to the maximum.
        let touch: Vec<u64> = (0..4096).collect();
        let (faults, ahead, used) = replay(&touch, 128);
        assert_eq!(faults, 8 + 4096 / 128 - 1, "1, 2, 4 ... 128, then 128 at a time");
        assert_eq!(
            (used, ahead),
            (4096 - faults, 4096 - faults + 127),
            "the last run goes past the end"
        );
        // A stride past `MAX_STRIDE` is random access: nothing fetched ahead.
        let touch: Vec<u64> = (0..100).map(|i| 300 * i).collect();
        assert_eq!(replay(&touch, 128), (100, 0, 0));
        // Steps fetched at one fault: at most `MAX_STEPS`, and at most `max` pages.
        let mut d = Streams::default();
        let mut longest = 0;
        for i in 0..200u64 {
            if let Some(s) = d.plan(8 * i, 8).stride {
                longest = longest.max(s.count());
            }
        }
        assert_eq!(longest, 8);
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
