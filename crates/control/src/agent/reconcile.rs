//! Reconciliation: the agent's background thread retries the releases the control plane did
//! not take, and at start and every reconcile interval releases the allocations of this node
//! that an agent made and nobody holds ([`orphans`]), renewing the leases of the others.

use super::leases::renew_leases;
use super::{lock, Shared};
use crate::api::Allocation;
use crate::client::ClientError;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Releases allocations of closed connections that the control plane refused or missed, and
/// reconciles at start and every `reconcile_interval`.
pub(super) fn release_loop(shared: &Shared) {
    let mut next_reconcile = Instant::now();
    while !shared.stop.load(Ordering::Acquire) {
        if Instant::now() >= next_reconcile {
            if let Err(e) = reconcile(shared) {
                eprintln!("rackmem agent: cannot reconcile with the control plane: {e}; will retry");
            }
            if let Err(e) = super::named::reconcile(shared) {
                eprintln!("rackmem agent: cannot reconcile named segments with the control plane: {e}; will retry");
            }
            next_reconcile = Instant::now() + shared.cfg.reconcile_interval;
        }
        std::thread::sleep(Duration::from_millis(500).min(shared.cfg.reconcile_interval));
        super::report::forward(shared);
        super::clones::expire(shared);
        let pending: Vec<u64> = std::mem::take(&mut *lock(&shared.pending_releases));
        let mut again = Vec::new();
        for id in pending {
            match shared.client.free(id) {
                Ok(_) | Err(ClientError::Server { status: 404, .. }) => {}
                Err(_) => again.push(id),
            }
        }
        lock(&shared.pending_releases).extend(again);
    }
}

/// The start time of process `pid` (field 22 of `/proc/PID/stat`, clock ticks since boot), or
/// `None` when there is no such process or it has exited (a zombie its parent has not reaped
/// yet uses no memory any more).
pub fn process_start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces or ')': fields resume
    // after the last ')'. The state is the first field after it, the start time the 20th.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    if matches!(fields.next(), Some("Z" | "X" | "x")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Which of `allocations` (this node's) nobody holds, given this run's name (`run`), what this
/// run's connections hold or are asking for (`held`, `in_flight`), and whether a process still
/// lives (`alive(pid, start_ticks)`):
/// - an allocation without a holder was made by hand: never an orphan;
/// - one made by this run is an orphan when no connection holds it and its connection has no
///   grow in flight (a grow whose reply was lost, or a release the process never got to make);
/// - one made by an earlier run (the agent restarted while programs kept running on the
///   segments they attached) is an orphan only once its process is gone, or its pid belongs to
///   a later process.
pub fn orphans(
    allocations: &[Allocation],
    run: &str,
    held: &HashSet<u64>,
    in_flight: &HashSet<u64>,
    alive: impl Fn(u32, u64) -> bool,
) -> Vec<u64> {
    allocations
        .iter()
        .filter(|a| match &a.holder {
            None => false,
            Some(h) if h.agent == run => !held.contains(&a.id) && !in_flight.contains(&h.connection),
            Some(h) => !alive(h.pid, h.start_ticks),
        })
        .map(|a| a.id)
        .collect()
}

/// Releases now the allocations of this node nobody holds (see [`orphans`]) and renews the
/// grants of those processes hold; returns the ids released (or handed to the retries).
pub(super) fn reconcile(shared: &Shared) -> Result<Vec<u64>, ClientError> {
    let node = shared.node.load(Ordering::Acquire);
    if node == 0 {
        return Ok(Vec::new());
    }
    let list = shared.client.node_allocations(node)?;
    let (held, in_flight) = lock(&shared.holdings).held_and_in_flight();
    let alive = |pid, start| process_start_ticks(pid) == Some(start);
    let ids = orphans(&list, &shared.run, &held, &in_flight, alive);
    renew_leases(shared, &list, &ids);
    for id in &ids {
        match shared.client.free(*id) {
            Ok(_) | Err(ClientError::Server { status: 404, .. }) => {
                shared.counters.reclaimed.fetch_add(1, Ordering::Relaxed);
                eprintln!("rackmem agent: released allocation {id}: nobody holds it");
            }
            Err(e) => {
                eprintln!("rackmem agent: releasing orphan allocation {id}: {e}; will retry");
                lock(&shared.pending_releases).push(*id);
            }
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Holder;

    #[test]
    fn start_ticks_of_this_process_and_of_none() {
        let mine = process_start_ticks(std::process::id()).expect("this process runs");
        assert_eq!(process_start_ticks(std::process::id()), Some(mine), "stable");
        assert_eq!(process_start_ticks(u32::MAX), None);
    }

    fn alloc(id: u64, holder: Option<(&str, u64, u32)>) -> Allocation {
        Allocation {
            id,
            node: 1,
            size_bytes: 1 << 20,
            stripe: 1,
            bandwidth_bps: 0,
            segments: Vec::new(),
            created_unix_ms: 0,
            idempotency_key: None,
            circuit: false,
            holder: holder.map(|(agent, connection, pid)| Holder {
                agent: agent.into(),
                connection,
                pid,
                uid: 0,
                start_ticks: 7,
            }),
        }
    }

    #[test]
    fn orphans_are_unheld_allocations_of_this_run_or_of_dead_processes() {
        let list = [
            alloc(1, None),                  // by hand
            alloc(2, Some(("me", 1, 100))),  // held
            alloc(3, Some(("me", 2, 100))),  // grow in flight on connection 2
            alloc(4, Some(("me", 3, 100))),  // nobody: a lost reply
            alloc(5, Some(("old", 9, 200))), // earlier run, process alive
            alloc(6, Some(("old", 9, 300))), // earlier run, process gone
        ];
        let held = HashSet::from([2]);
        let in_flight = HashSet::from([2]);
        let alive = |pid, start| pid == 200 && start == 7;
        assert_eq!(orphans(&list, "me", &held, &in_flight, alive), vec![4, 6]);
    }
}
