//! `sched_getaffinity` and `pthread_getaffinity_np`: a thread the fault handler confines to one
//! CPU while it alone faults (`rackmem_runtime`'s placement) is told its own mask, not the
//! confinement. Programs size their thread pools from this mask, most at start, when one thread
//! faults alone: NumPy's OpenBLAS, imported while Python's main thread was confined, started
//! one thread on two CPUs and kept it for the whole run. Every other answer is the C library's.
//!
//! `pthread_getaffinity_np` of another thread than the caller is passed on as it is (a
//! `pthread_t` does not name its kernel thread), as are calls made before the runtime starts.

use libc::{c_int, cpu_set_t, pid_t, pthread_t, size_t};
use rackmem_runtime::sys::CpuMask;
use std::sync::atomic::{AtomicUsize, Ordering};

type GetAffinity = unsafe extern "C" fn(pid_t, size_t, *mut cpu_set_t) -> c_int;
type PthreadGetAffinity = unsafe extern "C" fn(pthread_t, size_t, *mut cpu_set_t) -> c_int;

static REAL_SCHED: AtomicUsize = AtomicUsize::new(0);
static REAL_PTHREAD: AtomicUsize = AtomicUsize::new(0);

/// glibc's function `name`, looked up once into `slot` (0 if libc.so.6 lacks it).
fn real(slot: &AtomicUsize, name: &std::ffi::CStr) -> usize {
    let f = slot.load(Ordering::Acquire);
    if f != 0 {
        return f;
    }
    let f = crate::malloc::glibc_symbol(name);
    slot.store(f, Ordering::Release);
    f
}

/// Writes `mask` over the `size` bytes at `out` (bytes past the mask's 1024 CPUs are zero, as
/// the C library leaves them).
///
/// # Safety
/// `out` points to `size` writable bytes.
unsafe fn write_mask(out: *mut cpu_set_t, size: size_t, mask: &CpuMask) {
    let out = out as *mut u8;
    for i in 0..size {
        // Byte `i` of the little-endian words.
        let b = mask.get(i / 8).map_or(0, |w| (w >> (8 * (i % 8))) as u8);
        // SAFETY: `i < size`, inside the caller's buffer.
        unsafe { *out.add(i) = b };
    }
}

/// The kernel thread `pid` names in an affinity call (0: the caller).
fn thread_of(pid: pid_t) -> u32 {
    if pid == 0 {
        rackmem_runtime::sys::this_thread_id()
    } else {
        u32::try_from(pid).unwrap_or(0)
    }
}

#[no_mangle]
pub unsafe extern "C" fn sched_getaffinity(pid: pid_t, size: size_t, mask: *mut cpu_set_t) -> c_int {
    let f = real(&REAL_SCHED, c"sched_getaffinity");
    if f == 0 {
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    }
    // SAFETY: glibc's sched_getaffinity has this signature.
    let f: GetAffinity = unsafe { std::mem::transmute::<usize, GetAffinity>(f) };
    // SAFETY: the caller's arguments, passed on.
    let (r, own) = rackmem_runtime::program_mask(thread_of(pid), || unsafe { f(pid, size, mask) });
    if let (0, Some(own)) = (r, own) {
        // SAFETY: the call succeeded, so `mask` holds `size` writable bytes.
        unsafe { write_mask(mask, size, &own) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn pthread_getaffinity_np(thread: pthread_t, size: size_t, mask: *mut cpu_set_t) -> c_int {
    let f = real(&REAL_PTHREAD, c"pthread_getaffinity_np");
    if f == 0 {
        return libc::ENOSYS;
    }
    // SAFETY: glibc's pthread_getaffinity_np has this signature.
    let f: PthreadGetAffinity = unsafe { std::mem::transmute::<usize, PthreadGetAffinity>(f) };
    // SAFETY: pthread_self and pthread_equal take no pointers.
    let tid = if unsafe { libc::pthread_equal(thread, libc::pthread_self()) } != 0 {
        rackmem_runtime::sys::this_thread_id()
    } else {
        0
    };
    // SAFETY: the caller's arguments, passed on.
    let (r, own) = rackmem_runtime::program_mask(tid, || unsafe { f(thread, size, mask) });
    if let (0, Some(own)) = (r, own) {
        // SAFETY: the call succeeded, so `mask` holds `size` writable bytes.
        unsafe { write_mask(mask, size, &own) };
    }
    r
}
