//! How a control plane serves: where it listens, its store and topology, its timeouts and
//! limits, its admin token, TLS, and the routes open without a token.

use crate::graph::Topology;
use crate::store::Store;
use std::net::SocketAddr;
use std::time::Duration;

/// Default limit of a request body.
pub const DEFAULT_BODY_LIMIT_BYTES: usize = 64 << 10;

/// How the control plane serves.
pub struct ServerConfig {
    /// Where to listen (port 0: any free port).
    pub listen: SocketAddr,
    /// Where the state lives.
    pub store: Box<dyn Store>,
    /// Switches and cabling; `None`: every port on switch `rack`.
    pub topology: Option<Topology>,
    /// A brick without heartbeat for longer is marked down.
    pub brick_timeout: Duration,
    /// How often bricks are asked to send heartbeats.
    pub heartbeat_interval: Duration,
    /// Largest request body accepted.
    pub body_limit_bytes: usize,
    /// The URL other replicas send clients to while this one leads (`None`: `http://` (or
    /// `https://`) and the bound address, the host's name replacing an unspecified address).
    pub advertise: Option<String>,
    /// The admin token read from `--admin-token-file` (accepted as admin, never stored).
    /// `None`: only tokens in the store are accepted (deny by default: none on a new store).
    pub admin_token: Option<String>,
    /// Routes served without a token besides `/healthz` and `/v1/leader`.
    pub public: PublicRoutes,
    /// Connection caps and timeouts.
    pub limits: crate::serve::HttpLimits,
    /// HTTPS (`None`: plain HTTP).
    pub tls: Option<crate::serve::TlsFiles>,
    /// How long grants are good for (zero: forever); holders renew them.
    pub grant_lifetime: Duration,
    /// What one node may hold unless an admin set its own quota.
    pub node_quota: crate::plane::NodeQuota,
    /// How bricks are picked when an allocation does not say (`--placement`).
    pub placement: crate::api::Objective,
    /// What configures the switches for circuits (`None`: [`crate::switch::DryRun`]).
    pub switch_driver: Option<Box<dyn crate::switch::SwitchDriver>>,
    /// A brick that registers or comes back up starts a rebalance onto it
    /// (`--rebalance-on-join`; the defaults of `POST /v1/rebalance`).
    pub rebalance_on_join: bool,
}

impl ServerConfig {
    /// The same configuration, accepting `token` as an admin's (as `--admin-token-file` does).
    pub fn with_admin_token(mut self, token: &str) -> ServerConfig {
        self.admin_token = Some(token.to_string());
        self
    }
}

/// Routes a deployment may open to callers without a token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublicRoutes {
    /// `GET /openapi.json`.
    pub openapi: bool,
    /// `GET /metrics` (for a Prometheus that cannot send a bearer token).
    pub metrics: bool,
}

impl ServerConfig {
    /// Defaults for everything but where to listen and the store: brick timeout 10 s,
    /// heartbeat every second, bodies up to 64 KiB.
    pub fn new(listen: SocketAddr, store: Box<dyn Store>) -> ServerConfig {
        ServerConfig {
            listen,
            store,
            topology: None,
            brick_timeout: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(1),
            body_limit_bytes: DEFAULT_BODY_LIMIT_BYTES,
            advertise: None,
            admin_token: None,
            public: PublicRoutes::default(),
            limits: crate::serve::HttpLimits::default(),
            tls: None,
            grant_lifetime: crate::plane::DEFAULT_GRANT_LIFETIME,
            node_quota: crate::plane::NodeQuota::default(),
            placement: crate::api::Objective::default(),
            switch_driver: None,
            rebalance_on_join: false,
        }
    }
}
