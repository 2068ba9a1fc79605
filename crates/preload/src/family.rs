//! The program's own allocator: the malloc family this shim passes small requests to.
//!
//! A program may bring its allocator as a shared library it links (redis-server links
//! jemalloc) or one preloaded after this shim (`LD_PRELOAD=librackmem.so:libtcmalloc.so`). Its
//! pointers must only ever reach its own functions: `malloc` from jemalloc and
//! `malloc_usable_size` from glibc on the same pointer crashes. So the whole family is looked up
//! with `dlsym(RTLD_NEXT, ...)` once, and a function counts only if it lives in the same object
//! as the `malloc` found (`dladdr`): a name the allocator does not define (jemalloc has no
//! `pvalloc`) would otherwise resolve to glibc's. Missing members are built from the others.
//! When the next `malloc` is glibc's, glibc's `__libc_*` entry points are used directly.
//!
//! `dlsym` may itself call `calloc`/`malloc` while the lookup runs; those calls are served
//! from a small static bootstrap arena, whose blocks `free` recognises and ignores.

use libc::{c_int, c_void, size_t};
use std::ptr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// A value looked up once, by whichever thread asks first. Callers that ask while the lookup
/// runs (that thread itself, when `dlsym` allocates, or another thread) get `None` and use the
/// bootstrap arena: `std::sync::OnceLock` would block them, and deadlock the first.
struct Resolved<T> {
    state: AtomicU8,
    /// Written once by the resolving thread before `state` becomes `RESOLVED`.
    value: std::cell::UnsafeCell<T>,
}

// SAFETY: `value` is written by one thread only (the winner of the exchange on `state`) and read
// only after `state` is RESOLVED (Release on write, Acquire on read).
unsafe impl<T: Sync> Sync for Resolved<T> {}

const UNRESOLVED: u8 = 0;
const RESOLVING: u8 = 1;
const RESOLVED: u8 = 2;

impl<T> Resolved<T> {
    const fn new(placeholder: T) -> Resolved<T> {
        Resolved {
            state: AtomicU8::new(UNRESOLVED),
            value: std::cell::UnsafeCell::new(placeholder),
        }
    }

    /// The value, looked up with `resolve` on the first call; `None` while that runs.
    fn get(&self, resolve: impl FnOnce() -> T) -> Option<&T> {
        match self.state.load(Ordering::Acquire) {
            RESOLVED => {}
            UNRESOLVED => {
                if self
                    .state
                    .compare_exchange(UNRESOLVED, RESOLVING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    let found = resolve();
                    // SAFETY: only the thread that won the exchange writes, and no thread reads
                    // before `state` is RESOLVED.
                    unsafe { *self.value.get() = found };
                    self.state.store(RESOLVED, Ordering::Release);
                } else if self.state.load(Ordering::Acquire) != RESOLVED {
                    return None;
                }
            }
            _ => return None,
        }
        // SAFETY: `value` is no longer written once `state` is RESOLVED.
        Some(unsafe { &*self.value.get() })
    }
}

/// glibc's own allocator, for this library's Rust allocations and the runtime's C library
/// calls. Its `__libc_*` entry points are looked up in libc.so.6 itself: an allocator preloaded
/// after this shim (mimalloc, tcmalloc) defines the same names, and a plain reference binds to
/// that allocator, whose arenas may lie in the window, where a runtime thread must never wait.
mod glibc_fns {
    use super::*;

    extern "C" {
        // Fallback when libc.so.6 cannot be opened by name (never seen): whatever the loader binds.
        #[link_name = "__libc_malloc"]
        fn bound_malloc(size: size_t) -> *mut c_void;
        #[link_name = "__libc_calloc"]
        fn bound_calloc(n: size_t, size: size_t) -> *mut c_void;
        #[link_name = "__libc_realloc"]
        fn bound_realloc(p: *mut c_void, size: size_t) -> *mut c_void;
        #[link_name = "__libc_memalign"]
        fn bound_memalign(align: size_t, size: size_t) -> *mut c_void;
        #[link_name = "__libc_free"]
        fn bound_free(p: *mut c_void);
    }

