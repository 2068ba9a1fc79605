//! Miss concurrency measured online, for a runtime that sees faults begin and end.
//!
//! A runtime cannot keep a trace of every access (it does not even see hits), but it sees each
//! fault start and finish. [`MissClock`] integrates the number of outstanding faults over time,
//! which gives, with no trace kept: the time at least one fault was outstanding (seed 002's miss
//! cycles `MC` at the local buffer, and the active time of the level below), the time-weighted
//! mean number outstanding (miss concurrency), the most ever outstanding, and the faults that
//! overlapped no other fault at any moment (*isolated* faults: with hits invisible, the share
//! of faults that nothing else of the memory system overlapped).
//!
//! Its memory is bounded by the number of faults outstanding at once, which the caller bounds.

/// Names one outstanding fault between [`MissClock::begin`] and [`MissClock::end`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(usize);

/// Outstanding faults integrated over time (see the module docs). Times are nanoseconds on any
/// monotonic clock; a time earlier than the last one seen counts as equal to it.
#[derive(Debug, Clone, Default)]
pub struct MissClock {
    last_ns: u64,
    /// Slots of outstanding faults: `Some(overlapped)`.
    open: Vec<Option<bool>>,
    outstanding: u64,
    faults: u64,
    isolated: u64,
    busy_ns: u128,
    accum_ns: u128,
    max: u64,
}

/// What a [`MissClock`] has measured so far.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct MissFigures {
    /// Faults that ended.
    pub faults: u64,
    /// Faults that overlapped no other fault.
    pub isolated_faults: u64,
    /// Nanoseconds with at least one fault outstanding.
    pub busy_ns: u128,
    /// Outstanding faults integrated over time (fault-nanoseconds).
    pub accum_ns: u128,
    /// Most faults outstanding at once.
    pub max_outstanding: u64,
}

impl MissFigures {
    /// Mean faults outstanding while any is (time-weighted miss concurrency).
    pub fn concurrency(&self) -> f64 {
        if self.busy_ns == 0 {
            0.0
        } else {
            self.accum_ns as f64 / self.busy_ns as f64
        }
    }

    /// Mean time a fault was outstanding, in nanoseconds.
    pub fn mean_penalty_ns(&self) -> f64 {
        if self.faults == 0 {
            0.0
        } else {
            self.accum_ns as f64 / self.faults as f64
        }
    }
}

impl MissClock {
    /// A clock with nothing outstanding.
    pub fn new() -> MissClock {
        MissClock::default()
    }

    fn advance(&mut self, now_ns: u64) {
        let now = now_ns.max(self.last_ns);
        let dt = u128::from(now - self.last_ns);
        if self.outstanding > 0 {
            self.busy_ns += dt;
            self.accum_ns += dt * u128::from(self.outstanding);
        }
        self.last_ns = now;
    }

    /// A fault began at `now_ns`.
    pub fn begin(&mut self, now_ns: u64) -> Ticket {
        self.advance(now_ns);
        let overlapped = self.outstanding > 0;
        if overlapped {
            for s in self.open.iter_mut().flatten() {
                *s = true;
            }
        }
        self.outstanding += 1;
        self.max = self.max.max(self.outstanding);
        let slot = match self.open.iter().position(Option::is_none) {
            Some(i) => {
                self.open[i] = Some(overlapped);
                i
            }
            None => {
                self.open.push(Some(overlapped));
                self.open.len() - 1
            }
        };
        Ticket(slot)
    }

    /// The fault of `ticket` ended at `now_ns`. A ticket ended twice is ignored.
    pub fn end(&mut self, ticket: Ticket, now_ns: u64) {
        let Some(overlapped) = self.open.get_mut(ticket.0).and_then(Option::take) else {
            return;
        };
        self.advance(now_ns);
        self.outstanding -= 1;
        self.faults += 1;
        if !overlapped {
            self.isolated += 1;
        }
    }

    /// Faults outstanding now.
    pub fn outstanding(&self) -> u64 {
        self.outstanding
    }

