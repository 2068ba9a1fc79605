//! The functions of `include/rackmem.h`, for programs that ask for remote memory themselves.

use crate::malloc::window_release;
use crate::{runtime, Inside};
use libc::{c_int, c_void, size_t};
use rackmem_runtime::{in_window, CallGuard};
use std::ptr;

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