    pub struct Fns {
        pub malloc: MallocFn,
        pub calloc: CallocFn,
        pub realloc: ReallocFn,
        pub memalign: MemalignFn,
        pub free: FreeFn,
    }

    static FNS: Resolved<Fns> = Resolved::new(Fns {
        malloc: bound_malloc,
        calloc: bound_calloc,
        realloc: bound_realloc,
        memalign: bound_memalign,
        free: bound_free,
    });

    fn resolve() -> Fns {
        // SAFETY: dlopen of the already loaded C library (RTLD_NOLOAD loads nothing) and dlsym
        // with NUL-terminated names; each pointer found is the glibc function of that name,
        // whose C type is the one given (malloc(3)).
        unsafe {
            let h = libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
            let sym = |name: &std::ffi::CStr| -> Option<usize> {
                if h.is_null() {
                    return None;
                }
                let f = libc::dlsym(h, name.as_ptr());
                (!f.is_null()).then_some(f as usize)
            };
            macro_rules! get {
                ($name:expr, $t:ty, $fallback:expr) => {
                    sym($name).map_or($fallback as $t, |f| std::mem::transmute::<usize, $t>(f))
                };
            }
            Fns {
                malloc: get!(c"__libc_malloc", MallocFn, bound_malloc),
                calloc: get!(c"__libc_calloc", CallocFn, bound_calloc),
                realloc: get!(c"__libc_realloc", ReallocFn, bound_realloc),
                memalign: get!(c"__libc_memalign", MemalignFn, bound_memalign),
                free: get!(c"__libc_free", FreeFn, bound_free),
            }
        }
    }

    /// glibc's functions, or `None` while they are being looked up (the lookup itself may
    /// allocate: the caller uses the bootstrap arena then).
    pub fn get() -> Option<&'static Fns> {
        FNS.get(resolve)
    }
}

/// glibc's `malloc` (a bootstrap block while glibc's functions are being looked up).
pub unsafe fn libc_malloc(size: size_t) -> *mut c_void {
    match glibc_fns::get() {
        // SAFETY: glibc's malloc with the caller's argument.
        Some(f) => unsafe { (f.malloc)(size) },
        None => arena_alloc(size, 16),
    }
}

/// glibc's `calloc` (bootstrap blocks are zero).
pub unsafe fn libc_calloc(n: size_t, size: size_t) -> *mut c_void {
    match glibc_fns::get() {
        // SAFETY: glibc's calloc with the caller's arguments.
        Some(f) => unsafe { (f.calloc)(n, size) },
        None => n.checked_mul(size).map_or(ptr::null_mut(), |t| arena_alloc(t, 16)),
    }
}

/// glibc's `realloc`; a bootstrap block is copied into a new glibc block.
pub unsafe fn libc_realloc(p: *mut c_void, size: size_t) -> *mut c_void {
    if p.is_null() || in_arena(p) {
        // SAFETY: a new block of `size` bytes; a bootstrap block holds arena_size(p) bytes.
        unsafe {
            let n = libc_malloc(size);
            if !n.is_null() && !p.is_null() {
                ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, arena_size(p).min(size));
            }
            return n;
        }
    }
    match glibc_fns::get() {
        // SAFETY: glibc's realloc on a glibc block.
        Some(f) => unsafe { (f.realloc)(p, size) },
        None => ptr::null_mut(),
    }
}

/// glibc's `memalign`.
pub unsafe fn libc_memalign(align: size_t, size: size_t) -> *mut c_void {
    match glibc_fns::get() {
        // SAFETY: glibc's memalign with the caller's arguments.
        Some(f) => unsafe { (f.memalign)(align, size) },
        None if align <= 4096 => arena_alloc(size, align),
        None => ptr::null_mut(),
    }
}

