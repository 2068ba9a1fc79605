//! Allocations: requests checked (idempotency keys, holders, stripes, named bricks), placed
//! (see `placement`), resized, renewed and released, and shown as the REST API shows them.

use super::attach::next_id;
use super::leases::grant_expiry_of;
use super::placement::Placement;
use super::{now_unix_ms, ControlPlane, PlaneError};
use crate::api;
use crate::store::{AllocationRecord, Key, Op, Record};
use std::collections::HashSet;

/// Most bricks one allocation may be striped over.
pub const MAX_STRIPE: u32 = 1024;

/// Whether [`ControlPlane::allocate_once`] made the allocation or found it by its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocated {
    /// A new allocation (201).
    Created,
    /// The live allocation an earlier request with the same idempotency key made (200).
    Replayed,
}

/// SHA-256 (hex) of an allocation request without its idempotency key: what a retry must
/// repeat exactly.
fn request_digest(req: &api::AllocationRequest) -> String {
    use sha2::Digest;
    let bare = api::AllocationRequest {
        idempotency_key: None,
        ..req.clone()
    };
    // Plain fields only: serialization cannot fail, and its field order is fixed.
    let body = serde_json::to_vec(&bare).unwrap_or_default();
    hex::encode(sha2::Sha256::digest(&body))
}

impl ControlPlane {
    /// The most one brick lends to a segment (0 with no brick): a segment larger than this
    /// fits nowhere.
    pub(crate) fn largest_usable_bytes(&self) -> u64 {
        self.bricks
            .values()
            .map(|b| b.extents.usable_bytes())
            .max()
            .unwrap_or(0)
    }

    /// `POST /v1/allocations`: [`ControlPlane::allocate_once`] without saying whether the
    /// allocation is new.
    pub fn allocate(&mut self, req: api::AllocationRequest) -> Result<api::Allocation, PlaneError> {
        self.allocate_once(req).map(|(a, _)| a)
    }

    /// `POST /v1/allocations`: a new allocation ([`Allocated::Created`]), or, for a request whose
    /// idempotency key already made a live allocation, that one ([`Allocated::Replayed`]).
    pub fn allocate_once(&mut self, req: api::AllocationRequest) -> Result<(api::Allocation, Allocated), PlaneError> {
        let request_sha256 = match &req.idempotency_key {
            None => None,
            Some(key) => {
                if !api::valid_token(key) {
                    return Err(PlaneError::Invalid(format!(
                        "idempotency_key must be 1 to {} characters of A-Z a-z 0-9 - _ . : (got {} bytes)",
                        api::MAX_IDEMPOTENCY_KEY_LEN,
                        key.len()
                    )));
                }
                let sha = request_digest(&req);
                if let Some(done) = self.replayed(req.node, key, &sha)? {
                    return Ok((done, Allocated::Replayed));
                }
                Some(sha)
            }
        };
        check_holder(req.holder.as_ref())?;
        if !self.nodes.contains_key(&req.node) {
            return Err(PlaneError::NotFound(format!("node {} is not registered", req.node)));
        }
        if req.size_bytes == 0 {
            return Err(PlaneError::Invalid("size_bytes must be positive".to_string()));
        }
        let stripe = match (&req.bricks, req.stripe) {
            (Some(b), Some(s)) if b.len() != s as usize => {
                return Err(PlaneError::Invalid(format!(
                    "stripe {s} but {} bricks named: give one or make them agree",
                    b.len()
                )))
            }
            (Some(b), _) => u32::try_from(b.len()).unwrap_or(u32::MAX),
            (None, s) => s.unwrap_or(1),
        };
        if stripe == 0 || stripe > MAX_STRIPE {
            return Err(PlaneError::Invalid(format!(
                "stripe must be 1 to {MAX_STRIPE}, not {stripe}"
            )));
        }
        if let Some(list) = &req.bricks {
            let distinct: HashSet<&u64> = list.iter().collect();
            if distinct.len() != list.len() {
                return Err(PlaneError::Invalid("a brick is named twice in `bricks`".to_string()));
            }
            for id in list {
                if !self.bricks.contains_key(id) {
                    return Err(PlaneError::NotFound(format!("brick {id} is not registered")));
                }
            }
        }
        let bandwidth_bps = req.bandwidth_bps.unwrap_or(0);
        let mut pl = Placement::new(
            req.node,
            req.size_bytes,
            stripe,
            bandwidth_bps,
            req.links.as_deref(),
            req.bricks.as_deref(),
        )?;
        pl.objective = req.placement.unwrap_or(self.placement);
        let circuit = req.circuit.unwrap_or(false);
        let per_segment = pl.per_segment;
        let usable = self.largest_usable_bytes();
        if per_segment > usable {
            return Err(PlaneError::InsufficientCapacity(format!(
                "each of the {stripe} segments would need {per_segment} bytes; the largest brick lends {usable}"
            )));
        }
        // After the checks of what the rack can ever lend: a request no brick could hold is
        // told so, not that it is over the node's quota.
        self.check_quota(req.node, req.size_bytes)?;
        // The allocation counter moves with the same batch as the segments.
        let mut counters = self.counters;
        let id = next_id(&mut counters.next_allocation);
        pl.circuit = circuit.then_some(id);
        let view = self.place_allocation(&pl, counters, |segments| AllocationRecord {
            id,
            node: req.node,
            size_bytes: req.size_bytes,
            stripe,
            bandwidth_bps,
            links: req.links.clone(),
            segments,
            created_unix_ms: now_unix_ms(),
            idempotency_key: req.idempotency_key.clone(),
            request_sha256,
            holder: req.holder.clone(),
            circuit,
            named: None,
        })?;
        Ok((view, Allocated::Created))
    }

