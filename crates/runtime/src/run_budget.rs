//! The run's budget: one local buffer limit for every process of one `rackmem run`, the way a
//! memory cgroup confines a whole process tree. `--local P%` is P% of the peak footprint of the
//! tree (the sum of its processes' committed window pages at once); a byte value is the tree's
//! limit.
//!
//! The launcher creates a small file of slots (`RACKMEM_RUN_BUDGET`); every runtime of the run
//! (started at exec, or built again in a forked child) maps it and takes a slot: its pid, its
//! committed and resident pages, and its sampled `RssAnon`. There is no lock and no arbiter:
//! each process publishes its own figures at every fault and reads the others'. A process may
//! hold what the others leave of the tree's budget, and never less than its share of the budget
//! in proportion to its weight (its footprint, or the faults it made in the last
//! [`DEMAND_INTERVAL`] when fewer: what it showed it needs), so a process that grows while
//! another shrinks takes the freed room, one whose neighbours hold everything still makes
//! progress (it evicts its own pages only), and the busy process of a run takes the room its
//! idle neighbours hold but do not use. A process over its share gives room back at its next faults; one that
//! makes none (idle) is found over by its watchdog, which asks its handler to give the excess
//! back between faults (`handler::ask_give_back_if_over`). A process gives its
//! slot back at exit; one that dies without exiting is found by the next sweep (once a second,
//! by whichever runtime gets there first) and its slot cleared.

use crate::size::Budget;
use crate::PAGE;
use rackmem_sys::SharedMemory;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the other processes' figures are reused before they are read again. A run of
/// hundreds of processes (PostgreSQL's backends) would otherwise read hundreds of slots, which
/// every other process writes, at every fault; a millisecond is a hundred faults or so, and what
/// others held a millisecond ago is as good a guide to this process's share.
const OTHERS_REFRESH: Duration = Duration::from_millis(1);

/// The interval over which a process's faults measure its demand. A process's weight is its
/// footprint, capped by the faults it made in the last interval: PostgreSQL's postmaster and
/// its auxiliary processes (checkpointer, WAL writer, background writer, launchers) each have
/// its 8 MiB window and sleep; weighed by their footprints they held six sevenths of the run's
/// budget while the one backend running `pgbench -i`'s COPY was left 73 pages of a
/// 512-page budget and refaulted the same 216 pages 38 000 times in 4 s. Half a second is two
/// watchdog ticks, which update an idle process's figure (it makes no fault to do it).
pub const DEMAND_INTERVAL: Duration = Duration::from_millis(500);

/// Size of the file: a header and [`SLOTS`] slots.
pub const FILE_LEN: usize = 64 << 10;
const MAGIC: u64 = 0x7275_6e62_7564_0001;
const W_MAGIC: usize = 0;
/// Slots ever claimed (the lowest free slot is taken, so this bounds every scan by the most
/// processes alive at once).
const W_HIGH: usize = 8;
const W_PEAK_FOOTPRINT: usize = 16;
const W_BUDGET: usize = 24;
const W_PEAK_RESIDENT: usize = 32;
const W_PEAK_RSS: usize = 40;
const W_PROCESSES: usize = 48;
/// Milliseconds since the epoch of the last sweep for dead processes.
const W_SWEPT_MS: usize = 56;
const HEADER: usize = 128;
const SLOT: usize = 40;
const S_PID: usize = 0;
const S_COMMITTED: usize = 8;
const S_RESIDENT: usize = 16;
const S_RSS: usize = 24;
/// The weight of the process's share: all its committed pages, inherited ones included, or the
/// faults it made in the last [`DEMAND_INTERVAL`] when fewer.
const S_WEIGHT: usize = 32;
/// Processes of one run with a runtime alive at once (more go on with a budget of their own).
pub const SLOTS: usize = (FILE_LEN - HEADER) / SLOT;

/// This process's slot in its run's budget file.
#[derive(Debug)]
pub struct RunBudget {
    mem: SharedMemory,
    slot: usize,
    pid: u64,
    /// Committed pages this process inherited at fork, not counted in the run's footprint.
    inherited: u64,
    /// The other processes' figures as last read (see [`OTHERS_REFRESH`]).
    others: Mutex<Others>,
    refresh: Duration,
    demand_interval: Duration,
}

