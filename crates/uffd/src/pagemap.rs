//! `PAGEMAP_SCAN` (Linux 6.7) on `/proc/self/pagemap`: which pages of a range are present,
//! written since they were last write-protected, and so on, optionally write-protecting the
//! written ones in the same walk (`PM_SCAN_WP_MATCHING`). With `UFFD_FEATURE_WP_ASYNC` this is
//! the whole dirty-tracking mechanism: a first write costs ~1 µs in the kernel, no handler runs,
//! and a periodic scan collects and re-arms the written pages.

use crate::{iowr, os_error, UffdError};
use linux_raw_sys::general as sys;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// `_IOWR('f', 16, struct pm_scan_arg)`.
pub(crate) const PAGEMAP_SCAN: u32 = iowr(b'f' as u32, 16, std::mem::size_of::<sys::pm_scan_arg>());
const _: () = assert!(std::mem::size_of::<sys::pm_scan_arg>() == 96);
const _: () = assert!(std::mem::size_of::<sys::page_region>() == 24);

/// Regions returned per ioctl.
const VEC_LEN: usize = 256;

/// Page categories (`PAGE_IS_*`), for [`ScanRequest`] masks and [`PageRegion::categories`].
pub mod page_is {
    use linux_raw_sys::general as sys;
    /// The page may be write-protected with userfaultfd (range registered in `WP_ASYNC` mode).
    pub const WPALLOWED: u64 = sys::PAGE_IS_WPALLOWED as u64;
    /// Written since last write-protected (uffd-wp bit clear).
    pub const WRITTEN: u64 = sys::PAGE_IS_WRITTEN as u64;
    /// File-backed.
    pub const FILE: u64 = sys::PAGE_IS_FILE as u64;
    /// Present in memory.
    pub const PRESENT: u64 = sys::PAGE_IS_PRESENT as u64;
    /// Swapped out.
    pub const SWAPPED: u64 = sys::PAGE_IS_SWAPPED as u64;
    /// Mapped to the zero page.
    pub const PFNZERO: u64 = sys::PAGE_IS_PFNZERO as u64;
    /// Part of a huge page.
    pub const HUGE: u64 = sys::PAGE_IS_HUGE as u64;
    /// Soft-dirty.
    pub const SOFT_DIRTY: u64 = sys::PAGE_IS_SOFT_DIRTY as u64;
    /// A guard region (Linux 6.14).
    pub const GUARD: u64 = sys::PAGE_IS_GUARD as u64;
}

/// `PM_SCAN_*` flags for [`ScanRequest::flags`].
pub mod pm_scan {
    use linux_raw_sys::general as sys;
    /// Write-protect the matching pages in the same walk.
    pub const WP_MATCHING: u64 = sys::PM_SCAN_WP_MATCHING as u64;
    /// Fail with EPERM unless every VMA walked is registered in `WP_ASYNC` mode.
    pub const CHECK_WPASYNC: u64 = sys::PM_SCAN_CHECK_WPASYNC as u64;
}

/// One run of pages with the same categories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRegion {
    /// Start address (page-aligned).
    pub start: usize,
    /// End address (exclusive, page-aligned).
    pub end: usize,
    /// [`page_is`] bits, masked by the request's `return_mask`.
    pub categories: u64,
}

/// A general scan request (the kernel's `Documentation/admin-guide/mm/pagemap.rst`). A page
/// matches when, with its categories `c` XOR-ed with `category_inverted`, all bits of
/// `category_mask` are set and (if non-zero) at least one of `category_anyof_mask` is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanRequest {
    /// Range start (page-aligned).
    pub start: usize,
    /// Range end (exclusive).
    pub end: usize,
    /// [`pm_scan`] flags.
    pub flags: u64,
    /// [`page_is`] categories inverted before matching.
    pub category_inverted: u64,
    /// All of these must be set.
    pub category_mask: u64,
    /// At least one of these must be set (0: no condition).
    pub category_anyof_mask: u64,
    /// Categories reported back in [`PageRegion::categories`]; must be non-zero.
    pub return_mask: u64,
}

/// `/proc/self/pagemap`, opened once.
///
/// `Send + Sync`: a scan is a loop of ioctls with all state on the caller's stack; concurrent
/// scans are safe (two scans with `WP_MATCHING` over the same pages split the written pages
/// between them, each reported once).
#[derive(Debug)]
pub struct Pagemap {
    file: File,
}

