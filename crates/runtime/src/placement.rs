//! Where the fault handler runs and how it waits, under `HandlerMode::Auto` (the default on
//! more than one CPU): decided from which threads fault, watched on the fault path itself.
//!
//! On 2-vCPU KVM guests a fault served by a handler on the faulting thread's CPU is a context
//! switch (9.4 µs), against 24 µs with a handler spinning on the other vCPU and 73 µs with one
//! sleeping there (waking a sleeping vCPU costs ~30 µs with halt polling off). So when one thread
//! does (nearly) all the faulting, the handler *follows* it: both are confined to the CPU that
//! thread was on, and the handler blocks, so a fault is a context switch on that CPU. When
//! several threads fault, the handler floats over the CPUs the program may use and spins a
//! little after each fault (hybrid), as it did before.
//!
//! Why the faulting thread is confined too: with the handler alone moved to its CPU, the
//! scheduler wakes the faulting thread, after each fault, on the other CPU (idle, while the
//! handler still runs on their shared one), and the pair chases each other across CPUs (measured:
//! one move per sampling window, no faster than a floating handler). Only the followed thread is
//! confined, and only while it is the one faulting thread: other threads keep their CPUs, and
//! the thread gets its own mask back when others fault, when faults stop for a second, when the
//! program starts a thread (which would inherit the confined mask: the watchdog looks on its
//! ticks, see [`watch`]) and before a fork (the child would inherit it).
//!
//! The confined thread is not told: `sched_getaffinity` and `pthread_getaffinity_np` (interposed
//! by `librackmem.so`) answer with its own mask while it is followed ([`program_mask`]). A
//! program sizes its thread pools from that mask when it starts, which is when a lone thread
//! faults most: Python importing NumPy, whose OpenBLAS then ran one thread on a 2-vCPU machine
//! for the whole run (half its speed; `docs/benchmarks.md`, "NumPy at 50%: where the time went").
//!
//! The faulting thread comes with each fault (`UFFD_FEATURE_THREAD_ID`). Its CPU is read from
//! `/proc/self/task/TID/stat` (field 39, the CPU it last ran on) when the handler decides to
//! follow it, at the end of a sampling window of [`WINDOW_FAULTS`] faults and at least
//! [`WINDOW_NS`], never per fault. Nothing here runs on a timer: an idle program costs nothing.

use crate::sys;
use rackmem_sys::process::{CpuMask, MASK_WORDS};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Faults per sampling window.
const WINDOW_FAULTS: u32 = 256;
/// Shortest sampling window: decisions (and `/proc` reads) at most 50 times a second.
const WINDOW_NS: u64 = 20_000_000;
/// Share of a window's faults one thread must have raised for the handler to follow it.
const SINGLE_SHARE: f64 = 0.9;
/// Threads counted apart in a window; the rest count as "others".
const TRACKED: usize = 4;

/// What the handler does between faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiting {
    /// On the faulting thread's CPU: sleep at once, so the faulting thread gets the CPU back.
    Block,
    /// Floating: spin this long after the last fault, then sleep.
    Spin { spin_us: u64 },
}

/// What a sampling window decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Follow this thread (it raised nearly all the window's faults).
    Follow(u32),
    /// Float: several threads fault.
    Float,
}

/// The handler's fault counts per thread (one per handler thread).
pub(crate) struct Placement {
    /// CPUs the handler may use when floating (its mask at start).
    allowed: Vec<usize>,
    /// Faults per thread in this window.
    counts: [(u32, u32); TRACKED],
    total: u32,
    window_start_ns: u64,
    /// Spin time when floating.
    spin_us: u64,
}

impl Placement {
    /// A placement for a handler that may run on `allowed` CPUs; `None` when there is nothing to
    /// choose (one CPU: the handler always shares it with the program).
    pub fn new(allowed: Vec<usize>, spin_us: u64) -> Option<Placement> {
        (allowed.len() > 1).then_some(Placement {
            allowed,
            counts: [(0, 0); TRACKED],
            total: 0,
            window_start_ns: 0,
            spin_us,
        })
    }

    /// The CPUs the handler floats over.
    pub fn allowed(&self) -> &[usize] {
        &self.allowed
    }

