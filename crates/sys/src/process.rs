//! Processes, threads and signals: leaving at once, descriptors inherited across `fork`,
//! signal masks and signals, and the CPUs a thread may run on.

/// Ends the process now without running `atexit` handlers or destructors: those may touch remote
/// memory that can no longer be served, and the thread calling this may be the fault handler.
pub fn exit_immediately(status: i32) -> ! {
    // SAFETY: _exit takes no pointers and never returns; skipping atexit handlers is the point.
    unsafe { libc::_exit(status) }
}

/// Closes a file descriptor this process inherited across `fork` and will never use (the
/// parent's links and userfaultfds, owned by a runtime object the child leaks on purpose).
pub fn close_inherited(fd: std::os::fd::RawFd) {
    // SAFETY: the caller passes a descriptor whose owning object is never used or dropped in
    // this process, so nothing closes or reads it after us.
    unsafe {
        libc::close(fd);
    }
}

/// Blocks SIGPIPE in the calling thread. The runtime writes to brick sockets from threads of a
/// program whose SIGPIPE disposition is its own (the default kills it): a brick that dies must
/// turn into an error the runtime reports (EPIPE), never a silent death by signal.
pub fn block_sigpipe() {
    // SAFETY: sigset_t is plain data initialised by sigemptyset; pthread_sigmask only changes this
    // thread's signal mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Runs `f` with SIGPIPE blocked in the calling thread (a program thread, e.g. in the fork
/// hooks), restoring the thread's mask afterwards. A SIGPIPE that `f` raised (a write to a brick
/// that died: links write without `MSG_NOSIGNAL`) is taken off the pending set first: unblocked,
/// it would kill the program that the error was returned to. One pending before `f` stays.
pub fn without_sigpipe<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: as in `block_sigpipe`; the old mask is saved and restored on this same thread.
    let (old, set, was_pending) = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        let mut pending: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut pending);
        (old, set, libc::sigismember(&pending, libc::SIGPIPE) == 1)
    };
    let r = f();
    // SAFETY: `set` holds SIGPIPE only, which is blocked here, so sigtimedwait with a zero
    // timeout takes a pending one (or returns EAGAIN at once); then the mask saved above is
    // restored.
    unsafe {
        if !was_pending {
            let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            libc::sigtimedwait(&set, std::ptr::null_mut(), &zero);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
    r
}

/// Runs `f` with every asynchronous signal blocked in the calling thread, restoring its mask
/// afterwards: threads `f` creates start with them blocked. The runtime's threads are made so:
/// the kernel delivers a signal sent to the process to any thread that does not block it, and
/// the program's handler must run on one of the program's threads (natively, where else?), not
/// on a runtime thread, where a handler touching window memory would wait for itself and a
/// program that blocks a signal to take it from a signalfd (PostgreSQL with SIGURG) would never
/// see it. Signals the hardware raises (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS) stay
/// unblocked: blocked, they would kill the process instead of reaching its handler.
pub fn with_async_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigset_t is plain data initialised by sigfillset/sigemptyset; pthread_sigmask only
    // changes this thread's mask, and the old one is saved and restored on this same thread.
    let old = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for sig in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGTRAP,
            libc::SIGSYS,
        ] {
            libc::sigdelset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        old
    };
    let r = f();
    // SAFETY: restores the mask saved above.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
    r
}

/// Words of 64 CPUs in an affinity mask: `CPU_SETSIZE` (1024) CPUs, as glibc's `cpu_set_t`.
pub const MASK_WORDS: usize = 16;

/// An affinity mask: bit `c % 64` of word `c / 64` is CPU `c` (the kernel's layout, which is
/// `cpu_set_t`'s byte for byte on a little-endian machine).
pub type CpuMask = [u64; MASK_WORDS];

/// The affinity mask of thread `tid` (0: the calling thread) as the kernel has it, read with the
/// system call itself: the C library's `sched_getaffinity` is interposed by `librackmem.so`
/// (a thread the fault handler confines is told its own mask), and the runtime must see the
/// mask it set. `None` if it cannot be read (the thread is gone).
pub fn kernel_thread_mask(tid: u32) -> Option<CpuMask> {
    let tid = libc::pid_t::try_from(tid).ok()?;
    let mut mask: CpuMask = [0; MASK_WORDS];
    // SAFETY: the kernel writes at most the size passed (the mask's) into `mask`, plain words.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getaffinity,
            tid,
            std::mem::size_of::<CpuMask>(),
            mask.as_mut_ptr(),
        )
    };
    // The kernel returns the bytes it wrote (the rest of `mask` stays zero), or -1.
    (r >= 0).then_some(mask)
}

/// The CPUs set in `mask`, ascending.
pub fn mask_cpus(mask: &CpuMask) -> Vec<usize> {
    (0..MASK_WORDS * 64)
        .filter(|&c| mask[c / 64] >> (c % 64) & 1 == 1)
        .collect()
}

/// The mask holding exactly `cpus` (CPUs past the mask's 1024 are left out).
pub fn cpus_mask(cpus: &[usize]) -> CpuMask {
    let mut mask: CpuMask = [0; MASK_WORDS];
    for &c in cpus.iter().filter(|&&c| c < MASK_WORDS * 64) {
        mask[c / 64] |= 1 << (c % 64);
    }
    mask
}

