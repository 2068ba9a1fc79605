//! One-sided operations on brick memory that no window maps (issue 24): segments allocated or
//! opened by name for `rackmem_put`/`rackmem_get`, their non-blocking forms completed by a
//! quiet, and 8-byte atomics executed by the brick (or by the processor on a segment mapped
//! from a brick on this host), with a transfer engine that picks, per transfer size, between
//! an inline path (one frame) and a bulk path (pipelined pieces, or a copy into the mapping),
//! at a threshold measured on each link (seed 003).
//!
//! Data flow: the C API (`rackmem-preload`, `include/rackmem.h`) → [`Engine`] (handles,
//! bricks, plans) → [`Segment`] (range checks, the path for the size) → a
//! [`Link`](rackmem_transport::Link) request, or the mapping. Non-blocking transfers wait in a
//! per-thread [`Pending`] list until [`Pending::quiet`].
//!
//! What it is not: it knows no C ABI and holds no raw pointers (the C layer turns them into
//! slices under the contract the header states), starts no thread (the owner runs
//! [`keep_alive_loop`]), and does not serve the window's page faults (the fault path's own
//! copy/move switch is the pager's).
//!
//! Modules: `engine` (the process's segments and plans), `segment` (one segment and the two
//! paths), `plan` (thresholds and their calibration), `nbi` (non-blocking transfers),
//! `reattach` (a named segment whose link broke comes back by itself), `error`.

mod engine;
mod error;
mod nbi;
mod plan;
mod reattach;
mod segment;

pub use engine::{
    keep_alive_loop, Engine, EngineConfig, Granted, Granter, Sharing, DEFAULT_LINK_SPIN_US, MAX_GRANTED_NAME,
    MAX_SEGMENTS,
};
pub use error::PutGetError;
pub use nbi::{Pending, MAX_PENDING, MAX_PENDING_BYTES};
pub use plan::{calibrate, Direction, Path, Plan, Probe, Threshold, CALIBRATION_BYTES};
/// The types a [`Granter`] fills a [`Granted`] with.
pub use rackmem_proto::SegmentGrant;
pub use rackmem_transport::BrickAddr;
pub use reattach::{
    Retry, MOVING_FIRST_WAIT, MOVING_LIMIT, MOVING_MAX_WAIT, REATTACH_FIRST_DELAY, REATTACH_LIMIT, REATTACH_MAX_DELAY,
};
pub use segment::{Segment, BULK_PIECE_BYTES, BULK_WINDOW, INLINE_FRAME_BYTES};
