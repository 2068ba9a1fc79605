//! Telemetry of one process's window: counters the fault path bumps with relaxed atomics, and a
//! log-linear latency histogram (no allocation, lock-free) for fault latency percentiles.
//!
//! Read by `rackmem run --stats` (through the JSON line the runtime writes at exit) and by the
//! C API's `rackmem_stats`.

use rackmem_model::{LevelClock, LevelCounts};
use rackmem_transport::BrickAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Sub-buckets per power of two: 8 gives ~9% resolution, enough for p50/p99 of microseconds.
const SUB: usize = 8;
/// Powers of two covered: 1 ns .. 2^40 ns (~18 minutes).
const POW: usize = 40;

/// A fixed log-linear histogram of nanosecond values.
pub struct Histogram {
    buckets: [AtomicU64; SUB * POW],
    count: AtomicU64,
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
        }
    }
}

fn bucket_of(ns: u64) -> usize {
    let v = ns.max(1);
    let p = 63 - v.leading_zeros() as usize;
    let frac = if p >= 3 {
        ((v >> (p - 3)) & 7) as usize
    } else {
        ((v << (3 - p)) & 7) as usize
    };
    (p * SUB + frac).min(SUB * POW - 1)
}

fn bucket_upper(b: usize) -> u64 {
    let p = b / SUB;
    let frac = (b % SUB) as u64;
    let base = 1u64 << p;
    base + ((base * (frac + 1)) >> 3)
}

impl Histogram {
    /// Records one value.
    pub fn record(&self, ns: u64) {
        self.buckets[bucket_of(ns)].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
        self.max_ns.fetch_max(ns, Relaxed);
    }

    /// Number of values recorded.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    /// The value below which `q` (0..=1) of the recorded values fall (bucket upper bound).
    pub fn quantile_ns(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let target = ((n as f64 * q).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Relaxed);
            if seen >= target {
                return bucket_upper(i).min(self.max_ns.load(Relaxed));
            }
        }
        self.max_ns.load(Relaxed)
    }

    /// Values recorded in buckets whose upper bound is at most `bound_ns` (a value within a
    /// bucket of the bound may be left out: the count is a lower bound, within one bucket's
    /// width, an eighth of a power of two).
    pub fn count_at_most(&self, bound_ns: u64) -> u64 {
        self.buckets
            .iter()
            .enumerate()
            .take_while(|(i, _)| bucket_upper(*i) <= bound_ns)
            .map(|(_, b)| b.load(Relaxed))
            .sum::<u64>()
            .min(self.count())
    }

    /// Sum of the values recorded, in nanoseconds.
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns.load(Relaxed)
    }

    /// Mean in nanoseconds.
    pub fn mean_ns(&self) -> u64 {
        self.sum_ns.load(Relaxed) / self.count().max(1)
    }

    /// Largest value recorded.
    pub fn max_ns(&self) -> u64 {
        self.max_ns.load(Relaxed)
    }
}

/// Registers of [`DistinctPages`]: 2^11, for a relative error of about 1.04/√2048 ≈ 2.3%.
const HLL_BITS: u32 = 11;

/// How many distinct pages were recorded since the last [`DistinctPages::take`]: a HyperLogLog
/// sketch (Flajolet et al., 2007) of 2 KiB, lock-free, so the fault path can feed it every page
/// it fetches, and the watchdog can read it without stopping the handler.
pub struct DistinctPages {
    registers: [std::sync::atomic::AtomicU8; 1 << HLL_BITS],
}

impl Default for DistinctPages {
    fn default() -> Self {
        Self {
            registers: std::array::from_fn(|_| std::sync::atomic::AtomicU8::new(0)),
        }
    }
}

impl DistinctPages {
    /// Records `page`.
    pub fn insert(&self, page: u64) {
        let h = xxhash_rust::xxh3::xxh3_64(&page.to_le_bytes());
        let index = (h & ((1 << HLL_BITS) - 1)) as usize;
        let rank = ((h >> HLL_BITS).trailing_zeros() + 1).min(64 - HLL_BITS + 1) as u8;
        self.registers[index].fetch_max(rank, Relaxed);
    }

    /// The estimated number of distinct pages recorded, and a fresh start.
    pub fn take(&self) -> u64 {
        let m = (1u64 << HLL_BITS) as f64;
        let (mut sum, mut zeros) = (0.0f64, 0u64);
        for r in &self.registers {
            let v = r.swap(0, Relaxed);
            sum += 2f64.powi(-i32::from(v));
            zeros += u64::from(v == 0);
        }
        let alpha = 0.7213 / (1.0 + 1.079 / m);
        let raw = alpha * m * m / sum;
        // Few values: linear counting over the empty registers is the better estimate.
        let est = if raw <= 2.5 * m && zeros > 0 {
            m * (m / zeros as f64).ln()
        } else {
            raw
        };
        est.round() as u64
    }
}

