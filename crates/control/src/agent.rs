//! The node agent: registers its node with the control plane and hands segments to the node's
//! processes over a Unix socket (seed 004's agent on each compute brick; seed 000's dynamic
//! attachment: memory grows while programs run).
//!
//! Who may ask: the accept thread reads each connection's peer credentials (`SO_PEERCRED`,
//! which the peer cannot forge) and admits root, the agent's own user, and the users and groups
//! named by [`AgentConfig::allow_uids`] / [`AgentConfig::allow_gids`]; anyone else gets one JSON
//! error line and is disconnected. At most [`AgentConfig::max_connections`] processes are served
//! at once, one thread each (small stacks); a connection over the cap gets an error line.
//!
//! One thread per admitted connection speaks the JSON-lines protocol of
//! `docs/control-plane.md` ("The agent and its processes"). Every request gets exactly one
//! reply, malformed ones included; a request line must arrive whole within
//! [`AgentConfig::request_timeout`] (idle time between requests is unlimited: processes hold
//! their connection for life). Grows are checked against per-process and per-user quotas before
//! the control plane is asked, and carry a fresh idempotency key and a [`Holder`] naming this
//! agent run, the connection and the process.
//!
//! Everything a connection was given is returned when it closes, so a process that exits,
//! crashes or is killed never keeps memory. A release the control plane cannot take right now
//! is retried in the background until it succeeds. The same background thread reconciles at
//! start and every [`AgentConfig::reconcile_interval`]: it releases every allocation of this
//! node that an agent made and nobody holds (see [`orphans`]), e.g. one whose reply was lost.

use crate::api::{Allocation, AllocationRequest, Holder, NodeRegistration};
use crate::client::{new_idempotency_key, Client, ClientError};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Longest request line a process may send.
pub const MAX_LINE: usize = 64 << 10;

/// Stack of a connection thread: JSON and an HTTP call need far less than the 2 MiB default,
/// and a thousand connections should not reserve 2 GiB of address space.
const CONNECTION_STACK_BYTES: usize = 256 << 10;

/// How long a reply may take to be written before the connection is dropped (a process that
/// does not read its replies must not hold a thread forever).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors starting the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The socket could not be created.
    #[error("cannot listen on {path}: {cause}")]
    Listen {
        /// Socket path.
        path: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
    /// A thread could not be started.
    #[error("cannot start the agent's threads: {0}")]
    Thread(std::io::Error),
    /// The configuration cannot work.
    #[error("{0}")]
    Config(String),
}

/// How to run an agent.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Where processes connect.
    pub socket: PathBuf,
    /// The node's registration (name and ports).
    pub registration: NodeRegistration,
    /// Over how many bricks each allocation is spread.
    pub stripe: u32,
    /// Users admitted besides root and the agent's own user.
    pub allow_uids: Vec<u32>,
    /// Groups admitted (a process whose primary or supplementary group is one of these).
    pub allow_gids: Vec<u32>,
    /// Most bytes the processes of one user may hold at once.
    pub quota_per_uid_bytes: u64,
    /// Most bytes one process may hold at once.
    pub quota_per_process_bytes: u64,
    /// Most process connections served at once.
    pub max_connections: usize,
    /// How long a request line may take to arrive once it has begun.
    pub request_timeout: Duration,
    /// How often to release allocations nobody holds (also done once at start).
    pub reconcile_interval: Duration,
}

impl AgentConfig {
    /// A configuration with the defaults of `rackmem agent`.
    pub fn new(socket: PathBuf, registration: NodeRegistration) -> AgentConfig {
        AgentConfig {
            socket,
            registration,
            stripe: 1,
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
            quota_per_uid_bytes: DEFAULT_QUOTA_PER_UID_BYTES,
            quota_per_process_bytes: DEFAULT_QUOTA_PER_PROCESS_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            reconcile_interval: DEFAULT_RECONCILE_INTERVAL,
        }
    }
}

/// Default of [`AgentConfig::quota_per_process_bytes`]: 64 GiB.
pub const DEFAULT_QUOTA_PER_PROCESS_BYTES: u64 = 64 << 30;
/// Default of [`AgentConfig::quota_per_uid_bytes`]: 256 GiB.
pub const DEFAULT_QUOTA_PER_UID_BYTES: u64 = 256 << 30;
/// Default of [`AgentConfig::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default of [`AgentConfig::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`AgentConfig::reconcile_interval`].
pub const DEFAULT_RECONCILE_INTERVAL: Duration = Duration::from_secs(30);

