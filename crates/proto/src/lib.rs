//! The rackmem wire protocol between nodes and memory bricks. Pure encoding and decoding: no
//! sockets, no threads, so it can be fuzzed and property-tested in isolation.
//!
//! Every frame is a fixed 32-byte little-endian [`Header`] followed by `payload_len` bytes.
//! Requests carry a client-chosen tag that the response echoes, so a pipelined link may match
//! responses out of order. Page data moves in batches: one READ or WRITE names up to
//! [`MAX_EXTENTS`] page-aligned extents. A brick trusts nothing in a frame: [`Header::decode`]
//! validates magic, version, opcode and lengths before the payload is read or allocated, and
//! [`Request::decode`] validates the payload's structure. Grants are HMAC-SHA256 signed, and a
//! connection proves it holds a grant's session key ([`session_key`], [`attach_proof`]) bound to
//! the nonce of its own HELLO, so a grant seen on the wire cannot be used by someone else.
//! The format is documented in `docs/protocol.md`.

use hmac::{Hmac, Mac};
use sha2::Sha256;

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
    /// Version handshake; the response carries [`BrickInfo`].
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
    /// Copy-on-write clone of the attached segment; the response carries a [`SegmentGrant`].
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
            _ => return None,
        })
    }

    /// Whether a connection that has not authenticated yet (no successful ALLOC or ATTACH) may
    /// send this opcode: the handshake (HELLO, ALLOC, ATTACH) and PING. A brick refuses any
    /// other opcode before authentication, without reading its payload.
    pub fn allowed_before_auth(self) -> bool {
        matches!(self, Opcode::Hello | Opcode::Alloc | Opcode::Attach | Opcode::Ping)
    }

    /// The largest request payload this opcode can carry, so a receiver can refuse a header
    /// that claims more before it reads or allocates anything: the exact size of fixed-size
    /// payloads, [`MAX_SECRET`] for ALLOC, a full extent list for READ, and [`MAX_PAYLOAD`] for
    /// WRITE (extent list and pages).
    pub fn max_request_payload(self) -> u32 {
        use Opcode::*;
        match self {
            Hello | Clone | Detach | Ping | Stats | Share => 0,
            Alloc => MAX_SECRET as u32,
            Attach => (Grant::LEN + KEY_LEN) as u32,
            Read => MAX_EXTENT_LIST,
            Write => MAX_PAYLOAD,
            Discard | Populate => 8,
            Copy => 24,
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
}

impl Status {
    /// Every status, in code order.
    pub const ALL: [Status; 15] = [
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

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(array_at(b, o))
}
fn array_at<const N: usize>(b: &[u8], o: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[o..o + N]);
    a
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
}

/// What a brick tells a client at HELLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrickInfo {
    /// Pool size in bytes.
    pub pool_bytes: u64,
    /// Free bytes now.
    pub free_bytes: u64,
    /// Page size.
    pub page_size: u32,
    /// Largest payload accepted.
    pub max_payload: u32,
    /// Brick identity (random per start).
    pub brick_id: u64,
    /// Random per connection: an ATTACH proof on this connection is bound to it, so a proof seen
    /// on the wire cannot be replayed on another connection.
    pub nonce: [u8; NONCE_LEN],
}

impl BrickInfo {
    /// Encoded length.
    pub const LEN: usize = 32 + NONCE_LEN;
    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::LEN);
        v.extend_from_slice(&self.pool_bytes.to_le_bytes());
        v.extend_from_slice(&self.free_bytes.to_le_bytes());
        v.extend_from_slice(&self.page_size.to_le_bytes());
        v.extend_from_slice(&self.max_payload.to_le_bytes());
        v.extend_from_slice(&self.brick_id.to_le_bytes());
        v.extend_from_slice(&self.nonce);
        v
    }
    /// Decodes.
    pub fn decode(b: &[u8]) -> Result<BrickInfo, DecodeError> {
        exact(b, Self::LEN)?;
        Ok(BrickInfo {
            pool_bytes: u64_at(b, 0),
            free_bytes: u64_at(b, 8),
            page_size: u32_at(b, 16),
            max_payload: u32_at(b, 20),
            brick_id: u64_at(b, 24),
            nonce: array_at(b, 32),
        })
    }
}

fn exact(b: &[u8], want: usize) -> Result<(), DecodeError> {
    if b.len() == want {
        Ok(())
    } else {
        Err(DecodeError::PayloadSize { want, have: b.len() })
    }
}

