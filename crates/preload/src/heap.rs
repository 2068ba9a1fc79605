//! The program's small blocks in the window: the allocator that serves the malloc family below
//! the threshold when the program's allocator is glibc's, so that everything the program
//! allocates counts against `--local` and can be evicted.
//!
//! glibc takes its heap with `brk` and its arenas with its own internal `mmap`, which no
//! interposer sees, and it has had no `morecore` hook since 2.34: its blocks can never be window
//! memory. So once the program has taken [`SWITCH_BYTES`] of small blocks from glibc (a program
//! that never does, `ls` or a shell, never starts a runtime), new small blocks come from here.
//! Blocks glibc handed out before stay glibc's: `free` routes by address (a block of this heap
//! lies in one of its chunks, a glibc block never lies in the window).
//!
//! Layout, chosen to cost what glibc's costs: chunks of [`CHUNK_BYTES`] are allocated from the
//! window (aligned, so a table indexed by window offset says which chunks are the heap's);
//! spans carved from a chunk hold blocks of one size class. Every block starts with an 8-byte
//! header, a cookie bound to the block's address with its class and state (live or free), and
//! its usable size is 8 bytes short of a multiple of 16, as glibc's chunks (`malloc(64)` takes
//! 80 bytes here as there). Block sizes go by 16 bytes up to 528, then eight classes per
//! doubling up to 256 KiB; larger small requests are page-granular window blocks.
//!
//! Fast path: a per-thread cache of free blocks per class (a singly linked list through the
//! blocks, bounded per class); a cache that runs empty takes a batch from the class's central
//! list (one lock per class), one that runs full gives half back. A thread's cache goes back to
//! the central lists when the thread exits (a `pthread` key destructor).
//!
//! Bad input, checked as glibc checks it: `free` of a block whose header says free aborts with
//! "double free", of a pointer whose header is not a cookie of this heap (a pointer never
//! handed out, or a header overwritten by a write past the previous block) with "invalid
//! pointer", and a free block whose header was overwritten (written after free or past the
//! previous block) aborts when it would be handed out again. Nothing of the runtime's lies in
//! the heap's chunks, so a wild write through a heap pointer cannot reach the runtime's state.

use libc::c_void;
use rackmem_runtime::{is_runtime_thread, spawning_runtime_thread, window_start, CallGuard, Runtime};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Bytes of small blocks the program takes from glibc before its small blocks move to the
/// window (counted as handed out, frees not subtracted): part of the fixed allowance of local
/// memory the heap implies, since those blocks stay glibc's. `RACKMEM_SMALL_BLOCKS_AFTER`
/// overrides it (tests use 0: the window from the first block).
pub const SWITCH_BYTES: u64 = 1 << 20;
/// Window memory is taken in chunks of this size (and alignment within the window).
pub const CHUNK_BYTES: usize = 8 << 20;
/// Chunks the table can name: 4 TiB of window, a 512 KiB table (untouched where unused).
const MAX_CHUNKS: usize = 1 << 19;
/// Header bytes before each block.
const HEADER: usize = 8;
/// The unit fresh blocks are carved in (see `take`): the window's page.
const CARVE_PAGE: usize = 4096;
/// Classes with block sizes 32..=528 by 16 bytes.
const LINEAR: usize = 32;
/// Eight classes per doubling from 528 to 256 KiB.
const GEOMETRIC: usize = 9 * 8;
pub const CLASSES: usize = LINEAR + GEOMETRIC;
/// The largest block size (header included).
const MAX_BLOCK: usize = 256 << 10;
/// The largest request the classes serve.
pub const MAX_SMALL: usize = MAX_BLOCK - HEADER;

const LIVE: u64 = 0x5A;
const FREE: u64 = 0xA5;

/// Block size (header included) of class `c`.
const fn block_size(c: usize) -> usize {
    if c < LINEAR {
        32 + 16 * c
    } else {
        let g = c - LINEAR;
        let (k, j) = (g / 8, g % 8 + 1);
        (512 << k) + j * (64 << k)
    }
}

