//! `librackmem.so`: makes an unmodified program use remote memory when loaded with `LD_PRELOAD`.
//!
//! It interposes the malloc family and private anonymous `mmap` (with `munmap`, `mremap`,
//! `mprotect`, `madvise`): requests of at least the threshold (`RACKMEM_THRESHOLD`, 1 MiB by
//! default) are placed in the rackmem window, smaller ones go to the program's own allocator
//! (glibc's, or a jemalloc, tcmalloc or mimalloc it links or preloads: see `family`). Those
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
//! This file is the C ABI boundary: every `unsafe` block is here, each with its reason.

// The interposed symbols are the C library's own (malloc(3), mmap(2), ...): their contract is POSIX's.
#![allow(clippy::missing_safety_doc, missing_docs)]

use libc::{c_int, c_void, off_t, size_t};
use rackmem_runtime::{config::Config, in_window, sys, CallGuard, Runtime};
use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

mod family;
use family::{libc_calloc, libc_free, libc_malloc, libc_memalign, libc_realloc};

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

thread_local! {
    /// Set while this thread runs runtime code on behalf of an allocation call, so allocations
    /// made by the C library underneath (name lookup, thread creation) stay local.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Configuration read at load time; the runtime itself starts at the first allocation that
/// wants the window, so processes that never make one (shells, `exec` wrappers) cost nothing.
static CONFIG: std::sync::Mutex<Option<Config>> = std::sync::Mutex::new(None);

fn load_config() {
    let _inside = Inside::enter();
    match Config::from_env() {
        Ok(Some(cfg)) => {
            THRESHOLD.store(cfg.threshold_bytes, Ordering::Release);
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
    if INSIDE.with(|f| f.get()) || rackmem_runtime::is_runtime_thread() {
        return None;
    }
    rackmem_runtime::global()
}

fn wants_window(size: usize) -> bool {
    size as u64 >= THRESHOLD.load(Ordering::Acquire)
}

struct Inside;
impl Inside {
    fn enter() -> Inside {
        INSIDE.with(|f| f.set(true));
        Inside
    }
}
impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|f| f.set(false));
    }
}

/// A malloc-family block of `size` bytes in the window, if it is large enough to go there.
fn window_alloc(size: usize, align: usize) -> Option<*mut c_void> {
    let rt = window_runtime(size)?;
    let _call = CallGuard::enter();
    let _inside = Inside::enter();
    rt.alloc_block(size, align).map(|a| a as *mut c_void)
}

/// The runtime, if a request of `size` bytes goes to the window.
fn window_runtime(size: usize) -> Option<Arc<Runtime>> {
    if !wants_window(size) {
        return None;
    }
    let rt = runtime()?;
    ((size as u64) >= rt.config().threshold_bytes).then_some(rt)
}

/// True if `p` is a window block of the malloc family (not a block the program's allocator
/// carved from one of its mappings in the window).
fn is_window_block(p: *const c_void) -> bool {
    in_window(p as usize) && rackmem_runtime::global().is_some_and(|rt| rt.is_block(p as usize))
}

/// Frees `p` if it is a window block; false otherwise.
fn window_release(p: *mut c_void) -> bool {
    if !in_window(p as usize) {
        return false;
    }
    let Some(rt) = rackmem_runtime::global() else {
        // A forked child without its parent's window: nothing to free, nothing to pass on.
        return true;
    };
    let _call = CallGuard::enter();
    let _inside = Inside::enter();
    if !rt.is_block(p as usize) {
        return false;
    }
    if let Some((start, len)) = rt.region_of(p as usize) {
        rt.release(start, len);
    }
    true
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// The program's allocator, or `None` while it is being looked up (see [`family`]).
fn local() -> Option<&'static family::Next> {
    family::next()
}

/// True when this call comes from the runtime itself and the program's allocator is not glibc:
/// the C library's allocations for the runtime then stay in glibc (see
/// `family::internal_malloc`).
fn internal(n: &family::Next) -> bool {
    !n.glibc
        && (INSIDE.with(|f| f.get())
            || rackmem_runtime::is_runtime_thread()
            || rackmem_runtime::spawning_runtime_thread())
}

