//! The node pool: memory the control plane pushes to the node (seed 004's hot-plug; seed 000's
//! remote memory attached ahead of use). An allocation made for the node without a holder
//! (`rackmem ctl alloc --node`, or the REST call) is the node's: the agent attaches each of its
//! segments at once (connects to its brick and ATTACHes with the grant and its proof, which
//! checks the grant and creates the segment on a managed brick) and keeps it in the pool.
//! A process's grow is served from the pool first, with the smallest unused pool allocation
//! that covers it, before the agent asks the control plane for more; the process returns it
//! with `release` or by exiting, and it goes back to the pool, not to the control plane.
//!
//! The agent reports the pool every [`AgentConfig::pool_interval`](super::AgentConfig) and
//! whenever a process takes or returns a pool allocation (`PUT /v1/nodes/{id}/pool`): what it
//! attached and what is in use. A release asked of the control plane for a pool allocation in
//! use is deferred; the report's reply names it, the agent stops handing it out and releases it
//! once no process uses it.

use super::node::for_node;
use super::{lock, Shared};
use crate::api::{Allocation, PoolReport, Segment};
use crate::client::ClientError;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long the agent waits for a brick while attaching a pool segment.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(10);

/// One pool allocation.
struct Entry {
    bytes: u64,
    segments: Vec<Segment>,
    /// The connection using it, and its process.
    user: Option<u64>,
    user_pid: u32,
    /// Its release was asked while in use: released once unused, never handed out again.
    release: bool,
}

/// The node's pool, by allocation id.
#[derive(Default)]
pub(super) struct Pool {
    entries: BTreeMap<u64, Entry>,
}

impl Pool {
    fn report(&self) -> PoolReport {
        PoolReport {
            attached: self.entries.keys().copied().collect(),
            in_use: self
                .entries
                .iter()
                .filter(|(_, e)| e.user.is_some())
                .map(|(&id, _)| id)
                .collect(),
        }
    }

    /// Bytes of pool allocation `id`.
    pub(super) fn bytes_of(&self, id: u64) -> Option<u64> {
        self.entries.get(&id).map(|e| e.bytes)
    }

    pub(super) fn contains(&self, id: u64) -> bool {
        self.entries.contains_key(&id)
    }

    /// Bytes in the pool, and of those in use.
    pub(super) fn bytes(&self) -> (u64, u64) {
        let all = self.entries.values().map(|e| e.bytes).sum();
        let used = self
            .entries
            .values()
            .filter(|e| e.user.is_some())
            .map(|e| e.bytes)
            .sum();
        (all, used)
    }
}

/// Attaches every segment of `a` once: the brick checks the grant and its proof, and a managed
/// brick creates the segment now rather than at a process's first fault.
fn attach(a: &Allocation) -> Result<(), String> {
    let tls = match rackmem_transport::TlsClient::from_env() {
        Some(Ok(t)) => Some(t),
        Some(Err(e)) => return Err(e),
        None => None,
    };
    for s in &a.segments {
        let addr: rackmem_transport::BrickAddr = s
            .brick_address
            .parse()
            .map_err(|e| format!("segment {}: brick address {}: {e}", s.segment_id, s.brick_address))?;
        let grant = hex::decode(&s.grant_hex)
            .ok()
            .and_then(|b| rackmem_proto::Grant::decode(&b).ok())
            .ok_or_else(|| format!("segment {}: the grant does not decode", s.segment_id))?;
        let key: [u8; 32] = hex::decode(&s.session_key_hex)
            .ok()
            .and_then(|k| k.try_into().ok())
            .ok_or_else(|| format!("segment {}: the session key does not decode", s.segment_id))?;
        let link = rackmem_transport::Link::connect_with(&addr, ATTACH_TIMEOUT, tls.as_ref())
            .map_err(|e| format!("segment {}: connecting to {}: {e}", s.segment_id, s.brick_address))?;
        link.attach(&grant, &key)
            .map_err(|e| format!("segment {}: attaching on {}: {e}", s.segment_id, s.brick_address))?;
    }
    Ok(())
}

/// Sends the pool's report and applies the reply: entries whose release was asked are marked,
/// and those no process uses are released now.
fn report(shared: &Shared) -> Result<(), ClientError> {
    let r = lock(&shared.pool).report();
    let reply = for_node(shared, |node| shared.client.report_pool(node, &r))?;
    if !reply.evacuate.is_empty() {
        super::evacuate::start(shared, reply.evacuate);
    }
    let release: HashSet<u64> = reply.release.into_iter().collect();
    let now: Vec<u64> = {
        let mut p = lock(&shared.pool);
        for (id, e) in p.entries.iter_mut() {
            e.release |= release.contains(id);
        }
        let ids: Vec<u64> = p
            .entries
            .iter()
            .filter(|(_, e)| e.release && e.user.is_none())
            .map(|(&id, _)| id)
            .collect();
        for id in &ids {
            p.entries.remove(id);
        }
        ids
    };
    for id in now {
        release_now(shared, id);
    }
    Ok(())
}

fn release_now(shared: &Shared, id: u64) {
    match shared.client.free(id) {
        Ok(r) if r.deferred => {
            // The control plane still saw it in use: the next report clears that, and the
            // release is retried with the others.
            lock(&shared.pending_releases).push(id);
        }
        Ok(_) | Err(ClientError::Server { status: 404, .. }) => {
            eprintln!("rackmem agent: released pool allocation {id}: asked while in use, now unused");
        }
        Err(e) => {
            eprintln!("rackmem agent: releasing pool allocation {id}: {e}; will retry");
            lock(&shared.pending_releases).push(id);
        }
    }
}

