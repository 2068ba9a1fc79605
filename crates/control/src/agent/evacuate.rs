//! Draining a brick, and rebalancing, the agent's part: the control plane lists, in the reply
//! to each pool report, the segments of this node's allocations on draining bricks or that a
//! rebalance moves now, and where each goes ([`Evacuation`]). The agent's `agent-evacuate` thread takes the latest list and, for each
//! segment: releases an unused pool allocation at once; orders the process that uses a pool
//! allocation or holds one to move the pages off and return it (an `evacuate` order on the
//! process's order connection, as `rackmem migrate --pid` uses); and says why it cannot when no
//! process of this agent run holds it or the control plane found no target.
//!
//! One list is kept (the newest replaces an older one not yet taken) and one thread works
//! through it, one process at a time; the list comes again with every report until the
//! segments are gone, so a refusal (busy, no room on the target) is retried a second later.

use super::{lock, Shared};
use crate::api::Evacuation;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The list waiting for the thread.
#[derive(Default)]
pub(super) struct Pending {
    list: Option<Vec<Evacuation>>,
    /// Segments already said to be stuck (said once per agent run, not every second).
    said: HashSet<u64>,
}

/// Hands the thread the control plane's latest list.
pub(super) fn start(shared: &Shared, list: Vec<Evacuation>) {
    lock(&shared.evacuations).list = Some(list);
    shared.evacuate_cv.notify_all();
}

/// The `agent-evacuate` thread: works through each list it is given until the agent stops.
pub(super) fn evacuate_loop(shared: &Shared) {
    while !shared.stop.load(Ordering::Acquire) {
        let list = {
            let mut p = lock(&shared.evacuations);
            match p.list.take() {
                Some(l) => l,
                None => {
                    let _ = shared
                        .evacuate_cv
                        .wait_timeout(p, Duration::from_millis(500))
                        .unwrap_or_else(|e| e.into_inner());
                    continue;
                }
            }
        };
        run(shared, list);
    }
}

/// Says once per segment why it cannot leave its brick now.
fn stuck(shared: &Shared, e: &Evacuation, why: &str) {
    if lock(&shared.evacuations).said.insert(e.segment_id) {
        eprintln!(
            "rackmem agent: segment {} of allocation {} on brick {} cannot move yet: {why}",
            e.segment_id, e.allocation, e.brick_id
        );
    }
}

fn run(shared: &Shared, list: Vec<Evacuation>) {
    // Process → the segments it must empty (a process with several goes in one order).
    let mut per_pid: BTreeMap<u32, Vec<rackmem_proto::EvacuateMove>> = BTreeMap::new();
    let mut released: HashSet<u64> = HashSet::new();
    // The list may predate releases made since (a process returns what it emptied): an
    // allocation nobody here holds is only stuck if the control plane still has it.
    let mut live: Option<HashSet<u64>> = None;
    let mut still_live = |id: u64| {
        let l = live.get_or_insert_with(|| {
            let node = shared.node.load(Ordering::Acquire);
            shared
                .client
                .node_allocations(node)
                .map(|v| v.iter().map(|a| a.id).collect())
                .unwrap_or_default()
        });
        l.contains(&id)
    };
    for e in &list {
        if released.contains(&e.allocation) {
            continue;
        }
        let pid = match super::pool::evacuate(shared, e.allocation) {
            Some(None) => {
                released.insert(e.allocation);
                continue;
            }
            Some(Some(pid)) => Some(pid),
            None => lock(&shared.holdings).holder_pid(e.allocation),
        };
        let Some(pid) = pid else {
            if !still_live(e.allocation) {
                continue;
            }
            stuck(
                shared,
                e,
                "no process of this agent run holds it (an agent that restarted cannot order the processes of the one before)",
            );
            continue;
        };
        let Some(to) = e.to_address.clone() else {
            stuck(
                shared,
                e,
                e.why.as_deref().unwrap_or("the control plane picked no brick for it"),
            );
            continue;
        };
        per_pid.entry(pid).or_default().push(rackmem_proto::EvacuateMove {
            segment_id: e.segment_id,
            to,
        });
    }
    for (pid, moves) in per_pid {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let n = moves.len();
        let r = super::orders::evacuate(shared, pid, moves);
        match (r.ok, r.error) {
            (true, _) => eprintln!(
                "rackmem agent: process {pid} moved {} of {n} segment(s) (a drain or a rebalance)",
                r.evacuated.map_or(0, |v| v.len())
            ),
            (false, Some(e)) => eprintln!(
                "rackmem agent: process {pid} did not empty the segments a drain or a rebalance moves: {}: {}; will ask again",
                e.code, e.message
            ),
            (false, None) => {}
        }
    }
}
