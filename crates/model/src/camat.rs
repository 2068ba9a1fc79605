//! C-AMAT, the concurrent average memory access time of seed 002 (section 2.2 and 3), for
//! rackmem's memory levels.
//!
//! C-AMAT is the time a memory level is *active* (at least one access outstanding, counted once
//! however many overlap) divided by the number of accesses it served (Eq. 1). Its parameterised
//! form (Eq. 2) splits that time into what hits cost, `H / C_H`, and what *pure* misses cost,
//! `pMR × pAMP / C_M`: a pure miss is a miss with at least one moment during which no hit is in
//! progress, and only those moments stall the program. Concurrency divides both: hit
//! concurrency `C_H`, and pure miss concurrency `C_M`, the mean number of misses outstanding
//! during pure miss time.
//!
//! In rackmem the first level is the local buffer: an access is a touch of a window page, a hit
//! a touch of a resident page, a miss a page fault. The second level is the bricks: each fault
//! is one access to them, and C-AMAT₂ is the time at least one fault is being served divided by
//! the number of faults. Eq. 4 ties the levels together: C-AMAT₁ = H₁ / C_H₁ + MR₁ × κ₁ ×
//! C-AMAT₂, where κ₁ (Eq. 5) is the share of miss time that no hit overlaps.
//!
//! All times here share one unit, whatever the caller uses (seconds, nanoseconds, cycles).
//! [`Trace`] measures every parameter exactly from a list of accesses, which is how the tests
//! check that Eq. 1, Eq. 2 and Eq. 4 agree, and how a researcher can feed a recorded trace.

use crate::ModelError;

/// The five parameters of seed 002's Eq. 2 for one memory level.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Camat {
    /// `H`: the mean time one hit takes.
    pub hit_time: f64,
    /// `C_H`: hits in progress at once, on average over the time any hit is in progress.
    pub hit_concurrency: f64,
    /// `pMR`: pure misses over all accesses.
    pub pure_miss_ratio: f64,
    /// `pAMP`: pure miss time per pure miss (each pure miss's own pure moments, summed).
    pub pure_avg_miss_penalty: f64,
    /// `C_M`: misses outstanding at once, on average over pure miss time.
    pub pure_miss_concurrency: f64,
}

impl Camat {
    /// Eq. 2: `H / C_H + pMR × pAMP / C_M` (the second term is 0 when there is no pure miss).
    pub fn value(&self) -> f64 {
        let hits = if self.hit_concurrency > 0.0 {
            self.hit_time / self.hit_concurrency
        } else {
            0.0
        };
        let misses = if self.pure_miss_ratio > 0.0 && self.pure_miss_concurrency > 0.0 {
            self.pure_miss_ratio * self.pure_avg_miss_penalty / self.pure_miss_concurrency
        } else {
            0.0
        };
        hits + misses
    }
}

/// Eq. 1: C-AMAT as active time over accesses.
pub fn from_active_time(active_time: f64, accesses: u64) -> f64 {
    if accesses == 0 {
        0.0
    } else {
        active_time / accesses as f64
    }
}

/// Eq. 5: κ, the share of miss time that overlaps no hit (pure miss time over miss time); 1 when
/// there is no miss time (nothing overlaps, and Eq. 4's second term is 0 anyway).
pub fn kappa(pure_miss_time: f64, miss_time: f64) -> f64 {
    if miss_time > 0.0 {
        pure_miss_time / miss_time
    } else {
        1.0
    }
}

/// Eq. 7: the time a program stalls on memory, from its memory accesses, their C-AMAT and the
/// share of memory time its computation overlaps (`overlap`, 0 for a thread that waits on
/// every fault, as a thread stopped in a page fault does).
pub fn stall_time(accesses: u64, camat: f64, overlap: f64) -> f64 {
    accesses as f64 * camat * (1.0 - overlap)
}

/// One level of the recursive form (Eq. 4).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Level {
    /// `H_i`.
    pub hit_time: f64,
    /// `C_H_i`.
    pub hit_concurrency: f64,
    /// `MR_i`: misses over accesses at this level (every miss, pure or not).
    pub miss_ratio: f64,
    /// `κ_i` (Eq. 5).
    pub kappa: f64,
}

/// Eq. 4 applied from the last level up: `levels[0]` is the first level (the local buffer),
/// `last` the C-AMAT of the level below the last one given (the bricks, measured or modelled).
/// Returns C-AMAT of the first level.
pub fn recursive(levels: &[Level], last: f64) -> f64 {
    levels.iter().rev().fold(last, |below, l| {
        let hits = if l.hit_concurrency > 0.0 {
            l.hit_time / l.hit_concurrency
        } else {
            0.0
        };
        hits + l.miss_ratio * l.kappa * below
    })
}