    /// The figures so far (outstanding faults count up to the last event).
    pub fn figures(&self) -> MissFigures {
        MissFigures {
            faults: self.faults,
            isolated_faults: self.isolated,
            busy_ns: self.busy_ns,
            accum_ns: self.accum_ns,
            max_outstanding: self.max,
        }
    }
}

/// What one memory level served, counted online: the figures C-AMAT needs at that level when
/// hits are invisible (seed 002, section 2.2, with κ = 1). A *pure miss* here is an access that
/// overlapped no other access outstanding at any level the clock tracks, so its whole time
/// stalled the program; the level's C-AMAT is its active time over its accesses (Eq. 1).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LevelCounts {
    /// Accesses that ended (faults served by this level).
    pub faults: u64,
    /// Of those, the ones no other access overlapped.
    pub pure_misses: u64,
    /// Their time, summed, nanoseconds.
    pub pure_miss_ns: u64,
    /// Time at least one access of this level was outstanding, nanoseconds.
    pub busy_ns: u64,
    /// Outstanding accesses integrated over time (access-nanoseconds).
    pub accum_ns: u64,
    /// Most accesses of this level outstanding at once.
    pub max_outstanding: u32,
}

impl LevelCounts {
    /// Miss concurrency `C_M`: accesses outstanding at once, time-weighted over the time any was.
    pub fn miss_concurrency(&self) -> f64 {
        ratio(self.accum_ns, self.busy_ns)
    }

    /// Mean time one access took, nanoseconds.
    pub fn mean_ns(&self) -> f64 {
        ratio(self.accum_ns, self.faults)
    }

    /// `pAMP`: mean time of a pure miss, nanoseconds.
    pub fn pure_avg_miss_penalty_ns(&self) -> f64 {
        ratio(self.pure_miss_ns, self.pure_misses)
    }

