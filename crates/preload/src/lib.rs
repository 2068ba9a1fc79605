//! `librackmem.so`: makes an unmodified program use remote memory when loaded with `LD_PRELOAD`.
//!
//! It interposes the malloc family and private anonymous `mmap` (with `munmap`, `mremap`,
//! `madvise`): requests of at least the threshold (`RACKMEM_THRESHOLD`, 1 MiB by default) are
//! placed in the rackmem window, smaller ones go to the C library's allocator. Programs that
//! bring their own allocator (jemalloc, tcmalloc, language runtimes) take their memory with
//! anonymous `mmap`, so their large mappings land in the window too.
//!
//! Rules this shim keeps, because it runs inside every allocation of someone else's program:
//! - no recursion: Rust code in this library allocates through glibc's `__libc_malloc` family
//!   (the global allocator below), never through the interposed symbols; the runtime's own
//!   threads always get local memory;
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

extern "C" {
    fn __libc_malloc(size: size_t) -> *mut c_void;
    fn __libc_calloc(n: size_t, size: size_t) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, size: size_t) -> *mut c_void;
    fn __libc_memalign(align: size_t, size: size_t) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
}

/// Rust allocations of this library go straight to glibc, never to the interposed `malloc`.
struct LibcAllocator;

// SAFETY: glibc's allocator returns memory valid for the requested size and alignment (memalign
// for large alignments) and accepts back exactly the pointers it returned.
unsafe impl GlobalAlloc for LibcAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain calls into glibc's allocator with a valid size/alignment.
        unsafe {
            if layout.align() <= 16 {
                __libc_malloc(layout.size()) as *mut u8
            } else {
                __libc_memalign(layout.align(), layout.size()) as *mut u8
            }
        }
    }
    unsafe fn dealloc(&self, p: *mut u8, _layout: Layout) {
        // SAFETY: `p` came from `alloc` above, i.e. from glibc.
        unsafe { __libc_free(p as *mut c_void) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= 16 {
            // SAFETY: plain call into glibc.
            unsafe { __libc_calloc(1, layout.size()) as *mut u8 }
        } else {
            // SAFETY: memalign returns `size` writable bytes or null.
            unsafe {
                let p = __libc_memalign(layout.align(), layout.size()) as *mut u8;
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
            unsafe { __libc_realloc(p as *mut c_void, new_size) as *mut u8 }
        } else {
            // SAFETY: allocate, copy the smaller size, free the old block (all from glibc).
            unsafe {
                let n = __libc_memalign(layout.align(), new_size) as *mut u8;
                if !n.is_null() {
                    ptr::copy_nonoverlapping(p, n, layout.size().min(new_size));
                    __libc_free(p as *mut c_void);
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

fn window_alloc(size: usize, align: usize) -> Option<*mut c_void> {
    if !wants_window(size) {
        return None;
    }
    let rt = runtime()?;
    if (size as u64) < rt.config().threshold_bytes {
        return None;
    }
    let _call = CallGuard::enter();
    let _inside = Inside::enter();
    rt.alloc(size, align).map(|a| a as *mut c_void)
}

fn window_release(p: *mut c_void) -> bool {
    if !in_window(p as usize) {
        return false;
    }
    if let Some(rt) = rackmem_runtime::global() {
        let _call = CallGuard::enter();
        let _inside = Inside::enter();
        if let Some((start, len)) = rt.region_of(p as usize) {
            rt.release(start, len);
        }
    }
    true
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

#[no_mangle]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    if let Some(p) = window_alloc(size, 16) {
        return p;
    }
    // SAFETY: pass-through to glibc.
    unsafe { __libc_malloc(size) }
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
    // SAFETY: pass-through to glibc.
    unsafe { __libc_calloc(n, size) }
}

#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() || window_release(p) {
        return;
    }
    // SAFETY: not a window pointer, so it came from glibc (or is the caller's bug as usual).
    unsafe { __libc_free(p) }
}

#[no_mangle]
pub unsafe extern "C" fn cfree(p: *mut c_void) {
    // SAFETY: same contract as free.
    unsafe { free(p) }
}

fn libc_usable_size(p: *mut c_void) -> usize {
    type F = unsafe extern "C" fn(*mut c_void) -> size_t;
    static REAL: AtomicU64 = AtomicU64::new(0);
    let mut f = REAL.load(Ordering::Acquire);
    if f == 0 {
        // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds glibc's definition.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) } as u64;
        REAL.store(f, Ordering::Release);
    }
    if f == 0 {
        return 0;
    }
    // SAFETY: `f` is glibc's malloc_usable_size, called with a glibc heap pointer.
    unsafe { std::mem::transmute::<u64, F>(f)(p) }
}

#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> size_t {
    if p.is_null() {
        return 0;
    }
    if in_window(p as usize) {
        return rackmem_runtime::global()
            .and_then(|rt| rt.usable_size(p as usize))
            .unwrap_or(0);
    }
    libc_usable_size(p)
}

#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: size_t) -> *mut c_void {
    if p.is_null() {
        // SAFETY: same contract as malloc.
        return unsafe { malloc(size) };
    }
    if size == 0 {
        // SAFETY: glibc's realloc(p, 0) frees and returns NULL.
        unsafe { free(p) };
        return ptr::null_mut();
    }
    if in_window(p as usize) {
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
        // SAFETY: allocate the new block (window or local), copy what fits, free the old one.
        unsafe {
            let n = malloc(size);
            if n.is_null() {
                return ptr::null_mut();
            }
            ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, old.min(size));
            free(p);
            n
        }
    } else if wants_window(size) {
        match window_alloc(size, 16) {
            Some(n) => {
                let old = libc_usable_size(p);
                // SAFETY: `p` is a live glibc block of `old` usable bytes; `n` has `size` bytes.
                unsafe {
                    ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, old.min(size));
                    __libc_free(p);
                }
                n
            }
            // SAFETY: pass-through to glibc.
            None => unsafe { __libc_realloc(p, size) },
        }
    } else {
        // SAFETY: pass-through to glibc.
        unsafe { __libc_realloc(p, size) }
    }
}

#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: same contract as realloc.
        Some(total) => unsafe { realloc(p, total) },
        None => {
            set_errno(libc::ENOMEM);
            ptr::null_mut()
        }
    }
}

fn aligned(align: usize, size: usize) -> *mut c_void {
    if let Some(p) = window_alloc(size, align.max(16)) {
        return p;
    }
    // SAFETY: pass-through to glibc.
    unsafe { __libc_memalign(align, size) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: size_t, size: size_t) -> c_int {
    if !align.is_power_of_two() || align % std::mem::size_of::<*mut c_void>() != 0 {
        return libc::EINVAL;
    }
    let p = aligned(align, size);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller passes a valid out-pointer.
    unsafe { *out = p };
    0
}

#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    aligned(align, size)
}

#[no_mangle]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    aligned(align, size)
}

#[no_mangle]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    aligned(4096, size)
}

#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    aligned(4096, size.div_ceil(4096).max(1) * 4096)
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
    let special =
        libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE | libc::MAP_GROWSDOWN | libc::MAP_HUGETLB | libc::MAP_STACK;
    if addr.is_null() && private_anon && flags & special == 0 && prot == libc::PROT_READ | libc::PROT_WRITE {
        if let Some(p) = window_alloc(len, 4096) {
            return p;
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
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    if in_window(addr as usize) {
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
    rt.alloc(size, 4096).map_or(ptr::null_mut(), |a| a as *mut c_void)
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