/// Where the handler's time goes for one fault, step by step (the way seed 001 splits a
/// migration into Setup / Allocate / Transfer / Finalize).
#[derive(Default)]
pub struct Breakdown {
    /// Choosing victims, including waiting for free staging slots.
    pub make_room: Histogram,
    /// UFFDIO_MOVE of the victims out of the window.
    pub stage: Histogram,
    /// Reading the run from its bricks (the network round trip).
    pub fetch: Histogram,
    /// Checksums, UFFDIO_COPY and the wake-up of the faulting thread.
    pub install: Histogram,
    /// The handler's whole service time of a remote fault.
    pub total: Histogram,
}

/// Mean and median of one step, in nanoseconds.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct StepSnapshot {
    /// Median.
    pub p50_ns: u64,
    /// Mean.
    pub mean_ns: u64,
}

impl StepSnapshot {
    fn of(h: &Histogram) -> StepSnapshot {
        StepSnapshot {
            p50_ns: h.quantile_ns(0.5),
            mean_ns: h.mean_ns(),
        }
    }
}

/// Counters of one process's runtime. All relaxed: they are statistics, not synchronisation.
#[derive(Default)]
pub struct Stats {
    /// Page-fault messages handled (missing faults in the window).
    pub faults: AtomicU64,
    /// Faults that found the page already installed (another thread faulted it first).
    pub faults_duplicate: AtomicU64,
    /// Faults served by fetching from a brick.
    pub faults_remote: AtomicU64,
    /// Faults served with a zero page (never written to a brick).
    pub faults_zero: AtomicU64,
    /// Faults served by filling a same-filled page with its word (no brick asked).
    pub faults_filled: AtomicU64,
    /// Bytes read from bricks for faulting pages.
    pub bytes_fetched: AtomicU64,
    /// Bytes read from bricks ahead of use (sequential prefetch).
    pub bytes_prefetched: AtomicU64,
    /// Bytes written back to bricks (dirty pages only).
    pub bytes_written_back: AtomicU64,
    /// Pages evicted from the local buffer.
    pub evictions: AtomicU64,
    /// Evicted pages that were clean and needed no write-back.
    pub evictions_clean: AtomicU64,
    /// Evicted pages whose contents were one word repeated: kept as that word, neither compared
    /// with the brick's copy nor written back; their next fetch is a fill.
    pub evictions_same_filled: AtomicU64,
    /// Evicted pages that were not read-write (read-only, `PROT_NONE`, executable): moved out
    /// through a staging slot given their protection.
    pub evictions_protected: AtomicU64,
    /// Evictions that found their page still shared copy-on-write with a lazily forked child
    /// or parent, and made it private first (`UFFDIO_MOVE` moves only pages of one process).
    pub evictions_shared: AtomicU64,
    /// Bytes resident at the start: the pages a lazily forked child kept from its parent
    /// (copy-on-write). They may pass the child's own share of the budget until it evicts them.
    pub inherited_resident_bytes: AtomicU64,
    /// A lazily forked child: pages it fetched from what it inherited remote and reported to
    /// its parent, which takes them back so that its next children inherit them (`fork_hot.rs`).
    pub fork_pages_reported: AtomicU64,
    /// A parent: pages its children reported that it faulted back in (`fork_hot.rs`).
    pub fork_pages_taken_back: AtomicU64,
    /// Pages evicted with no fault to serve: the run's other processes grew while this one was
    /// idle over its share of the run's budget, and it gave the room back (`run_budget.rs`).
    pub evictions_given_back: AtomicU64,
    /// Fetched pages received into spent staging slots and moved into the window (no page
    /// allocated or copied by the kernel; see the runtime's `recycle` module).
    pub pages_recycled: AtomicU64,
    /// Pages that arrived by read-ahead: sent at the previous fault of a sequential stream, in
    /// flight while the program worked.
    pub pages_read_ahead: AtomicU64,
    /// Read-aheads whose request could not be sent (their brick's link failed): dropped, since
    /// only a fault on one of those pages means the program needs them.
    pub reads_ahead_unsent: AtomicU64,
    /// Early reads sent: the brick read of a fault queued behind the one its handler served,
    /// sent before that handler waited on its link (pipelining; `RACKMEM_PIPELINE`).
    pub reads_early: AtomicU64,
    /// Early reads their fault used (the others went stale: released, claimed by another run).
    pub reads_early_used: AtomicU64,
    /// Resident pages now.
    pub resident_pages: AtomicU64,
    /// Largest number of resident pages seen.
    pub peak_resident_pages: AtomicU64,
    /// Largest local-buffer budget in force so far, in pages (a percentage follows the peak
    /// footprint).
    pub budget_pages: AtomicU64,
    /// Largest number of committed window pages so far (allocated, not `PROT_NONE`): the peak
    /// footprint a `--local` percentage is of. Never decreases, so freeing memory never shrinks
    /// the local buffer, as freeing never lowers a memory cgroup's limit.
    pub peak_committed_pages: AtomicU64,
    /// Largest anonymous resident memory of the process (`RssAnon` in `/proc/self/status`)
    /// sampled so far, in bytes: the local memory the program really holds, window pages,
    /// staging slots, the C library's heap and the runtime's own memory together. Sampled by the
    /// watchdog four times a second and at each snapshot.
    pub peak_rss_anon_bytes: AtomicU64,
    /// Window bytes allocated now.
    pub window_bytes_allocated: AtomicU64,
    /// Largest window footprint seen.
    pub peak_window_bytes: AtomicU64,
    /// Allocations placed in the window.
    pub window_allocations: AtomicU64,
    /// Bytes fetched with a memory copy from a segment mapped into the process (a brick on this
    /// host, `RACKMEM_SHARED_MEMORY`) rather than over a link.
    pub bytes_fetched_shared: AtomicU64,
    /// Bytes written back with a memory copy into a mapped segment (part of
    /// `bytes_written_back`; the rest went over links: pages the brick held no memory for yet).
    pub bytes_written_shared: AtomicU64,
    /// REMOVE/UNMAP/REMAP events handled.
    pub events: AtomicU64,
    /// Faults the watchdog saw waiting longer than its limit.
    pub watchdog_reports: AtomicU64,
    /// Times the fault handler moved (`HandlerMode::Auto`): onto a faulting thread's CPU, or
    /// back to floating.
    pub handler_moves: AtomicU64,
    /// Faults held by load control (`crate::load`): another thread was favoured.
    pub load_holds: AtomicU64,
    /// Times load control's favour moved to another thread at the end of a slice.
    pub load_rotations: AtomicU64,
    /// Times load control released its holds early: the favoured thread was waiting.
    pub load_stalls: AtomicU64,
    /// Longest a fault was held by load control, ns.
    pub load_hold_max_ns: AtomicU64,
    /// Pages `UFFDIO_MOVE` moved but reported as not moved (pages the kernel had swapped out),
    /// found in the page table and counted as moved (see "Swapped pages" in
    /// docs/architecture.md).
    pub moves_recounted: AtomicU64,
    /// Migrations done (`rackmem_migrate`), and what they carried.
    pub migrations: AtomicU64,
    /// Bytes migrations carried (read from the source and written to the target once each).
    pub migration_bytes: AtomicU64,
    /// Time migrations spent in seed 001's Setup step (Table III), ns.
    pub migration_setup_ns: AtomicU64,
    /// Time in the Allocate step, ns.
    pub migration_allocate_ns: AtomicU64,
    /// Time in the Transfer step, ns.
    pub migration_transfer_ns: AtomicU64,
    /// Time in the Finalize step, ns.
    pub migration_finalize_ns: AtomicU64,
    /// Pieces of migrations between bricks the target brick pulled from the source (direct).
    pub migration_pieces_direct: AtomicU64,
    /// Pieces of migrations between bricks bounced through this process.
    pub migration_pieces_bounced: AtomicU64,
    /// Of the bounced pieces, those bounced because the target could not reach the source.
    pub migration_direct_fallbacks: AtomicU64,
    /// Pages of migration segments a move reused (a range had moved out of them) instead of
    /// taking fresh ones.
    pub migration_pages_reused: AtomicU64,
    /// Handler-side fault service time (message read to page installed).
    pub fault_latency: Histogram,
    /// Pages fetched from bricks (re-fetches of pages evicted earlier) since the watchdog last
    /// looked: feeds the working-set estimate of the "outrunning its link" notice.
    pub refetched: DistinctPages,
    /// The same time split into steps.
    pub breakdown: Breakdown,
    /// Faults in flight (miss concurrency): the local buffer's level of C-AMAT.
    pub in_flight: InFlight,
    /// The bricks' level of C-AMAT, brick by brick.
    pub bricks: BrickLevels,
}

