//! Rebalancing (`rackmem ctl rebalance`, and the `--rebalance-on-join` policy): moves
//! allocations from the fullest bricks onto bricks with room, through the same evacuation
//! orders a drain uses (`drain.rs`): the moves that are under way are listed, with their
//! targets, in the reply to their node's pool report, and the agent has the process holding
//! each move its pages and return it. The control plane moves no pages itself.
//!
//! **The rule.** A brick's *share* is the bytes in its segments over its capacity; the *mean* is
//! all bricks' bytes over all their capacity (bricks that are up and not draining). While the
//! fullest brick is more than `tolerance` points above the mean, one allocation with a segment
//! on it moves that segment to the emptiest brick that can take it without ending fuller than
//! the source will be (so every move brings the two closer and the plan ends); among the
//! allocations that fit, the largest segment goes first. A brick from which nothing fits is
//! left as it is. An allocation goes back whole, so its other segments are carried too, each to
//! a new segment on its own brick (a copy, which needs room there while it moves).
//!
//! **Bounds.** One move per allocation (an allocation is in a plan once); at most
//! [`MAX_MOVES`] moves per plan; at most
//! `max_in_flight_bytes` of allocations moving at once (one always moves, however large); a
//! move not done within [`MOVE_TIMEOUT`] is given up, and its allocation stays where it was.
//!
//! Not stored: a control plane that restarts or fails over forgets the plan (moves under way
//! finish, the rest is planned again by the next `rebalance`).

use super::placement::Placement;
use super::{now_unix_ms, ControlPlane, PlaneError};
use crate::alloc::FreeExtents;
use crate::api::{self, MoveState};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

/// How far a brick may stay from the mean share, in percentage points, unless asked otherwise.
pub const DEFAULT_TOLERANCE_POINTS: f64 = 10.0;
/// Most bytes of allocations moving at once, unless asked otherwise.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: u64 = 256 << 20;
/// How long a move may be under way before it is given up: an agent that cannot order its
/// process (it restarted, the process takes no orders) never finishes it.
pub const MOVE_TIMEOUT: Duration = Duration::from_secs(120);

/// Most moves one plan holds: it is made under the control plane's lock, and its status is
/// one reply.
pub const MAX_MOVES: usize = 1024;

/// The rebalance under way (or the last one), and when each of its moves started.
pub(super) struct Running {
    view: api::Rebalance,
    started: HashMap<u64, Instant>,
}

/// A brick as the planner sees it.
#[derive(Clone)]
pub(super) struct Room {
    pub(super) name: String,
    pub(super) capacity: u64,
    pub(super) used: u64,
    /// Its free extents, carved as the plan places segments on it.
    pub(super) extents: FreeExtents,
}

/// An allocation the planner may move.
pub(super) struct Candidate {
    pub(super) allocation: u64,
    pub(super) node: u64,
    /// (segment, brick, size).
    pub(super) segments: Vec<(u64, u64, u64)>,
}

/// `a / b <= c / d` for shares, without rounding.
fn not_above(a: u64, b: u64, c: u64, d: u64) -> bool {
    u128::from(a) * u128::from(d) <= u128::from(c) * u128::from(b)
}

fn percent(used: u64, capacity: u64) -> f64 {
    if capacity == 0 {
        0.0
    } else {
        used as f64 * 100.0 / capacity as f64
    }
}

