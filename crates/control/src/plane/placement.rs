//! Placement: the one path by which an allocation gets segments, whether it is new
//! (`POST /v1/allocations`) or grows (`PATCH /v1/allocations/{id}`), and by which segments go
//! back.
//!
//! A [`Placement`] asks for `stripe` segments of one size on distinct bricks, each with a path
//! from the node that has the bandwidth asked for. Each segment's brick is the one named for it,
//! or else the up brick with the largest free extent that has such a path; the segment is carved
//! from it, its path reserved, its grant signed, every step written to an undo log. The
//! allocation record is then written to the store in one batch with the counters; if placement
//! or the store fails, the log is undone and nothing stays reserved.

use super::attach::next_id;
use super::{ControlPlane, PlaneError};
use crate::alloc::align_up;
use crate::api::{self, Port};
use crate::grant;
use crate::store::{AllocationRecord, Counters, Op, Record, SegmentRecord};
use std::collections::HashSet;

/// A step of a placement, to undo if the placement or its commit fails.
enum Undo {
    Carved { brick: u64, offset: u64, size: u64 },
    Reserved { links: Vec<String>, bandwidth_bps: u64 },
}

/// What a placement needs to know.
pub(super) struct Placement<'a> {
    node: u64,
    /// Bytes of each segment (whole MiB).
    pub(super) per_segment: u64,
    stripe: u32,
    bandwidth_bps: u64,
    /// The brick of each segment, if the request names them.
    bricks: Option<&'a [u64]>,
    /// The only links a path may cross, if the request names them.
    allowed: Option<HashSet<String>>,
    /// How to pick bricks the request does not name.
    pub(super) objective: api::Objective,
    /// The allocation whose circuit the segments are part of, if it is one: their paths must
    /// cross only cables no other segment uses, and become its alone.
    pub(super) circuit: Option<u64>,
}

impl<'a> Placement<'a> {
    /// `stripe` segments that together cover `size_bytes` (each rounded up to whole MiB) for
    /// `node`, with `bandwidth_bps` reserved on every link of their paths; on `bricks` if given
    /// (one per segment), over `links` only if given.
    pub(super) fn new(
        node: u64,
        size_bytes: u64,
        stripe: u32,
        bandwidth_bps: u64,
        links: Option<&[String]>,
        bricks: Option<&'a [u64]>,
    ) -> Result<Placement<'a>, PlaneError> {
        let per_segment = align_up(size_bytes.div_ceil(u64::from(stripe))).ok_or_else(|| {
            PlaneError::Invalid(format!(
                "size {size_bytes} bytes cannot be represented in whole MiB segments"
            ))
        })?;
        Ok(Placement {
            node,
            per_segment,
            stripe,
            bandwidth_bps,
            bricks,
            allowed: links.map(|l| l.iter().cloned().collect()),
            objective: api::Objective::default(),
            circuit: None,
        })
    }
}

impl ControlPlane {
    /// Places `pl`, makes the allocation record from the new segments with `build`, and writes
    /// it in one batch with `counters` (advanced past the new segments' ids); then the
    /// allocation is live (see [`ControlPlane::keep`]). On failure everything placed is undone
    /// and nothing changes.
    pub(super) fn place_allocation(
        &mut self,
        pl: &Placement<'_>,
        counters: Counters,
        build: impl FnOnce(Vec<SegmentRecord>) -> AllocationRecord,
    ) -> Result<api::Allocation, PlaneError> {
        self.place_allocation_of(std::slice::from_ref(pl), counters, build)
    }