    /// How to wait now.
    pub fn waiting(&self) -> Waiting {
        if FOLLOWING.load(Ordering::Relaxed) {
            Waiting::Block
        } else {
            Waiting::Spin { spin_us: self.spin_us }
        }
    }

    /// Counts a fault by `thread_id` (0: unknown) at `now_ns`; at the end of a window, what to
    /// do.
    pub fn fault(&mut self, thread_id: u32, now_ns: u64) -> Option<Decision> {
        if self.total == 0 {
            self.window_start_ns = now_ns;
        }
        self.total += 1;
        match self.counts.iter_mut().find(|c| c.0 == thread_id && c.1 > 0) {
            Some(c) => c.1 += 1,
            None => {
                if let Some(c) = self.counts.iter_mut().find(|c| c.1 == 0) {
                    *c = (thread_id, 1);
                }
            }
        }
        if self.total < WINDOW_FAULTS || now_ns.saturating_sub(self.window_start_ns) < WINDOW_NS {
            return None;
        }
        let (tid, top) = self.counts.iter().copied().max_by_key(|c| c.1).unwrap_or((0, 0));
        let single = tid != 0 && f64::from(top) >= SINGLE_SHARE * f64::from(self.total);
        self.counts = [(0, 0); TRACKED];
        self.total = 0;
        Some(if single { Decision::Follow(tid) } else { Decision::Float })
    }
}

/// The thread the handler follows, and what to give back when it stops.
struct Follow {
    /// The followed thread.
    tid: u32,
    /// The CPU both are confined to.
    cpu: usize,
    /// The handler thread, and its mask when floating.
    handler_tid: u32,
    handler_cpus: Vec<usize>,
    /// The followed thread's own mask.
    saved: Vec<usize>,
    /// Threads that were confined to `cpu` alone before (the program's own choice): left alone.
    pinned_before: Vec<u32>,
    /// Threads of the process when following started (sorted).
    threads: Vec<u32>,
    /// Faults handled at the watchdog's last tick, and ticks since that number last changed.
    faults_seen: u64,
    quiet_ticks: u32,
}

static FOLLOW: Mutex<Option<Follow>> = Mutex::new(None);
/// When following last stopped because the program started a thread. A decision to follow
/// that the handler reached before the thread was born can arrive after the watchdog let go
/// (on a loaded machine the handler may wait for a CPU that long); it is refused for
/// [`SPAWN_FENCE`] so the followed thread does not stay confined for [`QUIET_TICKS`] ticks
/// after the program went multi-threaded.
static SPAWNED: Mutex<Option<std::time::Instant>> = Mutex::new(None);
/// How long after a thread was started a lone faulting thread is not followed: as long as a
/// followed thread would stay confined without faults, so no decision from before the start
/// outlives it.
const SPAWN_FENCE: std::time::Duration = std::time::Duration::from_millis(250 * QUIET_TICKS as u64);

fn note_spawn() {
    *SPAWNED.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now());
}

fn spawned_recently() -> bool {
    SPAWNED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_some_and(|at| at.elapsed() < SPAWN_FENCE)
}
/// Mirrors `FOLLOW.is_some()` for the handler's idle loop, which must not take a lock.
static FOLLOWING: AtomicBool = AtomicBool::new(false);

/// The followed thread (0: none) and its own mask, for [`program_mask`], which the program's
/// threads call and which must take no lock: the handler holds `FOLLOW` while it reads masks.
/// Written under `FOLLOW` only, between two steps of `MASK_SEQ` (odd while they change and
/// while the kernel's masks are being changed, so a reader never pairs a mask the kernel had
/// before a change with the state after it).
static MASK_TID: AtomicU32 = AtomicU32::new(0);
static MASK_SAVED: [AtomicU64; MASK_WORDS] = [const { AtomicU64::new(0) }; MASK_WORDS];
static MASK_SEQ: AtomicU64 = AtomicU64::new(0);
/// Tries of [`program_mask`] before it gives up waiting for a change to end.
const MASK_TRIES: u32 = 4096;

/// Begins a change of the followed thread's state or of the kernel's masks (`FOLLOW` held).
fn mask_change_begins() {
    MASK_SEQ.fetch_add(1, Ordering::SeqCst);
}

/// Ends it: readers from now on see the new state.
fn mask_change_ends() {
    MASK_SEQ.fetch_add(1, Ordering::SeqCst);
}

