//! Load control (Denning's working-set load control, seed 002's multicore extension): when a
//! program's threads fault together on working sets that fit the local buffer one at a time but
//! not together, their refaults evict each other's pages and nearly every fault fetches back a
//! page evicted shortly before. The kernel's swap escapes that by accident (a thread blocked in
//! reclaim lets its pages age, so the LRU favours the other); here it is done on purpose: one
//! thread is *favoured*, its faults are served as they come, and the other threads' faults are
//! *held* (read from the userfaultfd but not served, so those threads stay blocked in the
//! kernel) for a bounded slice, after which the favour rotates to the thread held longest.
//!
//! Data flow: the first handler asks [`LoadControl::fault`] about each fault before serving it
//! (serve or hold), and [`LoadControl::due`] between faults which held faults to serve now.
//! Nothing here makes a system call; the caller says whether the favoured thread is running.
//!
//! When it engages: over a window of [`WINDOW_FAULTS`] faults and at least [`WINDOW_NS`], at
//! least [`REFAULT_SHARE`] of the faults fetched back a page from a brick (the buffer is full
//! and pages come back), and at least two threads each raised an eighth of the faults. A
//! one-thread program never engages, nor does one whose faults are mostly first touches.
//! Nor does one whose threads refault *each other's* pages: favouring one thread helps only
//! when each has a working set of its own (xz's match finders), never when they share one (a
//! server's workers on one table), where it would only hold a worker's request for a slice. A
//! sketch remembers which thread last faulted in each granule of [`GRANULE_PAGES`] pages (one
//! byte per slot of [`SKETCH`], indexed by the granule's number, so granules far apart may
//! share a slot); a window engages only if the share of its faults in granules faulted before
//! that came from the thread that faulted there last is nearer 1 (working sets of their own)
//! than the share threads that mix over one working set would show by chance, the sum of the
//! squares of each thread's share of the faults (1/2 for two threads faulting alike, 0.74 when
//! one raises 85% of the faults). Granules, not pages: a fault
//! installs a run (zeros, read-ahead), so most pages of a working set were never faulted one
//! by one, while the granule they sit in was.
//!
//! Bounds and hazards:
//! - **Every hold ends within [`SLICE_NS`]** (500 ms, a quarter of the watchdog's default limit):
//!   the slice's end releases every held fault, whatever happens.
//! - **A held thread may hold a lock the favoured one waits for.** When the favoured thread has
//!   raised no fault for [`STALL_NS`] and is not running (the caller reads its state; a thread
//!   waiting on a futex, a pipe or a held thread's lock sleeps), the holds end at once and the
//!   favour moves to the thread held longest. A favoured thread that computes on resident pages
//!   stays runnable and keeps the favour, for [`IDLE_FAVOUR_NS`]: a thread spinning at a barrier
//!   for a held one is runnable too (OpenBLAS's threads spin in user space, no system call), so
//!   a favoured thread without a fault for that long ends the holds as if it slept. NumPy's
//!   multiply with two BLAS threads at 50% lost up to 0.5 s a hold before (10–25 holds a run).
//!   Threads that wait for each other at every few faults (a mutex around their work) stall
//!   the favour at once after each move: two such stalls in a row end load control for
//!   [`BACKOFF_NS`] ([`QUICK_STALL_NS`]).
//! - **The kernel's own accesses** to a missing page inside a system call wait on the same fault
//!   as the thread's own: a hold only delays them, never turns them into an error.
//! - **Favour that does not help** (each thread's working set alone exceeds the buffer, so the
//!   refaults of a slice's second half are not a quarter fewer than its first half's) ends load
//!   control for [`BACKOFF_NS`]: at most one slice in nine is spent trying again.
//! - **Memory**: [`TRACKED`] thread ids counted per window, at most [`MAX_HELD`] faults held (a
//!   thread has one fault at a time; past that a fault is served as it comes).

use std::collections::VecDeque;

