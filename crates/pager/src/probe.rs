//! Read-ahead accuracy, measured on a sample: of the pages a fault's run fetches beyond the
//! faulting page (prefetch and read-ahead), how many does the program then use?
//!
//! userfaultfd reports misses, never reads of pages already installed, so a read-ahead page
//! that was installed and then used looks exactly like one installed and never touched. So a
//! sample of them is not installed: when a run is claimed, each page it would fetch from its
//! brick beyond the faulting page becomes a *probe* with probability 1 in `one_in`; the run
//! passes over it (it stays remote, its brick holds it) and the rest of the run is installed as
//! usual. Then:
//!
//! - the program touches the probe: it faults, and the probe counts as **used** (the fault
//!   fetches that one page, and does not count as a step of any sequential stream);
//! - the probe's *partner* leaves the local buffer first (the faulting page of its run, chosen
//!   as a victim or released): had the probe been installed with its run, it would have left
//!   about then, untouched, so it counts as **wasted**; so does a probe the program releases;
//! - another fault's run claims the probe as one of its own pages (a new stream passing over
//!   it): nobody can tell, and the probe is **dropped** from the sample.
//!
//! The estimate is used ÷ (used + wasted). It costs one extra fault per used probe: at the
//! runtime's 1 in 256, under 2% of a sequential scan's faults. Pending probes are bounded
//! ([`MAX_PENDING`]); past that, no new ones are taken.

use std::collections::HashMap;

/// Probes waiting for their outcome at most: a local buffer of 1 M pages (4 GiB) at 1 in 256
/// has about 4 k probes alive at once.
pub const MAX_PENDING: usize = 8192;

/// The sample and its counts (kept by [`crate::Core`], changed under its lock).
#[derive(Debug, Clone)]
pub struct Probes {
    /// One page in `one_in` becomes a probe; 0: none.
    one_in: u32,
    rng: u64,
    /// Probe page → its partner (the faulting page of the run it was taken from).
    partner_of: HashMap<u32, u32>,
    /// Partner → its probes.
    probes_of: HashMap<u32, Vec<u32>>,
    counts: ProbeCounts,
}

/// What the sample found so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeCounts {
    /// Probes taken.
    pub taken: u64,
    /// Probes the program touched before their partner left.
    pub used: u64,
    /// Probes whose partner left (or which were released) first.
    pub wasted: u64,
    /// Probes claimed by another fault's run (outcome unknown).
    pub dropped: u64,
}

impl ProbeCounts {
    /// used ÷ (used + wasted), if any probe has an outcome.
    pub fn accuracy(&self) -> Option<f64> {
        let n = self.used + self.wasted;
        (n > 0).then(|| self.used as f64 / n as f64)
    }
}

impl Probes {
    /// A sample of one page in `one_in` (0: none).
    pub fn new(one_in: u32) -> Probes {
        Probes {
            one_in,
            rng: 0x9e37_79b9_7f4a_7c15,
            partner_of: HashMap::new(),
            probes_of: HashMap::new(),
            counts: ProbeCounts::default(),
        }
    }

    /// The sampling rate: one page in this many (0: off).
    pub fn one_in(&self) -> u32 {
        self.one_in
    }

    /// What the sample found so far.
    pub fn counts(&self) -> ProbeCounts {
        self.counts
    }

    /// Probes waiting for their outcome.
    pub fn pending(&self) -> usize {
        self.partner_of.len()
    }

    /// True if no probe is waiting (the common case: callers skip their lookups).
    pub fn is_empty(&self) -> bool {
        self.partner_of.is_empty()
    }

    /// True if `page` is a pending probe.
    pub fn contains(&self, page: u64) -> bool {
        !self.partner_of.is_empty() && self.partner_of.contains_key(&(page as u32))
    }

    /// Draws whether the next read-ahead page is a probe.
    pub fn draw(&mut self) -> bool {
        if self.one_in == 0 || self.partner_of.len() >= MAX_PENDING {
            return false;
        }
        // xorshift64: deterministic, so the simulation replays a seed exactly.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % u64::from(self.one_in) == 0
    }

