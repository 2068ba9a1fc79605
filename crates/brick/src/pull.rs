//! Direct brick-to-brick migration (issue 23, seed 001's device-to-device transfer without the
//! host's bounce buffer).
//!
//! Both ends are here. As the *source*, a brick binds a connection with ATTACH_PULL to one
//! range of one segment, read-only: the credential is a [`PullGrant`], the node's delegation,
//! checked with the same care as an ATTACH (the segment's grant under this brick's key, the
//! delegation under the session key derived from it, its expiry, the proof of the pull key
//! against this connection's nonce; failures count towards the peer's authentication
//! throttle). Nothing else opens a segment to another brick: deny by default.
//!
//! As the *target*, a brick serves PULL on a connection attached with write rights: it
//! connects to the source, attaches with the order's pull grant, and reads the pieces with at
//! most [`WINDOW`] reads of at most [`READ_BYTES`] in flight, writing each into its segment
//! before it asks for another. The receiver drives the transfer, so a target that falls behind
//! (a slow pool, a busy segment gate) simply asks for nothing until it catches up: the source
//! never sends what was not asked for, and nothing is dropped or sent twice. A failure ends the
//! pull with its status (`Unreachable` before anything was read, `SourceLost` after); the node
//! then decides (bounce, or give up), never the brick.
//!
//! A target keeps its links to sources between orders ([`PullLinks`]): connecting and HELLO
//! cost more than a small order's transfer (`docs/benchmarks.md`, "Direct migration"). A kept
//! link holds no rights: it is detached after every order, and the next order attaches it
//! with its own pull grant, so a grant's expiry or a source's restart leaves nothing usable
//! behind. Neither costs a round trip: the ATTACH_PULL goes out with the first reads behind it
//! (the source serves a connection's requests in order, so they find it attached or fail as
//! the attach did, and the attach's answer is read first), and the DETACH's answer is not
//! waited for (the next order's ATTACH_PULL comes after it on the same connection). Links are
//! capped ([`MAX_KEPT_LINKS`]) and dropped after [`KEPT_LINK_IDLE`] unused, or at the first
//! failure; a kept link that fails before its ATTACH_PULL is answered (the source
//! restarted, or closed it as idle) is replaced by a fresh connection once.

