//! `fork` with copy semantics: the parent quiesces and writes back its dirty pages, each brick
//! clones the parent's segment copy-on-write, and the child builds its own runtime on the
//! clones, over the same window addresses.

use crate::error::RuntimeError;
use crate::process::{clear_global, global, set_global, ACTIVE_CALLS, FORKING};
use crate::segment::{self, Segment, SegmentTable};
use crate::{handler, ratelimit, sys, writeback, Inner, Runtime, PAGE, PAGE_SIZE};
use rackmem_pager::prot;
use rackmem_sys::Mapping;
use rackmem_transport::Link;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

static FORK_STATE: Mutex<Option<ForkState>> = Mutex::new(None);

/// What the parent prepared for the child of a `fork`.
struct ForkState {
    grants: Vec<rackmem_proto::SegmentGrant>,
    failure: Option<String>,
}

/// `pthread_atfork` prepare hook. Quiesces the runtime (no program thread inside it, handler
/// parked, write-back drained), writes back every dirty resident page, and takes a
/// copy-on-write clone of each segment on its brick: the child's frozen view of the parent's
/// remote pages. The window is `MADV_DONTFORK`, so the child gets no copy of the resident pages:
/// it starts with every page remote, from the clone.
pub fn fork_prepare() {
    let Some(rt) = global() else {
        return;
    };
    FORKING.store(true, Ordering::Release);
    while ACTIVE_CALLS.load(Ordering::Acquire) != 0 {
        std::thread::yield_now();
    }
    let inner = &rt.inner;
    handler::pause(inner);
    writeback::drain(inner);
    let flushed = sys::without_sigpipe(|| writeback::flush_dirty(inner));
    let mut grants = Vec::new();
    let mut failure = None;
    for b in inner.table.all() {
        match sys::without_sigpipe(|| b.fault.clone_segment()) {
            Ok(g) => grants.push(g),
            Err(e) => {
                // The parent goes on; the child will stop with this message.
                failure = Some(format!(
                    "brick {} cannot clone the parent's segment for the child: {e}",
                    b.addr
                ));
                break;
            }
        }
    }
    if inner.cfg.verbose {
        eprintln!(
            "rackmem[{}]: fork: flushed {flushed} dirty pages, cloned {} segment(s)",
            std::process::id(),
            grants.len()
        );
    }
    *FORK_STATE.lock().unwrap_or_else(|e| e.into_inner()) = Some(ForkState { grants, failure });
}

/// `pthread_atfork` parent hook: resume.
pub fn fork_parent() {
    let Some(rt) = global() else {
        return;
    };
    FORK_STATE.lock().unwrap_or_else(|e| e.into_inner()).take();
    handler::resume(&rt.inner);
    FORKING.store(false, Ordering::Release);
}

/// Closes, in a forked child, the descriptors of the parent's runtime (its links, uffds and
/// agent connection), so that bricks and agent see the parent's connections end when it exits.
fn close_parent_fds(parent: &Inner) {
    for b in parent.table.all() {
        for fd in b.fault.raw_fds().into_iter().chain(b.writeback.raw_fds()) {
            sys::close_inherited(fd);
        }
    }
    if let Some(a) = &parent.agent {
        for fd in a.raw_fds() {
            sys::close_inherited(fd);
        }
    }
    sys::close_inherited(parent.uffd.as_raw_fd());
    sys::close_inherited(parent.stage_uffd.as_raw_fd());
    sys::close_inherited(parent.bell.as_raw_fd());
}