/// Records `tid` (0: none) as the followed thread, with its own mask (inside a change).
fn publish(tid: u32, saved: &[usize]) {
    let mask = rackmem_sys::process::cpus_mask(saved);
    for (w, v) in MASK_SAVED.iter().zip(mask) {
        w.store(v, Ordering::SeqCst);
    }
    MASK_TID.store(tid, Ordering::SeqCst);
}

/// What a program's affinity query about thread `tid` should answer: `read` asks the kernel
/// (the real call), and its result comes back with `Some(mask)` when `tid` is confined by the
/// handler (the answer must then be that mask, the thread's own), or `None` (the kernel's
/// answer is the program's). The kernel is asked inside a stretch where nothing changed, so the
/// two agree. A change takes a few system calls and a read of `/proc/self/task` (tens of
/// microseconds), and changes come at most every 20 ms; if one still holds after
/// [`MASK_TRIES`] yields, the kernel's answer is taken as it is.
pub fn program_mask<R>(tid: u32, mut read: impl FnMut() -> R) -> (R, Option<CpuMask>) {
    for _ in 0..MASK_TRIES {
        let before = MASK_SEQ.load(Ordering::SeqCst);
        if before % 2 == 1 {
            std::thread::yield_now();
            continue;
        }
        let r = read();
        let mask = (tid != 0 && MASK_TID.load(Ordering::SeqCst) == tid).then(|| {
            let mut m: CpuMask = [0; MASK_WORDS];
            for (v, w) in m.iter_mut().zip(&MASK_SAVED) {
                *v = w.load(Ordering::SeqCst);
            }
            m
        });
        if MASK_SEQ.load(Ordering::SeqCst) == before {
            return (r, mask);
        }
    }
    (read(), None)
}

fn follow_state() -> MutexGuard<'static, Option<Follow>> {
    FOLLOW.lock().unwrap_or_else(|e| e.into_inner())
}

/// The threads of this process.
fn threads() -> Vec<u32> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

/// The thread the handler follows now, if any.
pub(crate) fn followed() -> Option<u32> {
    follow_state().as_ref().map(|f| f.tid)
}

/// Confines thread `tid` and the calling handler thread (floating over `handler_cpus`) to the
/// CPU `tid` last ran on. Returns that CPU, or `None` if it cannot (the thread is gone, or its
/// own mask does not allow the CPU the handler may use).
pub(crate) fn follow(tid: u32, handler_cpus: &[usize]) -> Option<usize> {
    let mut state = follow_state();
    // A thread born since following began: stop, as the watchdog would, and do not follow
    // again from a decision that may predate it.
    if state
        .as_ref()
        .is_some_and(|f| threads().iter().any(|t| f.threads.binary_search(t).is_err()))
    {
        note_spawn();
    }
    release(&mut state);
    if spawned_recently() {
        return None;
    }
    let cpu = cpu_of_thread(tid).filter(|c| handler_cpus.contains(c))?;
    let saved = sys::thread_cpus(tid);
    if !saved.contains(&cpu) || saved.len() < 2 {
        // Already confined to one CPU by the program: then it needs no help to stay there.
        return None;
    }
    let mut all = threads();
    all.sort_unstable();
    let pinned_before = all.iter().copied().filter(|&t| sys::thread_cpus(t) == [cpu]).collect();
    // The thread's own mask is what it is told from before its confinement on.
    mask_change_begins();
    publish(tid, &saved);
    let confined = sys::set_thread_cpus(tid, &[cpu]);
    if !confined {
        publish(0, &[]);
    }
    mask_change_ends();
    if !confined {
        return None;
    }
    let handler_tid = sys::this_thread_id();
    if !sys::set_thread_cpus(0, &[cpu]) {
        mask_change_begins();
        sys::set_thread_cpus(tid, &saved);
        publish(0, &[]);
        mask_change_ends();
        return None;
    }
    *state = Some(Follow {
        tid,
        cpu,
        handler_tid,
        handler_cpus: handler_cpus.to_vec(),
        saved,
        pinned_before,
        threads: all,
        faults_seen: 0,
        quiet_ticks: 0,
    });
    FOLLOWING.store(true, Ordering::Relaxed);
    Some(cpu)
}