/// The plan (see the module documentation): moves in the order they start. `rooms` ends as
/// the plan leaves the bricks; `reachable(candidate, brick)` says whether the candidate's node
/// has a path to that brick.
pub(super) fn plan(
    rooms: &mut BTreeMap<u64, Room>,
    candidates: &[Candidate],
    tolerance: f64,
    reachable: impl Fn(&Candidate, u64) -> bool,
) -> Vec<api::RebalanceMove> {
    let capacity: u64 = rooms.values().map(|r| r.capacity).sum();
    let used: u64 = rooms.values().map(|r| r.used).sum();
    let mean = percent(used, capacity);
    let mut moves = Vec::new();
    let mut planned: HashSet<u64> = HashSet::new();
    let mut stuck: HashSet<u64> = HashSet::new();
    // Brick → (size, candidate) of the candidates' segments on it, largest first (then in
    // allocation order): a round looks at the fullest brick's only.
    let mut on: HashMap<u64, Vec<(u64, usize)>> = HashMap::new();
    for (i, c) in candidates.iter().enumerate() {
        for &(_, brick, size) in &c.segments {
            on.entry(brick).or_default().push((size, i));
        }
    }
    for v in on.values_mut() {
        v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    }
    // Each round plans a move or leaves a brick as it is, so this many rounds are enough; a
    // plan holds at most MAX_MOVES (the next rebalance goes on from there).
    for _ in 0..candidates.len().min(MAX_MOVES) + rooms.len() {
        if moves.len() >= MAX_MOVES {
            break;
        }
        let fullest = rooms
            .iter()
            .filter(|(id, r)| !stuck.contains(*id) && percent(r.used, r.capacity) > mean + tolerance)
            .max_by(|a, b| {
                percent(a.1.used, a.1.capacity)
                    .total_cmp(&percent(b.1.used, b.1.capacity))
                    .then(b.0.cmp(a.0))
            })
            .map(|(id, _)| *id);
        let Some(from) = fullest else { break };
        let mut emptiest: Vec<u64> = rooms.keys().copied().filter(|id| *id != from).collect();
        emptiest.sort_by(|a, b| {
            percent(rooms[a].used, rooms[a].capacity)
                .total_cmp(&percent(rooms[b].used, rooms[b].capacity))
                .then(a.cmp(b))
        });
        let src = &rooms[&from];
        // (size, candidate index, target): the first that fits, in size order, is the largest.
        let mut best: Option<(u64, usize, u64)> = None;
        for &(size, i) in on.get(&from).map_or(&[][..], Vec::as_slice) {
            let c = &candidates[i];
            if planned.contains(&c.allocation) {
                continue;
            }
            // Its other segments are copied on their own bricks while it moves.
            let carried_fit = c
                .segments
                .iter()
                .filter(|s| s.1 != from)
                .all(|s| rooms.get(&s.1).is_some_and(|r| r.extents.largest() >= s.2));
            if !carried_fit {
                continue;
            }
            let to = emptiest.iter().copied().find(|to| {
                let r = &rooms[to];
                !c.segments.iter().any(|s| s.1 == *to)
                    && r.extents.largest() >= size
                    && not_above(r.used + size, r.capacity, src.used.saturating_sub(size), src.capacity)
                    && reachable(c, *to)
            });
            if let Some(to) = to {
                best = Some((size, i, to));
                break;
            }
        }
        let Some((size, i, to)) = best else {
            stuck.insert(from);
            continue;
        };
        let c = &candidates[i];
        planned.insert(c.allocation);
        let mut segments = Vec::with_capacity(c.segments.len());
        for &(segment_id, brick, bytes) in &c.segments {
            let target = if brick == from { to } else { brick };
            if let Some(r) = rooms.get_mut(&target) {
                // The carried copies hold their room only while they move; the plan keeps it
                // (it may place a little less than it could, never more than fits).
                let _ = r.extents.carve(bytes);
            }
            segments.push(api::SegmentMove {
                segment_id,
                from_brick_id: brick,
                to_brick_id: target,
                size_bytes: bytes,
            });
        }
        if let Some(r) = rooms.get_mut(&to) {
            r.used += size;
        }
        if let Some(r) = rooms.get_mut(&from) {
            r.used = r.used.saturating_sub(size);
        }
        moves.push(api::RebalanceMove {
            allocation: c.allocation,
            node: c.node,
            segments,
            state: MoveState::Pending,
            why: None,
        });
    }
    moves
}

