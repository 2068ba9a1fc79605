//! Refault: a segmented FIFO whose pages earn protection by coming back after eviction.
//!
//! The runtime never sees a hit on a resident page, only faults, so the one sign that a page is
//! hot is that it faults again soon after being evicted. The policy keeps:
//!
//! - *probation*, a FIFO that every newly faulted page enters and that victims come from,
//!   oldest first;
//! - *ghosts*, the pages evicted most recently: a page is one while fewer than a budget's worth
//!   of evictions came after its own (its refault distance), with the score it left with;
//! - *protected*, a queue of pages that faulted back while still remembered as ghosts, which
//!   eviction does not touch while probation has pages. It may hold all but an eighth of the
//!   budget ([`MIN_PROBATION_DIVISOR`]).
//!
//! A page's *score* counts how often it came back (at most [`MAX_SCORE`]), halved every
//! [`AGE_BUDGETS`] budgets' worth of evictions so that a hot set that has moved on loses its
//! hold. While protected has room, a page that comes back joins it. Once it is full, the page
//! challenges protected's oldest page: if it came back more often (a higher score), it takes
//! the oldest page's place and that page is demoted to probation; if not, the oldest page goes
//! round again and the newcomer stays in probation, keeping its score for its next return.
//! Without the challenge, protected would be a FIFO of everything that ever came back, and a
//! cold page re-drawn by chance soon after its eviction would push out a hot one, whose return
//! pushes out another: hits cannot be seen, so only how often a page came back tells hot from
//! lucky.
//!
//! What it guarantees: a stream that never comes back within a budget's worth of evictions (a
//! scan larger than the local buffer, STREAM) promotes nothing and is evicted exactly as
//! [`super::Fifo`] evicts it. A scan of new pages cannot flush protected pages: new pages enter
//! probation and leave from it. Memory: one entry per resident page (O(budget)), and one word
//! per window page up to the highest evicted (8 bytes per 4 KiB page: 0.2% of the window) for
//! the ghosts, an array because it is read at every install and written at every eviction.
//! Every operation is O(1) amortised (queues with lazy deletion, compacted when stale entries
//! outnumber live ones; scores age lazily, by the epoch they were last set in).

use super::{EvictionPolicy, PageMap};
use std::collections::VecDeque;

/// Protected may hold all but this fraction of the budget: probation keeps at least an eighth,
/// so that pages not yet proven hot stay a while before they are evicted.
pub const MIN_PROBATION_DIVISOR: usize = 8;
/// Highest score a page earns by coming back.
pub const MAX_SCORE: u8 = 15;
/// Scores halve every this many budgets' worth of evictions. Measured on simulated traces
/// (the policy's tests): never halving keeps a hot set that has moved on protected for too
/// long (a moving hot set faulted 11% more than with FIFO); halving every two to three budgets
/// lets cold pages that came back by chance win challenges against hot pages that have had
/// no reason to come back (they are resident), and the skewed workload's faults per cold
/// update rose from 1.08 towards 1.3. Six budgets holds both.
pub const AGE_BUDGETS: u64 = 6;

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// Matches the page's one live queue entry (older entries are stale).
    generation: u32,
    protected: bool,
    score: Score,
}

/// A score and the aging epoch it was set in; it halves once per epoch since.
#[derive(Clone, Copy, Debug, Default)]
struct Score {
    value: u8,
    epoch: u32,
}

impl Score {
    fn now(self, epoch: u32) -> u8 {
        let halvings = epoch.wrapping_sub(self.epoch).min(8);
        self.value.checked_shr(halvings).unwrap_or(0)
    }
}