/// Lists the node's allocations, attaches the pushed ones not in the pool yet, drops those the
/// control plane no longer has, and reports.
pub(super) fn refresh(shared: &Shared) -> Result<(), ClientError> {
    let node = shared.node.load(Ordering::Acquire);
    if node == 0 {
        return Ok(());
    }
    let list = shared.client.node_allocations(node)?;
    let pushed: Vec<&Allocation> = list.iter().filter(|a| a.holder.is_none()).collect();
    let listed: HashSet<u64> = pushed.iter().map(|a| a.id).collect();
    let new: Vec<&Allocation> = {
        let mut p = lock(&shared.pool);
        // Released by an admin while unused (or lost with the control plane's state).
        p.entries.retain(|id, _| listed.contains(id));
        // Renewed grants: the next process handed one gets the fresh ones.
        for a in &pushed {
            if let Some(e) = p.entries.get_mut(&a.id) {
                e.segments.clone_from(&a.segments);
            }
        }
        pushed.into_iter().filter(|a| !p.entries.contains_key(&a.id)).collect()
    };
    for a in new {
        match attach(a) {
            Ok(()) => {
                let bytes = a.segments.iter().map(|s| s.size_bytes).sum();
                eprintln!(
                    "rackmem agent: allocation {} ({bytes} bytes, {} segments) pushed to this node: attached to its pool",
                    a.id,
                    a.segments.len()
                );
                lock(&shared.pool).entries.insert(
                    a.id,
                    Entry {
                        bytes,
                        segments: a.segments.clone(),
                        user: None,
                        user_pid: 0,
                        release: false,
                    },
                );
            }
            // Not in the pool: tried again at the next refresh.
            Err(e) => eprintln!("rackmem agent: cannot attach pushed allocation {}: {e}", a.id),
        }
    }
    report(shared)
}

/// The smallest unused pool allocation of at least `bytes`, now used by `connection`: its id,
/// size and segments.
pub(super) fn take(shared: &Shared, connection: u64, pid: u32, bytes: u64) -> Option<(u64, u64, Vec<Segment>)> {
    let got = {
        let mut p = lock(&shared.pool);
        let id = p
            .entries
            .iter()
            .filter(|(_, e)| e.user.is_none() && !e.release && e.bytes >= bytes)
            .min_by_key(|(_, e)| e.bytes)
            .map(|(&id, _)| id)?;
        let e = p.entries.get_mut(&id)?;
        e.user = Some(connection);
        e.user_pid = pid;
        (id, e.bytes, e.segments.clone())
    };
    // Said before the process gets it, so a release asked from now on waits for it.
    if let Err(e) = report(shared) {
        eprintln!("rackmem agent: reporting the pool: {e}; will retry");
    }
    // The report's reply may have marked it (its release was asked just before).
    let still = lock(&shared.pool)
        .entries
        .get(&got.0)
        .is_some_and(|e| e.user == Some(connection) && !e.release);
    if still {
        Some(got)
    } else {
        give_back(shared, got.0);
        None
    }
}

/// `connection` no longer uses pool allocation `id`: back to the pool, or released if that
/// was asked meanwhile.
pub(super) fn give_back(shared: &Shared, id: u64) {
    if let Some(e) = lock(&shared.pool).entries.get_mut(&id) {
        e.user = None;
    }
    if let Err(e) = report(shared) {
        eprintln!("rackmem agent: reporting the pool: {e}; will retry");
    }
}

/// The pool's thread: refreshes every `interval` until the agent stops.
pub(super) fn pool_loop(shared: &Shared) {
    let mut said = false;
    while !shared.stop.load(Ordering::Acquire) {
        match refresh(shared) {
            Ok(()) => said = false,
            Err(e) if !said => {
                eprintln!("rackmem agent: cannot refresh the node pool: {e}; will retry");
                said = true;
            }
            Err(_) => {}
        }
        let mut left = shared.cfg.pool_interval;
        while !left.is_zero() && !shared.stop.load(Ordering::Acquire) {
            let step = left.min(Duration::from_millis(100));
            std::thread::sleep(step);
            left -= step;
        }
    }
}

/// What the drain of a brick asks of pool allocation `id`: `None` when it is not in the pool;
/// `Some(None)` when no process used it: it is out of the pool and released now; `Some(Some(pid))`:
/// process `pid` uses it and must move its pages first.
pub(super) fn evacuate(shared: &Shared, id: u64) -> Option<Option<u32>> {
    let unused = {
        let mut p = lock(&shared.pool);
        let e = p.entries.get(&id)?;
        if e.user.is_some() {
            return Some(Some(e.user_pid));
        }
        p.entries.remove(&id);
        true
    };
    if unused {
        eprintln!("rackmem agent: pool allocation {id} has a segment on a draining brick and is unused: released");
        match shared.client.free(id) {
            Ok(_) | Err(ClientError::Server { status: 404, .. }) => {}
            Err(e) => {
                eprintln!("rackmem agent: releasing pool allocation {id}: {e}; will retry");
                lock(&shared.pending_releases).push(id);
            }
        }
    }
    Some(None)
}