use crate::data::{with_segment, Attached};
use crate::reply::{err, ok, Reply};
use crate::session::{bind, now_unix, Session};
use crate::state::Shared;
use crate::sync::lock;
use rackmem_proto::{
    rights, verify_attach_proof, Extent, PullError, PullGrant, PullOrder, Status, KEY_LEN, MAX_EXTENTS,
};
use rackmem_transport::{BrickAddr, Link, LinkError};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bytes one read of a pull asks for.
pub(crate) const READ_BYTES: usize = 256 << 10;
/// Reads of a pull in flight at once: with [`READ_BYTES`], at most 2 MiB on its way to this
/// brick per pull (as a node's bulk GET keeps in flight, the link floor it is measured against).
pub(crate) const WINDOW: usize = 8;
/// Longest a pull waits for the source to connect or answer one read.
const SOURCE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most links to sources a target keeps between orders (each is an authenticated connection
/// the source counts against this brick's address; a migration has one order in flight, so a
/// few nodes migrating at once need no more).
pub(crate) const MAX_KEPT_LINKS: usize = 8;
/// A kept link unused for this long is closed at the next order (well under a source's idle
/// timeout, so a kept link is seldom one the source has closed already).
pub(crate) const KEPT_LINK_IDLE: Duration = Duration::from_secs(30);

/// Detached links to source bricks, kept between pull orders, oldest first.
#[derive(Default)]
pub(crate) struct PullLinks {
    idle: Mutex<Vec<Kept>>,
}

struct Kept {
    source: String,
    link: Link,
    since: Instant,
}

impl PullLinks {
    /// A kept link to `source`, if one is fresh; drops the stale ones.
    fn take(&self, source: &str) -> Option<Link> {
        let now = Instant::now();
        let (link, stale) = {
            let mut idle = lock(&self.idle);
            let (keep, stale): (Vec<Kept>, Vec<Kept>) = std::mem::take(&mut *idle)
                .into_iter()
                .partition(|k| now.duration_since(k.since) < KEPT_LINK_IDLE && !k.link.is_broken());
            *idle = keep;
            let link = idle
                .iter()
                .rposition(|k| k.source == source)
                .map(|i| idle.remove(i).link);
            (link, stale)
        };
        // Closed outside the lock: a close may wait on the socket.
        drop(stale);
        link
    }

    /// Keeps a detached link to `source` for the next order; the oldest goes past the cap.
    fn put(&self, source: &str, link: Link) {
        if link.is_broken() {
            return;
        }
        let old = {
            let mut idle = lock(&self.idle);
            let old = if idle.len() >= MAX_KEPT_LINKS {
                Some(idle.remove(0))
            } else {
                None
            };
            idle.push(Kept {
                source: source.to_string(),
                link,
                since: Instant::now(),
            });
            old
        };
        drop(old);
    }
}

/// ATTACH_PULL: binds the connection, read-only, to the pull grant's range of its segment.
pub(crate) fn attach_pull(shared: &Shared, session: &mut Session, pull: &PullGrant, proof: &[u8; KEY_LEN]) -> Reply {
    let Some(nonce) = session.nonce else {
        return err(
            Status::BadRequest,
            "ATTACH_PULL before HELLO: its proof is bound to the nonce HELLO returns; say HELLO first",
            true,
        );
    };
    if !std::mem::take(&mut session.turn_taken) {
        if let Some(busy) = shared.wait_turn(session.peer) {
            return busy;
        }
    }
    let id = pull.grant.segment_id;
    let key = match pull.verify(&shared.cfg.key, now_unix()) {
        Ok(k) => k,
        Err(e) => {
            let status = match e {
                PullError::Grant(rackmem_proto::GrantError::Expired) | PullError::Expired => Status::GrantExpired,
                PullError::Range => Status::OutOfRange,
                _ => Status::GrantInvalid,
            };
            if status != Status::GrantExpired {
                shared.guard.failed(session.peer, Instant::now());
            }
            return err(status, format!("pull of segment {id} refused: {e}"), true);
        }
    };
    if !verify_attach_proof(&key, &nonce, id, proof) {
        shared.guard.failed(session.peer, Instant::now());
        return err(
            Status::GrantUnproven,
            format!(
                "pull of segment {id} is not proven: the proof does not match the pull grant's key \
                 and this connection's HELLO nonce"
            ),
            true,
        );
    }
    shared.guard.succeeded(session.peer);
    if session.attached.is_some() {
        return err(Status::BadRequest, "connection already attached to a segment", false);
    }
    // A pull reads a segment that exists; it never creates one (a managed brick's ATTACH does).
    if !shared.store.segs().live.contains_key(&id) {
        return err(
            Status::NoSegment,
            format!("segment {id} does not exist on this brick"),
            true,
        );
    }
    let gate = match bind(shared, &pull.grant) {
        Ok(g) => g,
        Err(reply) => return reply,
    };
    session.attached = Some(Attached {
        id,
        offset: pull.grant.brick_offset,
        size: pull.grant.size_bytes,
        rights: rights::READ,
        gate,
        pace: crate::pace::SegmentPace::untracked(),
        only: Some((pull.offset, pull.len)),
    });
    ok(Vec::new())
}

/// PULL: copies the order's pieces from its source into the attached segment.
pub(crate) fn pull(shared: &Shared, attached: Option<&Attached>, order: &PullOrder) -> Reply {
    let Some(a) = attached else {
        return err(Status::NotAttached, "ATTACH or ALLOC before PULL", true);
    };
    if a.rights & rights::WRITE == 0 || a.only.is_some() {
        return err(Status::Forbidden, "PULL needs a grant that allows writes", false);
    }
    if let Some(p) = order
        .pieces
        .iter()
        .find(|p| p.dst.checked_add(p.len).is_none_or(|e| e > a.size))
    {
        return crate::data::out_of_range(a, p.dst, p.len);
    }
    let unreachable = |what: &str, e: &dyn std::fmt::Display| {
        err(
            Status::Unreachable,
            format!("cannot reach the source brick {}: {what}: {e}", order.source),
            false,
        )
    };
    let addr: BrickAddr = match order.source.parse() {
        Ok(a) => a,
        Err(e) => return unreachable("its address", &e),
    };
    if matches!(addr, BrickAddr::Tls(..)) {
        // This brick has no CA to check the source's certificate with: the node bounces.
        return unreachable("TLS", &"this brick verifies no peer certificates");
    }
    let refused = |e: LinkError| {
        // The source refused the credential: not a route problem, and never bounced.
        err(
            Status::Forbidden,
            format!("the source brick {} refused the pull: {e}", order.source),
            false,
        )
    };
    // The ATTACH_PULL goes out with the first reads behind it, and the DETACH after the last
    // is not waited for: on a kept link an order costs no round trip to the source besides its
    // reads.
    let fresh = || Link::connect(&addr, SOURCE_TIMEOUT);
    let (src, r) = match shared.pull_links.take(&order.source) {
        Some(kept) => match copy(shared, a, &kept, order) {
            // An answer is the source's word on this grant: a new connection would get the same.
            Err(Failed::Attach(e @ LinkError::Refused { .. })) => return refused(e),
            // The kept link is dead (the source restarted, or closed it as idle): once afresh.
            Err(Failed::Attach(_)) => {
                drop(kept);
                let l = match fresh() {
                    Ok(l) => l,
                    Err(e) => return unreachable("connecting", &e),
                };
                let r = copy(shared, a, &l, order);
                (l, r)
            }
            r => (kept, r),
        },
        None => {
            let l = match fresh() {
                Ok(l) => l,
                Err(e) => return unreachable("connecting", &e),
            };
            let r = copy(shared, a, &l, order);
            (l, r)
        }
    };
    // Detached before it is kept: an idle link holds no rights on the source.
    if r.is_ok() && src.detach_unwaited().is_ok() {
        shared.pull_links.put(&order.source, src);
    }
    match r {
        Ok(bytes) => ok(bytes.to_le_bytes().to_vec()),
        Err(Failed::Attach(e)) => refused(e),
        Err(Failed::Source(e)) => err(
            Status::SourceLost,
            format!("the source brick {} failed during the pull: {e}", order.source),
            false,
        ),
        Err(Failed::Here(reply)) => reply,
    }
}

enum Failed {
    /// The ATTACH_PULL failed: nothing was read.
    Attach(LinkError),
    Source(LinkError),
    Here(Reply),
}

/// One read of a pull: its source extents, and where their bytes go here.
struct Chunk {
    src: Vec<Extent>,
    dst: Vec<(u64, usize)>,
    bytes: usize,
}

/// Cuts the order into reads of at most [`READ_BYTES`].
fn chunks(order: &PullOrder) -> Vec<Chunk> {
    let mut out: Vec<Chunk> = Vec::new();
    let mut cur = Chunk {
        src: Vec::new(),
        dst: Vec::new(),
        bytes: 0,
    };
    for p in &order.pieces {
        let mut done = 0u64;
        while done < p.len {
            let room = READ_BYTES - cur.bytes;
            let n = (p.len - done).min(room as u64) as usize;
            cur.src.push((p.src + done, n as u32));
            cur.dst.push((p.dst + done, n));
            cur.bytes += n;
            done += n as u64;
            if cur.bytes == READ_BYTES || cur.src.len() == MAX_EXTENTS as usize {
                out.push(std::mem::replace(
                    &mut cur,
                    Chunk {
                        src: Vec::new(),
                        dst: Vec::new(),
                        bytes: 0,
                    },
                ));
            }
        }
    }
    if cur.bytes > 0 {
        out.push(cur);
    }
    out
}

/// The transfer: the ATTACH_PULL, then [`WINDOW`] reads in flight, each written here before
/// the next is asked for. The attach's answer is collected before any read's: a read sent
/// behind a refused attach fails, and its answer is dropped.
fn copy(shared: &Shared, a: &Attached, src: &Link, order: &PullOrder) -> Result<u64, Failed> {
    let attach = src
        .submit_attach_pull(&order.pull, &order.key)
        .map_err(Failed::Attach)?;
    let todo = chunks(order);
    let mut next = 0usize;
    let mut inflight = VecDeque::with_capacity(WINDOW);
    let mut attach = Some(attach);
    let mut buf = vec![0u8; READ_BYTES];
    let mut bytes = 0u64;
    loop {
        while inflight.len() < WINDOW && next < todo.len() {
            let c = &todo[next];
            let t = match src.submit_read(&c.src) {
                Ok(t) => t,
                // Behind a failed attach, the attach's answer says why.
                Err(e) => {
                    return Err(match attach.take() {
                        Some(t) => Failed::Attach(t.wait(&mut []).err().unwrap_or(e)),
                        None => Failed::Source(e),
                    })
                }
            };
            inflight.push_back((t, next));
            next += 1;
        }
        if let Some(t) = attach.take() {
            t.wait(&mut []).map_err(Failed::Attach)?;
        }
        let Some((t, i)) = inflight.pop_front() else {
            return Ok(bytes);
        };
        let c = &todo[i];
        t.wait(&mut buf[..c.bytes]).map_err(Failed::Source)?;
        let reply = with_segment(Some(a), |a, mem| {
            let mut at = 0usize;
            for &(off, n) in &c.dst {
                shared.store.write(mem, a.offset, off, &buf[at..at + n]);
                at += n;
            }
            ok(Vec::new())
        });
        if reply.status != Status::Ok {
            return Err(Failed::Here(reply));
        }
        shared
            .counters
            .bytes_written
            .fetch_add(c.bytes as u64, std::sync::atomic::Ordering::Relaxed);
        bytes += c.bytes as u64;
    }
}