/// Brick-wide counters, returned by STATS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BrickStats {
    /// Bytes served by READ.
    pub bytes_read: u64,
    /// Bytes stored by WRITE.
    pub bytes_written: u64,
    /// Requests handled.
    pub requests: u64,
    /// Connections open now.
    pub connections: u64,
    /// Requests refused or malformed.
    pub errors: u64,
    /// Bytes of pool memory allocated now.
    pub resident_bytes: u64,
    /// Live segments.
    pub segments: u64,
    /// Free bytes.
    pub free_bytes: u64,
}

impl BrickStats {
    /// Encoded length.
    pub const LEN: usize = 64;
    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        [
            self.bytes_read,
            self.bytes_written,
            self.requests,
            self.connections,
            self.errors,
            self.resident_bytes,
            self.segments,
            self.free_bytes,
        ]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
    }
    /// Decodes.
    pub fn decode(b: &[u8]) -> Result<BrickStats, DecodeError> {
        exact(b, Self::LEN)?;
        let f = |i: usize| u64_at(b, i * 8);
        Ok(BrickStats {
            bytes_read: f(0),
            bytes_written: f(1),
            requests: f(2),
            connections: f(3),
            errors: f(4),
            resident_bytes: f(5),
            segments: f(6),
            free_bytes: f(7),
        })
    }
}

/// Rights a grant gives.
pub mod rights {
    /// READ.
    pub const READ: u8 = 1;
    /// WRITE, DISCARD, COPY.
    pub const WRITE: u8 = 2;
    /// CLONE.
    pub const CLONE: u8 = 4;
    /// Everything.
    pub const ALL: u8 = READ | WRITE | CLONE;
}

/// A brick's permission for one node to use one segment, signed with the brick's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Segment identity on the brick.
    pub segment_id: u64,
    /// Where the segment starts in the brick's pool.
    pub brick_offset: u64,
    /// Segment size.
    pub size_bytes: u64,
    /// Node the grant is for.
    pub node: u64,
    /// [`rights`] bits.
    pub rights: u8,
    /// Seconds since the Unix epoch after which the grant is void (0 = never).
    pub expiry_unix_s: u64,
    /// HMAC-SHA256 over the fields above.
    pub mac: [u8; 32],
}

/// Why a grant is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    /// The signature does not verify.
    #[error("grant signature does not verify (forged, altered, or signed by another brick)")]
    BadSignature,
    /// The grant expired.
    #[error("grant expired")]
    Expired,
}

impl Grant {
    /// Encoded length.
    pub const LEN: usize = 8 * 5 + 1 + 32;

    fn signed_bytes(&self) -> [u8; 41] {
        let mut b = [0u8; 41];
        b[0..8].copy_from_slice(&self.segment_id.to_le_bytes());
        b[8..16].copy_from_slice(&self.brick_offset.to_le_bytes());
        b[16..24].copy_from_slice(&self.size_bytes.to_le_bytes());
        b[24..32].copy_from_slice(&self.node.to_le_bytes());
        b[32] = self.rights;
        b[33..41].copy_from_slice(&self.expiry_unix_s.to_le_bytes());
        b
    }

    fn compute_mac(&self, key: &[u8]) -> Hmac<Sha256> {
        let mut m = hmac(key);
        m.update(b"rackmem-grant-v1");
        m.update(&self.signed_bytes());
        m
    }

    /// Builds and signs a grant.
    pub fn sign(
        key: &[u8],
        segment_id: u64,
        brick_offset: u64,
        size_bytes: u64,
        node: u64,
        rights: u8,
        expiry_unix_s: u64,
    ) -> Grant {
        let mut g = Grant {
            segment_id,
            brick_offset,
            size_bytes,
            node,
            rights,
            expiry_unix_s,
            mac: [0; 32],
        };
        g.mac = g.compute_mac(key).finalize().into_bytes().into();
        g
    }

    /// Verifies the signature (in constant time) and the expiry.
    pub fn verify(&self, key: &[u8], now_unix_s: u64) -> Result<(), GrantError> {
        self.compute_mac(key)
            .verify_slice(&self.mac)
            .map_err(|_| GrantError::BadSignature)?;
        if self.expiry_unix_s != 0 && now_unix_s > self.expiry_unix_s {
            return Err(GrantError::Expired);
        }
        Ok(())
    }

    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = self.signed_bytes().to_vec();
        v.extend_from_slice(&self.mac);
        v
    }

    /// Decodes.
    pub fn decode(b: &[u8]) -> Result<Grant, DecodeError> {
        exact(b, Self::LEN)?;
        Ok(Grant {
            segment_id: u64_at(b, 0),
            brick_offset: u64_at(b, 8),
            size_bytes: u64_at(b, 16),
            node: u64_at(b, 24),
            rights: b[32],
            expiry_unix_s: u64_at(b, 33),
            mac: array_at(b, 41),
        })
    }
}

