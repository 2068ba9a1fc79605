//! Links from a node to memory bricks.
//!
//! A [`Link`] is one connection (TCP with `TCP_NODELAY`, TLS over such a TCP connection, or a
//! Unix stream socket). Requests
//! carry tags and may be pipelined, from several threads at once or from one thread through
//! [`Link::submit_read`] / [`Link::submit_write`] and [`Ticket::wait`].
//!
//! There is no reader thread. A caller that waits for a response becomes the link's reader if
//! nobody else is reading: it reads frames off the socket itself and parks other callers'
//! responses, waking them. A caller alone on a link (the fault handler) therefore reads its own
//! response directly, with no thread hop: on 2-vCPU guests a cross-thread wake-up costs ~30 µs,
//! more than the loopback round trip (`baselines/README.md` §3).
//!
//! Without a reader thread, two things could wedge a link, and both are handled:
//! - a sender blocked on a full socket while the brick is blocked sending responses nobody
//!   reads: sends use a short socket send timeout, and a blocked sender drains responses;
//! - an unbounded backlog: at most [`MAX_IN_FLIGHT`] requests are in flight per link, and a
//!   batched read keeps at most [`READ_WINDOW`] batches in flight.
//!
//! Every wait has a deadline (the link's timeout). A closed connection, a timeout or a malformed
//! response marks the link broken: that request and every pending and later one fail with
//! [`LinkError::BrickLost`] naming the brick and the cause. Nothing ever returns zeros in place
//! of data.
//!
//! A link may be *emulated* (module `emulate`, [`EMULATE_ENV`]): its responses reach their
//! waiters as late as a given network would deliver them.
//!
//! A `tls://` link keeps this design: one TLS connection state is shared by the reader and the
//! senders under a lock never held across blocking I/O (module `tls`, and `docs/architecture.md`,
//! "TLS links").

mod addr;
mod connect;
mod emulate;
mod error;
mod limits;
mod link;
mod onesided;
mod pages;
mod reader;
mod requests;
mod sender;
mod socket;
mod spin;
mod sync;
mod ticket;
mod tls;

pub use addr::BrickAddr;
pub use emulate::EMULATE_ENV;
pub use error::LinkError;
pub use limits::{DEFAULT_TIMEOUT, KEEPALIVE_INTERVAL, MAX_BATCH_BYTES, MAX_BATCH_EXTENTS, MAX_IN_FLIGHT, READ_WINDOW};
pub use link::Link;
pub use ticket::{DetachedTicket, Ticket};
pub use tls::{TlsClient, TLS_CA_ENV};