/// The other processes' figures summed, and the run's peaks, as last read.
#[derive(Debug, Default)]
struct Others {
    read_at: Option<Instant>,
    committed: u64,
    resident: u64,
    weights: u64,
    /// The run's peaks as this process last saw or raised them: a shared word is written only
    /// when a figure passes it.
    peak_footprint: u64,
    budget: u64,
    peak_resident: u64,
    /// This process's demand: when its interval began, its fault count then, and the faults
    /// it made in the last whole interval (`None` before one ends: a new process weighs its
    /// footprint).
    demand_since: Option<Instant>,
    faults_then: u64,
    demand: Option<u64>,
}

/// The run's figures, for `--stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Largest budget of the whole run, bytes.
    pub budget_bytes: u64,
    /// Peak of the processes' committed window footprints summed, bytes.
    pub peak_footprint_bytes: u64,
    /// Peak of the processes' resident window pages summed, bytes.
    pub peak_resident_bytes: u64,
    /// Peak of the processes' sampled `RssAnon` summed, bytes.
    pub peak_rss_anon_bytes: u64,
    /// Processes that took part.
    pub processes: u64,
}

fn slot_off(i: usize) -> usize {
    HEADER + i * SLOT
}

impl RunBudget {
    /// Maps the run's file and takes a slot: the one this pid already holds (a program that
    /// exec'd), else the lowest free one.
    /// `inherited`: the committed pages of a forked child's inherited window (0 at exec).
    pub fn attach(path: &Path, inherited: u64) -> Result<RunBudget, String> {
        let mem = SharedMemory::open_file(path, FILE_LEN).map_err(|e| e.to_string())?;
        let m = mem.compare_swap_u64(W_MAGIC, 0, MAGIC);
        if m != 0 && m != MAGIC {
            return Err(format!("{} is not a run's budget file", path.display()));
        }
        let pid = u64::from(std::process::id());
        let mut rb = RunBudget {
            mem,
            slot: 0,
            pid,
            inherited,
            others: Mutex::default(),
            refresh: OTHERS_REFRESH,
            demand_interval: DEMAND_INTERVAL,
        };
        let high = (rb.mem.load_u64(W_HIGH) as usize).min(SLOTS);
        if let Some(i) = (0..high).find(|&i| rb.mem.load_u64(slot_off(i) + S_PID) == pid) {
            rb.slot = i;
            return Ok(rb);
        }
        for attempt in 0..2 {
            for i in 0..SLOTS {
                let o = slot_off(i);
                if rb.mem.load_u64(o + S_PID) == 0 && rb.mem.compare_swap_u64(o + S_PID, 0, pid) == 0 {
                    rb.mem.fetch_max_u64(W_HIGH, i as u64 + 1);
                    for w in [S_COMMITTED, S_RESIDENT, S_RSS, S_WEIGHT] {
                        rb.mem.store_u64(o + w, 0);
                    }
                    rb.mem.fetch_add_u64(W_PROCESSES, 1);
                    rb.slot = i;
                    return Ok(rb);
                }
            }
            if attempt == 0 {
                rb.sweep();
            }
        }
        Err(format!("more than {SLOTS} processes of the run at once"))
    }