/// How many CPUs the calling thread may run on (its affinity mask as the kernel has it; 0 if it
/// cannot be read).
pub fn allowed_cpus() -> usize {
    kernel_thread_mask(0).map_or(0, |m| m.iter().map(|w| w.count_ones() as usize).sum())
}

/// The CPUs thread `tid` of this process (0: the calling thread) may run on, as the kernel has
/// them; empty if its mask cannot be read (the thread is gone).
pub fn thread_cpus(tid: u32) -> Vec<usize> {
    kernel_thread_mask(tid).map(|m| mask_cpus(&m)).unwrap_or_default()
}

/// Confines thread `tid` of this process (0: the calling thread), and only it, to `cpus` (a
/// thread started by it afterwards, or a process it starts, inherits the mask). Fails if the
/// kernel refused (the thread is gone, or a CPU is offline) or a CPU is out of range (EINVAL).
pub fn set_thread_cpus(tid: u32, cpus: &[usize]) -> std::io::Result<()> {
    let einval = || std::io::Error::from_raw_os_error(libc::EINVAL);
    let tid = libc::pid_t::try_from(tid).map_err(|_| einval())?;
    // SAFETY: cpu_set_t is plain data; CPU_SET writes inside it (indices checked below);
    // sched_setaffinity only reads it and changes that thread's mask.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c >= libc::CPU_SETSIZE as usize {
                return Err(einval());
            }
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The calling thread's id.
pub fn this_thread_id() -> u32 {
    // SAFETY: gettid takes nothing and cannot fail.
    let tid = unsafe { libc::gettid() };
    u32::try_from(tid).unwrap_or(0)
}

/// Sends `signal` to process `pid`; errors (the process is gone) are ignored.
pub fn send_signal(pid: u32, signal: i32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) takes plain integers; a stale pid at worst returns ESRCH.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Whether process `pid` still exists (a zombie not yet reaped counts as gone: it holds no
/// memory). Any process may be asked: a process of another user answers EPERM to kill(2), which
/// still says it exists.
pub fn process_alive(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill(2) with signal 0 sends nothing; it only checks that the process exists.
    let r = unsafe { libc::kill(p, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    // A zombie still answers kill(2): its state in /proc says it is dead.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !matches!(
            s.rsplit_once(')').map(|(_, r)| r.trim_start().as_bytes().first()),
            Some(Some(b'Z' | b'X'))
        ),
        // Hidden (hidepid) or just gone: kill(2) said it existed; the next look decides.
        Err(_) => true,
    }
}

/// The largest resident set of any child process reaped so far (and of their reaped
/// descendants), in bytes: `getrusage(RUSAGE_CHILDREN)`'s `ru_maxrss`.
pub fn children_max_rss_bytes() -> std::io::Result<u64> {
    // SAFETY: rusage is plain data; all-zero is a valid value for it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage for the call to fill.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024)
}

/// The calling process's effective user and group ids.
pub fn effective_ids() -> (u32, u32) {
    // SAFETY: geteuid and getegid take nothing and cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// Bytes of process `pid`'s anonymous memory (mappings without a file, the heap included) whose
/// pages were accessed since the last [`clear_referenced`] (the `Referenced:` lines of
/// `/proc/PID/smaps`): pages touched at least once, counted once however often.
pub fn referenced_anon_bytes(pid: u32) -> std::io::Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let mut total_kib = 0u64;
    let mut anonymous = false;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if first.contains('-') && first.chars().next().is_some_and(|c| c.is_ascii_hexdigit()) {
            // A mapping's header: address perms offset dev inode [path]; anonymous when the path
            // is absent or [heap].
            let path = line.split_whitespace().nth(5);
            anonymous = matches!(path, None | Some("[heap]"));
        } else if first == "Referenced:" && anonymous {
            total_kib += fields.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    Ok(total_kib * 1024)
}

/// Clears the accessed bits of every page of process `pid` (`/proc/PID/clear_refs`, 1), so that
/// [`referenced_anon_bytes`] counts from now. The kernel's reclaim uses the same bits: clearing
/// them makes pages look cold to it until touched again.
pub fn clear_referenced(pid: u32) -> std::io::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), b"1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_mask_is_the_c_librarys() {
        // SAFETY: cpu_set_t is plain data (all zeros is an empty set); sched_getaffinity fills
        // at most its size. This test binary does not load librackmem.so: this is glibc's.
        let (r, set) = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let r = libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
            (r, set)
        };
        assert_eq!(r, 0, "sched_getaffinity failed: {}", std::io::Error::last_os_error());
        let libc_cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: CPU_ISSET reads inside the set (indices below CPU_SETSIZE).
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect();
        assert!(!libc_cpus.is_empty());
        assert_eq!(thread_cpus(0), libc_cpus);
        assert_eq!(allowed_cpus(), libc_cpus.len());
        let m = kernel_thread_mask(this_thread_id()).expect("this thread's mask");
        assert_eq!(mask_cpus(&m), libc_cpus);
    }

    #[test]
    fn masks_and_cpu_lists_convert_both_ways() {
        let cpus = vec![0, 1, 63, 64, 130, 1023];
        assert_eq!(mask_cpus(&cpus_mask(&cpus)), cpus);
        assert_eq!(mask_cpus(&cpus_mask(&[1024, 5])), vec![5]);
        assert_eq!(cpus_mask(&[65])[1], 2);
    }
}
