//! The one raw call the binary makes: forwarding a signal to the program it runs.

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
