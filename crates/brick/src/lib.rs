//! The memory brick: a passive server that lends a byte pool `[0, size)` as segments.
//!
//! A brick keeps no policy. In standalone mode a client that knows the shared secret carves a
//! segment (ALLOC) and gets its grant and session key; segments end with their last
//! connection. In managed mode ([`BrickConfig::managed`]) a control plane hands out grants
//! signed with the brick's key: a grant for a segment the brick has not seen creates it where
//! the grant says, and segments live until the control plane stops listing them
//! ([`BrickHandle::retain_segments`]). Every connection is bound (ATTACH) to one segment by a
//! grant plus a proof that it holds the grant's session key, bound to its own HELLO nonce, and
//! every data request is bounds-checked against it. A malformed frame or a bad grant closes that
//! connection only.
//!
//! The pool is lazily backed: it is split in [`CHUNK`]-sized chunks allocated on first write, so
//! a never-written range costs nothing and reads as zeros. Chunks are reference-counted, which
//! makes CLONE (the copy a forked child gets) a copy-on-write sharing of chunks: O(chunks) at
//! clone time, a chunk copy on the first write to a shared chunk.
//!
//! A brick admits a bounded number of connections, in total and per peer address, gives each
//! a deadline to authenticate and, once it has, an idle timeout; it reads a frame's payload only
//! after the header is valid for its opcode and the connection's state, and slows down peers
//! whose secrets or grants keep failing ([`BrickLimits`]).
//!
//! Threads: one acceptor, which also holds every connection until it authenticates (on epoll,
//! without a thread each: `handshake`), and one per authenticated connection. Requests on a connection are processed in order
//! and answered in order; a response is held back only while a whole further request is
//! already buffered, so a pipelined burst is answered with few system calls and a client is
//! never left waiting for a response while the brick waits for the client.

mod accept;
mod config;
mod connection;
mod cow;
mod data;
mod error;
mod guard;
mod handshake;
mod metrics;
mod moving;
mod onesided;
mod pace;
mod pool;
mod pull;
mod reply;
mod server;
mod session;
mod state;
mod stream;
mod sync;
mod tls;

pub use config::{BrickConfig, ListenAddr, CLONE_GRACE, DEFAULT_SPIN_US};
pub use error::BrickError;
pub use guard::{BrickLimits, GuardStats, AUTH_FORGET, MAX_TRACKED_PEERS};
pub use moving::{MoveReport, PullOutcome, PullSpec, MAX_CONTROL_PULLS};
pub use pace::{probe_serve_rate, PaceStats, SegmentPaceStats, BURST as PACE_BURST, MAX_WAIT as PACE_MAX_WAIT};
pub use pool::CHUNK;
pub use rackmem_proto::BrickStats;
pub use server::{run_until_signal, Brick, BrickHandle, BrickManager, BrickStopper};
pub use tls::server_config as tls_server_config;