    /// This process's budget in pages, given its committed and resident window pages now and
    /// the faults it has taken so far; publishes all three. `floor_bytes`: the least a
    /// percentage gives the run ([`Budget::pages_with_floor`]).
    pub fn budget_pages(
        &self,
        budget: &Budget,
        committed: u64,
        resident: u64,
        faults: u64,
        min_pages: u64,
        floor_bytes: u64,
    ) -> u64 {
        let footprint = committed;
        // What the process committed beyond what it inherited: a parent's pages shared at fork
        // count once, in the parent, as a cgroup charges them.
        let committed = committed.saturating_sub(self.inherited);
        let me = slot_off(self.slot);
        self.mem.store_u64(me + S_COMMITTED, committed);
        self.mem.store_u64(me + S_RESIDENT, resident);
        let mut o = self.others.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match o.demand_since {
            None => (o.demand_since, o.faults_then) = (Some(now), faults),
            Some(t) if now.duration_since(t) >= self.demand_interval => {
                o.demand = Some(faults.saturating_sub(o.faults_then));
                (o.demand_since, o.faults_then) = (Some(now), faults);
            }
            Some(_) => {}
        }
        // A forked child's weight counts its whole window, inherited pages included: it uses
        // them, though the run's footprint counts them once, in the parent.
        let weight = o.demand.map_or(footprint, |d| d.min(footprint));
        self.mem.store_u64(me + S_WEIGHT, weight);
        if o.read_at.is_none_or(|t| t.elapsed() >= self.refresh) {
            let (mut committed, mut resident, mut weights) = (0u64, 0u64, 0u64);
            for i in 0..(self.mem.load_u64(W_HIGH) as usize).min(SLOTS) {
                let s = slot_off(i);
                if i == self.slot || self.mem.load_u64(s + S_PID) == 0 {
                    continue;
                }
                committed += self.mem.load_u64(s + S_COMMITTED);
                resident += self.mem.load_u64(s + S_RESIDENT);
                weights += self.mem.load_u64(s + S_WEIGHT);
            }
            o.committed = committed;
            o.resident = resident;
            o.weights = weights;
            o.peak_footprint = o.peak_footprint.max(self.mem.load_u64(W_PEAK_FOOTPRINT));
            o.budget = o.budget.max(self.mem.load_u64(W_BUDGET));
            o.peak_resident = o.peak_resident.max(self.mem.load_u64(W_PEAK_RESIDENT));
            o.read_at = Some(Instant::now());
        }
        let tree_committed = o.committed + committed;
        self.raise(W_PEAK_FOOTPRINT, &mut o.peak_footprint, tree_committed);
        let tree = budget.pages_with_floor(o.peak_footprint * PAGE, PAGE, min_pages, floor_bytes);
        self.raise(W_BUDGET, &mut o.budget, tree);
        let tree_resident = o.resident + resident;
        self.raise(W_PEAK_RESIDENT, &mut o.peak_resident, tree_resident);
        let weights = o.weights + weight;
        let share = if weights == 0 {
            tree
        } else {
            (u128::from(tree) * u128::from(weight) / u128::from(weights)) as u64
        };
        tree.saturating_sub(o.resident).max(share).max(min_pages)
    }

    /// Raises the run's shared peak `word` to `v`, written only when `v` passes `seen` (the
    /// peak as this process last saw it), which becomes the peak after the raise.
    fn raise(&self, word: usize, seen: &mut u64, v: u64) {
        if v > *seen {
            *seen = self.mem.fetch_max_u64(word, v).max(v);
        }
    }

    /// Publishes this process's `RssAnon` now and records the run's sum; once a second (in
    /// whichever process comes first) clears the slots of processes that died without exiting.
    pub fn note_rss_anon(&self, bytes: u64) {
        self.mem.store_u64(slot_off(self.slot) + S_RSS, bytes);
        let mut sum = 0u64;
        for i in 0..(self.mem.load_u64(W_HIGH) as usize).min(SLOTS) {
            let o = slot_off(i);
            if self.mem.load_u64(o + S_PID) != 0 {
                sum += self.mem.load_u64(o + S_RSS);
            }
        }
        self.mem.fetch_max_u64(W_PEAK_RSS, sum);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let last = self.mem.load_u64(W_SWEPT_MS);
        if now >= last + 1000 && self.mem.compare_swap_u64(W_SWEPT_MS, last, now) == last {
            self.sweep();
        }
    }

    /// Clears the slots of processes that are gone (killed, or exec'd into a program without
    /// the runtime and exited since).
    fn sweep(&self) {
        for i in 0..(self.mem.load_u64(W_HIGH) as usize).min(SLOTS) {
            let o = slot_off(i);
            let pid = self.mem.load_u64(o + S_PID);
            if pid == 0 || pid == self.pid || rackmem_sys::process::process_alive(pid as u32) {
                continue;
            }
            for w in [S_COMMITTED, S_RESIDENT, S_RSS, S_WEIGHT] {
                self.mem.store_u64(o + w, 0);
            }
            self.mem.compare_swap_u64(o + S_PID, pid, 0);
        }
    }

