//! Named segments (`/v1/segments`, issue 24): one-sided segments that processes on several
//! nodes open by name, so that their puts, gets and atomics meet in the same memory.
//!
//! A named segment is an allocation of one segment, made for the node whose process created
//! it (placed, reserved and counted against that node's quota like any allocation), with a
//! [`NamedRecord`] stored in it: the name, the user it belongs to, and its holders. Every open
//! adds a holder and returns a grant signed for the opener's node (a brick checks the grant,
//! not which node attaches); every close removes one, and the last close releases the
//! allocation, which its brick learns from its next heartbeat reply. The node agents close the
//! holds of processes that are gone, as they return their allocations.
//!
//! Named segments are not listed among allocations (`GET /v1/allocations`): an agent must
//! neither take one for its node's pool nor return it as an orphan.

use super::allocations::Allocated;
use super::attach::next_id;
use super::placement::Placement;
use super::{now_unix_ms, ControlPlane, PlaneError};
use crate::api;
use crate::grant;
use crate::store::{AllocationRecord, NamedRecord, Op, Record};

impl ControlPlane {
    /// `POST /v1/segments`: the named segment `req.name`, created with `req.size_bytes` if it
    /// does not exist ([`Allocated::Created`]) or opened ([`Allocated::Replayed`]), held by
    /// `req.holder` from now on, with a grant for `req.node` in `segment`. Idempotent: a holder
    /// that opens the name again is held once.
    pub fn open_named(&mut self, req: api::SegmentOpen) -> Result<(api::NamedSegment, Allocated), PlaneError> {
        if !api::valid_token(&req.name) {
            return Err(PlaneError::Invalid(format!(
                "a segment name is 1 to {} characters of A-Z a-z 0-9 - _ . : (got {:?})",
                api::MAX_IDEMPOTENCY_KEY_LEN,
                req.name.chars().take(40).collect::<String>()
            )));
        }
        if !api::valid_token(&req.holder.agent) {
            return Err(PlaneError::Invalid(format!(
                "holder.agent must be 1 to {} characters of A-Z a-z 0-9 - _ . :",
                api::MAX_IDEMPOTENCY_KEY_LEN
            )));
        }
        if !self.nodes.contains_key(&req.node) {
            return Err(PlaneError::NotFound(format!("node {} is not registered", req.node)));
        }
        let hold = api::NamedHolder {
            node: req.node,
            holder: req.holder.clone(),
        };
        if let Some(&id) = self.names.get(&req.name) {
            let Some(cur) = self.allocations.get(&id).cloned() else {
                return Err(PlaneError::NotFound(format!("segment {:?} is gone", req.name)));
            };
            let Some(named) = &cur.named else {
                return Err(PlaneError::NotFound(format!("segment {:?} is gone", req.name)));
            };
            if named.uid != req.holder.uid {
                return Err(PlaneError::Forbidden(format!(
                    "segment {:?} belongs to uid {}; uid {} may not open it (a name belongs to the user \
                     who created it)",
                    req.name, named.uid, req.holder.uid
                )));
            }
            let size: u64 = cur.segments.iter().map(|s| s.size_bytes).sum();
            if req.size_bytes > size {
                return Err(PlaneError::Conflict(format!(
                    "segment {:?} exists with {size} bytes, fewer than the {} asked for",
                    req.name, req.size_bytes
                )));
            }
            let mut rec = cur;
            if let Some(n) = rec.named.as_mut() {
                if !n.holders.iter().any(|h| same_holder(h, &hold)) {
                    if n.holders.len() >= api::MAX_NAMED_HOLDERS {
                        return Err(PlaneError::Conflict(format!(
                            "segment {:?} has {} holders already, the most it may have",
                            req.name,
                            api::MAX_NAMED_HOLDERS
                        )));
                    }
                    n.holders.push(hold);
                    self.store.commit(&[Op::Put(Record::Allocation(rec.clone()))])?;
                }
            }
            self.keep(rec.clone());
            return Ok((self.named_view(&rec, Some(req.node))?, Allocated::Replayed));
        }
        if req.size_bytes == 0 {
            return Err(PlaneError::NotFound(format!(
                "no segment is named {:?} (give a size to create it)",
                req.name
            )));
        }
        let mut pl = Placement::new(req.node, req.size_bytes, 1, 0, None, None)?;
        pl.objective = self.placement;
        let usable = self.largest_usable_bytes();
        if pl.per_segment > usable {
            return Err(PlaneError::InsufficientCapacity(format!(
                "segment {:?} would need {} bytes; the largest brick lends {usable}",
                req.name, pl.per_segment
            )));
        }
        self.check_quota(req.node, req.size_bytes)?;
        let mut counters = self.counters;
        let id = next_id(&mut counters.next_allocation);
        let named = NamedRecord {
            name: req.name.clone(),
            uid: req.holder.uid,
            holders: vec![hold],
        };
        self.place_allocation(&pl, counters, |segments| AllocationRecord {
            id,
            node: req.node,
            size_bytes: req.size_bytes,
            stripe: 1,
            bandwidth_bps: 0,
            links: None,
            segments,
            created_unix_ms: now_unix_ms(),
            idempotency_key: None,
            request_sha256: None,
            holder: None,
            circuit: false,
            named: Some(Box::new(named)),
        })?;
        let rec = self
            .allocations
            .get(&id)
            .cloned()
            .ok_or_else(|| PlaneError::NotFound(format!("segment {:?} is gone", req.name)))?;
        Ok((self.named_view(&rec, Some(req.node))?, Allocated::Created))
    }