/// Counters, for the agent's `--metrics` and its log.
#[derive(Debug, Default)]
pub struct AgentCounters {
    /// Processes connected now.
    pub processes: AtomicU64,
    /// Allocations handed out and not yet returned.
    pub allocations: AtomicU64,
    /// Bytes in those allocations.
    pub bytes: AtomicU64,
    /// Requests refused (by the agent or the control plane).
    pub refusals: AtomicU64,
    /// Connections refused (peer not admitted, or over the connection cap).
    pub connections_refused: AtomicU64,
    /// Allocations released by reconciliation because nobody held them.
    pub reclaimed: AtomicU64,
    /// Grant renewals of held allocations (leases).
    pub renewed: AtomicU64,
}

/// What this agent run's connections hold and are asking for, under one lock so that
/// reconciliation sees a grow either in flight or held, never neither.
#[derive(Default)]
struct Holdings {
    /// Allocation → (connection, uid, pid, bytes).
    held: HashMap<u64, (u64, u32, u32, u64)>,
    /// Connection → grows asked of the control plane and not answered yet.
    in_flight: HashMap<u64, u32>,
    /// Bytes held or being asked for, per user and per process.
    per_uid: HashMap<u32, u64>,
    per_pid: HashMap<u32, u64>,
}

impl Holdings {
    fn add(&mut self, uid: u32, pid: u32, bytes: u64) {
        *self.per_uid.entry(uid).or_default() += bytes;
        *self.per_pid.entry(pid).or_default() += bytes;
    }

    fn sub(&mut self, uid: u32, pid: u32, bytes: u64) {
        for (m, k) in [(&mut self.per_uid, uid), (&mut self.per_pid, pid)] {
            if let Some(v) = m.get_mut(&k) {
                *v = v.saturating_sub(bytes);
                if *v == 0 {
                    m.remove(&k);
                }
            }
        }
    }
}

struct Shared {
    client: Client,
    cfg: AgentConfig,
    /// This run's name in [`Holder::agent`].
    run: String,
    node: AtomicU64,
    counters: AgentCounters,
    holdings: Mutex<Holdings>,
    /// Releases the control plane has not acknowledged yet.
    pending_releases: Mutex<Vec<u64>>,
    next_connection: AtomicU64,
    stop: AtomicBool,
}

/// A running agent.
pub struct Agent {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// The operations of the protocol.
const OPS: [&str; 4] = ["hello", "grow", "release", "rates"];

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
enum Request {
    Hello {
        #[serde(default)]
        pid: u32,
        #[serde(default)]
        program: String,
    },
    Grow {
        bytes: u64,
    },
    Release {
        allocation: u64,
    },
    Rates,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: &'a str,
    message: String,
}

fn refusal(code: &str, message: impl Into<String>) -> serde_json::Value {
    serde_json::json!({"ok": false, "error": ErrorBody { code, message: message.into() }})
}

fn client_refusal(e: &ClientError) -> serde_json::Value {
    match e {
        ClientError::Server { code, message, .. } => refusal(code, message.clone()),
        ClientError::Unreachable { .. } => refusal("control_plane_unreachable", e.to_string()),
        other => refusal("control_plane_error", other.to_string()),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Agent {
    /// Registers the node (waiting, with a message, while the control plane is unreachable),
    /// then listens on the socket.
    pub fn start(client: Client, cfg: AgentConfig) -> Result<Agent, AgentError> {
        if cfg.max_connections == 0 {
            return Err(AgentError::Config("--max-connections must be at least 1".into()));
        }
        if cfg.request_timeout.is_zero() || cfg.reconcile_interval.is_zero() {
            return Err(AgentError::Config(
                "--request-timeout and --reconcile-interval must be positive".into(),
            ));
        }
        let listener = bind(&cfg)?;
        let shared = Arc::new(Shared {
            client,
            cfg,
            run: format!("agent-{}", new_idempotency_key()),
            node: AtomicU64::new(0),
            counters: AgentCounters::default(),
            holdings: Mutex::new(Holdings::default()),
            pending_releases: Mutex::new(Vec::new()),
            next_connection: AtomicU64::new(1),
            stop: AtomicBool::new(false),
        });
        register(&shared);
        let mut threads = Vec::new();
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("agent-accept".into())
                .spawn(move || accept_loop(&s, listener))
                .map_err(AgentError::Thread)?,
        );
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("agent-release".into())
                .spawn(move || release_loop(&s))
                .map_err(AgentError::Thread)?,
        );
        Ok(Agent { shared, threads })
    }

    /// The node id the control plane gave.
    pub fn node(&self) -> u64 {
        self.shared.node.load(Ordering::Acquire)
    }

    /// Counters so far.
    pub fn counters(&self) -> &AgentCounters {
        &self.shared.counters
    }

    /// Releases now the allocations nobody holds (see [`orphans`]); returns their ids.
    pub fn reconcile(&self) -> Result<Vec<u64>, ClientError> {
        reconcile(&self.shared)
    }

    /// Stops accepting, removes the socket, and waits for the background threads. Processes
    /// still connected keep their connection threads until they close.
    pub fn stop(mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wake the accept loop.
        let _ = UnixStream::connect(&self.shared.cfg.socket);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.shared.cfg.socket);
    }
}