/// C-AMAT of a level made of parts side by side (the bricks of rackmem's second level), from
/// each part's accesses and C-AMAT: their mean weighted by accesses, the time each part was
/// active summed over all accesses. Parts active at the same time count once each, so this is
/// at least the level's Eq. 1 over the union of their active time. `None` with no access.
pub fn weighted(parts: &[(u64, f64)]) -> Option<f64> {
    let n: u64 = parts.iter().map(|p| p.0).sum();
    (n > 0).then(|| parts.iter().map(|&(a, c)| a as f64 * c).sum::<f64>() / n as f64)
}

/// One access in a [`Trace`]: a hit phase of `hit` from `start`, then, for a miss, a miss phase
/// of `miss` (0 for a hit). Seed 002 counts a miss's hit phase (the lookup that found nothing)
/// as part of the access; a page fault's is the touch that trapped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Access {
    /// When the access began.
    pub start: f64,
    /// How long its hit phase took (> 0).
    pub hit: f64,
    /// How long its miss phase took (0: a hit).
    pub miss: f64,
}

/// Every quantity of Eq. 1–5 and 9, measured exactly from a trace of accesses from any number
/// of threads (seed 002's multicore C-AMAT, Eq. 3, is this measurement over all of them).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Trace {
    /// Accesses (`C_MemAcc`).
    pub accesses: u64,
    /// Misses (accesses with a miss phase).
    pub misses: u64,
    /// Pure misses (`C_pMA`): misses with a moment of miss phase during which no hit was in
    /// progress.
    pub pure_misses: u64,
    /// Time at least one access was in progress (`T_MemCycle`).
    pub active_time: f64,
    /// Sum of all hit phases.
    pub hit_time_total: f64,
    /// Time at least one hit phase was in progress.
    pub hit_active_time: f64,
    /// Time at least one miss phase was in progress (`MC`).
    pub miss_time: f64,
    /// Time at least one miss phase and no hit phase was in progress (`pMC`).
    pub pure_miss_time: f64,
    /// Pure miss time counted once per outstanding miss (`pMC_accum`, Eq. 11).
    pub pure_miss_time_accum: f64,
    /// Miss phases counted once per outstanding miss, over all miss time.
    pub miss_time_accum: f64,
}