    /// `POST /v1/segments/{name}/close`: `holder` of `node` holds segment `name` no more; the
    /// last holder's close releases it.
    pub fn close_named(&mut self, name: &str, node: u64, holder: &api::Holder) -> Result<api::NamedClosed, PlaneError> {
        let not_held = || PlaneError::NotFound(format!("segment {name:?} is not held by that process of node {node}"));
        let id = *self
            .names
            .get(name)
            .ok_or_else(|| PlaneError::NotFound(format!("no segment is named {name:?}")))?;
        let mut rec = self.allocations.get(&id).cloned().ok_or_else(not_held)?;
        let hold = api::NamedHolder {
            node,
            holder: holder.clone(),
        };
        let left = {
            let n = rec.named.as_mut().ok_or_else(not_held)?;
            let before = n.holders.len();
            n.holders.retain(|h| !same_holder(h, &hold));
            if n.holders.len() == before {
                return Err(not_held());
            }
            n.holders.len() as u64
        };
        if left == 0 {
            self.free(id)?;
            return Ok(api::NamedClosed {
                name: name.to_string(),
                holders: 0,
                released: true,
            });
        }
        self.store.commit(&[Op::Put(Record::Allocation(rec.clone()))])?;
        self.keep(rec);
        Ok(api::NamedClosed {
            name: name.to_string(),
            holders: left,
            released: false,
        })
    }

    /// `GET /v1/segments`: every named segment, or those node `node` created or holds.
    pub fn named_segments(&self, node: Option<u64>) -> Vec<api::NamedSegment> {
        self.names
            .values()
            .filter_map(|id| self.allocations.get(id))
            .filter(|a| {
                node.is_none_or(|n| {
                    a.node == n || a.named.as_ref().is_some_and(|r| r.holders.iter().any(|h| h.node == n))
                })
            })
            .filter_map(|a| self.named_view(a, None).ok())
            .collect()
    }

    /// What the API shows of named segment `rec`; with `for_node`, its segment with a grant
    /// signed for that node.
    fn named_view(&self, rec: &AllocationRecord, for_node: Option<u64>) -> Result<api::NamedSegment, PlaneError> {
        let named = rec
            .named
            .as_ref()
            .ok_or_else(|| PlaneError::NotFound(format!("allocation {} is not a named segment", rec.id)))?;
        let segment = match for_node {
            None => None,
            Some(node) => {
                let mut view = self.allocation(rec.id)?;
                let mut s = view
                    .segments
                    .pop()
                    .ok_or_else(|| PlaneError::NotFound(format!("segment {:?} has no memory", named.name)))?;
                // Signed now for the opener's node: the stored grant names the creator and
                // may have expired while the segment lived (nobody renews a named segment's
                // grants; an attached link keeps working, a new ATTACH needs a fresh one).
                let b = self
                    .bricks
                    .get(&s.brick_id)
                    .ok_or_else(|| PlaneError::NotFound(format!("brick {} of segment {:?}", s.brick_id, named.name)))?;
                let issued = grant::issue(
                    &b.key,
                    s.segment_id,
                    s.offset,
                    s.size_bytes,
                    node,
                    self.grant_expiry(),
                    s.rate_limit_bps,
                );
                s.grant_hex = issued.grant_hex;
                s.session_key_hex = issued.session_key_hex;
                s.grant_expires_unix_s = super::leases::grant_expiry_of(&s.grant_hex);
                Some(s)
            }
        };
        Ok(api::NamedSegment {
            name: named.name.clone(),
            uid: named.uid,
            allocation: rec.id,
            node: rec.node,
            size_bytes: rec.segments.iter().map(|s| s.size_bytes).sum(),
            created_unix_ms: rec.created_unix_ms,
            holders: named.holders.clone(),
            segment,
        })
    }
}

