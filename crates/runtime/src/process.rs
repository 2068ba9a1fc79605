//! Process-wide state: the one runtime of this process, the window's bounds for lock-free
//! checks, which threads are the runtime's, and the calls in progress that `fork` waits for.

use crate::Runtime;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

static GLOBAL: RwLock<Option<Arc<Runtime>>> = RwLock::new(None);

static WINDOW_START: AtomicU64 = AtomicU64::new(0);

static WINDOW_END: AtomicU64 = AtomicU64::new(0);

/// Threads currently inside an allocation call; `fork` waits for zero (see `fork_prepare`).
pub(crate) static ACTIVE_CALLS: AtomicUsize = AtomicUsize::new(0);

pub(crate) static FORKING: AtomicBool = AtomicBool::new(false);

thread_local! {
    pub(crate) static RUNTIME_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runtime threads created but not yet marked as such (see [`spawning_runtime_thread`]).
pub(crate) static SPAWNING: AtomicUsize = AtomicUsize::new(0);

/// True while a runtime thread is being started: the C library and Rust's thread set-up allocate
/// on the new thread before it can mark itself (`is_runtime_thread`), so an interposer that must
/// keep runtime threads off the program's allocator treats every allocation in that short
/// window as the runtime's. The thread that starts the runtime waits until each new thread has
/// marked itself; the program's other threads may still allocate in the window, so an
/// interposer should hand their allocations to the program's allocator if its own table is full.
pub fn spawning_runtime_thread() -> bool {
    SPAWNING.load(Ordering::Acquire) != 0
}

/// True on the runtime's own threads (handler, write-back, watchdog): their allocations must
/// stay local, or a thread could fault on memory only it can serve.
pub fn is_runtime_thread() -> bool {
    RUNTIME_THREAD.with(|f| f.get())
}

/// The process's runtime, if one was started.
pub fn global() -> Option<Arc<Runtime>> {
    GLOBAL.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Installs `rt` as the process's runtime.
pub fn set_global(rt: Arc<Runtime>) {
    let (s, e) = (
        rt.inner.window.addr() as u64,
        (rt.inner.window.addr() + rt.inner.window.len()) as u64,
    );
    WINDOW_START.store(s, Ordering::Release);
    WINDOW_END.store(e, Ordering::Release);
    *GLOBAL.write().unwrap_or_else(|e| e.into_inner()) = Some(rt);
}

/// Leaves the process without a runtime, keeping the window's bounds known so that `free` of a
/// window pointer is still recognised (and ignored). Used in a forked child that cannot have
/// its parent's remote memory; the caller keeps the old runtime alive (its destructors would
/// act on the parent's connections).
pub(crate) fn clear_global() {
    *GLOBAL.write().unwrap_or_else(|e| e.into_inner()) = None;
}

/// True if `addr` lies in the window (a lock-free check for `free` of any pointer).
pub fn in_window(addr: usize) -> bool {
    let a = addr as u64;
    a >= WINDOW_START.load(Ordering::Acquire) && a < WINDOW_END.load(Ordering::Acquire)
}

/// The window's first address (0 before a runtime started): allocators that carve their own
/// blocks from window allocations index them by their offset in the window.
pub fn window_start() -> usize {
    WINDOW_START.load(Ordering::Acquire) as usize
}

/// Bytes of shared anonymous memory the program mapped in pieces of at least the threshold: it
/// stays local (a userfaultfd serves one process's private pages; a shared page has no single
/// owner to evict it for), and the user is told so.
static SHARED_LOCAL: AtomicU64 = AtomicU64::new(0);

/// Counts `bytes` of shared memory that stays local; returns the total so far.
pub fn note_shared_local(bytes: u64) -> u64 {
    SHARED_LOCAL.fetch_add(bytes, Ordering::Relaxed) + bytes
}

/// Shared memory mapped so far that stays local, in bytes (see [`note_shared_local`]).
pub fn shared_local_bytes() -> u64 {
    SHARED_LOCAL.load(Ordering::Relaxed)
}

/// Marks a call into the runtime from a program thread, so `fork` can wait until no thread holds
/// a runtime lock (the child would inherit it locked).
pub struct CallGuard(());

impl CallGuard {
    /// Enters; waits while a fork is being prepared.
    pub fn enter() -> CallGuard {
        loop {
            while FORKING.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            if let Some(g) = CallGuard::try_enter() {
                return g;
            }
        }
    }

    /// Enters unless a fork is being prepared (`None`: skip the work). For the runtime's own
    /// threads that take the pager core's lock on their own schedule (the watchdog): a fork
    /// waits for them to leave, so the child never inherits the lock held by a thread it does
    /// not have.
    pub fn try_enter() -> Option<CallGuard> {
        ACTIVE_CALLS.fetch_add(1, Ordering::SeqCst);
        if !FORKING.load(Ordering::SeqCst) {
            return Some(CallGuard(()));
        }
        ACTIVE_CALLS.fetch_sub(1, Ordering::AcqRel);
        None
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        ACTIVE_CALLS.fetch_sub(1, Ordering::AcqRel);
    }
}