/// A local block from the program's allocator, or from the bootstrap arena during the lookup.
fn local_malloc(size: usize) -> *mut c_void {
    match local() {
        Some(n) if internal(n) => family::internal_malloc(size, false),
        // SAFETY: malloc(3) of the program's allocator.
        Some(n) => unsafe { n.malloc(size) },
        None => family::arena_alloc(size, 16),
    }
}

/// Frees a block that is not in the window: bootstrap blocks are ignored, others go back to
/// the program's allocator.
fn local_free(p: *mut c_void) {
    if p.is_null() || family::in_arena(p) {
        return;
    }
    if family::untrack(p) {
        // SAFETY: a tracked block came from glibc.
        unsafe { libc_free(p) };
        return;
    }
    if let Some(n) = local() {
        // SAFETY: `p` came from the program's allocator (the only other source of pointers).
        unsafe { n.free(p) }
    }
}

/// Usable bytes of a block that is not in the window.
fn local_usable_size(p: *mut c_void) -> usize {
    if family::in_arena(p) {
        return family::arena_size(p);
    }
    if family::is_tracked(p) {
        return family::glibc_usable_size(p);
    }
    match local() {
        // SAFETY: `p` is a live block of the program's allocator.
        Some(n) => unsafe { n.usable_size(p) },
        None => 0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    if let Some(p) = window_alloc(size, 16) {
        return p;
    }
    local_malloc(size)
}

#[no_mangle]
pub unsafe extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    };
    // Window memory reads as zeros (fresh or released regions are empty pages).
    if let Some(p) = window_alloc(total, 16) {
        return p;
    }
    match local() {
        Some(a) if internal(a) => family::internal_malloc(total, true),
        // SAFETY: calloc(3) of the program's allocator.
        Some(a) => unsafe { a.calloc(n, size) },
        // The arena is zero-initialised and never reused.
        None => family::arena_alloc(total, 16),
    }
}

#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() || window_release(p) {
        return;
    }
    local_free(p)
}

#[no_mangle]
pub unsafe extern "C" fn cfree(p: *mut c_void) {
    // SAFETY: same contract as free.
    unsafe { free(p) }
}

#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> size_t {
    if p.is_null() {
        return 0;
    }
    if is_window_block(p) {
        return rackmem_runtime::global()
            .and_then(|rt| rt.usable_size(p as usize))
            .unwrap_or(0);
    }
    local_usable_size(p)
}

/// Moves a window block to a new block of `size` bytes made by `alloc` (window or local),
/// copying what fits; null (and `p` untouched) if the new block cannot be had.
fn window_move(p: *mut c_void, size: usize, alloc: impl FnOnce() -> *mut c_void) -> *mut c_void {
    let Some(rt) = rackmem_runtime::global() else {
        return ptr::null_mut();
    };
    let old = {
        let _call = CallGuard::enter();
        let _inside = Inside::enter();
        if rt.resize_in_place(p as usize, size) {
            return p;
        }
        rt.usable_size(p as usize).unwrap_or(0)
    };
    let n = alloc();
    if n.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: `p` has `old` readable bytes, `n` has `size` writable bytes; distinct blocks.
    unsafe { ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, old.min(size)) };
    window_release(p);
    n
}

/// Moves a local block to a window block of `size` bytes; `None` if the window declines.
fn local_to_window(p: *mut c_void, size: usize, align: usize) -> Option<*mut c_void> {
    let n = window_alloc(size, align)?;
    let old = local_usable_size(p);
    // SAFETY: `p` is a live local block of `old` usable bytes; `n` has `size` bytes.
    unsafe { ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, old.min(size)) };
    local_free(p);
    Some(n)
}

