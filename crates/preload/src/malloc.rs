//! The malloc family's interposers, with jemalloc's extended API (`mallocx` and the rest):
//! large blocks are window blocks; smaller ones go to the program's own allocator (`family`),
//! except that when it is glibc's, once the program has taken a few MiB from it, they come from
//! the window too (`heap`, and page-granular window blocks above the heap's classes). A pointer
//! is routed by its address: a heap chunk, a window block, or the program's allocator.

use crate::family::{self, libc_free};
use crate::heap;
use crate::{inside, runtime, set_errno, wants_window, window_runtime, Inside};
use libc::{c_int, c_void, size_t};
use rackmem_runtime::{in_window, CallGuard};
use std::ptr;

/// A malloc-family block of `size` bytes in the window, if it is large enough to go there.
#[inline(always)]
fn window_alloc(size: usize, align: usize) -> Option<*mut c_void> {
    if !wants_window(size) {
        return None;
    }
    window_alloc_large(size, align)
}

fn window_alloc_large(size: usize, align: usize) -> Option<*mut c_void> {
    let rt = window_runtime(size)?;
    let _call = CallGuard::enter();
    let _inside = Inside::enter();
    rt.alloc_block(size, align).map(|a| a as *mut c_void)
}

/// A block of `size` bytes below the threshold in the window, when the program's allocator is
/// glibc's and the heap is on; `None` sends the request to the program's allocator. While the
/// heap is armed, counts what glibc hands out and turns the heap on at its switch point.
#[inline(always)]
fn small_alloc(size: usize) -> Option<*mut c_void> {
    match heap::state() {
        heap::ON => {}
        heap::COUNTING => {
            count_for_switch(size);
            return None;
        }
        _ => return None,
    }
    let p = if size <= heap::MAX_SMALL {
        heap::alloc(size)
    } else {
        medium_alloc(size)
    };
    (!p.is_null()).then_some(p)
}

/// A page-granular window block for a request between the heap's classes and the threshold.
#[cold]
fn medium_alloc(size: usize) -> *mut c_void {
    let Some(rt) = runtime() else {
        return ptr::null_mut();
    };
    let _call = CallGuard::enter();
    let _inside = Inside::enter();
    rt.alloc_block(size, 16).map_or(ptr::null_mut(), |a| a as *mut c_void)
}

/// Counts a small block glibc is about to hand out; at the switch point, starts the runtime (if
/// no large allocation did yet) and turns the heap on.
#[cold]
fn count_for_switch(size: usize) {
    match local() {
        Some(n) if n.glibc => {}
        Some(_) => {
            heap::disarm();
            return;
        }
        None => return,
    }
    if !heap::count(size) {
        return;
    }
    if crate::STATE.load(std::sync::atomic::Ordering::Acquire) == crate::OFF {
        heap::disarm();
        return;
    }
    if let Some(rt) = runtime() {
        heap::switch_on(&rt);
    }
}

/// True if `p` is a window block of the malloc family (not a block the program's allocator
/// carved from one of its mappings in the window).
fn is_window_block(p: *const c_void) -> bool {
    in_window(p as usize) && rackmem_runtime::global().is_some_and(|rt| rt.is_block(p as usize))
}

/// Frees `p` if it is a window block; false otherwise.
pub(crate) fn window_release(p: *mut c_void) -> bool {
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

/// The program's allocator, or `None` while it is being looked up (see [`family`]).
fn local() -> Option<&'static family::Next> {
    family::next()
}

