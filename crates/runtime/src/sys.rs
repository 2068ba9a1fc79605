//! The runtime's exit statuses, and the process calls it makes (from `rackmem-sys`: leaving the
//! process at once when its remote memory is gone, signal masks, the CPUs a thread may run on).

/// Exit status of a program whose remote memory was lost (a brick died or stopped answering).
pub const EXIT_BRICK_LOST: i32 = 112;
/// Exit status of a program whose runtime could not start (bad configuration, no brick).
pub const EXIT_RUNTIME_FAILED: i32 = 111;

pub use rackmem_sys::process::{
    allowed_cpus, block_sigpipe, close_inherited, exit_immediately, this_thread_id, thread_cpus,
    with_async_signals_blocked, without_sigpipe, CpuMask,
};

/// Confines thread `tid` (0: the calling thread) to `cpus`; false if the kernel refused (the
/// thread is gone, or a CPU is offline): placement is advisory, so callers go on either way.
pub fn set_thread_cpus(tid: u32, cpus: &[usize]) -> bool {
    rackmem_sys::process::set_thread_cpus(tid, cpus).is_ok()
}
