//! One process's connection: its requests answered in order (hello first; grows checked
//! against the quotas, then allocated with an idempotency key and a holder; one-sided
//! segments, named or not; releases; rates), and everything it holds returned when it closes.

use super::node::for_node;
use super::protocol::{
    client_refusal, parse_request, read_request, refusal, reply, Line, Reply, Request, MAX_LINE, WRITE_TIMEOUT,
};
use super::reconcile::process_start_ticks;
use super::{lock, Shared};
use crate::api::{AllocationRequest, Holder};
use crate::client::{new_idempotency_key, ClientError};
use std::collections::HashMap;
use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;

/// A segment of an allocation as a process receives it.
fn agent_segment(s: &crate::api::Segment) -> rackmem_proto::AgentSegment {
    rackmem_proto::AgentSegment {
        brick_id: s.brick_id,
        brick_address: s.brick_address.clone(),
        segment_id: s.segment_id,
        offset: s.offset,
        size_bytes: s.size_bytes,
        grant_hex: s.grant_hex.clone(),
        session_key_hex: s.session_key_hex.clone(),
        rate_limit_bps: s.rate_limit_bps,
        grant_expires_unix_s: s.grant_expires_unix_s,
    }
}

/// Per-connection state.
struct Connection<'a> {
    shared: &'a Shared,
    id: u64,
    cred: rackmem_sys::PeerCredentials,
    start_ticks: u64,
    /// Allocation → bytes.
    mine: HashMap<u64, u64>,
    /// Pool allocations this connection uses (memory pushed to the node).
    pooled: std::collections::HashSet<u64>,
    /// Named segments this connection holds, by their allocation.
    named: HashMap<u64, super::named::Hold>,
}

