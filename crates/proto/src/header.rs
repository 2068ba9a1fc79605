//! The frame header and the vocabulary it carries: the protocol's constants and limits, [`Opcode`],
//! [`Status`], and [`DecodeError`] for bytes that are not a valid frame.

use crate::bytes::{u16_at, u32_at, u64_at};
use crate::Grant;

/// `"RMEM"` in little-endian byte order.
pub const MAGIC: u32 = u32::from_le_bytes(*b"RMEM");
/// Protocol version of this crate.
pub const VERSION: u8 = 1;
/// Size of the frame header.
pub const HEADER_LEN: usize = 32;
/// Largest payload accepted (checked before allocation).
pub const MAX_PAYLOAD: u32 = 16 << 20;
/// Largest number of extents in one READ/WRITE.
pub const MAX_EXTENTS: u32 = 4096;
/// Page size; extents are multiples of it.
pub const PAGE_SIZE: u32 = 4096;
/// Bit set in `flags` of every response.
pub const FLAG_RESPONSE: u16 = 0x8000;
/// Largest shared secret in an ALLOC.
pub const MAX_SECRET: usize = 1024;
/// Longest segment name in an OPEN.
pub const MAX_NAME: usize = 255;
/// Largest error message in a response.
pub const MAX_MESSAGE: usize = 1024;
/// Length of the per-connection nonce a brick returns at HELLO.
pub const NONCE_LEN: usize = 16;
/// Length of a session key and of an attach proof (HMAC-SHA256 outputs).
pub const KEY_LEN: usize = 32;

/// Operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// Version handshake; the response carries [`BrickInfo`](crate::BrickInfo).
    Hello = 1,
    /// Standalone mode: carve a segment, presenting the brick's shared secret.
    Alloc = 2,
    /// Bind the connection to a segment with a [`Grant`] and a proof of its session key.
    Attach = 3,
    /// Batched read of extents of the attached segment.
    Read = 4,
    /// Batched write.
    Write = 5,
    /// Zero a range and release its memory.
    Discard = 6,
    /// Copy within the attached segment.
    Copy = 7,
    /// Copy-on-write clone of the attached segment; the response carries a [`SegmentGrant`](crate::SegmentGrant).
    Clone = 8,
    /// Unbind from the segment.
    Detach = 9,
    /// Liveness.
    Ping = 10,
    /// Brick statistics.
    Stats = 11,
    /// Map the attached segment directly: the brick moves it into a memory file and sends the
    /// file's descriptor with the response (`SCM_RIGHTS`), so a node on the same host reads and
    /// writes it with memory copies. Unix-socket links only. The response payload is the
    /// segment's size in bytes (u64, little-endian).
    Share = 12,
    /// Give a range of the attached segment memory now, zero-filled where it had none, without
    /// changing its contents. For a segment in shared memory this makes the brick, not the node
    /// that writes the mapping later, the owner Linux charges the pages to; for a pool segment
    /// it does nothing (the pool allocates at the first write). Same layout as DISCARD.
    Populate = 13,
    /// Standalone mode: open the segment registered under a name, carving it first (of
    /// `offset` bytes, rounded up to the brick's chunk) if no live segment has that name, and
    /// attach the connection to it, presenting the brick's shared secret as ALLOC does.
    /// `length` is the name's length; the payload is the name, then the secret. An `offset` of
    /// 0 opens an existing segment only. The response is the segment's
    /// [`SegmentGrant`](crate::SegmentGrant), as for ALLOC. A named segment lives while any
    /// connection is attached to it.
    Open = 14,
    /// One-sided store: the payload's bytes go to byte `offset` of the attached segment (no
    /// alignment required). The response is empty.
    Put = 15,
    /// One-sided load: `length` bytes (at most [`MAX_PAYLOAD`]) from byte `offset` of the
    /// attached segment; the response carries them.
    Get = 16,
    /// Atomic fetch-and-add on the little-endian 8-byte word at `offset` (a multiple of 8) of
    /// the attached segment, executed by the brick; the payload is the addend (u64), the
    /// response the word's previous value (u64). Atomic with respect to every other
    /// FETCH_ADD and COMPARE_SWAP, from any connection, and to atomic instructions of nodes
    /// that map the segment (SHARE).
    FetchAdd = 17,
    /// Atomic compare-and-swap of the 8-byte word at `offset` (a multiple of 8): the payload is
    /// the expected value then the desired one (two u64); the word becomes the desired value if
    /// it held the expected one. The response is the word's previous value (u64), so the swap
    /// happened iff it equals the expected value.
    CompareSwap = 18,
    /// Bind the connection to one range of a segment, read-only, with a
    /// [`PullGrant`](crate::PullGrant) (a node's delegation) and a proof of its pull key: what
    /// a brick pulling a migration says to the source brick. Payload: the pull grant, then the
    /// proof.
    AttachPull = 19,
    /// Copy pages from another brick into the attached segment: the payload is a
    /// [`PullOrder`](crate::PullOrder); the brick connects to its source, attaches with
    /// ATTACH_PULL and reads with a bounded window in flight. The response is the bytes copied
    /// (u64).
    Pull = 20,
    /// Copy-on-write clone of the attached segment into a segment its control plane placed (a
    /// managed brick's CLONE): the payload is the new segment's grant, then the proof of its
    /// session key for this connection's HELLO nonce, as for ATTACH. The brick checks both,
    /// creates the segment at the grant's range, of the attached segment's size, and shares
    /// its pages copy-on-write. The response is empty; the connection stays attached to its
    /// own segment.
    CloneInto = 21,
    /// Lazy clone of the attached segment, for a node that maps it (SHARE) and promises to send
    /// UNSHARE before it overwrites, through its mapping, any page a live lazy clone may still
    /// share. The clone starts empty and shares every page with its source: a page becomes the
    /// clone's own when either side first overwrites it (the brick copies it then, one request
    /// for a run), so the request costs no copy. A segment that is not in shared memory is
    /// cloned as by CLONE (its chunks are copy-on-write already). The response carries a
    /// [`SegmentGrant`](crate::SegmentGrant), as for CLONE.
    CloneLazy = 22,
    /// Copy `[offset, offset + length)` of the attached segment (page-aligned; same layout as
    /// DISCARD) into every live lazy clone that still shares those pages, so that the node may
    /// overwrite them in its mapping. A length of 0 copies nothing. The response is the number
    /// of live lazy clones of the segment (u64), so a node learns when it need not ask again.
    Unshare = 23,
}