/// Faults per detection window (as the handler's placement counts them).
pub(crate) const WINDOW_FAULTS: u32 = 256;
/// Shortest detection window.
pub(crate) const WINDOW_NS: u64 = 20_000_000;
/// Share of a window's faults that must be refaults (pages fetched back from a brick): nearly
/// all, so a program still filling its buffer, or one touching new pages, is left alone.
pub(crate) const REFAULT_SHARE: f64 = 0.75;
/// Each of at least two threads must have raised this share of a window's faults.
pub(crate) const THREAD_SHARE: f64 = 0.125;
/// How long one thread is favoured; also the longest a fault is held. Long enough that a
/// favoured thread whose working set (xz's match finder, 28 MiB: 7,000 faults of 10–25 µs) must
/// come back in first still has most of its slice to run on it.
pub(crate) const SLICE_NS: u64 = 500_000_000;
/// A favoured thread without a fault for this long, and not running, is waiting for something
/// (perhaps a held thread): the holds end at once.
pub(crate) const STALL_NS: u64 = 2_000_000;
/// A favoured thread that runs without a fault for this long, while faults are held, ends the
/// holds as one that sleeps does: it may be spinning for a held thread (a barrier of OpenBLAS's
/// threads), which nothing outside the thread can tell from computing, and a thread that
/// computes this long on resident pages is not thrashing now.
pub(crate) const IDLE_FAVOUR_NS: u64 = 20_000_000;
/// Load control rests this long after a slice in which favour did not cut the favoured
/// thread's faults.
pub(crate) const BACKOFF_NS: u64 = 4_000_000_000;
/// A stall this soon after the favour moved means the newly favoured thread waited at once for
/// a held one: the threads work in lock step (a mutex taken for every few faults), and favouring
/// one only makes each wait last a stall. Two in a row end load control for [`BACKOFF_NS`].
pub(crate) const QUICK_STALL_NS: u64 = 50_000_000;
/// Most faults held at once.
pub(crate) const MAX_HELD: usize = 16;
/// Thread ids counted apart in a detection window.
pub(crate) const TRACKED: usize = 8;
/// Slots of the sketch of which thread last faulted in a granule (one byte each): 64 GiB of
/// window before two granules share a slot.
pub(crate) const SKETCH: usize = 1 << 20;
/// Pages per granule of the sketch (64 KiB).
pub(crate) const GRANULE_PAGES: u64 = 16;
/// Fewer faults in granules faulted before than this in a window (memory installed by runs
/// and read-ahead, never faulted in) say nothing of who owns what: such a window does not
/// engage (a program filled by one thread and refaulted by its workers looks like that).
const OWN_MIN_AGAIN: u32 = WINDOW_FAULTS / 4;
/// A slice is judged useless only if its second half had at least this many refaults (a few
/// are the favoured thread's working set moving on, not thrashing).
const USELESS_MIN_REFAULTS: u64 = 256;

/// What to do with a fault now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Serve,
    Hold,
}

/// Why held faults are released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// The slice ended; the favour moved to the thread held longest.
    Rotated,
    /// The favoured thread stopped making progress (no fault, not running).
    Stalled,
    /// Load control disengaged (favour did not help, or nothing is held any more, or the caller
    /// asked: a fork, helpers turned on).
    Off,
}

#[derive(Debug, Clone, Copy)]
struct Favour {
    tid: u32,
    slice_start_ns: u64,
    last_fault_ns: u64,
    /// The refault count when the slice began and when its second half began. While one thread
    /// is favoured the others' faults are held, so the slice's refaults are nearly all its own:
    /// a thread whose working set fits the buffer alone refaults while it brings it back, in the
    /// first half, and little after; one whose working set does not fit refaults all along.
    remote_start: u64,
    remote_half: Option<u64>,
}

impl Favour {
    fn new(tid: u32, now_ns: u64, remote_total: u64) -> Favour {
        Favour {
            tid,
            slice_start_ns: now_ns,
            last_fault_ns: now_ns,
            remote_start: remote_total,
            remote_half: None,
        }
    }

    /// Notes the refault count at the slice's half-way point, the first time it is seen past it.
    fn note_half(&mut self, now_ns: u64, remote_total: u64) {
        if self.remote_half.is_none() && now_ns.saturating_sub(self.slice_start_ns) >= SLICE_NS / 2 {
            self.remote_half = Some(remote_total);
        }
    }
}