/// glibc's `free`; bootstrap blocks are ignored.
pub unsafe fn libc_free(p: *mut c_void) {
    if p.is_null() || in_arena(p) {
        return;
    }
    if let Some(f) = glibc_fns::get() {
        // SAFETY: glibc's free on a glibc block.
        unsafe { (f.free)(p) }
    }
}

type MallocFn = unsafe extern "C" fn(size_t) -> *mut c_void;
type CallocFn = unsafe extern "C" fn(size_t, size_t) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, size_t) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type MemalignFn = unsafe extern "C" fn(size_t, size_t) -> *mut c_void;
type PosixMemalignFn = unsafe extern "C" fn(*mut *mut c_void, size_t, size_t) -> c_int;
type UsableFn = unsafe extern "C" fn(*mut c_void) -> size_t;
type ReallocarrayFn = unsafe extern "C" fn(*mut c_void, size_t, size_t) -> *mut c_void;
/// jemalloc's extended API (`mallocx(3)`).
pub type MallocxFn = unsafe extern "C" fn(size_t, c_int) -> *mut c_void;
pub type RallocxFn = unsafe extern "C" fn(*mut c_void, size_t, c_int) -> *mut c_void;
pub type XallocxFn = unsafe extern "C" fn(*mut c_void, size_t, size_t, c_int) -> size_t;
pub type SallocxFn = unsafe extern "C" fn(*const c_void, c_int) -> size_t;
pub type DallocxFn = unsafe extern "C" fn(*mut c_void, c_int);
pub type SdallocxFn = unsafe extern "C" fn(*mut c_void, size_t, c_int);

/// The next allocator's functions; `None` where it does not define one.
pub struct Next {
    /// True when the next `malloc` is glibc's: the `__libc_*` entry points are used.
    pub glibc: bool,
    malloc: Option<MallocFn>,
    calloc: Option<CallocFn>,
    realloc: Option<ReallocFn>,
    free: Option<FreeFn>,
    memalign: Option<MemalignFn>,
    aligned_alloc: Option<MemalignFn>,
    posix_memalign: Option<PosixMemalignFn>,
    valloc: Option<MallocFn>,
    pvalloc: Option<MallocFn>,
    usable: Option<UsableFn>,
    reallocarray: Option<ReallocarrayFn>,
    pub mallocx: Option<MallocxFn>,
    pub rallocx: Option<RallocxFn>,
    pub xallocx: Option<XallocxFn>,
    pub sallocx: Option<SallocxFn>,
    pub dallocx: Option<DallocxFn>,
    pub sdallocx: Option<SdallocxFn>,
}

const GLIBC: Next = Next {
    glibc: true,
    malloc: None,
    calloc: None,
    realloc: None,
    free: None,
    memalign: None,
    aligned_alloc: None,
    posix_memalign: None,
    valloc: None,
    pvalloc: None,
    usable: None,
    reallocarray: None,
    mallocx: None,
    rallocx: None,
    xallocx: None,
    sallocx: None,
    dallocx: None,
    sdallocx: None,
};

static NEXT: Resolved<Next> = Resolved::new(GLIBC);

/// The next allocator, or `None` while it is being looked up (the caller uses the bootstrap
/// arena then).
pub fn next() -> Option<&'static Next> {
    NEXT.get(resolve)
}

/// The base address of the object defining `f` (0 if unknown).
fn object_of(f: *mut c_void) -> usize {
    // SAFETY: dladdr only reads the loader's tables and fills `info`.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(f as *const c_void, &mut info) == 0 {
            return 0;
        }
        info.dli_fbase as usize
    }
}

