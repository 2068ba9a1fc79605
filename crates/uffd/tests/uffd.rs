//! The wrapper against the real kernel (these tests need root or another way to open a
//! userfaultfd with kernel-mode faults): faults served by a handler thread, including a fault
//! raised inside a system call; COPY/ZEROPAGE/MOVE/POISON and their partial-progress errors;
//! the REMOVE event and EAGAIN while it is pending; EBUSY from MOVE after fork and break_cow.
//! Which pages are present is read from `/proc/self/pagemap`.

use rackmem_sys::{Mapping, PAGE_SIZE};
use rackmem_uffd::{CopyMode, Event, Features, MoveMode, OpenOptions, RegisterMode, Uffd, UffdError};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MISSING: RegisterMode = RegisterMode {
    missing: true,
    wp: false,
    minor: false,
};
const MISSING_WP: RegisterMode = RegisterMode {
    missing: true,
    wp: true,
    minor: false,
};
const WP_INSTALL: CopyMode = CopyMode {
    write_protect: true,
    dontwake: false,
};

/// `UFFDIO_MOVE` between the test's own mappings.
fn move_pages(u: &Uffd, dst: usize, src: usize, len: usize, mode: MoveMode) -> Result<usize, UffdError> {
    // SAFETY: every caller here moves between mappings the test reserved and reaches only through
    // raw addresses and `Mapping::read`/`write`, never a Rust reference.
    unsafe { u.move_pages(dst, src, len, mode) }
}

fn open(features: Features) -> Uffd {
    Uffd::open(&OpenOptions {
        features,
        nonblocking: true,
    })
    .expect("userfaultfd (these tests need root: run ./scripts/test as root)")
}

fn pattern(page: usize) -> Vec<u8> {
    (0..PAGE_SIZE)
        .map(|i| (i as u8) ^ (page as u8).wrapping_mul(37))
        .collect()
}

/// The `/proc/self/pagemap` entry of each page of `m`: bit 63 says present, bits 0-54 hold the
/// frame number (0 unless the reader has CAP_SYS_ADMIN).
fn pagemap(m: &Mapping) -> Vec<u64> {
    let f = std::fs::File::open("/proc/self/pagemap").expect("open /proc/self/pagemap");
    let mut raw = vec![0u8; m.len() / PAGE_SIZE * 8];
    f.read_exact_at(&mut raw, (m.addr() / PAGE_SIZE * 8) as u64)
        .expect("read /proc/self/pagemap");
    raw.chunks_exact(8)
        .map(|e| u64::from_ne_bytes(e.try_into().expect("8 bytes")))
        .collect()
}

/// Pages of `m` that are present, by index.
fn present(m: &Mapping) -> Vec<usize> {
    let entries = pagemap(m);
    (0..entries.len()).filter(|&p| entries[p] >> 63 == 1).collect()
}

fn pipe() -> (i32, i32) {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    (fds[0], fds[1])
}

fn close(fd: i32) {
    // SAFETY: closing a descriptor this test opened and no longer uses.
    unsafe { libc::close(fd) };
}

/// Forks a child that runs `child` (async-signal-safe code only: the test process has other
/// threads) and then `_exit(0)`s.
fn fork_child(child: impl FnOnce()) -> libc::pid_t {
    // SAFETY: the child only runs async-signal-safe code (raw reads and `_exit`).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        child();
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    pid
}

fn wait_child(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    // SAFETY: waiting for our own child; `status` is a valid out-pointer.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid, "waitpid: {}", std::io::Error::last_os_error());
    status
}

