//! The window as the program's allocation calls see it: blocks and mappings carved from it,
//! protections, `MAP_FIXED` over it, lending to file mappings, release.

use crate::config::Config;
use crate::inner::{Inner, Job};
use crate::stats::StatsSnapshot;
use crate::{size, writeback, PAGE, PAGE_SIZE};
use rackmem_pager::prot;
use rackmem_uffd::RegisterMode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A running runtime: a window, its handler and write-back threads, links to bricks.
///
/// Thread-safe: allocation calls may come from any thread of the program. Only one exists per
/// process (see [`global`]); after `fork` the child builds its own from the parent's state.
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

impl Runtime {
    /// The configuration in use.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Allocates `size` bytes aligned to `align` (a power of two) in the window; `None` if the
    /// window is full (the caller falls back to local memory). The memory reads as zeros.
    pub fn alloc(&self, size: usize, align: usize) -> Option<usize> {
        let pages = (size.max(1) as u64).div_ceil(PAGE);
        let align_pages = (align as u64).div_ceil(PAGE).max(1);
        let mut c = self.inner.lock();
        let Some(first) = c.alloc_region(pages, align_pages) else {
            let (allocated, total) = (c.regions().allocated_pages() * PAGE, c.regions().total_pages() * PAGE);
            drop(c);
            static WARNED: AtomicBool = AtomicBool::new(false);
            if !WARNED.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "rackmem: warning: the window is full ({} of {} allocated); an allocation of {} stays in local memory. \
                     Use a larger --window or more bricks.",
                    size::format_size(allocated),
                    size::format_size(total),
                    size::format_size(size as u64)
                );
            }
            return None;
        };
        drop(c);
        if !self.ensure_backed(first + pages) {
            let mut c = self.inner.lock();
            c.free_region_range(first, pages);
            return None;
        }
        self.account_allocation();
        Some(self.inner.page_addr(first))
    }

    /// A private anonymous mapping of `len` bytes with protection `prot` (any of `PROT_NONE`,
    /// read-only, read-write, with or without exec): at `hint` if the whole range is free window
    /// space there, anywhere in the window otherwise (a hint is only a hint, as in mmap(2)).
    pub fn map(&self, hint: usize, len: usize, prot: i32) -> Option<usize> {
        let pages = (len.max(1) as u64).div_ceil(PAGE);
        let at = self
            .page_of(hint)
            .filter(|&h| hint % PAGE_SIZE == 0 && h + pages <= self.window_pages());
        let addr = match at.filter(|&h| self.inner.lock().alloc_region_at(h, pages)) {
            Some(h) => {
                if !self.ensure_backed(h + pages) {
                    self.inner.lock().free_region_range(h, pages);
                    return None;
                }
                self.account_allocation();
                self.inner.page_addr(h)
            }
            None => self.alloc(len, PAGE_SIZE)?,
        };
        if prot != libc::PROT_READ | libc::PROT_WRITE && self.protect(addr, len, prot).is_err() {
            self.release(addr, len);
            return None;
        }
        Some(addr)
    }

    fn window_pages(&self) -> u64 {
        (self.inner.window.len() / PAGE_SIZE) as u64
    }

    fn account_allocation(&self) {
        self.inner.note_footprint(&self.inner.lock());
        self.inner.stats.window_allocations.fetch_add(1, Ordering::Relaxed);
    }

    /// `mprotect(2)` on window pages: applies `prot` and records it. Pages of any protection
    /// stay evictable (see `fault::move_protected`); `PROT_NONE` pages stop counting as
    /// committed. Pages being evicted are waited for first, so no move is refused half-way. Err(errno): ENOMEM if part of the range is
    /// not allocated (as mmap(2) says of unmapped pages).
    pub fn protect(&self, addr: usize, len: usize, prot: i32) -> Result<(), i32> {
        let first = self.page_of(addr).ok_or(libc::ENOMEM)?;
        let pages = (len as u64).div_ceil(PAGE);
        let end = first + pages;
        if addr % PAGE_SIZE != 0 || end > self.window_pages() {
            return Err(libc::EINVAL);
        }
        let b = prot::encode(prot);
        let mut c = self.inner.lock();
        let mut p = first;
        while p < end {
            match c.regions().region_containing(p) {
                Some((s, l)) => p = s + l,
                None => return Err(libc::ENOMEM),
            }
        }
        while c.any_evicting(first, pages) {
            c = self
                .inner
                .core_cv
                .wait_timeout(c, Duration::from_millis(5))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let syscall = || {
            // SAFETY: window pages (checked above: allocated, page-aligned, inside the window),
            // reached only through raw addresses, given the protection the program asked for.
            unsafe { rackmem_sys::mprotect(addr, (pages * PAGE) as usize, prot) }
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL))
        };
        // Under the core's lock, so the core's record and the pages' protection change
        // together: a victim moves into a staging slot given the protection the core records
        // for it, and `UFFDIO_MOVE` refuses pages whose protections differ. (mprotect raises no
        // userfaultfd event, so no handler is needed for it to complete.)
        syscall()?;
        c.set_prot(first, pages, b, false);
        drop(c);
        self.inner.budget_pages(&self.inner.lock());
        Ok(())
    }

    /// `mmap(MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS)` over window pages: as on Linux, the
    /// range becomes fresh zero pages with protection `prot`; free window space in it is
    /// allocated exactly there. `noreplace`: MAP_FIXED_NOREPLACE (EEXIST over allocated pages).
    pub fn map_fixed(&self, addr: usize, len: usize, prot: i32, noreplace: bool) -> Result<usize, i32> {
        let first = self.page_of(addr).ok_or(libc::EINVAL)?;
        let pages = (len as u64).div_ceil(PAGE);
        let end = first + pages;
        if addr % PAGE_SIZE != 0 || len == 0 || end > self.window_pages() {
            return Err(libc::EINVAL);
        }
        {
            let mut c = self.inner.lock();
            let mut p = first;
            let mut holes = Vec::new();
            while p < end {
                match c.regions().region_containing(p) {
                    Some((s, l)) if noreplace => {
                        let _ = (s, l);
                        return Err(libc::EEXIST);
                    }
                    Some((s, l)) => p = (s + l).min(end),
                    None => {
                        let mut q = p + 1;
                        while q < end && c.regions().region_containing(q).is_none() {
                            q += 1;
                        }
                        holes.push((p, q - p));
                        p = q;
                    }
                }
            }
            for (s, n) in holes {
                if !c.alloc_region_at(s, n) {
                    return Err(libc::ENOMEM);
                }
            }
        }
        if !self.ensure_backed(end) {
            return Err(libc::ENOMEM);
        }
        self.account_allocation();
        self.give_back_lent(first, pages);
        self.discard_contents(first, pages);
        self.protect(addr, len, prot)?;
        Ok(addr)
    }

    /// Lends window pages to a file or shared mapping the program puts there with `MAP_FIXED`
    /// (a JVM maps its class-data archive into its reserved heap range): their contents are
    /// released and they count as uncommitted; free pages in the range are allocated so they
    /// are never handed out. The caller then makes the real mapping, which takes the range out
    /// of the userfaultfd. [`Runtime::release`] gives them back to the window.
    pub fn lend(&self, addr: usize, len: usize) -> Result<(), i32> {
        let first = self.page_of(addr).ok_or(libc::EINVAL)?;
        let pages = (len as u64).div_ceil(PAGE);
        let end = first + pages;
        if addr % PAGE_SIZE != 0 || end > self.window_pages() {
            return Err(libc::EINVAL);
        }
        {
            let mut c = self.inner.lock();
            for p in first..end {
                if c.regions().region_containing(p).is_none() && !c.alloc_region_at(p, 1) {
                    return Err(libc::ENOMEM);
                }
            }
        }
        // Read-write again first, so the discard below and any eviction see plain pages.
        self.protect(addr, len, libc::PROT_READ | libc::PROT_WRITE)?;
        self.discard_contents(first, pages);
        let mut c = self.inner.lock();
        c.set_prot(first, pages, prot::FOREIGN, true);
        Ok(())
    }

    /// True if `addr` is a window page lent to a file or shared mapping.
    pub fn is_lent(&self, addr: usize) -> bool {
        self.page_of(addr)
            .is_some_and(|p| self.inner.lock().prot_of(p) & prot::FOREIGN != 0)
    }

    /// Gives lent pages of `[first, first+pages)` back to the window: fresh anonymous memory
    /// replaces the program's mapping there and is registered with the userfaultfd again.
    fn give_back_lent(&self, first: u64, pages: u64) {
        let runs = self.prot_runs(first, pages, |b| b & prot::FOREIGN != 0);
        for (s, n) in runs {
            let (addr, len) = (self.inner.page_addr(s), (n * PAGE) as usize);
            // SAFETY: window pages lent to a program's file mapping (only raw addresses reach
            // them), taken back for the window.
            let back = unsafe { rackmem_sys::remap_anonymous(addr, len) }
                .and_then(|_| rackmem_sys::madvise_dontfork(addr, len))
                .map_err(crate::RuntimeError::from)
                .and_then(|_| {
                    self.inner
                        .uffd
                        .register(
                            addr,
                            len,
                            RegisterMode {
                                missing: true,
                                wp: false,
                                minor: false,
                            },
                        )
                        .map(|_| ())
                        .map_err(crate::RuntimeError::from)
                });
            if let Err(e) = back {
                self.inner.internal_error(&format!(
                    "giving window pages {addr:#x}+{len} back from a file mapping: {e}"
                ));
            }
            self.inner.lock().set_prot(s, n, 0, true);
        }
    }

    /// Runs of pages in `[first, first+pages)` whose protection byte satisfies `f`.
    fn prot_runs(&self, first: u64, pages: u64, f: impl Fn(u8) -> bool) -> Vec<(u64, u64)> {
        let c = self.inner.lock();
        let bytes = c.prot_bytes();
        let mut out: Vec<(u64, u64)> = Vec::new();
        for p in first..(first + pages).min(bytes.len() as u64) {
            if f(bytes[p as usize]) {
                match out.last_mut() {
                    Some((s, n)) if *s + *n == p => *n += 1,
                    _ => out.push((p, 1)),
                }
            }
        }
        out
    }

    /// Makes `[first, first+pages)` plain read-write window memory again (before it is freed):
    /// lent pages come back, other protections are lifted.
    fn restore_window(&self, first: u64, pages: u64) {
        self.give_back_lent(first, pages);
        for (s, n) in self.prot_runs(first, pages, |b| b != 0) {
            let (addr, len) = (self.inner.page_addr(s), (n * PAGE) as usize);
            // SAFETY: window pages being freed (only raw addresses reach them), made read-write
            // as the window's free pages are.
            if let Err(e) = unsafe { rackmem_sys::mprotect(addr, len, libc::PROT_READ | libc::PROT_WRITE) } {
                self.inner.internal_error(&format!(
                    "making freed window pages {addr:#x}+{len} read-write again: {e}"
                ));
            }
            self.inner.lock().set_prot(s, n, 0, true);
        }
    }

    /// Like [`Runtime::alloc`], for a malloc-family block: `free`, `realloc` and
    /// `malloc_usable_size` recognise it by [`Runtime::is_block`].
    pub fn alloc_block(&self, size: usize, align: usize) -> Option<usize> {
        let a = self.alloc(size, align)?;
        let page = self.page_of(a)?;
        self.inner.lock().mark_block(page);
        Some(a)
    }

    /// True if `addr` is the start of a live block from [`Runtime::alloc_block`]. Other window
    /// addresses belong to mappings (the program's allocator may carve its own blocks there).
    pub fn is_block(&self, addr: usize) -> bool {
        if addr % PAGE_SIZE != 0 {
            return false;
        }
        let Some(page) = self.page_of(addr) else {
            return false;
        };
        self.inner.lock().is_block(page)
    }

    /// The usable size of the window allocation starting at `addr`, if it is one.
    pub fn usable_size(&self, addr: usize) -> Option<usize> {
        let page = self.page_of(addr)?;
        let c = self.inner.lock();
        let (start, pages) = c.regions().region_containing(page)?;
        let region_end = self.inner.page_addr(start + pages);
        Some(region_end - addr)
    }

    /// The region `(start_addr, len)` that contains `addr`.
    pub fn region_of(&self, addr: usize) -> Option<(usize, usize)> {
        let page = self.page_of(addr)?;
        let c = self.inner.lock();
        let (start, pages) = c.regions().region_containing(page)?;
        Some((self.inner.page_addr(start), pages as usize * PAGE_SIZE))
    }

    /// Tries to resize the allocation at `addr` in place (for `realloc` and `mremap`).
    pub fn resize_in_place(&self, addr: usize, new_size: usize) -> bool {
        let Some(page) = self.page_of(addr) else {
            return false;
        };
        let new_pages = (new_size.max(1) as u64).div_ceil(PAGE);
        let old = {
            let c = self.inner.lock();
            match c.regions().region_at(page) {
                Some(p) => p,
                None => return false,
            }
        };
        if new_pages < old {
            // Shrinking releases the tail like munmap does.
            self.release(
                self.inner.page_addr(page + new_pages),
                ((old - new_pages) * PAGE) as usize,
            );
            return true;
        }
        let mut c = self.inner.lock();
        let mut ok = c.resize_region_in_place(page, new_pages);
        drop(c);
        if ok && !self.ensure_backed(page + new_pages) {
            // No memory behind the grown part: undo the growth; the caller moves the data.
            let mut c = self.inner.lock();
            c.resize_region_in_place(page, old);
            ok = false;
        }
        self.inner.note_footprint(&self.inner.lock());
        ok
    }

    fn page_of(&self, addr: usize) -> Option<u64> {
        let base = self.inner.window.addr();
        (addr >= base && addr < base + self.inner.window.len()).then(|| ((addr - base) / PAGE_SIZE) as u64)
    }

    /// Releases `[addr, addr+len)` (page-rounded outward at the start, inward... see below): the
    /// pages are dropped from the local buffer and from the allocator, and their brick memory is
    /// discarded. Used by `free`, `munmap`, and the tail of a shrinking `realloc`.
    pub fn release(&self, addr: usize, len: usize) {
        let Some(first) = self.page_of(addr) else {
            return;
        };
        let pages = (len as u64).div_ceil(PAGE);
        self.restore_window(first, pages);
        self.discard_contents(first, pages);
        let mut c = self.inner.lock();
        let freed = c.free_region_range(first, pages);
        let allocated = c.regions().allocated_pages() * PAGE;
        drop(c);
        self.inner
            .stats
            .window_bytes_allocated
            .store(allocated, Ordering::Relaxed);
        for (s, n) in freed {
            self.queue_discard(s, n);
        }
        self.shrink();
    }

    /// `madvise(MADV_DONTNEED)` semantics on window pages: afterwards they read as zeros.
    pub fn dontneed(&self, addr: usize, len: usize) {
        if let Some(first) = self.page_of(addr) {
            let pages = (len as u64).div_ceil(PAGE);
            self.discard_contents(first, pages);
        }
    }

    fn discard_contents(&self, first: u64, pages: u64) {
        // The kernel zaps present pages (and tells the handler with a REMOVE event before it
        // does); the state change here covers pages that are remote or staged.
        let addr = self.inner.page_addr(first);
        let len = (pages * PAGE) as usize;
        // SAFETY: window pages the program discards (only raw addresses reach the window); the
        // program gave up their contents.
        if let Err(e) = unsafe { rackmem_sys::madvise_dontneed(addr, len) } {
            eprintln!("rackmem: madvise(DONTNEED) on window {addr:#x}+{len}: {e}");
        }
        let mut c = self.inner.lock();
        self.inner.release_pages(&mut c, first, pages);
    }

    fn queue_discard(&self, first: u64, pages: u64) {
        // Split along segments; small releases are not worth a message.
        if pages < 256 {
            return;
        }
        let mut p = first;
        let end = first + pages;
        while p < end {
            let Some((seg, off, seg_end)) = self.inner.table.lookup_run(p) else {
                return;
            };
            let seg_end = seg_end.min(end);
            writeback::submit(
                &self.inner,
                Job::Discard {
                    seg,
                    offset: off,
                    len: (seg_end - p) * PAGE,
                },
            );
            p = seg_end;
        }
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> StatsSnapshot {
        let c = self.inner.lock();
        self.inner.budget_pages(&c);
        let probes = c.probe_counts();
        drop(c);
        let mut s = self.inner.stats.snapshot(PAGE);
        s.fault_handlers = self.inner.handlers() as u32;
        s.unit_bytes = self.inner.unit.bytes();
        s.readahead_accuracy = probes.accuracy();
        s.readahead_sample_used = probes.used;
        s.readahead_sample_wasted = probes.wasted;
        if let Some(run) = &self.inner.run {
            if let Some(rss) = self.inner.stats.sample_rss_anon_now() {
                run.note_rss_anon(rss);
            }
            let r = run.summary();
            s.run_budget_bytes = r.budget_bytes;
            s.run_peak_footprint_bytes = r.peak_footprint_bytes;
            s.run_peak_resident_bytes = r.peak_resident_bytes;
            s.run_peak_rss_anon_bytes = r.peak_rss_anon_bytes;
        }
        if let Some(a) = s.readahead_accuracy {
            let pages = s.bytes_prefetched / PAGE;
            s.readahead_pages_used = (pages as f64 * a).round() as u64;
            s.readahead_pages_wasted = pages - s.readahead_pages_used.min(pages);
        }
        s
    }

    /// At the process's exit: writes its statistics and gives its share of the run's budget
    /// back, so the run's other processes may use the room at once.
    pub fn at_exit(&self) {
        self.write_stats();
        if let Some(run) = &self.inner.run {
            run.leave();
        }
    }

    /// Appends this process's statistics as one JSON line to the configured stats file.
    pub fn write_stats(&self) {
        let Some(path) = &self.inner.cfg.stats_file else {
            return;
        };
        let snap = self.stats();
        let Ok(mut line) = serde_json::to_string(&snap) else {
            return;
        };
        line.push('\n');
        use std::io::Write;
        match std::fs::OpenOptions::new().create(true).append(true).open(path) {
            Ok(mut f) => {
                if let Err(e) = f.write_all(line.as_bytes()) {
                    eprintln!("rackmem: cannot write statistics to {path}: {e}");
                }
            }
            Err(e) => eprintln!("rackmem: cannot open statistics file {path}: {e}"),
        }
    }
}
