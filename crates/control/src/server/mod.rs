//! The REST API of the control plane (axum on tokio), its OpenAPI document and its metrics.
//!
//! Requests run the [`ControlPlane`] state machine on a blocking thread while holding its lock
//! (the store commits synchronously), so changes are serialized and each is durable before its
//! reply. A background task marks bricks down when their heartbeats stop. Every error reply is
//! JSON, `{"error": {"code", "message"}}`:
//!
//! | status | code | when |
//! |---|---|---|
//! | 400 | `bad_request` | malformed JSON, wrong types, negative or out-of-range numbers, bad path ids |
//! | 401 | `unauthorized` | no token, or one that is unknown or revoked (see [`crate::auth`]) |
//! | 403 | `forbidden` | a valid principal whose role may not touch that object (another node's allocation, another brick) |
//! | 404 | `not_found` | unknown node, brick, allocation or route |
//! | 405 | `method_not_allowed` | known route, other method |
//! | 409 | `conflict` | a registration contradicts the state (address taken, live segments orphaned) |
//! | 409 | `insufficient_capacity` | not enough free memory on up bricks now |
//! | 409 | `insufficient_bandwidth` | no path with the bandwidth asked for now |
//! | 409 | `quota_exceeded` | the node would hold more than its quota (`rackmem ctl node-quota`) |
//! | 413 | `payload_too_large` | body over the limit |
//! | 415 | `unsupported_media_type` | body without `Content-Type: application/json` |
//! | 422 | `invalid` | a request that can never succeed as written (size 0, stripe 0, bad name or key) |
//! | 503 | `store` | the store failed, or the leader is reloading the state; nothing changed |
//! | 503 | `not_leader` | this replica does not lead (etcd store); `error.leader` names the leader |
//!
//! With a replicated store (etcd) several control planes share the state and one leads
//! ([`Leadership`]): a follower answers every `/v1/...` request but `GET /v1/leader` with
//! `not_leader` (clients move on to the next URL); a replica that becomes leader reloads the
//! whole state from the store before it serves.
//!
//! The parts: [`spawn`] and [`ServerHandle`] here, [`ServerConfig`] in `config`; `router`
//! assembles the routes with the OpenAPI document; `routes` holds the handlers, a file per
//! resource; `state` the state they share and the lock on the control plane; `extract` the
//! request extractors; `authz` who may touch what; `error` the error replies; `metrics` the
//! counters and the Prometheus text.

mod authz;
mod config;
mod error;
mod extract;
mod metrics;
mod router;
mod routes;
mod state;

pub use config::{PublicRoutes, ServerConfig, DEFAULT_BODY_LIMIT_BYTES};
pub use error::ApiError;
pub use router::openapi;

use crate::auth::TokenTable;
use crate::plane::{ControlPlane, PlaneError};
use crate::store::{Leadership, StoreError};
use router::{build, Settings};
use state::{expire_bricks, follow_leadership};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Why the server cannot start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The state could not be loaded.
    #[error("loading the control plane's state: {0}")]
    Load(#[from] PlaneError),
    /// The store failed to open.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The certificate or key cannot be used.
    #[error(transparent)]
    Tls(#[from] crate::serve::TlsError),
    /// The listening socket or the runtime failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

/// The host's name, for advertising an unspecified listening address.
fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// A running control plane.
pub struct ServerHandle {
    addr: SocketAddr,
    leadership: Arc<Leadership>,
    advertise: String,
    scheme: &'static str,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), ServerError>>>,
}

impl ServerHandle {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR` (`https://ADDR` when serving TLS).
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// The URL it advertises to the other replicas.
    pub fn advertise(&self) -> &str {
        &self.advertise
    }

    /// Its role in the election (always leader without a replicated store).
    pub fn leadership(&self) -> &Arc<Leadership> {
        &self.leadership
    }

    /// Stops serving (requests in flight finish) and waits for the server thread.
    pub fn stop(mut self) -> Result<(), ServerError> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), ServerError> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(ServerError::Io {
                what: "the control plane's server thread".to_string(),
                source: std::io::Error::other("panicked"),
            }),
            None => Ok(()),
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

/// Loads the state, binds `config.listen` and serves on a thread of its own (with its own tokio
/// runtime) until [`ServerHandle::stop`].
pub fn spawn(mut config: ServerConfig) -> Result<ServerHandle, ServerError> {
    let io = |what: String| move |source| ServerError::Io { what, source };
    let listener = std::net::TcpListener::bind(config.listen).map_err(io(format!("listening on {}", config.listen)))?;
    listener
        .set_nonblocking(true)
        .map_err(io("making the listening socket non-blocking".to_string()))?;
    let addr = listener
        .local_addr()
        .map_err(io("reading the bound address".to_string()))?;
    let advertise = config.advertise.clone().unwrap_or_else(|| {
        let host = match addr.ip() {
            ip if ip.is_unspecified() => host_name().unwrap_or_else(|| ip.to_string()),
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            ip => ip.to_string(),
        };
        let scheme = if config.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{host}:{}", addr.port())
    });
    let tls = config.tls.as_ref().map(crate::serve::tls_config).transpose()?;
    // Campaign before loading: a replica that wins reloads anyway, and one that follows must
    // not serve what it loads now.
    let leadership = match config.store.start_election(&advertise)? {
        Some(l) => l,
        None => Arc::new(Leadership::single()),
    };
    let mut plane = ControlPlane::open(
        config.store,
        config.topology,
        config.brick_timeout,
        config.heartbeat_interval,
    )?;
    plane.set_grant_lifetime(config.grant_lifetime);
    plane.set_node_quota(config.node_quota);
    plane.set_placement(config.placement);
    plane.set_rebalance_on_join(config.rebalance_on_join);
    if let Some(d) = config.switch_driver.take() {
        plane.set_switch_driver(d);
    }
    // The circuits stored are configured again (a switch may have restarted meanwhile, or kept
    // rules of a circuit whose release it missed).
    plane.resync_switches();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("rackmem-control")
        .enable_all()
        .build()
        .map_err(io("starting the tokio runtime".to_string()))?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let conns = Arc::new(crate::serve::ConnStats::default());
    let settings = Settings {
        body_limit_bytes: config.body_limit_bytes,
        leadership: leadership.clone(),
        advertise: advertise.clone(),
        tokens: Arc::new(TokenTable::new(config.admin_token.as_deref())),
        public: config.public,
        conns: conns.clone(),
        request_timeout: config.limits.request_timeout,
    };
    let limits = config.limits;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let expiry_period = (config.brick_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let l3 = leadership.clone();
    let thread = std::thread::Builder::new()
        .name("rackmem-control".to_string())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)
                    .map_err(io("registering the listening socket".to_string()))?;
                let (router, plane) = build(plane, settings);
                let follow = tokio::spawn(follow_leadership(plane.clone(), l3, Duration::from_millis(50)));
                let expiry = tokio::spawn(expire_bricks(plane, expiry_period));
                crate::serve::serve(listener, router, limits, tls, conns, rx).await;
                expiry.abort();
                follow.abort();
                Ok(())
            })
        })
        .map_err(io("starting the server thread".to_string()))?;
    Ok(ServerHandle {
        addr,
        leadership,
        advertise,
        scheme,
        stop: Some(tx),
        thread: Some(thread),
    })
}