fn resolve() -> Next {
    // SAFETY: dlsym with NUL-terminated names; RTLD_NEXT searches the objects after this one.
    let sym = |name: &std::ffi::CStr| unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    let malloc = sym(c"malloc");
    if malloc.is_null() {
        return GLIBC;
    }
    let home = object_of(malloc);
    // The C library's object, known by a function no allocator defines: glibc's own functions
    // may still be being looked up (this lookup can run inside that one, when `dlopen`
    // allocates), and taking them as unknown once made glibc pass for another allocator.
    let libc_home = object_of(libc::getpid as *mut c_void);
    if home == 0 || home == libc_home {
        return GLIBC;
    }
    let own = |name: &std::ffi::CStr| -> Option<usize> {
        let f = sym(name);
        (!f.is_null() && object_of(f) == home).then_some(f as usize)
    };
    // SAFETY: each pointer is the named function of the allocator, whose C type is the one
    // its manual gives (malloc(3), posix_memalign(3), mallocx(3)).
    unsafe {
        macro_rules! get {
            ($name:expr, $t:ty) => {
                own($name).map(|f| std::mem::transmute::<usize, $t>(f))
            };
        }
        Next {
            glibc: false,
            malloc: get!(c"malloc", MallocFn),
            calloc: get!(c"calloc", CallocFn),
            realloc: get!(c"realloc", ReallocFn),
            free: get!(c"free", FreeFn),
            memalign: get!(c"memalign", MemalignFn),
            aligned_alloc: get!(c"aligned_alloc", MemalignFn),
            posix_memalign: get!(c"posix_memalign", PosixMemalignFn),
            valloc: get!(c"valloc", MallocFn),
            pvalloc: get!(c"pvalloc", MallocFn),
            usable: get!(c"malloc_usable_size", UsableFn),
            reallocarray: get!(c"reallocarray", ReallocarrayFn),
            mallocx: get!(c"mallocx", MallocxFn),
            rallocx: get!(c"rallocx", RallocxFn),
            xallocx: get!(c"xallocx", XallocxFn),
            sallocx: get!(c"sallocx", SallocxFn),
            dallocx: get!(c"dallocx", DallocxFn),
            sdallocx: get!(c"sdallocx", SdallocxFn),
        }
    }
}

/// Bootstrap arena: serves allocations made while the next allocator is being looked up.
/// Each block has a 16-byte header holding its size; blocks are never reused.
const ARENA_BYTES: usize = 256 << 10;
#[repr(C, align(4096))]
struct Arena(std::cell::UnsafeCell<[u8; ARENA_BYTES]>);
// SAFETY: disjoint blocks are handed out by an atomic bump pointer; each is used by one caller.
unsafe impl Sync for Arena {}
static ARENA: Arena = Arena(std::cell::UnsafeCell::new([0; ARENA_BYTES]));
static ARENA_USED: AtomicUsize = AtomicUsize::new(0);

fn arena_base() -> usize {
    ARENA.0.get() as usize
}

/// True if `p` is a bootstrap block (never freed).
pub fn in_arena(p: *const c_void) -> bool {
    let a = p as usize;
    a >= arena_base() && a < arena_base() + ARENA_BYTES
}

/// Says `msg` on stderr the first time `said` is unset, without allocating (this runs inside
/// malloc): a refused allocation must name its cause, or a program's "out of memory" abort
/// leaves nothing to act on.
pub fn say_once(said: &std::sync::atomic::AtomicBool, msg: &str) {
    if !said.swap(true, Ordering::Relaxed) {
        // SAFETY: write(2) of a valid buffer to the standard error descriptor.
        unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
    }
}

/// A zeroed bootstrap block of `size` bytes aligned to `align` (at most 4096), or null.
pub fn arena_alloc(size: usize, align: usize) -> *mut c_void {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let align = align.clamp(16, 4096);
    let mut cur = ARENA_USED.load(Ordering::Relaxed);
    loop {
        let start = (arena_base() + cur + 16).next_multiple_of(align) - arena_base();
        let end = start + size;
        if end > ARENA_BYTES {
            say_once(
                &SAID,
                "rackmem: warning: the 256 KiB bootstrap arena is used up; an allocation made while the \
                 program's allocator was being looked up failed\n",
            );
            return ptr::null_mut();
        }
        match ARENA_USED.compare_exchange(cur, end, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => {
                let p = (arena_base() + start) as *mut u8;
                // SAFETY: [start-16, end) lies in the arena and belongs to this caller alone
                // (the bump pointer moved past it); the header records the size.
                unsafe { (p.sub(16) as *mut usize).write(size) };
                return p as *mut c_void;
            }
            Err(now) => cur = now,
        }
    }
}

