//! `librackmem.so`: makes an unmodified program use remote memory when loaded with `LD_PRELOAD`.
//!
//! It interposes the malloc family and private anonymous `mmap` (with `munmap`, `mremap`,
//! `mprotect`, `madvise`): requests of at least the threshold (`RACKMEM_THRESHOLD`, 1 MiB by
//! default) are placed in the rackmem window; smaller blocks come from the window too when the
//! program's allocator is glibc's (`heap`, once glibc has handed out the first MiB), and
//! otherwise go to the program's own allocator (a jemalloc, tcmalloc or mimalloc it links or
//! preloads: see `family`). Those
//! allocators and language runtimes take their memory with anonymous `mmap`, reserving with
//! `PROT_NONE` and committing with `mprotect` or `MAP_FIXED`, so their large mappings land in
//! the window too.
//!
//! Rules this shim keeps, because it runs inside every allocation of someone else's program:
//! - no recursion: Rust code in this library allocates from glibc's allocator, looked up in
//!   `libc.so.6` itself (the global allocator below), never through the interposed symbols; the
//!   runtime's own threads always get local memory;
//! - safe before `main` and across threads: the runtime starts in a constructor or at the first
//!   large allocation, whichever comes first; allocations that race with start-up go local;
//! - `fork` keeps copy semantics through `pthread_atfork` hooks (see `rackmem_runtime::fork_*`);
//! - a pointer is remote iff it lies in the window, so `free` of anything else is passed on.
//!
//! This crate is the C ABI boundary: every `unsafe` block is in it, each with its reason. This
//! file holds start-up, the re-entrancy guard and the global allocator; the interposers are in
//! `malloc` (the malloc family, with jemalloc's extended API), `mapping` (the mmap family) and
//! `fork` (the `pthread_atfork` hooks), the functions of `include/rackmem.h` in `api` (and the
//! one-sided segments, put/get and atomics in `putget`), the
//! lookup of the program's allocator in `family`, and the small-block heap in `heap`.

// The interposed symbols are the C library's own (malloc(3), mmap(2), ...): their contract is POSIX's.
#![allow(clippy::missing_safety_doc, missing_docs)]

use libc::{c_int, c_void};
use rackmem_runtime::{config::Config, sys, Runtime};
use std::alloc::{GlobalAlloc, Layout};
use std::ptr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

mod affinity;
mod api;
mod family;
mod fork;
mod heap;
mod malloc;
mod mapping;
mod migrate;
mod putget;
use family::{libc_calloc, libc_free, libc_malloc, libc_memalign, libc_realloc};
use fork::{atfork_child, atfork_parent, atfork_prepare};

/// Rust allocations of this library go straight to glibc, never to the interposed `malloc`.
struct LibcAllocator;

// SAFETY: glibc's allocator returns memory valid for the requested size and alignment (memalign
// for large alignments) and accepts back exactly the pointers it returned.
unsafe impl GlobalAlloc for LibcAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain calls into glibc's allocator with a valid size/alignment.
        unsafe {
            if layout.align() <= 16 {
                libc_malloc(layout.size()) as *mut u8
            } else {
                libc_memalign(layout.align(), layout.size()) as *mut u8
            }
        }
    }
    unsafe fn dealloc(&self, p: *mut u8, _layout: Layout) {
        // SAFETY: `p` came from `alloc` above, i.e. from glibc.
        unsafe { libc_free(p as *mut c_void) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= 16 {
            // SAFETY: plain call into glibc.
            unsafe { libc_calloc(1, layout.size()) as *mut u8 }
        } else {
            // SAFETY: memalign returns `size` writable bytes or null.
            unsafe {
                let p = libc_memalign(layout.align(), layout.size()) as *mut u8;
                if !p.is_null() {
                    ptr::write_bytes(p, 0, layout.size());
                }
                p
            }
        }
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= 16 {
            // SAFETY: `p` came from glibc's malloc/calloc with alignment <= 16.
            unsafe { libc_realloc(p as *mut c_void, new_size) as *mut u8 }
        } else {
            // SAFETY: allocate, copy the smaller size, free the old block (all from glibc).
            unsafe {
                let n = libc_memalign(layout.align(), new_size) as *mut u8;
                if !n.is_null() {
                    ptr::copy_nonoverlapping(p, n, layout.size().min(new_size));
                    libc_free(p as *mut c_void);
                }
                n
            }
        }
    }
}

#[global_allocator]
static GLOBAL: LibcAllocator = LibcAllocator;

