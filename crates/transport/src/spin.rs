//! Whether a read polls for its answer or sleeps at once: chosen by measuring both.
//!
//! Polling pays when the reader has a CPU to itself: an 8-byte put over a Unix socket took 4 µs
//! polling against 14 µs sleeping on a quiet 2-vCPU guest, because a sleeping reader's wake-up
//! costs more than the brick takes to answer (`docs/benchmarks.md`, "Links that poll only while
//! it pays"). It costs dearly when the CPUs are busy: with three busy loops beside it the same
//! put took 20–255 µs polling against 15–45 µs sleeping, because the poller holds a CPU the
//! brick's thread needs. No fixed setting is right on both machines, nor on one machine whose
//! load comes and goes, so a link measures: each read's wait (from the read's start to its
//! first bytes) enters a moving average of its kind, and the next read takes the kind that
//! waited less. The other kind is tried again now and then, more rarely the worse it did, so a
//! change of load is noticed within a few hundred reads at the most.

use std::time::Duration;

/// Weight of the newest wait in a kind's moving average.
const WEIGHT: f64 = 1.0 / 8.0;
/// One read in this many tries the kind out of favour while the two are within 2× ...
const EXPLORE_CLOSE: u64 = 32;
/// ... and one in this many once it waited over twice as long (a poller beside busy CPUs
/// can wait 10× longer: trying it every 32nd read would cost more than polling ever saves).
const EXPLORE_FAR: u64 = 256;

/// The measured waits of polling and sleeping reads on one link, and the choice they make.
#[derive(Debug, Default, Clone)]
pub(crate) struct SpinChoice {
    /// Moving averages of the wait, ns; `None` until a read of that kind was measured.
    polled: Option<f64>,
    slept: Option<f64>,
    reads: u64,
}

impl SpinChoice {
    /// Whether the next read should poll first.
    pub(crate) fn poll_next(&mut self) -> bool {
        self.reads += 1;
        let (p, s) = match (self.polled, self.slept) {
            // Each kind is measured once before any choice.
            (None, _) => return true,
            (_, None) => return false,
            (Some(p), Some(s)) => (p, s),
        };
        let favour_poll = p <= s;
        let (best, worst) = if favour_poll { (p, s) } else { (s, p) };
        let every = if worst > 2.0 * best { EXPLORE_FAR } else { EXPLORE_CLOSE };
        if self.reads % every == 0 {
            !favour_poll
        } else {
            favour_poll
        }
    }

    /// Records how long a read of the given kind waited for its first bytes. A read of the
    /// kind out of favour replaces its average instead of moving it: those reads are rare, so
    /// each is the latest news of that kind, and an average built when the machine was busy
    /// would otherwise take thousands of reads to forget it.
    pub(crate) fn record(&mut self, polled: bool, wait: Duration) {
        let w = wait.as_nanos() as f64;
        let out_of_favour = match (self.polled, self.slept) {
            (Some(p), Some(s)) => (p <= s) != polled,
            _ => true,
        };
        let avg = if polled { &mut self.polled } else { &mut self.slept };
        *avg = Some(match *avg {
            Some(a) if !out_of_favour => a + WEIGHT * (w - a),
            _ => w,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(c: &mut SpinChoice, reads: usize, poll_wait_us: u64, sleep_wait_us: u64) -> usize {
        let mut polls = 0;
        for _ in 0..reads {
            let poll = c.poll_next();
            polls += poll as usize;
            let us = if poll { poll_wait_us } else { sleep_wait_us };
            c.record(poll, Duration::from_micros(us));
        }
        polls
    }

    #[test]
    fn each_kind_is_measured_first_then_the_faster_is_kept() {
        let mut c = SpinChoice::default();
        assert!(c.poll_next(), "the first read polls");
        c.record(true, Duration::from_micros(4));
        assert!(!c.poll_next(), "the second sleeps");
        c.record(false, Duration::from_micros(14));
        let polls = run(&mut c, 1000, 4, 14);
        // Polling wins; sleeping is tried one read in 256 (14 > 2 × 4).
        assert!(polls >= 995, "{polls}");
    }

    #[test]
    fn busy_cpus_turn_polling_off_and_quiet_ones_back_on() {
        let mut c = SpinChoice::default();
        run(&mut c, 1000, 4, 14);
        // The machine gets busy: polling now waits 200 µs, sleeping 30.
        let polls = run(&mut c, 2000, 200, 30);
        assert!(polls < 2000 / 100, "polling kept although it lost: {polls}");
        // Quiet again: the occasional poll notices and polling comes back.
        run(&mut c, 2000, 4, 14);
        let polls = run(&mut c, 1000, 4, 14);
        assert!(polls >= 990, "{polls}");
    }

    #[test]
    fn close_waits_are_both_kept_measured() {
        let mut c = SpinChoice::default();
        let polls = run(&mut c, 3200, 10, 11);
        // Polling wins narrowly; sleeping is still tried one read in 32.
        assert!((3000..3200).contains(&polls), "{polls}");
    }
}
