//! What a caller asks a brick for, besides pages: segments (ALLOC, ATTACH, SHARE, DETACH,
//! CLONE), DISCARD, POPULATE, COPY, PING and STATS, and collecting detached tickets.

use crate::addr::BrickAddr;
use crate::error::LinkError;
use crate::link::Link;
use crate::sync::lock;
use crate::ticket::{DetachedTicket, Ticket};
use rackmem_proto::{attach_proof, BrickStats, Grant, Opcode, PullGrant, PullOrder, Request, SegmentGrant, KEY_LEN};
use rackmem_sys::SharedMemory;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl Link {
    pub(crate) fn call(&self, req: &Request) -> Result<Vec<u8>, LinkError> {
        let tag = self.submit(req)?;
        self.wait_for(tag, req.opcode())
    }

    /// Sends a PING and waits for its answer if this link has sent nothing for `idle`; returns
    /// whether it did. A brick closes connections silent for longer than its idle timeout (10
    /// min by default), so an owner whose link may sit idle (a program whose working set fits
    /// its local buffer) calls this periodically with an `idle` well below that, such as
    /// [`KEEPALIVE_INTERVAL`](crate::KEEPALIVE_INTERVAL). Costs one small request per interval on an idle link, nothing on
    /// a busy one. Fails as any request does, breaking the link, when the brick is gone.
    pub fn keep_alive(&self, idle: Duration) -> Result<bool, LinkError> {
        let sent_ms = self.last_sent_ms.load(Ordering::Relaxed);
        let now_ms = self.born.elapsed().as_millis() as u64;
        if now_ms.saturating_sub(sent_ms) < idle.as_millis() as u64 {
            return Ok(false);
        }
        self.ping().map(|_| true)
    }

    /// Standalone mode: carves a segment of at least `size_bytes` (rounded up to the brick's
    /// chunk) with the brick's shared secret, and attaches this link to it. Returns the grant
    /// and its session key, which other links need to attach to the segment.
    pub fn alloc_segment(&self, secret: &[u8], size_bytes: u64) -> Result<SegmentGrant, LinkError> {
        let p = self.call(&Request::Alloc {
            size_bytes,
            secret: secret.to_vec(),
        })?;
        SegmentGrant::decode(&p).map_err(|e| self.lost(format!("bad grant in ALLOC answer: {e}")))
    }

    /// Binds this link to the grant's segment, proving with `session_key` (which never leaves
    /// this process) that it holds the grant, for this connection only. A forged, expired or
    /// unproven grant is refused with its own status and the brick closes the connection.
    pub fn attach(&self, grant: &Grant, session_key: &[u8; KEY_LEN]) -> Result<(), LinkError> {
        let proof = attach_proof(session_key, &self.info.nonce, grant.segment_id);
        self.call(&Request::Attach {
            grant: grant.clone(),
            proof,
        })
        .map(|_| ())
    }

    /// Binds this link, read-only, to the range of a segment a [`PullGrant`] delegates (what a
    /// brick pulling a migration does), proving it holds the pull key `key`. Refused like an
    /// ATTACH when the delegation is forged, altered, expired or unproven.
    pub fn attach_pull(&self, pull: &PullGrant, key: &[u8; KEY_LEN]) -> Result<(), LinkError> {
        let proof = attach_proof(key, &self.info.nonce, pull.grant.segment_id);
        self.call(&Request::AttachPull {
            pull: pull.clone(),
            proof,
        })
        .map(|_| ())
    }

    /// ATTACH_PULL without waiting for its answer: a puller sends its first reads right behind
    /// it (the brick serves a connection's requests in order, so they find the connection
    /// attached, or fail as the attach did). Collect the answer with [`Ticket::wait`] (`&mut []`)
    /// before trusting a read's.
    pub fn submit_attach_pull(&self, pull: &PullGrant, key: &[u8; KEY_LEN]) -> Result<Ticket<'_>, LinkError> {
        let proof = attach_proof(key, &self.info.nonce, pull.grant.segment_id);
        let tag = self.submit(&Request::AttachPull {
            pull: pull.clone(),
            proof,
        })?;
        Ok(Ticket {
            link: self,
            tag,
            op: Opcode::AttachPull,
            len: 0,
            done: false,
        })
    }

    /// Asks the brick to pull pages into the attached segment from another brick (direct
    /// migration); returns the bytes it copied. Waits for the whole order (at most
    /// [`MAX_PULL_BYTES`](rackmem_proto::MAX_PULL_BYTES)).
    pub fn pull(&self, order: &PullOrder) -> Result<u64, LinkError> {
        let mut b = [0u8; 8];
        self.submit_pull(order)?.wait(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// PULL without waiting: several orders of one migration queue on the brick, which serves
    /// them one after another with no round trip to this node between them. The answer (the
    /// bytes copied, little-endian) is collected with [`Ticket::wait`] into 8 bytes.
    pub fn submit_pull(&self, order: &PullOrder) -> Result<Ticket<'_>, LinkError> {
        let tag = self.submit(&Request::Pull(order.clone()))?;
        Ok(Ticket {
            link: self,
            tag,
            op: Opcode::Pull,
            len: 8,
            done: false,
        })
    }

    /// Maps the attached segment into this process: the brick moves it into shared memory and
    /// hands over its descriptor, after which reads and writes of the returned memory *are* reads
    /// and writes of the segment, without a request. Only a brick on this host can do that:
    /// over TCP this fails with [`LinkError::Invalid`] before sending anything.
    pub fn share(&self) -> Result<SharedMemory, LinkError> {
        if !matches!(self.addr, BrickAddr::Unix(_)) {
            return Err(self.invalid(
                "shared memory needs a Unix-socket link to a brick on this host (TCP and TLS cannot carry a \
                 descriptor)"
                    .into(),
            ));
        }
        let _one = lock(&self.share_lock);
        let p = self.call(&Request::Share)?;
        // The descriptor arrived with the response's first bytes, so it is here by now; any
        // other descriptor is not one we asked for.
        let fd = {
            let mut fds = lock(&self.received_fds);
            let fd = fds.pop();
            fds.clear();
            fd
        };
        let (Some(fd), Ok(size)) = (fd, <[u8; 8]>::try_from(p.as_slice())) else {
            return Err(self.lost("SHARE answer without a memory descriptor or size".into()));
        };
        let size = u64::from_le_bytes(size);
        let len = usize::try_from(size).map_err(|_| self.lost(format!("SHARE answer: size {size} too large")))?;
        SharedMemory::open(fd, len).map_err(|e| self.invalid(format!("cannot map the shared segment: {e}")))
    }

    /// Unbinds this link from its segment (the brick frees the segment when nobody is attached).
    pub fn detach(&self) -> Result<(), LinkError> {
        self.call(&Request::Detach).map(|_| ())
    }

    /// DETACH without waiting for its answer, which is dropped when it arrives: the brick
    /// serves it before anything sent later on this connection, so the next request finds the
    /// connection detached all the same.
    pub fn detach_unwaited(&self) -> Result<(), LinkError> {
        let tag = self.submit(&Request::Detach)?;
        self.abandon(tag);
        Ok(())
    }

    /// Copy-on-write clone of the attached segment; the grant (with its session key) is for the
    /// new segment, which the brick frees if nobody attaches to it within its grace period.
    /// Bricks managed by a control plane refuse it (`Denied`).
    pub fn clone_segment(&self) -> Result<SegmentGrant, LinkError> {
        let p = self.call(&Request::Clone)?;
        SegmentGrant::decode(&p).map_err(|e| self.lost(format!("bad grant in CLONE answer: {e}")))
    }

    /// Lazy clone of the attached segment (CLONE_LAZY): nothing is copied until either side
    /// overwrites a page. The caller maps the segment and must call [`Link::unshare`] before it
    /// overwrites any page in its mapping while the clone lives.
    pub fn clone_segment_lazy(&self) -> Result<SegmentGrant, LinkError> {
        let p = self.call(&Request::CloneLazy)?;
        SegmentGrant::decode(&p).map_err(|e| self.lost(format!("bad grant in CLONE_LAZY answer: {e}")))
    }

    /// UNSHARE: every live lazy clone of the attached segment takes its own copy of
    /// `[offset, offset + len)` (page-aligned; 0 bytes: none). Returns the lazy clones still
    /// live.
    pub fn unshare(&self, offset: u64, len: u64) -> Result<u64, LinkError> {
        let p = self.call(&Request::Unshare { offset, len })?;
        let Ok(n) = <[u8; 8]>::try_from(p.as_slice()) else {
            return Err(self.lost(format!("UNSHARE answer of {} bytes", p.len())));
        };
        Ok(u64::from_le_bytes(n))
    }

    /// Copy-on-write clone of the attached segment into the segment of `grant` (a control
    /// plane's clone placed on this brick: see `Opcode::CloneInto`), proving with
    /// `session_key` that this connection holds the clone's grant. The link stays attached to
    /// its own segment.
    pub fn clone_into(&self, grant: &Grant, session_key: &[u8; KEY_LEN]) -> Result<(), LinkError> {
        let proof = attach_proof(session_key, &self.info.nonce, grant.segment_id);
        self.call(&Request::CloneInto {
            grant: grant.clone(),
            proof,
        })
        .map(|_| ())
    }

    /// Waits for a detached ticket's response (see [`Ticket::wait`]); it must come from this link.
    pub fn wait_detached(&self, t: DetachedTicket, out: &mut [u8]) -> Result<(), LinkError> {
        if out.len() != t.len {
            self.abandon(t.tag);
            return Err(self.invalid(format!("{} byte buffer for a response of {} bytes", out.len(), t.len)));
        }
        self.wait_for_into(t.tag, t.op, out)
    }

    /// Drops a detached ticket's response when it arrives; nothing is written to any buffer.
    pub fn abandon_detached(&self, t: DetachedTicket) {
        self.abandon(t.tag);
    }

    /// Zeroes a page-aligned range of the segment and releases its memory on the brick.
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), LinkError> {
        self.call(&Request::Discard { offset, len }).map(|_| ())
    }

    /// Asks the brick to give `[offset, offset + len)` of the segment memory now (POPULATE;
    /// page-aligned), without waiting: the brick of a mapped segment then owns those pages
    /// before this node writes them. Learn the outcome with [`Ticket::wait`] (`&mut []`), or
    /// detach the ticket and abandon it when the answer does not matter.
    pub fn submit_populate(&self, offset: u64, len: u64) -> Result<Ticket<'_>, LinkError> {
        let page = rackmem_proto::PAGE_SIZE as u64;
        if len == 0 || len % page != 0 || offset % page != 0 {
            return Err(self.invalid(format!("populate {offset:#x}+{len:#x} is not a run of whole pages")));
        }
        let tag = self.submit(&Request::Populate { offset, len })?;
        Ok(Ticket {
            link: self,
            tag,
            op: Opcode::Populate,
            len: 0,
            done: false,
        })
    }

    /// Copies `len` bytes from `src` to `dst` within the segment, on the brick (ranges may
    /// overlap, offsets page-aligned).
    pub fn copy_within(&self, src: u64, dst: u64, len: u64) -> Result<(), LinkError> {
        self.call(&Request::Copy { src, dst, len }).map(|_| ())
    }

    /// Round trip time of a PING.
    pub fn ping(&self) -> Result<Duration, LinkError> {
        let t = Instant::now();
        self.call(&Request::Ping)?;
        Ok(t.elapsed())
    }

    /// The brick's counters.
    pub fn stats(&self) -> Result<BrickStats, LinkError> {
        let p = self.call(&Request::Stats)?;
        BrickStats::decode(&p).map_err(|e| self.lost(format!("bad STATS answer: {e}")))
    }
}
