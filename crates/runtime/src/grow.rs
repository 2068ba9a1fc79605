//! Growing and shrinking the window's backing with the node agent: memory is attached as the
//! program's allocations reach past what is backed, and returned when they shrink back.

use crate::error::RuntimeError;
use crate::segment::{self, Segment};
use crate::{agent, ratelimit, size, sys, writeback, Runtime, PAGE, PAGE_SIZE};
use rackmem_transport::{BrickAddr, Link, LinkError};
use std::sync::atomic::{AtomicBool, Ordering};

impl Runtime {
    /// Makes sure segments back the window up to page `end`, asking the node agent for more
    /// memory if needed (in steps of at least `RACKMEM_GROW`, and at least half of what is
    /// attached, so a growing program attaches few segments). False if that memory cannot be
    /// had: the caller keeps the allocation local.
    pub(crate) fn ensure_backed(&self, end: u64) -> bool {
        let inner = &self.inner;
        if end <= inner.table.total_pages() {
            return true;
        }
        let Some(agent) = inner.agent.as_ref() else {
            return false;
        };
        let _change = inner.table.change_lock();
        let window_pages = (inner.window.len() / PAGE_SIZE) as u64;
        while inner.table.total_pages() < end {
            let backed = inner.table.total_pages() * PAGE;
            let room = window_pages * PAGE - backed;
            let want = (end * PAGE - backed)
                .max(inner.cfg.grow_bytes)
                .max(backed / 2)
                .next_multiple_of(1 << 20)
                .min(room);
            if let Err(e) = sys::without_sigpipe(|| self.attach_allocation(agent, want)) {
                static WARNED: AtomicBool = AtomicBool::new(false);
                if !WARNED.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "rackmem: warning: no more remote memory ({e}); allocations beyond {} stay in local memory",
                        size::format_size(backed)
                    );
                }
                return false;
            }
        }
        true
    }

    /// Asks the agent for `bytes` and attaches every segment of the allocation at the end of
    /// the window, or none of them (the allocation is returned if any fails).
    fn attach_allocation(&self, agent: &agent::Agent, bytes: u64) -> Result<(), RuntimeError> {
        let inner = &self.inner;
        let a = agent.grow(bytes)?;
        // Pages, address, grant, session key, fault and write-back links, rate, mapping: a
        // segment ready to publish.
        type Ready = (
            u64,
            BrickAddr,
            rackmem_proto::Grant,
            [u8; rackmem_proto::KEY_LEN],
            Link,
            Link,
            u64,
            Option<rackmem_sys::SharedMemory>,
        );
        let attach = || -> Result<Vec<Ready>, RuntimeError> {
            let mut out = Vec::new();
            let window_pages = (inner.window.len() / PAGE_SIZE) as u64;
            let mut end = inner.table.total_pages();
            for s in &a.segments {
                let bad = |why: String| agent::AgentError::Malformed { op: "grow", why };
                let (grant, key) = agent::credentials(s).map_err(bad)?;
                let addr: BrickAddr = s.brick_address.parse().map_err(|e: LinkError| bad(e.to_string()))?;
                let pages = grant.size_bytes / PAGE;
                end += pages;
                if pages == 0 || end > window_pages || inner.table.len() + out.len() >= segment::MAX_SEGMENTS {
                    return Err(RuntimeError::NoSegment(format!(
                        "the agent's allocation does not fit the window of {}",
                        size::format_size(inner.window.len() as u64)
                    )));
                }
                let fault = Link::connect_with(&addr, inner.cfg.timeout, inner.cfg.tls.as_ref())?;
                fault.attach(&grant, &key)?;
                fault.set_receive_spin(inner.cfg.link_spin);
                let writeback = Link::connect_with(&addr, inner.cfg.timeout, inner.cfg.tls.as_ref())?;
                writeback.attach(&grant, &key)?;
                let shared = segment::share_if(inner.cfg.shared_memory, &fault)?;
                out.push((pages, addr, grant, key, fault, writeback, s.rate_limit_bps, shared));
            }
            Ok(out)
        };
        match attach() {
            Ok(segs) => {
                for (pages, addr, grant, session_key, fault, writeback, rate, shared) in segs {
                    inner.table.push(pages, |first_page| Segment {
                        first_page,
                        pages,
                        addr,
                        grant,
                        session_key,
                        fault,
                        writeback: segment::WritebackLink::ready(writeback, &inner.cfg),
                        allocation: Some(a.allocation),
                        limiter: ratelimit::RateLimiter::new(rate),
                        shared: segment::mapped(shared),
                        share_after: Default::default(),
                        lazy_clones: Default::default(),
                    });
                }
                if inner.cfg.verbose {
                    eprintln!(
                        "rackmem[{}]: attached allocation {} ({} segment(s)); window backed up to {}",
                        std::process::id(),
                        a.allocation,
                        a.segments.len(),
                        size::format_size(inner.table.total_pages() * PAGE)
                    );
                }
                Ok(())
            }
            Err(e) => {
                let _ = agent.release(a.allocation);
                Err(e)
            }
        }
    }

    /// Returns trailing allocations the program's allocations no longer reach (keeping one
    /// growth step of slack, so a program that frees and allocates again does not ask each
    /// time). Write-back is drained first: no queued job may refer to a segment being detached.
    pub(crate) fn shrink(&self) {
        let inner = &self.inner;
        let Some(agent) = inner.agent.as_ref() else {
            return;
        };
        let slack = inner.cfg.grow_bytes / PAGE;
        let high = inner.lock().regions().high_water();
        let Some(last) = inner.table.get(inner.table.len().wrapping_sub(1)) else {
            return;
        };
        if last.first_page < high + slack {
            return;
        }
        let _change = inner.table.change_lock();
        writeback::drain(inner);
        loop {
            let n = inner.table.len();
            let Some(last) = inner.table.get(n.wrapping_sub(1)) else {
                return;
            };
            // A migration target (pushed aside) holds moved ranges: it stays, and so do the
            // allocations before it.
            if inner.table.is_aside(n - 1) {
                return;
            }
            let Some(id) = last.allocation else {
                return;
            };
            // The allocation's segments are neighbours at the end of the window.
            let mut k = n - 1;
            while k > 0 && inner.table.get(k - 1).is_some_and(|s| s.allocation == Some(id)) {
                k -= 1;
            }
            let first = inner.table.bounds(k).map_or(0, |b| b.0);
            let high = inner.lock().regions().high_water();
            if first < high + slack {
                return;
            }
            for _ in k..n {
                drop(inner.table.pop());
            }
            if let Err(e) = sys::without_sigpipe(|| agent.release(id)) {
                eprintln!("rackmem: warning: returning allocation {id} to the node agent: {e}");
            }
            if inner.cfg.verbose {
                eprintln!(
                    "rackmem[{}]: returned allocation {id}; window backed up to {}",
                    std::process::id(),
                    size::format_size(inner.table.total_pages() * PAGE)
                );
            }
        }
    }
}