impl Trace {
    /// Measures a trace. Accesses may overlap in any way; order does not matter.
    pub fn measure(accesses: &[Access]) -> Result<Trace, ModelError> {
        // Events: (time, kind, access index); kind 0 = a phase ends, 1 = a phase begins, so that
        // at equal times ends are taken first and touching intervals do not overlap.
        #[derive(Clone, Copy)]
        enum Phase {
            Hit,
            Miss,
        }
        let mut events: Vec<(f64, u8, Phase, usize)> = Vec::with_capacity(accesses.len() * 4);
        for (i, a) in accesses.iter().enumerate() {
            let finite = a.start.is_finite() && a.hit.is_finite() && a.miss.is_finite();
            if !finite || a.hit <= 0.0 || a.miss < 0.0 {
                return Err(ModelError::Invalid {
                    what: "access",
                    reason: format!(
                        "access {i}: start {}, hit {}, miss {} (hit must be > 0, miss ≥ 0, all finite)",
                        a.start, a.hit, a.miss
                    ),
                });
            }
            events.push((a.start, 1, Phase::Hit, i));
            events.push((a.start + a.hit, 0, Phase::Hit, i));
            if a.miss > 0.0 {
                events.push((a.start + a.hit, 1, Phase::Miss, i));
                events.push((a.start + a.hit + a.miss, 0, Phase::Miss, i));
            }
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut t = Trace {
            accesses: accesses.len() as u64,
            misses: accesses.iter().filter(|a| a.miss > 0.0).count() as u64,
            pure_misses: 0,
            active_time: 0.0,
            hit_time_total: accesses.iter().map(|a| a.hit).sum(),
            hit_active_time: 0.0,
            miss_time: 0.0,
            pure_miss_time: 0.0,
            pure_miss_time_accum: 0.0,
            miss_time_accum: 0.0,
        };
        let mut hits_open = 0u64;
        let mut misses_open: Vec<usize> = Vec::new();
        let mut pure = vec![false; accesses.len()];
        let mut last = events.first().map_or(0.0, |e| e.0);
        for (time, begins, phase, i) in events {
            let dt = time - last;
            if dt > 0.0 {
                let m = misses_open.len() as f64;
                if hits_open > 0 || !misses_open.is_empty() {
                    t.active_time += dt;
                }
                if hits_open > 0 {
                    t.hit_active_time += dt;
                }
                if !misses_open.is_empty() {
                    t.miss_time += dt;
                    t.miss_time_accum += m * dt;
                    if hits_open == 0 {
                        t.pure_miss_time += dt;
                        t.pure_miss_time_accum += m * dt;
                        for &j in &misses_open {
                            pure[j] = true;
                        }
                    }
                }
            }
            last = time;
            match (phase, begins) {
                (Phase::Hit, 1) => hits_open += 1,
                (Phase::Hit, _) => hits_open -= 1,
                (Phase::Miss, 1) => misses_open.push(i),
                (Phase::Miss, _) => misses_open.retain(|&j| j != i),
            }
        }
        t.pure_misses = pure.iter().filter(|p| **p).count() as u64;
        Ok(t)
    }

    /// Eq. 1.
    pub fn camat_eq1(&self) -> f64 {
        from_active_time(self.active_time, self.accesses)
    }

    /// Eq. 2's parameters.
    pub fn camat(&self) -> Camat {
        let n = self.accesses.max(1) as f64;
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        Camat {
            hit_time: self.hit_time_total / n,
            hit_concurrency: ratio(self.hit_time_total, self.hit_active_time),
            pure_miss_ratio: self.pure_misses as f64 / n,
            pure_avg_miss_penalty: ratio(self.pure_miss_time_accum, self.pure_misses as f64),
            pure_miss_concurrency: ratio(self.pure_miss_time_accum, self.pure_miss_time),
        }
    }

    /// Eq. 9: `H / C_H + pMC / C_MemAcc`.
    pub fn camat_eq9(&self) -> f64 {
        let c = self.camat();
        let hits = if c.hit_concurrency > 0.0 {
            c.hit_time / c.hit_concurrency
        } else {
            0.0
        };
        hits + from_active_time(self.pure_miss_time, self.accesses)
    }

    /// κ (Eq. 5).
    pub fn kappa(&self) -> f64 {
        kappa(self.pure_miss_time, self.miss_time)
    }

    /// Miss concurrency over all miss time (outstanding misses, time-weighted), the figure the
    /// runtime reports as faults in flight.
    pub fn miss_concurrency(&self) -> f64 {
        if self.miss_time > 0.0 {
            self.miss_time_accum / self.miss_time
        } else {
            0.0
        }
    }

    /// The next level's C-AMAT as this level's misses see it: time any miss is outstanding
    /// over misses (each miss is one access to the level below).
    pub fn next_level_camat(&self) -> f64 {
        from_active_time(self.miss_time, self.misses)
    }

    /// This level in Eq. 4's form.
    pub fn level(&self) -> Level {
        let c = self.camat();
        Level {
            hit_time: c.hit_time,
            hit_concurrency: c.hit_concurrency,
            miss_ratio: self.misses as f64 / self.accesses.max(1) as f64,
            kappa: self.kappa(),
        }
    }
}

/// C-AMAT of rackmem's two levels from one run's counters, without a trace: what the runtime
/// counts (faults, their mean service time, faults in flight) and a sampled count of page
/// accesses.
///
/// Hits cannot be timed without hardware counters, so the first level's `H / C_H` is not
/// given; its miss term `MR₁ × κ₁ × C-AMAT₂` is, with κ₁ taken as 1 (no hit overlaps a miss:
/// an upper bound, exact for one thread, which stops while its fault is served).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct FromCounters {
    /// Page accesses (a lower bound: pages touched, counted once per sampling interval).
    pub page_accesses: u64,
    /// Faults (misses of the local buffer).
    pub faults: u64,
    /// Mean time a fault took to serve, seconds.
    pub fault_mean_s: f64,
    /// Faults outstanding at once, time-weighted over the time any was (C_M).
    pub miss_concurrency: f64,
    /// The run's wall-clock time, seconds.
    pub wall_s: f64,
}

impl FromCounters {
    /// MR₁: faults per page access (at most 1 when accesses are counted fully; above 1 says the
    /// sampling missed accesses, for example of pages evicted within an interval).
    pub fn miss_ratio(&self) -> f64 {
        if self.page_accesses == 0 {
            0.0
        } else {
            self.faults as f64 / self.page_accesses as f64
        }
    }

    /// C-AMAT₂, the bricks' level: time any fault is outstanding per fault, the mean fault
    /// time divided by the miss concurrency.
    pub fn bricks_camat_s(&self) -> f64 {
        self.fault_mean_s / self.miss_concurrency.max(1.0)
    }

    /// MC₁: time at least one fault was outstanding (faults × C-AMAT₂).
    pub fn miss_time_s(&self) -> f64 {
        self.faults as f64 * self.bricks_camat_s()
    }