static BLOCK_SIZES: [usize; CLASSES] = {
    let mut t = [0; CLASSES];
    let mut c = 0;
    while c < CLASSES {
        t[c] = block_size(c);
        c += 1;
    }
    t
};

/// The class of a request of `size` bytes (at most [`MAX_SMALL`]).
#[inline(always)]
pub fn class_of(size: usize) -> usize {
    let n = size + HEADER;
    if n <= 528 {
        return n.max(32).div_ceil(16) - 2;
    }
    let top = usize::BITS as usize - 1 - (n - 1).leading_zeros() as usize; // n-1 in [2^top, 2^(top+1))
    let k = top - 9;
    let step = 64usize << k;
    let j = (n - (512 << k)).div_ceil(step);
    LINEAR + 8 * k + j - 1
}

/// Usable bytes of a block of class `c`.
#[inline]
pub fn usable(c: usize) -> usize {
    BLOCK_SIZES[c] - HEADER
}

/// Blocks of class `c` a thread keeps cached at most: bounded in bytes (64 KiB a class),
/// between 2 and 64 blocks. A table: a division on every `free` showed in the profile.
static CACHE_MAX: [u32; CLASSES] = {
    let mut t = [0; CLASSES];
    let mut c = 0;
    while c < CLASSES {
        let n = (64 << 10) / block_size(c);
        t[c] = if n < 2 {
            2
        } else if n > 64 {
            64
        } else {
            n as u32
        };
        c += 1;
    }
    t
};

#[inline]
fn cache_max(c: usize) -> u32 {
    CACHE_MAX[c]
}

/// Span length for class `c`: at least 64 KiB and four blocks, whole pages.
fn span_bytes(c: usize) -> usize {
    (BLOCK_SIZES[c] * 4).max(64 << 10).next_multiple_of(4096)
}

// --- State and switch ----------------------------------------------------------------------

/// Not configured (no runtime wanted, or the program's allocator is not glibc's).
pub const OFF: u8 = 0;
/// Counting the bytes glibc hands out until [`SWITCH_BYTES`].
pub const COUNTING: u8 = 1;
const SWITCHING: u8 = 2;
/// Serving small blocks from the window.
pub const ON: u8 = 3;
/// A forked child that has no window: new blocks are glibc's, frees of heap blocks are ignored.
pub const GONE: u8 = 4;

static STATE: AtomicU8 = AtomicU8::new(OFF);
static COUNTED: AtomicU64 = AtomicU64::new(0);

#[inline]
pub fn state() -> u8 {
    STATE.load(Ordering::Relaxed)
}

/// Bytes glibc hands out before the switch ([`SWITCH_BYTES`] unless configured).
static SWITCH_AFTER: AtomicU64 = AtomicU64::new(SWITCH_BYTES);

/// Arms the switch, to happen once glibc has handed out `after` bytes of small blocks (at load
/// time, when a runtime is configured).
pub fn arm(after: u64) {
    SWITCH_AFTER.store(after, Ordering::Relaxed);
    STATE.store(COUNTING, Ordering::Release);
}

/// Leaves the heap off for good (the program's allocator is not glibc's).
pub fn disarm() {
    let _ = STATE.compare_exchange(COUNTING, OFF, Ordering::AcqRel, Ordering::Relaxed);
}

/// Counts `size` bytes handed out by glibc; true once the total calls for the switch.
#[inline]
pub fn count(size: usize) -> bool {
    COUNTED.fetch_add(size as u64, Ordering::Relaxed) + size as u64 >= SWITCH_AFTER.load(Ordering::Relaxed)
}

