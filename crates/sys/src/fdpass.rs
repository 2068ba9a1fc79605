//! Handing file descriptors over a Unix stream socket (`SCM_RIGHTS`): a brick sends the memory
//! file of a segment it shares, a node receives it with the answer's bytes.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Sends `data` on the Unix stream socket `sock` with `fd` attached (`SCM_RIGHTS`); returns the
/// bytes sent (the descriptor travels with the first of them: send the rest with plain writes).
pub fn send_with_fd(sock: BorrowedFd<'_>, data: &[u8], fd: BorrowedFd<'_>) -> io::Result<usize> {
    let fd_len = std::mem::size_of::<libc::c_int>() as u32;
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_len) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: an all-zero msghdr is valid (null name, no iovecs yet).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at `control`, which has room for one header carrying one int
    // (CMSG_SPACE above), so CMSG_FIRSTHDR is non-null and CMSG_DATA lies inside `control`.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(fd_len) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut libc::c_int, fd.as_raw_fd());
    }
    loop {
        // SAFETY: sendmsg(2) reads `data` through the iovec and the control buffer, both alive
        // for the call; MSG_NOSIGNAL turns a closed peer into EPIPE rather than SIGPIPE.
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives into `buf` from the Unix stream socket `sock` like `read(2)`, keeping any
/// descriptors that came with the bytes (`SCM_RIGHTS`) in `fds` (close-on-exec).
pub fn recv_with_fds(sock: BorrowedFd<'_>, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    // Room for a few descriptors: a brick sends one per message; more would be a misbehaving
    // peer, and the kernel closes what does not fit (MSG_CTRUNC).
    let mut control = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is valid (null name, no iovecs yet).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    let n = loop {
        // SAFETY: recvmsg(2) writes at most `buf.len()` bytes into `buf` and at most
        // `msg_controllen` bytes into `control`, both alive and exclusively ours for the call.
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if r >= 0 {
            break r as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // SAFETY: after a successful recvmsg the control buffer holds `msg_controllen` bytes of
    // well-formed headers; the CMSG_* walk stays inside them, and each SCM_RIGHTS payload holds
    // descriptors the kernel just installed in this process, owned by nobody else yet.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const libc::c_int;
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / std::mem::size_of::<libc::c_int>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(n)
}