    /// The level's C-AMAT (Eq. 1): its active time per access, nanoseconds (the mean access
    /// time divided by its miss concurrency).
    pub fn camat_ns(&self) -> f64 {
        ratio(self.busy_ns, self.faults)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Accesses to several memory levels (each brick a slot) integrated over time, each level's
/// figures apart ([`LevelCounts`]) and pure misses judged across all of them: an access is pure
/// when it began with nothing outstanding and nothing began before it ended. Memory and time per
/// event are constant: no ticket, no trace.
///
/// The caller pairs every [`LevelClock::begin`] of a slot with one [`LevelClock::end`] of the
/// same slot; an `end` with nothing outstanding on its slot is ignored. Slots past the count
/// given to [`LevelClock::new`] share the last one.
#[derive(Debug, Clone)]
pub struct LevelClock {
    slots: Vec<SlotClock>,
    outstanding: u64,
    /// The access that began alone, while nothing else has begun: (slot, start).
    solo: Option<(usize, u64)>,
}

#[derive(Debug, Clone, Copy, Default)]
struct SlotClock {
    now: u32,
    since_ns: u64,
    counts: LevelCounts,
}

impl SlotClock {
    fn advance(&mut self, at_ns: u64) {
        let at = at_ns.max(self.since_ns);
        let dt = at - self.since_ns;
        if self.now > 0 {
            self.counts.busy_ns += dt;
            self.counts.accum_ns += dt * u64::from(self.now);
        }
        self.since_ns = at;
    }
}

impl LevelClock {
    /// A clock of `slots` levels (at least one), nothing outstanding.
    pub fn new(slots: usize) -> LevelClock {
        LevelClock {
            slots: vec![SlotClock::default(); slots.max(1)],
            outstanding: 0,
            solo: None,
        }
    }

    fn slot(&self, slot: usize) -> usize {
        slot.min(self.slots.len() - 1)
    }

    /// An access to level `slot` began at `at_ns`.
    pub fn begin(&mut self, slot: usize, at_ns: u64) {
        let k = self.slot(slot);
        self.solo = (self.outstanding == 0).then_some((k, at_ns));
        self.outstanding += 1;
        let s = &mut self.slots[k];
        s.advance(at_ns);
        s.now += 1;
        s.counts.max_outstanding = s.counts.max_outstanding.max(s.now);
    }

    /// An access to level `slot` ended at `at_ns`.
    pub fn end(&mut self, slot: usize, at_ns: u64) {
        let k = self.slot(slot);
        if self.slots[k].now == 0 {
            return;
        }
        let solo = self.solo.take_if(|(s, _)| *s == k && self.outstanding == 1);
        self.outstanding -= 1;
        let s = &mut self.slots[k];
        s.advance(at_ns);
        s.now -= 1;
        s.counts.faults += 1;
        if let Some((_, start)) = solo {
            s.counts.pure_misses += 1;
            s.counts.pure_miss_ns += at_ns.saturating_sub(start);
        }
    }

    /// Slot `slot`'s figures so far (outstanding accesses count up to its last event).
    pub fn counts(&self, slot: usize) -> LevelCounts {
        self.slots[self.slot(slot)].counts
    }

    /// Slots kept.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_fault_at_a_time_has_concurrency_one() {
        let mut c = MissClock::new();
        for i in 0..10u64 {
            let t = c.begin(i * 100);
            c.end(t, i * 100 + 10);
        }
        let f = c.figures();
        assert_eq!(f.faults, 10);
        assert_eq!(f.isolated_faults, 10);
        assert_eq!(f.busy_ns, 100);
        assert_eq!(f.concurrency(), 1.0);
        assert_eq!(f.mean_penalty_ns(), 10.0);
        assert_eq!(f.max_outstanding, 1);
    }

    #[test]
    fn overlapping_faults_raise_concurrency_and_are_not_isolated() {
        let mut c = MissClock::new();
        let a = c.begin(0);
        let b = c.begin(5);
        c.end(a, 10);
        c.end(b, 15);
        c.end(b, 99); // ended twice: ignored
        let f = c.figures();
        assert_eq!(f.faults, 2);
        assert_eq!(f.isolated_faults, 0);
        assert_eq!(f.busy_ns, 15);
        assert_eq!(f.accum_ns, 20);
        assert_eq!(f.max_outstanding, 2);
        assert!((f.concurrency() - 20.0 / 15.0).abs() < 1e-12);
    }

    #[test]
    fn levels_are_kept_apart_and_pure_misses_judged_across_them() {
        let mut c = LevelClock::new(3);
        // Slot 0 alone for 10 ns: pure.
        c.begin(0, 0);
        c.end(0, 10);
        // Slot 1 from 20 to 40, slot 2 from 30 to 35: neither pure.
        c.begin(1, 20);
        c.begin(2, 30);
        c.end(2, 35);
        c.end(1, 40);
        // Slot 1 twice at once, 50..60 and 55..70: concurrency (10 + 15) / 20, neither pure.
        c.begin(1, 50);
        c.begin(1, 55);
        c.end(1, 60);
        c.end(1, 70);
        // Slot 9 lands in the last slot; an end with nothing outstanding is ignored.
        c.begin(9, 100);
        c.end(2, 130);
        c.end(0, 500);
        let (a, b, d) = (c.counts(0), c.counts(1), c.counts(2));
        assert_eq!((a.faults, a.pure_misses, a.pure_miss_ns, a.busy_ns), (1, 1, 10, 10));
        assert_eq!(
            (b.faults, b.pure_misses, b.busy_ns, b.accum_ns, b.max_outstanding),
            (3, 0, 40, 45, 2)
        );
        assert!((b.miss_concurrency() - 45.0 / 40.0).abs() < 1e-12);
        assert!((b.camat_ns() - 40.0 / 3.0).abs() < 1e-12);
        assert_eq!((d.faults, d.pure_misses, d.pure_miss_ns, d.busy_ns), (2, 1, 30, 35));
        assert_eq!(d.pure_avg_miss_penalty_ns(), 30.0);
        assert_eq!(LevelCounts::default().camat_ns(), 0.0);
    }
}