/// Turns the heap on, over the runtime `rt` (started by the caller). One caller wins.
pub fn switch_on(_rt: &Runtime) {
    if STATE
        .compare_exchange(COUNTING, SWITCHING, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    // SAFETY: getauxval only reads the auxiliary vector; AT_RANDOM points to 16 random bytes
    // the kernel put on the initial stack, readable for the process's life.
    let random = unsafe {
        let p = libc::getauxval(libc::AT_RANDOM) as *const u64;
        if p.is_null() {
            0
        } else {
            p.read_unaligned() ^ p.add(1).read_unaligned()
        }
    };
    SECRET.store(
        (random ^ (&SECRET as *const _ as u64)).wrapping_mul(0xD6E8_FEB8_6659_FD93) | 1,
        Ordering::Relaxed,
    );
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: pthread_key_create fills `key`; the destructor is a plain extern "C" fn.
    if unsafe { libc::pthread_key_create(&mut key, Some(thread_exit)) } != 0 {
        STATE.store(OFF, Ordering::Release);
        return;
    }
    KEY.store(key as usize, Ordering::Release);
    // Registered after the runtime's hooks, so the prepare hook below runs before the runtime's
    // (prepare hooks run in reverse order): the heap's locks are taken while faults are still
    // served, and released after the runtime's child and parent hooks.
    // SAFETY: the hooks are plain `extern "C" fn()` with static lifetime.
    let rc = unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    if rc != 0 {
        STATE.store(OFF, Ordering::Release);
        return;
    }
    STATE.store(ON, Ordering::Release);
}

// --- Locks ---------------------------------------------------------------------------------

/// A spin lock that yields: held for a few list operations (and, rarely, a page fault or a
/// window allocation); `std`'s mutex cannot be held across `fork`'s hooks.
struct SpinLock(AtomicBool);

impl SpinLock {
    const fn new() -> SpinLock {
        SpinLock(AtomicBool::new(false))
    }
    fn lock(&self) {
        let mut spins = 0u32;
        while self
            .0
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // SAFETY: sched_yield has no arguments and cannot fail in a harmful way.
                unsafe { libc::sched_yield() };
            }
        }
    }
    fn unlock(&self) {
        self.0.store(false, Ordering::Release);
    }
}

// --- Chunks --------------------------------------------------------------------------------

/// Which window chunks are the heap's, by offset in the window / CHUNK_BYTES.
static CHUNKS: [AtomicU8; MAX_CHUNKS] = [const { AtomicU8::new(0) }; MAX_CHUNKS];
static CHUNK_LOCK: SpinLock = SpinLock::new();
struct Carve {
    cur: usize,
    end: usize,
}
struct CarveCell(UnsafeCell<Carve>);
// SAFETY: accessed only under CHUNK_LOCK.
unsafe impl Sync for CarveCell {}
static CARVE: CarveCell = CarveCell(UnsafeCell::new(Carve { cur: 0, end: 0 }));
static CHUNK_TOTAL: AtomicU64 = AtomicU64::new(0);

/// The window's start, kept here once the heap has a chunk (0 before): the window never moves
/// (a forked child maps its own at the same address), and a call into the runtime for it on
/// every `free` cost more than the rest of the fast path (measured with perf).
static BASE: AtomicUsize = AtomicUsize::new(0);

/// True if `p` lies in one of the heap's chunks.
#[inline]
pub fn owns(p: usize) -> bool {
    let base = BASE.load(Ordering::Relaxed);
    if base == 0 || p < base {
        return false;
    }
    let i = (p - base) / CHUNK_BYTES;
    i < MAX_CHUNKS && CHUNKS[i].load(Ordering::Relaxed) != 0
}

/// True once the heap has a chunk.
pub fn owns_any() -> bool {
    BASE.load(Ordering::Relaxed) != 0
}

/// Offset of `p` in its chunk.
#[inline]
fn chunk_offset(p: usize) -> usize {
    (p - BASE.load(Ordering::Relaxed)) % CHUNK_BYTES
}

/// A span of `len` bytes (at most a chunk) from the current chunk, or a new chunk from the
/// window; 0 if the window has none.
fn new_span(len: usize) -> usize {
    CHUNK_LOCK.lock();
    // SAFETY: under CHUNK_LOCK.
    let c = unsafe { &mut *CARVE.0.get() };
    if c.end - c.cur < len {
        let chunk = window_chunk();
        if chunk == 0 {
            CHUNK_LOCK.unlock();
            return 0;
        }
        c.cur = chunk;
        c.end = chunk + CHUNK_BYTES;
    }
    let s = c.cur;
    c.cur += len;
    CHUNK_LOCK.unlock();
    s
}