/// The socket's permission bits: only root and the agent's user unless others are admitted;
/// a single admitted group gets group access (the socket's group is set to it); any other
/// admission (a user, several groups) needs the file open to all, and the peer check is the gate.
fn socket_mode(cfg: &AgentConfig) -> u32 {
    let own = own_uid();
    let other_users = cfg.allow_uids.iter().any(|u| *u != 0 && Some(*u) != own);
    match (other_users, cfg.allow_gids.len()) {
        (false, 0) => 0o600,
        (false, 1) => 0o660,
        _ => 0o666,
    }
}

fn bind(cfg: &AgentConfig) -> Result<UnixListener, AgentError> {
    let path = &cfg.socket;
    let err = |cause| AgentError::Listen {
        path: path.to_path_buf(),
        cause,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    // A socket left by an agent that died is in the way; anything else is not ours to remove.
    if let Ok(m) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if m.file_type().is_socket() && UnixStream::connect(path).is_err() {
            std::fs::remove_file(path).map_err(err)?;
        }
    }
    let l = UnixListener::bind(path).map_err(err)?;
    let mode = socket_mode(cfg);
    if mode == 0o660 {
        std::os::unix::fs::chown(path, None, cfg.allow_gids.first().copied()).map_err(err)?;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(err)?;
    Ok(l)
}

fn register(shared: &Shared) {
    let mut wait = Duration::from_millis(100);
    let mut said = false;
    loop {
        match shared.client.register_node(&shared.cfg.registration) {
            Ok(r) => {
                shared.node.store(r.id, Ordering::Release);
                if said {
                    eprintln!("rackmem agent: registered as node {} after all", r.id);
                }
                return;
            }
            Err(e) => {
                if !said {
                    eprintln!(
                        "rackmem agent: cannot register node {}: {e}; retrying",
                        shared.cfg.registration.name
                    );
                    said = true;
                }
                if shared.stop.load(Ordering::Acquire) {
                    return;
                }
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// The agent's own (effective) user id, read without a system call wrapper: `/proc/self` is
/// owned by it.
fn own_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// The supplementary groups of `pid` (SO_PEERCRED carries the primary group only).
fn supplementary_groups(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Groups:"))
                .map(|g| g.split_whitespace().filter_map(|x| x.parse().ok()).collect())
        })
        .unwrap_or_default()
}

/// Why a peer is not admitted, with the options that would admit it; `None`: admitted.
fn refuse_peer(cfg: &AgentConfig, cred: &rackmem_sys::PeerCredentials) -> Option<String> {
    let own = own_uid();
    if cred.uid == 0 || Some(cred.uid) == own || cfg.allow_uids.contains(&cred.uid) {
        return None;
    }
    if cfg.allow_gids.contains(&cred.gid)
        || (!cfg.allow_gids.is_empty()
            && supplementary_groups(cred.pid)
                .iter()
                .any(|g| cfg.allow_gids.contains(g)))
    {
        return None;
    }
    Some(format!(
        "uid {} (gid {}, pid {}) may not use this agent: it admits root{}{}{}; start it with \
         --allow-uid {} or --allow-gid {} to admit this process",
        cred.uid,
        cred.gid,
        cred.pid,
        own.filter(|u| *u != 0)
            .map(|u| format!(", uid {u}"))
            .unwrap_or_default(),
        if cfg.allow_uids.is_empty() {
            String::new()
        } else {
            format!(", uids {:?}", cfg.allow_uids)
        },
        if cfg.allow_gids.is_empty() {
            String::new()
        } else {
            format!(", gids {:?}", cfg.allow_gids)
        },
        cred.uid,
        cred.gid
    ))
}

/// Writes one refusal line to a connection that is not served, and closes it.
fn turn_away(mut conn: UnixStream, code: &str, message: String) {
    let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = reply(&mut conn, &refusal(code, message));
    let _ = conn.shutdown(std::net::Shutdown::Both);
}

fn accept_loop(shared: &Arc<Shared>, listener: UnixListener) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(conn) = conn else {
            continue;
        };
        let cred = match rackmem_sys::peer_credentials(conn.as_fd()) {
            Ok(c) => c,
            Err(e) => {
                shared.counters.connections_refused.fetch_add(1, Ordering::Relaxed);
                turn_away(
                    conn,
                    "permission_denied",
                    format!("cannot read the peer's credentials: {e}"),
                );
                continue;
            }
        };
        if let Some(why) = refuse_peer(&shared.cfg, &cred) {
            shared.counters.connections_refused.fetch_add(1, Ordering::Relaxed);
            turn_away(conn, "permission_denied", why);
            continue;
        }
        // The count goes up here, in the only thread that accepts, so the cap cannot be raced.
        let max = shared.cfg.max_connections as u64;
        if shared.counters.processes.load(Ordering::Acquire) >= max {
            shared.counters.connections_refused.fetch_add(1, Ordering::Relaxed);
            turn_away(
                conn,
                "too_many_connections",
                format!(
                    "the agent serves at most {max} processes at once (--max-connections); \
                     try again when one exits"
                ),
            );
            continue;
        }
        shared.counters.processes.fetch_add(1, Ordering::AcqRel);
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("agent-process".into())
            .stack_size(CONNECTION_STACK_BYTES)
            .spawn(move || {
                serve(&s, conn, cred);
                s.counters.processes.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            shared.counters.processes.fetch_sub(1, Ordering::AcqRel);
            eprintln!("rackmem agent: cannot serve a process: {e}");
        }
    }
}

/// Releases allocations of closed connections that the control plane refused or missed, and
/// reconciles at start and every `reconcile_interval`.
fn release_loop(shared: &Shared) {
    let mut next_reconcile = Instant::now();
    while !shared.stop.load(Ordering::Acquire) {
        if Instant::now() >= next_reconcile {
            if let Err(e) = reconcile(shared) {
                eprintln!("rackmem agent: cannot reconcile with the control plane: {e}; will retry");
            }
            next_reconcile = Instant::now() + shared.cfg.reconcile_interval;
        }
        std::thread::sleep(Duration::from_millis(500).min(shared.cfg.reconcile_interval));
        let pending: Vec<u64> = std::mem::take(&mut *lock(&shared.pending_releases));
        let mut again = Vec::new();
        for id in pending {
            match shared.client.free(id) {
                Ok(_) | Err(ClientError::Server { status: 404, .. }) => {}
                Err(_) => again.push(id),
            }
        }
        lock(&shared.pending_releases).extend(again);
    }
}

/// The start time of process `pid` (field 22 of `/proc/PID/stat`, clock ticks since boot), or
/// `None` when there is no such process or it has exited (a zombie its parent has not reaped
/// yet uses no memory any more).
pub fn process_start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces or ')': fields resume
    // after the last ')'. The state is the first field after it, the start time the 20th.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    if matches!(fields.next(), Some("Z" | "X" | "x")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Which of `allocations` (this node's) nobody holds, given this run's name (`run`), what this
/// run's connections hold or are asking for (`held`, `in_flight`), and whether a process still
/// lives (`alive(pid, start_ticks)`):
/// - an allocation without a holder was made by hand: never an orphan;
/// - one made by this run is an orphan when no connection holds it and its connection has no
///   grow in flight (a grow whose reply was lost, or a release the process never got to make);
/// - one made by an earlier run (the agent restarted while programs kept running on the
///   segments they attached) is an orphan only once its process is gone, or its pid belongs to
///   a later process.
pub fn orphans(
    allocations: &[Allocation],
    run: &str,
    held: &HashSet<u64>,
    in_flight: &HashSet<u64>,
    alive: impl Fn(u32, u64) -> bool,
) -> Vec<u64> {
    allocations
        .iter()
        .filter(|a| match &a.holder {
            None => false,
            Some(h) if h.agent == run => !held.contains(&a.id) && !in_flight.contains(&h.connection),
            Some(h) => !alive(h.pid, h.start_ticks),
        })
        .map(|a| a.id)
        .collect()
}

/// Renews the grants of the allocations processes still hold (agent-made, not `orphans`) once
/// they come within three reconcile periods (at least a minute) of expiring, so a holder can
/// always attach again while a grant copied elsewhere soon expires.
fn renew_leases(shared: &Shared, allocations: &[Allocation], orphans: &[u64]) {
    let now_s = crate::plane::now_unix_ms() / 1000;
    let margin_s = (shared.cfg.reconcile_interval * 3).as_secs().max(60);
    for a in allocations {
        if a.holder.is_none() || orphans.contains(&a.id) {
            continue;
        }
        let soonest = a
            .segments
            .iter()
            .map(|s| s.grant_expires_unix_s)
            .filter(|&e| e != 0)
            .min();
        let Some(expiry) = soonest else { continue };
        if expiry.saturating_sub(now_s) > margin_s {
            continue;
        }
        match shared.client.renew(a.id) {
            Ok(_) => {
                shared.counters.renewed.fetch_add(1, Ordering::Relaxed);
            }
            Err(ClientError::Server { status: 404, .. }) => {}
            Err(e) => eprintln!(
                "rackmem agent: renewing the grants of allocation {}: {e}; will retry",
                a.id
            ),
        }
    }
}

fn reconcile(shared: &Shared) -> Result<Vec<u64>, ClientError> {
    let node = shared.node.load(Ordering::Acquire);
    if node == 0 {
        return Ok(Vec::new());
    }
    let list = shared.client.node_allocations(node)?;
    let (held, in_flight) = {
        let h = lock(&shared.holdings);
        let held: HashSet<u64> = h.held.keys().copied().collect();
        let flying: HashSet<u64> = h.in_flight.keys().copied().collect();
        (held, flying)
    };
    let alive = |pid, start| process_start_ticks(pid) == Some(start);
    let ids = orphans(&list, &shared.run, &held, &in_flight, alive);
    renew_leases(shared, &list, &ids);
    for id in &ids {
        match shared.client.free(*id) {
            Ok(_) | Err(ClientError::Server { status: 404, .. }) => {
                shared.counters.reclaimed.fetch_add(1, Ordering::Relaxed);
                eprintln!("rackmem agent: released allocation {id}: nobody holds it");
            }
            Err(e) => {
                eprintln!("rackmem agent: releasing orphan allocation {id}: {e}; will retry");
                lock(&shared.pending_releases).push(*id);
            }
        }
    }
    Ok(ids)
}

/// Calls the control plane for this node, registering again if it forgot the node (its state
/// was lost) — the node keeps working across a control-plane reset.
fn for_node<T>(shared: &Shared, f: impl Fn(u64) -> Result<T, ClientError>) -> Result<T, ClientError> {
    match f(shared.node.load(Ordering::Acquire)) {
        // The only object these requests name is the node: a 404 means it was forgotten.
        Err(ClientError::Server { status: 404, .. }) => {
            let r = shared.client.register_node(&shared.cfg.registration)?;
            shared.node.store(r.id, Ordering::Release);
            f(r.id)
        }
        other => other,
    }
}

/// What reading one request line gave.
enum Line {
    /// A whole line (without its newline).
    Got,
    /// The peer closed (or the connection broke).
    Closed,
    /// Longer than [`MAX_LINE`].
    TooLong,
    /// Begun but not finished within the request timeout.
    TimedOut,
}

/// Reads one request line into `buf`: waits as long as it takes for its first byte (a process
/// may stay quiet for its whole life), then at most `timeout` for the rest.
fn read_request(reader: &mut BufReader<UnixStream>, buf: &mut Vec<u8>, timeout: Duration) -> Line {
    buf.clear();
    if reader.get_ref().set_read_timeout(None).is_err() {
        return Line::Closed;
    }
    loop {
        match reader.fill_buf() {
            Ok([]) => return Line::Closed,
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Line::Closed,
        }
    }
    let started = Instant::now();
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Line::TimedOut;
        }
        if reader.get_ref().set_read_timeout(Some(left)).is_err() {
            return Line::Closed;
        }
        let room = (MAX_LINE + 1).saturating_sub(buf.len()) as u64;
        match reader.by_ref().take(room).read_until(b'\n', buf) {
            Ok(_) if buf.last() == Some(&b'\n') => {
                buf.pop();
                return Line::Got;
            }
            Ok(_) if buf.len() > MAX_LINE => return Line::TooLong,
            // End of stream in the middle of a line: nobody is left to answer.
            Ok(_) => return Line::Closed,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return Line::Closed,
        }
    }
}