/// The tests fork children and pass pipe ends around; run concurrently, one test's child could
/// inherit another test's pipe ends. Each test holds this lock so they run one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn features_are_negotiated_and_named() {
    let _serial = serial();
    let wanted = Features::WP_ASYNC
        | Features::MOVE
        | Features::EVENT_REMOVE
        | Features::EVENT_UNMAP
        | Features::EVENT_REMAP
        | Features::THREAD_ID
        | Features::POISON;
    let u = open(wanted);
    assert!(u.features().contains(wanted), "{}", u.features());
    // The kernel turns WP_UNPOPULATED on with WP_ASYNC, and the wrapper says so.
    assert!(u.features().contains(Features::WP_UNPOPULATED));
    let s = u.features().to_string();
    for name in [
        "WP_ASYNC",
        "MOVE",
        "EVENT_REMOVE",
        "EVENT_UNMAP",
        "EVENT_REMAP",
        "THREAD_ID",
        "POISON",
    ] {
        assert!(s.split('|').any(|n| n == name), "{name} missing from {s}");
    }
}

#[test]
fn unknown_features_are_reported_by_name_and_bits() {
    let _serial = serial();
    let wanted = Features::MOVE | Features(1 << 62);
    match Uffd::open(&OpenOptions {
        features: wanted,
        nonblocking: false,
    }) {
        Err(UffdError::MissingFeatures {
            wanted: w,
            available,
            missing,
        }) => {
            assert_eq!(w, wanted);
            assert_eq!(missing, Features(1 << 62));
            assert!(available.contains(Features::MOVE));
            let msg = UffdError::MissingFeatures {
                wanted: w,
                available,
                missing,
            }
            .to_string();
            assert!(msg.contains("lacks 0x4000000000000000"), "{msg}");
        }
        other => panic!("expected MissingFeatures, got {other:?}"),
    }
}

#[test]
fn permission_error_says_what_is_needed() {
    let _serial = serial();
    let e = UffdError::Permission {
        cause: std::io::Error::from_raw_os_error(libc::EPERM),
    };
    let m = e.to_string();
    for needed in [
        "root",
        "CAP_SYS_PTRACE",
        "/dev/userfaultfd",
        "vm.unprivileged_userfaultfd=1",
    ] {
        assert!(m.contains(needed), "{needed} missing from: {m}");
    }
}

/// A handler thread serving `n` faults on `m` with `pattern(page)`, write-protected; returns the
/// (page, thread id) of each fault.
fn serve(u: Arc<Uffd>, base: usize, n: usize) -> std::thread::JoinHandle<Vec<(usize, u32)>> {
    std::thread::spawn(move || {
        let mut served = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while served.len() < n {
            assert!(Instant::now() < deadline, "faults not seen: {served:?}");
            if !u.poll_readable(100).expect("poll") {
                continue;
            }
            let mut ev = Vec::new();
            u.read_events(&mut ev, 8).expect("read");
            for e in ev {
                let Event::Pagefault { addr, thread_id, .. } = e else {
                    panic!("unexpected event {e:?}");
                };
                assert_eq!(addr % PAGE_SIZE, 0);
                let page = (addr - base) / PAGE_SIZE;
                match u.copy(addr, &pattern(page), WP_INSTALL) {
                    Ok(len) => assert_eq!(len, PAGE_SIZE),
                    // Another fault on the same page raced with ours: wake its thread.
                    Err(UffdError::Exists { .. }) => u.wake(addr, PAGE_SIZE).expect("wake"),
                    Err(e) => panic!("copy: {e}"),
                }
                served.push((page, thread_id));
            }
        }
        served
    })
}

