//! First in, first out: the order pages came in is the order they leave.

use super::{EvictionPolicy, PageMap};
use std::collections::VecDeque;

/// First in, first out, with lazy deletion: removals only drop the page from the index; stale
/// queue entries are skipped when they reach the head.
#[derive(Default)]
pub struct Fifo {
    queue: VecDeque<(u32, u32)>,
    live: PageMap<u32>,
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
}