/// Faults in flight at once: one is in flight from when a handler reads its message to when its
/// page is installed and its thread woken. Kept as a time integral (the miss concurrency of
/// seed 002's C-AMAT: the mean number of faults outstanding over the time at least one is), with
/// the pure misses (faults no other fault overlapped) of the local buffer's level.
pub struct InFlight {
    clock: std::sync::Mutex<LevelClock>,
}

impl Default for InFlight {
    fn default() -> Self {
        Self {
            clock: std::sync::Mutex::new(LevelClock::new(1)),
        }
    }
}

impl InFlight {
    fn clock(&self) -> std::sync::MutexGuard<'_, LevelClock> {
        self.clock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A handler read a fault at `at_ns` (on the runtime's clock).
    pub fn begin(&self, at_ns: u64) {
        self.clock().begin(0, at_ns);
    }

    /// A fault read earlier is served (installed and woken) at `at_ns`.
    pub fn end(&self, at_ns: u64) {
        self.clock().end(0, at_ns);
    }

    /// Time-weighted mean of faults in flight over the time at least one was (0 if none ever
    /// was), and the most at once.
    pub fn mean_and_max(&self) -> (f64, u32) {
        let c = self.counts();
        (c.miss_concurrency(), c.max_outstanding)
    }

    /// The local buffer's level: every fault, its pure misses and concurrency.
    pub fn counts(&self) -> LevelCounts {
        self.clock().counts(0)
    }
}

/// Bricks told apart in [`BrickLevels`]; faults served by more bricks than this are counted
/// together under the last one's entry, named `other bricks`.
pub const MAX_BRICK_LEVELS: usize = rackmem_proto::MAX_REPORTED_BRICKS;

/// The bricks' level of C-AMAT, brick by brick: each fault whose page a brick served is one
/// access to that brick, from the start of its read to the page's data being here (a read on
/// the brick's link, a read-ahead's wait, or, for a segment mapped into the process, the copy
/// out of it at install). Pure misses are judged across all bricks: a read no read of any
/// brick overlapped.
pub struct BrickLevels {
    state: std::sync::Mutex<(Vec<BrickAddr>, LevelClock)>,
}

impl Default for BrickLevels {
    fn default() -> Self {
        Self {
            state: std::sync::Mutex::new((Vec::new(), LevelClock::new(MAX_BRICK_LEVELS))),
        }
    }
}

/// One brick's access in progress, from [`BrickLevels::begin`] to [`BrickLevels::end`].
#[derive(Debug)]
#[must_use = "an access begun is ended"]
pub struct BrickAccess(usize);

impl BrickLevels {
    fn state(&self) -> std::sync::MutexGuard<'_, (Vec<BrickAddr>, LevelClock)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A read of the brick at `addr` for a fault began at `at_ns`.
    pub fn begin(&self, addr: &BrickAddr, at_ns: u64) -> BrickAccess {
        let mut g = self.state();
        let (bricks, clock) = &mut *g;
        let slot = match bricks.iter().position(|b| b == addr) {
            Some(i) => i,
            None if bricks.len() < MAX_BRICK_LEVELS => {
                bricks.push(addr.clone());
                bricks.len() - 1
            }
            None => MAX_BRICK_LEVELS - 1,
        };
        clock.begin(slot, at_ns);
        BrickAccess(slot)
    }