/// The size of a bootstrap block.
pub fn arena_size(p: *const c_void) -> usize {
    // SAFETY: `p` is a block from `arena_alloc`, whose header sits 16 bytes before it.
    unsafe { ((p as *const u8).sub(16) as *const usize).read() }
}

impl Next {
    /// `malloc` of the program's allocator.
    pub unsafe fn malloc(&self, size: size_t) -> *mut c_void {
        // SAFETY: calls into the program's allocator (or glibc's) with the arguments of
        // the caller's own call, whose contract is the C function's.
        unsafe {
            match self.malloc {
                Some(f) => f(size),
                None => libc_malloc(size),
            }
        }
    }

    pub unsafe fn calloc(&self, n: size_t, size: size_t) -> *mut c_void {
        // SAFETY: calls into the program's allocator (or glibc's) with the arguments of
        // the caller's own call, whose contract is the C function's.
        unsafe {
            match (self.glibc, self.calloc) {
                (false, Some(f)) => f(n, size),
                (false, None) => match n.checked_mul(size) {
                    Some(t) => {
                        let p = self.malloc(t);
                        if !p.is_null() {
                            ptr::write_bytes(p as *mut u8, 0, t);
                        }
                        p
                    }
                    None => ptr::null_mut(),
                },
                _ => libc_calloc(n, size),
            }
        }
    }

    pub unsafe fn realloc(&self, p: *mut c_void, size: size_t) -> *mut c_void {
        // SAFETY: calls into the program's allocator (or glibc's) with the arguments of
        // the caller's own call, whose contract is the C function's.
        unsafe {
            match self.realloc {
                Some(f) => f(p, size),
                None => libc_realloc(p, size),
            }
        }
    }

    pub unsafe fn free(&self, p: *mut c_void) {
        // SAFETY: calls into the program's allocator (or glibc's) with the arguments of
        // the caller's own call, whose contract is the C function's.
        unsafe {
            match self.free {
                Some(f) => f(p),
                None => libc_free(p),
            }
        }
    }

    pub unsafe fn memalign(&self, align: size_t, size: size_t) -> *mut c_void {
        // SAFETY: calls into the program's allocator (or glibc's) with the arguments of
        // the caller's own call, whose contract is the C function's.
        unsafe {
            if self.glibc {
                return libc_memalign(align, size);
            }
            if let Some(f) = self.memalign {
                return f(align, size);
            }
            if let Some(f) = self.posix_memalign {
                let mut out = ptr::null_mut();
                let a = align.max(std::mem::size_of::<*mut c_void>());
                return if f(&mut out, a, size) == 0 {
                    out
                } else {
                    ptr::null_mut()
                };
            }
            match self.aligned_alloc {
                Some(f) => f(align, size.next_multiple_of(align.max(1))),
                None => ptr::null_mut(),
            }
        }
    }

    pub unsafe fn aligned_alloc(&self, align: size_t, size: size_t) -> *mut c_void {
        // SAFETY: calls into the program's allocator (or glibc's) with the arguments of
        // the caller's own call, whose contract is the C function's.
        unsafe {
            match (self.glibc, self.aligned_alloc) {
                (false, Some(f)) => f(align, size),
                _ => self.memalign(align, size),
            }
        }
    }

    pub unsafe fn posix_memalign(&self, out: *mut *mut c_void, align: size_t, size: size_t) -> c_int {
        // SAFETY: calls into the program's allocator (or glibc's) with the arguments of
        // the caller's own call, whose contract is the C function's.
        unsafe {
            match (self.glibc, self.posix_memalign) {
                (false, Some(f)) => f(out, align, size),
                _ => {
                    let p = self.memalign(align, size);
                    if p.is_null() {
                        return libc::ENOMEM;
                    }
                    *out = p;
                    0
                }
            }
        }
    }