fn hmac(key: &[u8]) -> Hmac<Sha256> {
    // HMAC accepts keys of any length; new_from_slice cannot fail for HMAC.
    <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC takes any key length"))
}

/// The session key of a grant: `HMAC-SHA256(brick_key, "rackmem-session-v1" || grant.mac)`.
///
/// Whoever holds the brick's key (the brick, its control plane) can derive it; a node receives
/// it only along with its own grant (ALLOC and CLONE replies, or the control plane's allocation
/// reply). The grant alone, which crosses the network in clear at every ATTACH, does not reveal
/// it. Keep it as secret as the data in the segment.
pub fn session_key(brick_key: &[u8], grant: &Grant) -> [u8; KEY_LEN] {
    let mut m = hmac(brick_key);
    m.update(b"rackmem-session-v1");
    m.update(&grant.mac);
    m.finalize().into_bytes().into()
}

fn proof_mac(session_key: &[u8; KEY_LEN], nonce: &[u8; NONCE_LEN], segment_id: u64) -> Hmac<Sha256> {
    let mut m = hmac(session_key);
    m.update(b"rackmem-attach-v1");
    m.update(nonce);
    m.update(&segment_id.to_le_bytes());
    m
}

/// The proof an ATTACH carries: `HMAC-SHA256(session_key, "rackmem-attach-v1" || nonce ||
/// segment_id as u64 LE)`, where `nonce` is the one the brick returned at this connection's
/// HELLO ([`BrickInfo::nonce`]). Valid on that connection only.
pub fn attach_proof(session_key: &[u8; KEY_LEN], nonce: &[u8; NONCE_LEN], segment_id: u64) -> [u8; KEY_LEN] {
    proof_mac(session_key, nonce, segment_id).finalize().into_bytes().into()
}

/// True if `proof` is [`attach_proof`] of these inputs; compared in constant time, so a peer
/// cannot learn a valid proof byte by byte from response timing.
pub fn verify_attach_proof(
    session_key: &[u8; KEY_LEN],
    nonce: &[u8; NONCE_LEN],
    segment_id: u64,
    proof: &[u8; KEY_LEN],
) -> bool {
    proof_mac(session_key, nonce, segment_id).verify_slice(proof).is_ok()
}

/// Compares two byte strings in time that depends on their lengths only, never on where they
/// differ (for secrets and MACs).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A grant with its session key: what ALLOC and CLONE return, and what a node needs to attach.
#[derive(Clone, PartialEq, Eq)]
pub struct SegmentGrant {
    /// The grant.
    pub grant: Grant,
    /// Its session key ([`session_key`]).
    pub session_key: [u8; KEY_LEN],
}

// Hand-written so the session key never lands in a log.
impl std::fmt::Debug for SegmentGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentGrant")
            .field("grant", &self.grant)
            .field("session_key", &"<secret>")
            .finish()
    }
}

impl SegmentGrant {
    /// Encoded length: the grant, then the key.
    pub const LEN: usize = Grant::LEN + KEY_LEN;

    /// The grant and the session key derived from it with `brick_key`.
    pub fn new(brick_key: &[u8], grant: Grant) -> SegmentGrant {
        SegmentGrant {
            session_key: session_key(brick_key, &grant),
            grant,
        }
    }

    /// Encodes as `grant || session_key`.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = self.grant.encode();
        v.extend_from_slice(&self.session_key);
        v
    }

    /// Decodes `grant || session_key`.
    pub fn decode(b: &[u8]) -> Result<SegmentGrant, DecodeError> {
        exact(b, Self::LEN)?;
        Ok(SegmentGrant {
            grant: Grant::decode(&b[..Grant::LEN])?,
            session_key: array_at(b, Grant::LEN),
        })
    }
}

/// One run of pages: offset within the segment, length in bytes.
pub type Extent = (u64, u32);