/// Stops following: the followed thread, any thread it started meanwhile (they inherited its
/// confined mask) and the handler get their masks back. True if it was following.
pub(crate) fn unfollow() -> bool {
    release(&mut follow_state())
}

fn release(state: &mut Option<Follow>) -> bool {
    let Some(f) = state.take() else {
        return false;
    };
    FOLLOWING.store(false, Ordering::Relaxed);
    // The thread is told its own mask until the kernel has it back.
    mask_change_begins();
    for t in threads() {
        if t == f.handler_tid {
            sys::set_thread_cpus(t, &f.handler_cpus);
        } else if (t == f.tid || !f.pinned_before.contains(&t)) && sys::thread_cpus(t) == [f.cpu] {
            // Confined by us (or born confined from the followed thread), not by the program.
            sys::set_thread_cpus(t, &f.saved);
        }
    }
    publish(0, &[]);
    mask_change_ends();
    true
}

/// Watchdog ticks without a fault after which a followed thread gets its mask back: the program
/// moved on to computing, where the scheduler should be free to place that thread.
const QUIET_TICKS: u32 = 4;

/// Called by the watchdog on its ticks (no timer of its own), with the faults handled so far.
/// Stops following when the program started a thread meanwhile (a thread id not there when
/// following began: it inherited the confined mask, and new threads must never be stuck on one
/// CPU) or when faults stopped for [`QUIET_TICKS`] ticks. The handler follows again if one
/// thread does the faulting again. True if it stopped following.
pub(crate) fn watch(faults: u64) -> bool {
    let mut state = follow_state();
    let Some(f) = state.as_mut() else {
        return false;
    };
    if faults != f.faults_seen {
        f.faults_seen = faults;
        f.quiet_ticks = 0;
    } else {
        f.quiet_ticks += 1;
    }
    if threads().iter().any(|t| f.threads.binary_search(t).is_err()) {
        note_spawn();
        return release(&mut state);
    }
    if f.quiet_ticks >= QUIET_TICKS {
        return release(&mut state);
    }
    false
}

/// The CPU thread `tid` of this process last ran on: field 39 of `/proc/self/task/TID/stat`.
pub(crate) fn cpu_of_thread(tid: u32) -> Option<usize> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // Field 2 (the command) is in parentheses and may hold spaces: count from after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3.
    rest.split_whitespace().nth(39 - 3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decide(p: &mut Placement, faults: &[(u32, u32)], now: &mut u64) -> Vec<Decision> {
        let mut out = Vec::new();
        for &(tid, n) in faults {
            for _ in 0..n {
                *now += 100_000;
                out.extend(p.fault(tid, *now));
            }
        }
        out
    }

    #[test]
    fn one_faulting_thread_is_followed_several_are_not() {
        let mut p = Placement::new(vec![0, 1], 200).expect("two CPUs");
        let mut now = 0;
        assert_eq!(decide(&mut p, &[(7, 256)], &mut now), vec![Decision::Follow(7)]);
        // 95% from one thread still counts as one.
        assert_eq!(
            decide(&mut p, &[(7, 243), (8, 13)], &mut now),
            vec![Decision::Follow(7)]
        );
        assert_eq!(decide(&mut p, &[(7, 128), (8, 128)], &mut now), vec![Decision::Float]);
        let many: Vec<(u32, u32)> = (1..=16).map(|t| (t, 16)).collect();
        assert_eq!(decide(&mut p, &many, &mut now), vec![Decision::Float]);
        // Unknown threads (no THREAD_ID) are never followed.
        assert_eq!(decide(&mut p, &[(0, 256)], &mut now), vec![Decision::Float]);
        assert!(Placement::new(vec![2], 50).is_none(), "one CPU: nothing to place");
    }

    #[test]
    fn a_window_lasts_long_enough() {
        let mut p = Placement::new(vec![0, 1], 200).expect("two CPUs");
        // 1,000 faults within 1 ms: no decision yet (decisions stay rare on fast faults).
        for i in 0..1000 {
            assert_eq!(p.fault(7, i * 1000), None);
        }
        assert_eq!(p.fault(7, WINDOW_NS + 1), Some(Decision::Follow(7)));
    }

    #[test]
    fn this_threads_cpu_is_readable() {
        let tid = sys::this_thread_id();
        assert!(tid > 0);
        assert!(cpu_of_thread(tid).is_some());
    }
}
