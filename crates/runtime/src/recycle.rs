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

use crate::Inner;
use rackmem_pager::SpentRun;

/// The run's pages as bytes, to receive into.
pub(crate) fn bytes<'a>(inner: &'a Inner, run: &'a mut SpentRun) -> &'a mut [u8] {
    // SAFETY: a `SpentRun` is created only by `Slots::take_spent`, which removes its slots from
    // the spent list under the core lock; no victim is moved into them (they are not free) and the
    // write-back thread is done with them, so the holder of `&mut run` is their only user for
    // the slice's lifetime. Spent slots are mapped (their pages were moved in and never freed),
    // so touching them raises no fault on the staging userfaultfd.
    unsafe {
        inner.staging.bytes_mut(
            run.start() as usize * inner.unit_bytes(),
            run.count() as usize * inner.unit_bytes(),
        )
    }
}

/// The page (or huge unit) staged in `slot` by an eviction job, read in place by whoever runs the job (the
/// write-back thread, or the handler for a job it keeps).
pub(crate) fn staged_page(inner: &Inner, slot: u32) -> &[u8] {
    // SAFETY: only the runner of an eviction job calls this, for a slot of that job whose
    // `moved` flag says the victim page is there: the page left the window by UFFDIO_MOVE, so
    // no program thread can write it, the handler touches no slot of a job in flight (other
    // than while running it), and the slot is given back (spent or freed) only after this
    // job's reads.
    unsafe {
        inner
            .staging
            .bytes(slot as usize * inner.unit_bytes(), inner.unit_bytes())
    }
}