#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: size_t) -> *mut c_void {
    if p.is_null() {
        // SAFETY: same contract as malloc.
        return unsafe { malloc(size) };
    }
    if size == 0 && !family::in_arena(p) && !is_window_block(p) && !family::is_tracked(p) {
        return match local() {
            // SAFETY: the program's allocator gives realloc(p, 0) its own meaning.
            Some(n) => unsafe { n.realloc(p, 0) },
            None => ptr::null_mut(),
        };
    }
    if size == 0 {
        // SAFETY: same contract as free; glibc's realloc(p, 0) frees and returns NULL.
        unsafe { free(p) };
        return ptr::null_mut();
    }
    if is_window_block(p) {
        // SAFETY: same contract as malloc.
        return window_move(p, size, || unsafe { malloc(size) });
    }
    if wants_window(size) || family::in_arena(p) {
        if let Some(n) = local_to_window(p, size, 16) {
            return n;
        }
    }
    if family::is_tracked(p) {
        return family::internal_realloc(p, size);
    }
    if family::in_arena(p) {
        let n = local_malloc(size);
        if !n.is_null() {
            // SAFETY: the arena block has arena_size(p) bytes; `n` has `size`.
            unsafe { ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, family::arena_size(p).min(size)) };
        }
        return n;
    }
    match local() {
        // SAFETY: `p` is a block of the program's allocator.
        Some(n) => unsafe { n.realloc(p, size) },
        None => ptr::null_mut(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    };
    if p.is_null() || is_window_block(p) || family::in_arena(p) || family::is_tracked(p) || wants_window(total) {
        // SAFETY: same contract as realloc.
        return unsafe { realloc(p, total) };
    }
    match local() {
        // SAFETY: `p` is a block of the program's allocator.
        Some(a) => unsafe { a.reallocarray(p, n, size) },
        None => ptr::null_mut(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: size_t, size: size_t) -> c_int {
    if !align.is_power_of_two() || align % std::mem::size_of::<*mut c_void>() != 0 {
        return libc::EINVAL;
    }
    if let Some(p) = window_alloc(size, align.max(16)) {
        // SAFETY: the caller passes a valid out-pointer.
        unsafe { *out = p };
        return 0;
    }
    match local() {
        Some(n) if internal(n) => {
            let p = family::internal_memalign(align, size);
            if p.is_null() {
                return libc::ENOMEM;
            }
            // SAFETY: the caller passes a valid out-pointer.
            unsafe { *out = p };
            0
        }
        // SAFETY: posix_memalign(3) of the program's allocator, with the caller's out-pointer.
        Some(n) => unsafe { n.posix_memalign(out, align, size) },
        None => {
            let p = family::arena_alloc(size, align);
            if p.is_null() {
                return libc::ENOMEM;
            }
            // SAFETY: the caller passes a valid out-pointer.
            unsafe { *out = p };
            0
        }
    }
}

/// One of the aligned allocation calls: the window for large sizes, else `local`.
fn aligned(align: usize, size: usize, local_call: impl FnOnce(&'static family::Next) -> *mut c_void) -> *mut c_void {
    if let Some(p) = window_alloc(size, align.max(16)) {
        return p;
    }
    match local() {
        Some(n) if internal(n) => family::internal_memalign(align, size),
        Some(n) => local_call(n),
        None => family::arena_alloc(size, align),
    }
}

#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: aligned_alloc(3) of the program's allocator.
    aligned(align, size, |n| unsafe { n.aligned_alloc(align, size) })
}

#[no_mangle]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: memalign(3) of the program's allocator.
    aligned(align, size, |n| unsafe { n.memalign(align, size) })
}

#[no_mangle]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    // SAFETY: valloc(3) of the program's allocator.
    aligned(4096, size, |n| unsafe { n.valloc(size) })
}

#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    let rounded = size.div_ceil(4096).max(1) * 4096;
    // SAFETY: pvalloc(3) of the program's allocator.
    aligned(4096, rounded, |n| unsafe { n.pvalloc(size) })
}

// jemalloc's extended API (mallocx(3)). A program calls these only when it links jemalloc, and
// a window pointer from `malloc` may reach any of them. Flags: the low 6 bits are lg(align)
// (MALLOCX_LG_ALIGN), 0x40 is MALLOCX_ZERO (window memory reads as zeros anyway); the tcache
// and arena bits only matter to jemalloc's own blocks.
const MALLOCX_LG_ALIGN_MASK: c_int = 0x3f;

fn mallocx_align(flags: c_int) -> usize {
    (1usize << (flags & MALLOCX_LG_ALIGN_MASK)).max(16)
}

