//! What a brick knows of one connection, and the requests that change it: HELLO (the nonce),
//! ALLOC and ATTACH (authentication and binding to a segment), SHARE and DETACH. Data requests
//! go on to `data`.
//!
//! ATTACH is where a connection earns access: the grant must verify under the brick's key, be
//! unexpired, and come with a proof that the connection holds the grant's session key, bound to
//! the nonce this connection got at HELLO (`docs/control-plane.md`, "Grants and proof of
//! possession"). Each failure has its own status, and the connection is closed.

use crate::data::{data_op, with_segment, Attached};
use crate::onesided::{self, Atomic};
use crate::pool::{Gate, ShareError};
use crate::reply::{err, ok, Reply};
use crate::state::Shared;
use rackmem_proto::{
    constant_time_eq, rights, session_key, verify_attach_proof, BrickInfo, Grant, GrantError, Request, Status, KEY_LEN,
    MAX_PAYLOAD, NONCE_LEN, PAGE_SIZE,
};
use std::net::IpAddr;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// What a brick knows about one connection.
#[derive(Default)]
pub(crate) struct Session {
    /// Returned at HELLO; ATTACH proofs on this connection are bound to it.
    pub(crate) nonce: Option<[u8; NONCE_LEN]>,
    pub(crate) attached: Option<Attached>,
    /// The connection can carry file descriptors (a Unix socket): SHARE is possible.
    pub(crate) passes_fds: bool,
    /// The peer's address (TCP), for the authentication failure table.
    pub(crate) peer: Option<IpAddr>,
    /// An ALLOC or ATTACH succeeded on this connection once: every opcode is allowed, and the
    /// idle timeout replaces the handshake deadline.
    pub(crate) authenticated: bool,
    /// The next ALLOC or ATTACH has had its turn (see `Guard::before_check`) already: the
    /// handshake stage waits for it on a timer rather than in a thread.
    pub(crate) turn_taken: bool,
}