    /// `POST /v1/allocations/{id}/clone`: a new allocation of `id`'s node with one segment per
    /// segment of `id` the request names (all by default), on that segment's brick, of its size
    /// and bandwidth, in the order named: what a forked child's copy-on-write clones need
    /// (each brick shares the source's pages with the clone when the node asks it with
    /// CLONE_INTO). Quota-checked and accounted like any allocation; refused whole when one
    /// brick is full, down or draining.
    pub fn clone_allocation(
        &mut self,
        id: u64,
        req: api::CloneRequest,
    ) -> Result<(api::Allocation, Allocated), PlaneError> {
        let src = self
            .allocations
            .get(&id)
            .cloned()
            .ok_or_else(|| PlaneError::NotFound(format!("allocation {id} does not exist")))?;
        let request_sha256 = match &req.idempotency_key {
            None => None,
            Some(key) => {
                if !api::valid_token(key) {
                    return Err(PlaneError::Invalid(format!(
                        "idempotency_key must be 1 to {} characters of A-Z a-z 0-9 - _ . :",
                        api::MAX_IDEMPOTENCY_KEY_LEN
                    )));
                }
                use sha2::Digest;
                let bare = api::CloneRequest {
                    idempotency_key: None,
                    ..req.clone()
                };
                let body = serde_json::to_vec(&(id, &bare)).unwrap_or_default();
                let sha = format!("clone:{}", hex::encode(sha2::Sha256::digest(&body)));
                if let Some(done) = self.replayed(src.node, key, &sha)? {
                    return Ok((done, Allocated::Replayed));
                }
                Some(sha)
            }
        };
        check_holder(req.holder.as_ref())?;
        let sources: Vec<crate::store::SegmentRecord> = match &req.segments {
            None => src.segments.clone(),
            Some(ids) => {
                if ids.is_empty() || ids.len() > api::MAX_CLONE_SEGMENTS {
                    return Err(PlaneError::Invalid(format!(
                        "a clone names 1 to {} segments, not {}",
                        api::MAX_CLONE_SEGMENTS,
                        ids.len()
                    )));
                }
                if ids.iter().collect::<HashSet<_>>().len() != ids.len() {
                    return Err(PlaneError::Invalid(
                        "a segment is named twice in `segments`".to_string(),
                    ));
                }
                ids.iter()
                    .map(|s| {
                        src.segments
                            .iter()
                            .find(|r| r.segment_id == *s)
                            .cloned()
                            .ok_or_else(|| PlaneError::NotFound(format!("segment {s} is not of allocation {id}")))
                    })
                    .collect::<Result<_, _>>()?
            }
        };
        let size_bytes: u64 = sources.iter().map(|s| s.size_bytes).sum();
        self.check_quota(src.node, size_bytes)?;
        let bricks: Vec<[u64; 1]> = sources.iter().map(|s| [s.brick_id]).collect();
        let pls = sources
            .iter()
            .zip(&bricks)
            .map(|(s, b)| {
                let mut pl = Placement::new(src.node, s.size_bytes, 1, s.bandwidth_bps, None, Some(b))?;
                pl.objective = self.placement;
                Ok(pl)
            })
            .collect::<Result<Vec<_>, PlaneError>>()?;
        let mut counters = self.counters;
        let clone_id = next_id(&mut counters.next_allocation);
        let view = self.place_allocation_of(&pls, counters, |segments| AllocationRecord {
            id: clone_id,
            node: src.node,
            size_bytes,
            stripe: 1,
            bandwidth_bps: 0,
            links: None,
            segments,
            created_unix_ms: now_unix_ms(),
            idempotency_key: req.idempotency_key.clone(),
            request_sha256,
            holder: req.holder.clone(),
            circuit: false,
            named: None,
        })?;
        Ok((view, Allocated::Created))
    }

