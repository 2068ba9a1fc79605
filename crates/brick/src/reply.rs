//! The answer to one request: its status, its payload, whether the connection closes after it,
//! and the shared memory whose descriptor travels with it (SHARE).

use rackmem_proto::{Status, MAX_MESSAGE};
use rackmem_sys::SharedMemory;
use std::sync::Arc;

pub(crate) struct Reply {
    pub(crate) status: Status,
    pub(crate) payload: Vec<u8>,
    pub(crate) close: bool,
    /// Shared memory whose descriptor goes with the response (SHARE).
    pub(crate) fd: Option<Arc<SharedMemory>>,
}

pub(crate) fn ok(payload: Vec<u8>) -> Reply {
    Reply {
        status: Status::Ok,
        payload,
        close: false,
        fd: None,
    }
}

pub(crate) fn err(status: Status, msg: impl Into<String>, close: bool) -> Reply {
    let mut m = msg.into().into_bytes();
    m.truncate(MAX_MESSAGE);
    Reply {
        status,
        payload: m,
        close,
        fd: None,
    }
}
