//! Copy-on-write clones for the forked children of the node's processes (`fork` on managed
//! memory). Before a `fork` the runtime asks `clone` for the segments it holds: the agent has
//! the control plane place a clone of each (a new allocation, on the same bricks, quota-checked
//! like any) and keeps the clones *pending*, for nobody's connection, with a random ticket that
//! only the process's memory holds. The child says `adopt` with that ticket from its own
//! connection: the agent checks that it is the asking process's child (or that the parent is
//! gone: a daemonizing parent may exit before its child adopts) of the same user, and the
//! clones become the child's connection's, returned when it closes like anything it holds.
//! A pending clone nobody adopts within [`ADOPT_WITHIN`] (the fork failed, the child was a raw
//! `clone()`) is returned by the agent's background thread.

use super::{lock, Shared};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a clone waits for the child to adopt it. A child adopts in its `fork` hook, before
/// the program's code runs again: this bounds only clones whose child never comes.
pub(super) const ADOPT_WITHIN: Duration = Duration::from_secs(30);

/// Most clones (allocations) one process may have pending at once: a program forking in a
/// loop faster than its children start cannot pile up memory without bound.
pub(super) const MAX_PENDING_PER_PROCESS: usize = 64;

/// Most source allocations one `clone` names.
pub(super) const MAX_SOURCES: usize = 256;

/// A clone waiting for its child.
pub(super) struct Pending {
    /// The process that asked, and its user.
    pub(super) parent_pid: u32,
    pub(super) uid: u32,
    /// What the child presents.
    pub(super) ticket: [u8; 32],
    pub(super) bytes: u64,
    pub(super) deadline: Instant,
}

/// The clones waiting for their children, by allocation id.
#[derive(Default)]
pub(super) struct Clones {
    pub(super) pending: HashMap<u64, Pending>,
}

impl Clones {
    /// Clones `pid` asked for that wait for a child.
    pub(super) fn pending_of(&self, pid: u32) -> usize {
        self.pending.values().filter(|p| p.parent_pid == pid).count()
    }
}

/// A fresh ticket.
pub(super) fn new_ticket() -> Result<[u8; 32], String> {
    let mut t = [0u8; 32];
    getrandom::fill(&mut t).map_err(|e| format!("no randomness for a clone ticket: {e}"))?;
    Ok(t)
}

/// The parent of process `pid` (field 4 of `/proc/PID/stat`), if it runs.
pub(super) fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Returns the clones whose child did not adopt them in time.
pub(super) fn expire(shared: &Shared) {
    let now = Instant::now();
    let gone: Vec<(u64, Pending)> = {
        let mut c = lock(&shared.clones);
        let ids: Vec<u64> = c
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(&id, _)| id)
            .collect();
        ids.into_iter()
            .filter_map(|id| c.pending.remove(&id).map(|p| (id, p)))
            .collect()
    };
    for (id, p) in gone {
        lock(&shared.holdings).release(id, p.uid, 0, p.bytes);
        shared.counters.allocations.fetch_sub(1, Ordering::Relaxed);
        shared.counters.bytes.fetch_sub(p.bytes, Ordering::Relaxed);
        eprintln!(
            "rackmem agent: returning clone {id}: the child of pid {} did not adopt it within {:?}",
            p.parent_pid, ADOPT_WITHIN
        );
        match shared.client.free(id) {
            Ok(_) | Err(crate::client::ClientError::Server { status: 404, .. }) => {}
            Err(_) => lock(&shared.pending_releases).push(id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_of_this_process_is_known_and_none_of_no_process() {
        let me = std::process::id();
        let parent = parent_of(me).expect("this process runs");
        assert_ne!(parent, me);
        assert_eq!(parent_of(u32::MAX), None);
    }
}
