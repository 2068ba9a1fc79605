//! Moving a named segment to another brick while its holders run (issue 23 item 4;
//! `docs/migration.md`, "Named segments"). A named segment has holders on several nodes, each
//! attached by its own link, so no node's agent can move it; the control plane does, through
//! the bricks' heartbeat replies (bricks poll it already, so it needs no way in to them), in
//! seed 001's four steps:
//!
//! 1. *Allocate*: a segment `T` of the source `S`'s size on an up brick that is not draining,
//!    placed for the segment's creator (as a drain places any segment), carved and reserved but
//!    in no allocation and granted to no node.
//! 2. *Freeze*: the source brick's replies list `S` as frozen; it answers node requests on `S`
//!    `Moving` without executing them, and its next heartbeat reports `S` frozen, after which
//!    nothing can change `S`.
//! 3. *Transfer*: the target brick's replies carry a pull order (a pull grant this control plane
//!    signs with a fresh grant of `S`: it holds the source brick's key); the target reports the
//!    pull's end in its heartbeats.
//! 4. *Finalize*: one store transaction points the named record at `T`; the source's replies
//!    list `S` as moved (it answers `Moved`, which sends holders to re-open the name and find
//!    `T`) for [`MOVED_GRACE`], then `S` is freed.
//!
//! Exactly one brick executes requests on the segment at any time: the source until its freeze
//! is reported, nobody while it is frozen, the target only once the record points at it (no
//! node holds a grant of `T` before). A target that fails or reports a failed pull, a brick that
//! goes down, or a move not done within [`NAMED_MOVE_DEADLINE`] ends the move: `T` is freed,
//! the source's next reply no longer lists `S` frozen and holders go on with `S`. The failure
//! is shown on the brick (`named_waiting`) and the move is tried again after
//! [`api::NAMED_MOVE_RETRY_S`]. A segment the source cannot freeze (a process on its host maps
//! it) fails the same way, with the brick's reason.
//!
//! Moves are not stored: a control plane that restarts (or a replica that takes over) forgets
//! them; `T`, in no record, is released by its brick's next reply, and `S` is unfrozen by its
//! next reply, so nothing is lost and the drain starts the move again.