    /// The read `access` ended at `at_ns`.
    pub fn end(&self, access: BrickAccess, at_ns: u64) {
        self.state().1.end(access.0, at_ns);
    }

    /// Every brick that served a fault, in the order first seen, with its figures.
    pub fn snapshot(&self) -> Vec<BrickLevel> {
        let g = self.state();
        let (bricks, clock) = &*g;
        bricks
            .iter()
            .enumerate()
            .map(|(i, b)| BrickLevel {
                brick: if i == MAX_BRICK_LEVELS - 1 && bricks.len() == MAX_BRICK_LEVELS {
                    format!("{b} and other bricks")
                } else {
                    b.to_string()
                },
                counts: clock.counts(i),
            })
            .collect()
    }
}

/// One brick's level of C-AMAT in a [`StatsSnapshot`].
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BrickLevel {
    /// The brick's address.
    pub brick: String,
    /// What it served (see [`BrickLevels`]).
    #[serde(flatten)]
    pub counts: LevelCounts,
}

/// A plain snapshot of [`Stats`], as written to the stats file and returned by the C API.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct StatsSnapshot {
    /// Process id.
    pub pid: u32,
    /// Command line of the process (argv[0]).
    pub program: String,
    /// See [`Stats::faults`].
    pub faults: u64,
    /// See [`Stats::faults_duplicate`].
    pub faults_duplicate: u64,
    /// See [`Stats::faults_remote`].
    pub faults_remote: u64,
    /// See [`Stats::faults_zero`].
    pub faults_zero: u64,
    /// See [`Stats::faults_filled`].
    #[serde(default)]
    pub faults_filled: u64,
    /// See [`Stats::bytes_fetched`].
    pub bytes_fetched: u64,
    /// See [`Stats::bytes_prefetched`].
    pub bytes_prefetched: u64,
    /// See [`Stats::bytes_written_back`].
    pub bytes_written_back: u64,
    /// See [`Stats::evictions`].
    pub evictions: u64,
    /// See [`Stats::evictions_clean`].
    pub evictions_clean: u64,
    /// See [`Stats::evictions_same_filled`].
    #[serde(default)]
    pub evictions_same_filled: u64,
    /// See [`Stats::evictions_protected`].
    #[serde(default)]
    pub evictions_protected: u64,
    /// See [`Stats::evictions_shared`].
    #[serde(default)]
    pub evictions_shared: u64,
    /// See [`Stats::inherited_resident_bytes`].
    #[serde(default)]
    pub inherited_resident_bytes: u64,
    /// See [`Stats::fork_pages_reported`].
    #[serde(default)]
    pub fork_pages_reported: u64,
    /// See [`Stats::fork_pages_taken_back`].
    #[serde(default)]
    pub fork_pages_taken_back: u64,
    /// See [`Stats::evictions_given_back`].
    #[serde(default)]
    pub evictions_given_back: u64,
    /// See [`Stats::pages_recycled`].
    #[serde(default)]
    pub pages_recycled: u64,
    /// See [`Stats::pages_read_ahead`].
    #[serde(default)]
    pub pages_read_ahead: u64,
    /// See [`Stats::reads_ahead_unsent`].
    #[serde(default)]
    pub reads_ahead_unsent: u64,
    /// See [`Stats::reads_early`].
    #[serde(default)]
    pub reads_early: u64,
    /// See [`Stats::reads_early_used`].
    #[serde(default)]
    pub reads_early_used: u64,
    /// Read-ahead accuracy: of the pages fetched beyond the faulting page (prefetch and
    /// read-ahead), the share the program then used, estimated on a sample left remote
    /// (`rackmem_pager::probe`); `None` until a sampled page has an outcome.
    #[serde(default)]
    pub readahead_accuracy: Option<f64>,
    /// Sampled read-ahead pages the program used.
    #[serde(default)]
    pub readahead_sample_used: u64,
    /// Sampled read-ahead pages that left (or were released) unused.
    #[serde(default)]
    pub readahead_sample_wasted: u64,
    /// Pages fetched beyond the faulting page (`bytes_prefetched` in pages) estimated used:
    /// the accuracy times those pages.
    #[serde(default)]
    pub readahead_pages_used: u64,
    /// Pages fetched beyond the faulting page estimated wasted (evicted or released unused).
    #[serde(default)]
    pub readahead_pages_wasted: u64,
    /// Resident bytes at snapshot time.
    pub resident_bytes: u64,
    /// Largest resident bytes seen.
    pub peak_resident_bytes: u64,
    /// Largest budget in force during the run, in bytes.
    pub budget_bytes: u64,
    /// Peak committed footprint in the window, in bytes (see [`Stats::peak_committed_pages`]).
    #[serde(default)]
    pub peak_footprint_bytes: u64,
    /// See [`Stats::peak_rss_anon_bytes`].
    #[serde(default)]
    pub peak_rss_anon_bytes: u64,
    /// The whole run's budget (every process of one `rackmem run`), bytes, as this process
    /// last saw it; 0 without a run's budget.
    #[serde(default)]
    pub run_budget_bytes: u64,
    /// Peak of the run's processes' committed window footprints summed, bytes.
    #[serde(default)]
    pub run_peak_footprint_bytes: u64,
    /// Peak of the run's processes' resident window pages summed, bytes.
    #[serde(default)]
    pub run_peak_resident_bytes: u64,
    /// Peak of the run's processes' sampled `RssAnon` summed, bytes.
    #[serde(default)]
    pub run_peak_rss_anon_bytes: u64,
    /// Shared anonymous memory the program mapped (pieces of at least the threshold), which
    /// stays local: see `crate::note_shared_local`.
    #[serde(default)]
    pub shared_local_bytes: u64,
    /// Window bytes allocated at snapshot time.
    pub window_bytes_allocated: u64,
    /// Largest window footprint seen.
    pub peak_window_bytes: u64,
    /// See [`Stats::window_allocations`].
    pub window_allocations: u64,
    /// See [`Stats::bytes_fetched_shared`].
    #[serde(default)]
    pub bytes_fetched_shared: u64,
    /// See [`Stats::bytes_written_shared`].
    #[serde(default)]
    pub bytes_written_shared: u64,
    /// See [`Stats::events`].
    pub events: u64,
    /// See [`Stats::watchdog_reports`].
    pub watchdog_reports: u64,
    /// See [`Stats::handler_moves`].
    #[serde(default)]
    pub handler_moves: u64,
    /// See [`Stats::load_holds`].
    #[serde(default)]
    pub load_holds: u64,
    /// See [`Stats::load_rotations`].
    #[serde(default)]
    pub load_rotations: u64,
    /// See [`Stats::load_stalls`].
    #[serde(default)]
    pub load_stalls: u64,
    /// See [`Stats::load_hold_max_ns`].
    #[serde(default)]
    pub load_hold_max_ns: u64,
    /// See [`Stats::moves_recounted`].
    #[serde(default)]
    pub moves_recounted: u64,
    /// See [`Stats::migrations`].
    #[serde(default)]
    pub migrations: u64,
    /// See [`Stats::migration_bytes`].
    #[serde(default)]
    pub migration_bytes: u64,
    /// See [`Stats::migration_setup_ns`].
    #[serde(default)]
    pub migration_setup_ns: u64,
    /// See [`Stats::migration_allocate_ns`].
    #[serde(default)]
    pub migration_allocate_ns: u64,
    /// See [`Stats::migration_transfer_ns`].
    #[serde(default)]
    pub migration_transfer_ns: u64,
    /// See [`Stats::migration_finalize_ns`].
    #[serde(default)]
    pub migration_finalize_ns: u64,
    /// See [`Stats::migration_pieces_direct`].
    #[serde(default)]
    pub migration_pieces_direct: u64,
    /// See [`Stats::migration_pieces_bounced`].
    #[serde(default)]
    pub migration_pieces_bounced: u64,
    /// See [`Stats::migration_direct_fallbacks`].
    #[serde(default)]
    pub migration_direct_fallbacks: u64,
    /// See [`Stats::migration_pages_reused`].
    #[serde(default)]
    pub migration_pages_reused: u64,
    /// Fault service time, median, ns.
    pub fault_p50_ns: u64,
    /// Fault service time, 90th percentile, ns.
    pub fault_p90_ns: u64,
    /// Fault service time, 99th percentile, ns.
    pub fault_p99_ns: u64,
    /// Fault service time, maximum, ns.
    pub fault_max_ns: u64,
    /// Fault service time, mean, ns.
    pub fault_mean_ns: u64,
    /// Step: making room (choosing victims, waiting for staging slots).
    #[serde(default)]
    pub step_make_room: StepSnapshot,
    /// Step: scanning and moving victims out.
    #[serde(default)]
    pub step_stage: StepSnapshot,
    /// Step: fetching from the brick.
    #[serde(default)]
    pub step_fetch: StepSnapshot,
    /// Step: installing and waking.
    #[serde(default)]
    pub step_install: StepSnapshot,
    /// The handler's whole service time of a remote fault.
    #[serde(default)]
    pub remote_fault_handler: StepSnapshot,
    /// Faults in flight, time-weighted mean over the time at least one was (miss concurrency).
    #[serde(default)]
    pub faults_in_flight_mean: f64,
    /// Most faults in flight at once.
    #[serde(default)]
    pub faults_in_flight_max: u32,
    /// Fault handler threads.
    #[serde(default)]
    pub fault_handlers: u32,
    /// The unit the window moved memory in: 4096, or 2 MiB with huge units (`--huge-pages`).
    #[serde(default)]
    pub unit_bytes: u64,
    /// The local buffer's level of C-AMAT: every fault, the pure misses among them (faults no
    /// other fault overlapped), miss concurrency, pure miss penalty.
    #[serde(default)]
    pub local_buffer: LevelCounts,
    /// The bricks' level, brick by brick (see [`BrickLevels`]).
    #[serde(default)]
    pub bricks: Vec<BrickLevel>,
}

