//! The write-back sequence: the victims of an eviction job, moved out of the window into their
//! staging slots, are examined (same-filled, clean or dirty), the dirty ones written to their
//! bricks, their slots kept spent for the next fetches or freed, and their pages finished in
//! the core.
//!
//! [`write_back`] runs it for one job. The runtime's write-back thread (and its fault handler,
//! for jobs a memory copy away) implements [`Writer`] with links and mapped segments
//! (`rackmem-runtime`, `writeback.rs`); the simulation with maps, completing jobs in any order.
//!
//! Only victims still evicting under their own job are examined and sent: a page released
//! after it was staged has a stale staged copy, and whatever order jobs complete in, that copy
//! must never overwrite what a later eviction of the page wrote.
//!
//! A victim whose range is moving to another memory is *parked*: left evicting in its slot,
//! neither examined nor sent, until the move ends and hands it back ([`Core::finish_move`]) to
//! be written to its new home. Its old home must not change under the move's copy.

use crate::core::{Core, Victim};
use crate::fault::lock;
use crate::state::Evicted;
use std::sync::Mutex;

/// What a staged victim turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Examined {
    /// Every 8-byte word of it is this value: kept in the core, not sent.
    Filled(u64),
    /// Its brick (or the zero page it was installed as) already holds its contents.
    Clean,
    /// Changed: queued for writing to its brick.
    Dirty,
}

/// What the write-back sequence needs from the world. No method is called under the core's
/// lock.
pub trait Writer {
    /// Looks at the staged copy of `v` (moved out, still its job's): same-filled, clean, or
    /// dirty and queued for writing.
    fn examine(&mut self, v: &Victim) -> Examined;
    /// Writes the queued dirty pages to their bricks.
    fn flush(&mut self);
    /// Gives the memory of staging slots `start..start+count` back (they become free).
    fn discard_slots(&mut self, start: u32, count: u32);
}

/// Writes back eviction job `id` (see the module documentation). The caller wakes whoever
/// waits for slots or pages afterwards.
pub fn write_back<W: Writer>(core: &Mutex<Core>, w: &mut W, id: u64, victims: &[Victim]) {
    let unparked: Vec<Victim>;
    let victims: &[Victim] = {
        let mut c = lock(core);
        if c.moves_in_progress() == 0 {
            victims
        } else {
            // Parked victims stay evicting in their slots; the rest of the job goes on.
            unparked = victims
                .iter()
                .filter(|v| !(v.moved && c.is_evicting_for(id, v.page) && c.park(id, v)))
                .copied()
                .collect();
            &unparked
        }
    };
    let mut how: Vec<Evicted> = {
        let c = lock(core);
        victims
            .iter()
            .map(|v| {
                if v.moved && c.is_evicting_for(id, v.page) {
                    Evicted::Written
                } else {
                    Evicted::Gone
                }
            })
            .collect()
    };
    for (h, v) in how.iter_mut().zip(victims) {
        if *h == Evicted::Gone {
            continue;
        }
        *h = match w.examine(v) {
            Examined::Filled(word) => Evicted::Filled(word),
            Examined::Clean => Evicted::Clean,
            Examined::Dirty => Evicted::Written,
        };
    }
    w.flush();
    // Runs of neighbouring moved slots: kept as spent slots for the next fetches, or, past the
    // cap, given back with one call per run.
    let mut slots: Vec<u32> = victims.iter().filter(|v| v.moved).map(|v| v.slot).collect();
    slots.sort_unstable();
    let mut runs: Vec<(u32, u32, bool)> = Vec::new();
    for &s in &slots {
        match runs.last_mut() {
            Some(r) if r.0 + r.1 == s => r.1 += 1,
            _ => runs.push((s, 1, false)),
        }
    }
    {
        let mut c = lock(core);
        for r in runs.iter_mut() {
            r.2 = c.slots.give_spent(r.0, r.1);
        }
    }
    for &(start, len, kept) in &runs {
        if !kept {
            w.discard_slots(start, len);
        }
    }
    let mut c = lock(core);
    for (v, &h) in victims.iter().zip(&how) {
        c.finish_eviction(id, v.page, h);
    }
    // Highest first, so the fault path pops ascending runs of neighbouring slots.
    let in_spent = |s: u32| runs.iter().any(|&(a, l, kept)| kept && s >= a && s < a + l);
    let mut freed: Vec<u32> = victims.iter().map(|v| v.slot).filter(|&s| !in_spent(s)).collect();
    freed.sort_unstable_by(|a, b| b.cmp(a));
    c.slots.put_free(freed);
}
