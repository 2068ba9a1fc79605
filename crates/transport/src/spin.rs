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
//! waited less. The other kind is tried again now and then in a short run of reads (a trial),
//! more rarely while trials change nothing, so a change of load is noticed within a few
//! thousand reads at the most.
//!
//! A new link to a brick starts from what the last links to the same brick learned (this
//! process's, kept per address): otherwise every new link paid a trial of polling and then
//! slept until the next trial, 64 reads later, however clearly polling had won on the link
//! before it. A one-sided segment has a link of its own, so a program that allocates a segment
//! and makes a few hundred puts spent most of them learning (`docs/benchmarks.md`, "The install
//! path measured at start, and put/get that poll when it pays": put lost to `MPI_Put` in short
//! runs only).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Weight of the newest wait in a kind's moving average.
const WEIGHT: f64 = 1.0 / 8.0;
/// Reads in a trial of the kind out of favour, and how many of its last ones count: a single
/// polled read among slept ones is slow even where polling pays (the reader and the brick's
/// thread have settled on one CPU, and a poller holds the brick off), so a trial polls several
/// times in a row and judges polling by the reads after the first few.
const TRIAL: u32 = 8;
const TRIAL_COUNTED: u32 = 4;
/// Reads between trials: from this many ...
const EVERY_MIN: u64 = 64;
/// ... doubling after each trial that did not change the choice, up to this many (a trial
/// of polling beside busy CPUs costs eight reads of 100–300 µs: at 4096 reads apart, about
/// 2% of the time).
const EVERY_MAX: u64 = 4096;

/// Bricks whose links' last averages are remembered; past this many, the table is cleared (a
/// process talks to a handful of bricks; this only bounds a process that talks to thousands).
const REMEMBERED_BRICKS: usize = 64;

/// The last averages (polled, slept) a link to each brick measured, by the brick's address.
static LEARNED: Mutex<Option<HashMap<String, (f64, f64)>>> = Mutex::new(None);

/// The measured waits of polling and sleeping reads on one link, and the choice they make.
#[derive(Debug, Default, Clone)]
pub(crate) struct SpinChoice {
    /// The brick's address, under which the link shares what it learns (empty: shares nothing).
    peer: String,
    /// Moving averages of the wait, ns; `None` until a read of that kind was measured.
    polled: Option<f64>,
    slept: Option<f64>,
    /// Reads since the last trial, and how many there are to be between trials (0: the least).
    since_trial: u64,
    every: u64,
    trial: Option<Trial>,
}

/// A run of reads of the kind out of favour.
#[derive(Debug, Clone)]
struct Trial {
    poll: bool,
    left: u32,
    sum: f64,
    counted: u32,
}

impl Trial {
    fn new(poll: bool) -> Trial {
        Trial {
            poll,
            left: TRIAL,
            sum: 0.0,
            counted: 0,
        }
    }
}

impl SpinChoice {
    /// The choice for a new link to `peer`: what the last link there learned, if one did (the
    /// favoured kind at once, the other tried again after the fewest reads), else nothing yet.
    /// Looked up again at the link's first read if nothing was known when it was made (a
    /// one-sided segment's link is made before the engine measures the brick on another).
    pub(crate) fn for_peer(peer: &str) -> SpinChoice {
        let mut c = SpinChoice {
            peer: peer.to_owned(),
            ..SpinChoice::default()
        };
        c.learn();
        c
    }

    /// Takes what the last link to the peer learned, if this link has measured nothing yet.
    fn learn(&mut self) {
        if self.polled.is_some() || self.slept.is_some() || self.trial.is_some() || self.peer.is_empty() {
            return;
        }
        if let Some((p, s)) = lock_learned().as_ref().and_then(|t| t.get(&self.peer).copied()) {
            (self.polled, self.slept) = (Some(p), Some(s));
        }
    }

    /// Shares both averages under the link's peer, once both are measured.
    fn publish(&self) {
        let (Some(p), Some(s)) = (self.polled, self.slept) else {
            return;
        };
        if self.peer.is_empty() {
            return;
        }
        let mut t = lock_learned();
        let t = t.get_or_insert_with(HashMap::new);
        if t.len() >= REMEMBERED_BRICKS && !t.contains_key(&self.peer) {
            t.clear();
        }
        t.insert(self.peer.clone(), (p, s));
    }