/// Parses one request line, or says why it is not one.
fn parse_request(line: &[u8]) -> Result<Request, serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(line)
        .map_err(|e| refusal("bad_request", format!("not a JSON object on one line: {e}")))?;
    let op = match v.get("op") {
        Some(serde_json::Value::String(op)) => op.clone(),
        Some(_) | None => {
            return Err(refusal(
                "bad_request",
                format!("a request is a JSON object with \"op\": one of {}", OPS.join(", ")),
            ))
        }
    };
    if !OPS.contains(&op.as_str()) {
        return Err(refusal(
            "unknown_op",
            format!("unknown op {op:?}: this agent knows {}", OPS.join(", ")),
        ));
    }
    serde_json::from_value(v).map_err(|e| refusal("bad_request", format!("{op}: {e}")))
}

/// Per-connection state.
struct Connection<'a> {
    shared: &'a Shared,
    id: u64,
    cred: rackmem_sys::PeerCredentials,
    start_ticks: u64,
    /// Allocation → bytes.
    mine: HashMap<u64, u64>,
}

impl Connection<'_> {
    fn grow(&mut self, bytes: u64) -> serde_json::Value {
        let shared = self.shared;
        let cfg = &shared.cfg;
        let (uid, pid) = (self.cred.uid, self.cred.pid);
        {
            // Checked and reserved under one lock, before the control plane is asked.
            let mut h = lock(&shared.holdings);
            let by_pid = h.per_pid.get(&pid).copied().unwrap_or(0);
            let by_uid = h.per_uid.get(&uid).copied().unwrap_or(0);
            if by_pid.saturating_add(bytes) > cfg.quota_per_process_bytes {
                shared.counters.refusals.fetch_add(1, Ordering::Relaxed);
                return refusal(
                    "quota_exceeded",
                    format!(
                        "pid {pid} holds {by_pid} bytes; {bytes} more would pass its quota of {} bytes \
                         (--quota-per-process)",
                        cfg.quota_per_process_bytes
                    ),
                );
            }
            if by_uid.saturating_add(bytes) > cfg.quota_per_uid_bytes {
                shared.counters.refusals.fetch_add(1, Ordering::Relaxed);
                return refusal(
                    "quota_exceeded",
                    format!(
                        "uid {uid} holds {by_uid} bytes; {bytes} more would pass its quota of {} bytes \
                         (--quota-per-uid)",
                        cfg.quota_per_uid_bytes
                    ),
                );
            }
            h.add(uid, pid, bytes);
            *h.in_flight.entry(self.id).or_default() += 1;
        }
        let holder = Holder {
            agent: shared.run.clone(),
            connection: self.id,
            pid,
            uid,
            start_ticks: self.start_ticks,
        };
        // One key for this grow, kept across the client's retries and a re-registration.
        let key = new_idempotency_key();
        let req = |node| AllocationRequest {
            node,
            size_bytes: bytes,
            stripe: Some(cfg.stripe.max(1)),
            idempotency_key: Some(key.clone()),
            holder: Some(holder.clone()),
            ..Default::default()
        };
        let r = for_node(shared, |node| shared.client.allocate(&req(node)));
        let mut h = lock(&shared.holdings);
        h.sub(uid, pid, bytes);
        if let Some(n) = h.in_flight.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                h.in_flight.remove(&self.id);
            }
        }
        match r {
            Ok(a) => {
                let size: u64 = a.segments.iter().map(|s| s.size_bytes).sum();
                h.add(uid, pid, size);
                h.held.insert(a.id, (self.id, uid, pid, size));
                drop(h);
                self.mine.insert(a.id, size);
                shared.counters.allocations.fetch_add(1, Ordering::Relaxed);
                shared.counters.bytes.fetch_add(size, Ordering::Relaxed);
                serde_json::json!({"ok": true, "allocation": a.id, "segments": a.segments})
            }
            Err(e) => {
                drop(h);
                shared.counters.refusals.fetch_add(1, Ordering::Relaxed);
                client_refusal(&e)
            }
        }
    }

    /// Forgets an allocation this connection held (released, or handed to the pending list).
    fn forget(&mut self, id: u64) {
        let Some(size) = self.mine.remove(&id) else {
            return;
        };
        let mut h = lock(&self.shared.holdings);
        h.held.remove(&id);
        h.sub(self.cred.uid, self.cred.pid, size);
        drop(h);
        self.shared.counters.allocations.fetch_sub(1, Ordering::Relaxed);
        self.shared.counters.bytes.fetch_sub(size, Ordering::Relaxed);
    }

    fn answer(&mut self, req: Request, hello: &mut bool, who: &mut String) -> serde_json::Value {
        let shared = self.shared;
        match req {
            Request::Hello { pid, program } => {
                *hello = true;
                // The pid the process claims is only for the log; the kernel's is used.
                *who = format!("pid {} ({program}, says pid {pid})", self.cred.pid);
                serde_json::json!({"ok": true, "node": shared.node.load(Ordering::Acquire)})
            }
            _ if !*hello => refusal("bad_request", "say hello first"),
            Request::Grow { bytes } => self.grow(bytes),
            Request::Release { allocation } => {
                if !self.mine.contains_key(&allocation) {
                    refusal("not_found", format!("allocation {allocation} is not this process's"))
                } else {
                    match shared.client.free(allocation) {
                        Ok(_) | Err(ClientError::Server { status: 404, .. }) => {
                            self.forget(allocation);
                            serde_json::json!({"ok": true})
                        }
                        Err(e) => client_refusal(&e),
                    }
                }
            }
            Request::Rates => match for_node(shared, |node| shared.client.rates(node)) {
                Ok(r) => {
                    let rates: Vec<serde_json::Value> = r
                        .segments
                        .iter()
                        .filter(|s| self.mine.contains_key(&s.allocation))
                        .map(|s| serde_json::json!({"segment_id": s.segment_id, "rate_limit_bps": s.rate_limit_bps}))
                        .collect();
                    serde_json::json!({"ok": true, "rates": rates})
                }
                Err(e) => client_refusal(&e),
            },
        }
    }
}

