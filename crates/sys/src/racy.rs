//! Copies in and out of memory that other threads or processes may be writing at the same time
//! (a window page the program touches, a shared segment a node writes), without the undefined
//! behaviour a plain Rust copy racing with a write would be.

#[cfg(not(target_arch = "x86_64"))]
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Copies `len` bytes from `src` to `dst` with `rep movsb` inside an `asm!` block.
///
/// Why not `copy_nonoverlapping`: the memory may be written meanwhile by another thread of the
/// program or by another process (a shared segment), and a plain Rust copy racing with a write
/// is undefined behaviour. An asm block is opaque to the compiler: it is not a Rust memory
/// access, and the CPU gives what the hardware gives, some mix of old and new bytes. It is as
/// sound as word-by-word atomic copies and, on CPUs with fast string moves (ERMS), runs at
/// memcpy speed (a 512 KiB copy from a shared segment took 65 µs with atomic words).
///
/// # Safety
/// `[src, src + len)` must be mapped and readable and `[dst, dst + len)` mapped and writable for
/// the duration of the call; the ranges must not overlap; no Rust reference may point into the
/// destination except the one the caller holds exclusively.
#[cfg(target_arch = "x86_64")]
unsafe fn racy_copy(dst: usize, src: usize, len: usize) {
    // SAFETY: the caller guarantees both ranges for `len` bytes. `rep movsb` copies RCX bytes
    // from RSI to RDI forwards (the ABI guarantees the direction flag is clear), touches no
    // other memory and no flags, and leaves RCX/RSI/RDI changed, which the operands declare.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") len => _,
            inout("rdi") dst => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags)
        );
    }
}

/// Copies `out.len()` bytes from `src`, soundly even while others write it (see `racy_copy`; on
/// other architectures, relaxed atomic loads: bytes up to 8-alignment, then words).
///
/// # Safety
/// `[src, src + out.len())` must be mapped and readable for the duration of the call, and not be
/// accessed non-atomically by Rust code.
pub(crate) unsafe fn atomic_load_bytes(src: usize, out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller guarantees the source; `out` is ours, exclusively, for its length.
    unsafe {
        racy_copy(out.as_mut_ptr() as usize, src, out.len())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let mut i = 0;
        while i < out.len() {
            let a = src + i;
            if a % 8 == 0 && out.len() - i >= 8 {
                // SAFETY: `a` is 8-aligned and the 8 bytes at it are mapped (caller's contract);
                // AtomicU64 has the layout of u64.
                let w = unsafe { &*(a as *const AtomicU64) }.load(Ordering::Relaxed);
                out[i..i + 8].copy_from_slice(&w.to_ne_bytes());
                i += 8;
            } else {
                // SAFETY: the byte at `a` is mapped (caller's contract).
                out[i] = unsafe { &*(a as *const AtomicU8) }.load(Ordering::Relaxed);
                i += 1;
            }
        }
    }
}

/// Copies `data` to `dst`, soundly even while others read or write it (see
/// [`atomic_load_bytes`]).
///
/// # Safety
/// `[dst, dst + data.len())` must be mapped and writable for the duration of the call, and not be
/// accessed non-atomically by Rust code.
pub(crate) unsafe fn atomic_store_bytes(dst: usize, data: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller guarantees the destination; `data` is a live slice, read only.
    unsafe {
        racy_copy(dst, data.as_ptr() as usize, data.len())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let mut i = 0;
        while i < data.len() {
            let a = dst + i;
            if a % 8 == 0 && data.len() - i >= 8 {
                let mut w = [0u8; 8];
                w.copy_from_slice(&data[i..i + 8]);
                // SAFETY: `a` is 8-aligned and the 8 bytes at it are mapped and writable
                // (caller's contract); AtomicU64 has the layout of u64.
                unsafe { &*(a as *const AtomicU64) }.store(u64::from_ne_bytes(w), Ordering::Relaxed);
                i += 8;
            } else {
                // SAFETY: the byte at `a` is mapped and writable (caller's contract).
                unsafe { &*(a as *const AtomicU8) }.store(data[i], Ordering::Relaxed);
                i += 1;
            }
        }
    }
}