impl Opcode {
    /// Decodes an opcode byte.
    pub fn from_u8(v: u8) -> Option<Opcode> {
        use Opcode::*;
        Some(match v {
            1 => Hello,
            2 => Alloc,
            3 => Attach,
            4 => Read,
            5 => Write,
            6 => Discard,
            7 => Copy,
            8 => Clone,
            9 => Detach,
            10 => Ping,
            11 => Stats,
            12 => Share,
            13 => Populate,
            14 => Open,
            15 => Put,
            16 => Get,
            17 => FetchAdd,
            18 => CompareSwap,
            19 => AttachPull,
            20 => Pull,
            21 => CloneInto,
            22 => CloneLazy,
            23 => Unshare,
            _ => return None,
        })
    }

    /// Whether a connection that has not authenticated yet (no successful ALLOC, OPEN or
    /// ATTACH) may send this opcode: the handshake (HELLO, ALLOC, OPEN, ATTACH) and PING. A
    /// brick refuses any other opcode before authentication, without reading its payload.
    pub fn allowed_before_auth(self) -> bool {
        matches!(
            self,
            Opcode::Hello | Opcode::Alloc | Opcode::Open | Opcode::Attach | Opcode::Ping | Opcode::AttachPull
        )
    }

    /// The largest request payload this opcode can carry, so a receiver can refuse a header
    /// that claims more before it reads or allocates anything: the exact size of fixed-size
    /// payloads, [`MAX_SECRET`] for ALLOC, a full extent list for READ, and [`MAX_PAYLOAD`] for
    /// WRITE (extent list and pages).
    pub fn max_request_payload(self) -> u32 {
        use Opcode::*;
        match self {
            Hello | Clone | CloneLazy | Detach | Ping | Stats | Share => 0,
            Alloc => MAX_SECRET as u32,
            Attach | CloneInto => (Grant::RATED_LEN + KEY_LEN) as u32,
            Read => MAX_EXTENT_LIST,
            Write => MAX_PAYLOAD,
            Discard | Populate | Unshare => 8,
            Copy => 24,
            Open => (MAX_NAME + MAX_SECRET) as u32,
            Put => MAX_PAYLOAD,
            Get => 0,
            FetchAdd => 8,
            CompareSwap => 16,
            AttachPull => (crate::PullGrant::MAX_LEN + KEY_LEN) as u32,
            Pull => crate::PullOrder::MAX_LEN as u32,
        }
    }
}

/// Bytes of the largest extent list ([`MAX_EXTENTS`] entries): the largest READ payload.
pub const MAX_EXTENT_LIST: u32 = 4 + MAX_EXTENTS * 12;

