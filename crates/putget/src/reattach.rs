//! A granted named segment whose link breaks comes back by itself (issue 23 item 4): the call
//! that found the link broken re-opens the name through the [`Granter`] (a fresh grant, so an
//! expired one is no obstacle), attaches a new link, puts the new segment under the same
//! handle, and retries the operation where a retry is safe.
//!
//! What is retried: a put or a get whose link broke, whatever happened to its request (a put
//! applied twice writes the same bytes, a get read twice reads them again); any operation the
//! brick *refused* before executing it (not attached, grant expired, busy). What is not: an
//! atomic whose request was sent when the link broke. The brick may have executed it before the
//! answer was lost, and a fetch-add retried would then add twice; bricks keep no per-holder
//! request ids to tell, so such an atomic fails with `EIO` (its outcome unknown, as the header
//! says) and only the *next* call finds the segment attached again. A link the brick closed
//! before the atomic is sent (an idle close) is seen beforehand (a peek at the socket) and
//! re-attached first, so that case sends the atomic once, on the new link.
//!
//! A restarted brick is not the brick the segment lived on: it comes back on the same address
//! with a new identity ([`BrickInfo::brick_id`](rackmem_proto::BrickInfo), random per start)
//! and an empty pool, and a managed brick would carve the segment afresh, zero-filled, from the
//! new grant. Reading that would return zeros in place of the program's data, silently, so the
//! segment is marked lost instead: this call and every later one on the handle fail with
//! `EIO`; the program closes it (and may open the name again, knowingly, to start over).
//!
//! A segment the control plane moves to another brick (`docs/migration.md`, "Named segments")
//! answers `Moving` while it is copied and `Moved` once its name points at the new brick; both
//! mean the request was *not executed*. On `Moving` the call waits ([`MOVING_FIRST_WAIT`],
//! doubling up to [`MOVING_MAX_WAIT`]) and sends it again, for at most [`MOVING_LIMIT`]
//! (then `EAGAIN`, nothing done); on `Moved` it re-attaches as after a broken link (the
//! re-open finds the new brick) and sends it there. Atomics included: neither status executed
//! them, so each is executed exactly once. A segment held under no name (allocated, not
//! opened) cannot follow a move; such an answer fails at once with `EIO`, saying so.
//!
//! Bounds: one re-attach at a time per process (others wait for it, then use its result);
//! tries [`REATTACH_FIRST_DELAY`] apart, doubling up to [`REATTACH_MAX_DELAY`], until
//! [`REATTACH_LIMIT`] has passed since the failure (each try's connection waits at most the
//! engine's link timeout more). After that the call fails with the last error (`EIO` for a brick
//! that stays unreachable).

use crate::engine::{Engine, Granter};
use crate::error::PutGetError;
use crate::segment::Segment;
use rackmem_proto::Status;
use rackmem_transport::LinkError;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a call goes on trying to re-attach its segment after its link broke (plus at most
/// one link timeout for the try under way).
pub const REATTACH_LIMIT: Duration = Duration::from_secs(10);
/// Wait before the second try (the first is at once): a connection reset finds the brick at
/// once, a brick that restarts needs a moment to listen again.
pub const REATTACH_FIRST_DELAY: Duration = Duration::from_millis(50);
/// Longest wait between two tries.
pub const REATTACH_MAX_DELAY: Duration = Duration::from_secs(1);

/// First wait after a `Moving` answer before the request is sent again.
pub const MOVING_FIRST_WAIT: Duration = Duration::from_millis(1);
/// Longest wait between two sends of a request answered `Moving`.
pub const MOVING_MAX_WAIT: Duration = Duration::from_millis(50);
/// Longest a call goes on sending a request answered `Moving` (the control plane ends a move
/// that takes more than 20 s, and the segment is served where it was again).
pub const MOVING_LIMIT: Duration = Duration::from_secs(30);

/// Whether an operation may be sent again after its link broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Sending it twice does what sending it once does (put, get).
    Idempotent,
    /// It may have executed before the link broke and must not be sent twice (the atomics):
    /// retried only when the brick refused it without executing it.
    AtMostOnce,
}

/// How an operation's failure relates to its segment's link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broken {
    /// The brick refused the request before executing it (or it was never sent): the link or
    /// its grant is unusable, and the operation did nothing.
    NotExecuted,
    /// The link broke with the request possibly executed.
    MaybeExecuted,
}