const UNINIT: u8 = 0;
const STARTING: u8 = 1;
const READY: u8 = 2;
const OFF: u8 = 3;
static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static THRESHOLD: AtomicU64 = AtomicU64::new(u64::MAX);

/// Set while this thread runs runtime code on behalf of an allocation call, so allocations
/// made by the C library underneath (name lookup, thread creation) stay local. Kept in the
/// heap's per-thread state: one thread-local access on the fast path instead of two.
pub(crate) fn inside() -> bool {
    heap::inside()
}

/// Configuration read at load time; the runtime itself starts at the first allocation that
/// wants the window, so processes that never make one (shells, `exec` wrappers) cost nothing.
static CONFIG: std::sync::Mutex<Option<Config>> = std::sync::Mutex::new(None);

fn load_config() {
    let _inside = Inside::enter();
    match Config::from_env() {
        Ok(Some(cfg)) => {
            THRESHOLD.store(cfg.threshold_bytes, Ordering::Release);
            // Small blocks go to the window unless asked not to (to compare, or to rule the
            // heap out when a program misbehaves under it), on agent memory too: a forked child
            // gets copy-on-write clones of its parent's segments there as well.
            let small = std::env::var("RACKMEM_SMALL_BLOCKS").unwrap_or_default();
            if !matches!(small.as_str(), "0" | "off" | "no" | "false") {
                let after = match std::env::var("RACKMEM_SMALL_BLOCKS_AFTER") {
                    Ok(v) => match rackmem_runtime::size::parse_size(&v) {
                        Ok(b) => b,
                        Err(e) => {
                            eprintln!("rackmem: bad configuration: RACKMEM_SMALL_BLOCKS_AFTER={v}: {e}");
                            sys::exit_immediately(sys::EXIT_RUNTIME_FAILED);
                        }
                    },
                    Err(_) => heap::SWITCH_BYTES,
                };
                heap::arm(after);
            }
            *CONFIG.lock().unwrap_or_else(|e| e.into_inner()) = Some(cfg);
        }
        Ok(None) => STATE.store(OFF, Ordering::Release),
        Err(e) => {
            eprintln!("rackmem: bad configuration: {e}");
            sys::exit_immediately(sys::EXIT_RUNTIME_FAILED);
        }
    }
}

fn start() {
    if STATE
        .compare_exchange(UNINIT, STARTING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let _inside = Inside::enter();
    let Some(cfg) = CONFIG.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        STATE.store(OFF, Ordering::Release);
        return;
    };
    match Runtime::start(cfg) {
        Ok(rt) => {
            rackmem_runtime::set_global(rt);
            // SAFETY: the hooks are plain `extern "C" fn()` with static lifetime.
            let rc = unsafe { libc::pthread_atfork(Some(atfork_prepare), Some(atfork_parent), Some(atfork_child)) };
            if rc != 0 {
                eprintln!("rackmem: pthread_atfork failed ({rc}); fork() would not keep copy semantics");
                sys::exit_immediately(sys::EXIT_RUNTIME_FAILED);
            }
            STATE.store(READY, Ordering::Release);
        }
        Err(e) => {
            eprintln!("rackmem: cannot start remote memory for this program: {e}");
            sys::exit_immediately(sys::EXIT_RUNTIME_FAILED);
        }
    }
}

/// The runtime, if it is up and this call may use it.
fn runtime() -> Option<Arc<Runtime>> {
    match STATE.load(Ordering::Acquire) {
        READY => {}
        UNINIT => {
            start();
            if STATE.load(Ordering::Acquire) != READY {
                return None;
            }
        }
        _ => return None,
    }
    if inside() || rackmem_runtime::is_runtime_thread() {
        return None;
    }
    rackmem_runtime::global()
}

#[inline]
pub(crate) fn wants_window(size: usize) -> bool {
    size as u64 >= THRESHOLD.load(Ordering::Acquire)
}

struct Inside;
impl Inside {
    fn enter() -> Inside {
        heap::set_inside(true);
        Inside
    }
}
impl Drop for Inside {
    fn drop(&mut self) {
        heap::set_inside(false);
    }
}

/// The runtime, if a request of `size` bytes goes to the window.
#[inline]
fn window_runtime(size: usize) -> Option<Arc<Runtime>> {
    if !wants_window(size) {
        return None;
    }
    let rt = runtime()?;
    ((size as u64) >= rt.config().threshold_bytes).then_some(rt)
}

fn get_errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() }
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

extern "C" fn on_load() {
    load_config();
}

extern "C" fn on_unload() {
    if let Some(rt) = rackmem_runtime::global() {
        rt.at_exit();
    }
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;