impl ControlPlane {
    /// `POST /v1/rebalance`: plans moves (see the module documentation) and, unless a dry run,
    /// starts them. Refused while another rebalance has moves left.
    pub fn rebalance(&mut self, req: api::RebalanceRequest, reason: &str) -> Result<api::Rebalance, PlaneError> {
        self.rebalance_tick();
        if let Some(r) = self.rebalance.as_ref().filter(|r| !r.view.finished) {
            let left = r
                .view
                .moves
                .iter()
                .filter(|m| matches!(m.state, MoveState::Pending | MoveState::Moving))
                .count();
            if !req.dry_run {
                return Err(PlaneError::Conflict(format!(
                    "a rebalance is under way ({left} move(s) left): wait for it (GET /v1/rebalance) and \
                     ask again"
                )));
            }
        }
        let tolerance = req.tolerance_points.unwrap_or(DEFAULT_TOLERANCE_POINTS);
        if !(0.0..=100.0).contains(&tolerance) {
            return Err(PlaneError::Invalid(format!(
                "tolerance {tolerance} is not between 0 and 100 percentage points"
            )));
        }
        let max_in_flight = req.max_in_flight_bytes.unwrap_or(DEFAULT_MAX_IN_FLIGHT_BYTES);
        let mut rooms: BTreeMap<u64, Room> = self
            .bricks
            .iter()
            .filter(|(_, b)| b.up && !b.rec.draining)
            .map(|(id, b)| {
                (
                    *id,
                    Room {
                        name: b.rec.name.clone(),
                        // The tail under one MiB that no segment can use is not capacity.
                        capacity: b.extents.usable_bytes(),
                        used: b.extents.usable_bytes().saturating_sub(b.extents.free_bytes()),
                        extents: b.extents.clone(),
                    },
                )
            })
            .collect();
        let before = rooms.clone();
        let candidates = self.rebalance_candidates(&rooms);
        let moves = plan(&mut rooms, &candidates, tolerance, |c, to| self.reaches(c, to));
        let capacity: u64 = before.values().map(|r| r.capacity).sum();
        let used: u64 = before.values().map(|r| r.used).sum();
        let view = api::Rebalance {
            dry_run: req.dry_run,
            tolerance_points: tolerance,
            mean_percent: percent(used, capacity),
            max_in_flight_bytes: max_in_flight,
            reason: reason.to_string(),
            planned_unix_ms: now_unix_ms(),
            finished: moves.is_empty(),
            moves,
            bricks: before
                .iter()
                .map(|(id, r)| api::BrickShare {
                    brick_id: *id,
                    name: r.name.clone(),
                    capacity_bytes: r.capacity,
                    used_bytes: r.used,
                    planned_bytes: rooms.get(id).map_or(r.used, |p| p.used),
                })
                .collect(),
        };
        if req.dry_run {
            return Ok(view);
        }
        self.rebalance = Some(Running {
            view,
            started: HashMap::new(),
        });
        self.rebalance_tick();
        self.rebalance_status()
    }

    /// `GET /v1/rebalance`: the rebalance under way, or the last one.
    pub fn rebalance_status(&mut self) -> Result<api::Rebalance, PlaneError> {
        self.rebalance_tick();
        self.rebalance
            .as_ref()
            .map(|r| r.view.clone())
            .ok_or_else(|| PlaneError::NotFound("no rebalance was asked since the control plane started".into()))
    }

    /// Whether a brick that joined (registered, or came back up) starts a rebalance.
    pub fn set_rebalance_on_join(&mut self, on: bool) {
        self.rebalance_on_join = on;
    }

    /// The policy: brick `id` joined; rebalance onto it if asked to and none is under way.
    pub(super) fn brick_joined(&mut self, id: u64) {
        if !self.rebalance_on_join || self.rebalance.as_ref().is_some_and(|r| !r.view.finished) {
            return;
        }
        match self.rebalance(api::RebalanceRequest::default(), "brick_joined") {
            Ok(r) => tracing::info!(brick = id, moves = r.moves.len(), "a brick joined: rebalancing"),
            Err(e) => tracing::warn!(brick = id, "a brick joined; no rebalance: {e}"),
        }
    }

    /// The allocations a rebalance may move: those a process holds through an agent, or in
    /// their node's pool as its agent last reported (an agent can order or release them), on
    /// bricks that are up and not draining (a drain moves the others), and not circuits (their
    /// paths are theirs alone).
    fn rebalance_candidates(&self, rooms: &BTreeMap<u64, Room>) -> Vec<Candidate> {
        self.allocations
            .values()
            .filter(|a| !a.circuit && !a.segments.is_empty())
            .filter(|a| a.holder.is_some() || self.pools.get(&a.node).is_some_and(|p| p.attached.contains(&a.id)))
            .filter(|a| a.segments.iter().all(|s| rooms.contains_key(&s.brick_id)))
            .map(|a| Candidate {
                allocation: a.id,
                node: a.node,
                segments: a
                    .segments
                    .iter()
                    .map(|s| (s.segment_id, s.brick_id, s.size_bytes))
                    .collect(),
            })
            .collect()
    }