#[test]
fn faults_are_served_by_a_handler_thread_even_inside_system_calls() {
    let _serial = serial();
    // No EVENT_UNMAP here: unmapping at the end would wait for a reader that has finished.
    let u = Arc::new(open(Features::WP_ASYNC | Features::THREAD_ID));
    let m = Mapping::reserve(16 * PAGE_SIZE, PAGE_SIZE).expect("map");
    u.register(m.addr(), m.len(), MISSING_WP).expect("register");
    let handler = serve(u.clone(), m.addr(), 3);
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() } as u32;

    let mut b = vec![0u8; 64];
    m.read(3 * PAGE_SIZE + 100, &mut b);
    assert_eq!(b, pattern(3)[100..164]);
    m.read(5 * PAGE_SIZE, &mut b);
    assert_eq!(b, pattern(5)[..64]);

    // write(2) from a missing page: the kernel's copy faults and the handler serves it (a uffd
    // opened with UFFD_USER_MODE_ONLY would make this fail with EFAULT).
    let (r, w) = pipe();
    // SAFETY: the source lies inside the live mapping `m`; the kernel reads it (faulting).
    let n = unsafe { libc::write(w, (m.addr() + 7 * PAGE_SIZE) as *const libc::c_void, 256) };
    assert_eq!(n, 256, "write from a missing page: {}", std::io::Error::last_os_error());
    let mut got = [0u8; 256];
    // SAFETY: reading into a local buffer of 256 bytes.
    let n = unsafe { libc::read(r, got.as_mut_ptr().cast(), 256) };
    assert_eq!(n, 256);
    assert_eq!(got[..], pattern(7)[..256]);
    close(r);
    close(w);

    let served = handler.join().expect("handler");
    assert_eq!(served.iter().map(|s| s.0).collect::<Vec<_>>(), vec![3, 5, 7]);
    assert!(
        served.iter().all(|s| s.1 == me),
        "thread ids {served:?}, faulting thread {me}"
    );

    // COPY onto a present page: Exists with nothing done.
    match u.copy(m.addr() + 3 * PAGE_SIZE, &[0u8; PAGE_SIZE], CopyMode::default()) {
        Err(UffdError::Exists { done: 0 }) => {}
        other => panic!("expected Exists, got {other:?}"),
    }
    // COPY of pages 2..4 where 3 is present: the kernel reports the partial progress as EAGAIN.
    match u.copy(m.addr() + 2 * PAGE_SIZE, &[1u8; 2 * PAGE_SIZE], CopyMode::default()) {
        Err(UffdError::Again { done }) => assert_eq!(done, PAGE_SIZE),
        other => panic!("expected Again after one page, got {other:?}"),
    }
    m.read(2 * PAGE_SIZE, &mut b);
    assert_eq!(b, vec![1u8; 64]);
    m.read(3 * PAGE_SIZE, &mut b);
    assert_eq!(b, pattern(3)[..64]);
}

#[test]
fn zeropage_reads_zeros() {
    let _serial = serial();
    let u = open(Features::empty());
    let m = Mapping::reserve(4 * PAGE_SIZE, PAGE_SIZE).expect("map");
    u.register(m.addr(), m.len(), MISSING).expect("register");
    assert_eq!(
        u.zeropage(m.addr(), 4 * PAGE_SIZE, false).expect("zeropage"),
        4 * PAGE_SIZE
    );
    let mut b = vec![1u8; 4 * PAGE_SIZE];
    m.read(0, &mut b);
    assert!(b.iter().all(|&x| x == 0));
    // All four map one frame, the shared zero page: nothing was allocated for them.
    assert_eq!(present(&m), vec![0, 1, 2, 3]);
    let frames: Vec<u64> = pagemap(&m).iter().map(|e| e & ((1 << 55) - 1)).collect();
    assert_ne!(
        frames[0], 0,
        "frame numbers are hidden from this test: run it as root (CAP_SYS_ADMIN)"
    );
    assert!(frames.iter().all(|&f| f == frames[0]), "frames {frames:x?}");
    assert!(matches!(
        u.zeropage(m.addr(), PAGE_SIZE, false),
        Err(UffdError::Exists { done: 0 })
    ));
}

