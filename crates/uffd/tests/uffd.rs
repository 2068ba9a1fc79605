//! The wrapper against the real kernel: faults served by a handler thread, COPY/ZEROPAGE/MOVE/
//! POISON, WP_ASYNC dirty tracking through PAGEMAP_SCAN, and the REMOVE event. Needs root.

use rackmem_uffd::{
    CopyMode, Event, Features, Mapping, MoveMode, OpenOptions, Pagemap, RegisterMode, Uffd, UffdError, PAGE_SIZE,
};
use std::sync::Arc;

const MW: RegisterMode = RegisterMode {
    missing: true,
    wp: true,
    minor: false,
};

fn open(features: Features) -> Uffd {
    Uffd::open(&OpenOptions {
        features,
        nonblocking: true,
    })
    .expect("userfaultfd (these tests need root: run ./scripts/test as root)")
}

fn all() -> Features {
    Features::WP_ASYNC | Features::MOVE | Features::EVENT_REMOVE | Features::EVENT_UNMAP | Features::EVENT_REMAP
}

#[test]
fn features_are_negotiated_and_named() {
    let u = open(all());
    assert!(u.features().contains(Features::WP_ASYNC | Features::MOVE));
    let s = u.features().to_string();
    assert!(
        s.contains("WP_ASYNC") && s.contains("MOVE") && s.contains("EVENT_REMOVE"),
        "{s}"
    );
}

#[test]
fn permission_error_says_what_is_needed() {
    let e = UffdError::Permission {
        cause: std::io::Error::from_raw_os_error(libc::EPERM),
    };
    let m = e.to_string();
    assert!(
        m.contains("vm.unprivileged_userfaultfd=1") && m.contains("CAP_SYS_PTRACE") && m.contains("/dev/userfaultfd")
    );
}

#[test]
fn a_fault_is_served_by_a_handler_thread() {
    // No EVENT_UNMAP here: unmapping at the end would wait for a reader that has finished.
    let u = Arc::new(open(Features::WP_ASYNC));
    let m = Mapping::reserve(16 * PAGE_SIZE, PAGE_SIZE).expect("map");
    u.register(m.addr(), m.len(), MW).expect("register");
    let base = m.addr();
    let h = {
        let u = u.clone();
        std::thread::spawn(move || {
            let mut served = 0;
            while served < 2 {
                u.poll_readable(5000).expect("poll");
                let mut ev = Vec::new();
                u.read_events(&mut ev, 8).expect("read");
                for e in ev {
                    if let Event::Pagefault { addr, .. } = e {
                        let page = (addr - base) / PAGE_SIZE;
                        let data = vec![page as u8 + 1; PAGE_SIZE];
                        match u.copy(
                            addr,
                            &data,
                            CopyMode {
                                write_protect: true,
                                dontwake: false,
                            },
                        ) {
                            Ok(_) => served += 1,
                            Err(UffdError::Exists { .. }) => u.wake(addr, PAGE_SIZE).expect("wake"),
                            Err(e) => panic!("copy: {e}"),
                        }
                    }
                }
            }
        })
    };
    let mut b = vec![0u8; 8];
    m.read(3 * PAGE_SIZE + 100, &mut b);
    assert_eq!(b, vec![4u8; 8]);
    m.read(5 * PAGE_SIZE, &mut b);
    assert_eq!(b, vec![6u8; 8]);
    h.join().expect("handler");
    // Copying onto a present page reports Exists.
    match u.copy(base + 3 * PAGE_SIZE, &[0u8; PAGE_SIZE], CopyMode::default()) {
        Err(UffdError::Exists { done: 0 }) => {}
        other => panic!("expected Exists, got {other:?}"),
    }
}

#[test]
fn zeropage_reads_zeros() {
    let u = open(Features::default());
    let m = Mapping::reserve(4 * PAGE_SIZE, PAGE_SIZE).expect("map");
    u.register(
        m.addr(),
        m.len(),
        RegisterMode {
            missing: true,
            wp: false,
            minor: false,
        },
    )
    .expect("register");
    assert_eq!(
        u.zeropage(m.addr(), 4 * PAGE_SIZE, false).expect("zeropage"),
        4 * PAGE_SIZE
    );
    let mut b = vec![1u8; 4 * PAGE_SIZE];
    m.read(0, &mut b);
    assert!(b.iter().all(|&x| x == 0));
}

#[test]
fn wp_async_and_pagemap_scan_find_exactly_the_written_pages() {
    let u = open(Features::WP_ASYNC);
    let m = Mapping::reserve(10 * PAGE_SIZE, PAGE_SIZE).expect("map");
    u.register(m.addr(), m.len(), MW).expect("register");
    u.copy(
        m.addr(),
        &vec![7u8; 10 * PAGE_SIZE],
        CopyMode {
            write_protect: true,
            dontwake: true,
        },
    )
    .expect("copy");
    let pm = Pagemap::open().expect("pagemap");
    let mut w = Vec::new();
    pm.scan_written(m.addr(), m.addr() + m.len(), true, &mut w)
        .expect("scan");
    assert!(w.is_empty(), "nothing written yet: {w:?}");
    for p in [1usize, 4, 5] {
        m.write(p * PAGE_SIZE + 10, &[9u8; 3]);
    }
    pm.scan_written(m.addr(), m.addr() + m.len(), true, &mut w)
        .expect("scan");
    let pages: Vec<usize> = w
        .iter()
        .flat_map(|&(s, e)| ((s - m.addr()) / PAGE_SIZE)..((e - m.addr()) / PAGE_SIZE))
        .collect();
    assert_eq!(pages, vec![1, 4, 5]);
    w.clear();
    pm.scan_written(m.addr(), m.addr() + m.len(), true, &mut w)
        .expect("scan");
    assert!(w.is_empty(), "the scan re-protected what it reported: {w:?}");
}

