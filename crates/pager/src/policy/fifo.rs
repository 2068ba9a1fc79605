//! First in, first out: the policy that what userfaultfd reports supports exactly.

use super::EvictionPolicy;
use std::collections::{HashMap, VecDeque};

/// First in, first out, with lazy deletion: removals only drop the page from the index; stale
/// queue entries are skipped when they reach the head.
#[derive(Default)]
pub struct Fifo {
    queue: VecDeque<(u32, u32)>,
    live: HashMap<u32, u32>,
    generation: u32,
}

impl EvictionPolicy for Fifo {
    fn inserted(&mut self, page: u32) {
        self.generation = self.generation.wrapping_add(1);
        self.live.insert(page, self.generation);
        self.queue.push_back((page, self.generation));
        // Keep the queue bounded when pages churn through `removed`.
        if self.queue.len() > 4 * self.live.len() + 1024 {
            let live = &self.live;
            self.queue.retain(|(p, g)| live.get(p) == Some(g));
        }
    }

    fn removed(&mut self, page: u32) {
        self.live.remove(&page);
    }

    fn victims(&mut self, n: usize, out: &mut Vec<u32>) {
        let mut taken = 0;
        while taken < n {
            let Some((page, generation)) = self.queue.pop_front() else {
                break;
            };
            if self.live.get(&page) == Some(&generation) {
                self.live.remove(&page);
                out.push(page);
                taken += 1;
            }
        }
    }

    fn len(&self) -> usize {
        self.live.len()
    }

    fn name(&self) -> &'static str {
        "fifo"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_order_and_lazy_removal() {
        let mut f = Fifo::default();
        for p in [1, 2, 3, 4] {
            f.inserted(p);
        }
        f.removed(2);
        f.inserted(1); // re-inserted: moves to the back
        let mut out = Vec::new();
        f.victims(2, &mut out);
        assert_eq!(out, vec![3, 4]);
        out.clear();
        f.victims(5, &mut out);
        assert_eq!(out, vec![1]);
        assert!(f.is_empty());
    }
}
