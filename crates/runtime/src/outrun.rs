//! Telling the user, once, that a program outruns its link: it faults faster than its bricks can
//! serve, most faults re-fetch pages evicted earlier, and it would run far faster with a larger
//! local buffer (a random-access program at 10% local can take tens of minutes where it takes a
//! second natively).
//!
//! Driven by the watchdog's ticks (no timer of its own; nothing runs while the program is idle).
//! Each tick compares the counters with the previous tick's: the share of the wall time the
//! program spent waiting rather than computing (from its user-mode CPU time), the share the fault
//! handlers spent serving faults (summed over them: how busy the path to the bricks
//! is), and the share of faults that fetched a page from a brick. When the program waits more
//! than half of the time, the handler is busy at least a quarter of it, and most faults are
//! re-fetches, for [`SUSTAIN_NS`], the runtime prints one notice on standard error, once per `rackmem run` (a
//! marker file in `RACKMEM_NOTICE_DIR` keeps forked and exec'd children quiet), with the fault
//! rate and a local buffer that would hold the working set (see [`working_set_pages`]).

use crate::{size, Inner, PAGE};
use std::sync::atomic::Ordering;

/// How long a program must outrun its link before it is told.
const SUSTAIN_NS: u64 = 5_000_000_000;
/// Share of the wall time the program must spend waiting (not computing).
const WAITING_SHARE: f64 = 0.5;
/// Share of the wall time the handler must spend serving faults: what the program waits for is
/// the link, not a sleep or other input. Lower than `WAITING_SHARE`: the program also waits
/// for the kernel's fault delivery and two context switches per fault, and for the scheduler on
/// a busy machine (two processes outrunning their links on two CPUs kept their handlers 35–50%
/// busy while their programs waited nearly all the time).
const HANDLER_BUSY: f64 = 0.25;
/// Share of faults that re-fetch a page above which a larger local buffer would help.
const REFETCH_SHARE: f64 = 0.5;

/// Threads of the runtime in the process (fault handler, write-back, watchdog): not the
/// program's.
const RUNTIME_THREADS: usize = 3;
/// Clock ticks per second in `/proc` (USER_HZ, 100 on every Linux architecture).
const USER_HZ: u64 = 100;

/// Counters at one tick.
#[derive(Clone, Copy)]
struct Sample {
    at_ns: u64,
    faults: u64,
    remote_faults: u64,
    busy_ns: u64,
    fetched_pages: u64,
    /// User-mode CPU time of the whole process, ns (10 ms resolution).
    user_ns: u64,
}

impl Sample {
    fn of(inner: &Inner) -> Sample {
        let s = &inner.stats;
        Sample {
            at_ns: inner.now_ns(),
            faults: s.faults.load(Ordering::Relaxed),
            remote_faults: s.faults_remote.load(Ordering::Relaxed),
            busy_ns: s.fault_latency.sum_ns(),
            fetched_pages: (s.bytes_fetched.load(Ordering::Relaxed) + s.bytes_prefetched.load(Ordering::Relaxed))
                / PAGE,
            user_ns: user_time_ns(),
        }
    }
}

/// User-mode CPU time of this process (field 14 of `/proc/self/stat`), ns; 0 if unreadable.
fn user_time_ns() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return 0;
    };
    let ticks: u64 = rest
        .split_whitespace()
        .nth(14 - 3)
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    ticks * (1_000_000_000 / USER_HZ)
}

/// The share of the wall time the program spent waiting rather than computing: 1 minus its
/// user-mode CPU time over what its threads could have had (one CPU per thread, at most the CPUs
/// it may use). An upper bound of the time waiting on faults (the program may wait on other
/// things: the caller also asks that the handler be busy), and a lower one of the time not
/// computing (the runtime's own user time counts as the program's).
fn waiting_share(user_ns: u64, wall_ns: u64) -> f64 {
    let threads = std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count());
    let lanes = threads
        .saturating_sub(RUNTIME_THREADS)
        .clamp(1, crate::sys::allowed_cpus().max(1));
    (1.0 - user_ns as f64 / (wall_ns as f64 * lanes as f64)).max(0.0)
}

/// The watchdog's view of whether the program outruns its link.
#[derive(Default)]
pub(crate) struct Monitor {
    last: Option<Sample>,
    /// The tick the current stretch of outrunning started at.
    streak: Option<Sample>,
    told: bool,
}