    /// Whether the next read should poll first.
    pub(crate) fn poll_next(&mut self) -> bool {
        if let Some(t) = &self.trial {
            return t.poll;
        }
        if self.polled.is_none() {
            self.learn();
        }
        let favour_poll = match (self.polled, self.slept) {
            // Polling is tried first, as a trial; then sleeping is measured.
            (None, _) => {
                self.trial = Some(Trial::new(true));
                return true;
            }
            (_, None) => return false,
            (Some(p), Some(s)) => p <= s,
        };
        self.since_trial += 1;
        if self.since_trial >= self.every.max(EVERY_MIN) {
            self.since_trial = 0;
            self.trial = Some(Trial::new(!favour_poll));
            return !favour_poll;
        }
        favour_poll
    }

    /// Records how long a read of the given kind waited for its first bytes. A trial's reads
    /// replace their kind's average when the trial ends (the latest news of a kind seldom
    /// measured: an average built when the machine was busy would otherwise take thousands of
    /// reads to forget); other reads move the average.
    pub(crate) fn record(&mut self, polled: bool, wait: Duration) {
        let w = wait.as_nanos() as f64;
        if let Some(t) = self.trial.as_mut().filter(|t| t.poll == polled) {
            t.left -= 1;
            if t.left < TRIAL_COUNTED {
                t.sum += w;
                t.counted += 1;
            }
            if t.left > 0 {
                return;
            }
            let mean = t.sum / f64::from(t.counted.max(1));
            let before = self.favours_polling();
            *self.average(polled) = Some(mean);
            self.trial = None;
            // Back off while trials change nothing; start again from the least when one does.
            self.every = if self.favours_polling() == before {
                (self.every.max(EVERY_MIN) * 2).min(EVERY_MAX)
            } else {
                EVERY_MIN
            };
            self.publish();
            return;
        }
        let first = self.favours_polling().is_none();
        let avg = self.average(polled);
        // One slow read (the brick's thread descheduled once) moves the average by at most an
        // eighth of itself: unclipped, a single 200 µs poll among 9 µs ones lifted polling's
        // average above sleeping's 20 µs and the link slept until the next trial. A lasting
        // change still doubles the average within six reads.
        *avg = Some(match *avg {
            Some(a) => a + WEIGHT * (w.min(2.0 * a) - a),
            None => w,
        });
        // Shared when the choice is first made and after every trial (not on every read: the
        // table has one lock for the process's links).
        if first {
            self.publish();
        }
    }

    fn average(&mut self, polled: bool) -> &mut Option<f64> {
        if polled {
            &mut self.polled
        } else {
            &mut self.slept
        }
    }

    /// Which kind is in favour now (`None` before both were measured).
    fn favours_polling(&self) -> Option<bool> {
        Some(self.polled? <= self.slept?)
    }
}

