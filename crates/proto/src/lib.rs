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
//!
//! The modules, each re-exported at the crate root (other crates name nothing but the root):
//! - `header`: constants and limits, [`Opcode`], [`Status`], [`DecodeError`], the 32-byte [`Header`].
//! - `brick`: what a brick reports about itself, [`BrickInfo`] (HELLO) and [`BrickStats`] (STATS).
//! - `grant`: [`rights`], signed [`Grant`]s, session keys and ATTACH proofs, [`SegmentGrant`].
//! - `request`: [`Extent`] lists, [`Request`] encoding and decoding, zero-copy WRITE, request frames.
//! - `pull`: direct brick-to-brick migration, [`PullGrant`] (a node's read-only delegation of
//!   one range of a segment) and [`PullOrder`] (what a target brick pulls).
//! - `response`: response frames, [`encode_response`] and [`decode_response_frame`].
//! - `report`: the node agent's requests ([`AgentRequest`]) and [`ProcessReport`], what a program's
//!   runtime reports to its agent while it runs.
//! - `bytes` (private): the little-endian field readers and length check the decoders share.

mod brick;
mod bytes;
mod grant;
mod header;
mod pull;
mod report;
mod request;
mod response;

pub use brick::{BrickInfo, BrickStats};
pub use grant::{
    attach_proof, constant_time_eq, rights, session_key, verify_attach_proof, Grant, GrantError, SegmentGrant,
    SESSION_KEY_LABEL,
};
pub use header::{
    DecodeError, Header, Opcode, Status, FLAG_RESPONSE, HEADER_LEN, KEY_LEN, MAGIC, MAX_EXTENTS, MAX_EXTENT_LIST,
    MAX_MESSAGE, MAX_NAME, MAX_PAYLOAD, MAX_SECRET, NONCE_LEN, PAGE_SIZE, VERSION,
};
pub use pull::{
    pull_key, PullError, PullGrant, PullOrder, PullPiece, MAX_PULL_BYTES, MAX_PULL_LIFETIME_S, MAX_PULL_PIECES,
};
pub use report::{
    AgentClone, AgentMigration, AgentRate, AgentRefusal, AgentReply, AgentRequest, AgentSegment, BrickLevelReport,
    CloneSource, EvacuateMove, LatencyHistogram, ProcessReport, FAULT_LATENCY_BOUNDS_NS, MAX_BRICK_NAME_LEN,
    MAX_PROGRAM_LEN, MAX_REPORTED_BRICKS,
};
pub use request::{
    decode_request_frame, decode_write, encode_put_head, encode_write_head, extents_bytes, Extent, Request,
};
pub use response::{decode_response_frame, encode_response};