#[test]
fn move_takes_a_page_out_atomically() {
    let u = open(Features::MOVE);
    let win = Mapping::reserve(4 * PAGE_SIZE, PAGE_SIZE).expect("map");
    let stage = Mapping::reserve(4 * PAGE_SIZE, PAGE_SIZE).expect("map");
    let r = RegisterMode {
        missing: true,
        wp: false,
        minor: false,
    };
    u.register(win.addr(), win.len(), r).expect("register");
    u.register(stage.addr(), stage.len(), r).expect("register");
    u.copy(win.addr() + PAGE_SIZE, &vec![0x5au8; PAGE_SIZE], CopyMode::default())
        .expect("copy");
    u.move_pages(stage.addr(), win.addr() + PAGE_SIZE, PAGE_SIZE, MoveMode::default())
        .expect("move");
    let mut b = vec![0u8; PAGE_SIZE];
    stage.read(0, &mut b);
    assert!(b.iter().all(|&x| x == 0x5a));
    // The source is missing again: a copy there succeeds instead of reporting Exists.
    u.copy(win.addr() + PAGE_SIZE, &vec![1u8; PAGE_SIZE], CopyMode::default())
        .expect("source is empty after the move");
    // Moving a hole fails unless holes are allowed.
    assert!(u
        .move_pages(
            stage.addr() + PAGE_SIZE,
            win.addr() + 2 * PAGE_SIZE,
            PAGE_SIZE,
            MoveMode::default()
        )
        .is_err());
}

#[test]
fn madvise_dontneed_raises_a_remove_event() {
    let u = Arc::new(open(Features::EVENT_REMOVE));
    let m = Mapping::reserve(8 * PAGE_SIZE, PAGE_SIZE).expect("map");
    u.register(
        m.addr(),
        m.len(),
        RegisterMode {
            missing: true,
            wp: false,
            minor: false,
        },
    )
    .expect("register");
    u.copy(m.addr(), &vec![3u8; 8 * PAGE_SIZE], CopyMode::default())
        .expect("copy");
    let (addr, len) = (m.addr(), m.len());
    // madvise blocks until the event is read, so another thread reads it.
    let reader = {
        let u = u.clone();
        std::thread::spawn(move || loop {
            u.poll_readable(5000).expect("poll");
            let mut ev = Vec::new();
            u.read_events(&mut ev, 8).expect("read");
            if let Some(Event::Remove { start, end }) = ev.into_iter().find(|e| matches!(e, Event::Remove { .. })) {
                return (start, end);
            }
        })
    };
    rackmem_uffd::madvise_dontneed(addr + 2 * PAGE_SIZE, 3 * PAGE_SIZE).expect("madvise");
    assert_eq!(
        reader.join().expect("reader"),
        (addr + 2 * PAGE_SIZE, addr + 5 * PAGE_SIZE)
    );
    // The dropped pages are missing again; the others are intact.
    u.copy(addr + 2 * PAGE_SIZE, &vec![0u8; PAGE_SIZE], CopyMode::default())
        .expect("dropped page is missing");
    let mut b = vec![0u8; PAGE_SIZE];
    m.read(7 * PAGE_SIZE, &mut b);
    assert!(b.iter().all(|&x| x == 3));
    let _ = len;
}

#[test]
fn poison_marks_missing_pages_and_refuses_present_ones() {
    let u = open(Features::POISON);
    let m = Mapping::reserve(2 * PAGE_SIZE, PAGE_SIZE).expect("map");
    u.register(
        m.addr(),
        m.len(),
        RegisterMode {
            missing: true,
            wp: false,
            minor: false,
        },
    )
    .expect("register");
    assert_eq!(u.poison(m.addr(), PAGE_SIZE, false).expect("poison"), PAGE_SIZE);
    u.copy(m.addr() + PAGE_SIZE, &vec![1u8; PAGE_SIZE], CopyMode::default())
        .expect("copy");
    assert!(matches!(
        u.poison(m.addr() + PAGE_SIZE, PAGE_SIZE, false),
        Err(UffdError::Exists { .. })
    ));
}

#[test]
fn reserve_at_refuses_to_replace_a_mapping() {
    let m = Mapping::reserve(4 * PAGE_SIZE, 1 << 21).expect("map");
    assert_eq!(m.addr() % (1 << 21), 0);
    assert!(Mapping::reserve_at(m.addr(), PAGE_SIZE).is_err());
}