#[test]
fn move_takes_a_page_out_and_leaves_the_source_missing() {
    let _serial = serial();
    let u = open(Features::MOVE);
    let win = Mapping::reserve(4 * PAGE_SIZE, PAGE_SIZE).expect("map");
    let stage = Mapping::reserve(4 * PAGE_SIZE, PAGE_SIZE).expect("map");
    u.register(win.addr(), win.len(), MISSING).expect("register");
    u.register(stage.addr(), stage.len(), MISSING).expect("register");
    u.copy(win.addr() + PAGE_SIZE, &pattern(1), CopyMode::default())
        .expect("copy");
    assert_eq!(present(&win), vec![1]);

    let moved = move_pages(&u, stage.addr(), win.addr() + PAGE_SIZE, PAGE_SIZE, MoveMode::default()).expect("move");
    assert_eq!(moved, PAGE_SIZE);
    let mut b = vec![0u8; PAGE_SIZE];
    stage.read(0, &mut b);
    assert_eq!(b, pattern(1));
    // The source is missing (reading it would fault), the destination present.
    assert!(present(&win).is_empty());
    assert_eq!(present(&stage), vec![0]);

    // Moving onto a present page: Exists.
    u.copy(win.addr(), &pattern(0), CopyMode::default()).expect("copy");
    assert!(matches!(
        move_pages(&u, stage.addr(), win.addr(), PAGE_SIZE, MoveMode::default()),
        Err(UffdError::Exists { done: 0 })
    ));
    // Moving a hole fails with ENOENT unless holes are allowed.
    let hole = move_pages(
        &u,
        stage.addr() + PAGE_SIZE,
        win.addr() + 2 * PAGE_SIZE,
        PAGE_SIZE,
        MoveMode::default(),
    );
    assert_eq!(hole.err().and_then(|e| e.raw_os_error()), Some(libc::ENOENT));
    let allowed = MoveMode {
        dontwake: false,
        allow_src_holes: true,
    };
    assert_eq!(
        move_pages(
            &u,
            stage.addr() + PAGE_SIZE,
            win.addr() + 2 * PAGE_SIZE,
            PAGE_SIZE,
            allowed
        )
        .expect("hole allowed"),
        PAGE_SIZE
    );
    assert_eq!(present(&stage), vec![0]);
}

/// True if `/proc/self/maps` has a mapping that starts at `addr`.
fn a_vma_starts_at(addr: usize) -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .expect("read /proc/self/maps")
        .lines()
        .filter_map(|l| l.split('-').next())
        .any(|start| usize::from_str_radix(start, 16) == Ok(addr))
}

#[test]
fn requests_across_two_vmas_are_done_page_by_page() {
    let _serial = serial();
    let u = open(Features::MOVE);
    let win = Mapping::reserve(4 * PAGE_SIZE, PAGE_SIZE).expect("map");
    let stage = Mapping::reserve(4 * PAGE_SIZE, PAGE_SIZE).expect("map");
    // Different flags on the first half: two VMAs the kernel will not merge, as a program's
    // protection changes leave in the window. The kernel refuses one request across both.
    rackmem_sys::madvise_dontfork(win.addr(), 2 * PAGE_SIZE).expect("madvise");
    assert!(a_vma_starts_at(win.addr() + 2 * PAGE_SIZE), "the window did not split");
    u.register(win.addr(), win.len(), MISSING).expect("register");
    u.register(stage.addr(), stage.len(), MISSING).expect("register");

    let src: Vec<u8> = (0..4).flat_map(pattern).collect();
    assert_eq!(
        u.copy(win.addr(), &src, CopyMode::default()).expect("copy"),
        4 * PAGE_SIZE
    );
    let mut b = vec![0u8; 4 * PAGE_SIZE];
    win.read(0, &mut b);
    assert!(b == src, "pages copied across the VMAs differ");

    // Out of the window across its VMAs, then back in.
    let out = move_pages(&u, stage.addr(), win.addr(), 4 * PAGE_SIZE, MoveMode::default());
    assert_eq!(out.expect("move out"), 4 * PAGE_SIZE);
    assert!(present(&win).is_empty());
    let back = move_pages(&u, win.addr(), stage.addr(), 4 * PAGE_SIZE, MoveMode::default());
    assert_eq!(back.expect("move in"), 4 * PAGE_SIZE);
    win.read(0, &mut b);
    assert!(b == src, "pages moved across the VMAs differ");

    // A present page in the second VMA stops a zero-fill after the first VMA's pages.
    let z = Mapping::reserve(4 * PAGE_SIZE, PAGE_SIZE).expect("map");
    rackmem_sys::madvise_dontfork(z.addr(), 2 * PAGE_SIZE).expect("madvise");
    u.register(z.addr(), z.len(), MISSING).expect("register");
    u.copy(z.addr() + 3 * PAGE_SIZE, &pattern(3), CopyMode::default())
        .expect("copy");
    let r = u.zeropage(z.addr(), 4 * PAGE_SIZE, false);
    assert!(
        matches!(r, Err(UffdError::Exists { done }) if done == 3 * PAGE_SIZE),
        "{r:?}"
    );
}