    pub unsafe fn valloc(&self, size: size_t) -> *mut c_void {
        // SAFETY: calls into the program's allocator (or glibc's) with the arguments of
        // the caller's own call, whose contract is the C function's.
        unsafe {
            match (self.glibc, self.valloc) {
                (false, Some(f)) => f(size),
                _ => self.memalign(4096, size),
            }
        }
    }

    pub unsafe fn pvalloc(&self, size: size_t) -> *mut c_void {
        // SAFETY: calls into the program's allocator (or glibc's) with the arguments of
        // the caller's own call, whose contract is the C function's.
        unsafe {
            match (self.glibc, self.pvalloc) {
                (false, Some(f)) => f(size),
                _ => self.memalign(4096, size.div_ceil(4096).max(1) * 4096),
            }
        }
    }

    pub unsafe fn reallocarray(&self, p: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
        // SAFETY: calls into the program's allocator (or glibc's) with the arguments of
        // the caller's own call, whose contract is the C function's.
        unsafe {
            match (self.glibc, self.reallocarray) {
                (false, Some(f)) => f(p, n, size),
                _ => match n.checked_mul(size) {
                    Some(t) => self.realloc(p, t),
                    None => {
                        *libc::__errno_location() = libc::ENOMEM;
                        ptr::null_mut()
                    }
                },
            }
        }
    }

    /// `malloc_usable_size` of the program's allocator (0 if it has none).
    pub unsafe fn usable_size(&self, p: *mut c_void) -> size_t {
        // SAFETY: calls into the program's allocator (or glibc's) with the arguments of
        // the caller's own call, whose contract is the C function's.
        unsafe {
            if let Some(f) = self.usable {
                return f(p);
            }
            if !self.glibc {
                return 0;
            }
            static GLIBC_USABLE: AtomicUsize = AtomicUsize::new(0);
            let mut f = GLIBC_USABLE.load(Ordering::Acquire);
            if f == 0 {
                f = { libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) } as usize;
                GLIBC_USABLE.store(f, Ordering::Release);
            }
            if f == 0 {
                return 0;
            }
            std::mem::transmute::<usize, UsableFn>(f)(p)
        }
    }
}

/// Blocks that glibc gave to the runtime's own calls (see [`internal_malloc`]), so that `free`
/// can send them back to glibc whatever thread frees them. An open-addressed table of
/// addresses; 0 is an empty slot, 1 a removed one.
const TRACK_SLOTS: usize = 1 << 14;
const REMOVED: usize = 1;
static TRACKED: [AtomicUsize; TRACK_SLOTS] = [const { AtomicUsize::new(0) }; TRACK_SLOTS];
static TRACKED_LIVE: AtomicUsize = AtomicUsize::new(0);

fn slot_of(p: usize) -> usize {
    (p >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - 14)
}

fn track(p: usize) -> bool {
    let mut i = slot_of(p);
    for _ in 0..TRACK_SLOTS {
        let cur = TRACKED[i].load(Ordering::Acquire);
        if (cur == 0 || cur == REMOVED)
            && TRACKED[i]
                .compare_exchange(cur, p, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            TRACKED_LIVE.fetch_add(1, Ordering::AcqRel);
            return true;
        }
        i = (i + 1) % TRACK_SLOTS;
    }
    false
}

/// True while the table has room for allocations that may not be the runtime's (those made
/// while a runtime thread starts): a quarter stays for the runtime's own calls.
pub fn tracked_has_room_for_others() -> bool {
    TRACKED_LIVE.load(Ordering::Acquire) < TRACK_SLOTS * 3 / 4
}

