//! The node agent: registers its node with the control plane and hands segments to the node's
//! processes over a Unix socket (seed 004's agent on each compute brick; seed 000's dynamic
//! attachment: memory grows while programs run).
//!
//! One thread per process connection speaks the JSON-lines protocol of `docs/control-plane.md`
//! ("The agent and its processes"). Everything a connection was given is returned when it
//! closes, so a process that exits, crashes or is killed never keeps memory. A release the
//! control plane cannot take right now (it is restarting) is kept and retried in the
//! background until it succeeds.

use crate::api::{AllocationRequest, NodeRegistration};
use crate::client::{Client, ClientError};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Longest request line a process may send.
const MAX_LINE: usize = 64 << 10;

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
}

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
}

struct Shared {
    client: Client,
    cfg: AgentConfig,
    node: AtomicU64,
    counters: AgentCounters,
    /// Releases the control plane has not acknowledged yet.
    pending_releases: Mutex<Vec<u64>>,
    stop: AtomicBool,
}

/// A running agent.
pub struct Agent {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
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

impl Agent {
    /// Registers the node (waiting, with a message, while the control plane is unreachable),
    /// then listens on the socket.
    pub fn start(client: Client, cfg: AgentConfig) -> Result<Agent, AgentError> {
        let listener = bind(&cfg.socket)?;
        let shared = Arc::new(Shared {
            client,
            cfg,
            node: AtomicU64::new(0),
            counters: AgentCounters::default(),
            pending_releases: Mutex::new(Vec::new()),
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

fn bind(path: &Path) -> Result<UnixListener, AgentError> {
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
    // Any local process may ask for memory; restrict who can with the directory's permissions.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(err)?;
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

fn accept_loop(shared: &Arc<Shared>, listener: UnixListener) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(conn) = conn else {
            continue;
        };
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("agent-process".into())
            .spawn(move || serve(&s, conn));
        if let Err(e) = spawned {
            eprintln!("rackmem agent: cannot serve a process: {e}");
        }
    }
}

/// Releases allocations of closed connections that the control plane refused or missed.
fn release_loop(shared: &Shared) {
    while !shared.stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(500));
        let pending: Vec<u64> = std::mem::take(&mut *shared.pending_releases.lock().unwrap_or_else(|e| e.into_inner()));
        let mut again = Vec::new();
        for id in pending {
            match shared.client.free(id) {
                Ok(_) | Err(ClientError::Server { status: 404, .. }) => {}
                Err(_) => again.push(id),
            }
        }
        shared
            .pending_releases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(again);
    }
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

fn serve(shared: &Shared, conn: UnixStream) {
    shared.counters.processes.fetch_add(1, Ordering::Relaxed);
    let mut mine: HashSet<u64> = HashSet::new();
    let mut sizes: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    let mut who = String::from("a process");
    let mut hello = false;
    let Ok(reader) = conn.try_clone() else {
        shared.counters.processes.fetch_sub(1, Ordering::Relaxed);
        return;
    };
    let mut reader = BufReader::new(reader);
    let mut out = conn;
    let mut line = String::new();
    loop {
        line.clear();
        match (&mut reader).take(MAX_LINE as u64 + 1).read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(n) if n > MAX_LINE => {
                let _ = reply(&mut out, &refusal("bad_request", "request line too long"));
                break;
            }
            Ok(_) => {}
        }
        let answer = match serde_json::from_str::<Request>(line.trim()) {
            Err(e) => refusal("bad_request", format!("not a request this agent knows: {e}")),
            Ok(Request::Hello { pid, program }) => {
                hello = true;
                who = format!("pid {pid} ({program})");
                serde_json::json!({"ok": true, "node": shared.node.load(Ordering::Acquire)})
            }
            Ok(_) if !hello => refusal("bad_request", "say hello first"),
            Ok(Request::Grow { bytes }) => {
                let req = |node| AllocationRequest {
                    node,
                    size_bytes: bytes,
                    stripe: Some(shared.cfg.stripe.max(1)),
                    ..Default::default()
                };
                match for_node(shared, |node| shared.client.allocate(&req(node))) {
                    Ok(a) => {
                        mine.insert(a.id);
                        let size: u64 = a.segments.iter().map(|s| s.size_bytes).sum();
                        sizes.insert(a.id, size);
                        shared.counters.allocations.fetch_add(1, Ordering::Relaxed);
                        shared.counters.bytes.fetch_add(size, Ordering::Relaxed);
                        serde_json::json!({"ok": true, "allocation": a.id, "segments": a.segments})
                    }
                    Err(e) => {
                        shared.counters.refusals.fetch_add(1, Ordering::Relaxed);
                        client_refusal(&e)
                    }
                }
            }
            Ok(Request::Release { allocation }) => {
                if !mine.contains(&allocation) {
                    refusal("not_found", format!("allocation {allocation} is not this process's"))
                } else {
                    match shared.client.free(allocation) {
                        Ok(_) | Err(ClientError::Server { status: 404, .. }) => {
                            mine.remove(&allocation);
                            forget(shared, &mut sizes, allocation);
                            serde_json::json!({"ok": true})
                        }
                        Err(e) => client_refusal(&e),
                    }
                }
            }
            Ok(Request::Rates) => match for_node(shared, |node| shared.client.rates(node)) {
                Ok(r) => {
                    let rates: Vec<serde_json::Value> = r
                        .segments
                        .iter()
                        .filter(|s| mine.contains(&s.allocation))
                        .map(|s| serde_json::json!({"segment_id": s.segment_id, "rate_limit_bps": s.rate_limit_bps}))
                        .collect();
                    serde_json::json!({"ok": true, "rates": rates})
                }
                Err(e) => client_refusal(&e),
            },
        };
        if reply(&mut out, &answer).is_err() {
            break;
        }
    }
    // The process is gone (or broke the protocol): everything it had goes back.
    for id in mine {
        forget(shared, &mut sizes, id);
        match shared.client.free(id) {
            Ok(_) | Err(ClientError::Server { status: 404, .. }) => {}
            Err(e) => {
                eprintln!("rackmem agent: returning allocation {id} of {who}: {e}; will retry");
                shared
                    .pending_releases
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(id);
            }
        }
    }
    shared.counters.processes.fetch_sub(1, Ordering::Relaxed);
}

fn forget(shared: &Shared, sizes: &mut std::collections::HashMap<u64, u64>, id: u64) {
    if let Some(b) = sizes.remove(&id) {
        shared.counters.allocations.fetch_sub(1, Ordering::Relaxed);
        shared.counters.bytes.fetch_sub(b, Ordering::Relaxed);
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
             rackmem_agent_node {}\n",
            g(&c.processes),
            g(&c.allocations),
            g(&c.bytes),
            g(&c.refusals),
            self.node()
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