impl Pagemap {
    /// Opens `/proc/self/pagemap`.
    pub fn open() -> Result<Pagemap, UffdError> {
        File::open("/proc/self/pagemap")
            .map(|file| Pagemap { file })
            .map_err(|e| os_error("open /proc/self/pagemap", 0, 0, e))
    }

    /// Scans the whole of `[req.start, req.end)`, appending the matching regions to `out` in
    /// address order, adjacent regions with equal categories merged.
    ///
    /// The kernel returns at most one vector of regions per call and then reports where it
    /// stopped in `walk_end`; but after a walk of more than one internal batch `walk_end` can
    /// be stale (short of where the walk really got). So: fewer regions than the vector holds
    /// means the range is done; a full vector means continue from the later of `walk_end` and
    /// the end of the last region.
    pub fn scan(&self, req: &ScanRequest, out: &mut Vec<PageRegion>) -> Result<(), UffdError> {
        let mut regions = [sys::page_region {
            start: 0,
            end: 0,
            categories: 0,
        }; VEC_LEN];
        let first_new = out.len();
        let mut at = req.start;
        while at < req.end {
            let mut arg = sys::pm_scan_arg {
                size: std::mem::size_of::<sys::pm_scan_arg>() as u64,
                flags: req.flags,
                start: at as u64,
                end: req.end as u64,
                walk_end: 0,
                vec: regions.as_mut_ptr() as u64,
                vec_len: VEC_LEN as u64,
                max_pages: 0,
                category_inverted: req.category_inverted,
                category_mask: req.category_mask,
                category_anyof_mask: req.category_anyof_mask,
                return_mask: req.return_mask,
            };
            // SAFETY: PAGEMAP_SCAN reads and writes one pm_scan_arg, and writes at most
            // `vec_len` page_regions at `vec`, which points at `regions` (VEC_LEN entries, alive
            // and exclusively borrowed across the call).
            let n = unsafe { libc::ioctl(self.file.as_raw_fd(), PAGEMAP_SCAN as libc::Ioctl, &mut arg) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(os_error("PAGEMAP_SCAN", at, req.end - at, e));
            }
            let n = (n as usize).min(VEC_LEN);
            for r in &regions[..n] {
                let r = PageRegion {
                    start: r.start as usize,
                    end: r.end as usize,
                    categories: r.categories,
                };
                let merge_from = out.len() > first_new;
                match out.last_mut() {
                    Some(last) if merge_from && last.end == r.start && last.categories == r.categories => {
                        last.end = r.end;
                    }
                    _ => out.push(r),
                }
            }
            if n < VEC_LEN {
                break;
            }
            let last_end = regions[n - 1].end as usize;
            let next = (arg.walk_end as usize).max(last_end);
            if next <= at {
                // Cannot happen with a full vector (its last region ends after `at`); never loop.
                break;
            }
            at = next;
        }
        Ok(())
    }

    /// Written pages (uffd-wp bit clear, `PAGE_IS_WRITTEN`) in `[start, end)`, appended to `out`
    /// as page-aligned `(start, end)` ranges in address order.
    ///
    /// With `reprotect`, the kernel write-protects what it reports in the same walk
    /// (`PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC`: the range must be registered with a
    /// `WP_ASYNC` uffd in WP mode, else EPERM), so the next scan reports only pages written after
    /// this one: a write racing with the scan is either reported now or next time, never lost.
    pub fn scan_written(
        &self,
        start: usize,
        end: usize,
        reprotect: bool,
        out: &mut Vec<(usize, usize)>,
    ) -> Result<(), UffdError> {
        let req = ScanRequest {
            start,
            end,
            flags: if reprotect {
                pm_scan::WP_MATCHING | pm_scan::CHECK_WPASYNC
            } else {
                0
            },
            category_inverted: 0,
            category_mask: page_is::WRITTEN,
            category_anyof_mask: 0,
            return_mask: page_is::WRITTEN,
        };
        let mut regions = Vec::new();
        self.scan(&req, &mut regions)?;
        out.extend(regions.into_iter().map(|r| (r.start, r.end)));
        Ok(())
    }
}
