//! The limits of a link: how long it waits, how much it keeps in flight, how large a batch
//! may be.

use rackmem_proto::{MAX_EXTENTS, MAX_PAYLOAD};
use std::time::Duration;

/// Default timeout of every wait on a link.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a link may sit idle before its owner should ping it ([`Link::keep_alive`](crate::Link::keep_alive)): well
/// under a brick's default idle timeout (10 min), so the brick never closes a link of a program
/// that merely has not needed remote memory for a while.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
/// Most requests a link has in flight (sent, response not yet read off the socket).
pub const MAX_IN_FLIGHT: i64 = 128;
/// Most READ batches one [`Link::read_pages`](crate::Link::read_pages) call keeps in flight (each up to [`MAX_BATCH_BYTES`]).
pub const READ_WINDOW: usize = 4;
/// Most extents in one batched request sent by this crate.
pub const MAX_BATCH_EXTENTS: usize = 1024;
/// Most page bytes in one batched request sent by this crate (leaves room for the extent list).
pub const MAX_BATCH_BYTES: u64 = MAX_PAYLOAD as u64 - (1 << 16);
const _: () = assert!(MAX_BATCH_EXTENTS as u32 <= MAX_EXTENTS);

/// Most plaintext bytes a `tls://` sender seals before writing them out.
pub(crate) const TLS_SEAL_BYTES: usize = 256 << 10;

/// How long one blocked send waits before the sender checks for responses to drain.
pub(crate) const SEND_SLICE: Duration = Duration::from_millis(2);