impl Stats {
    /// Records that `pages` became resident, tracking the peak.
    pub fn add_resident(&self, pages: u64) {
        let now = self.resident_pages.fetch_add(pages, Relaxed) + pages;
        self.peak_resident_pages.fetch_max(now, Relaxed);
    }

    /// Records the core's count of resident pages, tracking the peak.
    pub fn set_resident(&self, pages: u64) {
        self.resident_pages.store(pages, Relaxed);
        self.peak_resident_pages.fetch_max(pages, Relaxed);
    }

    /// Records that `pages` stopped being resident (never below zero: a count set by another
    /// handler may already leave them out).
    pub fn sub_resident(&self, pages: u64) {
        let _ = self
            .resident_pages
            .fetch_update(Relaxed, Relaxed, |r| Some(r.saturating_sub(pages)));
    }

    /// Reads the process's `RssAnon` now and keeps the peak; returns the peak (0 if
    /// `/proc/self/status` cannot be read, as in a sandbox without procfs).
    /// Samples `RssAnon` into the peak, returning the value now (`None` if /proc cannot say).
    pub fn sample_rss_anon_now(&self) -> Option<u64> {
        let now = rss_anon_bytes()?;
        self.peak_rss_anon_bytes.fetch_max(now, Relaxed);
        Some(now)
    }