fn window_chunk() -> usize {
    let Some(rt) = rackmem_runtime::global() else {
        return 0;
    };
    let _call = CallGuard::enter();
    let _inside = crate::Inside::enter();
    let Some(a) = rt.alloc(CHUNK_BYTES, CHUNK_BYTES) else {
        return 0;
    };
    let i = (a - window_start()) / CHUNK_BYTES;
    if (a - window_start()) % CHUNK_BYTES != 0 || i >= MAX_CHUNKS {
        rt.release(a, CHUNK_BYTES);
        return 0;
    }
    CHUNKS[i].store(1, Ordering::Release);
    BASE.store(window_start(), Ordering::Release);
    CHUNK_TOTAL.fetch_add(CHUNK_BYTES as u64, Ordering::Relaxed);
    a
}

// --- Headers ---------------------------------------------------------------------------------

static SECRET: AtomicU64 = AtomicU64::new(0);

/// The address-bound part of `p`'s header (its low 16 bits hold the state and class).
#[inline]
fn seal(p: usize) -> u64 {
    ((p as u64) ^ SECRET.load(Ordering::Relaxed)).wrapping_mul(0x9E37_79B9_7F4A_7C15) & !0xFFFF
}

#[inline]
fn cookie(p: usize, state: u64, c: usize) -> u64 {
    seal(p) | (state << 8) | c as u64
}

#[inline]
fn header(p: usize) -> u64 {
    // SAFETY: callers pass a 16-aligned address of a heap chunk at least 16 bytes into it, so
    // the 8 bytes before it are chunk memory.
    unsafe { ((p - HEADER) as *const u64).read() }
}

#[inline]
fn set_header(p: usize, v: u64) {
    // SAFETY: as for `header`.
    unsafe { ((p - HEADER) as *mut u64).write(v) }
}

#[inline]
fn next_of(p: usize) -> usize {
    // SAFETY: a free block's first word holds the next free block (or 0); blocks have at least
    // 24 usable bytes.
    unsafe { (p as *const usize).read() }
}

#[inline]
fn set_next(p: usize, n: usize) {
    // SAFETY: as for `next_of`.
    unsafe { (p as *mut usize).write(n) }
}

/// Stops the program with `what` about `p`: the heap found bad input (as glibc's checks do),
/// and going on would corrupt another block.
#[cold]
pub(crate) fn die(what: &str, p: usize) -> ! {
    let mut buf = [0u8; 160];
    let mut n = 0;
    for part in ["rackmem: ", what, " (block 0x"] {
        for &b in part.as_bytes() {
            if n < buf.len() {
                buf[n] = b;
                n += 1;
            }
        }
    }
    for i in (0..16).rev() {
        let d = ((p >> (i * 4)) & 0xF) as u8;
        if n < buf.len() {
            buf[n] = if d < 10 { b'0' + d } else { b'a' + d - 10 };
            n += 1;
        }
    }
    for &b in b")\n" {
        if n < buf.len() {
            buf[n] = b;
            n += 1;
        }
    }
    // SAFETY: write(2) of a valid buffer to stderr, then abort(3), as glibc does on a corrupt heap.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), n);
        libc::abort()
    }
}

/// The class of a live block `p` of the heap and its seal; stops the program if `p` is not one.
#[inline(always)]
fn live_class(p: usize, what: &str) -> (usize, u64) {
    if p % 16 != 0 || chunk_offset(p) < 16 {
        die_invalid(what, p);
    }
    let h = header(p);
    let c = (h & 0xFF) as usize;
    let sealed = seal(p);
    if c >= CLASSES || h != sealed | (LIVE << 8) | c as u64 {
        if c < CLASSES && h == sealed | (FREE << 8) | c as u64 {
            let msg = match what {
                "free" => "free(): double free detected",
                "realloc" => "realloc(): pointer already freed",
                _ => "malloc_usable_size(): pointer already freed",
            };
            die(msg, p);
        }
        die_invalid(what, p);
    }
    (c, sealed)
}