/// True when this call comes from the runtime itself and the program's allocator is not glibc:
/// the C library's allocations for the runtime then stay in glibc (see
/// `family::internal_malloc`).
fn internal(n: &family::Next) -> bool {
    if n.glibc {
        return false;
    }
    if inside() || rackmem_runtime::is_runtime_thread() {
        return true;
    }
    // A runtime thread is starting and may not have marked itself yet: its set-up allocations
    // must stay off the program's allocator, and no thread can tell whether it is that one, so
    // every allocation goes to glibc meanwhile. The program's threads allocate then too; once
    // they have taken three quarters of the runtime's table, theirs go back to the program's
    // allocator instead of failing (Redis, loading keys under load, once filled the table and
    // aborted on ENOMEM).
    rackmem_runtime::spawning_runtime_thread() && family::tracked_has_room_for_others()
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
    if let Some(p) = small_alloc(size) {
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
    if let Some(p) = small_alloc(total) {
        // SAFETY: a fresh block of at least `total` bytes (a reused heap block is not zero).
        unsafe { ptr::write_bytes(p as *mut u8, 0, total) };
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
    if p.is_null() {
        return;
    }
    if heap::owns(p as usize) {
        heap::free(p as usize);
        return;
    }
    if window_release(p) {
        return;
    }
    not_in_window(p, "free(): invalid pointer (remote memory that is not a block)");
    local_free(p)
}

/// Stops the program if `p`, about to go to glibc, lies in the window: no glibc block does
/// (glibc's memory never reaches the interposed `mmap`), so it is a pointer never handed out,
/// and glibc would read its chunk header from window memory the runtime manages.
#[inline]
fn not_in_window(p: *mut c_void, what: &str) {
    if in_window(p as usize) && local().is_some_and(|n| n.glibc) {
        heap::die(what, p as usize);
    }
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
    if heap::owns(p as usize) {
        return heap::usable_size(p as usize);
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
    if heap::owns(p as usize) {
        return heap_realloc(p, size);
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
    if heap::state() == heap::ON && !family::in_arena(p) && !in_window(p as usize) {
        // A glibc block from before the switch: it moves to the window as it grows or shrinks.
        if let Some(n) = small_alloc(size) {
            let old = local_usable_size(p);
            // SAFETY: `p` has `old` usable bytes, `n` has `size`; distinct blocks.
            unsafe { ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, old.min(size)) };
            local_free(p);
            return n;
        }
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

/// `realloc` of a heap block: in place while the new size fits and uses at least half of it,
/// else moved (to the heap, a window block or glibc, as `malloc` would place it).
fn heap_realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if heap::state() == heap::GONE {
        // A forked child without its parent's window: the block's contents are gone.
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    }
    let (_, old) = heap::realloc_usable(p as usize);
    if size == 0 {
        heap::free(p as usize);
        return ptr::null_mut();
    }
    if size <= old && size >= old / 2 {
        return p;
    }
    // SAFETY: same contract as malloc.
    let n = unsafe { malloc(size) };
    if n.is_null() {
        return n;
    }
    // SAFETY: `p` has `old` usable bytes, `n` has `size`; distinct blocks.
    unsafe { ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, old.min(size)) };
    heap::free(p as usize);
    n
}

#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    };
    if p.is_null()
        || heap::state() == heap::ON
        || heap::owns(p as usize)
        || is_window_block(p)
        || family::in_arena(p)
        || family::is_tracked(p)
        || wants_window(total)
    {
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
    if let Some(p) = aligned_small(align, size) {
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

/// An aligned small block in the window: heap blocks are 16-aligned and window blocks
/// page-aligned; other requests (a 64-byte alignment of a small block) stay with glibc.
fn aligned_small(align: usize, size: usize) -> Option<*mut c_void> {
    if align <= 16 || (align <= 4096 && size > heap::MAX_SMALL) {
        return small_alloc(size);
    }
    None
}

/// One of the aligned allocation calls: the window for large sizes, else `local`.
fn aligned(align: usize, size: usize, local_call: impl FnOnce(&'static family::Next) -> *mut c_void) -> *mut c_void {
    if let Some(p) = window_alloc(size, align.max(16)) {
        return p;
    }
    if let Some(p) = aligned_small(align, size) {
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

/// glibc's function `name` from libc.so.6 itself (`RTLD_NEXT` could name another allocator's).
pub(crate) fn glibc_symbol(name: &std::ffi::CStr) -> usize {
    // SAFETY: dlopen of the already loaded C library (RTLD_NOLOAD loads nothing) and dlsym with
    // a NUL-terminated name.
    unsafe {
        let h = libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if h.is_null() {
            return 0;
        }
        libc::dlsym(h, name.as_ptr()) as usize
    }
}

/// glibc's `mallinfo2` with the heap's window memory added: `arena` counts its chunks,
/// `uordblks` its blocks handed out (or cached by threads), `fordblks` the rest.
#[no_mangle]
pub unsafe extern "C" fn mallinfo2() -> libc::mallinfo2 {
    static F: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let mut f = F.load(std::sync::atomic::Ordering::Acquire);
    if f == 0 {
        f = glibc_symbol(c"mallinfo2");
        F.store(f, std::sync::atomic::Ordering::Release);
    }
    let mut m = if f == 0 {
        // SAFETY: mallinfo2 is a plain C struct of integers; all zero is a valid value.
        unsafe { std::mem::zeroed() }
    } else {
        // SAFETY: glibc's mallinfo2, whose C type is the one given.
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn() -> libc::mallinfo2>(f)() }
    };
    if heap::owns_any() {
        let (total, used, _) = heap::totals();
        m.arena += total as usize;
        m.uordblks += used as usize;
        m.fordblks += total.saturating_sub(used) as usize;
    }
    m
}

/// `mallinfo`, from `mallinfo2` (its fields are `int`: they wrap, as glibc's do).
#[no_mangle]
pub unsafe extern "C" fn mallinfo() -> libc::mallinfo {
    // SAFETY: same contract.
    let m = unsafe { mallinfo2() };
    libc::mallinfo {
        arena: m.arena as c_int,
        ordblks: m.ordblks as c_int,
        smblks: m.smblks as c_int,
        hblks: m.hblks as c_int,
        hblkhd: m.hblkhd as c_int,
        usmblks: m.usmblks as c_int,
        fsmblks: m.fsmblks as c_int,
        uordblks: m.uordblks as c_int,
        fordblks: m.fordblks as c_int,
        keepcost: m.keepcost as c_int,
    }
}