fn lock_learned() -> std::sync::MutexGuard<'static, Option<HashMap<String, (f64, f64)>>> {
    LEARNED.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `reads` reads, polled ones waiting `poll_us`, slept ones `sleep_us`; returns the polls.
    fn run(c: &mut SpinChoice, reads: usize, poll_us: u64, sleep_us: u64) -> usize {
        let mut polls = 0;
        for _ in 0..reads {
            let poll = c.poll_next();
            polls += poll as usize;
            let us = if poll { poll_us } else { sleep_us };
            c.record(poll, Duration::from_micros(us));
        }
        polls
    }

    #[test]
    fn polling_is_tried_first_then_sleeping_then_the_faster_is_kept() {
        let mut c = SpinChoice::default();
        assert_eq!(
            run(&mut c, TRIAL as usize, 4, 14),
            TRIAL as usize,
            "a trial of polling first"
        );
        assert!(!c.poll_next(), "then a slept read");
        c.record(false, Duration::from_micros(14));
        let polls = run(&mut c, 10_000, 4, 14);
        // Polling wins; sleeping is tried in trials that back off to one in 4096 reads.
        assert!(polls >= 10_000 - 8 * 10, "{polls}");
    }

    #[test]
    fn busy_cpus_turn_polling_off_and_quiet_ones_back_on() {
        let mut c = SpinChoice::default();
        run(&mut c, 1000, 4, 14);
        // The machine gets busy: polling now waits 200 µs, sleeping 30.
        let polls = run(&mut c, 20_000, 200, 30);
        assert!(polls < 20_000 / 50, "polling kept although it lost: {polls}");
        // Quiet again: a trial notices within the longest back-off, and polling comes back.
        run(&mut c, EVERY_MAX as usize + TRIAL as usize, 4, 14);
        let polls = run(&mut c, 1000, 4, 14);
        assert!(polls >= 990, "{polls}");
    }

    #[test]
    fn a_trial_judges_by_its_last_reads() {
        let mut c = SpinChoice::default();
        // Sleeping wins at first: polled reads wait 200 µs.
        run(&mut c, 100, 200, 14);
        assert!(!c.poll_next());
        // Then polling's first reads of a trial are slow (threads on one CPU) and its later
        // ones fast: the trial's last reads decide, and polling is taken up.
        let mut saw_trial = false;
        for _ in 0..EVERY_MAX as usize * 2 {
            let poll = c.poll_next();
            let us = match (poll, c.trial.as_ref().map(|t| t.left)) {
                (true, Some(left)) if left > TRIAL_COUNTED => 160,
                (true, _) => 4,
                (false, _) => 14,
            };
            saw_trial |= poll;
            c.record(poll, Duration::from_micros(us));
        }
        assert!(saw_trial);
        let polls = run(&mut c, 100, 4, 14);
        assert!(
            polls >= 100 - TRIAL as usize,
            "polling taken up after a trial: {polls} {c:?}"
        );
    }

    #[test]
    fn a_new_link_to_a_brick_starts_from_what_the_last_one_learned() {
        let peer = "unix:/test/a-new-link-starts-from-the-last";
        let mut first = SpinChoice::for_peer(peer);
        run(&mut first, 200, 4, 14);
        // Polling won on the first link: the second polls from its first read, with no trial.
        let mut second = SpinChoice::for_peer(peer);
        assert!(second.trial.is_none() && second.poll_next(), "{second:?}");
        // (The first read above and these: one short of the first trial of sleeping.)
        let polls = run(&mut second, EVERY_MIN as usize - 2, 4, 14);
        assert_eq!(polls, EVERY_MIN as usize - 2, "{second:?}");
        // Sleeping wins on another brick: its next link sleeps at once, and this brick's
        // choice is untouched.
        let other = "tcp:/test/a-new-link-starts-from-the-last:1";
        let mut busy = SpinChoice::for_peer(other);
        run(&mut busy, 200, 200, 30);
        assert!(!SpinChoice::for_peer(other).poll_next());
        assert!(SpinChoice::for_peer(peer).poll_next());
        // A link of no known brick starts with its trial of polling, as before.
        let mut fresh = SpinChoice::for_peer("unix:/test/never-seen");
        assert!(fresh.poll_next() && fresh.trial.is_some());
    }

    #[test]
    fn a_link_that_learns_sleeping_wins_tells_the_next_link() {
        let peer = "unix:/test/learns-sleeping";
        let mut first = SpinChoice::for_peer(peer);
        run(&mut first, 100, 4, 14);
        // The machine gets busy; a trial on the first link shows sleeping wins now.
        run(&mut first, 3 * EVERY_MAX as usize, 200, 30);
        let mut next = SpinChoice::for_peer(peer);
        let polls = run(&mut next, EVERY_MIN as usize - 1, 200, 30);
        assert_eq!(polls, 0, "{next:?}");
    }

    #[test]
    fn a_link_made_before_its_brick_was_measured_learns_at_its_first_read() {
        let peer = "unix:/test/made-before";
        let mut early = SpinChoice::for_peer(peer);
        let mut other = SpinChoice::for_peer(peer);
        run(&mut other, 200, 4, 14);
        // `early` has read nothing yet: its first read polls, and no trial is under way.
        assert!(early.poll_next() && early.trial.is_none(), "{early:?}");
    }
}
