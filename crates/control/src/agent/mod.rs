//! The node agent: registers its node with the control plane and hands segments to the node's
//! processes over a Unix socket (seed 004's agent on each compute brick; seed 000's dynamic
//! attachment: memory grows while programs run).
//!
//! Who may ask: the accept thread reads each connection's peer credentials (`SO_PEERCRED`,
//! which the peer cannot forge) and admits root, the agent's own user, and the users and groups
//! named by [`AgentConfig::allow_uids`] / [`AgentConfig::allow_gids`]; anyone else gets one JSON
//! error line and is disconnected. At most [`AgentConfig::max_connections`] processes are served
//! at once, and at most [`AgentConfig::max_connections_per_uid`] of one user, one thread each
//! (small stacks); a connection over a cap gets an error line.
//!
//! One thread per admitted connection speaks the JSON-lines protocol of
//! `docs/control-plane.md` ("The agent and its processes"). Every request gets exactly one
//! reply, malformed ones included; a request line must arrive whole within
//! [`AgentConfig::request_timeout`] of its first byte, however it trickles in (idle time between requests is unlimited: processes hold
//! their connection for life). Grows are checked against per-process and per-user quotas before
//! the control plane is asked, and carry a fresh idempotency key and a
//! [`Holder`](crate::api::Holder) naming this agent run, the connection and the process.
//!
//! Everything a connection was given is returned when it closes, so a process that exits,
//! crashes or is killed never keeps memory. A release the control plane cannot take right now
//! is retried in the background until it succeeds. The same background thread reconciles at
//! start and every [`AgentConfig::reconcile_interval`]: it releases every allocation of this
//! node that an agent made and nobody holds (see [`orphans`]), e.g. one whose reply was lost.
//!
//! The parts: the [`Agent`], its configuration and counters here; `socket` listens and admits
//! peers; `protocol` reads request lines and writes replies; `connection` serves one process;
//! `holdings` keeps what connections hold and the quotas; `node` registers the node;
//! `reconcile` returns what nobody holds and retries releases; `leases` renews the grants of
//! what processes hold; `report` keeps each process's latest figures and passes them on to the
//! control plane; `orders` forwards `rackmem migrate --pid` (and a drain's `evacuate`) to a
//! process's runtime; `evacuate` moves this node's segments off draining bricks; `metrics`
//! the agent's metrics; `clones` keeps the copy-on-write clones asked for a forked child
//! until it adopts them; `named` keeps the named segments processes open (one-sided segments
//! shared by processes on several nodes) and closes the holds nobody has any more.

mod clones;
mod connection;
mod evacuate;
mod holdings;
mod leases;
mod metrics;
mod named;
mod node;
mod orders;
mod pool;
mod protocol;
mod reconcile;
mod report;
mod socket;

pub use protocol::MAX_LINE;
pub use reconcile::{orphans, process_start_ticks};

use crate::api::NodeRegistration;
use crate::client::{new_idempotency_key, Client, ClientError};
use holdings::Holdings;
use node::register;
use reconcile::{reconcile, release_loop};
use socket::{accept_loop, bind};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

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
    /// Most process connections of one user served at once (root's and the agent's user's
    /// included), so that one admitted user cannot hold every slot and lock the others out.
    pub max_connections_per_uid: usize,
    /// How long a request line may take to arrive once it has begun.
    pub request_timeout: Duration,
    /// How often to release allocations nobody holds (also done once at start).
    pub reconcile_interval: Duration,
    /// How often to look for memory pushed to the node (its pool), and report the pool.
    pub pool_interval: Duration,
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
            max_connections_per_uid: DEFAULT_MAX_CONNECTIONS_PER_UID,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            reconcile_interval: DEFAULT_RECONCILE_INTERVAL,
            pool_interval: DEFAULT_POOL_INTERVAL,
        }
    }
}

