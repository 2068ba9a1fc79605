//! `fork` with copy semantics: the parent quiesces, each brick clones the parent's segment
//! copy-on-write, and the child builds its own runtime on the clones, over the same window
//! addresses. Segments of the embedded or a standalone brick are cloned by the brick itself
//! (CLONE); segments from a node agent are cloned where the control plane places them (the
//! agent's `clone`, then CLONE_INTO on each brick), and the child adopts them from the agent with
//! the parent's ticket, so they go back when the child exits.
//!
//! Two ways to give the child the parent's resident pages ([`keeps_window`]):
//! - *lazy* (the default): the window is inherited by this fork (the prepare hook lifts its
//!   `MADV_DONTFORK` for the fork, so a child made without these hooks gets no window), so the
//!   kernel keeps the parent's resident pages mapped in the child, copy-on-write, as for any
//!   private memory. The child registers the
//!   inherited window with a userfaultfd of its own before its program runs (registrations are
//!   not inherited), and its core starts from the parent's page states, checksums included. The
//!   parent writes nothing back: the clone holds what the parent's segment held, which is what
//!   those checksums describe, so each side later writes its own changes to its own segment.
//!   Evicting a page still shared with the other process makes it private first
//!   (`UFFDIO_MOVE` refuses shared pages with EBUSY; see `fault::move_one`).
//! - *eager* (`RACKMEM_FORK=eager`, huge units, memory from a node agent): the window is
//!   `MADV_DONTFORK`; the parent writes back every dirty resident page, and the child starts with
//!   every page remote, fetched from its clone.

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
    /// Segments from the node agent: the clones' allocation of each segment, in the table's
    /// order, and the ticket the child adopts them with.
    adopt: Option<(Vec<u64>, String)>,
    /// The window's own ranges (byte address, length) made inheritable for this fork (a lazy
    /// fork), to be made `MADV_DONTFORK` again in the parent after it.
    inheritable: Vec<(usize, usize)>,
    /// Per grant: a lazy clone (CLONE_LAZY of a mapped segment), which the child reaches over
    /// its links only (mapping it would make the brick copy it whole).
    lazy: Vec<bool>,
}

/// The window's own ranges (not lent to the program's file mappings), as (address, length).
fn own_ranges(inner: &Inner) -> Vec<(usize, usize)> {
    let lent = crate::start::lent_runs(inner.lock().prot_bytes());
    let pages = (inner.window.len() / PAGE_SIZE) as u64;
    let mut out = Vec::new();
    let mut at = 0u64;
    for (s, n) in lent.into_iter().chain(std::iter::once((pages, 0))) {
        if s > at {
            out.push((inner.page_addr(at), (s - at) as usize * PAGE_SIZE));
        }
        at = s + n;
    }
    out
}

/// Makes the window's own ranges inherited by a fork (`MADV_DOFORK`) or not (`MADV_DONTFORK`,
/// the state outside a fork: see `start.rs`).
fn set_inheritable(ranges: &[(usize, usize)], inherit: bool) -> Result<(), rackmem_sys::SysError> {
    for &(addr, len) in ranges {
        match inherit {
            true => rackmem_sys::madvise_dofork(addr, len)?,
            false => rackmem_sys::madvise_dontfork(addr, len)?,
        }
    }
    Ok(())
}