impl Connection<'_> {
    fn grow(&mut self, bytes: u64, brick: Option<&str>) -> Reply {
        self.allocate(bytes, brick, false)
    }

    /// A grow (`single`: one segment, never from the pool: a one-sided segment of its own).
    fn allocate(&mut self, bytes: u64, brick: Option<&str>, single: bool) -> Reply {
        let shared = self.shared;
        // A migration's target: one segment on that brick, placed and accounted by the control
        // plane like any allocation (it refuses a brick that is full or not the node's to use).
        let on = match brick {
            None => None,
            Some(address) => match shared.client.bricks() {
                Ok(list) => match list.iter().find(|b| b.address == address) {
                    Some(b) => Some(b.id),
                    None => return refusal("not_found", format!("no brick at {address}")),
                },
                Err(e) => return client_refusal(&e),
            },
        };
        // Memory pushed to the node first: it is attached already and counts to no quota (an
        // admin gave it to the node).
        if on.is_none() && !single {
            if let Some((id, _, segments)) = super::pool::take(shared, self.id, self.cred.pid, bytes) {
                self.pooled.insert(id);
                return Reply::grown(id, segments.iter().map(agent_segment).collect());
            }
        }
        let cfg = &shared.cfg;
        let (uid, pid) = (self.cred.uid, self.cred.pid);
        // Checked and reserved under one lock, before the control plane is asked.
        let reserved = lock(&shared.holdings).reserve(cfg, self.id, uid, pid, bytes);
        if let Err(why) = reserved {
            return self.over_quota(why);
        }
        let holder = self.holder();
        // One key for this grow, kept across the client's retries and a re-registration.
        let key = new_idempotency_key();
        let req = |node| AllocationRequest {
            node,
            size_bytes: bytes,
            stripe: Some(if on.is_some() || single { 1 } else { cfg.stripe.max(1) }),
            bricks: on.map(|b| vec![b]),
            idempotency_key: Some(key.clone()),
            holder: Some(holder.clone()),
            ..Default::default()
        };
        let r = for_node(shared, |node| shared.client.allocate(&req(node)));
        let mut h = lock(&shared.holdings);
        h.answered(self.id, uid, pid, bytes);
        match r {
            Ok(a) => {
                let size: u64 = a.segments.iter().map(|s| s.size_bytes).sum();
                h.hold(a.id, self.id, uid, pid, size);
                drop(h);
                self.mine.insert(a.id, size);
                shared.counters.allocations.fetch_add(1, Ordering::Relaxed);
                shared.counters.bytes.fetch_add(size, Ordering::Relaxed);
                Reply::grown(a.id, a.segments.iter().map(agent_segment).collect())
            }
            Err(e) => {
                drop(h);
                shared.counters.refusals.fetch_add(1, Ordering::Relaxed);
                client_refusal(&e)
            }
        }
    }

    /// `segment`: a one-sided segment: the named segment `name` (created with `bytes` if it
    /// does not exist), or one of `bytes` of this connection's own.
    fn segment(&mut self, name: Option<String>, bytes: u64) -> Reply {
        let Some(name) = name else {
            if bytes == 0 {
                return refusal("bad_request", "a segment of 0 bytes");
            }
            return self.allocate(bytes, None, true);
        };
        let shared = self.shared;
        let (uid, pid) = (self.cred.uid, self.cred.pid);
        // The opener's quotas: a hold counts its size to the process and its user, as a grow
        // does (checked with the size asked for; an open of an existing name asks for 0).
        let reserved = lock(&shared.holdings).reserve(&shared.cfg, self.id, uid, pid, bytes);
        if let Err(why) = reserved {
            return self.over_quota(why);
        }
        let holder = self.holder();
        let req = |node| crate::api::SegmentOpen {
            node,
            name: name.clone(),
            size_bytes: bytes,
            holder: holder.clone(),
        };
        let r = for_node(shared, |node| shared.client.open_segment(&req(node)));
        let mut h = lock(&shared.holdings);
        h.answered(self.id, uid, pid, bytes);
        let s = match r {
            Ok(s) => s,
            Err(e) => {
                drop(h);
                shared.counters.refusals.fetch_add(1, Ordering::Relaxed);
                return client_refusal(&e);
            }
        };
        // The reservation was for the size asked for (0 for an open of an existing name): a new
        // hold must fit the quotas at the segment's real size, or this open is undone.
        let fits = match self.named.contains_key(&s.allocation) {
            true => Ok(()),
            false => h.fits(&shared.cfg, uid, pid, s.size_bytes),
        };
        if let Err(why) = fits {
            drop(h);
            if let Err(e) = super::named::close(shared, &name, &holder) {
                // The agent's reconcile closes holds nobody has; say why this one stayed.
                eprintln!("rackmem agent: closing the refused open of segment {name:?}: {e}");
            }
            return self.over_quota(why);
        }
        let Some(seg) = s.segment.as_ref() else {
            return refusal(
                "control_plane_error",
                format!("segment {name:?} came without its grant"),
            );
        };
        let hold = self.named.entry(s.allocation).or_insert_with(|| {
            h.hold_named(&name, self.id, uid, pid, s.size_bytes);
            super::named::Hold {
                name: name.clone(),
                bytes: s.size_bytes,
                opens: 0,
            }
        });
        hold.opens = hold.opens.saturating_add(1);
        drop(h);
        Reply::grown(s.allocation, vec![agent_segment(seg)])
    }

    /// Releases one open of named segment `allocation`; the last closes this connection's hold.
    fn close_named(&mut self, allocation: u64) -> Reply {
        let Some(hold) = self.named.get_mut(&allocation) else {
            return refusal("not_found", format!("allocation {allocation} is not this process's"));
        };
        hold.opens = hold.opens.saturating_sub(1);
        if hold.opens > 0 {
            return Reply::done();
        }
        let name = hold.name.clone();
        match super::named::close(self.shared, &name, &self.holder()) {
            Ok(()) => {
                self.forget_named(allocation);
                Reply::done()
            }
            Err(e) => {
                // Still held: a later release (or the connection's close) tries again.
                if let Some(h) = self.named.get_mut(&allocation) {
                    h.opens = 1;
                }
                client_refusal(&e)
            }
        }
    }

    /// Forgets a named segment this connection held.
    fn forget_named(&mut self, allocation: u64) {
        if let Some(h) = self.named.remove(&allocation) {
            lock(&self.shared.holdings).release_named(&h.name, self.id, self.cred.uid, self.cred.pid, h.bytes);
        }
    }

    /// A request refused by the agent's own quotas (counted with the refusals).
    fn over_quota(&self, why: String) -> Reply {
        self.shared.counters.refusals.fetch_add(1, Ordering::Relaxed);
        refusal("quota_exceeded", why)
    }

    /// This connection's process, as the control plane records who holds what.
    fn holder(&self) -> Holder {
        Holder {
            agent: self.shared.run.clone(),
            connection: self.id,
            pid: self.cred.pid,
            uid: self.cred.uid,
            start_ticks: self.start_ticks,
        }
    }

    /// `clone`: a copy-on-write clone of each source (an allocation this connection holds) for
    /// the child of the `fork` the process is about to make; pending until the child adopts them
    /// (see `clones`). All or nothing.
    fn clone_for_child(&mut self, sources: Vec<rackmem_proto::CloneSource>) -> Reply {
        use super::clones::{new_ticket, Pending, ADOPT_WITHIN, MAX_PENDING_PER_PROCESS, MAX_SOURCES};
        let shared = self.shared;
        if sources.is_empty() || sources.len() > MAX_SOURCES {
            return refusal(
                "bad_request",
                format!("clone names 1 to {MAX_SOURCES} allocations, not {}", sources.len()),
            );
        }
        let mut bytes = 0u64;
        for s in &sources {
            let held = self.mine.get(&s.allocation).copied().or_else(|| {
                self.pooled
                    .contains(&s.allocation)
                    .then(|| lock(&shared.pool).bytes_of(s.allocation))
                    .flatten()
            });
            match held {
                Some(b) => bytes = bytes.saturating_add(b),
                None => {
                    return refusal(
                        "not_found",
                        format!("allocation {} is not this process's: it cannot be cloned", s.allocation),
                    )
                }
            }
        }
        let (uid, pid) = (self.cred.uid, self.cred.pid);
        let waiting = lock(&shared.clones).pending_of(pid);
        if waiting + sources.len() > MAX_PENDING_PER_PROCESS {
            shared.counters.refusals.fetch_add(1, Ordering::Relaxed);
            return refusal(
                "too_many_clones",
                format!(
                    "pid {pid} has {waiting} clones waiting for forked children that have not taken them; \
                     at most {MAX_PENDING_PER_PROCESS} may wait at once"
                ),
            );
        }
        let ticket = match new_ticket() {
            Ok(t) => t,
            Err(why) => return refusal("agent_error", why),
        };
        let reserved = lock(&shared.holdings).reserve_for_child(&shared.cfg, self.id, uid, bytes);
        if let Err(why) = reserved {
            return self.over_quota(why);
        }
        let holder = self.holder();
        let mut made: Vec<crate::api::Allocation> = Vec::new();
        let mut failed = None;
        for s in &sources {
            let req = crate::api::CloneRequest {
                segments: Some(s.segments.clone()),
                idempotency_key: Some(new_idempotency_key()),
                holder: Some(holder.clone()),
            };
            match shared.client.clone_allocation(s.allocation, &req) {
                Ok(a) => made.push(a),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        // Clones before holdings, as `adopt` takes them.
        let mut c = lock(&shared.clones);
        let mut h = lock(&shared.holdings);
        h.answered(self.id, uid, 0, bytes);
        if let Some(e) = failed {
            drop(h);
            drop(c);
            for a in &made {
                if shared.client.free(a.id).is_err() {
                    lock(&shared.pending_releases).push(a.id);
                }
            }
            shared.counters.refusals.fetch_add(1, Ordering::Relaxed);
            return client_refusal(&e);
        }
        let deadline = std::time::Instant::now() + ADOPT_WITHIN;
        let mut clones = Vec::new();
        for a in made {
            let size: u64 = a.segments.iter().map(|s| s.size_bytes).sum();
            h.hold(a.id, 0, uid, 0, size);
            c.pending.insert(
                a.id,
                Pending {
                    parent_pid: pid,
                    uid,
                    ticket,
                    bytes: size,
                    deadline,
                },
            );
            shared.counters.allocations.fetch_add(1, Ordering::Relaxed);
            shared.counters.bytes.fetch_add(size, Ordering::Relaxed);
            clones.push(rackmem_proto::AgentClone {
                allocation: a.id,
                segments: a.segments.iter().map(agent_segment).collect(),
            });
        }
        Reply::cloned(clones, hex::encode(ticket))
    }

    /// `adopt`: the forked child takes the clones its parent asked for.
    fn adopt(&mut self, allocations: &[u64], ticket: &str) -> Reply {
        let shared = self.shared;
        let Ok(ticket) = hex::decode(ticket) else {
            return refusal("bad_request", "ticket is not hex");
        };
        let (uid, pid) = (self.cred.uid, self.cred.pid);
        if allocations.is_empty() || allocations.len() > super::clones::MAX_SOURCES {
            return refusal("bad_request", "adopt names 1 to 256 clones");
        }
        let mut c = lock(&shared.clones);
        let mut parent = None;
        for id in allocations {
            match c.pending.get(id) {
                Some(p) if p.uid == uid && p.parent_pid != pid && rackmem_proto::constant_time_eq(&p.ticket, &ticket) => {
                    parent = Some(p.parent_pid);
                }
                _ => {
                    return refusal(
                        "not_found",
                        format!("allocation {id} is no clone waiting for pid {pid} (wrong ticket, user or process, or its time ran out)"),
                    )
                }
            }
        }
        if let Some(parent) = parent {
            // The ticket was in the parent's memory at the fork; the child is the process that
            // has it. A parent that exited already (a daemonizing one) left an orphan, which
            // the init process adopted.
            let ppid = super::clones::parent_of(pid);
            if ppid != Some(parent) && super::reconcile::process_start_ticks(parent).is_some() {
                return refusal(
                    "permission_denied",
                    format!("pid {pid} is not a child of pid {parent}, which asked for the clones"),
                );
            }
        }
        let mut h = lock(&shared.holdings);
        for id in allocations {
            if let Some(p) = c.pending.remove(id) {
                h.release(*id, p.uid, 0, p.bytes);
                h.hold(*id, self.id, uid, pid, p.bytes);
                self.mine.insert(*id, p.bytes);
            }
        }
        Reply::done()
    }

    /// Forgets an allocation this connection held (released, or handed to the pending list).
    fn forget(&mut self, id: u64) {
        let Some(size) = self.mine.remove(&id) else {
            return;
        };
        lock(&self.shared.holdings).release(id, self.cred.uid, self.cred.pid, size);
        self.shared.counters.allocations.fetch_sub(1, Ordering::Relaxed);
        self.shared.counters.bytes.fetch_sub(size, Ordering::Relaxed);
    }

    fn answer(&mut self, req: Request, hello: &mut bool, who: &mut String) -> Reply {
        let shared = self.shared;
        match req {
            Request::Hello { pid, program } => {
                *hello = true;
                // The pid the process claims is only for the log; the kernel's is used.
                *who = format!("pid {} ({program}, says pid {pid})", self.cred.pid);
                Reply::hello(shared.node.load(Ordering::Acquire))
            }
            _ if !*hello => refusal("bad_request", "say hello first"),
            Request::Grow { bytes, brick } => self.grow(bytes, brick.as_deref()),
            Request::Segment { name, bytes } => self.segment(name, bytes),
            Request::Release { allocation } if self.named.contains_key(&allocation) => self.close_named(allocation),
            Request::Release { allocation } if self.pooled.remove(&allocation) => {
                super::pool::give_back(shared, allocation);
                Reply::done()
            }
            Request::Release { allocation } => {
                if !self.mine.contains_key(&allocation) {
                    refusal("not_found", format!("allocation {allocation} is not this process's"))
                } else {
                    match shared.client.free(allocation) {
                        Ok(_) | Err(ClientError::Server { status: 404, .. }) => {
                            self.forget(allocation);
                            Reply::done()
                        }
                        Err(e) => client_refusal(&e),
                    }
                }
            }
            Request::Rates => match for_node(shared, |node| shared.client.rates(node)) {
                Ok(r) => {
                    let rates = r
                        .segments
                        .iter()
                        .filter(|s| self.mine.contains_key(&s.allocation) || self.pooled.contains(&s.allocation))
                        .map(|s| rackmem_proto::AgentRate {
                            segment_id: s.segment_id,
                            rate_limit_bps: s.rate_limit_bps,
                        })
                        .collect();
                    Reply::rates(rates)
                }
                Err(e) => client_refusal(&e),
            },
            Request::Clone { sources } => self.clone_for_child(sources),
            Request::Adopt { allocations, ticket } => self.adopt(&allocations, &ticket),
            Request::Orders => refusal("bad_request", "orders is the first and only request of a connection"),
            Request::Evacuate { .. } => refusal(
                "bad_request",
                "evacuate is an order the agent sends a process when a brick drains, not a request",
            ),
            Request::Migrate {
                pid,
                addr,
                len,
                to,
                timeout_ms,
                ..
            } => super::orders::migrate(shared, &self.cred, pid, addr, len, &to, timeout_ms),
            Request::Report(r) => match r.validate() {
                Ok(()) => {
                    let mut r = *r;
                    // The pid the process claims is not trusted: the kernel's is stored.
                    r.pid = self.cred.pid;
                    super::report::store(shared, self.id, self.cred.uid, r);
                    Reply::done()
                }
                Err(why) => refusal("bad_request", format!("report: {why}")),
            },
        }
    }
}

/// Serves one admitted process until it closes the connection or breaks the protocol, then
/// returns everything it was given.
pub(super) fn serve(shared: &Shared, conn: UnixStream, cred: rackmem_sys::PeerCredentials) {
    let mut c = Connection {
        shared,
        id: shared.next_connection.fetch_add(1, Ordering::Relaxed),
        cred,
        start_ticks: process_start_ticks(cred.pid).unwrap_or(0),
        mine: HashMap::new(),
        pooled: std::collections::HashSet::new(),
        named: HashMap::new(),
    };
    let mut who = format!("pid {}", cred.pid);
    let mut hello = false;
    let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
    let Ok(reader) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(reader);
    let mut out = conn;
    let mut line = Vec::new();
    loop {
        let answer = match read_request(&mut reader, &mut line, shared.cfg.request_timeout) {
            Line::Closed => break,
            Line::TooLong => {
                // The rest of the line cannot be told from the next request: answer and close.
                let _ = reply(
                    &mut out,
                    &refusal(
                        "request_too_long",
                        format!("a request line is at most {MAX_LINE} bytes"),
                    ),
                );
                break;
            }
            Line::TimedOut => {
                let _ = reply(
                    &mut out,
                    &refusal(
                        "request_timeout",
                        format!(
                            "a request line must arrive whole within {} ms of its first byte",
                            shared.cfg.request_timeout.as_millis()
                        ),
                    ),
                );
                break;
            }
            Line::Got => match parse_request(&line) {
                Ok(Request::Orders) if !hello => {
                    // A runtime's order connection: kept until its process's main connection
                    // closes; this thread is done with it.
                    super::orders::register(shared, &cred, out, reader);
                    return;
                }
                Ok(req) => c.answer(req, &mut hello, &mut who),
                Err(refused) => *refused,
            },
        };
        if reply(&mut out, &answer).is_err() {
            break;
        }
    }
    super::report::forget(shared, c.id);
    if hello {
        super::orders::forget(shared, cred.pid);
    }
    // The process is gone (or broke the protocol): everything it had goes back, pool memory
    // to the pool.
    for id in std::mem::take(&mut c.pooled) {
        super::pool::give_back(shared, id);
    }
    // Its named segments' holds close (the last holder's close frees the segment); one the
    // control plane misses is closed by the next reconciliation, which finds it unheld.
    let named: Vec<u64> = c.named.keys().copied().collect();
    for id in named {
        let Some(name) = c.named.get(&id).map(|h| h.name.clone()) else {
            continue;
        };
        if let Err(e) = super::named::close(shared, &name, &c.holder()) {
            eprintln!("rackmem agent: closing segment {name:?} of {who}: {e}; will retry");
        }
        c.forget_named(id);
    }
    let ids: Vec<u64> = c.mine.keys().copied().collect();
    for id in ids {
        c.forget(id);
        match shared.client.free(id) {
            Ok(_) | Err(ClientError::Server { status: 404, .. }) => {}
            Err(e) => {
                eprintln!("rackmem agent: returning allocation {id} of {who}: {e}; will retry");
                lock(&shared.pending_releases).push(id);
            }
        }
    }
}
