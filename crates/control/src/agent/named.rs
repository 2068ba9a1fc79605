//! Named segments for the node's processes (`segment` with a name; issue 24): a connection's
//! holds, the close of each when the process releases it or its connection closes, and the
//! reconciliation that closes the holds nobody on this node has any more (a close the control
//! plane missed, or the holds of an earlier agent run's processes that are gone).
//!
//! A process that opens one name several times holds it once at the control plane (the hold is
//! this connection's): the agent counts the opens, and closes at the control plane on the last
//! release.

use super::node::for_node;
use super::reconcile::process_start_ticks;
use super::{lock, Shared};
use crate::api::{Holder, NamedSegment, SegmentClose};
use crate::client::ClientError;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

/// One connection's hold of a named segment.
#[derive(Debug, Clone)]
pub(super) struct Hold {
    /// The name.
    pub(super) name: String,
    /// Its size, counted to the process's and user's quotas while held.
    pub(super) bytes: u64,
    /// Opens not released yet.
    pub(super) opens: u32,
}

/// Closes the hold of `holder` (a connection of this run) on segment `name` at the control
/// plane; a hold already gone is no error.
pub(super) fn close(shared: &Shared, name: &str, holder: &Holder) -> Result<(), ClientError> {
    let req = |node| SegmentClose {
        node,
        holder: holder.clone(),
    };
    match for_node(shared, |node| shared.client.close_segment(name, &req(node))) {
        Ok(_) | Err(ClientError::Server { status: 404, .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The holds of this node in `list` that nobody has any more: of this run, when no connection
/// holds the name (`held`: (name, connection)) and the connection has no open in flight; of an
/// earlier run, once the process is gone (`alive(pid, start_ticks)` false).
pub(super) fn lapsed(
    list: &[NamedSegment],
    node: u64,
    run: &str,
    held: &HashSet<(String, u64)>,
    in_flight: &HashSet<u64>,
    alive: impl Fn(u32, u64) -> bool,
) -> Vec<(String, Holder)> {
    let mut out = Vec::new();
    for s in list {
        for h in s.holders.iter().filter(|h| h.node == node) {
            let gone = if h.holder.agent == run {
                !held.contains(&(s.name.clone(), h.holder.connection)) && !in_flight.contains(&h.holder.connection)
            } else {
                !alive(h.holder.pid, h.holder.start_ticks)
            };
            if gone {
                out.push((s.name.clone(), h.holder.clone()));
            }
        }
    }
    out
}

/// Closes the holds of this node nobody has any more (see [`lapsed`]); returns how many.
pub(super) fn reconcile(shared: &Shared) -> Result<usize, ClientError> {
    let node = shared.node.load(Ordering::Acquire);
    if node == 0 {
        return Ok(0);
    }
    let list = shared.client.named_segments(Some(node))?;
    let (held, in_flight) = lock(&shared.holdings).named_and_in_flight();
    let alive = |pid, start| process_start_ticks(pid) == Some(start);
    let gone = lapsed(&list, node, &shared.run, &held, &in_flight, alive);
    for (name, holder) in &gone {
        match close(shared, name, holder) {
            Ok(()) => eprintln!(
                "rackmem agent: closed segment {name:?} for pid {}: it holds it no more",
                holder.pid
            ),
            Err(e) => eprintln!(
                "rackmem agent: closing segment {name:?} for pid {}: {e}; will retry",
                holder.pid
            ),
        }
    }
    Ok(gone.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::NamedHolder;

    fn seg(name: &str, holders: &[(u64, &str, u64, u32)]) -> NamedSegment {
        NamedSegment {
            name: name.into(),
            uid: 0,
            allocation: 1,
            node: 1,
            size_bytes: 1 << 20,
            created_unix_ms: 0,
            holders: holders
                .iter()
                .map(|&(node, agent, connection, pid)| NamedHolder {
                    node,
                    holder: Holder {
                        agent: agent.into(),
                        connection,
                        pid,
                        uid: 0,
                        start_ticks: 7,
                    },
                })
                .collect(),
            segment: None,
        }
    }

    #[test]
    fn lapsed_holds_are_this_nodes_unheld_or_dead_ones() {
        let list = [
            seg("a", &[(1, "me", 1, 10), (1, "me", 2, 11), (2, "me", 3, 12)]),
            seg("b", &[(1, "old", 9, 200), (1, "old", 9, 300), (1, "me", 4, 13)]),
        ];
        let held = HashSet::from([("a".to_string(), 1)]);
        let in_flight = HashSet::from([4]);
        let alive = |pid, start| pid == 200 && start == 7;
        let got: Vec<(String, u32)> = lapsed(&list, 1, "me", &held, &in_flight, alive)
            .into_iter()
            .map(|(n, h)| (n, h.pid))
            .collect();
        // a/2: unheld; node 2's hold is its own agent's; b/300: dead; b/4: an open in flight.
        assert_eq!(got, vec![("a".to_string(), 11), ("b".to_string(), 300)]);
    }
}