#[test]
fn move_of_a_page_shared_with_a_forked_child_is_busy_until_cow_is_broken() {
    let _serial = serial();
    let u = open(Features::MOVE);
    let win = Mapping::reserve(2 * PAGE_SIZE, PAGE_SIZE).expect("map");
    let stage = Mapping::reserve(2 * PAGE_SIZE, PAGE_SIZE).expect("map");
    u.register(win.addr(), win.len(), MISSING).expect("register");
    u.register(stage.addr(), stage.len(), MISSING).expect("register");
    u.copy(win.addr(), &pattern(0), CopyMode::default()).expect("copy");

    let (r, w) = pipe();
    let child = fork_child(|| {
        let mut b = 0u8;
        // SAFETY: a raw read into a local byte; returns when the parent writes one. (Not EOF:
        // this child, and children forked by other tests, hold copies of the write end.)
        unsafe { libc::read(r, (&mut b as *mut u8).cast(), 1) };
    });
    close(r);

    let res = move_pages(&u, stage.addr(), win.addr(), PAGE_SIZE, MoveMode::default());
    assert!(matches!(res, Err(UffdError::Busy { done: 0 })), "{res:?}");
    win.break_cow(0).expect("break cow");
    assert_eq!(
        move_pages(&u, stage.addr(), win.addr(), PAGE_SIZE, MoveMode::default()).expect("move after break_cow"),
        PAGE_SIZE
    );
    let mut b = vec![0u8; PAGE_SIZE];
    stage.read(0, &mut b);
    assert_eq!(b, pattern(0));

    // SAFETY: writing one byte from a local to our pipe.
    let n = unsafe { libc::write(w, [1u8].as_ptr().cast(), 1) };
    assert_eq!(n, 1);
    close(w);
    let status = wait_child(child);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "{status:#x}");
    // break_cow on an unmapped address is an error, not a crash.
    assert!(rackmem_sys::try_break_cow(8 * PAGE_SIZE).is_err());
}