#[cold]
fn die_invalid(what: &str, p: usize) -> ! {
    let msg = match what {
        "free" => "free(): invalid pointer or corrupted block header (a write past the previous block?)",
        "realloc" => "realloc(): invalid pointer or corrupted block header (a write past the previous block?)",
        _ => "malloc_usable_size(): invalid pointer",
    };
    die(msg, p)
}

/// Checks a free block about to be handed out (or taken from a list); returns its seal. A
/// list pointer overwritten by a write after free is caught here before anything is written
/// through it: its header cannot hold the cookie of its address (reading it may fault, which
/// stops the program too).
#[inline(always)]
fn check_free(p: usize, c: usize) -> u64 {
    if p % 16 != 0 || p < 4096 {
        corrupted_free(p);
    }
    let sealed = seal(p);
    if header(p) != sealed | (FREE << 8) | c as u64 {
        corrupted_free(p);
    }
    sealed
}

#[cold]
fn corrupted_free(p: usize) -> ! {
    die(
        "malloc(): corrupted free block (written after free, or past the previous block)",
        p,
    )
}

// --- Central lists -------------------------------------------------------------------------

struct Central {
    free: usize,
    nfree: usize,
    bump: usize,
    end: usize,
    carved: usize,
}

struct Bin {
    lock: SpinLock,
    c: UnsafeCell<Central>,
}

// SAFETY: `c` is accessed only under `lock`.
unsafe impl Sync for Bin {}

static BINS: [Bin; CLASSES] = [const {
    Bin {
        lock: SpinLock::new(),
        c: UnsafeCell::new(Central {
            free: 0,
            nfree: 0,
            bump: 0,
            end: 0,
            carved: 0,
        }),
    }
}; CLASSES];

/// Takes up to `want` free blocks of class `c` as a list; (head, count). Fresh blocks are
/// listed in address order, so consecutive `malloc`s get ascending addresses as from glibc: the
/// fault handler sees sequential runs to prefetch, and a write past a block reaches the header
/// of the next one handed out.
fn take(c: usize, want: u32) -> (usize, u32) {
    let bin = &BINS[c];
    bin.lock.lock();
    // SAFETY: under the bin's lock.
    let st = unsafe { &mut *bin.c.get() };
    let (mut head, mut tail, mut n) = (0usize, 0usize, 0u32);
    // The central list's first blocks are taken as the chain they already form, cut after the
    // last one: one write, where relinking each block wrote every one of them. In a forked
    // child those blocks lie in pages it shares with its parent copy-on-write, and each write
    // copied a page (`perf record` of 600 PostgreSQL backends: 530 samples of page faults in
    // this function, more than in any of the program's own).
    if want > 0 && st.free != 0 {
        head = st.free;
        while n < want && st.free != 0 {
            let p = st.free;
            check_free(p, c);
            st.free = next_of(p);
            st.nfree -= 1;
            tail = p;
            n += 1;
        }
        set_next(tail, 0);
    }
    let mut append = |p: usize| {
        set_next(p, 0);
        if tail == 0 {
            head = p;
        } else {
            set_next(tail, p);
        }
        tail = p;
    };
    let b = BLOCK_SIZES[c];
    // Fresh blocks are carved only while the next header lies in the page the last block ends
    // in: carving ahead wrote a header into every page of a batch (32 KiB of 1 KiB blocks for
    // one `malloc`), and in a forked child each of those pages is a copy-on-write copy or a
    // first touch through the fault handler that the child may never use (PostgreSQL's
    // backends: see `docs/benchmarks.md`, "A backend's life"). The next page is carved when it
    // is needed.
    let mut carved_to = 0usize;
    while n < want {
        if carved_to != 0 && (carved_to % CARVE_PAGE == 0 || st.end - st.bump < b) {
            break;
        }
        if n > 0 && carved_to == 0 {
            // Blocks came off the central list: no fresh page for them.
            break;
        }
        if st.end - st.bump < b {
            let len = span_bytes(c);
            let s = new_span(len);
            if s == 0 {
                break;
            }
            // The first header sits 8 bytes into the span, so blocks are 16-aligned.
            st.bump = s + HEADER;
            st.end = s + len;
        }
        let p = st.bump + HEADER;
        st.bump += b;
        st.carved += 1;
        set_header(p, cookie(p, FREE, c));
        append(p);
        n += 1;
        carved_to = st.bump;
    }
    bin.lock.unlock();
    (head, n)
}