/// Removes `p` from the table; true if it was there (a glibc block of the runtime's calls).
pub fn untrack(p: *mut c_void) -> bool {
    let p = p as usize;
    if TRACKED_LIVE.load(Ordering::Acquire) == 0 {
        return false;
    }
    let mut i = slot_of(p);
    for _ in 0..TRACK_SLOTS {
        match TRACKED[i].load(Ordering::Acquire) {
            0 => return false,
            x if x == p => {
                TRACKED[i].store(REMOVED, Ordering::Release);
                TRACKED_LIVE.fetch_sub(1, Ordering::AcqRel);
                return true;
            }
            _ => i = (i + 1) % TRACK_SLOTS,
        }
    }
    false
}

/// True if `p` is a glibc block of the runtime's calls.
pub fn is_tracked(p: *const c_void) -> bool {
    let p = p as usize;
    if TRACKED_LIVE.load(Ordering::Acquire) == 0 {
        return false;
    }
    let mut i = slot_of(p);
    for _ in 0..TRACK_SLOTS {
        match TRACKED[i].load(Ordering::Acquire) {
            0 => return false,
            x if x == p => return true,
            _ => i = (i + 1) % TRACK_SLOTS,
        }
    }
    false
}

/// A block for a C library call made by the runtime itself (its threads, or a program thread
/// inside a runtime call): always glibc's, whose memory is never in the window. The program's
/// allocator may keep its arenas in the window (its large mappings go there), and a runtime
/// thread touching the window, or making the allocator purge window pages, would wait on a fault
/// or event only that thread can serve. `zero`: calloc semantics.
pub fn internal_malloc(size: usize, zero: bool) -> *mut c_void {
    // SAFETY: plain calls into glibc's allocator.
    let p = unsafe {
        if zero {
            libc_calloc(1, size)
        } else {
            libc_malloc(size)
        }
    };
    if !p.is_null() && !track(p as usize) {
        // Table full (the runtime never holds that many C blocks): refuse rather than hand out
        // a block `free` would send to the wrong allocator.
        // SAFETY: `p` just came from glibc.
        unsafe { libc_free(p) };
        track_full();
        return ptr::null_mut();
    }
    p
}

/// Says that the table of the runtime's own C blocks is full (once).
fn track_full() {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    say_once(
        &SAID,
        "rackmem: internal error: the runtime holds 16,384 blocks of the C library's allocator; \
         an allocation of the runtime's was refused\n",
    );
}

/// `realloc` of a tracked glibc block.
pub fn internal_realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: `p` is a live glibc block (tracked).
    let n = unsafe { libc_realloc(p, size) };
    if !n.is_null() && n != p {
        untrack(p);
        if !track(n as usize) {
            // SAFETY: `n` just came from glibc.
            unsafe { libc_free(n) };
            track_full();
            return ptr::null_mut();
        }
    }
    n
}

/// `memalign` for the runtime's own calls (see [`internal_malloc`]).
pub fn internal_memalign(align: usize, size: usize) -> *mut c_void {
    // SAFETY: plain call into glibc's allocator.
    let p = unsafe { libc_memalign(align, size) };
    if !p.is_null() && !track(p as usize) {
        // SAFETY: `p` just came from glibc.
        unsafe { libc_free(p) };
        track_full();
        return ptr::null_mut();
    }
    p
}

/// glibc's `malloc_usable_size` (found in libc.so.6 itself: `RTLD_NEXT` may name another
/// allocator's).
pub fn glibc_usable_size(p: *mut c_void) -> usize {
    static F: AtomicUsize = AtomicUsize::new(0);
    let mut f = F.load(Ordering::Acquire);
    if f == 0 {
        // SAFETY: dlopen of the already loaded C library (RTLD_NOLOAD loads nothing) and dlsym
        // with NUL-terminated names.
        f = unsafe {
            let h = libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
            if h.is_null() {
                0
            } else {
                libc::dlsym(h, c"malloc_usable_size".as_ptr()) as usize
            }
        };
        F.store(f, Ordering::Release);
    }
    if f == 0 {
        return 0;
    }
    // SAFETY: glibc's malloc_usable_size on a live glibc block.
    unsafe { std::mem::transmute::<usize, UsableFn>(f)(p) }
}