fn serve(shared: &Shared, conn: UnixStream, cred: rackmem_sys::PeerCredentials) {
    let mut c = Connection {
        shared,
        id: shared.next_connection.fetch_add(1, Ordering::Relaxed),
        cred,
        start_ticks: process_start_ticks(cred.pid).unwrap_or(0),
        mine: HashMap::new(),
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
                Ok(req) => c.answer(req, &mut hello, &mut who),
                Err(refused) => refused,
            },
        };
        if reply(&mut out, &answer).is_err() {
            break;
        }
    }
    // The process is gone (or broke the protocol): everything it had goes back.
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

fn reply(out: &mut UnixStream, v: &serde_json::Value) -> std::io::Result<()> {
    let mut s = v.to_string();
    s.push('\n');
    out.write_all(s.as_bytes())
}

impl Agent {
    /// The agent's counters in the Prometheus text format.
    pub fn metrics_text(&self) -> String {
        let c = &self.shared.counters;
        let pending = pending_releases(self);
        let g = |v: &AtomicU64| v.load(Ordering::Relaxed);
        format!(
            "# HELP rackmem_agent_processes Processes connected to the agent.\n\
             # TYPE rackmem_agent_processes gauge\n\
             rackmem_agent_processes {}\n\
             # HELP rackmem_agent_allocations Allocations handed to processes and not returned.\n\
             # TYPE rackmem_agent_allocations gauge\n\
             rackmem_agent_allocations {}\n\
             # HELP rackmem_agent_allocated_bytes Bytes in those allocations.\n\
             # TYPE rackmem_agent_allocated_bytes gauge\n\
             rackmem_agent_allocated_bytes {}\n\
             # HELP rackmem_agent_refusals_total Requests refused by the agent or the control plane.\n\
             # TYPE rackmem_agent_refusals_total counter\n\
             rackmem_agent_refusals_total {}\n\
             # HELP rackmem_agent_pending_releases Releases the control plane has not taken yet.\n\
             # TYPE rackmem_agent_pending_releases gauge\n\
             rackmem_agent_pending_releases {pending}\n\
             # HELP rackmem_agent_node Node id of this agent.\n\
             # TYPE rackmem_agent_node gauge\n\
             rackmem_agent_node {}\n\
             # HELP rackmem_agent_connections_refused_total Connections turned away (peer not admitted, or over --max-connections).\n\
             # TYPE rackmem_agent_connections_refused_total counter\n\
             rackmem_agent_connections_refused_total {}\n\
             # HELP rackmem_agent_reclaimed_total Allocations nobody held, released by reconciliation.\n\
             # TYPE rackmem_agent_reclaimed_total counter\n\
             rackmem_agent_reclaimed_total {}\n\
             # HELP rackmem_agent_renewed_total Grant renewals of allocations processes hold.\n\
             # TYPE rackmem_agent_renewed_total counter\n\
             rackmem_agent_renewed_total {}\n",
            g(&c.processes),
            g(&c.allocations),
            g(&c.bytes),
            g(&c.refusals),
            self.node(),
            g(&c.connections_refused),
            g(&c.reclaimed),
            g(&c.renewed),
        )
    }
}