/// Gives the list `head..=tail` of `n` free blocks of class `c` back.
fn give(c: usize, head: usize, tail: usize, n: u32) {
    let bin = &BINS[c];
    bin.lock.lock();
    // SAFETY: under the bin's lock.
    let st = unsafe { &mut *bin.c.get() };
    set_next(tail, st.free);
    st.free = head;
    st.nfree += n as usize;
    bin.lock.unlock();
}

// --- Thread caches -------------------------------------------------------------------------

#[derive(Clone, Copy)]
#[repr(C)]
struct Cached {
    head: usize,
    count: u32,
}

/// Unknown: set on first use.
const T_NEW: u8 = 0;
/// A program thread: uses its cache.
const T_CACHE: u8 = 1;
/// A runtime thread: never uses the heap.
const T_NEVER: u8 = 2;

#[repr(C)]
struct Cache {
    mode: u8,
    /// See [`crate::inside`].
    inside: bool,
    bins: [Cached; CLASSES],
}

/// This thread's cache (all zero at thread start: `T_NEW`, not inside, empty).
///
/// On x86-64 it is a thread-local block of the initial-exec model, reached from the thread
/// pointer with one load: Rust's `thread_local!` in a shared object goes through a call to
/// `__tls_get_addr` on every access, and on the allocate-and-free loop of
/// `bench/malloc_bench.c` that call was the largest part of the gap to glibc, which reads its
/// own thread cache this way. The initial-exec model is sound for a library loaded at start
/// (`LD_PRELOAD`), which is how this one is used; a `dlopen` of it may be refused for want of
/// static TLS space, with the loader's message.
#[cfg(target_arch = "x86_64")]
mod tls {
    use super::Cache;

    core::arch::global_asm!(
        ".pushsection .tbss,\"awT\",@nobits",
        ".balign 64",
        ".globl rackmem_heap_cache",
        ".hidden rackmem_heap_cache",
        ".type rackmem_heap_cache,@object",
        ".size rackmem_heap_cache, {size}",
        "rackmem_heap_cache:",
        ".zero {size}",
        ".popsection",
        size = const std::mem::size_of::<Cache>(),
    );