/// Response status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// The frame or payload is malformed.
    BadRequest = 1,
    /// A data operation before ATTACH.
    NotAttached = 2,
    /// An extent is outside the attached segment.
    OutOfRange = 3,
    /// The grant's signature does not verify (forged, or for another brick).
    GrantInvalid = 4,
    /// The grant has expired.
    GrantExpired = 5,
    /// Not enough free space for the segment.
    NoSpace = 6,
    /// The shared secret is wrong or the brick has none.
    Denied = 7,
    /// The segment does not exist (any more).
    NoSegment = 8,
    /// The grant does not allow this operation.
    Forbidden = 9,
    /// The brick failed.
    Internal = 10,
    /// The brick does not speak this version.
    BadVersion = 11,
    /// The grant verifies but the connection did not prove it holds the grant's session key
    /// (no proof, or a proof for another grant or another connection's nonce).
    GrantUnproven = 12,
    /// The grant's range cannot become a segment here: it overlaps a live segment, lies outside
    /// the pool, or contradicts the segment already known under its id.
    Conflict = 13,
    /// The brick refuses this now because of one of its limits: too many connections (in total
    /// or from this peer), or too many recent authentication failures from this peer. The
    /// message says which and what to do; the connection is closed. Retrying later may work.
    Busy = 14,
    /// PULL: the target brick could not reach the source brick (no route, refused, or an
    /// address it cannot use, such as TLS without a CA): nothing was copied; the node moves
    /// the pages itself.
    Unreachable = 15,
    /// PULL: the source brick failed or went away while pages were being pulled: some may have
    /// been copied, none is valid.
    SourceLost = 16,
    /// A data request on a named segment that the control plane is moving to another brick
    /// (frozen): the request was *not executed*; the same request succeeds once the move ends
    /// (here if it failed, on the new brick after `Moved`). Holders wait and resend.
    Moving = 17,
    /// A data request on a named segment that has moved to another brick: *not executed*; the
    /// holder re-opens the name (the control plane gives it the new brick) and resends there.
    Moved = 18,
}

impl Status {
    /// Every status, in code order.
    pub const ALL: [Status; 19] = [
        Status::Ok,
        Status::BadRequest,
        Status::NotAttached,
        Status::OutOfRange,
        Status::GrantInvalid,
        Status::GrantExpired,
        Status::NoSpace,
        Status::Denied,
        Status::NoSegment,
        Status::Forbidden,
        Status::Internal,
        Status::BadVersion,
        Status::GrantUnproven,
        Status::Conflict,
        Status::Busy,
        Status::Unreachable,
        Status::SourceLost,
        Status::Moving,
        Status::Moved,
    ];

    /// The code on the wire.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Decodes a status; a code this side does not know reads as [`Status::Internal`].
    pub fn from_u32(v: u32) -> Status {
        use Status::*;
        match v {
            0 => Ok,
            1 => BadRequest,
            2 => NotAttached,
            3 => OutOfRange,
            4 => GrantInvalid,
            5 => GrantExpired,
            6 => NoSpace,
            7 => Denied,
            8 => NoSegment,
            9 => Forbidden,
            11 => BadVersion,
            12 => GrantUnproven,
            13 => Conflict,
            14 => Busy,
            15 => Unreachable,
            16 => SourceLost,
            17 => Moving,
            18 => Moved,
            _ => Internal,
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than the structure needs.
    #[error("truncated frame: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// Not a rackmem frame.
    #[error("bad magic {0:#010x} (not a rackmem peer?)")]
    BadMagic(u32),
    /// Another protocol version.
    #[error("unsupported protocol version {0} (this side speaks {VERSION})")]
    BadVersion(u8),
    /// Unknown operation.
    #[error("unknown opcode {0}")]
    BadOpcode(u8),
    /// Payload larger than [`MAX_PAYLOAD`].
    #[error("payload of {0} bytes exceeds the limit of {MAX_PAYLOAD}")]
    TooLong(u32),
    /// Too many extents.
    #[error("{0} extents exceed the limit of {MAX_EXTENTS}")]
    TooManyExtents(u32),
    /// An extent is not page-aligned or empty.
    #[error("extent at {offset:#x}+{len:#x} is not a non-empty run of whole pages")]
    Misaligned {
        /// Offset.
        offset: u64,
        /// Length.
        len: u32,
    },
    /// Payload length does not match its contents.
    #[error("payload of {have} bytes where {want} were expected")]
    PayloadSize {
        /// Expected.
        want: usize,
        /// Present.
        have: usize,
    },
    /// A field value is out of its domain.
    #[error("invalid field: {0}")]
    Invalid(&'static str),
    /// An ATTACH carrying a grant but no proof of possession: a client older than session keys.
    #[error(
        "ATTACH carries a grant but no proof of possession ({} bytes where {} are expected); \
         the client predates session keys: upgrade it",
        Grant::LEN,
        Grant::LEN + KEY_LEN
    )]
    MissingProof,
}

/// The fixed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Operation.
    pub opcode: Opcode,
    /// Flags ([`FLAG_RESPONSE`]).
    pub flags: u16,
    /// Request tag, echoed by the response.
    pub tag: u32,
    /// Status ([`Status`]) in responses, 0 in requests.
    pub status: u32,
    /// Operation-specific offset.
    pub offset: u64,
    /// Operation-specific length.
    pub length: u32,
    /// Bytes following the header.
    pub payload_len: u32,
}