/// One process's hold: its node, agent run and connection (pid and start time follow from them).
fn same_holder(a: &api::NamedHolder, b: &api::NamedHolder) -> bool {
    a.node == b.node && a.holder.agent == b.holder.agent && a.holder.connection == b.holder.connection
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plane::tests::{brick, node, plane, M};

    fn holder(agent: &str, connection: u64, uid: u32) -> api::Holder {
        api::Holder {
            agent: agent.into(),
            connection,
            pid: 100 + connection as u32,
            uid,
            start_ticks: 1,
        }
    }

    fn open(
        p: &mut ControlPlane,
        node: u64,
        name: &str,
        size: u64,
        h: &api::Holder,
    ) -> Result<(api::NamedSegment, Allocated), PlaneError> {
        p.open_named(api::SegmentOpen {
            node,
            name: name.into(),
            size_bytes: size,
            holder: h.clone(),
        })
    }

    #[test]
    fn named_segments_are_shared_owned_and_released_by_the_last_close() {
        let mut p = plane();
        brick(&mut p, "b1", 64 * M);
        let (n1, n2) = (node(&mut p, "n1"), node(&mut p, "n2"));
        let (a, b) = (holder("agent-a", 1, 1000), holder("agent-b", 7, 1000));
        assert!(
            matches!(open(&mut p, n1, "counter", 0, &a), Err(PlaneError::NotFound(_))),
            "ENOENT"
        );
        let (s1, how) = open(&mut p, n1, "counter", 3 * M, &a).unwrap();
        assert_eq!(how, Allocated::Created);
        assert_eq!((s1.node, s1.uid, s1.size_bytes), (n1, 1000, 3 * M));
        // Another node opens it: the same segment, a grant of its own.
        let (s2, how) = open(&mut p, n2, "counter", 0, &b).unwrap();
        assert_eq!(how, Allocated::Replayed);
        let (g1, g2) = (s1.segment.clone().unwrap(), s2.segment.clone().unwrap());
        assert_eq!((g1.segment_id, g1.offset), (g2.segment_id, g2.offset));
        assert_ne!(g1.grant_hex, g2.grant_hex);
        let g = rackmem_proto::Grant::decode(&hex::decode(&g2.grant_hex).unwrap()).unwrap();
        assert_eq!(g.node, n2);
        // Idempotent: the same holder again is held once.
        open(&mut p, n2, "counter", M, &b).unwrap();
        assert_eq!(p.named_segments(None)[0].holders.len(), 2);
        assert!(
            matches!(open(&mut p, n2, "counter", 4 * M, &b), Err(PlaneError::Conflict(_))),
            "EEXIST"
        );
        let other = holder("agent-b", 8, 1001);
        assert!(
            matches!(open(&mut p, n2, "counter", 0, &other), Err(PlaneError::Forbidden(_))),
            "EACCES"
        );
        assert!(matches!(
            open(&mut p, n2, "bad name", M, &b),
            Err(PlaneError::Invalid(_))
        ));
        // Counted to the creator; not an allocation any agent lists.
        assert_eq!(p.node(n1).unwrap().allocated_bytes, 3 * M);
        assert!(p.allocations(Some(n1)).is_empty());
        assert_eq!(p.named_segments(Some(n2)).len(), 1);
        // Closes: a stranger's is refused; the last one releases the memory.
        assert!(matches!(p.close_named("counter", n1, &b), Err(PlaneError::NotFound(_))));
        let c = p.close_named("counter", n1, &a).unwrap();
        assert_eq!((c.holders, c.released), (1, false));
        let c = p.close_named("counter", n2, &b).unwrap();
        assert_eq!((c.holders, c.released), (0, true));
        assert!(p.named_segments(None).is_empty());
        assert_eq!(p.node(n1).unwrap().allocated_bytes, 0);
        assert!(p.heartbeat(1, None).unwrap().segments.is_empty());
        // The name is free again, for any user.
        let (s3, how) = open(&mut p, n2, "counter", M, &other).unwrap();
        assert_eq!((how, s3.uid), (Allocated::Created, 1001));
    }

    /// A drain lists named segments to no agent (their holders on several nodes attach by
    /// name): the control plane moves them itself (`moves.rs`), and the brick's view names
    /// them, which `rackmem ctl drain` shows the operator.
    #[test]
    fn a_draining_brick_names_its_named_segments_and_moves_them_itself() {
        let mut p = plane();
        let b1 = brick(&mut p, "b1", 64 * M);
        let n1 = node(&mut p, "n1");
        let a = holder("agent-a", 1, 1000);
        open(&mut p, n1, "zeta", M, &a).unwrap();
        open(&mut p, n1, "alpha", M, &a).unwrap();
        // A brick with room, or the drain is refused.
        brick(&mut p, "b2", 64 * M);
        let v = p.set_draining(b1, true).unwrap();
        assert_eq!(v.named_segments, vec!["alpha".to_string(), "zeta".to_string()]);
        assert!(!v.drained && v.draining);
        assert!(
            p.evacuations(n1).is_empty(),
            "an agent was asked to move a named segment"
        );
        assert_eq!(p.heartbeat(b1, None).unwrap().frozen.len(), 2, "both start moving");
        assert_eq!(p.brick(b1).unwrap().named_moving.len(), 2);
        // Closed while they move: the brick is drained once the moves end.
        p.close_named("alpha", n1, &a).unwrap();
        p.close_named("zeta", n1, &a).unwrap();
        p.end_overdue_moves(std::time::Instant::now() + super::super::NAMED_MOVE_DEADLINE);
        let v = p.brick(b1).unwrap();
        assert!(v.named_segments.is_empty() && v.drained, "{v:?}");
        assert!(v.named_waiting.is_empty(), "{v:?}");
    }
}