#[no_mangle]
pub unsafe extern "C" fn mallocx(size: size_t, flags: c_int) -> *mut c_void {
    if let Some(p) = window_alloc(size, mallocx_align(flags)) {
        return p;
    }
    match local().and_then(|n| n.mallocx) {
        // SAFETY: jemalloc's mallocx with the caller's arguments.
        Some(f) => unsafe { f(size, flags) },
        None => ptr::null_mut(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rallocx(p: *mut c_void, size: size_t, flags: c_int) -> *mut c_void {
    let align = mallocx_align(flags);
    if is_window_block(p) {
        // SAFETY: same contract as mallocx.
        return window_move(p, size, || unsafe { mallocx(size, flags) });
    }
    if wants_window(size) {
        if let Some(n) = window_alloc(size, align) {
            // SAFETY: same contract as sallocx on a live jemalloc block.
            let old = unsafe { sallocx(p, 0) };
            // SAFETY: `p` has `old` bytes, `n` has `size`.
            unsafe { ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, old.min(size)) };
            // SAFETY: same contract as dallocx on a live jemalloc block.
            unsafe { dallocx(p, 0) };
            return n;
        }
    }
    match local().and_then(|n| n.rallocx) {
        // SAFETY: jemalloc's rallocx with the caller's arguments.
        Some(f) => unsafe { f(p, size, flags) },
        None => ptr::null_mut(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn xallocx(p: *mut c_void, size: size_t, extra: size_t, flags: c_int) -> size_t {
    if is_window_block(p) {
        let Some(rt) = rackmem_runtime::global() else {
            return 0;
        };
        let _call = CallGuard::enter();
        let _inside = Inside::enter();
        let old = rt.usable_size(p as usize).unwrap_or(0);
        // Grow in place only (xallocx never moves); never shrink below the current contents
        // beyond what the caller asked.
        let want = size.saturating_add(extra);
        if want > old && !rt.resize_in_place(p as usize, want) && size > old {
            rt.resize_in_place(p as usize, size);
        }
        return rt.usable_size(p as usize).unwrap_or(old);
    }
    match local().and_then(|n| n.xallocx) {
        // SAFETY: jemalloc's xallocx with the caller's arguments.
        Some(f) => unsafe { f(p, size, extra, flags) },
        None => 0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn sallocx(p: *const c_void, flags: c_int) -> size_t {
    if is_window_block(p) {
        return rackmem_runtime::global()
            .and_then(|rt| rt.usable_size(p as usize))
            .unwrap_or(0);
    }
    if family::in_arena(p) {
        return family::arena_size(p);
    }
    match local().and_then(|n| n.sallocx) {
        // SAFETY: jemalloc's sallocx with the caller's arguments.
        Some(f) => unsafe { f(p, flags) },
        None => 0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn dallocx(p: *mut c_void, flags: c_int) {
    if p.is_null() || window_release(p) || family::in_arena(p) {
        return;
    }
    if let Some(f) = local().and_then(|n| n.dallocx) {
        // SAFETY: jemalloc's dallocx with the caller's arguments.
        unsafe { f(p, flags) }
    }
}

#[no_mangle]
pub unsafe extern "C" fn sdallocx(p: *mut c_void, size: size_t, flags: c_int) {
    if p.is_null() || window_release(p) || family::in_arena(p) {
        return;
    }
    if let Some(f) = local().and_then(|n| n.sdallocx) {
        // SAFETY: jemalloc's sdallocx with the caller's arguments.
        unsafe { f(p, size, flags) }
    }
}

fn raw_mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    // SAFETY: the mmap system call with the caller's arguments, as glibc's wrapper would make it.
    unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void }
}

fn syscall_result(r: libc::c_long) -> libc::c_long {
    if (-4095..0).contains(&r) {
        set_errno(-r as c_int);
        -1
    } else {
        r
    }
}

#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    let private_anon = flags & (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_SHARED)
        == (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
    let fixed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0;
    let special = libc::MAP_GROWSDOWN | libc::MAP_HUGETLB | libc::MAP_STACK;
    if fixed && in_window(addr as usize) {
        if let Some(rt) = rackmem_runtime::global() {
            let _call = CallGuard::enter();
            let _inside = Inside::enter();
            if private_anon && flags & special == 0 {
                // Commit, decommit or fresh pages inside the window (JVM, V8, mimalloc).
                let noreplace = flags & libc::MAP_FIXED == 0;
                return match rt.map_fixed(addr as usize, len, prot, noreplace) {
                    Ok(a) => a as *mut c_void,
                    Err(e) => {
                        if e != libc::EEXIST {
                            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                            family::say_once(
                                &SAID,
                                "rackmem: warning: an mmap(MAP_FIXED) over window memory failed (the window could not back it); the program sees ENOMEM\n",
                            );
                        }
                        set_errno(e);
                        libc::MAP_FAILED
                    }
                };
            }
            // A file or shared mapping into a reserved window range (a JVM's class-data
            // archive): the range leaves the window, then the kernel maps it.
            if let Err(e) = rt.lend(addr as usize, len) {
                set_errno(e);
                return libc::MAP_FAILED;
            }
        }
    } else if private_anon && !fixed && flags & special == 0 {
        // Any protection: reservations (PROT_NONE) go to the window too, and a hint is honoured
        // when it names free window space, ignored otherwise.
        if let Some(rt) = window_runtime(len) {
            let _call = CallGuard::enter();
            let _inside = Inside::enter();
            if let Some(p) = rt.map(addr as usize, len, prot) {
                return p as *mut c_void;
            }
        }
    }
    let r = raw_mmap(addr, len, prot, flags, fd, off) as libc::c_long;
    syscall_result(r) as *mut c_void
}

#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: same contract as mmap (off_t is 64-bit here).
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    if in_window(addr as usize) {
        if let Some(rt) = rackmem_runtime::global() {
            let _call = CallGuard::enter();
            let _inside = Inside::enter();
            rt.release(addr as usize, len);
        }
        return 0;
    }
    // SAFETY: the munmap system call with the caller's arguments.
    let r = unsafe { libc::syscall(libc::SYS_munmap, addr, len) };
    syscall_result(r) as c_int
}

/// `mremap` is variadic in C (the fifth argument exists with `MREMAP_FIXED`). Rust cannot define
/// C-variadic functions on stable, so the fifth argument is declared: on the x86-64 and AArch64
/// Linux ABIs the integer arguments of a variadic call travel in the same registers as fixed
/// ones, and it is only read when the flags say it was passed.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    if !in_window(old as usize) {
        let na = if flags & libc::MREMAP_FIXED != 0 {
            new_addr
        } else {
            ptr::null_mut()
        };
        // SAFETY: the mremap system call with the caller's arguments.
        let r = unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, na) };
        return syscall_result(r) as *mut c_void;
    }
    let Some(rt) = rackmem_runtime::global() else {
        set_errno(libc::EFAULT);
        return libc::MAP_FAILED;
    };
    if flags & libc::MREMAP_FIXED != 0 {
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    }
    {
        let _call = CallGuard::enter();
        let _inside = Inside::enter();
        if rt.resize_in_place(old as usize, new_len) {
            return old;
        }
    }
    if flags & libc::MREMAP_MAYMOVE == 0 {
        set_errno(libc::ENOMEM);
        return libc::MAP_FAILED;
    }
    // SAFETY: a fresh mapping of new_len bytes (window or local), contents copied, old released.
    unsafe {
        let n = mmap(
            ptr::null_mut(),
            new_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if n == libc::MAP_FAILED {
            return n;
        }
        ptr::copy_nonoverlapping(old as *const u8, n as *mut u8, old_len.min(new_len));
        munmap(old, old_len);
        n
    }
}

#[no_mangle]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: size_t, prot: c_int) -> c_int {
    let plain = prot & !(libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) == 0;
    if plain && in_window(addr as usize) {
        if let Some(rt) = rackmem_runtime::global() {
            let _call = CallGuard::enter();
            let _inside = Inside::enter();
            if !rt.is_lent(addr as usize) {
                return match rt.protect(addr as usize, len, prot) {
                    Ok(()) => 0,
                    Err(e) => {
                        set_errno(e);
                        -1
                    }
                };
            }
        }
    }
    // SAFETY: the mprotect system call with the caller's arguments.
    let r = unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) };
    syscall_result(r) as c_int
}

