//! Draining a brick, the runtime's part: the node agent orders the process (an `evacuate` order
//! on its order connection) to empty some of its segments, those on a brick the control plane
//! drains, each into a new segment on a brick the control plane picked; then their allocations
//! go back, so the draining brick's segment count reaches zero.
//!
//! Per segment `S` (the same machinery as a migration, `migrate.rs`): a segment `T` of `S`'s
//! size is granted on the target and attached aside; every window range whose home is `S`
//! (the pages the concatenation gives it that have not moved, and the moved ranges that point
//! at it: [`SegmentTable::homes_on`](crate::segment::SegmentTable::homes_on), which also finds
//! the segments the agent grows, which the core's placement does not list) moves to the same
//! page of `T`, in pieces of at most [`CHUNK_PAGES`], each a move that parks the range's
//! write-backs until it is finalized, so no write is lost while the program runs. Unallocated
//! pages move too (they carry nothing, only their home changes), so no window page is left
//! whose home is `S`.
//!
//! Then `S` is retired, not popped: its slot empties in place (the others keep their indices,
//! which the core's placement and the moved ranges name), after a grace period for faults that
//! looked `S` up before the last Finalize and are about to read it, and the allocation goes
//! back once every segment of it is retired and no reader holds one any more.

use crate::migrate::MigrateError;
use crate::segment::Segment;
use crate::{sys, Runtime};
use rackmem_transport::BrickAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most pages one move of an evacuation covers (8 MiB): bounds how long the range's
/// write-backs stay parked (and hold their staging slots) while the program runs.
const CHUNK_PAGES: u64 = 2048;
/// Longest the runtime waits for faults still holding a retired segment before it returns the
/// segment's allocation anyway at a later order.
const READERS_WAIT: Duration = Duration::from_secs(10);

/// Segments retired by drains whose allocations are not returned yet.
#[derive(Default)]
pub(crate) struct Retired {
    list: Mutex<Vec<Arc<Segment>>>,
}

impl Runtime {
    /// Empties the segments `moves` names (control-plane segment ids) into new segments on
    /// their targets and returns the allocations emptied; see the module documentation.
    /// Returns the ids of the segments no longer attached (emptied now or before).
    pub fn evacuate(&self, moves: &[(u64, BrickAddr)]) -> Result<Vec<u64>, MigrateError> {
        let inner = &self.inner;
        let Some(agent) = inner.agent.as_ref() else {
            return Err(MigrateError::UnknownBrick(
                "an evacuation needs a node agent's memory".into(),
            ));
        };
        let mut emptied: Vec<(u64, usize)> = Vec::new();
        let mut done = Vec::new();
        let mut failed = None;
        for (id, to) in moves {
            let Some(index) = inner.table.index_of(*id) else {
                done.push(*id);
                continue;
            };
            match sys::without_sigpipe(|| self.empty_segment(agent, index, to)) {
                Ok(()) => emptied.push((*id, index)),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if !emptied.is_empty() {
            // A fault that looked a segment up before the last Finalize takes it (an `Arc`) a
            // moment later: it has had far longer than that once the watchdog's limit for one
            // fault has passed.
            std::thread::sleep(crate::migrate::fault_grace(&inner.cfg));
            let mut retired = inner.retired.list.lock().unwrap_or_else(|e| e.into_inner());
            for (id, index) in emptied {
                if let Some(s) = inner.table.retire(index) {
                    retired.push(s);
                }
                done.push(id);
            }
        }
        self.return_retired(agent);
        match failed {
            Some(e) => Err(e),
            None => Ok(done),
        }
    }

    /// Moves every window range whose home is segment `index` to a new segment on `to`.
    fn empty_segment(&self, agent: &crate::agent::Agent, index: usize, to: &BrickAddr) -> Result<(), MigrateError> {
        let inner = &self.inner;
        let _one = inner.migrations.lock_one();
        let seg = inner.segment(index);
        let homes = inner.table.homes_on(index);
        let (t, t_pages) = self.attach_aside(agent, to, seg.grant.size_bytes, seg.pages)?;
        for (r, seg_page) in homes {
            let mut a = r.start;
            while a < r.end {
                let b = (a + CHUNK_PAGES).min(r.end);
                if let Err(e) = self.move_piece(
                    a,
                    b,
                    to,
                    Some((t, seg_page + (a - r.start))),
                    crate::migrate::Route::Chosen,
                ) {
                    // The agent asks again a second later: a target that received nothing goes
                    // back at once, or each retry would hold one more. No lookup reaches it.
                    if inner.table.homes_on(t).is_empty() {
                        if let Some(s) = inner.table.retire(t).and_then(|s| s.allocation) {
                            let _ = agent.release(s);
                        }
                    }
                    return Err(e);
                }
                a = b;
            }
        }
        // A migration segment's free rest goes on serving migrations, from its new home.
        inner.migrations.replaced(index, t, to, t_pages);
        let left = inner.table.homes_on(index);
        if let Some((r, _)) = left.first() {
            // Only a migration could have homed pages here meanwhile, and they wait for `one`.
            return Err(MigrateError::Busy {
                first: r.start,
                end: r.end,
                why: format!("still homed on segment {} after its evacuation", seg.grant.segment_id),
            });
        }
        if inner.cfg.verbose {
            eprintln!(
                "rackmem[{}]: segment {} on {} emptied into a new one on {to}",
                std::process::id(),
                seg.grant.segment_id,
                seg.addr
            );
        }
        Ok(())
    }

    /// Returns each allocation whose segments are all retired and held by nobody else.
    fn return_retired(&self, agent: &crate::agent::Agent) {
        let inner = &self.inner;
        let deadline = Instant::now() + READERS_WAIT;
        let mut retired = inner.retired.list.lock().unwrap_or_else(|e| e.into_inner());
        // Faults still reading a retired segment hold it; they end within a fault's time.
        while retired.iter().any(|s| Arc::strong_count(s) > 1) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let live: Vec<Option<u64>> = inner.table.all().iter().map(|s| s.allocation).collect();
        let mut ids: Vec<u64> = retired
            .iter()
            .filter_map(|s| s.allocation)
            .filter(|a| !live.contains(&Some(*a)))
            .filter(|a| {
                retired
                    .iter()
                    .filter(|s| s.allocation == Some(*a))
                    .all(|s| Arc::strong_count(s) == 1)
            })
            .collect();
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            match sys::without_sigpipe(|| agent.release(id)) {
                Ok(()) => {
                    retired.retain(|s| s.allocation != Some(id));
                    if inner.cfg.verbose {
                        eprintln!(
                            "rackmem[{}]: returned allocation {id}, emptied by a drain",
                            std::process::id()
                        );
                    }
                }
                Err(e) => eprintln!("rackmem: warning: returning allocation {id} emptied by a drain: {e}"),
            }
        }
    }
}