use super::placement::Placement;
use super::{ControlPlane, PlaneError};
use crate::api;
use crate::store::{Op, Record, SegmentRecord};
use rackmem_proto::{rights, Grant, PullGrant, SegmentGrant};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Named segments moving at once (each holds a pull thread on its target and, while frozen,
/// its holders waiting).
pub const MAX_NAMED_MOVES: usize = 4;
/// Longest from a move's start to its switch. Below the 30 s a holder waits on `Moving`
/// (`include/rackmem.h`), so a move that overruns ends before a holder gives up; a 64 MiB pull
/// takes well under a second on loopback.
pub const NAMED_MOVE_DEADLINE: Duration = Duration::from_secs(20);
/// How long the source answers `Moved` after the switch before `S` is freed: holders that have
/// not called since learn of the move rather than of a missing segment.
pub const MOVED_GRACE: Duration = Duration::from_secs(10);
/// What a pull grant is good for (the pull itself is bounded by the deadline).
const PULL_GRANT_LIFETIME_S: u64 = 120;

/// A named segment's move.
#[derive(Debug)]
pub(super) struct NamedMove {
    allocation: u64,
    name: String,
    source: SegmentRecord,
    target: SegmentRecord,
    step: Step,
    deadline: Instant,
    started: Instant,
}

#[derive(Debug)]
enum Step {
    /// The source has been told to freeze `S`; it has not reported it yet.
    Freezing,
    /// `S` is frozen; the target is told to pull it.
    Pulling(api::MovePull),
    /// The record points at `T`; the source answers `Moved` until then, and `S` is freed.
    Moved { until: Instant },
}

/// The moves under way (by source segment id) and the last failure of each named segment's.
#[derive(Debug, Default)]
pub(super) struct Moves {
    under_way: BTreeMap<u64, NamedMove>,
    failed: BTreeMap<u64, (String, Instant)>,
}

fn retry_after() -> Duration {
    Duration::from_secs(api::NAMED_MOVE_RETRY_S)
}

impl ControlPlane {
    /// A heartbeat's part in moves: brick `id`'s report moves its moves on, moves past their
    /// time end, moves off draining bricks start; returns what its reply lists: segments to
    /// freeze, segments moved, pulls to run.
    pub(super) fn named_moves_for(
        &mut self,
        id: u64,
        stats: Option<&api::HeartbeatStats>,
    ) -> (Vec<u64>, Vec<u64>, Vec<api::MovePull>) {
        let now = Instant::now();
        if let Some(s) = stats {
            self.note_move_report(id, s, now);
        }
        self.end_overdue_moves(now);
        self.start_named_moves(now);
        let (mut frozen, mut moved, mut pulls) = (Vec::new(), Vec::new(), Vec::new());
        for m in self.moves.under_way.values() {
            if m.source.brick_id == id {
                match m.step {
                    Step::Moved { .. } => moved.push(m.source.segment_id),
                    _ => frozen.push(m.source.segment_id),
                }
            }
            if let (true, Step::Pulling(order)) = (m.target.brick_id == id, &m.step) {
                pulls.push(order.clone());
            }
        }
        (frozen, moved, pulls)
    }

    /// The names moving off brick `id` now, and those waiting (`name: why`), sorted.
    pub(super) fn named_moves_on(&self, id: u64) -> (Vec<String>, Vec<String>) {
        let mut moving: Vec<String> = self
            .moves
            .under_way
            .values()
            .filter(|m| m.source.brick_id == id && !matches!(m.step, Step::Moved { .. }))
            .map(|m| m.name.clone())
            .collect();
        moving.sort();
        let mut waiting: Vec<String> = self
            .moves
            .failed
            .iter()
            .filter_map(|(a, (why, _))| {
                let rec = self.allocations.get(a)?;
                let named = rec.named.as_ref()?;
                rec.segments
                    .iter()
                    .any(|s| s.brick_id == id)
                    .then(|| format!("{}: {why}", named.name))
            })
            .collect();
        waiting.sort();
        (moving, waiting)
    }

    /// Moves on what brick `id` reports: a freeze applied (or refused), a pull ended.
    fn note_move_report(&mut self, id: u64, s: &api::HeartbeatStats, now: Instant) {
        let keys: Vec<u64> = self.moves.under_way.keys().copied().collect();
        for k in keys {
            let Some(m) = self.moves.under_way.get(&k) else {
                continue;
            };
            let brick = |b: u64| self.brick_name(b).unwrap_or("?").to_string();
            if m.source.brick_id == id {
                if let Some(u) = s.unmovable.iter().find(|u| u.segment_id == m.source.segment_id) {
                    let why = format!("brick {} cannot freeze it: {}", brick(id), u.why);
                    self.end_move(k, Some(why), now);
                    continue;
                }
                if matches!(m.step, Step::Freezing) && s.frozen.contains(&m.source.segment_id) {
                    match self.pull_order(m) {
                        Ok(order) => {
                            if let Some(m) = self.moves.under_way.get_mut(&k) {
                                m.step = Step::Pulling(order);
                            }
                        }
                        Err(why) => self.end_move(k, Some(why), now),
                    }
                    continue;
                }
            }
            if m.target.brick_id == id && matches!(m.step, Step::Pulling(_)) {
                if let Some(p) = s.pulls_ended.iter().find(|p| p.segment_id == m.target.segment_id) {
                    match &p.error {
                        Some(e) => {
                            let why = format!("the pull into brick {} failed: {e}", brick(id));
                            self.end_move(k, Some(why), now);
                        }
                        None if p.bytes == m.target.size_bytes => self.finalize_move(k, now),
                        None => {
                            let why = format!(
                                "the pull into brick {} copied {} of {} bytes",
                                brick(id),
                                p.bytes,
                                m.target.size_bytes
                            );
                            self.end_move(k, Some(why), now);
                        }
                    }
                }
            }
        }
    }

    /// Ends moves past their deadline or with a brick down, and moved ones past their grace.
    pub(super) fn end_overdue_moves(&mut self, now: Instant) {
        let up = |p: &ControlPlane, b: u64| p.bricks.get(&b).is_some_and(|b| b.up);
        let mut ended = Vec::new();
        for (&k, m) in &self.moves.under_way {
            let why = match m.step {
                Step::Moved { until } if now >= until => Some(None),
                Step::Moved { .. } => None,
                // Closed by its last holder meanwhile: `S` went with it, `T` goes back.
                _ if !self.allocations.contains_key(&m.allocation) => Some(None),
                _ if !up(self, m.target.brick_id) => Some(Some(format!(
                    "its target brick {} went down",
                    self.brick_name(m.target.brick_id).unwrap_or("?")
                ))),
                _ if !up(self, m.source.brick_id) => Some(Some(format!(
                    "its brick {} went down",
                    self.brick_name(m.source.brick_id).unwrap_or("?")
                ))),
                _ if now >= m.deadline => Some(Some(format!(
                    "it was not done within {:?} ({})",
                    NAMED_MOVE_DEADLINE,
                    match m.step {
                        Step::Freezing => "the source brick never reported the segment frozen",
                        _ => "the target brick never reported the pull's end",
                    }
                ))),
                _ => None,
            };
            if let Some(why) = why {
                ended.push((k, why));
            }
        }
        for (k, why) in ended {
            self.end_move(k, why, now);
        }
    }

    /// Starts moves of named segments off draining bricks, at most [`MAX_NAMED_MOVES`] at
    /// once; one that cannot start is shown as waiting and tried again later.
    fn start_named_moves(&mut self, now: Instant) {
        let busy = self
            .moves
            .under_way
            .values()
            .filter(|m| !matches!(m.step, Step::Moved { .. }))
            .count();
        // Every heartbeat comes here: with no brick draining (the usual case) no name is looked at.
        if busy >= MAX_NAMED_MOVES || !self.bricks.values().any(|b| b.rec.draining) {
            return;
        }
        let draining = |p: &ControlPlane, b: u64| p.bricks.get(&b).is_some_and(|b| b.rec.draining);
        let mut todo: Vec<(String, u64, SegmentRecord)> = Vec::new();
        for (name, &a) in &self.names {
            let Some(rec) = self.allocations.get(&a) else {
                continue;
            };
            if self
                .moves
                .failed
                .get(&a)
                .is_some_and(|(_, at)| now.saturating_duration_since(*at) < retry_after())
            {
                continue;
            }
            for s in &rec.segments {
                if draining(self, s.brick_id) && !self.moves.under_way.contains_key(&s.segment_id) {
                    todo.push((name.clone(), a, s.clone()));
                }
            }
        }
        todo.sort_by(|x, y| x.0.cmp(&y.0));
        for (name, a, s) in todo.into_iter().take(MAX_NAMED_MOVES - busy) {
            if let Err(e) = self.begin_move(&name, a, &s, now) {
                tracing::warn!(segment = %name, "a named segment cannot leave its draining brick yet: {e}");
                self.moves.failed.insert(a, (e.to_string(), now));
            }
        }
    }

    /// Allocate: `T` for source segment `s` of named segment `name` (allocation `a`).
    fn begin_move(&mut self, name: &str, a: u64, s: &SegmentRecord, now: Instant) -> Result<(), PlaneError> {
        let (node, links) = match self.allocations.get(&a) {
            Some(r) => (r.node, r.links.clone()),
            None => return Err(PlaneError::NotFound(format!("segment {name:?} is gone"))),
        };
        let to = self.evacuation_target(node, s.size_bytes, s.bandwidth_bps, links.as_deref())?;
        let bricks = [to];
        let pl = Placement::new(node, s.size_bytes, 1, s.bandwidth_bps, links.as_deref(), Some(&bricks))?;
        let mut counters = self.counters;
        let t = self.place_one(&pl, &mut counters)?;
        if let Err(e) = self.store.commit(&[Op::Put(Record::Counters(counters))]) {
            self.release_segment(&t);
            return Err(e.into());
        }
        self.counters = counters;
        if let Some(b) = self.bricks.get_mut(&t.brick_id) {
            // Listed in the target's replies from now on, so that the brick keeps what it pulls.
            b.segments.insert(t.segment_id, (t.offset, t.size_bytes));
            b.paths.insert(t.segment_id, (t.links.clone(), t.bandwidth_bps));
        }
        tracing::info!(
            segment = %name,
            from = self.brick_name(s.brick_id).unwrap_or("?"),
            to = self.brick_name(t.brick_id).unwrap_or("?"),
            bytes = s.size_bytes,
            "moving a named segment off a draining brick"
        );
        self.moves.under_way.insert(
            s.segment_id,
            NamedMove {
                allocation: a,
                name: name.to_string(),
                source: s.clone(),
                target: t,
                step: Step::Freezing,
                deadline: now + NAMED_MOVE_DEADLINE,
                started: now,
            },
        );
        Ok(())
    }

    /// Transfer: the target's order, with a pull grant of all of `S` signed under a fresh grant
    /// of `S` (the stored one may have expired; this control plane holds the source's key).
    fn pull_order(&self, m: &NamedMove) -> Result<api::MovePull, String> {
        let src = self
            .bricks
            .get(&m.source.brick_id)
            .ok_or_else(|| format!("its brick {} is gone", m.source.brick_id))?;
        let node = self.allocations.get(&m.allocation).map_or(0, |r| r.node);
        let expiry = super::now_unix_ms() / 1000 + PULL_GRANT_LIFETIME_S;
        let g = Grant::sign(
            &src.key,
            m.source.segment_id,
            m.source.offset,
            m.source.size_bytes,
            node,
            rights::READ,
            expiry,
        );
        let (pull, key) = PullGrant::issue(&SegmentGrant::new(&src.key, g), 0, m.source.size_bytes, expiry);
        Ok(api::MovePull {
            segment_id: m.target.segment_id,
            grant_hex: m.target.grant_hex.clone(),
            source: src.rec.address.clone(),
            pull_grant_hex: hex::encode(pull.encode()),
            pull_key_hex: hex::encode(key),
        })
    }

    /// Finalize: the record points at `T` (one store transaction); `S` answers `Moved`.
    fn finalize_move(&mut self, k: u64, now: Instant) {
        let Some(m) = self.moves.under_way.get(&k) else {
            return;
        };
        let Some(mut rec) = self.allocations.get(&m.allocation).cloned() else {
            // Closed by its last holder while it moved: the target goes back.
            self.end_move(k, None, now);
            return;
        };
        let Some(slot) = rec.segments.iter_mut().find(|s| s.segment_id == m.source.segment_id) else {
            self.end_move(k, None, now);
            return;
        };
        *slot = m.target.clone();
        if let Err(e) = self.store.commit(&[Op::Put(Record::Allocation(rec.clone()))]) {
            self.end_move(k, Some(format!("storing the switch failed: {e}")), now);
            return;
        }
        tracing::info!(
            segment = %m.name,
            to = self.brick_name(m.target.brick_id).unwrap_or("?"),
            took_ms = now.saturating_duration_since(m.started).as_millis() as u64,
            "named segment moved"
        );
        let a = m.allocation;
        self.keep(rec);
        self.moves.failed.remove(&a);
        if let Some(m) = self.moves.under_way.get_mut(&k) {
            m.step = Step::Moved {
                until: now + MOVED_GRACE,
            };
        }
    }

    /// Ends move `k`: a moved one frees `S`, any other frees `T` (and `S` is unfrozen by its
    /// brick's next reply). `why` is a failure, shown and logged.
    fn end_move(&mut self, k: u64, why: Option<String>, now: Instant) {
        let Some(m) = self.moves.under_way.remove(&k) else {
            return;
        };
        match m.step {
            Step::Moved { .. } => self.release_segment(&m.source),
            _ => self.release_segment(&m.target),
        }
        if let Some(why) = why {
            tracing::warn!(segment = %m.name, "a named segment's move ended; it stays where it was: {why}");
            if self.allocations.contains_key(&m.allocation) {
                self.moves.failed.insert(m.allocation, (why, now));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plane::tests::{brick, node, plane, M};

    fn holder() -> api::Holder {
        api::Holder {
            agent: "agent-a".into(),
            connection: 1,
            pid: 101,
            uid: 1000,
            start_ticks: 1,
        }
    }

    fn open(p: &mut ControlPlane, n: u64, name: &str) -> api::Segment {
        p.open_named(api::SegmentOpen {
            node: n,
            name: name.into(),
            size_bytes: 4 * M,
            holder: holder(),
        })
        .unwrap()
        .0
        .segment
        .unwrap()
    }

    fn beat(p: &mut ControlPlane, id: u64, stats: api::HeartbeatStats) -> api::HeartbeatReply {
        p.heartbeat(id, Some(stats)).unwrap()
    }

    /// The four steps through heartbeats: the freeze is listed until the source reports it,
    /// the pull only then, the switch only once the target reports the pull whole; the source
    /// answers `Moved` for the grace and is then drained.
    #[test]
    fn a_named_segment_leaves_a_draining_brick_in_four_steps_through_heartbeats() {
        let mut p = plane();
        let b1 = brick(&mut p, "b1", 64 * M);
        let n1 = node(&mut p, "n1");
        let s = open(&mut p, n1, "counter");
        assert_eq!(s.brick_id, b1);
        let b2 = brick(&mut p, "b2", 64 * M);
        p.set_draining(b1, true).unwrap();
        // Allocate and Freeze.
        let r = beat(&mut p, b1, Default::default());
        assert_eq!(r.frozen, vec![s.segment_id]);
        assert!(r.moved.is_empty());
        assert_eq!(p.brick(b1).unwrap().named_moving, vec!["counter".to_string()]);
        let r2 = beat(&mut p, b2, Default::default());
        assert!(r2.pulls.is_empty(), "a pull before the source is frozen");
        let t = r2
            .segments
            .iter()
            .find(|x| x.size_bytes == 4 * M)
            .expect("T listed on the target")
            .id;
        // Frozen: the target is told to pull; the name still points at the source.
        let frozen = api::HeartbeatStats {
            frozen: vec![s.segment_id],
            ..Default::default()
        };
        beat(&mut p, b1, frozen.clone());
        let r2 = beat(&mut p, b2, Default::default());
        assert_eq!(r2.pulls.len(), 1);
        assert_eq!(r2.pulls[0].segment_id, t);
        let pull = PullGrant::decode(&hex::decode(&r2.pulls[0].pull_grant_hex).unwrap()).unwrap();
        assert_eq!((pull.grant.segment_id, pull.offset, pull.len), (s.segment_id, 0, 4 * M));
        assert_eq!(open(&mut p, n1, "counter").segment_id, s.segment_id);
        // Done: the switch.
        let done = api::HeartbeatStats {
            pulls_ended: vec![api::PullEnded {
                segment_id: t,
                bytes: 4 * M,
                error: None,
            }],
            ..Default::default()
        };
        let r2 = beat(&mut p, b2, done);
        assert!(r2.pulls.is_empty());
        let now = open(&mut p, n1, "counter");
        assert_eq!((now.brick_id, now.segment_id), (b2, t));
        let r = beat(&mut p, b1, frozen);
        assert_eq!((r.frozen.len(), r.moved.clone()), (0, vec![s.segment_id]));
        assert!(r.segments.iter().any(|x| x.id == s.segment_id), "S kept for the grace");
        assert!(!p.brick(b1).unwrap().drained);
        // After the grace, S is freed and the brick drained.
        p.end_overdue_moves(Instant::now() + MOVED_GRACE + Duration::from_secs(1));
        assert!(p.brick(b1).unwrap().drained);
        assert!(beat(&mut p, b1, Default::default()).segments.is_empty());
        assert_eq!(p.node(n1).unwrap().allocated_bytes, 4 * M);
    }

    /// A pull that fails ends the move: `T` is freed, `S` unfrozen, the name stays, the
    /// failure is shown; a segment the source cannot freeze likewise.
    #[test]
    fn a_failed_move_leaves_the_segment_where_it_was_and_says_why() {
        let mut p = plane();
        let b1 = brick(&mut p, "b1", 64 * M);
        let n1 = node(&mut p, "n1");
        let s = open(&mut p, n1, "counter");
        let b2 = brick(&mut p, "b2", 64 * M);
        let free = p.brick(b2).unwrap().free_bytes;
        p.set_draining(b1, true).unwrap();
        beat(&mut p, b1, Default::default());
        let frozen = api::HeartbeatStats {
            frozen: vec![s.segment_id],
            ..Default::default()
        };
        beat(&mut p, b1, frozen);
        let t = beat(&mut p, b2, Default::default()).pulls[0].segment_id;
        let failed = api::HeartbeatStats {
            pulls_ended: vec![api::PullEnded {
                segment_id: t,
                bytes: 0,
                error: Some("SourceLost: reset".into()),
            }],
            ..Default::default()
        };
        beat(&mut p, b2, failed);
        assert_eq!(p.brick(b2).unwrap().free_bytes, free, "T freed");
        let v = p.brick(b1).unwrap();
        assert!(v.named_moving.is_empty());
        assert!(
            v.named_waiting[0].starts_with("counter: the pull into brick b2 failed"),
            "{v:?}"
        );
        assert_eq!(open(&mut p, n1, "counter").segment_id, s.segment_id);
        // Not retried at once: the source is served (no freeze listed).
        assert!(beat(&mut p, b1, Default::default()).frozen.is_empty());
        // After the retry delay, a new move; a source that cannot freeze ends it too.
        p.moves.failed.values_mut().for_each(|(_, at)| *at -= retry_after());
        assert_eq!(beat(&mut p, b1, Default::default()).frozen, vec![s.segment_id]);
        let mapped = api::HeartbeatStats {
            unmovable: vec![api::Unmovable {
                segment_id: s.segment_id,
                why: "a process on this brick's host maps it".into(),
            }],
            ..Default::default()
        };
        assert!(beat(&mut p, b1, mapped).frozen.is_empty());
        assert!(p.brick(b1).unwrap().named_waiting[0].contains("maps it"));
        assert_eq!(p.brick(b2).unwrap().free_bytes, free, "T freed");
    }
}