#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    let lent = in_window(addr as usize) && rackmem_runtime::global().is_some_and(|rt| rt.is_lent(addr as usize));
    if in_window(addr as usize) && !lent {
        if matches!(advice, libc::MADV_DONTNEED | libc::MADV_FREE | libc::MADV_REMOVE) {
            if let Some(rt) = rackmem_runtime::global() {
                let _call = CallGuard::enter();
                let _inside = Inside::enter();
                rt.dontneed(addr as usize, len);
            }
        }
        // Other advice (huge pages, fork behaviour, read-ahead) does not apply to the window.
        return 0;
    }
    // SAFETY: the madvise system call with the caller's arguments.
    let r = unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) };
    syscall_result(r) as c_int
}

extern "C" fn atfork_prepare() {
    INSIDE.with(|f| f.set(true));
    rackmem_runtime::fork_prepare();
}

extern "C" fn atfork_parent() {
    rackmem_runtime::fork_parent();
    INSIDE.with(|f| f.set(false));
}

extern "C" fn atfork_child() {
    rackmem_runtime::fork_child();
    INSIDE.with(|f| f.set(false));
}

extern "C" fn on_load() {
    load_config();
}

extern "C" fn on_unload() {
    if let Some(rt) = rackmem_runtime::global() {
        rt.write_stats();
    }
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;

/// Statistics for `rackmem_get_stats` (see `include/rackmem.h`).
#[repr(C)]
pub struct RackmemStats {
    /// Page faults handled.
    pub faults: u64,
    /// Bytes fetched from bricks for faulting pages.
    pub bytes_fetched: u64,
    /// Bytes fetched ahead of use.
    pub bytes_prefetched: u64,
    /// Bytes written back to bricks.
    pub bytes_written_back: u64,
    /// Pages evicted from the local buffer.
    pub evictions: u64,
    /// Resident bytes now.
    pub resident_bytes: u64,
    /// Largest resident bytes seen.
    pub peak_resident_bytes: u64,
    /// Local buffer budget now.
    pub budget_bytes: u64,
    /// Window bytes allocated now.
    pub window_bytes_allocated: u64,
    /// Median handler fault service time, ns.
    pub fault_p50_ns: u64,
    /// 99th percentile handler fault service time, ns.
    pub fault_p99_ns: u64,
}

/// Allocates `size` bytes of remote memory regardless of the threshold; NULL if rackmem is off.
#[no_mangle]
pub extern "C" fn rackmem_alloc(size: size_t) -> *mut c_void {
    let Some(rt) = runtime() else {
        return ptr::null_mut();
    };
    let _call = CallGuard::enter();
    let _inside = Inside::enter();
    rt.alloc_block(size, 4096).map_or(ptr::null_mut(), |a| a as *mut c_void)
}

/// Frees memory from `rackmem_alloc` (or any window allocation).
#[no_mangle]
pub extern "C" fn rackmem_free(p: *mut c_void) {
    window_release(p);
}

/// 1 if `p` points into remote memory, 0 otherwise.
#[no_mangle]
pub extern "C" fn rackmem_is_remote(p: *const c_void) -> c_int {
    c_int::from(in_window(p as usize))
}

/// Fills `out`; returns 0, or -1 if rackmem is not active in this process.
#[no_mangle]
pub unsafe extern "C" fn rackmem_get_stats(out: *mut RackmemStats) -> c_int {
    let Some(rt) = rackmem_runtime::global() else {
        return -1;
    };
    if out.is_null() {
        return -1;
    }
    let s = rt.stats();
    // SAFETY: the caller passes a valid pointer to a struct rackmem_stats.
    unsafe {
        *out = RackmemStats {
            faults: s.faults,
            bytes_fetched: s.bytes_fetched,
            bytes_prefetched: s.bytes_prefetched,
            bytes_written_back: s.bytes_written_back,
            evictions: s.evictions,
            resident_bytes: s.resident_bytes,
            peak_resident_bytes: s.peak_resident_bytes,
            budget_bytes: s.budget_bytes,
            window_bytes_allocated: s.window_bytes_allocated,
            fault_p50_ns: s.fault_p50_ns,
            fault_p99_ns: s.fault_p99_ns,
        }
    };
    0
}