/// A decoded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// HELLO.
    Hello,
    /// ALLOC of `size_bytes` with the shared secret.
    Alloc {
        /// Requested size.
        size_bytes: u64,
        /// Shared secret.
        secret: Vec<u8>,
    },
    /// ATTACH with a grant and the proof that this connection holds its session key.
    Attach {
        /// The grant.
        grant: Grant,
        /// [`attach_proof`] for this connection's HELLO nonce and the grant's segment.
        proof: [u8; KEY_LEN],
    },
    /// READ of extents.
    Read(Vec<Extent>),
    /// WRITE of extents; `data` holds their bytes in order.
    Write {
        /// Extents.
        extents: Vec<Extent>,
        /// Data.
        data: Vec<u8>,
    },
    /// DISCARD.
    Discard {
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
    },
    /// COPY within the segment.
    Copy {
        /// Source offset.
        src: u64,
        /// Destination offset.
        dst: u64,
        /// Length.
        len: u64,
    },
    /// CLONE.
    Clone,
    /// DETACH.
    Detach,
    /// PING.
    Ping,
    /// STATS.
    Stats,
    /// SHARE.
    Share,
    /// POPULATE.
    Populate {
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
    },
}

fn encode_extents(extents: &[Extent], out: &mut Vec<u8>) {
    out.extend_from_slice(&(extents.len() as u32).to_le_bytes());
    for &(o, l) in extents {
        out.extend_from_slice(&o.to_le_bytes());
        out.extend_from_slice(&l.to_le_bytes());
    }
}

/// Decodes a WRITE payload without copying its data: the extents, and the bytes that follow
/// them (exactly as many as the extents cover). A brick uses this to store pages straight from
/// its receive buffer.
pub fn decode_write(p: &[u8]) -> Result<(Vec<Extent>, &[u8]), DecodeError> {
    let (ext, used) = decode_extents(p)?;
    let want = extents_bytes(&ext) as usize;
    exact(&p[used..], want)?;
    Ok((ext, &p[used..]))
}

/// Decodes the extent list at the start of `b`; returns the extents and the bytes consumed.
fn decode_extents(b: &[u8]) -> Result<(Vec<Extent>, usize), DecodeError> {
    if b.len() < 4 {
        return Err(DecodeError::Truncated { need: 4, have: b.len() });
    }
    let n = u32_at(b, 0);
    if n == 0 {
        return Err(DecodeError::Invalid("empty extent list"));
    }
    if n > MAX_EXTENTS {
        return Err(DecodeError::TooManyExtents(n));
    }
    let need = 4 + n as usize * 12;
    if b.len() < need {
        return Err(DecodeError::Truncated { need, have: b.len() });
    }
    let mut v = Vec::with_capacity(n as usize);
    for i in 0..n as usize {
        let o = u64_at(b, 4 + i * 12);
        let l = u32_at(b, 12 + i * 12);
        if l == 0 || l % PAGE_SIZE != 0 || o % PAGE_SIZE as u64 != 0 || o.checked_add(l as u64).is_none() {
            return Err(DecodeError::Misaligned { offset: o, len: l });
        }
        v.push((o, l));
    }
    Ok((v, need))
}

/// Total bytes of an extent list (saturating).
pub fn extents_bytes(extents: &[Extent]) -> u64 {
    extents.iter().map(|e| e.1 as u64).sum()
}