/// The refault-driven policy (see the module docs).
#[derive(Default)]
pub struct Refault {
    live: PageMap<Entry>,
    probation: VecDeque<(u32, u32)>,
    protected: VecDeque<(u32, u32)>,
    /// Live pages in `protected`.
    protected_len: usize,
    /// Per window page, its last eviction as a ghost: `(eviction count + 1) << 8 | score`, 0
    /// for none. A ghost is live while fewer than a budget of evictions came after it (the
    /// page's refault distance, as Linux's workingset measures it). An array, not a map: it is
    /// read at every install and written at every eviction, and a scan evicts at memory speed.
    /// Grown to the highest page evicted: 8 bytes per window page at most.
    ghost: Vec<u64>,
    evictions: u64,
    /// Aging epoch, and the eviction count when it began.
    epoch: u32,
    epoch_began: u64,
    generation: u32,
    /// The budget in pages; 0 until told (then the pages held stand for it).
    capacity: usize,
    /// Pages promoted into protected, for tests and tuning.
    promotions: u64,
}

impl Refault {
    /// The budget: what the runtime said, or the pages held until it says.
    fn capacity(&self) -> usize {
        if self.capacity == 0 {
            self.live.len().max(1)
        } else {
            self.capacity
        }
    }

    /// Most pages protected may hold.
    fn protected_target(&self) -> usize {
        let cap = self.capacity();
        cap - cap.div_ceil(MIN_PROBATION_DIVISOR)
    }

    /// Pages promoted into protected so far.
    pub fn promotions(&self) -> u64 {
        self.promotions
    }

    /// Live ghosts now (O(window): for tests).
    pub fn ghosts(&self) -> usize {
        (0..self.ghost.len()).filter(|&p| self.ghost_at(p).is_some()).count()
    }

    /// When page index `p` was evicted, if it is a live ghost.
    fn ghost_at(&self, p: usize) -> Option<u64> {
        let g = *self.ghost.get(p)?;
        let at = (g >> 8).checked_sub(1)?;
        (self.evictions - at <= self.capacity() as u64).then_some(at)
    }

    /// Takes page `page`'s ghost, if live: the score it left with, halved once if an aging
    /// epoch began since (a live ghost is younger than a budget of evictions, an epoch lasts
    /// several budgets, so at most one began).
    fn take_ghost(&mut self, page: u32) -> Option<u8> {
        let p = page as usize;
        let at = self.ghost_at(p);
        let g = std::mem::take(self.ghost.get_mut(p)?);
        let at = at?;
        let value = (g & 0xff) as u8;
        Some(if at < self.epoch_began { value >> 1 } else { value })
    }

    /// Pages in protected now.
    pub fn protected_len(&self) -> usize {
        self.protected_len
    }

    /// Queue entries held, live and stale (for the bound on memory).
    pub fn queued(&self) -> usize {
        self.probation.len() + self.protected.len()
    }

    /// Records `page` live under a new generation (its queue entry is the caller's to push).
    fn enter(&mut self, page: u32, protected: bool, score: Score) -> u32 {
        self.generation = self.generation.wrapping_add(1);
        let generation = self.generation;
        self.live.insert(
            page,
            Entry {
                generation,
                protected,
                score,
            },
        );
        generation
    }

    fn push(&mut self, page: u32, protected: bool, score: Score) {
        let generation = self.enter(page, protected, score);
        if protected {
            self.protected_len += 1;
            self.protected.push_back((page, generation));
        } else {
            self.probation.push_back((page, generation));
        }
    }

    /// The oldest live page of protected (or probation), out of its queue and its count but
    /// still in `live`: the caller pushes it somewhere or removes it.
    fn pop_live(&mut self, protected: bool) -> Option<(u32, Entry)> {
        loop {
            let queue = if protected {
                &mut self.protected
            } else {
                &mut self.probation
            };
            let (page, generation) = queue.pop_front()?;
            match self.live.get(&page) {
                Some(&e) if e.generation == generation && e.protected == protected => {
                    if protected {
                        self.protected_len -= 1;
                    }
                    return Some((page, e));
                }
                _ => continue,
            }
        }
    }