fn broken(e: &PutGetError) -> Option<Broken> {
    match e {
        PutGetError::Link(LinkError::Unreachable { .. }) => Some(Broken::NotExecuted),
        PutGetError::Link(LinkError::Refused {
            // `NoSegment`: the brick no longer has it. A named segment that moved is freed on its
            // old brick after a grace, so a holder idle since finds it gone there; the re-open
            // finds it where it is now (or that the name is gone, which is then the error).
            status: Status::NotAttached | Status::GrantExpired | Status::Busy | Status::Moved | Status::NoSegment,
            ..
        }) => Some(Broken::NotExecuted),
        PutGetError::Link(LinkError::BrickLost { .. }) => Some(Broken::MaybeExecuted),
        _ => None,
    }
}

impl Engine {
    /// Runs `op` on segment `handle`; when it fails because the segment's link broke (or its
    /// grant expired), re-attaches the segment (see the module's doc) and runs `op` again where
    /// `retry` allows, within [`REATTACH_LIMIT`]. A segment whose contents are lost fails with
    /// [`PutGetError::Lost`] from then on.
    pub fn call<T>(
        &self,
        handle: u64,
        retry: Retry,
        op: impl Fn(&Segment) -> Result<T, PutGetError>,
    ) -> Result<T, PutGetError> {
        let mut seg = self.segment(handle)?;
        let mut deadline = None;
        // When a `Moving` or `Moved` answer was first seen, and the next wait on `Moving`.
        let mut moving: Option<Instant> = None;
        let mut wait = MOVING_FIRST_WAIT;
        loop {
            if let Some(why) = seg.lost() {
                return Err(PutGetError::Lost(why.to_string()));
            }
            // An atomic on a link the brick has closed already (an idle close) would be lost
            // unexecuted, but reported like one whose answer was lost: seen beforehand, it is
            // re-attached and sent once.
            let closed = retry == Retry::AtMostOnce && !seg.is_mapped() && seg.name.is_some() && seg.link.peer_closed();
            let e = if closed {
                PutGetError::Link(LinkError::Unreachable {
                    addr: seg.brick().to_string(),
                    cause: "the brick closed the connection".into(),
                })
            } else {
                match op(&seg) {
                    Ok(v) => {
                        if let (Some(since), true) = (moving, verbose()) {
                            eprintln!(
                                "rackmem: segment {:?}: a call waited {:.3} ms for its move to {}",
                                seg.name.as_deref().unwrap_or(""),
                                since.elapsed().as_secs_f64() * 1e3,
                                seg.brick()
                            );
                        }
                        return Ok(v);
                    }
                    Err(e) => e,
                }
            };
            if let Some(status @ (Status::Moving | Status::Moved)) = refused_status(&e) {
                let since = *moving.get_or_insert_with(Instant::now);
                if seg.name.is_none() || self.granter.is_none() {
                    return Err(PutGetError::CannotFollow(format!(
                        "segment {} on {}: the brick answers {status} (the segment moves to another brick), but                          this process holds it under no name to re-open it by; only named segments                          (rackmem_seg_open) move: nothing was done",
                        seg.grant.grant.segment_id,
                        seg.brick()
                    )));
                }
                if status == Status::Moving {
                    if since.elapsed() >= MOVING_LIMIT {
                        return Err(PutGetError::StillMoving(format!(
                            "segment {:?} on {} was still moving to another brick after {MOVING_LIMIT:?}:                              nothing was done; call again",
                            seg.name.as_deref().unwrap_or(""),
                            seg.brick()
                        )));
                    }
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(MOVING_MAX_WAIT);
                    continue;
                }
            }
            let Some(how) = broken(&e) else {
                return Err(e);
            };
            let (Some(name), Some(g)) = (seg.name.clone(), self.granter.clone()) else {
                return Err(e);
            };
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + REATTACH_LIMIT);
            seg = self.reattach(g.as_ref(), handle, &seg, &name, deadline)?;
            if how == Broken::MaybeExecuted && retry == Retry::AtMostOnce {
                return Err(e);
            }
            if Instant::now() >= deadline {
                return Err(e);
            }
        }
    }

    /// The segment under `handle` once it no longer is `old`: re-attached here (tries until
    /// `deadline`), or by another thread meanwhile.
    fn reattach(
        &self,
        g: &dyn Granter,
        handle: u64,
        old: &Arc<Segment>,
        name: &str,
        deadline: Instant,
    ) -> Result<Arc<Segment>, PutGetError> {
        let _one = self.reattaching.lock().unwrap_or_else(|e| e.into_inner());
        let cur = self.segment(handle)?;
        if !Arc::ptr_eq(&cur, old) {
            return Ok(cur);
        }
        let mut delay = REATTACH_FIRST_DELAY;
        loop {
            match self.reattach_once(g, old, name) {
                Ok(new) => {
                    let new = Arc::new(new);
                    let mut segments = self.segments.write().unwrap_or_else(|e| e.into_inner());
                    match segments.get_mut(&handle) {
                        // Freed meanwhile by another thread: the hold just taken goes back.
                        None => {
                            drop(segments);
                            if let Some(a) = new.allocation {
                                let _ = g.give_back(a);
                            }
                            return Err(PutGetError::BadHandle(handle));
                        }
                        Some(slot) => {
                            let _ = new.handle.set(handle);
                            *slot = new.clone();
                        }
                    }
                    drop(segments);
                    // The re-open took a hold (the agent counts a process's opens of one name);
                    // the broken segment's goes back, so the process holds the name once.
                    if let Some(a) = old.allocation {
                        let _ = g.give_back(a);
                    }
                    if verbose() {
                        eprintln!(
                            "rackmem: segment {name:?} re-attached on {} after its link broke or it moved",
                            new.brick()
                        );
                    }
                    return Ok(new);
                }
                Err(e @ PutGetError::Lost(_)) => {
                    let _ = old.lost.set(e.to_string());
                    eprintln!("rackmem: {e}");
                    return Err(e);
                }
                Err(e) => {
                    let now = Instant::now();
                    if now + delay >= deadline {
                        return Err(e);
                    }
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(REATTACH_MAX_DELAY);
                }
            }
        }
    }

    /// One try: the name re-opened (a fresh grant), attached by a new link; refused as
    /// [`PutGetError::Lost`] when the brick at the same address is another brick.
    fn reattach_once(&self, g: &dyn Granter, old: &Segment, name: &str) -> Result<Segment, PutGetError> {
        let granted = g.grant(Some(name), 0)?;
        let r = self.granted_segment(g, &granted, Some(name)).and_then(|new| {
            if &granted.brick == old.brick() && new.brick_id != old.brick_id {
                return Err(PutGetError::Lost(format!(
                    "segment {name:?}: its brick {} restarted (a brick's memory does not survive a restart), \
                     so its contents are lost; close it (and open the name again to start over)",
                    granted.brick
                )));
            }
            Ok(new)
        });
        if r.is_err() {
            let _ = g.give_back(granted.allocation);
        }
        r
    }
}

