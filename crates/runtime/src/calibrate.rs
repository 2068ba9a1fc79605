//! The install path's threshold measured on this machine (issue 24: one calibrated transfer
//! engine under the fault path as under put/get, not a constant from one benchmark).
//!
//! A fetched run reaches the window one of two ways ([`crate::recycle`]): its bytes are copied
//! into fresh pages (`UFFDIO_COPY`, the kernel allocates a page per 4 KiB, and in the steady
//! state a page is freed for each one allocated), or received into the pages of spent staging
//! slots and moved in (`UFFDIO_MOVE`, no allocation, no free). Which is cheaper for a run of
//! `n` pages depends on the machine: the price of a fresh page (seven times a warm one on guests
//! that report freed memory to their host) against the fixed cost of a move. The pager's
//! default switch, 4 pages, came from one GUPS run on one machine.
//!
//! [`recycle_crossover`] measures both on a scratch userfaultfd area the way the fault path
//! does them, for runs of 1 to [`MAX_PROBE_PAGES`] pages in interleaved rounds, and returns the
//! shortest run from which the move is no slower at that length and at every longer one probed.
//! `rackmem run` calls it once per run (a few milliseconds) and passes the result to every
//! process of the run in `RACKMEM_RECYCLE_MIN_PAGES`; a value given there pins it.

use crate::RuntimeError;
use rackmem_sys::{Mapping, PAGE_SIZE};
use rackmem_uffd::{CopyMode, Features, MoveMode, OpenOptions, RegisterMode, Uffd};
use std::time::{Duration, Instant};

/// The pager's threshold when nothing was measured or pinned.
pub use rackmem_pager::fault::RECYCLE_MIN_PAGES as DEFAULT_MIN_PAGES;

/// Run lengths probed, in 4 KiB pages.
pub const PROBE_PAGES: [u64; 6] = [1, 2, 4, 8, 16, 32];
/// The longest run probed; when the move wins at no probed length the threshold is twice this.
pub const MAX_PROBE_PAGES: u64 = 32;
/// Interleaved rounds per length (the median of each counts).
pub const ROUNDS: usize = 15;
/// The stand-in for a brick's memory that fetches read from, each at a new place. Larger than
/// the first two levels of cache; not larger than them all, which would cost more to set up
/// (tens of milliseconds) than the whole measurement.
const BRICK_BYTES: usize = 2 << 20;

/// What [`recycle_crossover`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct RecycleCalibration {
    /// Per probed length: pages, median time to copy the run into fresh pages and free as many,
    /// median time to move it in from warm pages.
    pub probes: Vec<(u64, Duration, Duration)>,
    /// The shortest run moved in rather than copied.
    pub min_pages: u64,
    /// How long the measurement took.
    pub took: Duration,
}

impl RecycleCalibration {
    /// The threshold from the probes: the shortest length from which the move is no slower at
    /// that length and every longer one; twice the longest probe when the move never wins.
    pub fn threshold(probes: &[(u64, Duration, Duration)]) -> u64 {
        let mut min = 2 * MAX_PROBE_PAGES;
        for &(pages, copy, moved) in probes.iter().rev() {
            if moved > copy {
                break;
            }
            min = pages;
        }
        min
    }