    /// Whether `c`'s node has a path to brick `to` for its segment's bandwidth.
    fn reaches(&self, c: &Candidate, to: u64) -> bool {
        let Some(a) = self.allocations.get(&c.allocation) else {
            return false;
        };
        let Some(node_ports) = self.nodes.get(&c.node).map(|n| n.rec.ports.clone()) else {
            return false;
        };
        let size = a.segments.first().map_or(0, |s| s.size_bytes);
        let bricks = [to];
        Placement::new(c.node, size, 1, a.bandwidth_bps, a.links.as_deref(), Some(&bricks))
            .and_then(|pl| self.choose(&pl, 0, &Default::default(), &node_ports))
            .is_ok()
    }

    /// Advances the rebalance: moves whose allocation is gone are done, moves past
    /// [`MOVE_TIMEOUT`] or whose target can take nothing now are given up, and pending moves
    /// start while the bytes in flight allow.
    pub(super) fn rebalance_tick(&mut self) {
        let Some(mut r) = self.rebalance.take() else {
            return;
        };
        if !r.view.dry_run && !r.view.finished {
            let now = Instant::now();
            let mut in_flight = 0u64;
            for m in &mut r.view.moves {
                let bytes: u64 = m.segments.iter().map(|s| s.size_bytes).sum();
                let gone = !self.allocations.contains_key(&m.allocation);
                match m.state {
                    MoveState::Pending if gone => {
                        m.state = MoveState::Abandoned;
                        m.why = Some("its holder released it before it moved".into());
                    }
                    MoveState::Moving if gone => m.state = MoveState::Done,
                    MoveState::Moving => {
                        let target_lost = m.segments.iter().find_map(|s| {
                            self.bricks
                                .get(&s.to_brick_id)
                                .filter(|b| !b.up || b.rec.draining)
                                .map(|b| b.rec.name.clone())
                        });
                        let late = r
                            .started
                            .get(&m.allocation)
                            .is_some_and(|t| now.saturating_duration_since(*t) > MOVE_TIMEOUT);
                        if let Some(name) = target_lost {
                            m.state = MoveState::Abandoned;
                            m.why = Some(format!("its target brick {name} is down or draining"));
                        } else if late {
                            m.state = MoveState::Abandoned;
                            m.why = Some(format!(
                                "not done within {} s (its node's agent log says why)",
                                MOVE_TIMEOUT.as_secs()
                            ));
                        } else {
                            in_flight += bytes;
                        }
                    }
                    _ => {}
                }
            }
            for m in &mut r.view.moves {
                if m.state != MoveState::Pending {
                    continue;
                }
                let bytes: u64 = m.segments.iter().map(|s| s.size_bytes).sum();
                if in_flight > 0 && in_flight.saturating_add(bytes) > r.view.max_in_flight_bytes {
                    // In plan order: a large move is not overtaken for ever by small ones.
                    break;
                }
                m.state = MoveState::Moving;
                r.started.insert(m.allocation, now);
                in_flight += bytes;
            }
            r.view.finished = r
                .view
                .moves
                .iter()
                .all(|m| matches!(m.state, MoveState::Done | MoveState::Abandoned));
        }
        self.rebalance = Some(r);
    }

