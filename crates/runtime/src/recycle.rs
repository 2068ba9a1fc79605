//! Page recycling: evicted pages become the receive buffers of the next fetches.
//!
//! An evicted page leaves the window with `UFFDIO_MOVE` into a staging slot. Once the write-back
//! thread has sent it, the slot still holds a mapped page: a *spent* slot. Instead of freeing it
//! (`madvise`) and letting `UFFDIO_COPY` allocate a fresh page for the next fetch, the handler
//! receives the fetched bytes straight into spent slots and moves those pages into the window.
//! Pages circulate between window and staging, and the kernel allocates and frees none.
//!
//! This matters most on virtual machines that hand freed guest memory back to the host (free
//! page reporting): there a fresh page costs about 7 times a warm one (1.45 µs against 0.20 µs
//! per 4 KiB on the machines the benchmarks ran on), and every fetch used to take one.

use crate::{Core, Inner, PAGE_SIZE};

/// Spent slots kept at most; beyond this the write-back thread frees them. Half the staging
/// area, so victims always find free slots.
pub(crate) const SPENT_CAP: u32 = (crate::STAGING_SLOTS / 2) as u32;

/// A run of spent slots taken out of [`Core::spent`]: whoever holds it is the only one to touch
/// those slots, which is what makes [`bytes`] sound. Created only here.
#[derive(Debug)]
pub(crate) struct SpentRun {
    start: u32,
    len: u32,
}

impl SpentRun {
    /// First slot.
    pub fn start(&self) -> u32 {
        self.start
    }

    /// Slots in the run, as a slot count.
    pub fn count(&self) -> u32 {
        self.len
    }
}

/// Records `[start, start + len)` as spent: written back, still mapped, nobody's. Merges it
/// with neighbouring spent runs, so that long runs form for long fetches. Returns false
/// (recording nothing) if the cap is reached; the caller frees the slots instead.
pub(crate) fn give(c: &mut Core, start: u32, len: u32) -> bool {
    if len == 0 || c.spent_pages + len > SPENT_CAP {
        return false;
    }
    c.spent_pages += len;
    let (mut s, mut l) = (start, len);
    if let Some((&ps, &pl)) = c.spent.range(..s).next_back() {
        if ps + pl == s {
            c.spent.remove(&ps);
            s = ps;
            l += pl;
        }
    }
    if let Some(nl) = c.spent.remove(&(start + len)) {
        l += nl;
    }
    c.spent.insert(s, l);
    true
}

/// Takes `n` neighbouring spent slots from the shortest run that has that many.
pub(crate) fn take(c: &mut Core, n: usize) -> Option<SpentRun> {
    let n = u32::try_from(n).ok().filter(|&n| n > 0)?;
    let (&start, &len) = c.spent.iter().filter(|(_, &l)| l >= n).min_by_key(|(_, &l)| l)?;
    c.spent.remove(&start);
    if len > n {
        c.spent.insert(start + n, len - n);
    }
    c.spent_pages -= n;
    Some(SpentRun { start, len: n })
}

/// Empties the spent list (the caller frees those slots' pages and makes them free slots).
pub(crate) fn take_all(c: &mut Core) -> Vec<(u32, u32)> {
    c.spent_pages = 0;
    std::mem::take(&mut c.spent).into_iter().collect()
}

/// The run's pages as bytes, to receive into.
pub(crate) fn bytes<'a>(inner: &'a Inner, run: &'a mut SpentRun) -> &'a mut [u8] {
    // SAFETY: a `SpentRun` is created only by `take`, which removes its slots from the spent
    // list under the core lock; no victim is moved into them (they are not free) and the
    // write-back thread is done with them, so the holder of `&mut run` is their only user for
    // the slice's lifetime. Spent slots are mapped (their pages were moved in and never freed),
    // so touching them raises no fault on the staging userfaultfd.
    unsafe {
        inner
            .staging
            .bytes_mut(run.start as usize * PAGE_SIZE, run.len as usize * PAGE_SIZE)
    }
}

/// The page staged in `slot` by an eviction job, read in place by whoever runs the job (the
/// write-back thread, or the handler for a job it keeps).
pub(crate) fn staged_page(inner: &Inner, slot: u32) -> &[u8] {
    // SAFETY: only the runner of an eviction job calls this, for a slot of that job whose
    // `moved` flag says the victim page is there: the page left the window by UFFDIO_MOVE, so
    // no program thread can write it, the handler touches no slot of a job in flight (other
    // than while running it), and the slot is given back (spent or freed) only after this
    // job's reads.
    unsafe { inner.staging.bytes(slot as usize * PAGE_SIZE, PAGE_SIZE) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn core() -> Core {
        Core::for_tests(16)
    }

    #[test]
    fn runs_coalesce_split_and_respect_the_cap() {
        let mut c = core();
        assert!(give(&mut c, 14, 4));
        assert!(give(&mut c, 10, 4), "merges with the run after it");
        assert!(give(&mut c, 30, 2));
        assert!(give(&mut c, 18, 2), "and with the run before it");
        assert_eq!(
            c.spent.iter().map(|(&s, &l)| (s, l)).collect::<Vec<_>>(),
            vec![(10, 10), (30, 2)]
        );
        assert!(take(&mut c, 11).is_none());
        let r = take(&mut c, 2).expect("best fit");
        assert_eq!((r.start(), r.count()), (30, 2));
        let r = take(&mut c, 3).expect("a run of 10 has 3");
        assert_eq!((r.start(), r.count()), (10, 3));
        assert_eq!(c.spent_pages, 7);
        assert!(!give(&mut c, 100, SPENT_CAP), "over the cap");
        assert_eq!(c.spent_pages, 7);
        assert_eq!(take_all(&mut c), vec![(13, 7)]);
        assert_eq!(c.spent_pages, 0);
    }
}