/// Has each segment (all from the node agent) cloned for the child: the agent has the control
/// plane place the clones, then each brick fills its clone from the parent's segment
/// (CLONE_INTO on the parent's fault link, idle while the handler is parked). Returns the
/// clones' grants in the table's order, with the allocation of each and the adoption ticket.
fn clone_on_agent(
    inner: &Inner,
    agent: &crate::agent::Agent,
) -> Result<(Vec<rackmem_proto::SegmentGrant>, Vec<u64>, String), String> {
    let segs = inner.table.all();
    let mut sources: Vec<rackmem_proto::CloneSource> = Vec::new();
    for b in &segs {
        let Some(a) = b.allocation else {
            return Err(format!(
                "segment {} did not come from the node agent",
                b.grant.segment_id
            ));
        };
        match sources.iter_mut().find(|s| s.allocation == a) {
            Some(s) => s.segments.push(b.grant.segment_id),
            None => sources.push(rackmem_proto::CloneSource {
                allocation: a,
                segments: vec![b.grant.segment_id],
            }),
        }
    }
    let (clones, ticket) = agent.clone_for_child(sources.clone()).map_err(|e| e.to_string())?;
    if clones.len() != sources.len() {
        return Err("the node agent answered with the wrong number of clones".into());
    }
    let mut of: std::collections::HashMap<u64, (u64, &rackmem_proto::AgentSegment)> = Default::default();
    for (s, c) in sources.iter().zip(&clones) {
        if c.segments.len() != s.segments.len() {
            return Err(format!(
                "the clone of allocation {} has the wrong number of segments",
                s.allocation
            ));
        }
        for (id, seg) in s.segments.iter().zip(&c.segments) {
            of.insert(*id, (c.allocation, seg));
        }
    }
    let mut grants = Vec::with_capacity(segs.len());
    let mut allocations = Vec::with_capacity(segs.len());
    for b in &segs {
        let Some(&(alloc, seg)) = of.get(&b.grant.segment_id) else {
            return Err(format!("no clone of segment {}", b.grant.segment_id));
        };
        let (grant, session_key) = crate::agent::credentials(seg)?;
        if grant.size_bytes != b.pages * PAGE {
            return Err(format!(
                "the clone of segment {} is not of its size",
                b.grant.segment_id
            ));
        }
        b.fault.clone_into(&grant, &session_key).map_err(|e| {
            format!(
                "brick {} cannot fill the clone of segment {}: {e}",
                b.addr, b.grant.segment_id
            )
        })?;
        grants.push(rackmem_proto::SegmentGrant { grant, session_key });
        allocations.push(alloc);
    }
    Ok((grants, allocations, ticket))
}

/// True if a forked child inherits the window and keeps its parent's resident pages (the lazy
/// fork; see the module documentation): 4 KiB units on bricks named at start, unless
/// `RACKMEM_FORK=eager`. Huge units and memory from a node agent fork eagerly: a huge unit
/// shared after a fork would be split by the kernel at its first write, and a child refused its
/// agent's clones must find no window at all (a segmentation fault, never zeros).
pub(crate) fn keeps_window(cfg: &crate::config::Config, unit: rackmem_pager::Unit, agent: bool) -> bool {
    cfg.fork_lazy && unit == rackmem_pager::Unit::Page && !agent
}

