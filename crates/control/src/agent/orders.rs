//! Orders to processes (`rackmem migrate --pid`): each runtime opens a second connection at
//! start and says `orders` on it; the agent keeps it, by the process's pid, to forward a caller's
//! `migrate` and read the answer. Only root or the process's owner (by `SO_PEERCRED` on both
//! connections) may order a process; one order runs at a time per process, and the caller waits
//! at most its timeout (an answer that comes later is recognised by its order number and
//! skipped).

use super::protocol::{reply, Reply};
use super::{lock, Shared};
use rackmem_proto::AgentRequest;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

/// How long a caller waits for a migration when it names no timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// The longest wait a caller may ask for.
const MAX_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the agent waits for a process to empty its segments on a draining brick: the
/// pages of a segment cross the node (or go brick to brick) at link speed, so even a large
/// one takes well under this; a process that takes longer is asked again at a later report.
const EVACUATE_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest answer line read from a runtime.
const MAX_ANSWER: u64 = 64 << 10;

/// A process's order connection.
pub(super) struct OrderLine {
    uid: u32,
    conn: Mutex<(UnixStream, BufReader<UnixStream>)>,
}

/// The order connections, by pid.
pub(super) type OrderLines = std::collections::HashMap<u32, Arc<OrderLine>>;

/// Keeps `conn` as the order connection of process `cred.pid` (replacing one a process of the
/// same pid left) after answering `orders`.
pub(super) fn register(
    shared: &Shared,
    cred: &rackmem_sys::PeerCredentials,
    mut out: UnixStream,
    reader: BufReader<UnixStream>,
) {
    if reply(&mut out, &Reply::done()).is_err() {
        return;
    }
    let line = Arc::new(OrderLine {
        uid: cred.uid,
        conn: Mutex::new((out, reader)),
    });
    lock(&shared.orders).insert(cred.pid, line);
}

/// Forgets the order connection of a process whose main connection closed.
pub(super) fn forget(shared: &Shared, pid: u32) {
    if let Some(l) = lock(&shared.orders).remove(&pid) {
        let c = lock(&l.conn);
        let _ = c.0.shutdown(std::net::Shutdown::Both);
    }
}

/// The address of brick `to` (its name, id or address), or `local`.
fn resolve(shared: &Shared, to: &str) -> Result<String, Box<Reply>> {
    if to == "local" {
        return Ok(to.to_string());
    }
    let bricks = shared
        .client
        .bricks()
        .map_err(|e| Box::new(super::protocol::client_refusal(&e)))?;
    match bricks
        .iter()
        .find(|b| b.name == to || b.address == to || b.id.to_string() == to)
    {
        Some(b) => Ok(b.address.clone()),
        None => Err(Box::new(Reply::refused(
            "unknown_brick",
            format!(
                "no brick {to:?}: the control plane has {}",
                if bricks.is_empty() {
                    "none".to_string()
                } else {
                    bricks.iter().map(|b| b.name.as_str()).collect::<Vec<_>>().join(", ")
                }
            ),
        ))),
    }
}

/// Forwards a caller's `migrate` to process `pid` and returns its answer.
pub(super) fn migrate(
    shared: &Shared,
    caller: &rackmem_sys::PeerCredentials,
    pid: u32,
    addr: u64,
    len: u64,
    to: &str,
    timeout_ms: u64,
) -> Reply {
    let Some(line) = lock(&shared.orders).get(&pid).cloned() else {
        return Reply::refused(
            "unknown_process",
            format!(
                "no process {pid} on this node's agent memory takes orders (is it running under rackmem run --agent?)"
            ),
        );
    };
    if caller.uid != 0 && caller.uid != line.uid {
        return Reply::refused(
            "permission_denied",
            format!(
                "uid {} may not move the memory of process {pid}: only root and its owner (uid {}) may",
                caller.uid, line.uid
            ),
        );
    }
    if len == 0 {
        return Reply::refused("outside_window", "an empty range");
    }
    let to = match resolve(shared, to) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let timeout = if timeout_ms == 0 {
        DEFAULT_TIMEOUT
    } else {
        Duration::from_millis(timeout_ms).min(MAX_TIMEOUT)
    };
    send(shared, pid, &line, timeout, |order| AgentRequest::Migrate {
        pid,
        addr,
        len,
        to: to.clone(),
        order,
        timeout_ms: timeout.as_millis() as u64,
    })
}

/// Orders process `pid` to move every page held on the segments of `moves` to their targets
/// and return their allocations (a brick drains); waits at most [`EVACUATE_TIMEOUT`].
pub(super) fn evacuate(shared: &Shared, pid: u32, moves: Vec<rackmem_proto::EvacuateMove>) -> Reply {
    let Some(line) = lock(&shared.orders).get(&pid).cloned() else {
        return Reply::refused(
            "unknown_process",
            format!("process {pid} takes no orders (its runtime opened no order connection)"),
        );
    };
    send(shared, pid, &line, EVACUATE_TIMEOUT, move |order| {
        AgentRequest::Evacuate { moves, order }
    })
}

/// Sends the order `req(number)` on `line` (one order at a time per process: `busy` while
/// another runs) and waits at most `timeout` for its answer.
fn send(
    shared: &Shared,
    pid: u32,
    line: &Arc<OrderLine>,
    timeout: Duration,
    req: impl FnOnce(u64) -> AgentRequest,
) -> Reply {
    let mut conn = match line.conn.try_lock() {
        Ok(c) => c,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        Err(TryLockError::WouldBlock) => {
            return Reply::refused(
                "busy",
                format!("process {pid} is carrying out another order; one at a time: try again when it ends"),
            )
        }
    };
    let order = shared.next_order.fetch_add(1, Ordering::Relaxed);
    let req = req(order);
    let gone = |why: String| {
        Reply::refused(
            "unknown_process",
            format!("process {pid} did not take the order: {why}"),
        )
    };
    let mut text = match serde_json::to_string(&req) {
        Ok(t) => t,
        Err(e) => return Reply::refused("internal", e.to_string()),
    };
    text.push('\n');
    let _ = conn.0.set_write_timeout(Some(super::protocol::WRITE_TIMEOUT));
    if let Err(e) = conn.0.write_all(text.as_bytes()) {
        drop(conn);
        lock(&shared.orders).retain(|_, l| !Arc::ptr_eq(l, line));
        return gone(e.to_string());
    }
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || conn.1.get_ref().set_read_timeout(Some(left)).is_err() {
            return timed_out(pid, timeout);
        }
        let mut answer = String::new();
        match Read::take(&mut conn.1, MAX_ANSWER).read_line(&mut answer) {
            Ok(0) => {
                drop(conn);
                lock(&shared.orders).retain(|_, l| !Arc::ptr_eq(l, line));
                return gone("it exited".into());
            }
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return timed_out(pid, timeout);
            }
            Err(e) => return gone(e.to_string()),
        }
        let Ok(r) = serde_json::from_str::<Reply>(&answer) else {
            return Reply::refused(
                "bad_answer",
                format!("process {pid} answered something else: {answer:?}"),
            );
        };
        // An answer to an order the agent stopped waiting for.
        if r.order != Some(order) {
            continue;
        }
        return r;
    }
}

fn timed_out(pid: u32, timeout: Duration) -> Reply {
    Reply::refused(
        "timeout",
        format!(
            "process {pid} did not finish the migration within {} s (it goes on; its answer is dropped)",
            timeout.as_secs_f64()
        ),
    )
}