    /// `PATCH /v1/allocations/{id}`.
    pub fn resize(&mut self, id: u64, size_bytes: u64) -> Result<api::Allocation, PlaneError> {
        let cur = self
            .allocations
            .get(&id)
            .cloned()
            .ok_or_else(|| PlaneError::NotFound(format!("allocation {id} does not exist")))?;
        if size_bytes == 0 {
            return Err(PlaneError::Invalid(
                "size_bytes must be positive (DELETE the allocation to release it)".to_string(),
            ));
        }
        if let Some(n) = &cur.named {
            return Err(PlaneError::Conflict(format!(
                "allocation {id} is named segment {:?}, whose size is fixed at its creation",
                n.name
            )));
        }
        let covered: u64 = cur.segments.iter().map(|s| s.size_bytes).sum();
        if size_bytes > covered {
            self.check_quota(cur.node, size_bytes - covered)?;
            let mut pl = Placement::new(
                cur.node,
                size_bytes - covered,
                cur.stripe,
                cur.bandwidth_bps,
                cur.links.as_deref(),
                None,
            )?;
            pl.objective = self.placement;
            pl.circuit = cur.circuit.then_some(cur.id);
            return self.place_allocation(&pl, self.counters, move |segments| {
                let mut r = cur;
                r.size_bytes = size_bytes;
                r.segments.extend(segments);
                r
            });
        }
        let mut rec = cur;
        let mut dropped = Vec::new();
        let mut left = covered;
        while rec.segments.len() > 1 {
            let Some(last) = rec.segments.last() else { break };
            if left - last.size_bytes < size_bytes {
                break;
            }
            left -= last.size_bytes;
            if let Some(s) = rec.segments.pop() {
                dropped.push(s);
            }
        }
        rec.size_bytes = size_bytes;
        self.store.commit(&[Op::Put(Record::Allocation(rec.clone()))])?;
        for s in &dropped {
            self.release_segment(s);
        }
        let circuit = rec.circuit.then_some(rec.id);
        let view = self.keep(rec);
        if let Some(id) = circuit {
            let touched = self.switches_of(id, dropped.iter().map(|s| &s.links));
            self.sync_switches(&touched);
        }
        Ok(view)
    }

    /// Makes `rec` live, new or in place of its earlier version: its bricks list its segments,
    /// its node and its idempotency key lead to it. Returns what the REST API shows of it.
    pub(super) fn keep(&mut self, rec: AllocationRecord) -> api::Allocation {
        for s in &rec.segments {
            if let Some(b) = self.bricks.get_mut(&s.brick_id) {
                b.segments.insert(s.segment_id, (s.offset, s.size_bytes));
                b.paths.insert(s.segment_id, (s.links.clone(), s.bandwidth_bps));
            }
        }
        if let Some(n) = self.nodes.get_mut(&rec.node) {
            n.allocations.insert(rec.id);
        }
        if let Some(k) = &rec.idempotency_key {
            self.idempotency.insert((rec.node, k.clone()), rec.id);
        }
        if let Some(n) = &rec.named {
            self.names.insert(n.name.clone(), rec.id);
        }
        let view = self.allocation_view(&rec);
        self.allocations.insert(rec.id, rec);
        view
    }

