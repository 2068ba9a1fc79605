//! The staging area's slots: where victims wait for their write-back, and where fetched pages
//! are received before they move into the window.
//!
//! A slot is *free* (no page mapped), *spent* (its victim was written back and its page is still
//! mapped: the next fetch can receive into it and move the page into the window, so the kernel
//! allocates no fresh page), or *out*: holding a victim in flight, or taken as a run to receive
//! a fetch. Free, spent and out always add up to the area's size ([`Slots::check`]); the number
//! of slots bounds the pages in flight to the write-back thread.

use std::collections::BTreeMap;

/// A run of spent slots taken out of the spent list: whoever holds it is the only one to touch
/// those slots until they are given back. Only [`Slots::take_spent`] makes one.
#[derive(Debug)]
pub struct SpentRun {
    start: u32,
    len: u32,
}

impl SpentRun {
    /// First slot.
    pub fn start(&self) -> u32 {
        self.start
    }

    /// Slots in the run.
    pub fn count(&self) -> u32 {
        self.len
    }
}

/// The staging area's slots.
#[derive(Debug, Clone)]
pub struct Slots {
    /// Free slots; popped from the end, so pushing the highest first hands out ascending runs.
    free: Vec<u32>,
    /// Runs of spent slots, first slot → length.
    spent: BTreeMap<u32, u32>,
    spent_pages: u32,
    /// Slots neither free nor spent.
    out: u32,
    total: u32,
    spent_cap: u32,
}

impl Slots {
    /// `total` free slots; at most half may be kept spent, so victims always find free ones.
    pub fn new(total: u32) -> Slots {
        Slots {
            free: (0..total).rev().collect(),
            spent: BTreeMap::new(),
            spent_pages: 0,
            out: 0,
            total,
            spent_cap: total / 2,
        }
    }

    /// Slots in the area.
    pub fn total(&self) -> u32 {
        self.total
    }

    /// Free slots.
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Spent slots.
    pub fn spent_count(&self) -> u32 {
        self.spent_pages
    }

    /// Takes a free slot (it is out until given back).
    pub fn pop_free(&mut self) -> Option<u32> {
        let s = self.free.pop()?;
        self.out += 1;
        Some(s)
    }

    /// Gives back slots that are out, as free (their pages were freed or moved away).
    pub fn put_free(&mut self, slots: impl IntoIterator<Item = u32>) {
        for s in slots {
            assert!(self.out > 0 && s < self.total, "slot {s} freed twice or unknown");
            self.out -= 1;
            self.free.push(s);
        }
    }

    /// Gives back `[start, start + len)` (out) as spent, merged with neighbouring spent runs so
    /// long fetches find long runs. False, recording nothing, past the cap: the caller frees the
    /// slots' pages and calls [`Slots::put_free`].
    pub fn give_spent(&mut self, start: u32, len: u32) -> bool {
        if len == 0 || self.spent_pages + len > self.spent_cap {
            return false;
        }
        assert!(self.out >= len, "slots {start}+{len} given back but not out");
        self.out -= len;
        self.spent_pages += len;
        let (mut s, mut l) = (start, len);
        if let Some((&ps, &pl)) = self.spent.range(..s).next_back() {
            if ps + pl == s {
                self.spent.remove(&ps);
                s = ps;
                l += pl;
            }
        }
        if let Some(nl) = self.spent.remove(&(start + len)) {
            l += nl;
        }
        self.spent.insert(s, l);
        true
    }

    /// Takes `n` neighbouring spent slots from the shortest run that has that many.
    pub fn take_spent(&mut self, n: usize) -> Option<SpentRun> {
        let n = u32::try_from(n).ok().filter(|&n| n > 0)?;
        let (&start, &len) = self.spent.iter().filter(|(_, &l)| l >= n).min_by_key(|(_, &l)| l)?;
        self.spent.remove(&start);
        if len > n {
            self.spent.insert(start + n, len - n);
        }
        self.spent_pages -= n;
        self.out += n;
        Some(SpentRun { start, len: n })
    }

    /// Takes every spent run (the caller frees their pages and puts the slots back free).
    pub fn take_all_spent(&mut self) -> Vec<(u32, u32)> {
        self.out += self.spent_pages;
        self.spent_pages = 0;
        std::mem::take(&mut self.spent).into_iter().collect()
    }

    /// True if no slot is spent.
    pub fn spent_is_empty(&self) -> bool {
        self.spent.is_empty()
    }

    /// Slots out (holding victims in flight or taken to receive fetches).
    pub fn out(&self) -> u32 {
        self.out
    }

    /// Checks that free, spent and out slots add up to the area and that no slot is listed
    /// twice.
    pub fn check(&self) -> Result<(), String> {
        let listed = self.free.len() as u32 + self.spent_pages + self.out;
        if listed != self.total {
            return Err(format!(
                "slots: {} free + {} spent + {} out != {}",
                self.free.len(),
                self.spent_pages,
                self.out,
                self.total
            ));
        }
        let mut seen = vec![false; self.total as usize];
        let spent = self.spent.iter().flat_map(|(&s, &l)| s..s + l);
        for s in self.free.iter().copied().chain(spent) {
            match seen.get_mut(s as usize) {
                Some(b) if !*b => *b = true,
                _ => return Err(format!("slot {s} is listed twice or out of range")),
            }
        }
        if self.spent.values().sum::<u32>() != self.spent_pages {
            return Err("spent runs do not add up to the spent count".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_coalesce_split_and_respect_the_cap() {
        let mut s = Slots::new(64);
        let taken: Vec<u32> = (0..40).map(|_| s.pop_free().expect("free slot")).collect();
        assert_eq!(taken[..3], [0, 1, 2], "ascending runs");
        assert!(s.give_spent(14, 4));
        assert!(s.give_spent(10, 4), "merges with the run after it");
        assert!(s.give_spent(30, 2));
        assert!(s.give_spent(18, 2), "and with the run before it");
        assert_eq!(
            s.spent.iter().map(|(&a, &l)| (a, l)).collect::<Vec<_>>(),
            vec![(10, 10), (30, 2)]
        );
        assert!(s.take_spent(11).is_none());
        let r = s.take_spent(2).expect("best fit");
        assert_eq!((r.start(), r.count()), (30, 2));
        let r = s.take_spent(3).expect("a run of 10 has 3");
        assert_eq!((r.start(), r.count()), (10, 3));
        assert_eq!(s.spent_count(), 7);
        assert!(!s.give_spent(20, 32), "over the cap");
        assert_eq!(s.spent_count(), 7);
        s.check().expect("consistent");
        assert_eq!(s.take_all_spent(), vec![(13, 7)]);
        assert_eq!(s.spent_count(), 0);
        s.put_free(13..20);
        s.check().expect("consistent");
    }

    #[test]
    fn a_slot_freed_twice_is_caught() {
        let mut s = Slots::new(4);
        let a = s.pop_free().expect("free slot");
        s.put_free([a]);
        let r = std::panic::catch_unwind(move || s.put_free([a]));
        assert!(r.is_err(), "freeing a slot that is not out must panic");
    }
}