    /// Samples `RssAnon` into the peak, returning the peak.
    pub fn sample_rss_anon(&self) -> u64 {
        if let Some(now) = rss_anon_bytes() {
            self.peak_rss_anon_bytes.fetch_max(now, Relaxed);
        }
        self.peak_rss_anon_bytes.load(Relaxed)
    }

    /// A snapshot for reporting.
    pub fn snapshot(&self, page_size: u64) -> StatsSnapshot {
        let g = |a: &AtomicU64| a.load(Relaxed);
        let (faults_in_flight_mean, faults_in_flight_max) = self.in_flight.mean_and_max();
        StatsSnapshot {
            local_buffer: self.in_flight.counts(),
            bricks: self.bricks.snapshot(),
            faults_in_flight_mean,
            faults_in_flight_max,
            fault_handlers: 0,
            unit_bytes: 0,
            pid: std::process::id(),
            program: std::env::args().next().unwrap_or_default(),
            faults: g(&self.faults),
            faults_duplicate: g(&self.faults_duplicate),
            faults_remote: g(&self.faults_remote),
            faults_zero: g(&self.faults_zero),
            faults_filled: g(&self.faults_filled),
            bytes_fetched: g(&self.bytes_fetched),
            bytes_prefetched: g(&self.bytes_prefetched),
            bytes_written_back: g(&self.bytes_written_back),
            evictions: g(&self.evictions),
            evictions_clean: g(&self.evictions_clean),
            evictions_same_filled: g(&self.evictions_same_filled),
            evictions_protected: g(&self.evictions_protected),
            evictions_shared: g(&self.evictions_shared),
            inherited_resident_bytes: g(&self.inherited_resident_bytes),
            fork_pages_reported: g(&self.fork_pages_reported),
            fork_pages_taken_back: g(&self.fork_pages_taken_back),
            evictions_given_back: g(&self.evictions_given_back),
            pages_recycled: g(&self.pages_recycled),
            pages_read_ahead: g(&self.pages_read_ahead),
            reads_ahead_unsent: g(&self.reads_ahead_unsent),
            reads_early: g(&self.reads_early),
            reads_early_used: g(&self.reads_early_used),
            readahead_accuracy: None,
            readahead_sample_used: 0,
            readahead_sample_wasted: 0,
            readahead_pages_used: 0,
            readahead_pages_wasted: 0,
            resident_bytes: g(&self.resident_pages) * page_size,
            peak_resident_bytes: g(&self.peak_resident_pages) * page_size,
            budget_bytes: g(&self.budget_pages) * page_size,
            peak_footprint_bytes: g(&self.peak_committed_pages) * page_size,
            peak_rss_anon_bytes: self.sample_rss_anon(),
            run_budget_bytes: 0,
            run_peak_footprint_bytes: 0,
            run_peak_resident_bytes: 0,
            run_peak_rss_anon_bytes: 0,
            shared_local_bytes: crate::process::shared_local_bytes(),
            window_bytes_allocated: g(&self.window_bytes_allocated),
            peak_window_bytes: g(&self.peak_window_bytes),
            window_allocations: g(&self.window_allocations),
            bytes_fetched_shared: g(&self.bytes_fetched_shared),
            bytes_written_shared: g(&self.bytes_written_shared),
            events: g(&self.events),
            watchdog_reports: g(&self.watchdog_reports),
            handler_moves: g(&self.handler_moves),
            load_holds: g(&self.load_holds),
            load_rotations: g(&self.load_rotations),
            load_stalls: g(&self.load_stalls),
            load_hold_max_ns: g(&self.load_hold_max_ns),
            moves_recounted: g(&self.moves_recounted),
            migrations: g(&self.migrations),
            migration_bytes: g(&self.migration_bytes),
            migration_setup_ns: g(&self.migration_setup_ns),
            migration_allocate_ns: g(&self.migration_allocate_ns),
            migration_transfer_ns: g(&self.migration_transfer_ns),
            migration_finalize_ns: g(&self.migration_finalize_ns),
            migration_pieces_direct: g(&self.migration_pieces_direct),
            migration_pieces_bounced: g(&self.migration_pieces_bounced),
            migration_direct_fallbacks: g(&self.migration_direct_fallbacks),
            migration_pages_reused: g(&self.migration_pages_reused),
            fault_p50_ns: self.fault_latency.quantile_ns(0.5),
            fault_p90_ns: self.fault_latency.quantile_ns(0.9),
            fault_p99_ns: self.fault_latency.quantile_ns(0.99),
            fault_max_ns: self.fault_latency.max_ns(),
            fault_mean_ns: self.fault_latency.mean_ns(),
            step_make_room: StepSnapshot::of(&self.breakdown.make_room),
            step_stage: StepSnapshot::of(&self.breakdown.stage),
            step_fetch: StepSnapshot::of(&self.breakdown.fetch),
            step_install: StepSnapshot::of(&self.breakdown.install),
            remote_fault_handler: StepSnapshot::of(&self.breakdown.total),
        }
    }
}

