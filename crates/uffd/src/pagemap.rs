//! `PAGEMAP_SCAN` on `/proc/self/pagemap`: which pages of a range were written since they were
//! last write-protected, optionally re-protecting them in the same call (`PM_SCAN_WP_MATCHING`).
//! With `UFFD_FEATURE_WP_ASYNC` this is the whole dirty-tracking mechanism: no fault per write.

use crate::{UffdError, PAGE_SIZE};
use linux_raw_sys::general as sys;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: u32 =
    (3 << 30) | ((std::mem::size_of::<sys::pm_scan_arg>() as u32) << 16) | ((b'f' as u32) << 8) | 16;
/// Regions returned per ioctl.
const VEC_LEN: usize = 256;

/// One run of pages with the same categories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRegion {
    /// Start address.
    pub start: usize,
    /// End address (exclusive).
    pub end: usize,
    /// `PAGE_IS_*` bits (masked by the request's return mask).
    pub categories: u64,
}

/// A general scan request (see the kernel's `Documentation/admin-guide/mm/pagemap.rst`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ScanRequest {
    /// Range start.
    pub start: usize,
    /// Range end.
    pub end: usize,
    /// `PM_SCAN_*` flags.
    pub flags: u64,
    /// Categories inverted before matching.
    pub category_inverted: u64,
    /// All of these must be set.
    pub category_mask: u64,
    /// At least one of these must be set.
    pub category_anyof_mask: u64,
    /// Categories reported back.
    pub return_mask: u64,
}

/// `/proc/self/pagemap`, opened once.
#[derive(Debug)]
pub struct Pagemap {
    file: File,
}

impl Pagemap {
    /// Opens `/proc/self/pagemap`.
    pub fn open() -> Result<Pagemap, UffdError> {
        File::open("/proc/self/pagemap")
            .map(|file| Pagemap { file })
            .map_err(|errno| UffdError::Os {
                op: "open /proc/self/pagemap",
                addr: 0,
                len: 0,
                errno,
            })
    }

    /// Runs a scan over the whole requested range, appending regions to `out`.
    pub fn scan(&self, req: &ScanRequest, out: &mut Vec<PageRegion>) -> Result<(), UffdError> {
        let mut regions = [sys::page_region {
            start: 0,
            end: 0,
            categories: 0,
        }; VEC_LEN];
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
            // SAFETY: `arg` is a valid pm_scan_arg whose `vec` points at VEC_LEN page_regions
            // that live across the call.
            let n = unsafe { libc::ioctl(self.file.as_raw_fd(), PAGEMAP_SCAN as libc::c_ulong, &mut arg) };
            if n < 0 {
                return Err(UffdError::Os {
                    op: "PAGEMAP_SCAN",
                    addr: at,
                    len: req.end - at,
                    errno: io::Error::last_os_error(),
                });
            }
            let n = n as usize;
            for r in &regions[..n.min(VEC_LEN)] {
                out.push(PageRegion {
                    start: r.start as usize,
                    end: r.end as usize,
                    categories: r.categories,
                });
            }
            // Fewer regions than the vector holds means the walk reached the end, whatever
            // walk_end says; a full vector means continue from walk_end.
            if n < VEC_LEN {
                break;
            }
            let next = (arg.walk_end as usize).max(out.last().map_or(at + PAGE_SIZE, |r| r.end));
            if next <= at {
                break;
            }
            at = next;
        }
        Ok(())
    }

    /// Written pages (uffd-wp bit clear) in `[start, end)` as `(start, end)` ranges. With
    /// `reprotect`, the kernel write-protects what it reports in the same walk, so the next
    /// scan reports only pages written after this one.
    pub fn scan_written(
        &self,
        start: usize,
        end: usize,
        reprotect: bool,
        out: &mut Vec<(usize, usize)>,
    ) -> Result<(), UffdError> {
        let written = sys::PAGE_IS_WRITTEN as u64;
        let req = ScanRequest {
            start,
            end,
            flags: if reprotect {
                (sys::PM_SCAN_WP_MATCHING | sys::PM_SCAN_CHECK_WPASYNC) as u64
            } else {
                0
            },
            category_inverted: 0,
            category_mask: written,
            category_anyof_mask: 0,
            return_mask: written,
        };
        let mut regions = Vec::new();
        self.scan(&req, &mut regions)?;
        out.extend(regions.into_iter().map(|r| (r.start, r.end)));
        Ok(())
    }
}