    /// One line for `RACKMEM_VERBOSE`: each length's copy and move times.
    pub fn describe(&self) -> String {
        let per: Vec<String> = self
            .probes
            .iter()
            .map(|(p, c, m)| format!("{p}: copy {:.1} µs, move {:.1} µs", us(*c), us(*m)))
            .collect();
        let runs = match self.min_pages {
            1 => "every fetched run moves in recycled pages, none is copied".to_string(),
            n => format!("runs of {n} pages and more move in recycled pages, shorter ones are copied"),
        };
        format!(
            "{runs} ({}; measured in {:.1} ms)",
            per.join(", "),
            self.took.as_secs_f64() * 1e3
        )
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Measures the copy and move install paths on a scratch area (see the module's docs). Needs
/// a userfaultfd with `UFFDIO_MOVE` (Linux 6.8), as the runtime itself does.
pub fn recycle_crossover() -> Result<RecycleCalibration, RuntimeError> {
    let start = Instant::now();
    let uffd = Uffd::open(&OpenOptions {
        features: Features::MOVE,
        nonblocking: true,
    })?;
    let bytes = MAX_PROBE_PAGES as usize * PAGE_SIZE;
    // The window's stand-in and the staging slots' stand-in, both registered: MOVE's
    // destination must be, and pages go both ways. Nothing may fault in them (no handler
    // runs): only the ioctls below touch their pages.
    // Twice the longest run: a round's copies lie side by side (1 + 2 + … + 32 pages).
    let window = Mapping::reserve(2 * bytes, PAGE_SIZE)?;
    let slots = Mapping::reserve(bytes, PAGE_SIZE)?;
    let mode = RegisterMode {
        missing: true,
        wp: false,
        minor: false,
    };
    uffd.register(window.addr(), window.len(), mode)?;
    uffd.register(slots.addr(), bytes, mode)?;
    // What a fetch receives from: a brick's memory, read at a new place each time as a
    // fault's page would be.
    let brick: Vec<u8> = (0..BRICK_BYTES).map(|i| (i % 251) as u8).collect();
    // The slots start warm, as spent slots are: pages an eviction moved out and a write-back
    // sent.
    uffd.copy(slots.addr(), &brick[..bytes], CopyMode::default())?;
    // A program's other threads keep its address space live on other CPUs, so a move out of
    // its page tables there flushes their TLBs (an interprocessor interrupt, dear on a virtual
    // machine) where a copy into a missing entry flushes nothing. A thread of this process
    // running on another CPU meanwhile makes the measurement pay what the program pays.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let peer = {
        let done = done.clone();
        std::thread::Builder::new()
            .name("rackmem-calibrate".into())
            .spawn(move || {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
            .ok()
    };
    let measured = measure(&uffd, &window, &slots, &brick, bytes);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(p) = peer {
        let _ = p.join();
    }
    let probes = measured?;
    Ok(RecycleCalibration {
        min_pages: RecycleCalibration::threshold(&probes),
        probes,
        took: start.elapsed(),
    })
}

/// The interleaved rounds of [`recycle_crossover`]: per probed length, the median copy and move.
///
/// Each round copies a run of every length into its own part of the window, then frees them
/// all with one `MADV_DONTNEED` (as spent slots are freed past their cap, many at a time: one
/// TLB flush for the lot), whose time is shared among the pages; then moves a run of every
/// length in from the slots and back. Which half goes first alternates by round.
fn measure(
    uffd: &Uffd,
    window: &Mapping,
    slots: &Mapping,
    brick: &[u8],
    bytes: usize,
) -> Result<Vec<(u64, Duration, Duration)>, RuntimeError> {
    let mut at = 0usize;
    let mut from = |len: usize| {
        at = (at + bytes) % (BRICK_BYTES - bytes);
        &brick[at..at + len]
    };
    // The handler's receive buffer (the copy path's), reused by every fetch.
    let mut buffer = vec![0u8; bytes];
    let total_pages: u64 = PROBE_PAGES.iter().sum();
    let mut times: Vec<(Vec<Duration>, Vec<Duration>)> = vec![(Vec::new(), Vec::new()); PROBE_PAGES.len()];
    for round in 0..ROUNDS {
        for copy_half in [round % 2 == 0, round % 2 != 0] {
            if copy_half {
                let mut copies = Vec::with_capacity(PROBE_PAGES.len());
                let mut offset = 0usize;
                for &pages in &PROBE_PAGES {
                    let len = pages as usize * PAGE_SIZE;
                    let t = Instant::now();
                    buffer[..len].copy_from_slice(from(len));
                    uffd.copy(window.addr() + offset, &buffer[..len], CopyMode::default())?;
                    copies.push(t.elapsed());
                    offset += len;
                }
                let t = Instant::now();
                // SAFETY: the scratch window is this measurement's own mapping; no reference
                // points into it (only these ioctls and this madvise touch it).
                unsafe { rackmem_sys::madvise_dontneed(window.addr(), offset)? };
                let free_per_page = t.elapsed() / total_pages as u32;
                for (i, (&pages, c)) in PROBE_PAGES.iter().zip(copies).enumerate() {
                    times[i].0.push(c + free_per_page * pages as u32);
                }
            } else {
                for (i, &pages) in PROBE_PAGES.iter().enumerate() {
                    let len = pages as usize * PAGE_SIZE;
                    times[i].1.push(move_in(uffd, window, slots, from(len))?);
                }
            }
        }
    }
    Ok(PROBE_PAGES
        .iter()
        .zip(times.iter_mut())
        .map(|(&p, (c, m))| (p, median(c), median(m)))
        .collect())
}

/// The move path for one run: the fetch received into spent slots' pages, `UFFDIO_MOVE` of
/// them into the window, timed; then moved back to the slots (untimed) so the next round finds
/// them there.
fn move_in(uffd: &Uffd, window: &Mapping, slots: &Mapping, from: &[u8]) -> Result<Duration, RuntimeError> {
    let len = from.len();
    let t = Instant::now();
    // The slots' pages are present (moved back after each round), so this raises no fault.
    slots.write(0, from);
    // SAFETY: both ranges are the scratch mappings made for this measurement; no Rust reference
    // points into either (they are touched only by these ioctls).
    unsafe { uffd.move_pages(window.addr(), slots.addr(), len, MoveMode::default())? };
    let took = t.elapsed();
    // SAFETY: as above, the other way.
    unsafe { uffd.move_pages(slots.addr(), window.addr(), len, MoveMode::default())? };
    Ok(took)
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(v: u64) -> Duration {
        Duration::from_micros(v)
    }

    #[test]
    fn the_threshold_is_where_the_move_stays_no_slower() {
        let p = |m: [u64; 6]| -> Vec<(u64, Duration, Duration)> {
            PROBE_PAGES
                .iter()
                .zip(m)
                .map(|(&n, mv)| (n, us(10 * n), us(mv)))
                .collect()
        };
        // Moves win from 4 pages on.
        assert_eq!(RecycleCalibration::threshold(&p([20, 30, 30, 60, 100, 200])), 4);
        // A win at 1 page that does not last counts for nothing.
        assert_eq!(RecycleCalibration::threshold(&p([5, 30, 30, 60, 100, 200])), 4);
        // Moves win everywhere.
        assert_eq!(RecycleCalibration::threshold(&p([1, 1, 1, 1, 1, 1])), 1);
        // Moves never win, or lose at the longest probe.
        assert_eq!(
            RecycleCalibration::threshold(&p([20, 30, 50, 90, 170, 330])),
            2 * MAX_PROBE_PAGES
        );
        assert_eq!(
            RecycleCalibration::threshold(&p([1, 1, 1, 1, 1, 400])),
            2 * MAX_PROBE_PAGES
        );
    }

    #[test]
    fn the_machine_gives_a_threshold_within_the_probes() {
        // Needs userfaultfd with UFFDIO_MOVE, as the runtime does: fails with the reason
        // otherwise (never skipped).
        let c = recycle_crossover().expect("measuring copy against move needs userfaultfd with UFFDIO_MOVE (Linux 6.8, root or vm.unprivileged_userfaultfd=1)");
        assert_eq!(c.probes.len(), PROBE_PAGES.len());
        assert!(
            c.probes
                .iter()
                .all(|(_, copy, moved)| !copy.is_zero() && !moved.is_zero()),
            "{c:?}"
        );
        assert!(
            c.min_pages == 2 * MAX_PROBE_PAGES || PROBE_PAGES.contains(&c.min_pages),
            "{c:?}"
        );
        assert_eq!(c.min_pages, RecycleCalibration::threshold(&c.probes));
    }
}