/// A held fault: the thread, when it was held, the faulting address.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held {
    pub tid: u32,
    pub since_ns: u64,
    pub addr: usize,
}

/// The first handler's load control (see the module documentation).
#[derive(Debug)]
pub(crate) struct LoadControl {
    counts: [(u32, u32); TRACKED],
    total: u32,
    window_start_ns: u64,
    window_remote_start: u64,
    favour: Option<Favour>,
    backoff_until_ns: u64,
    last_check_ns: u64,
    held: VecDeque<Held>,
    /// The last slice's refaults in its first and second half (for `--verbose`).
    last_halves: (u64, u64),
    /// Stalls in a row that came within [`QUICK_STALL_NS`] of the favour's last move.
    quick_stalls: u32,
    /// Which thread last faulted in each granule (a hash of its id, never 0; 0: no fault
    /// seen), made at the first fault.
    owners: Vec<u8>,
    /// This window's faults in granules faulted before, and those by the thread that did.
    again: u32,
    again_own: u32,
    /// The last judged window's `again` and `again_own` (for `--verbose`).
    last_own: (u32, u32),
}

/// A thread id as the sketch keeps it: 7 bits of a multiplicative hash, never 0.
fn owner_tag(tid: u32) -> u8 {
    ((tid.wrapping_mul(0x9E37_79B1) >> 25) as u8) | 0x80
}

impl Default for LoadControl {
    fn default() -> Self {
        LoadControl {
            counts: [(0, 0); TRACKED],
            total: 0,
            window_start_ns: 0,
            window_remote_start: 0,
            favour: None,
            backoff_until_ns: 0,
            last_check_ns: 0,
            held: VecDeque::with_capacity(MAX_HELD),
            last_halves: (0, 0),
            quick_stalls: 0,
            owners: Vec::new(),
            again: 0,
            again_own: 0,
            last_own: (0, 0),
        }
    }
}

impl LoadControl {
    /// The thread favoured now, if load control is engaged.
    pub fn favoured(&self) -> Option<u32> {
        self.favour.map(|f| f.tid)
    }

    /// The last slice's refaults in its first and second half.
    pub fn last_halves(&self) -> (u64, u64) {
        self.last_halves
    }

    /// The last judged window's faults in granules faulted before, and those by the thread
    /// that faulted there last.
    pub fn last_own(&self) -> (u32, u32) {
        self.last_own
    }

    /// Faults held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// A fault by `tid` (0: unknown) on window page number `page` at `now_ns`; `remote_total`
    /// is the runtime's count of faults that fetched a page back from a brick so far. Serve it
    /// now, or hold it (then the caller gives it to [`LoadControl::hold`]).
    pub fn fault(&mut self, tid: u32, page: u64, now_ns: u64, remote_total: u64) -> Verdict {
        if tid != 0 {
            if self.owners.is_empty() {
                self.owners = vec![0; SKETCH];
            }
            let tag = owner_tag(tid);
            let slot = &mut self.owners[((page / GRANULE_PAGES) as usize) & (SKETCH - 1)];
            if *slot != 0 {
                self.again += 1;
                self.again_own += u32::from(*slot == tag);
            }
            *slot = tag;
        }
        if let Some(f) = self.favour.as_mut() {
            f.note_half(now_ns, remote_total);
            if tid == f.tid || tid == 0 || self.held.len() >= MAX_HELD {
                if tid == f.tid {
                    f.last_fault_ns = now_ns;
                }
                return Verdict::Serve;
            }
            return Verdict::Hold;
        }
        if self.total == 0 {
            self.window_start_ns = now_ns;
            self.window_remote_start = remote_total;
            // Faults counted while a favour ran belong to no window.
            (self.again, self.again_own) = (0, 0);
        }
        self.total += 1;
        match self.counts.iter_mut().find(|c| c.0 == tid && c.1 > 0) {
            Some(c) => c.1 += 1,
            None => {
                if let Some(c) = self.counts.iter_mut().find(|c| c.1 == 0) {
                    *c = (tid, 1);
                }
            }
        }
        if self.total < WINDOW_FAULTS || now_ns.saturating_sub(self.window_start_ns) < WINDOW_NS {
            return Verdict::Serve;
        }
        let refaults = remote_total.saturating_sub(self.window_remote_start) as f64;
        let share = f64::from(self.total) * THREAD_SHARE;
        let busy = self
            .counts
            .iter()
            .filter(|c| c.0 != 0 && f64::from(c.1) >= share)
            .count();
        let top = self.counts.iter().copied().filter(|c| c.0 != 0).max_by_key(|c| c.1);
        // By chance alone, threads mixing over one working set find their own tag with the
        // probability that two faults come from one thread: the sum of the squared shares.
        let chance: f64 = self
            .counts
            .iter()
            .filter(|c| c.0 != 0)
            .map(|c| (f64::from(c.1) / f64::from(self.total)).powi(2))
            .sum();
        let own_sets =
            self.again >= OWN_MIN_AGAIN && f64::from(self.again_own) >= (1.0 + chance) / 2.0 * f64::from(self.again);
        let thrashing = refaults >= REFAULT_SHARE * f64::from(self.total) && busy >= 2 && own_sets;
        self.counts = [(0, 0); TRACKED];
        self.total = 0;
        self.last_own = (self.again, self.again_own);
        (self.again, self.again_own) = (0, 0);
        if let (true, Some((top, _)), true) = (thrashing, top, now_ns >= self.backoff_until_ns) {
            self.favour = Some(Favour::new(top, now_ns, remote_total));
            self.quick_stalls = 0;
        }
        Verdict::Serve
    }

