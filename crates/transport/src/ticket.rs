//! Tickets: requests sent whose responses are collected later, which is how one thread keeps
//! several requests in flight on a link.

use crate::error::LinkError;
use crate::link::Link;
use rackmem_proto::Opcode;

/// A request sent with [`Link::submit_read`] or [`Link::submit_write`] whose response is still
/// to be collected with [`Ticket::wait`]. Dropping a ticket abandons the response (it is
/// discarded when it arrives); the request itself may still have been carried out.
#[must_use = "a ticket's response says whether the request succeeded"]
pub struct Ticket<'a> {
    pub(crate) link: &'a Link,
    pub(crate) tag: u32,
    pub(crate) op: Opcode,
    /// Bytes the response carries (the extents' total for READ, 0 for WRITE).
    pub(crate) len: usize,
    pub(crate) done: bool,
}

impl Ticket<'_> {
    /// Bytes the response carries: the buffer size [`Ticket::wait`] needs (0 for a write).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a write ticket (no data in the response).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Waits for the response; for a read, copies the pages (in extent order) into `out`, which
    /// must be exactly [`Ticket::len`] bytes (pass `&mut []` for a write).
    pub fn wait(mut self, out: &mut [u8]) -> Result<(), LinkError> {
        self.done = true;
        let link = self.link;
        if out.len() != self.len {
            // Nothing can be delivered: drop the response when it comes.
            link.abandon(self.tag);
            return Err(link.invalid(format!(
                "{} byte buffer for a response of {} bytes",
                out.len(),
                self.len
            )));
        }
        link.wait_for_into(self.tag, self.op, out)
    }
}

impl<'a> Ticket<'a> {
    /// Detaches the ticket from its borrow of the link, for a holder that cannot keep one (a
    /// read-ahead kept across faults next to the link's owner). Collect it with
    /// [`Link::wait_detached`] or drop the response with [`Link::abandon_detached`]; a detached
    /// ticket that is simply dropped leaves its response parked on the link.
    pub fn detach(mut self) -> DetachedTicket {
        self.done = true;
        DetachedTicket {
            tag: self.tag,
            op: self.op,
            len: self.len,
        }
    }
}

/// A [`Ticket`] without its borrow of the link (see [`Ticket::detach`]).
#[derive(Debug)]
#[must_use = "wait for it or abandon it on its link"]
pub struct DetachedTicket {
    pub(crate) tag: u32,
    pub(crate) op: Opcode,
    pub(crate) len: usize,
}

impl DetachedTicket {
    /// Bytes the response carries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a response without payload.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.link.abandon(self.tag);
        }
    }
}