/// True when `e` is a failure a named segment's call recovers from (a broken link, an expired
/// grant, a move): what [`Engine::call`] re-attaches or waits for.
pub(crate) fn recoverable(e: &PutGetError) -> bool {
    broken(e).is_some() || matches!(refused_status(e), Some(Status::Moving | Status::Moved))
}

/// The status of a brick's refusal.
fn refused_status(e: &PutGetError) -> Option<Status> {
    match e {
        PutGetError::Link(LinkError::Refused { status, .. }) => Some(*status),
        _ => None,
    }
}

fn verbose() -> bool {
    std::env::var("RACKMEM_VERBOSE").is_ok_and(|v| !v.is_empty() && v != "0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rackmem_proto::Opcode;

    fn refused(status: Status) -> PutGetError {
        PutGetError::Link(LinkError::Refused {
            addr: "tcp://b:1".into(),
            op: Opcode::Put,
            status,
            message: String::new(),
        })
    }

    #[test]
    fn only_link_failures_are_retried_and_a_lost_answer_only_where_repeating_is_harmless() {
        let lost = PutGetError::Link(LinkError::BrickLost {
            addr: "tcp://b:1".into(),
            cause: "reset".into(),
        });
        assert_eq!(broken(&lost), Some(Broken::MaybeExecuted));
        assert_eq!(broken(&refused(Status::GrantExpired)), Some(Broken::NotExecuted));
        assert_eq!(broken(&refused(Status::NotAttached)), Some(Broken::NotExecuted));
        assert_eq!(broken(&refused(Status::Moved)), Some(Broken::NotExecuted));
        assert_eq!(broken(&refused(Status::NoSegment)), Some(Broken::NotExecuted));
        assert!(recoverable(&refused(Status::Moving)), "waited for, not re-attached");
        assert_eq!(broken(&refused(Status::Moving)), None);
        // The caller's mistakes and the brick's verdicts are not broken links.
        assert_eq!(broken(&refused(Status::OutOfRange)), None);
        assert_eq!(broken(&refused(Status::NoSpace)), None);
        assert_eq!(broken(&PutGetError::Misaligned(3)), None);
        assert_eq!(broken(&PutGetError::Lost("x".into())), None);
    }
}
