//! The mmap family's interposers (`mmap`, `munmap`, `mremap`, `mprotect`, `madvise`): large
//! private anonymous mappings go to the window, the runtime serves calls on window ranges, and
//! the rest are passed to the system calls.

use crate::family;
use crate::{set_errno, window_runtime, Inside};
use libc::{c_int, c_void, off_t, size_t};
use rackmem_runtime::{in_window, CallGuard};
use std::ptr;

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
    let r = syscall_result(r);
    if r != -1 && flags & (libc::MAP_SHARED | libc::MAP_ANONYMOUS) == (libc::MAP_SHARED | libc::MAP_ANONYMOUS) {
        shared_stays_local(len);
    }
    r as *mut c_void
}

/// A shared anonymous mapping of at least the threshold (PostgreSQL's shared buffers, a
/// multi-process server's shared cache) stays local: counted, and told once, with its size.
fn shared_stays_local(len: size_t) {
    if !crate::wants_window(len) || rackmem_runtime::is_runtime_thread() {
        return;
    }
    rackmem_runtime::note_shared_local(len as u64);
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if SAID.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    // Formatted on the stack: this runs inside mmap, which an allocator may be calling.
    let mut buf = [0u8; 400];
    let mut w = &mut buf[..];
    let _ = std::io::Write::write_fmt(
        &mut w,
        format_args!(
            "rackmem: notice: this program maps shared memory (MAP_SHARED|MAP_ANONYMOUS, {} MiB here): \
             shared mappings stay local, whatever --local says (a page shared between processes has no \
             single owner to evict it for); its statistics count them as shared_local_bytes\n",
            len >> 20
        ),
    );
    let n = 400 - w.len();
    family::say_once(
        &SAID,
        std::str::from_utf8(&buf[..n]).unwrap_or("rackmem: notice: shared memory stays local\n"),
    );
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