impl Header {
    /// Encodes into 32 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[5] = self.opcode as u8;
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..12].copy_from_slice(&self.tag.to_le_bytes());
        b[12..16].copy_from_slice(&self.status.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..28].copy_from_slice(&self.length.to_le_bytes());
        b[28..32].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    /// Decodes and validates a header; the payload length is checked against [`MAX_PAYLOAD`]
    /// before anyone allocates for it.
    pub fn decode(b: &[u8]) -> Result<Header, DecodeError> {
        if b.len() < HEADER_LEN {
            return Err(DecodeError::Truncated {
                need: HEADER_LEN,
                have: b.len(),
            });
        }
        let magic = u32_at(b, 0);
        if magic != MAGIC {
            return Err(DecodeError::BadMagic(magic));
        }
        if b[4] != VERSION {
            return Err(DecodeError::BadVersion(b[4]));
        }
        let opcode = Opcode::from_u8(b[5]).ok_or(DecodeError::BadOpcode(b[5]))?;
        let payload_len = u32_at(b, 28);
        if payload_len > MAX_PAYLOAD {
            return Err(DecodeError::TooLong(payload_len));
        }
        Ok(Header {
            opcode,
            flags: u16_at(b, 6),
            tag: u32_at(b, 8),
            status: u32_at(b, 12),
            offset: u64_at(b, 16),
            length: u32_at(b, 24),
            payload_len,
        })
    }

    /// True for responses.
    pub fn is_response(&self) -> bool {
        self.flags & FLAG_RESPONSE != 0
    }

    /// What a header that [`Header::decode`] refused claims to be, for the answer that tells its
    /// sender why: the opcode it names (`Ping` if none) and its tag, with the status that fits
    /// the error (`BadVersion` for a client of another version, `BadRequest` otherwise).
    pub fn refusal(b: &[u8; HEADER_LEN], e: &DecodeError) -> (Opcode, u32, Status) {
        let status = match e {
            DecodeError::BadVersion(_) => Status::BadVersion,
            _ => Status::BadRequest,
        };
        (Opcode::from_u8(b[5]).unwrap_or(Opcode::Ping), u32_at(b, 8), status)
    }

    /// The payload length a buffered header claims, unchecked (`None` while fewer than
    /// [`HEADER_LEN`] bytes are buffered): how much a reader must buffer before the frame is
    /// whole. [`Header::decode`] checks it.
    pub fn claimed_payload_len(b: &[u8]) -> Option<u32> {
        (b.len() >= HEADER_LEN).then(|| u32_at(b, 28))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_header_is_answered_with_what_it_claims() {
        let h = Header {
            opcode: Opcode::Read,
            flags: 0,
            tag: 77,
            status: 0,
            offset: 0,
            length: 4096,
            payload_len: 5,
        };
        let mut b = h.encode();
        assert_eq!(Header::claimed_payload_len(&b), Some(5));
        assert_eq!(Header::claimed_payload_len(&b[..HEADER_LEN - 1]), None);
        b[4] = VERSION + 1;
        let e = Header::decode(&b).unwrap_err();
        assert_eq!(Header::refusal(&b, &e), (Opcode::Read, 77, Status::BadVersion));
        b[4] = VERSION;
        b[5] = 0xee;
        let e = Header::decode(&b).unwrap_err();
        assert_eq!(Header::refusal(&b, &e), (Opcode::Ping, 77, Status::BadRequest));
    }

    #[test]
    fn header_validation() {
        let good = Header {
            opcode: Opcode::Read,
            flags: 0,
            tag: 7,
            status: 0,
            offset: 0,
            length: 0,
            payload_len: 16,
        }
        .encode();
        assert!(Header::decode(&good).is_ok());
        let mut bad = good;
        bad[0] = b'X';
        assert!(matches!(Header::decode(&bad), Err(DecodeError::BadMagic(_))));
        let mut bad = good;
        bad[4] = 9;
        assert_eq!(Header::decode(&bad), Err(DecodeError::BadVersion(9)));
        let mut bad = good;
        bad[28..32].copy_from_slice(&(MAX_PAYLOAD + 1).to_le_bytes());
        assert_eq!(Header::decode(&bad), Err(DecodeError::TooLong(MAX_PAYLOAD + 1)));
        assert!(matches!(
            Header::decode(&good[..10]),
            Err(DecodeError::Truncated { .. })
        ));
    }
}