    /// Keeps a fault the last [`LoadControl::fault`] said to hold.
    pub fn hold(&mut self, tid: u32, now_ns: u64, addr: usize) {
        assert!(self.held.len() < MAX_HELD, "more faults held than the bound");
        self.held.push_back(Held {
            tid,
            since_ns: now_ns,
            addr,
        });
    }

    /// Between faults: the held faults to serve now, and why, if any are due (or load control
    /// ends with none held). `remote_total` as for [`LoadControl::fault`]; `queue_empty`: nothing
    /// is queued on the userfaultfd (so a favoured thread with no fault in hand has none waiting
    /// either). `running(tid)` says whether a thread is running or runnable; it is asked at most
    /// once per [`STALL_NS`] / 2.
    pub fn due(
        &mut self,
        now_ns: u64,
        remote_total: u64,
        queue_empty: bool,
        running: impl FnOnce(u32) -> bool,
        out: &mut Vec<Held>,
    ) -> Option<Release> {
        let f = self.favour.as_mut()?;
        f.note_half(now_ns, remote_total);
        let f = *f;
        if now_ns.saturating_sub(f.slice_start_ns) >= SLICE_NS {
            // Favour did not help if the refaults did not fall by a quarter from the first half
            // to the second.
            let half = f.remote_half.unwrap_or(remote_total);
            let (first, second) = (half.saturating_sub(f.remote_start), remote_total.saturating_sub(half));
            self.last_halves = (first, second);
            let useless = second >= USELESS_MIN_REFAULTS && 4 * second >= 3 * first;
            if useless {
                self.backoff_until_ns = now_ns + BACKOFF_NS;
            }
            if useless || self.held.is_empty() {
                self.favour = None;
                out.extend(self.held.drain(..));
                return Some(Release::Off);
            }
            self.rotate(now_ns, remote_total, out);
            return Some(Release::Rotated);
        }
        if self.held.is_empty() || !queue_empty || now_ns.saturating_sub(f.last_fault_ns) < STALL_NS {
            return None;
        }
        if now_ns.saturating_sub(self.last_check_ns) < STALL_NS / 2 {
            return None;
        }
        self.last_check_ns = now_ns;
        if now_ns.saturating_sub(f.last_fault_ns) < IDLE_FAVOUR_NS && running(f.tid) {
            return None;
        }
        if now_ns.saturating_sub(f.slice_start_ns) < QUICK_STALL_NS {
            self.quick_stalls += 1;
        } else {
            self.quick_stalls = 0;
        }
        if self.quick_stalls >= 2 {
            self.backoff_until_ns = now_ns + BACKOFF_NS;
            self.favour = None;
            out.extend(self.held.drain(..));
            return Some(Release::Off);
        }
        self.rotate(now_ns, remote_total, out);
        Some(Release::Stalled)
    }