    #[inline(always)]
    pub(super) fn cache_ptr() -> *mut Cache {
        let p: usize;
        // SAFETY: reads this thread's offset of `rackmem_heap_cache` from the GOT (filled by
        // the loader's TPOFF relocation) and adds the thread pointer (%fs:0 holds the TCB's own
        // address on x86-64 Linux): the address of this thread's block, which lives as long as
        // the thread. Neither load has side effects.
        unsafe {
            core::arch::asm!(
                "movq rackmem_heap_cache@GOTTPOFF(%rip), {p}",
                "addq %fs:0, {p}",
                p = out(reg) p,
                options(att_syntax, pure, readonly, nostack)
            );
        }
        p as *mut Cache
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod tls {
    use super::{Cache, Cached, CLASSES, T_NEW};
    use std::cell::UnsafeCell;

    thread_local! {
        static CACHE: UnsafeCell<Cache> = const {
            UnsafeCell::new(Cache { mode: T_NEW, inside: false, bins: [Cached { head: 0, count: 0 }; CLASSES] })
        };
    }

    #[inline(always)]
    pub(super) fn cache_ptr() -> *mut Cache {
        CACHE.with(|c| c.get())
    }
}

/// True while this thread runs runtime code for an allocation call (see [`crate::inside`]).
#[inline]
pub fn inside() -> bool {
    // SAFETY: this thread's own state; no reference to it is held across calls.
    unsafe { (*tls::cache_ptr()).inside }
}

/// Marks this thread as inside (or out of) a runtime call.
#[inline]
pub fn set_inside(v: bool) {
    // SAFETY: as for `inside`.
    unsafe { (*tls::cache_ptr()).inside = v }
}

static KEY: AtomicUsize = AtomicUsize::new(0);

/// This thread's cache, if it may use the heap now: not inside a runtime call, not a runtime
/// thread (nor a thread that may be one not yet marked).
#[inline(always)]
fn cache() -> Option<*mut Cache> {
    let c = tls::cache_ptr();
    // SAFETY: this thread's own cache; no reference to it outlives a heap call.
    let (mode, inside) = unsafe { ((*c).mode, (*c).inside) };
    if mode == T_CACHE && !inside {
        return Some(c);
    }
    if inside || mode == T_NEVER || spawning_runtime_thread() {
        return None;
    }
    if is_runtime_thread() {
        // SAFETY: as above.
        unsafe { (*c).mode = T_NEVER };
        return None;
    }
    // SAFETY: KEY was created before the heap was turned on; the value only marks the thread so
    // its destructor runs at exit (keys below 32 take no allocation in glibc).
    unsafe {
        libc::pthread_setspecific(
            KEY.load(Ordering::Acquire) as libc::pthread_key_t,
            std::ptr::dangling::<c_void>(),
        );
        (*c).mode = T_CACHE;
    }
    Some(c)
}

/// A block of at least `size` (at most [`MAX_SMALL`]) bytes, 16-aligned; null if this thread
/// may not use the heap (a runtime thread, or inside a runtime call) or the window is full.
#[inline(always)]
pub fn alloc(size: usize) -> *mut c_void {
    let Some(tc) = cache() else {
        return std::ptr::null_mut();
    };
    let c = class_of(size);
    // SAFETY: this thread's cache, used by this call alone.
    let b = unsafe { &mut (*tc).bins[c] };
    if b.head == 0 {
        let (head, n) = take(c, cache_max(c).div_ceil(2));
        if n == 0 {
            return std::ptr::null_mut();
        }
        b.head = head;
        b.count = n;
    }
    let p = b.head;
    let sealed = check_free(p, c);
    b.head = next_of(p);
    b.count -= 1;
    set_header(p, sealed | (LIVE << 8) | c as u64);
    p as *mut c_void
}

/// Usable bytes of the heap block `p` (the program's `malloc_usable_size`).
pub fn usable_size(p: usize) -> usize {
    usable(live_class(p, "malloc_usable_size").0)
}

/// Usable bytes of the heap block `p`, checked as `realloc` checks it.
pub fn realloc_usable(p: usize) -> (usize, usize) {
    let c = live_class(p, "realloc").0;
    (c, usable(c))
}

/// Frees the heap block `p`; stops the program on a double free or a pointer that is not a
/// block of the heap.
#[inline(always)]
pub fn free(p: usize) {
    if state() == GONE {
        // A forked child without its parent's window: nothing to free.
        return;
    }
    let (c, sealed) = live_class(p, "free");
    set_header(p, sealed | (FREE << 8) | c as u64);
    let Some(tc) = cache() else {
        give(c, p, p, 1);
        return;
    };
    // SAFETY: this thread's cache, used by this call alone.
    let b = unsafe { &mut (*tc).bins[c] };
    set_next(p, b.head);
    b.head = p;
    b.count += 1;
    let max = cache_max(c);
    if b.count >= max {
        // Keep the most recently freed half (warm), give the rest back.
        let keep = max / 2;
        let mut last = b.head;
        for _ in 1..keep {
            last = next_of(last);
        }
        let rest = next_of(last);
        let n = b.count - keep;
        let mut tail = rest;
        for _ in 1..n {
            tail = next_of(tail);
        }
        set_next(last, 0);
        b.count = keep;
        give(c, rest, tail, n);
    }
}

/// Gives a thread's cached blocks back when the thread exits.
extern "C" fn thread_exit(_: *mut c_void) {
    let c = tls::cache_ptr();
    // SAFETY: this thread's own cache, during its exit.
    let cache = unsafe { &mut *c };
    for (class, b) in cache.bins.iter_mut().enumerate() {
        if b.count == 0 {
            continue;
        }
        let mut tail = b.head;
        while next_of(tail) != 0 {
            tail = next_of(tail);
        }
        give(class, b.head, tail, b.count);
        *b = Cached { head: 0, count: 0 };
    }
    cache.mode = T_NEW;
}

// --- fork ----------------------------------------------------------------------------------

extern "C" fn fork_prepare() {
    CHUNK_LOCK.lock();
    for b in &BINS {
        b.lock.lock();
    }
}

extern "C" fn fork_parent() {
    for b in &BINS {
        b.lock.unlock();
    }
    CHUNK_LOCK.unlock();
}

extern "C" fn fork_child() {
    for b in &BINS {
        b.lock.unlock();
    }
    CHUNK_LOCK.unlock();
    if rackmem_runtime::global().is_none() {
        // The child could not have its parent's remote memory: its heap blocks are gone.
        STATE.store(GONE, Ordering::Release);
    }
}

// --- Statistics ----------------------------------------------------------------------------

/// (bytes of window taken, bytes in blocks handed out or cached by threads, bytes free in the
/// central lists).
pub fn totals() -> (u64, u64, u64) {
    let (mut used, mut free) = (0u64, 0u64);
    for (c, bin) in BINS.iter().enumerate() {
        bin.lock.lock();
        // SAFETY: under the bin's lock.
        let st = unsafe { &*bin.c.get() };
        used += ((st.carved - st.nfree) * BLOCK_SIZES[c]) as u64;
        free += (st.nfree * BLOCK_SIZES[c]) as u64;
        bin.lock.unlock();
    }
    (CHUNK_TOTAL.load(Ordering::Relaxed), used, free)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_every_size_with_glibc_like_overhead() {
        let mut prev = 0;
        for (c, &b) in BLOCK_SIZES.iter().enumerate() {
            assert!(b > prev, "class {c} not increasing");
            assert_eq!(b % 16, 0, "class {c}: block size {b} not a multiple of 16");
            prev = b;
        }
        assert_eq!(BLOCK_SIZES[CLASSES - 1], MAX_BLOCK);
        for size in (0..=MAX_SMALL)
            .step_by(7)
            .chain([MAX_SMALL, 24, 25, 520, 521, 527, 528, 529])
        {
            let c = class_of(size);
            assert!(c < CLASSES, "size {size} has no class");
            assert!(usable(c) >= size, "size {size}: class {c} holds {}", usable(c));
            if c > 0 {
                assert!(usable(c - 1) < size.max(1), "size {size}: class {} would do", c - 1);
            }
            // At most 1/8 of waste above the linear classes (plus the header).
            assert!(
                usable(c) <= (size + size / 8 + 16).max(24),
                "size {size}: class {c} wastes too much"
            );
        }
        // glibc: malloc(64) takes an 80-byte chunk with 72 usable bytes.
        assert_eq!(BLOCK_SIZES[class_of(64)], 80);
        assert_eq!(usable(class_of(64)), 72);
    }

    #[test]
    fn cookies_bind_address_state_and_class() {
        SECRET.store(0x1234_5678_9abc_def1, Ordering::Relaxed);
        let a = cookie(0x7000_0000_1010, LIVE, 3);
        assert_ne!(a, cookie(0x7000_0000_1010, FREE, 3));
        assert_ne!(a, cookie(0x7000_0000_1020, LIVE, 3));
        assert_eq!(a & 0xFF, 3);
        assert_eq!((a >> 8) & 0xFF, LIVE);
    }
}