    /// `DELETE /v1/allocations/{id}`.
    pub fn free(&mut self, id: u64) -> Result<api::Released, PlaneError> {
        if !self.allocations.contains_key(&id) {
            return Err(PlaneError::NotFound(format!("allocation {id} does not exist")));
        }
        self.store.commit(&[Op::Delete(Key::Allocation(id))])?;
        let Some(rec) = self.allocations.remove(&id) else {
            return Err(PlaneError::NotFound(format!("allocation {id} does not exist")));
        };
        for s in &rec.segments {
            self.release_segment(s);
        }
        if let Some(n) = self.nodes.get_mut(&rec.node) {
            n.allocations.remove(&id);
        }
        if let Some(k) = &rec.idempotency_key {
            self.idempotency.remove(&(rec.node, k.clone()));
        }
        if let Some(n) = &rec.named {
            self.names.remove(&n.name);
        }
        self.deferred.remove(&id);
        if rec.circuit {
            // Committed: the switches follow (a failure is retried until it succeeds).
            let touched = self.switches_of(id, rec.segments.iter().map(|s| &s.links));
            self.sync_switches(&touched);
        }
        Ok(api::Released {
            id,
            deferred: false,
            extents: rec
                .segments
                .iter()
                .map(|s| api::ReleasedExtent {
                    brick_id: s.brick_id,
                    segment_id: s.segment_id,
                    offset: s.offset,
                    size_bytes: s.size_bytes,
                })
                .collect(),
        })
    }

    /// What the REST API shows of an allocation: its segments with their bricks' addresses,
    /// grants' expiries and current rate limits.
    /// The live allocation node `node`'s idempotency key `key` already made, if any; a conflict
    /// if it was made from a different request (digest `sha`).
    fn replayed(&self, node: u64, key: &str, sha: &str) -> Result<Option<api::Allocation>, PlaneError> {
        let Some(rec) = self
            .idempotency
            .get(&(node, key.to_string()))
            .and_then(|a| self.allocations.get(a))
        else {
            return Ok(None);
        };
        if rec.request_sha256.as_deref() != Some(sha) {
            return Err(PlaneError::Conflict(format!(
                "idempotency key {key:?} already made allocation {} from a different request; \
                 use a fresh key for a new request",
                rec.id
            )));
        }
        Ok(Some(self.allocation_view(rec)))
    }

    fn allocation_view(&self, a: &AllocationRecord) -> api::Allocation {
        api::Allocation {
            id: a.id,
            node: a.node,
            size_bytes: a.size_bytes,
            stripe: a.stripe,
            bandwidth_bps: a.bandwidth_bps,
            created_unix_ms: a.created_unix_ms,
            idempotency_key: a.idempotency_key.clone(),
            holder: a.holder.clone(),
            circuit: a.circuit,
            segments: a
                .segments
                .iter()
                .map(|s| api::Segment {
                    brick_id: s.brick_id,
                    brick_address: self
                        .bricks
                        .get(&s.brick_id)
                        .map(|b| b.rec.address.clone())
                        .unwrap_or_default(),
                    segment_id: s.segment_id,
                    offset: s.offset,
                    size_bytes: s.size_bytes,
                    grant_hex: s.grant_hex.clone(),
                    session_key_hex: s.session_key_hex.clone(),
                    grant_expires_unix_s: grant_expiry_of(&s.grant_hex),
                    bandwidth_bps: s.bandwidth_bps,
                    rate_limit_bps: self.graph.rate_limit(&s.links, s.bandwidth_bps),
                    links: s.links.clone(),
                })
                .collect(),
        }
    }

    /// `GET /v1/allocations/{id}`.
    pub fn allocation(&self, id: u64) -> Result<api::Allocation, PlaneError> {
        self.allocations
            .get(&id)
            .map(|a| self.allocation_view(a))
            .ok_or_else(|| PlaneError::NotFound(format!("allocation {id} does not exist")))
    }

    /// `GET /v1/allocations` (optionally of one node), named segments left out (they are
    /// `GET /v1/segments`'s: an agent must neither pool them nor return them as orphans).
    pub fn allocations(&self, node: Option<u64>) -> Vec<api::Allocation> {
        self.allocations
            .values()
            .filter(|a| a.named.is_none())
            .filter(|a| node.is_none_or(|n| a.node == n))
            .map(|a| self.allocation_view(a))
            .collect()
    }

    /// The node allocation `id` belongs to.
    pub fn allocation_node(&self, id: u64) -> Option<u64> {
        self.allocations.get(&id).map(|a| a.node)
    }
}

/// A request's holder names its agent with a token of the documented characters.
fn check_holder(holder: Option<&api::Holder>) -> Result<(), PlaneError> {
    match holder {
        Some(h) if !api::valid_token(&h.agent) => Err(PlaneError::Invalid(format!(
            "holder.agent must be 1 to {} characters of A-Z a-z 0-9 - _ . :",
            api::MAX_IDEMPOTENCY_KEY_LEN
        ))),
        _ => Ok(()),
    }
}