/// The process's anonymous resident memory (`RssAnon`), in bytes.
fn rss_anon_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_rss_anon(&status)
}

/// `RssAnon` of a `/proc/PID/status` text, in bytes.
fn parse_rss_anon(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_anon_is_read_from_status() {
        let status = "Name:\tx\nVmRSS:\t  9000 kB\nRssAnon:\t    1234 kB\nRssFile:\t 10 kB\n";
        assert_eq!(parse_rss_anon(status), Some(1234 * 1024));
        assert_eq!(parse_rss_anon("Name:\tx\n"), None);
        let own = rss_anon_bytes().expect("this process's RssAnon");
        assert!(own > 0, "a running test holds anonymous memory");
    }

    #[test]
    fn counts_at_a_bound_are_cumulative_and_within_a_bucket() {
        let h = Histogram::default();
        for v in [900u64, 1_000, 3_000, 9_000, 2_000_000] {
            h.record(v);
        }
        assert_eq!(h.count_at_most(1_100), 2);
        assert_eq!(h.count_at_most(10_000), 4);
        assert_eq!(h.count_at_most(u64::MAX), 5);
        assert_eq!(h.count_at_most(0), 0);
    }

    #[test]
    fn quantiles_are_within_a_bucket() {
        let h = Histogram::default();
        for v in 1..=10_000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile_ns(0.5) as f64;
        let p99 = h.quantile_ns(0.99) as f64;
        assert!((p50 / 5_000_000.0 - 1.0).abs() < 0.15, "p50 {p50}");
        assert!((p99 / 9_900_000.0 - 1.0).abs() < 0.15, "p99 {p99}");
        assert_eq!(h.max_ns(), 10_000_000);
        assert_eq!(h.count(), 10_000);
    }

    #[test]
    fn distinct_pages_are_counted_within_a_few_percent() {
        let d = DistinctPages::default();
        for n in [100u64, 5_000, 200_000] {
            // Each page several times: repeats must not count.
            for _ in 0..3 {
                for p in 0..n {
                    d.insert(p * 7);
                }
            }
            let est = d.take() as f64;
            assert!(
                (est / n as f64 - 1.0).abs() < 0.08,
                "{n} distinct pages estimated as {est}"
            );
        }
        assert_eq!(d.take(), 0, "take starts afresh");
    }

    #[test]
    fn faults_in_flight_are_weighted_by_time() {
        let f = InFlight::default();
        // One fault alone for 100 ns, then two for 100 ns, then none for 1000 ns, then one for
        // 200 ns: (100 + 200 + 200) / 400 busy ns.
        f.begin(0);
        f.begin(100);
        f.end(200);
        f.end(200);
        f.begin(1200);
        f.end(1400);
        let (mean, max) = f.mean_and_max();
        assert!((mean - 1.25).abs() < 1e-9, "mean {mean}");
        assert_eq!(max, 2);
        // Only the last fault overlapped no other: one pure miss of 200 ns.
        let c = f.counts();
        assert_eq!((c.faults, c.pure_misses, c.pure_miss_ns), (3, 1, 200));
    }

    #[test]
    fn faults_are_attributed_to_their_bricks() {
        let b = BrickLevels::default();
        let (x, y) = (BrickAddr::Unix("/x".into()), BrickAddr::Unix("/y".into()));
        let a = b.begin(&x, 0);
        b.end(a, 10);
        let a = b.begin(&y, 20);
        let c = b.begin(&x, 25);
        b.end(c, 30);
        b.end(a, 40);
        let s = b.snapshot();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].brick, x.to_string());
        assert_eq!((s[0].counts.faults, s[0].counts.pure_misses), (2, 1));
        assert_eq!(
            (s[1].counts.faults, s[1].counts.pure_misses, s[1].counts.busy_ns),
            (1, 0, 20)
        );
        // More bricks than kept: the rest are counted under the last entry.
        for i in 0..MAX_BRICK_LEVELS + 5 {
            let a = b.begin(&BrickAddr::Unix(format!("/b{i}").into()), 100);
            b.end(a, 101);
        }
        let s = b.snapshot();
        assert_eq!(s.len(), MAX_BRICK_LEVELS);
        assert!(s[MAX_BRICK_LEVELS - 1].brick.ends_with("and other bricks"));
        assert_eq!(
            s.iter().map(|l| l.counts.faults).sum::<u64>(),
            3 + MAX_BRICK_LEVELS as u64 + 5
        );
    }

    #[test]
    fn buckets_are_monotonic() {
        let mut last = 0;
        for v in [1u64, 2, 3, 7, 8, 9, 100, 1000, 12345, 1 << 30] {
            let b = bucket_of(v);
            assert!(b >= last);
            assert!(bucket_upper(b) >= v, "{v} -> {}", bucket_upper(b));
            last = b;
        }
    }
}