/// What a lazy fork stands on (the runtime's `fork.rs`): a child inherits a registered range
/// with its present pages, copy-on-write, but not the registration (no `EVENT_FORK`). Left so,
/// a missing page reads as zeros (the kernel fills it); registered again with a userfaultfd of
/// the child's own, it stays missing (with `SIGBUS`, a kernel read of it fails instead of
/// waiting for a handler), and the present page keeps the parent's contents. The child's write
/// to it is its own.
#[test]
fn a_forked_child_keeps_present_pages_but_must_register_the_range_again() {
    let _serial = serial();
    let u = open(Features::MOVE);
    let win = Mapping::reserve(2 * PAGE_SIZE, PAGE_SIZE).expect("map");
    u.register(win.addr(), win.len(), MISSING).expect("register");
    u.copy(win.addr(), &pattern(0), CopyMode::default()).expect("copy");
    let want = pattern(0);
    let addr = win.addr();
    fn exit(code: i32) -> ! {
        // SAFETY: leaving the child at once, without the parent's destructors.
        unsafe { libc::_exit(code) }
    }
    let same = |at: usize, want: &[u8]| {
        // SAFETY: `at` is a present page of the inherited range, read byte by byte.
        (0..PAGE_SIZE).all(|i| unsafe { std::ptr::read_volatile((at + i) as *const u8) } == want[i])
    };

    // Unregistered: the missing page is zero-filled by the kernel on a touch.
    let child = fork_child(|| {
        if !same(addr, &want) {
            exit(1);
        }
        if !same(addr + PAGE_SIZE, &[0u8; PAGE_SIZE]) {
            exit(2);
        }
    });
    let status = wait_child(child);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "unregistered child: status {status:#x} (1: present page changed, 2: missing page not zeros)"
    );

    // Registered again by the child: the missing page is the child's userfaultfd's to serve.
    let (r, w) = pipe();
    let child = fork_child(|| {
        let Ok(mine) = Uffd::open(&OpenOptions {
            features: Features::SIGBUS,
            nonblocking: true,
        }) else {
            exit(3)
        };
        if mine.register(addr, 2 * PAGE_SIZE, MISSING).is_err() {
            exit(4);
        }
        // SAFETY: the kernel reads 16 bytes of the missing, registered page into a pipe.
        let n = unsafe { libc::write(w, (addr + PAGE_SIZE) as *const libc::c_void, 16) };
        // SAFETY: reading this thread's errno right after the call.
        if n != -1 || unsafe { *libc::__errno_location() } != libc::EFAULT {
            exit(5);
        }
        if !same(addr, &want) {
            exit(6);
        }
        // The child's write breaks the sharing: its own copy.
        // SAFETY: a present, writable page of the inherited range.
        unsafe { std::ptr::write_volatile(addr as *mut u8, want[0] ^ 0xff) };
        // SAFETY: as above.
        if unsafe { std::ptr::read_volatile(addr as *const u8) } != want[0] ^ 0xff {
            exit(7);
        }
    });
    close(r);
    close(w);
    let status = wait_child(child);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "registered child: status {status:#x} (3/4: open/register, 5: the missing page was not \
         missing, 6: present page changed, 7: own write lost)"
    );
    let mut b = vec![0u8; PAGE_SIZE];
    win.read(0, &mut b);
    assert_eq!(b, want, "the child's write reached the parent");
    assert_eq!(present(&win), vec![0], "the children's touches reached the parent");
}

#[test]
fn madvise_dontneed_raises_a_remove_event_and_copy_waits_for_it() {
    let _serial = serial();
    let u = Arc::new(open(Features::EVENT_REMOVE));
    let m = Mapping::reserve(8 * PAGE_SIZE, PAGE_SIZE).expect("map");
    u.register(m.addr(), m.len(), MISSING).expect("register");
    let data: Vec<u8> = (0..7).flat_map(pattern).collect();
    u.copy(m.addr(), &data, CopyMode::default()).expect("copy");
    let addr = m.addr();

    // madvise blocks until the event is read, so it runs on another thread.
    let advisor = std::thread::spawn(move || {
        // SAFETY: pages of the test's own mapping, reached only through raw addresses.
        unsafe { rackmem_sys::madvise_dontneed(addr + 2 * PAGE_SIZE, 3 * PAGE_SIZE) }
    });
    assert!(u.poll_readable(10_000).expect("poll"), "no REMOVE event");
    // While the event is pending, COPY anywhere on this uffd is refused with EAGAIN.
    match u.copy(addr + 7 * PAGE_SIZE, &pattern(7), CopyMode::default()) {
        Err(UffdError::Again { done: 0 }) => {}
        other => panic!("expected Again while REMOVE is pending, got {other:?}"),
    }
    let mut ev = Vec::new();
    assert_eq!(u.read_events(&mut ev, 8).expect("read"), 1);
    assert!(
        matches!(ev[..], [Event::Remove { start, end }] if start == addr + 2 * PAGE_SIZE && end == addr + 5 * PAGE_SIZE),
        "{ev:?}"
    );
    advisor.join().expect("advisor").expect("madvise");
    // Once madvise has resumed, COPY works again.
    assert_eq!(
        u.copy(addr + 7 * PAGE_SIZE, &pattern(7), CopyMode::default())
            .expect("copy after the event"),
        PAGE_SIZE
    );
    // The dropped pages are missing again; the others are intact.
    assert_eq!(present(&m), vec![0, 1, 5, 6, 7]);
    let mut b = vec![0u8; PAGE_SIZE];
    m.read(6 * PAGE_SIZE, &mut b);
    assert_eq!(b, pattern(6));
}