    /// Ends load control now and hands back every held fault (a fork is coming, helpers turned
    /// on).
    pub fn stop(&mut self, out: &mut Vec<Held>) {
        self.favour = None;
        self.counts = [(0, 0); TRACKED];
        self.total = 0;
        (self.again, self.again_own) = (0, 0);
        out.extend(self.held.drain(..));
    }

    /// The favour moves to the thread held longest; every held fault is handed back.
    fn rotate(&mut self, now_ns: u64, remote_total: u64, out: &mut Vec<Held>) {
        let Some(next) = self.held.front().map(|h| h.tid) else {
            self.favour = None;
            return;
        };
        self.favour = Some(Favour::new(next, now_ns, remote_total));
        out.extend(self.held.drain(..));
    }
}

/// True if thread `tid` of this process is running or runnable (state `R` in
/// `/proc/self/task/TID/stat`); false if it sleeps, waits on I/O or is gone.
pub(crate) fn thread_running(tid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else {
        return false;
    };
    // Field 2 (the command) is in parentheses and may hold spaces: field 3 follows the last ')'.
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .is_some_and(|s| s == "R")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Feeds one detection window of faults from `tids` in turn, every fault a refault if
    /// `refaults`, each thread on 32 pages of its own; returns the verdicts and the time after.
    fn window(lc: &mut LoadControl, tids: &[u32], refaults: bool, now: &mut u64, remote: &mut u64) -> Vec<Verdict> {
        window_on(lc, tids, refaults, now, remote, false)
    }

    /// As [`window`], the threads on 32 pages they share (each page faulted by every thread in
    /// turn: one working set).
    fn window_on(
        lc: &mut LoadControl,
        tids: &[u32],
        refaults: bool,
        now: &mut u64,
        remote: &mut u64,
        shared: bool,
    ) -> Vec<Verdict> {
        let mut out = Vec::new();
        for i in 0..WINDOW_FAULTS as usize {
            // So the window's last fault comes just after its shortest length.
            *now += WINDOW_NS / u64::from(WINDOW_FAULTS - 1) + 1_000;
            let tid = tids[i % tids.len()];
            let round = (i / tids.len()) as u64 % 32;
            let page = GRANULE_PAGES * if shared { round } else { u64::from(tid) * 4096 + round };
            out.push(lc.fault(tid, page, *now, *remote));
            if refaults {
                *remote += 1;
            }
        }
        out
    }

    #[test]
    fn one_thread_or_first_touches_never_engage() {
        let (mut now, mut remote) = (0, 0);
        let mut lc = LoadControl::default();
        for _ in 0..8 {
            assert!(window(&mut lc, &[7], true, &mut now, &mut remote)
                .iter()
                .all(|v| *v == Verdict::Serve));
            assert_eq!(lc.favoured(), None, "one thread is never held back");
            assert!(window(&mut lc, &[7, 8], false, &mut now, &mut remote)
                .iter()
                .all(|v| *v == Verdict::Serve));
            assert_eq!(lc.favoured(), None, "new pages are not thrashing");
            // A thread that faults rarely does not count as a second faulting thread.
            let mut tids = vec![7; 15];
            tids.push(8);
            window(&mut lc, &tids, true, &mut now, &mut remote);
            assert_eq!(lc.favoured(), None);
            // Unknown threads are never favoured nor held.
            window(&mut lc, &[0, 0, 7], true, &mut now, &mut remote);
            assert_eq!(lc.favoured(), None);
        }
    }

    #[test]
    fn threads_that_refault_one_shared_working_set_never_engage() {
        let (mut now, mut remote) = (0, 0);
        let mut lc = LoadControl::default();
        for _ in 0..8 {
            window_on(&mut lc, &[7, 8], true, &mut now, &mut remote, true);
            assert_eq!(
                lc.favoured(),
                None,
                "workers on one table: holding one would not shrink the working set"
            );
            window_on(&mut lc, &[7, 8, 9, 10], true, &mut now, &mut remote, true);
            assert_eq!(lc.favoured(), None);
            // One thread raising most faults finds its own tag most of the time by chance.
            window_on(&mut lc, &[7, 7, 7, 7, 7, 7, 7, 8], true, &mut now, &mut remote, true);
            assert_eq!(lc.favoured(), None, "an unequal pair on one working set");
        }
        // The same threads on working sets of their own: it engages (the check can fail).
        window(&mut lc, &[7, 8], true, &mut now, &mut remote);
        assert!(lc.favoured().is_some(), "private working sets that thrash engage it");
    }

    #[test]
    fn owner_tags_tell_threads_apart_and_are_never_empty() {
        let tags: std::collections::HashSet<u8> = (1000..1064).map(owner_tag).collect();
        assert!(tags.len() >= 48, "64 consecutive thread ids give {} tags", tags.len());
        assert!((0..100_000).all(|t| owner_tag(t) != 0));
    }

    #[test]
    fn two_thrashing_threads_take_turns_and_every_hold_is_bounded() {
        let (mut now, mut remote) = (0, 0);
        let mut lc = LoadControl::default();
        window(&mut lc, &[7, 7, 8], true, &mut now, &mut remote);
        assert_eq!(lc.favoured(), Some(7), "the thread with most faults is favoured");
        assert_eq!(lc.fault(8, 1, now, remote), Verdict::Hold);
        lc.hold(8, now, 0x1000);
        let held_at = now;
        let mut out = Vec::new();
        // The favoured thread goes on faulting (its working set comes in), then computes
        // (running), faulting now and then: thread 8 stays held until the slice ends.
        for _ in 0..100 {
            now += MS;
            assert_eq!(lc.fault(7, 2, now, remote), Verdict::Serve);
        }
        while now < held_at + SLICE_NS - MS {
            now += MS;
            if now % (IDLE_FAVOUR_NS / 2) < MS {
                assert_eq!(lc.fault(7, 2, now, remote), Verdict::Serve);
            }
            assert_eq!(lc.due(now, remote, true, |_| true, &mut out), None);
        }
        now += 2 * MS;
        assert_eq!(lc.due(now, remote, true, |_| true, &mut out), Some(Release::Rotated));
        assert_eq!(out.len(), 1);
        assert!(
            now - out[0].since_ns <= SLICE_NS + 2 * MS,
            "a hold lasts one slice at most"
        );
        assert_eq!(lc.favoured(), Some(8), "the favour rotates to the thread held longest");
        assert_eq!(lc.fault(7, 2, now, remote), Verdict::Hold);
        lc.hold(7, now, 0x2000);
        // At the end of a slice with nothing held, load control ends.
        out.clear();
        now += SLICE_NS;
        assert_eq!(lc.due(now, remote, true, |_| true, &mut out), Some(Release::Rotated));
        assert_eq!(lc.favoured(), Some(7));
        now += SLICE_NS;
        assert_eq!(lc.due(now, remote, true, |_| true, &mut out), Some(Release::Off));
        assert_eq!(lc.favoured(), None);
        assert_eq!(lc.held(), 0);
    }

    #[test]
    fn a_favoured_thread_that_waits_releases_the_holds_at_once() {
        let (mut now, mut remote) = (0, 0);
        let mut lc = LoadControl::default();
        window(&mut lc, &[7, 8, 7], true, &mut now, &mut remote);
        assert_eq!(lc.favoured(), Some(7));
        assert_eq!(lc.fault(8, 1, now, remote), Verdict::Hold);
        lc.hold(8, now, 0x1000);
        let mut out = Vec::new();
        // Not yet: the favoured thread faulted just now, or something is still queued.
        assert_eq!(lc.due(now + MS, remote, true, |_| false, &mut out), None);
        assert_eq!(lc.due(now + 3 * MS, remote, false, |_| false, &mut out), None);
        // Running: it computes, the hold stays.
        assert_eq!(lc.due(now + 3 * MS, remote, true, |_| true, &mut out), None);
        // Asleep (waiting for the lock thread 8 holds): released within a stall.
        assert_eq!(
            lc.due(now + 5 * MS, remote, true, |_| false, &mut out),
            Some(Release::Stalled)
        );
        assert_eq!(out.len(), 1);
        assert_eq!(lc.favoured(), Some(8));
        // That stall came right after the favour moved to thread 7 (load control engaged), and
        // thread 8 now waits at once for thread 7 in turn (a mutex around every few faults):
        // two quick stalls in a row end load control.
        now += 5 * MS;
        assert_eq!(lc.fault(7, 2, now, remote), Verdict::Hold);
        lc.hold(7, now, 0x3000);
        out.clear();
        assert_eq!(
            lc.due(now + 3 * MS, remote, true, |_| false, &mut out),
            Some(Release::Off)
        );
        assert_eq!((out.len(), lc.favoured(), lc.held()), (1, None, 0));
        // Resting: a thrashing window does not engage it again at once.
        let mut t = now + 8 * MS;
        window(&mut lc, &[7, 8], true, &mut t, &mut remote);
        assert_eq!(lc.favoured(), None);
    }

    #[test]
    fn a_favoured_thread_running_without_faults_releases_the_holds() {
        let (mut now, mut remote) = (0, 0);
        let mut lc = LoadControl::default();
        window(&mut lc, &[7, 8, 7], true, &mut now, &mut remote);
        assert_eq!(lc.favoured(), Some(7));
        assert_eq!(lc.fault(8, 1, now, remote), Verdict::Hold);
        lc.hold(8, now, 0x1000);
        let mut out = Vec::new();
        // Running (computing, or spinning at a barrier for thread 8): held a while.
        let mut t = now;
        while t < now + IDLE_FAVOUR_NS - MS {
            t += MS;
            assert_eq!(lc.due(t, remote, true, |_| true, &mut out), None);
        }
        // Then released, well within the slice.
        t += 2 * MS;
        assert_eq!(lc.due(t, remote, true, |_| true, &mut out), Some(Release::Stalled));
        assert_eq!((out.len(), lc.favoured()), (1, Some(8)));
    }

    #[test]
    fn favour_that_does_not_help_backs_off() {
        let (mut now, mut remote) = (0, 0);
        let mut lc = LoadControl::default();
        window(&mut lc, &[7, 7, 8], true, &mut now, &mut remote);
        assert_eq!(lc.favoured(), Some(7));
        let start = now;
        let mut out = Vec::new();
        // Thread 7 faults at the same rate all slice long: its working set does not fit alone.
        while now < start + SLICE_NS {
            now += MS / 4;
            remote += 1;
            assert_eq!(lc.fault(7, 2, now, remote), Verdict::Serve);
        }
        assert_eq!(lc.fault(8, 1, now, remote), Verdict::Hold);
        lc.hold(8, now, 0x1000);
        now += MS;
        assert_eq!(lc.due(now, remote, true, |_| true, &mut out), Some(Release::Off));
        assert_eq!(out.len(), 1);
        assert_eq!(lc.favoured(), None);
        // Resting: thrashing windows do not engage it again until the back-off ends.
        while now < start + SLICE_NS + BACKOFF_NS {
            window(&mut lc, &[7, 8], true, &mut now, &mut remote);
            if now < start + SLICE_NS + BACKOFF_NS {
                assert_eq!(lc.favoured(), None);
            }
        }
        window(&mut lc, &[7, 8], true, &mut now, &mut remote);
        assert!(
            lc.favoured().is_some(),
            "after the back-off, thrashing engages it again"
        );
    }

    #[test]
    fn holds_are_bounded_in_number() {
        let (mut now, mut remote) = (0, 0);
        let mut lc = LoadControl::default();
        window(&mut lc, &[7, 8], true, &mut now, &mut remote);
        for t in 0..MAX_HELD as u32 {
            assert_eq!(lc.fault(100 + t, 3, now, remote), Verdict::Hold);
            lc.hold(100 + t, now, 0x1000);
        }
        assert_eq!(
            lc.fault(999, 4, now, remote),
            Verdict::Serve,
            "past the bound a fault is served"
        );
        let mut out = Vec::new();
        lc.stop(&mut out);
        assert_eq!(out.len(), MAX_HELD);
        assert_eq!(lc.favoured(), None);
    }

    #[test]
    fn this_thread_is_running() {
        assert!(thread_running(crate::sys::this_thread_id()));
        assert!(!thread_running(u32::MAX), "a thread that is gone is not running");
    }
}