    /// [`ControlPlane::place_allocation`] of the segments of several placements, in their
    /// order, as one allocation (a clone: one placement per segment cloned, each on its own
    /// segment's brick); the circuit, if any, is the first placement's.
    pub(super) fn place_allocation_of(
        &mut self,
        pls: &[Placement<'_>],
        mut counters: Counters,
        build: impl FnOnce(Vec<SegmentRecord>) -> AllocationRecord,
    ) -> Result<api::Allocation, PlaneError> {
        let Some(pl) = pls.first() else {
            return Err(PlaneError::Invalid("nothing to place".to_string()));
        };
        let mut log = Vec::new();
        let mut segments = Vec::new();
        for p in pls {
            match self.place(p, &mut counters, &mut log) {
                Ok(s) => segments.extend(s),
                Err(e) => {
                    self.undo(log);
                    return Err(e);
                }
            }
        }
        let start = std::time::Instant::now();
        let rec = build(segments);
        // A circuit's switches are configured before it is stored: if they cannot be, nothing
        // is reserved and the request is refused saying why.
        let touched = match pl.circuit {
            Some(id) => {
                let paths: Vec<Vec<String>> = rec.segments.iter().map(|s| s.links.clone()).collect();
                let touched = self.switches_of(id, &paths);
                if let Err(e) = self.apply_switches(&touched, Some((id, Some(&paths)))) {
                    self.undo(log);
                    self.sync_switches(&touched);
                    return Err(e);
                }
                touched
            }
            None => Default::default(),
        };
        let ops = [
            Op::Put(Record::Allocation(rec.clone())),
            Op::Put(Record::Counters(counters)),
        ];
        if let Err(e) = self.store.commit(&ops) {
            self.undo(log);
            self.sync_switches(&touched);
            return Err(e.into());
        }
        self.counters = counters;
        if pl.circuit.is_some() {
            self.circuit_setup.observe(start.elapsed().as_secs_f64());
        }
        Ok(self.keep(rec))
    }

    /// One segment placed as `pl` asks (a stripe of 1), carved and its path reserved but in no
    /// allocation yet (a named segment's move target); nothing stays reserved on failure.
    pub(super) fn place_one(
        &mut self,
        pl: &Placement<'_>,
        counters: &mut Counters,
    ) -> Result<SegmentRecord, PlaneError> {
        let mut log = Vec::new();
        match self.place(pl, counters, &mut log) {
            Ok(mut s) if s.len() == 1 => Ok(s.remove(0)),
            Ok(_) => {
                self.undo(log);
                Err(PlaneError::Invalid(
                    "a placement of one segment made several".to_string(),
                ))
            }
            Err(e) => {
                self.undo(log);
                Err(e)
            }
        }
    }

    /// Carves `stripe` segments on distinct bricks and reserves their paths; on failure,
    /// everything done is undone by the caller through `log`.
    fn place(
        &mut self,
        pl: &Placement<'_>,
        counters: &mut Counters,
        log: &mut Vec<Undo>,
    ) -> Result<Vec<SegmentRecord>, PlaneError> {
        let node_ports = self
            .nodes
            .get(&pl.node)
            .map(|n| n.rec.ports.clone())
            .ok_or_else(|| PlaneError::NotFound(format!("node {} is not registered", pl.node)))?;
        let mut used: HashSet<u64> = HashSet::new();
        let mut out = Vec::with_capacity(pl.stripe as usize);
        for nth in 0..pl.stripe as usize {
            let (brick, path) = self.choose(pl, nth, &used, &node_ports)?;
            if !used.insert(brick) {
                return Err(PlaneError::Invalid(format!(
                    "brick {brick} is named twice in the stripe"
                )));
            }
            let mut path = path;
            if let Some(memory) = self.graph.memory_link(brick) {
                // Seed 004's rate limiter in front of the brick: its memory is one more link
                // on the path, so the segments' rates add up to at most what it can serve.
                if !self.graph.admits(&memory, pl.bandwidth_bps) {
                    let served = self.graph.link(&memory).map_or(0, |l| l.capacity_bps);
                    let free = self.graph.link(&memory).map_or(0, |l| l.free_bps());
                    return Err(PlaneError::InsufficientBandwidth(format!(
                        "brick {brick}'s memory serves {served} bytes/s, of which {free} are not reserved: \
                         not enough for {} bytes/s",
                        pl.bandwidth_bps
                    )));
                }
                path.push(memory);
            }
            let Some(b) = self.bricks.get_mut(&brick) else {
                return Err(PlaneError::NotFound(format!("brick {brick} is not registered")));
            };
            let old_largest = b.extents.largest();
            let offset = b.extents.carve(pl.per_segment).ok_or_else(|| {
                PlaneError::InsufficientCapacity(format!(
                    "brick {brick} has no free extent of {} bytes",
                    pl.per_segment
                ))
            })?;
            let key = b.key.clone();
            log.push(Undo::Carved {
                brick,
                offset,
                size: pl.per_segment,
            });
            self.set_largest(brick, old_largest);
            self.graph.reserve(&path, pl.bandwidth_bps);
            if let Some(owner) = pl.circuit {
                self.graph.claim(&path, owner);
            }
            log.push(Undo::Reserved {
                links: path.clone(),
                bandwidth_bps: pl.bandwidth_bps,
            });
            let segment_id = next_id(&mut counters.next_segment);
            let rate = self.graph.rate_limit(&path, pl.bandwidth_bps);
            let issued = grant::issue(
                &key,
                segment_id,
                offset,
                pl.per_segment,
                pl.node,
                self.grant_expiry(),
                rate,
            );
            out.push(SegmentRecord {
                brick_id: brick,
                segment_id,
                offset,
                size_bytes: pl.per_segment,
                bandwidth_bps: pl.bandwidth_bps,
                links: path,
                grant_hex: issued.grant_hex,
                session_key_hex: issued.session_key_hex,
            });
        }
        Ok(out)
    }

    /// The brick of the `nth` segment and the path to it: the one the request names, or the up
    /// brick not `used` yet with the largest free extent that has a path from the node.
    pub(super) fn choose(
        &self,
        pl: &Placement<'_>,
        nth: usize,
        used: &HashSet<u64>,
        node_ports: &[Port],
    ) -> Result<(u64, Vec<String>), PlaneError> {
        match pl.bricks {
            Some(list) => {
                let id = list[nth];
                let b = self
                    .bricks
                    .get(&id)
                    .ok_or_else(|| PlaneError::NotFound(format!("brick {id} is not registered")))?;
                if !b.up {
                    return Err(PlaneError::InsufficientCapacity(format!(
                        "brick {} ({id}) is down (no heartbeat for {:?})",
                        b.rec.name, self.brick_timeout
                    )));
                }
                if b.rec.draining {
                    return Err(PlaneError::InsufficientCapacity(format!(
                        "brick {} ({id}) is being drained: it takes no new segments",
                        b.rec.name
                    )));
                }
                if b.extents.largest() < pl.per_segment {
                    return Err(PlaneError::InsufficientCapacity(format!(
                        "brick {} ({id}) has no free extent of {} bytes (largest free: {}, free: {})",
                        b.rec.name,
                        pl.per_segment,
                        b.extents.largest(),
                        b.extents.free_bytes()
                    )));
                }
                let path = self.path_to(pl, node_ports, id, &b.rec.ports).ok_or_else(|| {
                    PlaneError::InsufficientBandwidth(format!(
                        "no path from node {} to brick {} ({id}) with {} bytes/s unreserved on every link{}{}",
                        pl.node,
                        b.rec.name,
                        pl.bandwidth_bps,
                        if pl.circuit.is_some() {
                            " and no other segment on its ports and switch links (a circuit)"
                        } else {
                            ""
                        },
                        self.held_by_circuits(node_ports, &b.rec.ports, pl.bandwidth_bps, pl.allowed.as_ref())
                    ))
                })?;
                Ok((id, path))
            }
            None => {
                let mut with_space = 0usize;
                let mut found = None;
                let mut blocked = String::new();
                for id in self.ranked(pl.per_segment, pl.objective) {
                    if used.contains(&id) {
                        continue;
                    }
                    with_space += 1;
                    let Some(b) = self.bricks.get(&id) else { continue };
                    // A brick whose memory serves no more (all reserved) is passed over like one
                    // without a path, so the next brick gets the segment.
                    if self
                        .graph
                        .memory_link(id)
                        .is_some_and(|m| !self.graph.admits(&m, pl.bandwidth_bps))
                    {
                        continue;
                    }
                    if let Some(path) = self.path_to(pl, node_ports, id, &b.rec.ports) {
                        found = Some((id, path));
                        break;
                    }
                    if blocked.is_empty() {
                        blocked =
                            self.held_by_circuits(node_ports, &b.rec.ports, pl.bandwidth_bps, pl.allowed.as_ref());
                    }
                }
                match found {
                    Some(f) => Ok(f),
                    None if with_space == 0 => Err(PlaneError::InsufficientCapacity(format!(
                        "{} of {} up bricks have a free extent of {} bytes; the stripe needs {}",
                        nth,
                        self.index.len(),
                        pl.per_segment,
                        pl.stripe
                    ))),
                    None => Err(PlaneError::InsufficientBandwidth(format!(
                        "{with_space} more up bricks have room for {} bytes but none has a path from node {} \
                             with {} bytes/s unreserved on every link{}{blocked}",
                        pl.per_segment,
                        pl.node,
                        pl.bandwidth_bps,
                        if pl.circuit.is_some() {
                            " and no other segment on its ports and switch links (a circuit)"
                        } else {
                            ""
                        }
                    ))),
                }
            }
        }
    }

    /// A path from the node to `brick` for a segment of `pl`: shared, or for a circuit one whose
    /// cables no other segment uses (or the path the circuit already holds to that brick).
    fn path_to(
        &self,
        pl: &Placement<'_>,
        node_ports: &[Port],
        brick: u64,
        brick_ports: &[Port],
    ) -> Option<Vec<String>> {
        let Some(owner) = pl.circuit else {
            return self
                .graph
                .find_path(node_ports, brick_ports, pl.bandwidth_bps, pl.allowed.as_ref());
        };
        let memory = crate::graph::memory_link_id(brick);
        let held = self
            .allocations
            .get(&owner)
            .and_then(|a| a.segments.iter().find(|s| s.brick_id == brick))
            .map(|s| s.links.iter().filter(|l| **l != memory).cloned().collect::<Vec<_>>())
            .filter(|p| p.iter().all(|l| self.graph.admits(l, pl.bandwidth_bps)));
        held.or_else(|| {
            let q = crate::graph::PathQuery {
                bandwidth_bps: pl.bandwidth_bps,
                allowed: pl.allowed.as_ref(),
                avoid: None,
                usage: crate::graph::PathUse::Circuit,
            };
            self.graph.find_path_with(node_ports, brick_ports, &q)
        })
    }

    /// The up bricks with a free extent of `size` bytes, in the order `objective` prefers
    /// them (see [`api::Objective`]).
    fn ranked(&self, size: u64, objective: api::Objective) -> Vec<u64> {
        let mut ids: Vec<u64> = self.index.candidates(size).collect();
        // A draining brick takes no new segments.
        ids.retain(|id| self.bricks.get(id).is_some_and(|b| !b.rec.draining));
        // `candidates` lists the largest free extent first; the sorts are stable, so that
        // stays the last tie-break.
        let entry = |id: &u64| self.bricks.get(id);
        match objective {
            api::Objective::Spread => ids.sort_by_key(|id| {
                entry(id).map_or((u64::MAX, usize::MAX), |b| (b.load_bps.unwrap_or(0), b.segments.len()))
            }),
            api::Objective::Pack => ids.sort_by_key(|id| {
                entry(id).map_or((true, u64::MAX, u32::MAX), |b| {
                    let idle = b.segments.is_empty();
                    let busy_watts = self.graph.power_of(&b.rec.name).map_or(0, |p| p.busy_watts);
                    // Busy bricks first, the fullest (smallest largest extent) first; then idle
                    // ones, the cheapest to wake first.
                    if idle {
                        (true, 0, busy_watts)
                    } else {
                        (false, b.extents.largest(), 0)
                    }
                })
            }),
        }
        ids
    }

    fn undo(&mut self, log: Vec<Undo>) {
        for u in log.into_iter().rev() {
            match u {
                Undo::Carved { brick, offset, size } => {
                    let old = self.bricks.get(&brick).map(|b| b.extents.largest());
                    if let Some(b) = self.bricks.get_mut(&brick) {
                        b.extents.release(offset, size);
                    }
                    if let Some(old) = old {
                        self.set_largest(brick, old);
                    }
                }
                Undo::Reserved { links, bandwidth_bps } => self.graph.release(&links, bandwidth_bps),
            }
        }
    }

    /// Gives a segment's extent back to its brick and its bandwidth back to its path.
    pub(super) fn release_segment(&mut self, s: &SegmentRecord) {
        self.graph.release(&s.links, s.bandwidth_bps);
        let Some(b) = self.bricks.get_mut(&s.brick_id) else {
            return;
        };
        let old = b.extents.largest();
        b.segments.remove(&s.segment_id);
        b.paths.remove(&s.segment_id);
        if !b.extents.release(s.offset, s.size_bytes) {
            tracing::error!(
                brick = s.brick_id,
                segment = s.segment_id,
                "released segment was already free: the extent map is inconsistent"
            );
        }
        self.set_largest(s.brick_id, old);
    }

    /// Tells the index of up bricks that `brick`'s largest free extent was `old_largest`.
    pub(super) fn set_largest(&mut self, brick: u64, old_largest: u64) {
        if let Some(b) = self.bricks.get(&brick) {
            if b.up {
                self.index.update(brick, Some(old_largest), b.extents.largest());
            }
        }
    }
}