impl Monitor {
    /// One watchdog tick.
    pub fn tick(&mut self, inner: &Inner) {
        if self.told {
            return;
        }
        let now = Sample::of(inner);
        let Some(last) = self.last.replace(now) else {
            return;
        };
        let wall = now.at_ns.saturating_sub(last.at_ns).max(1);
        let faults = now.faults - last.faults;
        let busy = (now.busy_ns - last.busy_ns) as f64 / wall as f64;
        let refetch = (now.remote_faults - last.remote_faults) as f64 / faults.max(1) as f64;
        let outrun = faults > 0
            && busy > HANDLER_BUSY
            && refetch > REFETCH_SHARE
            && waiting_share(now.user_ns.saturating_sub(last.user_ns), wall) > WAITING_SHARE;
        if !outrun {
            if self.streak.take().is_some() || faults > 0 {
                // The distinct-page sketch describes the current stretch only.
                inner.stats.refetched.take();
            }
            return;
        }
        let start = *self.streak.get_or_insert(last);
        if now.at_ns - start.at_ns < SUSTAIN_NS {
            return;
        }
        self.told = true;
        if !first_in_this_run(inner) {
            return;
        }
        let secs = (now.at_ns - start.at_ns) as f64 / 1e9;
        let distinct = inner.stats.refetched.take();
        let fetched = now.fetched_pages - start.fetched_pages;
        let rate = (now.remote_faults - start.remote_faults) as f64 / secs;
        let waiting = waiting_share(now.user_ns - start.user_ns, now.at_ns - start.at_ns);
        let refetch = (now.remote_faults - start.remote_faults) as f64 / (now.faults - start.faults).max(1) as f64;
        let footprint = inner.stats.window_bytes_allocated.load(Ordering::Relaxed).max(PAGE);
        let budget = inner.stats.budget_pages.load(Ordering::Relaxed) * PAGE;
        let (ws_pages, at_least) = working_set_pages(fetched, distinct);
        let ws = if at_least {
            budget + distinct * PAGE
        } else {
            ws_pages * PAGE
        }
        .min(footprint);
        let pct = suggest_percent(ws, footprint);
        eprintln!(
            "rackmem: notice: this program outruns its link: for {secs:.0} s it has spent {:.0}% of its time waiting \
             on page faults ({} faults/s, {:.0}% of them re-fetching pages evicted earlier). Its working set is {}{} \
             of its {} in remote memory (estimated from the {} distinct pages re-fetched in those {secs:.0} s), \
             while the local buffer holds {}. It would run much faster with --local {pct}% (or --local {}), \
             if this host has the memory.",
            (waiting * 100.0).min(100.0),
            rate.round() as u64,
            refetch * 100.0,
            if at_least { "at least " } else { "about " },
            size::format_size(ws),
            size::format_size(footprint),
            distinct,
            size::format_size(budget),
            size::format_size(ws.next_multiple_of(1 << 20)),
        );
    }
}

/// True the first time it is called in this `rackmem run` (the marker file in
/// `RACKMEM_NOTICE_DIR` did not exist yet), or in this process without one.
fn first_in_this_run(inner: &Inner) -> bool {
    let Some(dir) = &inner.cfg.notice_dir else {
        return true;
    };
    let path = std::path::Path::new(dir).join("outrun");
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        // The directory is gone (rackmem run ended; a daemon goes on): say it anyway.
        Err(_) => true,
    }
}

/// The working set, in pages, from `fetched` page fetches that brought `distinct` distinct
/// pages in one stretch of time; and whether that is only a lower bound.
///
/// Method: treat the fetches as draws from a population of N pages (the pages the program keeps
/// returning to that the local buffer cannot hold: for a random-access program, its whole
/// working set, since FIFO eviction sends every page out in turn). Drawing `fetched` times
/// uniformly from N pages yields N·(1 − e^(−fetched/N)) distinct pages on average (the
/// occupancy, or coupon-collector, expectation); solving that for N given `distinct` estimates
/// the population, including pages not drawn yet. When nearly every fetch brought a new page,
/// there were too few repeats to see the population's size: the estimate is then `distinct`
/// as a lower bound (the caller adds the local buffer).
pub(crate) fn working_set_pages(fetched: u64, distinct: u64) -> (u64, bool) {
    let (r, d) = (fetched as f64, distinct as f64);
    if distinct == 0 || r <= d * 1.05 {
        return (distinct, true);
    }
    let expected = |n: f64| n * (1.0 - (-r / n).exp());
    // expected(n) grows with n, from about d·… at n = d up to r as n grows without bound.
    let (mut lo, mut hi) = (d, d * 2.0);
    while expected(hi) < d && hi < d * 1e6 {
        lo = hi;
        hi *= 2.0;
    }
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if expected(mid) < d {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (hi.round() as u64, false)
}

/// The local buffer, in percent of the footprint, that holds `ws` bytes with a little room, in
/// steps of 5%, at most 100%.
fn suggest_percent(ws: u64, footprint: u64) -> u64 {
    let pct = (ws as f64 * 1.1 / footprint as f64 * 100.0).ceil() as u64;
    pct.div_ceil(5).saturating_mul(5).clamp(5, 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_population_is_found_from_repeats() {
        // Draws from N pages: the expected distinct count gives N back.
        for n in [1_000u64, 50_000, 400_000] {
            for draws in [n / 2, n, 5 * n] {
                let d = (n as f64 * (1.0 - (-(draws as f64) / n as f64).exp())).round() as u64;
                let (est, lower) = working_set_pages(draws, d);
                assert!(!lower, "{n} {draws}");
                assert!(
                    (est as f64 / n as f64 - 1.0).abs() < 0.02,
                    "{n} pages, {draws} draws: {est}"
                );
            }
        }
        // No repeats: only a lower bound.
        assert_eq!(working_set_pages(1000, 1000), (1000, true));
        assert_eq!(working_set_pages(0, 0), (0, true));
    }

    #[test]
    fn suggestions_are_round_and_bounded() {
        assert_eq!(suggest_percent(40, 100), 45);
        assert_eq!(suggest_percent(100, 100), 100);
        assert_eq!(suggest_percent(1, 1000), 5);
    }
}