    /// Gives the slot back (at exit): the others may use its room at once.
    pub fn leave(&self) {
        let o = slot_off(self.slot);
        for w in [S_COMMITTED, S_RESIDENT, S_RSS, S_WEIGHT] {
            self.mem.store_u64(o + w, 0);
        }
        self.mem.compare_swap_u64(o + S_PID, self.pid, 0);
    }

    /// The run's figures so far.
    pub fn summary(&self) -> RunSummary {
        summary_of(|w| self.mem.load_u64(w))
    }
}

fn summary_of(word: impl Fn(usize) -> u64) -> RunSummary {
    RunSummary {
        budget_bytes: word(W_BUDGET) * PAGE,
        peak_footprint_bytes: word(W_PEAK_FOOTPRINT) * PAGE,
        peak_resident_bytes: word(W_PEAK_RESIDENT) * PAGE,
        peak_rss_anon_bytes: word(W_PEAK_RSS),
        processes: word(W_PROCESSES),
    }
}

/// Creates the run's budget file (zeros, readable and writable by the run's processes whatever
/// user they switch to, as PostgreSQL's server does).
pub fn create(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let f = std::fs::File::create(path)?;
    f.set_len(FILE_LEN as u64)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o666))
}

/// The run's figures as the file holds them (`None` if no runtime ever attached).
pub fn read_summary(path: &Path) -> Option<RunSummary> {
    let bytes = std::fs::read(path).ok()?;
    let word = |o: usize| {
        bytes
            .get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_ne_bytes)
    };
    (word(W_MAGIC) == MAGIC).then(|| summary_of(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_of_a_run_share_one_budget() {
        let dir = std::env::temp_dir().join(format!("run-budget-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("budget");
        create(&path).unwrap();
        let mut a = RunBudget::attach(&path, 0).unwrap();
        // Every call reads the others again (in a run, a millisecond may pass first).
        a.refresh = Duration::ZERO;
        // The same pid attaches to its own slot again (an exec).
        let again = RunBudget::attach(&path, 0).unwrap();
        assert_eq!(a.slot, again.slot);
        // A second process of the run (pid 1, which is alive, so no sweep clears it).
        let b = {
            let mem = SharedMemory::open_file(&path, FILE_LEN).unwrap();
            let slot = (0..SLOTS)
                .find(|&i| mem.compare_swap_u64(slot_off(i) + S_PID, 0, 1) == 0)
                .unwrap();
            mem.fetch_max_u64(W_HIGH, slot as u64 + 1);
            RunBudget {
                mem,
                slot,
                pid: 1,
                inherited: 0,
                others: Mutex::default(),
                refresh: Duration::ZERO,
                demand_interval: DEMAND_INTERVAL,
            }
        };
        assert_ne!(a.slot, b.slot);
        let pct = Budget::Percent(25.0);
        // a: 400 pages committed, b: none yet: a may hold the whole 100.
        assert_eq!(a.budget_pages(&pct, 400, 0, 0, 1, 0), 100);
        // b grows to 400 too: the tree's peak is 800, its budget 200.
        assert_eq!(b.budget_pages(&pct, 400, 0, 0, 1, 0), 200);
        // a holds 150: b may have the 50 left, but never less than its share (100).
        assert_eq!(a.budget_pages(&pct, 400, 150, 0, 1, 0), 200);
        assert_eq!(b.budget_pages(&pct, 400, 0, 0, 1, 0), 100);
        // a frees everything: the peak stays, b may take the whole budget.
        assert_eq!(a.budget_pages(&pct, 0, 0, 0, 1, 0), 200);
        assert_eq!(b.budget_pages(&pct, 400, 90, 0, 1, 0), 200);
        // A byte budget is the tree's: b holding 3 MiB leaves a 1 MiB of 4 MiB.
        let bytes = Budget::Bytes(4 << 20);
        assert_eq!(b.budget_pages(&bytes, 400, 768, 0, 1, 0), 1024);
        assert_eq!(a.budget_pages(&bytes, 400, 0, 0, 1, 0), 512);
        b.leave();
        assert_eq!(a.budget_pages(&bytes, 400, 0, 0, 1, 0), 1024);
        let s = a.summary();
        assert_eq!(s.budget_bytes, 1024 * PAGE);
        assert_eq!(s.peak_footprint_bytes, 800 * PAGE);
        assert_eq!(read_summary(&path), Some(s));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_percentage_gives_the_run_at_least_its_floor() {
        let dir = std::env::temp_dir().join(format!("run-budget-floor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("budget");
        create(&path).unwrap();
        let a = member(&path, u64::from(std::process::id()));
        let (pct, floor) = (Budget::Percent(25.0), 8 << 20);
        // 1 MiB so far: all of it (the floor never passes the footprint).
        assert_eq!(a.budget_pages(&pct, 256, 0, 0, 1, floor), 256);
        // 16 MiB so far: 8 MiB, not 4.
        assert_eq!(a.budget_pages(&pct, 4096, 0, 0, 1, floor), 2048);
        // 64 MiB: a quarter is past the floor.
        assert_eq!(a.budget_pages(&pct, 16384, 0, 0, 1, floor), 4096);
        // A size is the size asked for.
        assert_eq!(a.budget_pages(&Budget::Bytes(1 << 20), 16384, 0, 0, 1, floor), 256);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A process of the run that `attach` would have given a slot, with pid `pid` (alive, so
    /// that no sweep clears it) and every call ending a demand interval.
    fn member(path: &Path, pid: u64) -> RunBudget {
        let mem = SharedMemory::open_file(path, FILE_LEN).unwrap();
        let slot = (0..SLOTS)
            .find(|&i| mem.compare_swap_u64(slot_off(i) + S_PID, 0, pid) == 0)
            .unwrap();
        mem.fetch_max_u64(W_HIGH, slot as u64 + 1);
        RunBudget {
            mem,
            slot,
            pid,
            inherited: 0,
            others: Mutex::default(),
            refresh: Duration::ZERO,
            demand_interval: Duration::ZERO,
        }
    }

    #[test]
    fn a_busy_process_takes_the_room_idle_ones_hold() {
        let dir = std::env::temp_dir().join(format!("run-budget-demand-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("budget");
        create(&path).unwrap();
        let pct = Budget::Percent(25.0);
        let (busy, idle) = (member(&path, 1), member(&path, u64::from(std::process::id())));
        // Each weighs its footprint until its first interval ends: the first to commit 400
        // pages has the run's budget (100) to itself, and the second doubles it.
        assert_eq!(idle.budget_pages(&pct, 400, 0, 0, 1, 0), 100);
        assert_eq!(busy.budget_pages(&pct, 400, 0, 0, 1, 0), 200);
        // The idle process took no fault in its interval: its weight falls to nothing, and the
        // busy one, faulting, may take the whole budget, the idle one's 100 pages included.
        assert_eq!(idle.budget_pages(&pct, 400, 100, 0, 1, 0), 200);
        assert_eq!(busy.budget_pages(&pct, 400, 0, 5000, 1, 0), 200);
        // The idle process is left what the busy one does not hold, so its watchdog gives the
        // rest back (never below the least a process keeps).
        assert_eq!(busy.budget_pages(&pct, 400, 190, 10000, 1, 0), 200);
        assert_eq!(idle.budget_pages(&pct, 400, 100, 0, 1, 0), 10);
        assert_eq!(idle.budget_pages(&pct, 400, 100, 0, 32, 0), 32);
        // A process that faults again weighs its faults (at most its footprint): 40 faults
        // against the busy one's 400 pages earn it a share of 200 * 40 / 440.
        assert_eq!(busy.budget_pages(&pct, 400, 190, 15000, 1, 0), 200);
        assert_eq!(idle.budget_pages(&pct, 400, 10, 40, 1, 0), 18);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
