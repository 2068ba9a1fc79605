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
}