/// `pthread_atfork` child hook: build the child's own runtime over the same window addresses,
/// with its own userfaultfd, links and threads, on the cloned segments.
pub fn fork_child() {
    let Some(rt) = global() else {
        return;
    };
    let state = FORK_STATE.lock().unwrap_or_else(|e| e.into_inner()).take();
    let parent = &rt.inner;
    let Some(state) = state else {
        eprintln!("rackmem: fork child without prepared state");
        sys::exit_immediately(sys::EXIT_RUNTIME_FAILED);
    };
    if let (Some(why), Some(_)) = (&state.failure, &parent.agent) {
        // Segments from a control plane cannot be cloned (yet): the child goes on without its
        // parent's remote memory. It may exec (what most forking programs do); touching the
        // window, which the child does not have, stops it with SIGSEGV, never with zeros.
        if parent.cfg.verbose {
            eprintln!(
                "rackmem: the forked child (pid {}) has no access to its parent's remote memory: {why}",
                std::process::id()
            );
        }
        close_parent_fds(parent);
        std::mem::forget(rt);
        clear_global();
        FORKING.store(false, Ordering::Release);
        return;
    }
    if let Some(why) = state.failure {
        eprintln!(
            "rackmem: the forked child (pid {}) cannot have its own copy of remote memory: {why}",
            std::process::id()
        );
        sys::exit_immediately(sys::EXIT_RUNTIME_FAILED);
    }
    let result = sys::without_sigpipe(|| -> Result<Arc<Runtime>, RuntimeError> {
        // The window's addresses are free in the child (the window is MADV_DONTFORK): take
        // them back before anything else maps memory, or a buffer could land there. Pages the
        // parent lent to file or shared mappings hold those mappings here too (they are not
        // MADV_DONTFORK): they move aside while the window is mapped, and back once the
        // child's userfaultfd serves the rest (their UNMAP events release the pages again).
        let (base, len) = (parent.window.addr(), parent.window.len());
        let lent: Vec<(usize, usize)> = {
            let c = parent.lock();
            let mut out: Vec<(usize, usize)> = Vec::new();
            for (p, &b) in c.prot_bytes().iter().enumerate() {
                if b & prot::FOREIGN == 0 {
                    continue;
                }
                let addr = base + p * PAGE_SIZE;
                match out.last_mut() {
                    Some((a, l)) if *a + *l == addr => *l += PAGE_SIZE,
                    _ => out.push((addr, PAGE_SIZE)),
                }
            }
            out
        };
        let mut aside: Vec<(usize, usize, usize)> = Vec::new();
        if !lent.is_empty() {
            // The window's free parts first, so the placeholders below cannot land there.
            let mut gaps = Vec::new();
            let mut at = base;
            for &(a, l) in lent.iter().chain(std::iter::once(&(base + len, 0))) {
                if a > at {
                    gaps.push(Mapping::reserve_at(at, a - at)?);
                }
                at = a + l;
            }
            for &(a, l) in &lent {
                let (placeholder, _) = Mapping::reserve(l, PAGE_SIZE)?.leak();
                // SAFETY: `a` is a program's file mapping lent window pages (no Rust reference
                // points into it), the placeholder was just reserved and leaked here, and the
                // mapping moves back below before the child's program runs (single-threaded
                // atfork hook).
                unsafe { rackmem_sys::move_mapping(a, l, placeholder)? };
                aside.push((placeholder, a, l));
            }
            drop(gaps);
        }
        let window = Mapping::reserve_at(base, len)?;
        let table = SegmentTable::default();
        for (i, b) in parent.table.all().iter().enumerate() {
            let seg = state.grants[i].clone();
            let fault = Link::connect_with(&b.addr, parent.cfg.timeout, parent.cfg.tls.as_ref())?;
            fault.attach(&seg.grant, &seg.session_key)?;
            fault.set_receive_spin(parent.cfg.link_spin);
            let writeback = Link::connect_with(&b.addr, parent.cfg.timeout, parent.cfg.tls.as_ref())?;
            writeback.attach(&seg.grant, &seg.session_key)?;
            let shared = segment::share_if(parent.cfg.shared_memory, &fault)?;
            table.push(b.pages, |first_page| Segment {
                first_page,
                pages: b.pages,
                addr: b.addr.clone(),
                grant: seg.grant,
                session_key: seg.session_key,
                fault,
                writeback,
                allocation: None,
                limiter: ratelimit::RateLimiter::new(0),
                shared,
            });
        }
        // Ranges the parent migrated live in the clones of the same segments.
        table.copy_moved_from(&parent.table);
        let c = parent.lock();
        // After the flush every resident page is clean: the child sees the brick's copy (or
        // zeros); same-filled pages live in the parent's core only, so the child gets them too.
        // Protections are the program's: the child's fresh window gets them back below.
        let core = c.forked(parent.cfg.eviction.build());
        drop(c);
        let prot_runs: Vec<(u64, u64, u8)> = {
            let mut out: Vec<(u64, u64, u8)> = Vec::new();
            for (p, &b) in core.prot_bytes().iter().enumerate() {
                if b & prot::SET == 0 {
                    continue;
                }
                match out.last_mut() {
                    Some((s, n, ob)) if *ob == b && *s + *n == p as u64 => *n += 1,
                    _ => out.push((p as u64, 1, b)),
                }
            }
            out
        };
        let child = Runtime::assemble(parent.cfg.clone(), window, table, None, Some(core))?;
        // Subpages released inside units that are away from the window read zeros in the child
        // too (its segments are clones of the parent's, stale there as in the parent's).
        let holes = parent.holes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        *child.inner.holes.lock().unwrap_or_else(|e| e.into_inner()) = holes;
        for (placeholder, addr, len) in aside {
            // SAFETY: the program's mapping comes back from the placeholder it was set aside to
            // above, over the child's window range it was lent (only raw addresses reach it),
            // before the child's program runs.
            unsafe { rackmem_sys::move_mapping(placeholder, len, addr)? };
        }
        for (s, n, b) in prot_runs {
            let addr = child.inner.page_addr(s);
            // SAFETY: pages of the child's window (reached only through raw addresses), given the
            // protection the program had set on them in the parent.
            unsafe { rackmem_sys::mprotect(addr, (n * PAGE) as usize, i32::from(b & prot::MASK))? };
        }
        Ok(child)
    });
    match result {
        Ok(child) => {
            // The parent's runtime object stays allocated and unused in the child: its threads
            // do not exist here, and dropping it would run destructors against the parent's
            // brick connections (shared sockets). Its descriptors are closed, so the brick sees
            // the parent's connections end when the parent exits.
            close_parent_fds(parent);
            std::mem::forget(rt);
            set_global(child);
            FORKING.store(false, Ordering::Release);
        }
        Err(e) => {
            eprintln!("rackmem: the forked child cannot reach its remote memory: {e}");
            if matches!(&e, RuntimeError::Sys(m) if m.raw_os_error() == Some(libc::EEXIST)) {
                // Name what occupies the window's addresses: that is what to fix.
                let (lo, hi) = (parent.window.addr(), parent.window.addr() + parent.window.len());
                for line in std::fs::read_to_string("/proc/self/maps").unwrap_or_default().lines() {
                    let range = line.split_whitespace().next().unwrap_or("");
                    let mut ends = range.split('-').map(|x| usize::from_str_radix(x, 16).unwrap_or(0));
                    if let (Some(a), Some(b)) = (ends.next(), ends.next()) {
                        if a < hi && b > lo {
                            eprintln!("rackmem:   in the way: {line}");
                        }
                    }
                }
            }
            sys::exit_immediately(sys::EXIT_RUNTIME_FAILED);
        }
    }
}