#[test]
fn poison_makes_missing_pages_fatal_to_touch_and_refuses_present_ones() {
    let _serial = serial();
    let u = open(Features::POISON);
    let m = Mapping::reserve(2 * PAGE_SIZE, PAGE_SIZE).expect("map");
    u.register(m.addr(), m.len(), MISSING).expect("register");
    // A present page in the same VMA (so a fork copies its page tables, poison markers included).
    u.copy(m.addr() + PAGE_SIZE, &pattern(1), CopyMode::default())
        .expect("copy");
    assert_eq!(u.poison(m.addr(), PAGE_SIZE, false).expect("poison"), PAGE_SIZE);
    assert!(matches!(
        u.poison(m.addr() + PAGE_SIZE, PAGE_SIZE, false),
        Err(UffdError::Exists { done: 0 })
    ));

    // A system call touching the poisoned page fails with EFAULT.
    let (r, w) = pipe();
    // SAFETY: the source lies inside the live mapping `m`; the kernel validates the access.
    let n = unsafe { libc::write(w, m.addr() as *const libc::c_void, 16) };
    assert_eq!(n, -1);
    assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EFAULT));
    close(r);
    close(w);

    // A load from it raises SIGBUS (in a child, which then dies of it).
    let addr = m.addr();
    let child = fork_child(|| {
        // SAFETY: `addr` is mapped in the child (a copy of the parent's mapping); the load is
        // expected to raise SIGBUS, which kills the child.
        let _ = unsafe { std::ptr::read_volatile(addr as *const u8) };
    });
    let status = wait_child(child);
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGBUS,
        "child status {status:#x}"
    );
    // The present page is untouched.
    let mut b = vec![0u8; PAGE_SIZE];
    m.read(PAGE_SIZE, &mut b);
    assert_eq!(b, pattern(1));
}

#[test]
fn reserve_aligns_and_reserve_at_refuses_to_replace_a_mapping() {
    let _serial = serial();
    let m = Mapping::reserve(4 * PAGE_SIZE + 1, 1 << 21).expect("map");
    assert_eq!(m.addr() % (1 << 21), 0);
    assert_eq!(m.len(), 5 * PAGE_SIZE);
    assert!(Mapping::reserve_at(m.addr(), PAGE_SIZE).is_err());
    assert!(Mapping::reserve(0, PAGE_SIZE).is_err());
    assert!(Mapping::reserve(PAGE_SIZE, 3 * PAGE_SIZE).is_err());
    // Unregistered anonymous memory reads zeros and keeps what is written.
    m.write(5, b"hello");
    let mut b = [0u8; 12];
    m.read(1, &mut b);
    assert_eq!(&b, b"\0\0\0\0hello\0\0\0");
    let (addr, len) = m.leak();
    assert_eq!((addr % (1 << 21), len), (0, 5 * PAGE_SIZE));
}