    /// The first level's miss term per access, `MR₁ × C-AMAT₂` (κ₁ = 1).
    pub fn local_miss_term_s(&self) -> f64 {
        self.miss_ratio() * self.bricks_camat_s()
    }

    /// Share of the run during which a fault was outstanding: with κ₁ = 1, the share of the
    /// run stalled on remote memory (Eq. 7 with no overlap).
    pub fn stall_share(&self) -> f64 {
        if self.wall_s > 0.0 {
            (self.miss_time_s() / self.wall_s).min(1.0)
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(start: f64, hit: f64) -> Access {
        Access { start, hit, miss: 0.0 }
    }
    fn miss(start: f64, hit: f64, miss: f64) -> Access {
        Access { start, hit, miss }
    }

    #[test]
    fn parts_side_by_side_weigh_by_their_accesses() {
        assert_eq!(weighted(&[]), None);
        assert_eq!(weighted(&[(0, 5.0)]), None);
        // 3 accesses at 10 and 1 at 30: 60 / 4.
        assert_eq!(weighted(&[(3, 10.0), (1, 30.0), (0, 99.0)]), Some(15.0));
        // Through Eq. 4 with no hit term: MR × κ × C-AMAT₂.
        let l = Level {
            hit_time: 0.0,
            hit_concurrency: 0.0,
            miss_ratio: 0.5,
            kappa: 1.0,
        };
        assert_eq!(recursive(&[l], 15.0), 7.5);
    }

    #[test]
    fn sequential_hits_and_one_miss_give_amat() {
        // Three hits of 1 and one miss (1 + 10), one after the other: AMAT = 14 / 4.
        let t = Trace::measure(&[hit(0.0, 1.0), hit(1.0, 1.0), hit(2.0, 1.0), miss(3.0, 1.0, 10.0)]).unwrap();
        assert_eq!(t.active_time, 14.0);
        assert_eq!(t.camat_eq1(), 3.5);
        assert_eq!(t.pure_misses, 1);
        assert!((t.camat().value() - 3.5).abs() < 1e-12);
        assert_eq!(t.kappa(), 1.0);
    }

    #[test]
    fn a_miss_hidden_under_hits_is_not_pure() {
        // The miss's phase [1, 3) is covered by a hit on another thread: no stall, no pure miss.
        let t = Trace::measure(&[miss(0.0, 1.0, 2.0), hit(1.0, 2.0)]).unwrap();
        assert_eq!(t.pure_misses, 0);
        assert_eq!(t.pure_miss_time, 0.0);
        assert_eq!(t.kappa(), 0.0);
        assert_eq!(t.camat_eq1(), 1.5);
        assert!((t.camat().value() - 1.5).abs() < 1e-12);
    }

    #[test]
    fn two_overlapping_misses_halve_the_miss_term() {
        // Two misses of 10 in parallel after hits of 1: C_M = 2, active time 11 over 2 accesses.
        let t = Trace::measure(&[miss(0.0, 1.0, 10.0), miss(0.0, 1.0, 10.0)]).unwrap();
        let c = t.camat();
        assert_eq!(c.pure_miss_concurrency, 2.0);
        assert_eq!(c.pure_avg_miss_penalty, 10.0);
        assert_eq!(c.hit_concurrency, 2.0);
        assert!((c.value() - 5.5).abs() < 1e-12);
        assert_eq!(t.miss_concurrency(), 2.0);
    }

    #[test]
    fn bad_accesses_are_refused() {
        assert!(Trace::measure(&[hit(0.0, 0.0)]).is_err());
        assert!(Trace::measure(&[miss(0.0, 1.0, -1.0)]).is_err());
        assert!(Trace::measure(&[hit(f64::NAN, 1.0)]).is_err());
    }

    #[test]
    fn counters_give_the_bricks_level_and_the_miss_term() {
        let c = FromCounters {
            page_accesses: 1000,
            faults: 100,
            fault_mean_s: 20e-6,
            miss_concurrency: 2.0,
            wall_s: 0.01,
        };
        assert_eq!(c.miss_ratio(), 0.1);
        assert!((c.bricks_camat_s() - 10e-6).abs() < 1e-18);
        assert!((c.miss_time_s() - 1e-3).abs() < 1e-15);
        assert!((c.local_miss_term_s() - 1e-6).abs() < 1e-18);
        assert!((c.stall_share() - 0.1).abs() < 1e-12);
    }

    #[test]
    fn stall_time_follows_eq7() {
        assert_eq!(stall_time(1000, 2.0, 0.25), 1500.0);
    }
}
