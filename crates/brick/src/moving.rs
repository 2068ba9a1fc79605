//! A named segment moving to another brick while its holders run (issue 23 item 4;
//! `docs/migration.md`, "Named segments"). The control plane drives the move through this
//! brick's heartbeat replies, so it needs no way in to the brick; this module is the brick's
//! half, both ends.
//!
//! *As the source*, a reply lists the segments to freeze and those that have moved.
//! [`apply`] sets each one's [`Motion`] under its gate's write lock, which waits out the
//! requests under way on it: once the next heartbeat reports a segment frozen, no node request
//! can change it any more. From then on `with_segment` answers `Moving` (or `Moved`) without
//! executing anything; reads of pull connections (ATTACH_PULL) are served, since they are how
//! the segment leaves. A segment that a process on this host maps (SHARE) cannot be frozen: its
//! holders' stores are the processor's, which nothing here can refuse. It is reported
//! unmovable and left as it is, and the control plane leaves it too.
//!
//! *As the target*, a reply lists pulls. Each runs on a thread of its own (at most
//! [`MAX_CONTROL_PULLS`] at once): it binds the target segment from its grant, checked under
//! this brick's key as an ATTACH's would be, and copies the source segment with the direct pull
//! of `pull.rs` in orders of at most [`MAX_PULL_BYTES`]. Its outcome is reported in every
//! heartbeat until the replies stop listing the pull (a lost heartbeat loses nothing).

use crate::data::Attached;
use crate::reply::{err, Reply};
use crate::session::{bind, now_unix};
use crate::state::Shared;
use crate::sync::lock;
use rackmem_proto::{rights, Grant, PullGrant, PullOrder, PullPiece, Status, KEY_LEN, MAX_PULL_BYTES};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// Most pulls the control plane's orders run at once on this brick (each one thread, one link
/// to its source and at most 2 MiB in flight).
pub const MAX_CONTROL_PULLS: usize = 4;

/// Where a segment is in a move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Motion {
    /// Served as usual.
    #[default]
    Still,
    /// Being copied to another brick: node requests are answered `Moving`, not executed.
    Frozen,
    /// Its holders' name points at another brick now: requests are answered `Moved`.
    Moved,
}

/// The refusal of a request on segment `id` in `motion`: not executed, the connection kept.
pub(crate) fn refused(id: u64, motion: Motion) -> Reply {
    match motion {
        Motion::Moved => err(
            Status::Moved,
            format!("segment {id} has moved to another brick: not executed; open its name again"),
            false,
        ),
        _ => err(
            Status::Moving,
            format!("segment {id} is moving to another brick: not executed; send it again shortly"),
            false,
        ),
    }
}

/// A pull the control plane orders: copy the whole source segment into the target segment.
#[derive(Clone)]
pub struct PullSpec {
    /// The target segment's grant, signed with this brick's key (its id, range and rights).
    pub target: Grant,
    /// The source brick's address.
    pub source: String,
    /// The delegation the source checks: the source segment's grant and the range to read.
    pub pull: PullGrant,
    /// The pull key, proven to the source against its HELLO nonce.
    pub key: [u8; KEY_LEN],
}

// Hand-written so the pull key never lands in a log.
impl std::fmt::Debug for PullSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullSpec")
            .field("target", &self.target.segment_id)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// How a pull ordered by the control plane ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullOutcome {
    /// The target segment.
    pub segment_id: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Why it failed; `None`: the target holds the whole source.
    pub error: Option<String>,
}

/// What a heartbeat tells the control plane of moves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MoveReport {
    /// Live segments frozen (or moved) now: no node request changes them.
    pub frozen: Vec<u64>,
    /// Segments the control plane asked to freeze that cannot be, and why.
    pub unmovable: Vec<(u64, String)>,
    /// Pulls that ended.
    pub pulls: Vec<PullOutcome>,
}

/// The brick's moves: what it was told last, pulls running and ended.
#[derive(Default)]
pub(crate) struct Moves {
    inner: Mutex<MovesInner>,
}

#[derive(Default)]
struct MovesInner {
    frozen: BTreeSet<u64>,
    unmovable: BTreeMap<u64, String>,
    running: BTreeSet<u64>,
    done: BTreeMap<u64, PullOutcome>,
}