    /// `page` becomes a probe of the run whose faulting page is `partner`.
    pub fn take(&mut self, page: u64, partner: u64) {
        let (page, partner) = (page as u32, partner as u32);
        assert!(
            self.partner_of.insert(page, partner).is_none(),
            "window page {page} is already a read-ahead probe"
        );
        self.probes_of.entry(partner).or_default().push(page);
        self.counts.taken += 1;
    }

    /// Forgets probe `page`; returns true if it was one.
    fn forget(&mut self, page: u64) -> bool {
        let Some(partner) = self.partner_of.remove(&(page as u32)) else {
            return false;
        };
        if let Some(v) = self.probes_of.get_mut(&partner) {
            v.retain(|&p| p != page as u32);
            if v.is_empty() {
                self.probes_of.remove(&partner);
            }
        }
        true
    }

    /// The program faulted on `page`: if it is a probe, it was used. Returns true if it was.
    pub fn touched(&mut self, page: u64) -> bool {
        let hit = self.forget(page);
        if hit {
            self.counts.used += 1;
        }
        hit
    }

    /// `page` is claimed by a run that does not fault on it: a probe there is dropped.
    pub fn claimed(&mut self, page: u64) {
        if self.forget(page) {
            self.counts.dropped += 1;
        }
    }

    /// `page` was released while remote: a probe there was never used.
    pub fn released(&mut self, page: u64) {
        if self.forget(page) {
            self.counts.wasted += 1;
        }
    }

    /// `page` leaves the local buffer (a victim, or released): its probes were never used.
    pub fn partner_left(&mut self, page: u64) {
        if self.probes_of.is_empty() {
            return;
        }
        if let Some(v) = self.probes_of.remove(&(page as u32)) {
            for p in v {
                self.partner_of.remove(&p);
                self.counts.wasted += 1;
            }
        }
    }

    /// Every pending probe with its partner, for [`crate::Core::check`].
    pub fn pending_pairs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.partner_of.iter().map(|(&p, &q)| (u64::from(p), u64::from(q)))
    }

    /// Checks that the two maps agree.
    pub fn check(&self) -> Result<(), String> {
        let listed: usize = self.probes_of.values().map(Vec::len).sum();
        if listed != self.partner_of.len() {
            return Err(format!(
                "{} read-ahead probes, {listed} listed under partners",
                self.partner_of.len()
            ));
        }
        for (partner, v) in &self.probes_of {
            if let Some(p) = v.iter().find(|p| self.partner_of.get(p) != Some(partner)) {
                return Err(format!(
                    "read-ahead probe {p} is listed under partner {partner} but not its"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_counted_once_each() {
        let mut p = Probes::new(1);
        assert!(p.draw(), "one in one");
        p.take(10, 1);
        p.take(11, 1);
        p.take(20, 2);
        p.take(30, 3);
        assert!(p.touched(10));
        assert!(!p.touched(10), "counted once");
        p.partner_left(1); // 11 is wasted
        p.released(20);
        p.claimed(30);
        p.partner_left(2);
        p.partner_left(3);
        assert!(p.is_empty());
        p.check().expect("consistent");
        assert_eq!(
            p.counts(),
            ProbeCounts {
                taken: 4,
                used: 1,
                wasted: 2,
                dropped: 1
            }
        );
        assert_eq!(p.counts().accuracy(), Some(1.0 / 3.0));
    }

    #[test]
    fn the_sampling_rate_is_about_one_in_n_and_off_at_zero() {
        let mut p = Probes::new(16);
        let hits = (0..160_000).filter(|_| p.draw()).count();
        assert!((8_000..12_000).contains(&hits), "{hits} of 160000 at 1 in 16");
        let mut off = Probes::new(0);
        assert!(!(0..1000).any(|_| off.draw()));
    }
}