/// `pthread_atfork` prepare hook. Quiesces the runtime (no program thread inside it, handler
/// parked, write-back drained) and takes a copy-on-write clone of each segment on its brick: the
/// child's frozen view of the parent's remote pages. An eager fork first writes back every dirty
/// resident page, since its child gets no copy of them; a lazy fork's child keeps them.
pub fn fork_prepare() {
    let Some(rt) = global() else {
        return;
    };
    let started = std::time::Instant::now();
    // SeqCst, as `CallGuard::enter` and `try_enter`: this store and the load below against their
    // increment and load of FORKING (Dekker's pattern). Release and Acquire let the load pass
    // the store, and a call (or the watchdog) could start as the fork goes on.
    FORKING.store(true, Ordering::SeqCst);
    while ACTIVE_CALLS.load(Ordering::SeqCst) != 0 {
        std::thread::yield_now();
    }
    let inner = &rt.inner;
    handler::pause(inner);
    writeback::drain(inner);
    let quiesced = started.elapsed();
    let flushed = if inner.keeps_window() {
        0
    } else {
        sys::without_sigpipe(|| writeback::flush_dirty(inner))
    };
    let mut grants = Vec::new();
    let mut failure = None;
    let mut adopt = None;
    if let Some(agent) = &inner.agent {
        match sys::without_sigpipe(|| clone_on_agent(inner, agent)) {
            Ok((g, allocations, ticket)) => {
                grants = g;
                adopt = Some((allocations, ticket));
            }
            // The parent goes on; the child goes on without its parent's remote memory.
            Err(e) => failure = Some(format!("no copy-on-write clone of the parent's segments: {e}")),
        }
    }
    let mut lazy = Vec::new();
    for b in inner.table.all().into_iter().filter(|_| inner.agent.is_none()) {
        // A lazy fork of a mapped segment: the brick copies nothing now, and a page only when
        // either side first overwrites it; this process's writes go over its link meanwhile
        // (`Segment::mapped_for_overwrite`). An eager fork's child starts with every page
        // remote and maps its clone: it gets a copy.
        let cow = inner.keeps_window() && b.shared.get().is_some();
        let cloned = sys::without_sigpipe(|| match cow {
            true => b.fault.clone_segment_lazy(),
            false => b.fault.clone_segment(),
        });
        if cow && cloned.is_ok() {
            b.lazy_clones.store(true, Ordering::Release);
        }
        lazy.push(cow);
        match cloned {
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
    let cloned = started.elapsed() - quiesced;
    // The window is inherited by this fork only (a child made without these hooks gets none).
    let mut inheritable = Vec::new();
    if inner.keeps_window() && failure.is_none() {
        inheritable = own_ranges(inner);
        if let Err(e) = set_inheritable(&inheritable, true) {
            // The child would miss part of its window: it stops with this message instead.
            let _ = set_inheritable(&inheritable, false);
            inheritable.clear();
            failure = Some(format!("the window cannot be inherited by the child: {e}"));
        }
        // Where the child reports the pages it fetches from what it inherited remote, so that
        // this process takes them back for its next children (`fork_hot.rs`).
        crate::fork_hot::ring_for_fork(inner);
    }
    if inner.cfg.verbose {
        let kept = if inner.keeps_window() {
            format!(
                "the child keeps {} resident pages ({} taken back from earlier children)",
                inner.lock().resident(),
                inner.stats.fork_pages_taken_back.load(Ordering::Relaxed)
            )
        } else {
            format!("flushed {flushed} dirty pages")
        };
        eprintln!(
            "rackmem[{}]: fork: {kept}, cloned {} segment(s) (quiesced in {} us, cloned in {} us)",
            std::process::id(),
            grants.len(),
            quiesced.as_micros(),
            cloned.as_micros()
        );
    }
    *FORK_STATE.lock().unwrap_or_else(|e| e.into_inner()) = Some(ForkState {
        grants,
        failure,
        adopt,
        inheritable,
        lazy,
    });
}

/// `pthread_atfork` parent hook: resume.
pub fn fork_parent() {
    let Some(rt) = global() else {
        return;
    };
    let state = FORK_STATE.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(s) = state {
        if let Err(e) = set_inheritable(&s.inheritable, false) {
            rt.inner
                .internal_error(&format!("making the window not inherited by forks again: {e}"));
        }
    }
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
    if let Some(r) = parent.fork_hot.get() {
        sys::close_inherited(r.raw_fd());
    }
    if let Some(r) = parent.parent_hot.get() {
        sys::close_inherited(r.raw_fd());
    }
    sys::close_inherited(parent.uffd.as_raw_fd());
    sys::close_inherited(parent.stage_uffd.as_raw_fd());
    sys::close_inherited(parent.bell.as_raw_fd());
}

/// The child's segment table: a link pair attached to each clone, in the parent's order, with
/// the parent's migrated ranges (they live in the clones of the same segments).
fn clone_table(parent: &Inner, state: &ForkState) -> Result<SegmentTable, RuntimeError> {
    let table = SegmentTable::default();
    let clone_allocations = state.adopt.as_ref().map(|(a, _)| a.clone());
    for (i, b) in parent.table.all().iter().enumerate() {
        let seg = state.grants[i].clone();
        let fault = Link::connect_with(&b.addr, parent.cfg.timeout, parent.cfg.tls.as_ref())?;
        fault.attach(&seg.grant, &seg.session_key)?;
        fault.set_receive_spin(parent.cfg.link_spin);
        let shared = match state.lazy.get(i) {
            Some(true) => None,
            _ => segment::share_if(parent.cfg.shared_memory, &fault)?,
        };
        table.push(b.pages, |first_page| Segment {
            first_page,
            pages: b.pages,
            addr: b.addr.clone(),
            grant: seg.grant,
            session_key: seg.session_key,
            fault,
            // Made at the child's first write-back (most children of a forking server make none).
            writeback: segment::WritebackLink::later(&parent.cfg),
            allocation: clone_allocations.as_ref().and_then(|a| a.get(i).copied()),
            limiter: ratelimit::RateLimiter::new(0),
            shared: segment::mapped(shared),
            share_after: std::sync::atomic::AtomicU64::new(match state.lazy.get(i) {
                Some(true) => segment::SHARE_AFTER_PAGES,
                _ => 0,
            }),
            lazy_clones: Default::default(),
        });
    }
    // Ranges the parent migrated live in the clones of the same segments.
    table.copy_moved_from(&parent.table);
    Ok(table)
}

/// A lazy fork's child (see the module documentation): the inherited window, with the parent's
/// resident pages still mapped copy-on-write, registered with the child's own userfaultfd before
/// its program runs; a core that starts from the parent's page states; links to the clones.
/// The protections and the file mappings the parent lent window pages to are inherited as they
/// are.
fn lazy_child(parent: &Inner, state: &ForkState) -> Result<Arc<Runtime>, RuntimeError> {
    // SAFETY: the parent's window, inherited by this child at the same addresses; the parent's
    // `Mapping` of it is in the runtime object the child forgets (never dropped here), so this
    // is its only owner; only raw addresses reach it.
    let window = unsafe { Mapping::adopt(parent.window.addr(), parent.window.len()) };
    let started = std::time::Instant::now();
    let table = clone_table(parent, state)?;
    let linked = started.elapsed();
    let mut core = parent.lock().forked_keeping_resident(parent.cfg.eviction.build());
    if state.lazy.iter().any(|&l| l) {
        // The parent compared its pages with its mapping and kept no checksums for them; the
        // child reaches its lazy clones over its links and compares checksums, so a page
        // without one must not pass for what the brick holds (a page the child zeroes would
        // be taken as clean): it is written back if it is not zeros.
        core.distrust_unchecked_resident();
    }
    let inherited = core.resident() * parent.unit_bytes() as u64;
    let child = Runtime::assemble(parent.cfg.clone(), window, table, None, Some(core), true)?;
    child
        .inner
        .stats
        .inherited_resident_bytes
        .store(inherited, std::sync::atomic::Ordering::Relaxed);
    let holes = parent.holes.lock().unwrap_or_else(|e| e.into_inner()).clone();
    *child.inner.holes.lock().unwrap_or_else(|e| e.into_inner()) = holes;
    if let Some(ring) = parent
        .fork_hot
        .get()
        .and_then(|r| crate::fork_hot::ParentRing::adopt(r))
    {
        let _ = child.inner.parent_hot.set(ring);
    }
    if parent.cfg.verbose {
        eprintln!(
            "rackmem[{}]: fork: the child's runtime is ready in {} us (links to its clones {} us)",
            std::process::id(),
            started.elapsed().as_micros(),
            linked.as_micros()
        );
    }
    Ok(child)
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
    // Segments from a control plane: the child holds their clones through a connection of its
    // own to the agent (returned when it exits or execs).
    let adopted = match (&state.adopt, &parent.agent) {
        (Some((allocations, ticket)), Some(a)) => {
            let path = a.path().to_string();
            sys::without_sigpipe(|| -> Result<crate::agent::Agent, String> {
                let child = crate::agent::Agent::connect(&path, parent.cfg.timeout).map_err(|e| e.to_string())?;
                let mut ids = allocations.clone();
                ids.sort_unstable();
                ids.dedup();
                child.adopt(ids, ticket.clone()).map_err(|e| e.to_string())?;
                Ok(child)
            })
            .map(Some)
        }
        _ => Ok(None),
    };
    let (failure, adopted) = match adopted {
        Ok(a) => (state.failure.clone(), a),
        Err(e) => (
            Some(format!("the node agent did not give the child its clones: {e}")),
            None,
        ),
    };
    if let (Some(why), Some(_)) = (&failure, &parent.agent) {
        // The clone was refused (over a limit, a brick full or down): the child goes on
        // without its parent's remote memory. It may exec (what most forking programs do);
        // touching the window, which the child does not have, stops it with SIGSEGV, never
        // with zeros.
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
        if parent.keeps_window() {
            return lazy_child(parent, &state);
        }
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
        let table = clone_table(parent, &state)?;
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
        let child = Runtime::assemble(parent.cfg.clone(), window, table, adopted, Some(core), false)?;
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