/// Applies a heartbeat reply's moves: `frozen` and `moved` segments (every other one is
/// served as usual), and `pulls` to run here.
pub(crate) fn apply(shared: &Arc<Shared>, frozen: &[u64], moved: &[u64], pulls: Vec<PullSpec>) {
    // Only the segments listed now or frozen before can change: most replies list none, and
    // then no gate is touched.
    let mut ids: BTreeSet<u64> = lock(&shared.moves.inner).frozen.clone();
    ids.extend(frozen.iter().chain(moved).copied());
    let gates: Vec<(u64, crate::pool::Gate)> = {
        let segs = shared.store.segs();
        ids.iter()
            .filter_map(|id| segs.live.get(id).map(|s| (*id, s.gate.clone())))
            .collect()
    };
    let mut now_frozen = BTreeSet::new();
    let mut unmovable = BTreeMap::new();
    for (id, gate) in gates {
        let want = if moved.contains(&id) {
            Motion::Moved
        } else if frozen.contains(&id) {
            Motion::Frozen
        } else {
            Motion::Still
        };
        let cur = gate.read().unwrap_or_else(|e| e.into_inner()).motion;
        let motion = if cur == want {
            want
        } else {
            // The write side waits for every request under way on the segment.
            let mut g = gate.write().unwrap_or_else(|e| e.into_inner());
            if want != Motion::Still && g.shared.is_some() {
                unmovable.insert(
                    id,
                    "a process on this brick's host maps it (shared memory): its stores cannot be refused".to_string(),
                );
                g.motion = Motion::Still;
            } else {
                g.motion = want;
            }
            g.motion
        };
        if motion != Motion::Still {
            now_frozen.insert(id);
        }
    }
    let listed: BTreeSet<u64> = pulls.iter().map(|p| p.target.segment_id).collect();
    let mut start = Vec::new();
    {
        let mut m = lock(&shared.moves.inner);
        m.frozen = now_frozen;
        m.unmovable = unmovable;
        m.done.retain(|id, _| listed.contains(id));
        for p in pulls {
            let id = p.target.segment_id;
            if m.running.len() >= MAX_CONTROL_PULLS {
                break;
            }
            if m.running.contains(&id) || m.done.contains_key(&id) {
                continue;
            }
            m.running.insert(id);
            start.push(p);
        }
    }
    for p in start {
        let id = p.target.segment_id;
        let sh = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("rackmem-move-pull".to_string())
            .spawn(move || {
                let r = run_pull(&sh, &p);
                let outcome = match r {
                    Ok(bytes) => PullOutcome {
                        segment_id: id,
                        bytes,
                        error: None,
                    },
                    Err(e) => PullOutcome {
                        segment_id: id,
                        bytes: 0,
                        error: Some(e),
                    },
                };
                let mut m = lock(&sh.moves.inner);
                m.running.remove(&id);
                m.done.insert(id, outcome);
            });
        if let Err(e) = spawned {
            let mut m = lock(&shared.moves.inner);
            m.running.remove(&id);
            m.done.insert(
                id,
                PullOutcome {
                    segment_id: id,
                    bytes: 0,
                    error: Some(format!("cannot start a thread for the pull: {e}")),
                },
            );
        }
    }
}

/// What the next heartbeat reports.
pub(crate) fn report(shared: &Shared) -> MoveReport {
    let m = lock(&shared.moves.inner);
    MoveReport {
        frozen: m.frozen.iter().copied().collect(),
        unmovable: m.unmovable.iter().map(|(&id, why)| (id, why.clone())).collect(),
        pulls: m.done.values().cloned().collect(),
    }
}

/// Copies the source segment into the target segment; the bytes copied.
fn run_pull(shared: &Shared, spec: &PullSpec) -> Result<u64, String> {
    let g = &spec.target;
    g.verify(&shared.cfg.key, now_unix())
        .map_err(|e| format!("the target segment {}'s grant: {e}", g.segment_id))?;
    if g.rights & rights::WRITE == 0 {
        return Err(format!("the target segment {}'s grant allows no writes", g.segment_id));
    }
    if !shared.cfg.managed {
        return Err("this brick is not managed by a control plane".to_string());
    }
    let gate = bind(shared, g).map_err(|r| reply_text(&r))?;
    let a = Attached {
        id: g.segment_id,
        offset: g.brick_offset,
        size: g.size_bytes,
        rights: rights::ALL,
        gate: gate.clone(),
        pace: crate::pace::SegmentPace::untracked(),
        only: None,
    };
    let mut at = 0u64;
    let r = loop {
        if at >= g.size_bytes {
            break Ok(at);
        }
        let len = (g.size_bytes - at).min(MAX_PULL_BYTES);
        let order = PullOrder {
            source: spec.source.clone(),
            pull: spec.pull.clone(),
            key: spec.key,
            pieces: vec![PullPiece { dst: at, src: at, len }],
        };
        let reply = crate::pull::pull(shared, Some(&a), &order);
        if reply.status != Status::Ok {
            break Err(format!("after {at} bytes: {}", reply_text(&reply)));
        }
        at += len;
    };
    shared.store.detach(g.segment_id, &gate);
    r
}

fn reply_text(r: &Reply) -> String {
    format!("{}: {}", r.status, String::from_utf8_lossy(&r.payload))
}