    /// The segments of `node`'s allocations a rebalance is moving now, each with its target,
    /// for the reply to its pool report (as a drain's, which come first: `skip` lists the
    /// allocations already listed).
    pub(super) fn rebalance_evacuations(&self, node: u64, skip: &HashSet<u64>) -> Vec<api::Evacuation> {
        let Some(r) = self.rebalance.as_ref().filter(|r| !r.view.dry_run) else {
            return Vec::new();
        };
        r.view
            .moves
            .iter()
            .filter(|m| m.node == node && m.state == MoveState::Moving && !skip.contains(&m.allocation))
            .flat_map(|m| {
                m.segments.iter().map(move |s| api::Evacuation {
                    allocation: m.allocation,
                    segment_id: s.segment_id,
                    brick_id: s.from_brick_id,
                    size_bytes: s.size_bytes,
                    to_brick_id: Some(s.to_brick_id),
                    to_address: self.bricks.get(&s.to_brick_id).map(|b| b.rec.address.clone()),
                    why: None,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    fn room(name: &str, capacity: u64, used: u64) -> Room {
        let mut extents = FreeExtents::new(capacity);
        if used > 0 {
            let _ = extents.carve(used);
        }
        Room {
            name: name.into(),
            capacity,
            used,
            extents,
        }
    }

    fn one(allocation: u64, brick: u64, size: u64) -> Candidate {
        Candidate {
            allocation,
            node: 1,
            segments: vec![(allocation * 10, brick, size)],
        }
    }

    #[test]
    fn a_brick_that_joins_takes_load_until_every_share_is_within_the_tolerance() {
        // Two bricks of 1 GiB, each holding eight 64 MiB allocations (50%); a third joins.
        let mut rooms = BTreeMap::from([
            (1, room("a", 1024 * M, 512 * M)),
            (2, room("b", 1024 * M, 512 * M)),
            (3, room("c", 1024 * M, 0)),
        ]);
        let cands: Vec<Candidate> = (0..16).map(|i| one(i + 1, 1 + i % 2, 64 * M)).collect();
        let moves = plan(&mut rooms, &cands, 10.0, |_, _| true);
        let mean = 100.0 / 3.0;
        for r in rooms.values() {
            let s = percent(r.used, r.capacity);
            assert!((s - mean).abs() <= 10.0, "{} at {s:.1}% (mean {mean:.1}%)", r.name);
        }
        assert!(
            moves.iter().all(|m| m.segments[0].to_brick_id == 3),
            "only onto the new brick"
        );
        assert!(!moves.is_empty() && moves.len() <= 6, "{} moves", moves.len());
        let once: HashSet<u64> = moves.iter().map(|m| m.allocation).collect();
        assert_eq!(once.len(), moves.len(), "one move per allocation");
    }

    #[test]
    fn a_balanced_rack_and_a_move_that_would_overshoot_plan_nothing() {
        let mut rooms = BTreeMap::from([(1, room("a", 1024 * M, 300 * M)), (2, room("b", 1024 * M, 250 * M))]);
        let cands = [one(1, 1, 64 * M)];
        assert!(
            plan(&mut rooms, &cands, 10.0, |_, _| true).is_empty(),
            "within 10 points"
        );
        // One 512 MiB allocation on a, nothing on b: moving it would make b the fuller one.
        let mut rooms = BTreeMap::from([(1, room("a", 1024 * M, 512 * M)), (2, room("b", 1024 * M, 0))]);
        let cands = [one(1, 1, 512 * M + M)];
        assert!(plan(&mut rooms, &cands, 1.0, |_, _| true).is_empty());
        // Nothing reachable: nothing planned, and the plan ends.
        let cands = [one(1, 1, 64 * M)];
        assert!(plan(&mut rooms, &cands, 1.0, |_, _| false).is_empty());
    }

    #[test]
    fn a_striped_allocation_moves_its_segment_off_the_full_brick_and_carries_the_other() {
        let mut rooms = BTreeMap::from([
            (1, room("a", 256 * M, 192 * M)),
            (2, room("b", 256 * M, 64 * M)),
            (3, room("c", 256 * M, 0)),
        ]);
        let striped = Candidate {
            allocation: 7,
            node: 1,
            segments: vec![(70, 1, 32 * M), (71, 2, 32 * M)],
        };
        let moves = plan(&mut rooms, &[striped], 5.0, |_, _| true);
        assert_eq!(moves.len(), 1);
        let s = &moves[0].segments;
        assert_eq!((s[0].from_brick_id, s[0].to_brick_id), (1, 3), "{s:?}");
        assert_eq!(
            (s[1].from_brick_id, s[1].to_brick_id),
            (2, 2),
            "carried on its own brick: {s:?}"
        );
        assert_eq!((rooms[&1].used, rooms[&3].used), (160 * M, 32 * M));
    }
}