/// Serves `GET /metrics` (Prometheus text) on `addr` from a thread of its own: a plain HTTP/1.1
/// responder, enough for a scraper, so the agent needs no web framework.
pub fn serve_metrics(
    addr: std::net::SocketAddr,
    text: impl Fn() -> String + Send + 'static,
) -> std::io::Result<std::net::SocketAddr> {
    let l = std::net::TcpListener::bind(addr)?;
    let bound = l.local_addr()?;
    std::thread::Builder::new().name("agent-metrics".into()).spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
            let mut req = [0u8; 2048];
            let n = conn.read(&mut req).unwrap_or(0);
            let head = String::from_utf8_lossy(&req[..n]);
            let (status, body) = if head.starts_with("GET /metrics ") {
                ("200 OK", text())
            } else {
                ("404 Not Found", "only GET /metrics is served here\n".to_string())
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    })?;
    Ok(bound)
}

/// The pending releases, for tests and the agent's log.
pub fn pending_releases(agent: &Agent) -> usize {
    agent
        .shared
        .pending_releases
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_ticks_of_this_process_and_of_none() {
        let mine = process_start_ticks(std::process::id()).expect("this process runs");
        assert_eq!(process_start_ticks(std::process::id()), Some(mine), "stable");
        assert_eq!(process_start_ticks(u32::MAX), None);
    }

    fn alloc(id: u64, holder: Option<(&str, u64, u32)>) -> Allocation {
        Allocation {
            id,
            node: 1,
            size_bytes: 1 << 20,
            stripe: 1,
            bandwidth_bps: 0,
            segments: Vec::new(),
            created_unix_ms: 0,
            idempotency_key: None,
            holder: holder.map(|(agent, connection, pid)| Holder {
                agent: agent.into(),
                connection,
                pid,
                uid: 0,
                start_ticks: 7,
            }),
        }
    }

    #[test]
    fn orphans_are_unheld_allocations_of_this_run_or_of_dead_processes() {
        let list = [
            alloc(1, None),                  // by hand
            alloc(2, Some(("me", 1, 100))),  // held
            alloc(3, Some(("me", 2, 100))),  // grow in flight on connection 2
            alloc(4, Some(("me", 3, 100))),  // nobody: a lost reply
            alloc(5, Some(("old", 9, 200))), // earlier run, process alive
            alloc(6, Some(("old", 9, 300))), // earlier run, process gone
        ];
        let held = HashSet::from([2]);
        let in_flight = HashSet::from([2]);
        let alive = |pid, start| pid == 200 && start == 7;
        assert_eq!(orphans(&list, "me", &held, &in_flight, alive), vec![4, 6]);
    }
}
