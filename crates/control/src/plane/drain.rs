//! Draining a brick (`rackmem ctl drain`): which segments of a node must leave a draining brick,
//! and where each goes. The control plane moves no pages itself: each node's agent learns its
//! share from the reply to its pool report (it polls every second with its node token, so the
//! control plane needs no way in to nodes and no credentials of theirs) and has the processes
//! using those segments move their pages and return them.

use super::placement::Placement;
use super::{ControlPlane, PlaneError};
use crate::api;

impl ControlPlane {
    /// The segments of `node`'s allocations that have one on a draining brick (all of them: an
    /// allocation goes back whole), each with a target picked as a
    /// new segment of its size would be placed now (an up brick that is not draining, with a
    /// free extent of its size and a path from the node with its bandwidth). Targets are
    /// picked independently: two segments may be sent to a brick with room for one, and the
    /// second grow is refused and picked again at the next report.
    pub(super) fn evacuations(&self, node: u64) -> Vec<api::Evacuation> {
        let Some(n) = self.nodes.get(&node) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let draining = |brick: u64| self.bricks.get(&brick).is_some_and(|b| b.rec.draining);
        // A named segment's holders attach by name on several nodes; no one agent can move it:
        // the control plane moves it itself (`moves.rs`).
        for a in n
            .allocations
            .iter()
            .filter_map(|id| self.allocations.get(id))
            .filter(|a| a.named.is_none())
        {
            if !a.segments.iter().any(|s| draining(s.brick_id)) {
                continue;
            }
            // An allocation is returned whole: its segments on other bricks move too (to the
            // brick a new segment would go to, which may be their own).
            for s in &a.segments {
                let mut e = api::Evacuation {
                    allocation: a.id,
                    segment_id: s.segment_id,
                    brick_id: s.brick_id,
                    size_bytes: s.size_bytes,
                    ..Default::default()
                };
                match self.evacuation_target(node, s.size_bytes, s.bandwidth_bps, a.links.as_deref()) {
                    Ok(id) => {
                        e.to_address = self.bricks.get(&id).map(|b| b.rec.address.clone());
                        e.to_brick_id = Some(id);
                    }
                    Err(why) => e.why = Some(why.to_string()),
                }
                out.push(e);
            }
        }
        out
    }

    /// Where a segment of `size` bytes leaving a draining brick would go for `node`.
    pub(super) fn evacuation_target(
        &self,
        node: u64,
        size: u64,
        bandwidth_bps: u64,
        links: Option<&[String]>,
    ) -> Result<u64, PlaneError> {
        let pl = Placement::new(node, size, 1, bandwidth_bps, links, None)?;
        let node_ports = self
            .nodes
            .get(&node)
            .map(|n| n.rec.ports.clone())
            .ok_or_else(|| PlaneError::NotFound(format!("node {node} is not registered")))?;
        self.choose(&pl, 0, &Default::default(), &node_ports).map(|(id, _)| id)
    }

    /// Refuses to drain brick `id` when its largest segment fits on no other brick: no up,
    /// undrained brick has a free extent of that size. Then nothing can move, and the operator
    /// is told so at once rather than after a timeout.
    pub(super) fn check_drain_possible(&self, id: u64) -> Result<(), PlaneError> {
        let Some(b) = self.bricks.get(&id) else {
            return Ok(());
        };
        let Some(&(_, largest)) = b.segments.values().max_by_key(|(_, size)| *size) else {
            return Ok(());
        };
        let room = self
            .bricks
            .values()
            .filter(|o| o.rec.id != id && o.up && !o.rec.draining)
            .map(|o| o.extents.largest())
            .max();
        match room {
            Some(r) if r >= largest => Ok(()),
            _ => Err(PlaneError::InsufficientCapacity(format!(
                "brick {} holds {} segment(s) (the largest {} bytes) and no other brick can take them: {}; \
                 nothing was changed (add or free a brick, then drain again)",
                b.rec.name,
                b.segments.len(),
                largest,
                match room {
                    None => "there is no other up brick that is not draining".to_string(),
                    Some(r) => format!("the largest free extent of the other bricks is {r} bytes"),
                }
            ))),
        }
    }
}