impl Request {
    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::Hello => Opcode::Hello,
            Request::Alloc { .. } => Opcode::Alloc,
            Request::Attach { .. } => Opcode::Attach,
            Request::Read(_) => Opcode::Read,
            Request::Write { .. } => Opcode::Write,
            Request::Discard { .. } => Opcode::Discard,
            Request::Copy { .. } => Opcode::Copy,
            Request::Clone => Opcode::Clone,
            Request::Detach => Opcode::Detach,
            Request::Ping => Opcode::Ping,
            Request::Stats => Opcode::Stats,
            Request::Share => Opcode::Share,
            Request::Populate { .. } => Opcode::Populate,
        }
    }

    /// Encodes a whole frame (header and payload) with `tag`.
    ///
    /// A WRITE's data is copied into the frame; [`encode_write_head`] avoids that copy.
    pub fn encode(&self, tag: u32) -> Vec<u8> {
        if let Request::Write { extents, data } = self {
            let mut frame = encode_write_head(tag, extents, data.len());
            frame.extend_from_slice(data);
            return frame;
        }
        let mut payload = Vec::new();
        let mut offset = 0;
        match self {
            Request::Hello | Request::Clone | Request::Detach | Request::Ping | Request::Stats | Request::Share => {}
            Request::Alloc { size_bytes, secret } => {
                offset = *size_bytes;
                payload.extend_from_slice(secret);
            }
            Request::Attach { grant, proof } => {
                payload = grant.encode();
                payload.extend_from_slice(proof);
            }
            Request::Read(ext) => encode_extents(ext, &mut payload),
            // Encoded above, without the intermediate payload.
            Request::Write { .. } => {}
            Request::Discard { offset: o, len } | Request::Populate { offset: o, len } => {
                offset = *o;
                payload.extend_from_slice(&len.to_le_bytes());
            }
            Request::Copy { src, dst, len } => {
                for v in [src, dst, len] {
                    payload.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        let h = Header {
            opcode: self.opcode(),
            flags: 0,
            tag,
            status: 0,
            offset,
            length: 0,
            payload_len: payload.len() as u32,
        };
        let mut frame = Vec::with_capacity(HEADER_LEN + payload.len());
        frame.extend_from_slice(&h.encode());
        frame.extend_from_slice(&payload);
        frame
    }

    /// Decodes a request from its validated header and its payload.
    pub fn decode(h: &Header, p: &[u8]) -> Result<Request, DecodeError> {
        if p.len() != h.payload_len as usize {
            return Err(DecodeError::PayloadSize {
                want: h.payload_len as usize,
                have: p.len(),
            });
        }
        if h.is_response() {
            return Err(DecodeError::Invalid("response flag in a request"));
        }
        let empty = |r: Request| {
            exact(p, 0)?;
            Ok(r)
        };
        match h.opcode {
            Opcode::Hello => empty(Request::Hello),
            Opcode::Clone => empty(Request::Clone),
            Opcode::Detach => empty(Request::Detach),
            Opcode::Ping => empty(Request::Ping),
            Opcode::Stats => empty(Request::Stats),
            Opcode::Share => empty(Request::Share),
            Opcode::Alloc => {
                if p.len() > MAX_SECRET {
                    return Err(DecodeError::Invalid("secret too long"));
                }
                Ok(Request::Alloc {
                    size_bytes: h.offset,
                    secret: p.to_vec(),
                })
            }
            Opcode::Attach => {
                if p.len() == Grant::LEN {
                    return Err(DecodeError::MissingProof);
                }
                exact(p, Grant::LEN + KEY_LEN)?;
                Ok(Request::Attach {
                    grant: Grant::decode(&p[..Grant::LEN])?,
                    proof: array_at(p, Grant::LEN),
                })
            }
            Opcode::Read => {
                let (ext, used) = decode_extents(p)?;
                exact(&p[used..], 0)?;
                Ok(Request::Read(ext))
            }
            Opcode::Write => {
                let (extents, data) = decode_write(p)?;
                Ok(Request::Write {
                    extents,
                    data: data.to_vec(),
                })
            }
            Opcode::Discard => {
                exact(p, 8)?;
                Ok(Request::Discard {
                    offset: h.offset,
                    len: u64_at(p, 0),
                })
            }
            Opcode::Populate => {
                exact(p, 8)?;
                Ok(Request::Populate {
                    offset: h.offset,
                    len: u64_at(p, 0),
                })
            }
            Opcode::Copy => {
                exact(p, 24)?;
                Ok(Request::Copy {
                    src: u64_at(p, 0),
                    dst: u64_at(p, 8),
                    len: u64_at(p, 16),
                })
            }
        }
    }
}

/// Encodes the header and extent list of a WRITE frame whose `data_len` bytes of data the caller
/// sends right after (so page data is never copied into a frame buffer). `data_len` must be the
/// extents' total and the extents must respect [`MAX_EXTENTS`] and [`MAX_PAYLOAD`], or the
/// brick refuses the frame.
pub fn encode_write_head(tag: u32, extents: &[Extent], data_len: usize) -> Vec<u8> {
    let mut frame = Vec::with_capacity(HEADER_LEN + 4 + extents.len() * 12);
    frame.extend_from_slice(&[0u8; HEADER_LEN]);
    encode_extents(extents, &mut frame);
    let payload_len = (frame.len() - HEADER_LEN + data_len) as u32;
    let h = Header {
        opcode: Opcode::Write,
        flags: 0,
        tag,
        status: 0,
        offset: 0,
        length: 0,
        payload_len,
    };
    frame[..HEADER_LEN].copy_from_slice(&h.encode());
    frame
}

/// Encodes a response frame.
pub fn encode_response(opcode: Opcode, tag: u32, status: Status, payload: &[u8]) -> Vec<u8> {
    let h = Header {
        opcode,
        flags: FLAG_RESPONSE,
        tag,
        status: status as u32,
        offset: 0,
        length: 0,
        payload_len: payload.len() as u32,
    };
    let mut v = Vec::with_capacity(HEADER_LEN + payload.len());
    v.extend_from_slice(&h.encode());
    v.extend_from_slice(payload);
    v
}

/// Decodes a whole frame from a byte slice (header, then exactly `payload_len` bytes): the entry
/// point for fuzzing and tests. Returns the header, the request and the bytes consumed.
pub fn decode_request_frame(b: &[u8]) -> Result<(Header, Request, usize), DecodeError> {
    let h = Header::decode(b)?;
    let end = HEADER_LEN + h.payload_len as usize;
    if b.len() < end {
        return Err(DecodeError::Truncated {
            need: end,
            have: b.len(),
        });
    }
    let r = Request::decode(&h, &b[HEADER_LEN..end])?;
    Ok((h, r, end))
}

/// Decodes a whole response frame from a byte slice: returns the header, the payload and the
/// bytes consumed. The payload's meaning depends on the request (see `docs/protocol.md`).
pub fn decode_response_frame(b: &[u8]) -> Result<(Header, &[u8], usize), DecodeError> {
    let h = Header::decode(b)?;
    if !h.is_response() {
        return Err(DecodeError::Invalid("request where a response was expected"));
    }
    let end = HEADER_LEN + h.payload_len as usize;
    if b.len() < end {
        return Err(DecodeError::Truncated {
            need: end,
            have: b.len(),
        });
    }
    Ok((h, &b[HEADER_LEN..end], end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn grant() -> impl Strategy<Value = Grant> {
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u8>(),
            any::<u64>(),
            any::<[u8; 32]>(),
        )
            .prop_map(
                |(segment_id, brick_offset, size_bytes, node, rights, expiry_unix_s, mac)| Grant {
                    segment_id,
                    brick_offset,
                    size_bytes,
                    node,
                    rights,
                    expiry_unix_s,
                    mac,
                },
            )
    }

    fn extents() -> impl Strategy<Value = Vec<Extent>> {
        proptest::collection::vec((0u64..1 << 40, 1u32..16), 1..20)
            .prop_map(|v| v.into_iter().map(|(o, l)| (o * 4096, l * 4096)).collect())
    }

    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            Just(Request::Hello),
            Just(Request::Clone),
            Just(Request::Detach),
            Just(Request::Ping),
            Just(Request::Stats),
            Just(Request::Share),
            (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..64))
                .prop_map(|(size_bytes, secret)| Request::Alloc { size_bytes, secret }),
            (grant(), any::<[u8; 32]>()).prop_map(|(grant, proof)| Request::Attach { grant, proof }),
            extents().prop_map(Request::Read),
            (extents(), any::<u8>()).prop_map(|(extents, fill)| {
                let n = extents_bytes(&extents) as usize;
                Request::Write {
                    extents,
                    data: vec![fill; n],
                }
            }),
            (any::<u64>(), any::<u64>()).prop_map(|(offset, len)| Request::Discard { offset, len }),
            (any::<u64>(), any::<u64>()).prop_map(|(offset, len)| Request::Populate { offset, len }),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(src, dst, len)| Request::Copy { src, dst, len }),
        ]
    }

    proptest! {
        #[test]
        fn request_round_trip(r in request(), tag in any::<u32>()) {
            let frame = r.encode(tag);
            let (h, back, used) = decode_request_frame(&frame).unwrap();
            prop_assert_eq!(used, frame.len());
            prop_assert_eq!(h.tag, tag);
            prop_assert_eq!(back, r);
            // A receiver enforcing the per-opcode bound accepts every well-formed request.
            prop_assert!(h.payload_len <= h.opcode.max_request_payload());
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_request_frame(&bytes);
        }

        #[test]
        fn decode_never_panics_with_valid_header(op in 0u8..16, payload in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut b = Header { opcode: Opcode::Ping, flags: 0, tag: 1, status: 0, offset: 4096, length: 0, payload_len: payload.len() as u32 }.encode().to_vec();
            b[5] = op;
            b.extend_from_slice(&payload);
            let _ = decode_request_frame(&b);
        }

        #[test]
        fn grant_round_trip_and_signature(g in grant(), key in proptest::collection::vec(any::<u8>(), 1..64)) {
            let s = Grant::sign(&key, g.segment_id, g.brick_offset, g.size_bytes, g.node, g.rights, 0);
            prop_assert_eq!(Grant::decode(&s.encode()).unwrap(), s.clone());
            prop_assert!(s.verify(&key, 1).is_ok());
            let mut forged = s.clone();
            forged.size_bytes ^= 1;
            prop_assert_eq!(forged.verify(&key, 1), Err(GrantError::BadSignature));
        }
    }

    proptest! {
        #[test]
        fn response_round_trip(op in 1u8..12, code in 0u32..14, tag in any::<u32>(), payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let op = Opcode::from_u8(op).unwrap();
            let status = Status::from_u32(code);
            prop_assert_eq!(status.code(), code);
            let frame = encode_response(op, tag, status, &payload);
            let (h, p, used) = decode_response_frame(&frame).unwrap();
            prop_assert_eq!(used, frame.len());
            prop_assert_eq!((h.opcode, h.tag, Status::from_u32(h.status)), (op, tag, status));
            prop_assert_eq!(p, &payload[..]);
            // A response is never taken for a request, nor the other way round.
            prop_assert!(decode_request_frame(&frame).is_err());
        }

        #[test]
        fn info_and_stats_round_trip(v in proptest::collection::vec(any::<u64>(), 8), small in any::<(u32, u32)>(), nonce in any::<[u8; 16]>()) {
            let info = BrickInfo { pool_bytes: v[0], free_bytes: v[1], page_size: small.0, max_payload: small.1, brick_id: v[2], nonce };
            prop_assert_eq!(BrickInfo::decode(&info.encode()).unwrap(), info);
            // A HELLO answer from a brick without nonces is refused, not misread.
            prop_assert!(BrickInfo::decode(&info.encode()[..32]).is_err());
            let stats = BrickStats {
                bytes_read: v[0], bytes_written: v[1], requests: v[2], connections: v[3],
                errors: v[4], resident_bytes: v[5], segments: v[6], free_bytes: v[7],
            };
            prop_assert_eq!(BrickStats::decode(&stats.encode()).unwrap(), stats);
            prop_assert!(BrickStats::decode(&stats.encode()[1..]).is_err());
        }

        #[test]
        fn write_head_plus_data_is_a_write_frame(ext in extents(), tag in any::<u32>()) {
            let n = extents_bytes(&ext) as usize;
            let data: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
            let mut frame = encode_write_head(tag, &ext, n);
            frame.extend_from_slice(&data);
            let (_, back, _) = decode_request_frame(&frame).unwrap();
            prop_assert_eq!(back, Request::Write { extents: ext, data });
        }

        #[test]
        fn segment_grant_round_trip(g in grant(), key in any::<[u8; 32]>()) {
            let sg = SegmentGrant { grant: g, session_key: key };
            let bytes = sg.encode();
            prop_assert_eq!(bytes.len(), SegmentGrant::LEN);
            prop_assert_eq!(SegmentGrant::decode(&bytes).unwrap(), sg);
            prop_assert!(SegmentGrant::decode(&bytes[..Grant::LEN]).is_err());
        }

        #[test]
        fn segment_grant_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..160)) {
            let _ = SegmentGrant::decode(&bytes);
            let _ = BrickInfo::decode(&bytes);
        }

        #[test]
        fn proofs_bind_key_nonce_and_segment(
            g in grant(),
            brick_key in proptest::collection::vec(any::<u8>(), 1..64),
            nonce in any::<[u8; 16]>(),
            flip in 0usize..16,
        ) {
            let g = Grant::sign(&brick_key, g.segment_id, g.brick_offset, g.size_bytes, g.node, g.rights, 0);
            let key = session_key(&brick_key, &g);
            let proof = attach_proof(&key, &nonce, g.segment_id);
            prop_assert!(verify_attach_proof(&key, &nonce, g.segment_id, &proof));
            let mut other_nonce = nonce;
            other_nonce[flip] ^= 1;
            prop_assert!(!verify_attach_proof(&key, &other_nonce, g.segment_id, &proof), "replayed on another connection");
            prop_assert!(!verify_attach_proof(&key, &nonce, g.segment_id ^ 1, &proof), "used for another segment");
            let other = Grant::sign(&brick_key, g.segment_id ^ 1, g.brick_offset, g.size_bytes, g.node, g.rights, 0);
            prop_assert_ne!(session_key(&brick_key, &other), key, "every grant has its own session key");
            let mut other_brick = brick_key.clone();
            // Not a trailing zero: HMAC pads short keys with zeros, so "k" and "k\0" are one key.
            other_brick[0] ^= 1;
            prop_assert_ne!(session_key(&other_brick, &g), key);
        }

        #[test]
        fn truncated_frames_are_errors(r in request(), cut in any::<prop::sample::Index>()) {
            let frame = r.encode(9);
            let cut = cut.index(frame.len());
            prop_assert!(decode_request_frame(&frame[..cut]).is_err());
        }
    }

    #[test]
    fn write_data_must_match_extents() {
        let mut frame = encode_write_head(1, &[(0, 4096)], 4095);
        frame.extend_from_slice(&[0u8; 4095]);
        assert!(matches!(
            decode_request_frame(&frame),
            Err(DecodeError::PayloadSize { want: 4096, have: 4095 })
        ));
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

    #[test]
    fn extents_are_validated() {
        let mut p = Vec::new();
        encode_extents(&[(100, 4096)], &mut p);
        let h = Header {
            opcode: Opcode::Read,
            flags: 0,
            tag: 1,
            status: 0,
            offset: 0,
            length: 0,
            payload_len: p.len() as u32,
        };
        assert!(matches!(Request::decode(&h, &p), Err(DecodeError::Misaligned { .. })));
        let mut p = Vec::new();
        p.extend_from_slice(&(MAX_EXTENTS + 1).to_le_bytes());
        let h = Header {
            payload_len: p.len() as u32,
            ..h
        };
        assert_eq!(
            Request::decode(&h, &p),
            Err(DecodeError::TooManyExtents(MAX_EXTENTS + 1))
        );
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Pins the derivations of `docs/control-plane.md` to values computed independently (Python's
    /// `hmac`), so a control plane written in another language agrees with the brick.
    #[test]
    fn session_key_and_proof_known_answers() {
        let g = Grant::sign(b"brick-key", 7, 1 << 20, 2 << 20, 3, rights::ALL, 0);
        assert_eq!(
            g.mac.to_vec(),
            unhex("aa7ff9e506f8a4fe226fba0815ec7abdf3fdfbf1daac31d9b3afdc2d9c5232cf")
        );
        let key = session_key(b"brick-key", &g);
        assert_eq!(
            key.to_vec(),
            unhex("350aedf7471a46fbe2b3a106b9364984a115e1ca2e4c7b4b87bf1b4ae2f564d2")
        );
        let nonce: [u8; 16] = std::array::from_fn(|i| i as u8);
        assert_eq!(
            attach_proof(&key, &nonce, 7).to_vec(),
            unhex("bb3079a8beeaec30d7596aea3b8f2fca9cd1d1df60e9dea6e40d0c5f6f538ade")
        );
    }

    #[test]
    fn attach_without_proof_is_a_clear_error() {
        let g = Grant::sign(b"k", 1, 0, 4096, 2, rights::ALL, 0);
        let p = g.encode();
        let h = Header {
            opcode: Opcode::Attach,
            flags: 0,
            tag: 1,
            status: 0,
            offset: 0,
            length: 0,
            payload_len: p.len() as u32,
        };
        let e = Request::decode(&h, &p).unwrap_err();
        assert_eq!(e, DecodeError::MissingProof);
        assert!(e.to_string().contains("upgrade"), "{e}");
        let h = Header {
            payload_len: p.len() as u32 - 1,
            ..h
        };
        assert!(matches!(
            Request::decode(&h, &p[1..]),
            Err(DecodeError::PayloadSize { want: 105, have: 72 })
        ));
    }

    #[test]
    fn constant_time_eq_compares() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn segment_grant_debug_hides_the_key() {
        let sg = SegmentGrant::new(b"k", Grant::sign(b"k", 1, 0, 4096, 2, rights::ALL, 0));
        let shown = format!("{sg:?}");
        assert!(!shown.contains(&format!("{:?}", sg.session_key)), "{shown}");
    }

    #[test]
    fn expired_grant() {
        let g = Grant::sign(b"k", 1, 0, 4096, 2, rights::ALL, 100);
        assert_eq!(g.verify(b"k", 101), Err(GrantError::Expired));
        assert!(g.verify(b"k", 100).is_ok());
        assert_eq!(g.verify(b"other", 50), Err(GrantError::BadSignature));
    }
}