/// The mechanism of huge units (docs/architecture.md, "Huge pages"): a 2 MiB transparent huge
/// page moves whole between a window and a staging area, both 2 MiB-aligned and advised
/// `MADV_HUGEPAGE`, with one `UFFDIO_MOVE` each way, and stays one huge page on both sides
/// (`AnonHugePages`); the destination is registered with the uffd the move is called on (the
/// staging area has its own, as in the runtime). A unit the kernel split (a subpage released
/// with `MADV_DONTNEED`) still moves whole with `allow_src_holes`, its hole left a hole.
#[test]
fn a_huge_page_moves_whole_both_ways_and_a_split_one_with_holes() {
    use rackmem_sys::{anon_huge_bytes, thp_mode, HUGE_PAGE_SIZE};
    let _serial = serial();
    let mode = thp_mode();
    assert!(
        mode.advised_gets_huge(),
        "transparent huge pages are {mode:?} on this machine: this test needs `madvise` or `always` in /sys/kernel/mm/transparent_hugepage/enabled"
    );
    let win_u = open(Features::MOVE);
    let stage_u = open(Features::MOVE);
    let win = Mapping::reserve_huge(2 * HUGE_PAGE_SIZE).expect("map window");
    let stage = Mapping::reserve_huge(2 * HUGE_PAGE_SIZE).expect("map staging");
    assert_eq!(win.addr() % HUGE_PAGE_SIZE, 0);
    assert_eq!(stage.addr() % HUGE_PAGE_SIZE, 0);
    // A staging slot gets its huge page the way a fetch fills it: written in place, before the
    // staging area is registered (afterwards its missing pages would fault to its uffd).
    let data: Vec<u8> = (0..HUGE_PAGE_SIZE / PAGE_SIZE).flat_map(pattern).collect();
    stage.write(0, &data);
    let huge_staged = anon_huge_bytes(stage.addr(), stage.len()).expect("smaps");
    assert_eq!(
        huge_staged, HUGE_PAGE_SIZE as u64,
        "the written staging slot is not one huge page (defrag setting?)"
    );
    win_u.register(win.addr(), win.len(), MISSING).expect("register window");
    stage_u
        .register(stage.addr(), stage.len(), MISSING)
        .expect("register staging");

    // Install: one 2 MiB move into the window.
    let moved = move_pages(&win_u, win.addr(), stage.addr(), HUGE_PAGE_SIZE, MoveMode::default()).expect("move in");
    assert_eq!(moved, HUGE_PAGE_SIZE);
    let mut back = vec![0u8; HUGE_PAGE_SIZE];
    win.read(0, &mut back);
    assert!(back == data, "the unit's contents changed on the way in");
    assert_eq!(
        anon_huge_bytes(win.addr(), win.len()).expect("smaps"),
        HUGE_PAGE_SIZE as u64
    );
    assert_eq!(anon_huge_bytes(stage.addr(), stage.len()).expect("smaps"), 0);

    // Evict: one 2 MiB move out into the second slot, still one huge page there.
    let out = move_pages(
        &stage_u,
        stage.addr() + HUGE_PAGE_SIZE,
        win.addr(),
        HUGE_PAGE_SIZE,
        MoveMode::default(),
    )
    .expect("move out");
    assert_eq!(out, HUGE_PAGE_SIZE);
    assert!(present(&win).is_empty());
    assert_eq!(
        anon_huge_bytes(stage.addr(), stage.len()).expect("smaps"),
        HUGE_PAGE_SIZE as u64
    );
    stage.read(HUGE_PAGE_SIZE, &mut back);
    assert!(back == data, "the unit's contents changed on the way out");

    // Split: back into the window, one subpage released there (the kernel splits the huge
    // page), then out again whole, the hole allowed.
    move_pages(
        &win_u,
        win.addr(),
        stage.addr() + HUGE_PAGE_SIZE,
        HUGE_PAGE_SIZE,
        MoveMode::default(),
    )
    .expect("move in again");
    // SAFETY: the window is reached only through raw addresses here.
    unsafe { rackmem_sys::madvise_dontneed(win.addr() + 7 * PAGE_SIZE, PAGE_SIZE) }.expect("dontneed");
    // The release queued nothing on this uffd (REMOVE events were not asked for).
    let holes = MoveMode {
        dontwake: false,
        allow_src_holes: true,
    };
    let out = move_pages(&stage_u, stage.addr(), win.addr(), HUGE_PAGE_SIZE, holes).expect("move split unit out");
    assert_eq!(out, HUGE_PAGE_SIZE);
    assert!(present(&win).is_empty());
    let staged = present(&stage);
    assert_eq!(
        staged.len(),
        HUGE_PAGE_SIZE / PAGE_SIZE - 1,
        "every subpage but the hole"
    );
    assert!(!staged.contains(&7));
    for p in (0..HUGE_PAGE_SIZE / PAGE_SIZE).filter(|&p| p != 7) {
        let mut b = vec![0u8; PAGE_SIZE];
        stage.read(p * PAGE_SIZE, &mut b);
        assert!(b == pattern(p), "subpage {p} of the split unit changed");
    }
}