/// Default of [`AgentConfig::quota_per_process_bytes`]: 64 GiB.
pub const DEFAULT_QUOTA_PER_PROCESS_BYTES: u64 = 64 << 30;
/// Default of [`AgentConfig::quota_per_uid_bytes`]: 256 GiB.
pub const DEFAULT_QUOTA_PER_UID_BYTES: u64 = 256 << 30;
/// Default of [`AgentConfig::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default of [`AgentConfig::max_connections_per_uid`]: a quarter of the total.
pub const DEFAULT_MAX_CONNECTIONS_PER_UID: usize = 256;
/// Default of [`AgentConfig::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`AgentConfig::pool_interval`]: memory pushed to the node is attached within
/// about a second.
pub const DEFAULT_POOL_INTERVAL: Duration = Duration::from_secs(1);
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

/// What the agent's threads share.
struct Shared {
    client: Client,
    cfg: AgentConfig,
    /// This run's name in [`Holder::agent`](crate::api::Holder::agent).
    run: String,
    node: AtomicU64,
    counters: AgentCounters,
    holdings: Mutex<Holdings>,
    /// Releases the control plane has not acknowledged yet.
    pending_releases: Mutex<Vec<u64>>,
    /// Memory pushed to the node.
    pool: Mutex<pool::Pool>,
    /// Clones waiting for the forked children they are for.
    clones: Mutex<clones::Clones>,
    next_connection: AtomicU64,
    /// Connections served now, per user (entries go at zero).
    per_uid: Mutex<std::collections::HashMap<u32, usize>>,
    /// Each connected process's latest report, by connection.
    reports: Mutex<report::Reports>,
    /// Each process's order connection, by pid (`rackmem migrate --pid`).
    orders: Mutex<orders::OrderLines>,
    next_order: AtomicU64,
    /// The latest list of segments to move off draining bricks, for `agent-evacuate`.
    evacuations: Mutex<evacuate::Pending>,
    evacuate_cv: std::sync::Condvar,
    stop: AtomicBool,
}

impl Shared {
    /// True when allocation `id` is in the node's pool.
    fn in_pool(&self, id: u64) -> bool {
        lock(&self.pool).contains(id)
    }
}

/// A running agent.
pub struct Agent {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Locks `m`, also after a panic in another holder.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Agent {
    /// Registers the node (waiting, with a message, while the control plane is unreachable),
    /// then listens on the socket.
    pub fn start(client: Client, cfg: AgentConfig) -> Result<Agent, AgentError> {
        if cfg.max_connections == 0 || cfg.max_connections_per_uid == 0 {
            return Err(AgentError::Config(
                "--max-connections and --max-connections-per-uid must be at least 1".into(),
            ));
        }
        if cfg.request_timeout.is_zero() || cfg.reconcile_interval.is_zero() || cfg.pool_interval.is_zero() {
            return Err(AgentError::Config(
                "--request-timeout, --reconcile-interval and --pool-interval must be positive".into(),
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
            pool: Mutex::new(pool::Pool::default()),
            clones: Mutex::default(),
            next_connection: AtomicU64::new(1),
            per_uid: Mutex::new(std::collections::HashMap::new()),
            reports: Mutex::default(),
            orders: Mutex::default(),
            next_order: AtomicU64::new(1),
            evacuations: Mutex::default(),
            evacuate_cv: std::sync::Condvar::new(),
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
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("agent-pool".into())
                .spawn(move || pool::pool_loop(&s))
                .map_err(AgentError::Thread)?,
        );
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("agent-evacuate".into())
                .spawn(move || evacuate::evacuate_loop(&s))
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

    /// Bytes in the node's pool (memory pushed to the node), and of those in use by processes.
    pub fn pool_bytes(&self) -> (u64, u64) {
        lock(&self.shared.pool).bytes()
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

/// The pending releases, for tests and the agent's log.
pub fn pending_releases(agent: &Agent) -> usize {
    agent
        .shared
        .pending_releases
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .len()
}