    /// A page came back while remembered, with `score` (its new one): into protected if it
    /// has room or the page beats protected's oldest, else into probation.
    fn returned(&mut self, page: u32, score: Score) {
        if self.protected_len < self.protected_target() {
            self.promotions += 1;
            self.push(page, true, score);
            return;
        }
        match self.pop_live(true) {
            Some((head, e)) if e.score.now(self.epoch) < score.value => {
                self.push(head, false, e.score);
                self.promotions += 1;
                self.push(page, true, score);
            }
            Some((head, e)) => {
                self.push(head, true, e.score);
                self.push(page, false, score);
            }
            None => self.push(page, false, score),
        }
    }

    /// Demotes protected's oldest pages while it holds more than its target (the budget shrank).
    fn shed(&mut self) {
        while self.protected_len > self.protected_target() {
            let Some((page, e)) = self.pop_live(true) else {
                break;
            };
            self.push(page, false, e.score);
        }
    }

    fn remember(&mut self, page: u32, score: Score) {
        let evicted_at = self.evictions;
        self.evictions += 1;
        if self.evictions - self.epoch_began >= AGE_BUDGETS * self.capacity() as u64 {
            self.epoch = self.epoch.wrapping_add(1);
            self.epoch_began = self.evictions;
        }
        let p = page as usize;
        if p >= self.ghost.len() {
            self.ghost.resize(p + 1, 0);
        }
        self.ghost[p] = ((evicted_at + 1) << 8) | u64::from(score.now(self.epoch));
    }

    /// Drops stale queue entries once they outnumber live ones, keeping memory O(budget).
    fn compact(&mut self) {
        let live = &self.live;
        if self.probation.len() + self.protected.len() > 2 * live.len() + 1024 {
            let keep = |protected: bool| {
                move |&(p, g): &(u32, u32)| {
                    live.get(&p)
                        .is_some_and(|e| e.generation == g && e.protected == protected)
                }
            };
            self.probation.retain(keep(false));
            self.protected.retain(keep(true));
        }
    }
}

impl EvictionPolicy for Refault {
    fn inserted(&mut self, page: u32) {
        match self.take_ghost(page) {
            Some(left_with) => {
                let value = left_with.saturating_add(1).min(MAX_SCORE);
                let epoch = self.epoch;
                self.returned(page, Score { value, epoch });
            }
            None => self.push(page, false, Score::default()),
        }
        self.compact();
    }

    fn removed(&mut self, page: u32) {
        if let Some(e) = self.live.remove(&page) {
            if e.protected {
                self.protected_len -= 1;
            }
        }
    }

    fn victims(&mut self, n: usize, out: &mut Vec<u32>) {
        for _ in 0..n {
            // Probation's oldest; protected's only when probation is empty.
            let Some((page, e)) = self.pop_live(false).or_else(|| self.pop_live(true)) else {
                break;
            };
            self.live.remove(&page);
            self.remember(page, e.score);
            out.push(page);
        }
        self.compact();
    }

    fn len(&self) -> usize {
        self.live.len()
    }

    fn released(&mut self, first: u32, count: u32) {
        let end = (first as usize).saturating_add(count as usize).min(self.ghost.len());
        if let Some(range) = self.ghost.get_mut(first as usize..end) {
            range.fill(0);
        }
    }

    /// Protected pages go to probation's old end, in their order, with their scores: the next
    /// victims are the pages proven hot under the previous load, and the favoured thread's pages
    /// that come back within a budget of evictions earn protection again.
    fn demote_all(&mut self) {
        let mut hot = Vec::with_capacity(self.protected_len);
        while let Some(e) = self.pop_live(true) {
            hot.push(e);
        }
        for &(page, e) in hot.iter().rev() {
            let generation = self.enter(page, false, e.score);
            self.probation.push_front((page, generation));
        }
        self.compact();
    }

    fn set_capacity(&mut self, pages: usize) {
        let shrank = pages < self.capacity;
        self.capacity = pages.max(1);
        if shrank {
            self.shed();
        }
    }
}