/// Seconds since the Unix epoch (0 for a clock set before it), for grant expiry.
pub(crate) fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Serves one request on the connection of `session` (READ and WRITE come here only when the
/// connection does not serve them from its own buffers).
pub(crate) fn handle(shared: &Shared, session: &mut Session, req: Request) -> Reply {
    match req {
        Request::Hello => hello(shared, session),
        Request::Ping => ok(Vec::new()),
        Request::Stats => ok(shared.stats().encode()),
        Request::Alloc { size_bytes, secret } => alloc(shared, session, size_bytes, &secret),
        Request::Attach { grant: g, proof } => attach(shared, session, &g, &proof),
        Request::AttachPull { pull, proof } => crate::pull::attach_pull(shared, session, &pull, &proof),
        Request::CloneInto { grant: g, proof } => clone_into(shared, session, &g, &proof),
        Request::Pull(order) => crate::pull::pull(shared, session.attached.as_ref(), &order),
        Request::Open {
            name,
            size_bytes,
            secret,
        } => onesided::open(shared, session, &name, size_bytes, &secret),
        Request::Put { offset, data } => onesided::put(shared, session.attached.as_ref(), offset, &data),
        Request::Get { offset, len } => onesided::get(shared, session.attached.as_ref(), offset, len, Vec::new()),
        Request::FetchAdd { offset, value } => {
            onesided::atomic(shared, session.attached.as_ref(), offset, Atomic::FetchAdd(value))
        }
        Request::CompareSwap {
            offset,
            expected,
            desired,
        } => onesided::atomic(
            shared,
            session.attached.as_ref(),
            offset,
            Atomic::CompareSwap { expected, desired },
        ),
        Request::Share => share(shared, session.attached.as_ref(), session.passes_fds),
        Request::Detach => match session.attached.take() {
            Some(a) => {
                shared.store.detach(a.id, &a.gate);
                ok(Vec::new())
            }
            None => err(Status::NotAttached, "not attached", false),
        },
        other => {
            let Some(a) = session.attached.as_ref() else {
                return err(Status::NotAttached, "ATTACH or ALLOC before data requests", true);
            };
            if matches!(other, Request::Clone | Request::CloneLazy) && shared.cfg.managed {
                // The control plane places every segment of a managed brick and accounts for its
                // space; a clone it never heard of would be overwritten by its next placement.
                // Kept open: the node may go on using its segment.
                return err(
                    Status::Denied,
                    "this brick takes its segments from its control plane: CLONE is disabled; \
                     ask the control plane for a new allocation",
                    false,
                );
            }
            with_segment(Some(a), |a, m| data_op(shared, a, m, other))
        }
    }
}

/// HELLO: the brick's description, and this connection's nonce (drawn once), which ATTACH
/// proofs on it are bound to.
fn hello(shared: &Shared, session: &mut Session) -> Reply {
    if session.nonce.is_none() {
        let mut nonce = [0u8; NONCE_LEN];
        // A predictable nonce would let a proof seen on the wire be replayed: no
        // randomness, no HELLO.
        if let Err(e) = getrandom::fill(&mut nonce) {
            return err(
                Status::Internal,
                format!("no randomness for the HELLO nonce: {e}"),
                true,
            );
        }
        session.nonce = Some(nonce);
    }
    ok(BrickInfo {
        pool_bytes: shared.cfg.size_bytes,
        free_bytes: shared.store.segs().free_bytes(),
        page_size: PAGE_SIZE,
        max_payload: MAX_PAYLOAD,
        brick_id: shared.brick_id,
        nonce: session.nonce.unwrap_or_default(),
    }
    .encode())
}

/// ALLOC (standalone mode): checks the shared secret, carves a segment and attaches this
/// connection to it; answers with the segment's grant and session key.
fn alloc(shared: &Shared, session: &mut Session, size_bytes: u64, secret: &[u8]) -> Reply {
    let store = &shared.store;
    let attached = &mut session.attached;
    if shared.cfg.managed {
        return err(
            Status::Denied,
            "this brick takes its segments from its control plane: ALLOC is disabled; \
             ask the control plane for an allocation",
            true,
        );
    }
    if !std::mem::take(&mut session.turn_taken) {
        if let Some(busy) = shared.wait_turn(session.peer) {
            return busy;
        }
    }
    let allowed = shared.cfg.secret.as_ref().is_some_and(|s| constant_time_eq(s, secret));
    if allowed {
        shared.guard.succeeded(session.peer);
    } else {
        shared.guard.failed(session.peer, Instant::now());
        return err(
            Status::Denied,
            "wrong shared secret (or this brick takes grants from a control plane only)",
            true,
        );
    }
    if attached.is_some() {
        return err(Status::BadRequest, "connection already attached to a segment", false);
    }
    if size_bytes == 0 || size_bytes > shared.cfg.size_bytes {
        return err(
            Status::NoSpace,
            format!(
                "cannot carve {size_bytes} bytes from a pool of {}",
                shared.cfg.size_bytes
            ),
            false,
        );
    }
    // ALLOC attaches the requesting connection at once: no grace period needed.
    let carved = {
        let mut segs = store.segs();
        segs.carve(size_bytes, 1, None)
            .and_then(|(id, off, size)| Some((id, off, size, segs.live.get(&id)?.gate.clone())))
    };
    let Some((id, off, size, gate)) = carved else {
        return err(Status::NoSpace, format!("no free extent of {size_bytes} bytes"), false);
    };
    *attached = Some(Attached {
        id,
        offset: off,
        size,
        rights: rights::ALL,
        gate,
        pace: crate::pace::SegmentPace::untracked(),
        only: None,
    });
    ok(shared.grant(id, off, size).encode())
}

/// ATTACH: verifies the grant and its proof of possession (bound to this connection's nonce)
/// and binds the connection to the grant's segment.
fn attach(shared: &Shared, session: &mut Session, g: &Grant, proof: &[u8; KEY_LEN]) -> Reply {
    let attached = &mut session.attached;
    let Some(nonce) = session.nonce else {
        return err(
            Status::BadRequest,
            "ATTACH before HELLO: the attach proof is bound to the nonce HELLO returns; say HELLO first",
            true,
        );
    };
    if !std::mem::take(&mut session.turn_taken) {
        if let Some(busy) = shared.wait_turn(session.peer) {
            return busy;
        }
    }
    let now = now_unix();
    match g.verify(&shared.cfg.key, now) {
        Ok(()) => {}
        Err(GrantError::Expired) => {
            return err(
                Status::GrantExpired,
                format!(
                    "grant for segment {} expired at {} (now {now}); ask its issuer for a new one",
                    g.segment_id, g.expiry_unix_s
                ),
                true,
            )
        }
        Err(GrantError::BadSignature) => {
            shared.guard.failed(session.peer, Instant::now());
            return err(
                Status::GrantInvalid,
                format!(
                    "grant for segment {} does not verify under this brick's key \
                     (forged, altered, or signed for another brick)",
                    g.segment_id
                ),
                true,
            );
        }
    }
    let key = session_key(&shared.cfg.key, g);
    if !verify_attach_proof(&key, &nonce, g.segment_id, proof) {
        shared.guard.failed(session.peer, Instant::now());
        return err(
            Status::GrantUnproven,
            format!(
                "grant for segment {} is not proven: the proof does not match the grant's \
                 session key and this connection's HELLO nonce (a grant is usable only by \
                 whoever holds its session key, on the connection the proof was made for)",
                g.segment_id
            ),
            true,
        );
    }
    shared.guard.succeeded(session.peer);
    if attached.is_some() {
        return err(Status::BadRequest, "connection already attached to a segment", false);
    }
    let gate = match bind(shared, g) {
        Ok(gate) => gate,
        Err(reply) => return reply,
    };
    *attached = Some(Attached {
        id: g.segment_id,
        offset: g.brick_offset,
        size: g.size_bytes,
        rights: g.rights,
        gate,
        // A managed brick's segments are the control plane's, which sets their rates (the
        // grant's, then every heartbeat reply's); a standalone brick's CLONE grants carry none.
        pace: if shared.cfg.managed {
            shared.pacer.segment(g.segment_id, g.rate_bps)
        } else {
            crate::pace::SegmentPace::untracked()
        },
        only: None,
    });
    ok(Vec::new())
}

/// CLONE_INTO (a managed brick's CLONE, for a forked child): the control plane placed and
/// accounted the clone and signed its grant; the connection attached to the parent's segment
/// proves it holds that grant's session key (bound to its HELLO nonce, as ATTACH does), and the
/// brick creates the clone at the grant's range and shares the parent's pages with it
/// copy-on-write. The clone then lives as any managed segment: until the control plane stops
/// listing it. A refusal keeps the connection open (the parent goes on with its segment),
/// except for a grant that is forged or unproven.
fn clone_into(shared: &Shared, session: &mut Session, g: &Grant, proof: &[u8; KEY_LEN]) -> Reply {
    let Some(a) = session.attached.as_ref() else {
        return err(Status::NotAttached, "ATTACH before CLONE_INTO", true);
    };
    if !shared.cfg.managed {
        return err(
            Status::Denied,
            "CLONE_INTO places a control plane's segment; this brick is standalone: use CLONE",
            false,
        );
    }
    if a.only.is_some() || a.rights & rights::READ == 0 {
        return err(
            Status::Forbidden,
            "CLONE_INTO needs a grant that allows reads of the whole segment",
            false,
        );
    }
    let Some(nonce) = session.nonce else {
        return err(Status::BadRequest, "CLONE_INTO before HELLO", true);
    };
    match g.verify(&shared.cfg.key, now_unix()) {
        Ok(()) => {}
        Err(GrantError::Expired) => {
            return err(
                Status::GrantExpired,
                format!(
                    "the clone's grant for segment {} expired at {}",
                    g.segment_id, g.expiry_unix_s
                ),
                false,
            )
        }
        Err(GrantError::BadSignature) => {
            shared.guard.failed(session.peer, Instant::now());
            return err(
                Status::GrantInvalid,
                format!(
                    "the clone's grant for segment {} does not verify under this brick's key",
                    g.segment_id
                ),
                true,
            );
        }
    }
    if !verify_attach_proof(&session_key(&shared.cfg.key, g), &nonce, g.segment_id, proof) {
        shared.guard.failed(session.peer, Instant::now());
        return err(
            Status::GrantUnproven,
            format!(
                "the clone's grant for segment {} is not proven for this connection",
                g.segment_id
            ),
            true,
        );
    }
    let chunk = crate::pool::CHUNK;
    if g.rights & rights::WRITE == 0
        || g.size_bytes != a.size
        || g.segment_id == a.id
        || g.brick_offset % chunk != 0
        || a.offset % chunk != 0
    {
        return err(
            Status::BadRequest,
            format!(
                "segment {} [{:#x}, +{:#x}) cannot be a clone of segment {} [{:#x}, +{:#x}): another segment                  of the same size, chunk aligned, with write rights, is needed",
                g.segment_id, g.brick_offset, g.size_bytes, a.id, a.offset, a.size
            ),
            false,
        );
    }
    // The clone's segment, new (a retry finds it in place and fills it again).
    {
        let live = shared.store.segs().live.get(&g.segment_id).map(|s| (s.offset, s.size));
        match live {
            Some((o, s)) if o == g.brick_offset && s == g.size_bytes => {}
            Some((o, s)) => {
                return err(
                    Status::Conflict,
                    format!(
                        "segment {} lives at [{o:#x}, +{s:#x}) on this brick, but the grant says [{:#x}, +{:#x})",
                        g.segment_id, g.brick_offset, g.size_bytes
                    ),
                    false,
                )
            }
            None => {
                shared.store.supersede(g.segment_id, g.brick_offset, g.size_bytes);
                if let Err(e) = shared.store.segs().claim(g.segment_id, g.brick_offset, g.size_bytes) {
                    return err(Status::Conflict, format!("cannot place the clone: {e}"), false);
                }
            }
        }
    }
    let (id, dst, size) = (g.segment_id, g.brick_offset, g.size_bytes);
    with_segment(Some(a), |a, mem| {
        match &mem.shared {
            // As CLONE does: shared memory has no copy-on-write chunks.
            Some(m) => {
                if let Some(c) = &mem.cow {
                    c.dissolve();
                }
                if let Err(ShareError::Memory(_)) = shared.store.clone_shared(m, id, size) {
                    shared.store.copy_into_pool(m, dst, size);
                }
            }
            None => shared.store.pool.share(a.offset, dst, size),
        }
        ok(Vec::new())
    })
}

/// SHARE: moves the attached segment into shared memory (once) and answers with its descriptor.
pub(crate) fn share(shared: &Shared, attached: Option<&Attached>, passes_fds: bool) -> Reply {
    let Some(a) = attached else {
        return err(Status::NotAttached, "ATTACH or ALLOC before SHARE", true);
    };
    if !passes_fds {
        // Kept open: the node goes on over this link.
        return err(
            Status::Forbidden,
            "SHARE maps a segment into a node on this brick's own host and needs a Unix-socket \
             link to carry the memory's descriptor; this link is TCP: go on with READ and WRITE",
            false,
        );
    }
    if a.rights & (rights::READ | rights::WRITE) != rights::READ | rights::WRITE {
        return err(
            Status::Forbidden,
            "SHARE needs a grant that allows reads and writes",
            false,
        );
    }
    match shared.store.share(a.id, &a.gate, a.offset, a.size) {
        Ok(m) => Reply {
            fd: Some(m),
            ..ok(a.size.to_le_bytes().to_vec())
        },
        Err(ShareError::Released) => err(
            Status::NoSegment,
            format!(
                "segment {} was released by the control plane; ask it for a new allocation",
                a.id
            ),
            true,
        ),
        Err(ShareError::Moving) => crate::moving::refused(a.id, crate::moving::Motion::Frozen),
        Err(e @ ShareError::Memory(_)) => err(Status::Internal, e.to_string(), false),
    }
}

/// Counts one more attachment of the grant's segment, creating it first on a managed brick that
/// has not seen it; returns the segment's gate.
pub(crate) fn bind(shared: &Shared, g: &Grant) -> Result<Gate, Reply> {
    if shared.cfg.managed && !shared.store.segs().live.contains_key(&g.segment_id) {
        // The control plane may reuse a released range before our heartbeat learns of the
        // release: the newer grant settles it.
        shared.store.supersede(g.segment_id, g.brick_offset, g.size_bytes);
    }
    let mut segs = shared.store.segs();
    let seg = match segs.live.get_mut(&g.segment_id) {
        Some(s) if s.offset == g.brick_offset && s.size == g.size_bytes => s,
        Some(s) if shared.cfg.managed => {
            return Err(err(
                Status::Conflict,
                format!(
                    "segment {} lives at [{:#x}, +{:#x}) on this brick, but the grant says [{:#x}, +{:#x})",
                    g.segment_id, s.offset, s.size, g.brick_offset, g.size_bytes
                ),
                true,
            ))
        }
        None if shared.cfg.managed => match segs.claim(g.segment_id, g.brick_offset, g.size_bytes) {
            Ok(s) => s,
            Err(e) => {
                return Err(err(
                    Status::Conflict,
                    format!("cannot place the grant's segment: {e}"),
                    true,
                ))
            }
        },
        _ => {
            return Err(err(
                Status::NoSegment,
                format!("segment {} does not exist on this brick", g.segment_id),
                true,
            ))
        }
    };
    seg.attached += 1;
    seg.unattached_deadline = None;
    Ok(seg.gate.clone())
}
