//! A small blocking client of the control plane's REST API, for `rackmem ctl`, for managed
//! bricks and for agents.
//!
//! It takes one or several control plane URLs: a request that cannot reach one (connection
//! refused, name not found, timeout), or that one answers `503 not_leader` (a replica that
//! follows another, with a shared etcd store), is sent to the next, and the client keeps using
//! the one that answered. Any other error reply is not retried elsewhere: it is the control
//! plane's answer, returned as [`ClientError::Server`] with the server's code and message.

use crate::api::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The error code of a replica that does not lead.
pub const NOT_LEADER: &str = "not_leader";

/// Default time limit of one request.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

fn with_auth<B>(r: ureq::RequestBuilder<B>, authorization: Option<&str>) -> ureq::RequestBuilder<B> {
    match authorization {
        Some(a) => r.header("Authorization", a),
        None => r,
    }
}

/// ureq's TLS settings for `config`: its CA file and client certificate, if any.
fn tls_config(config: &ClientConfig) -> Result<ureq::tls::TlsConfig, ClientError> {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};
    let read =
        |p: &std::path::Path| std::fs::read(p).map_err(|e| ClientError::Tls(format!("reading {}: {e}", p.display())));
    let mut b = TlsConfig::builder();
    if let Some(ca) = &config.ca_file {
        let pem = read(ca)?;
        let mut certs = Vec::new();
        for item in ureq::tls::parse_pem(&pem) {
            match item {
                Ok(ureq::tls::PemItem::Certificate(c)) => certs.push(c),
                Ok(_) => {}
                Err(e) => return Err(ClientError::Tls(format!("{}: {e}", ca.display()))),
            }
        }
        if certs.is_empty() {
            return Err(ClientError::Tls(format!("{} holds no certificate", ca.display())));
        }
        b = b.root_certs(RootCerts::new_with_certs(&certs));
    }
    if let Some((cert, key)) = &config.identity {
        let cert_pem = read(cert)?;
        let chain: Vec<Certificate<'static>> = ureq::tls::parse_pem(&cert_pem)
            .filter_map(|i| match i {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        if chain.is_empty() {
            return Err(ClientError::Tls(format!("{} holds no certificate", cert.display())));
        }
        let key = PrivateKey::from_pem(&read(key)?).map_err(|e| ClientError::Tls(format!("{}: {e}", key.display())))?;
        b = b.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
    }
    Ok(b.build())
}

/// How many times [`Client::allocate`] sends a request whose reply was lost, in all.
pub const ALLOCATE_ATTEMPTS: u32 = 3;

/// The wait before the first retry of an allocation; it doubles for each further one.
const ALLOCATE_RETRY_WAIT: Duration = Duration::from_millis(100);

/// A fresh random idempotency key (32 hex characters).
pub fn new_idempotency_key() -> String {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        // No entropy source: time, pid and a counter are still unique on this machine.
        static N: AtomicUsize = AtomicUsize::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let n = N.fetch_add(1, Ordering::Relaxed) as u128;
        b = (t ^ (u128::from(std::process::id()) << 96) ^ (n << 64)).to_le_bytes();
    }
    hex::encode(b)
}

/// Whether a failed request may have changed the state before its reply was lost: no reply at
/// all, a reply cut short, or a 5xx (a control plane that failed while committing, or a proxy).
fn may_have_committed(e: &ClientError) -> bool {
    match e {
        ClientError::Unreachable { .. } | ClientError::BadReply { .. } => true,
        ClientError::Server { status, .. } => *status >= 500,
        ClientError::BadUrl(_) | ClientError::Tls(_) => false,
    }
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No control plane URL is usable.
    #[error("control plane URL {0:?} is not valid: use http://HOST:PORT or https://HOST:PORT")]
    BadUrl(String),
    /// The CA file or client certificate cannot be used.
    #[error("control plane TLS settings: {0}")]
    Tls(String),
    /// None of the control planes answered.
    #[error("no control plane reachable at {urls}: {message}")]
    Unreachable {
        /// The URLs tried.
        urls: String,
        /// The last failure.
        message: String,
    },
    /// The control plane answered with an error.
    #[error("control plane {url} answered {status} {code}: {message}")]
    Server {
        /// Which control plane.
        url: String,
        /// HTTP status.
        status: u16,
        /// The error code (`not_found`, `insufficient_capacity`, ...).
        code: String,
        /// What it said.
        message: String,
    },
    /// The reply could not be understood.
    #[error("control plane {url} sent a reply that cannot be read: {message}")]
    BadReply {
        /// Which control plane.
        url: String,
        /// Why.
        message: String,
    },
}

impl ClientError {
    /// The HTTP status, for a server-reported error.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Server { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A client of one or several control planes.
#[derive(Debug)]
pub struct Client {
    agent: ureq::Agent,
    urls: Vec<String>,
    current: AtomicUsize,
    /// `Bearer TOKEN`, sent with every request.
    authorization: Option<String>,
}

/// How a client authenticates and whom it trusts.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Time limit of one request.
    pub timeout: Duration,
    /// The API token (`rmk_ID_SECRET`), sent as a bearer token.
    pub token: Option<String>,
    /// CA certificates (PEM) that sign the control planes' certificates, for `https://` URLs
    /// (`None`: the system's web PKI roots).
    pub ca_file: Option<std::path::PathBuf>,
    /// A client certificate and its key (PEM), instead of a token where the control plane
    /// takes certificates.
    pub identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            timeout: DEFAULT_TIMEOUT,
            token: None,
            ca_file: None,
            identity: None,
        }
    }
}

enum Method {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl Client {
    /// A client of `urls` (each `http://HOST:PORT`, tried in order).
    pub fn new<S: AsRef<str>>(urls: &[S]) -> Result<Client, ClientError> {
        Client::with_timeout(urls, DEFAULT_TIMEOUT)
    }

    /// Like [`Client::new`], with a time limit for each request.
    pub fn with_timeout<S: AsRef<str>>(urls: &[S], timeout: Duration) -> Result<Client, ClientError> {
        Client::with_config(
            urls,
            &ClientConfig {
                timeout,
                ..ClientConfig::default()
            },
        )
    }

    /// The same client, sending `token` (when `Some`) with every request.
    pub fn with_token(mut self, token: Option<String>) -> Client {
        self.authorization = token.map(|t| format!("Bearer {}", t.trim()));
        self
    }

    /// A client of `urls` (`http://HOST:PORT` or `https://HOST:PORT`) as `config` says.
    pub fn with_config<S: AsRef<str>>(urls: &[S], config: &ClientConfig) -> Result<Client, ClientError> {
        let timeout = config.timeout;
        let mut v = Vec::new();
        for u in urls {
            let u = u.as_ref().trim().trim_end_matches('/');
            let rest = u
                .strip_prefix("http://")
                .or_else(|| u.strip_prefix("https://"))
                .ok_or_else(|| ClientError::BadUrl(u.to_string()))?;
            if rest.is_empty() || rest.contains('/') {
                return Err(ClientError::BadUrl(u.to_string()));
            }
            v.push(u.to_string());
        }
        if v.is_empty() {
            return Err(ClientError::BadUrl(String::new()));
        }
        let tls = tls_config(config)?;
        let agent_config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .tls_config(tls)
            .build();
        Ok(Client {
            agent: agent_config.into(),
            urls: v,
            current: AtomicUsize::new(0),
            authorization: None,
        }
        .with_token(config.token.clone()))
    }

    /// Splits `URL[,URL...]`.
    pub fn parse_urls(list: &str) -> Vec<String> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// The URLs, in order.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    fn request<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let n = self.urls.len();
        let first = self.current.load(Ordering::Relaxed) % n;
        let mut last = String::new();
        let mut refusals: Option<ClientError> = None;
        let mut unreachable = 0;
        for i in 0..n {
            let idx = (first + i) % n;
            let base = &self.urls[idx];
            let url = format!("{base}{path}");
            let auth = self.authorization.as_deref();
            let r = match (&method, body) {
                (Method::Get, _) => with_auth(self.agent.get(&url), auth).call(),
                (Method::Delete, _) => with_auth(self.agent.delete(&url), auth).call(),
                (Method::Post, Some(b)) => with_auth(self.agent.post(&url), auth).send_json(b),
                (Method::Post, None) => with_auth(self.agent.post(&url), auth).send_empty(),
                (Method::Put, Some(b)) => with_auth(self.agent.put(&url), auth).send_json(b),
                (Method::Put, None) => with_auth(self.agent.put(&url), auth).send_empty(),
                (Method::Patch, Some(b)) => with_auth(self.agent.patch(&url), auth).send_json(b),
                (Method::Patch, None) => with_auth(self.agent.patch(&url), auth).send_empty(),
            };
            let mut resp = match r {
                Ok(resp) => resp,
                Err(e) => {
                    // Transport failures move on to the next control plane.
                    last = format!("{base}: {e}");
                    unreachable += 1;
                    continue;
                }
            };
            let status = resp.status().as_u16();
            let text = resp
                .body_mut()
                .with_config()
                .limit(64 << 20)
                .read_to_string()
                .map_err(|e| ClientError::BadReply {
                    url: base.clone(),
                    message: e.to_string(),
                })?;
            if (200..300).contains(&status) {
                self.current.store(idx, Ordering::Relaxed);
                return serde_json::from_str(&text).map_err(|e| ClientError::BadReply {
                    url: base.clone(),
                    message: format!("{e}: {}", text.chars().take(200).collect::<String>()),
                });
            }
            let (code, message) = match serde_json::from_str::<ErrorBody>(&text) {
                Ok(b) => (b.error.code, b.error.message),
                Err(_) => ("http".to_string(), text.chars().take(500).collect()),
            };
            if status == 503 && code == NOT_LEADER {
                // A follower: the leader is another of the URLs (its message names it).
                last = format!("{base}: {message}");
                refusals = Some(ClientError::Server {
                    url: base.clone(),
                    status,
                    code,
                    message,
                });
                continue;
            }
            self.current.store(idx, Ordering::Relaxed);
            return Err(ClientError::Server {
                url: base.clone(),
                status,
                code,
                message,
            });
        }
        match refusals {
            // Every control plane answered, none leads (an election is under way).
            Some(e) if unreachable == 0 => Err(e),
            _ => Err(ClientError::Unreachable {
                urls: self.urls.join(","),
                message: last,
            }),
        }
    }

    fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.request::<(), T>(Method::Get, path, None)
    }

    /// `POST /v1/bricks`.
    pub fn register_brick(&self, reg: &BrickRegistration) -> Result<BrickRegistered, ClientError> {
        self.request(Method::Post, "/v1/bricks", Some(reg))
    }

    /// `PUT /v1/bricks/{id}/heartbeat`.
    pub fn heartbeat(&self, brick: u64, stats: &HeartbeatStats) -> Result<HeartbeatReply, ClientError> {
        self.request(Method::Put, &format!("/v1/bricks/{brick}/heartbeat"), Some(stats))
    }

    /// `GET /v1/bricks`.
    pub fn bricks(&self) -> Result<Vec<Brick>, ClientError> {
        self.get("/v1/bricks")
    }

    /// `GET /v1/bricks/{id}`.
    pub fn brick(&self, id: u64) -> Result<Brick, ClientError> {
        self.get(&format!("/v1/bricks/{id}"))
    }

    /// `POST /v1/nodes`.
    pub fn register_node(&self, reg: &NodeRegistration) -> Result<NodeRegistered, ClientError> {
        self.request(Method::Post, "/v1/nodes", Some(reg))
    }

    /// `GET /v1/nodes`.
    pub fn nodes(&self) -> Result<Vec<Node>, ClientError> {
        self.get("/v1/nodes")
    }

    /// `GET /v1/nodes/{id}`.
    pub fn node(&self, id: u64) -> Result<Node, ClientError> {
        self.get(&format!("/v1/nodes/{id}"))
    }

    /// `GET /v1/nodes/{id}/rates`.
    pub fn rates(&self, node: u64) -> Result<NodeRates, ClientError> {
        self.get(&format!("/v1/nodes/{node}/rates"))
    }

    /// `PUT /v1/nodes/{id}/processes`: what the node's agent reports of its processes now.
    pub fn report_processes(&self, node: u64, reports: &ProcessReports) -> Result<ProcessReports, ClientError> {
        self.request(Method::Put, &format!("/v1/nodes/{node}/processes"), Some(reports))
    }

    /// `GET /v1/processes`: every process the nodes' agents reported lately.
    pub fn processes(&self) -> Result<Vec<ProcessView>, ClientError> {
        self.get("/v1/processes")
    }

    /// `POST /v1/allocations`, safe to retry: the request carries an idempotency key (a fresh
    /// random one unless `req` has one), and a failure that may have happened after the control
    /// plane committed (no reply, a 5xx) is retried with the same key, up to
    /// [`ALLOCATE_ATTEMPTS`] times in all, so a lost reply never leaves a second allocation
    /// behind: the retry gets the first one back.
    pub fn allocate(&self, req: &AllocationRequest) -> Result<Allocation, ClientError> {
        let mut req = req.clone();
        if req.idempotency_key.is_none() {
            req.idempotency_key = Some(new_idempotency_key());
        }
        let mut wait = ALLOCATE_RETRY_WAIT;
        let mut attempt = 1;
        loop {
            match self.request(Method::Post, "/v1/allocations", Some(&req)) {
                Err(e) if attempt < ALLOCATE_ATTEMPTS && may_have_committed(&e) => {
                    std::thread::sleep(wait);
                    wait *= 2;
                    attempt += 1;
                }
                r => return r,
            }
        }
    }

    /// `POST /v1/allocations/{id}/clone`, safe to retry as [`Client::allocate`] is (same key,
    /// same attempts): the new allocation's segments are copy-on-write clones of the listed
    /// segments, on their bricks, in their order.
    pub fn clone_allocation(&self, id: u64, req: &crate::api::CloneRequest) -> Result<Allocation, ClientError> {
        let mut req = req.clone();
        if req.idempotency_key.is_none() {
            req.idempotency_key = Some(new_idempotency_key());
        }
        let path = format!("/v1/allocations/{id}/clone");
        let mut wait = ALLOCATE_RETRY_WAIT;
        let mut attempt = 1;
        loop {
            match self.request(Method::Post, &path, Some(&req)) {
                Err(e) if attempt < ALLOCATE_ATTEMPTS && may_have_committed(&e) => {
                    std::thread::sleep(wait);
                    wait *= 2;
                    attempt += 1;
                }
                r => return r,
            }
        }
    }

    /// `GET /v1/allocations`.
    pub fn allocations(&self) -> Result<Vec<Allocation>, ClientError> {
        self.get("/v1/allocations")
    }

    /// `GET /v1/allocations?node={node}`: the allocations of one node.
    pub fn node_allocations(&self, node: u64) -> Result<Vec<Allocation>, ClientError> {
        self.get(&format!("/v1/allocations?node={node}"))
    }

    /// `POST /v1/segments`: create-or-open a named segment. Safe to retry (a holder that opens
    /// a name again is held once), so a reply lost after the commit is asked for again, as
    /// [`Client::allocate`] does.
    pub fn open_segment(&self, req: &crate::api::SegmentOpen) -> Result<crate::api::NamedSegment, ClientError> {
        let mut wait = ALLOCATE_RETRY_WAIT;
        let mut attempt = 1;
        loop {
            match self.request(Method::Post, "/v1/segments", Some(req)) {
                Err(e) if attempt < ALLOCATE_ATTEMPTS && may_have_committed(&e) => {
                    std::thread::sleep(wait);
                    wait *= 2;
                    attempt += 1;
                }
                r => return r,
            }
        }
    }

    /// `POST /v1/segments/{name}/close`: a holder of a named segment closes it.
    pub fn close_segment(
        &self,
        name: &str,
        req: &crate::api::SegmentClose,
    ) -> Result<crate::api::NamedClosed, ClientError> {
        self.request(Method::Post, &format!("/v1/segments/{name}/close"), Some(req))
    }

    /// `GET /v1/segments[?node=ID]`: the named segments (of one node: created or held by it).
    pub fn named_segments(&self, node: Option<u64>) -> Result<Vec<crate::api::NamedSegment>, ClientError> {
        match node {
            Some(n) => self.get(&format!("/v1/segments?node={n}")),
            None => self.get("/v1/segments"),
        }
    }

    /// `GET /v1/allocations/{id}`.
    pub fn allocation(&self, id: u64) -> Result<Allocation, ClientError> {
        self.get(&format!("/v1/allocations/{id}"))
    }

    /// `PATCH /v1/allocations/{id}`.
    pub fn resize(&self, id: u64, size_bytes: u64) -> Result<Allocation, ClientError> {
        self.request(
            Method::Patch,
            &format!("/v1/allocations/{id}"),
            Some(&ResizeRequest { size_bytes }),
        )
    }

    /// `PUT /v1/nodes/{id}/quota` (`None`: the default quota).
    pub fn set_node_quota(&self, node: u64, quota_bytes: Option<u64>) -> Result<Node, ClientError> {
        self.request(
            Method::Put,
            &format!("/v1/nodes/{node}/quota"),
            Some(&crate::api::NodeQuotaRequest { quota_bytes }),
        )
    }

    /// `PUT /v1/nodes/{id}/pool`.
    pub fn report_pool(
        &self,
        node: u64,
        report: &crate::api::PoolReport,
    ) -> Result<crate::api::PoolReply, ClientError> {
        self.request(Method::Put, &format!("/v1/nodes/{node}/pool"), Some(report))
    }

    /// `DELETE /v1/allocations/{id}`.
    pub fn free(&self, id: u64) -> Result<Released, ClientError> {
        self.request::<(), _>(Method::Delete, &format!("/v1/allocations/{id}"), None)
    }

    /// `POST /v1/allocations/{id}/renew`: fresh grants for a segment still in use.
    pub fn renew(&self, id: u64) -> Result<Allocation, ClientError> {
        self.request::<(), _>(Method::Post, &format!("/v1/allocations/{id}/renew"), None)
    }

    /// `POST /v1/tokens` (admins only).
    pub fn create_token(&self, req: &TokenRequest) -> Result<TokenCreated, ClientError> {
        self.request(Method::Post, "/v1/tokens", Some(req))
    }

    /// `GET /v1/tokens` (admins only).
    pub fn tokens(&self) -> Result<Vec<TokenInfo>, ClientError> {
        self.get("/v1/tokens")
    }

    /// `DELETE /v1/tokens/{id}` (admins only).
    pub fn revoke_token(&self, id: u64) -> Result<TokenInfo, ClientError> {
        self.request::<(), _>(Method::Delete, &format!("/v1/tokens/{id}"), None)
    }

    /// `DELETE /v1/bricks/{id}` (admins only; the brick must hold no segment).
    pub fn forget_brick(&self, id: u64) -> Result<Brick, ClientError> {
        self.request::<(), _>(Method::Delete, &format!("/v1/bricks/{id}"), None)
    }

    /// `PUT /v1/bricks/{id}/serve-rate` (admins only).
    pub fn set_serve_rate(&self, id: u64, serve_bps: Option<u64>) -> Result<Brick, ClientError> {
        let req = crate::api::ServeRateRequest { serve_bps };
        self.request(Method::Put, &format!("/v1/bricks/{id}/serve-rate"), Some(&req))
    }

    /// `PUT /v1/bricks/{id}/drain` (admins only).
    pub fn set_draining(&self, id: u64, draining: bool) -> Result<Brick, ClientError> {
        let req = crate::api::DrainRequest { draining };
        self.request(Method::Put, &format!("/v1/bricks/{id}/drain"), Some(&req))
    }

    /// `POST /v1/rebalance` (admins only).
    pub fn rebalance(&self, req: &crate::api::RebalanceRequest) -> Result<crate::api::Rebalance, ClientError> {
        self.request(Method::Post, "/v1/rebalance", Some(req))
    }

    /// `GET /v1/rebalance` (admins only).
    pub fn rebalance_status(&self) -> Result<crate::api::Rebalance, ClientError> {
        self.get("/v1/rebalance")
    }

    /// `GET /v1/circuits` (admins only).
    pub fn circuits(&self) -> Result<crate::api::Circuits, ClientError> {
        self.get("/v1/circuits")
    }

    /// `POST /v1/circuits/{id}/move`.
    pub fn move_circuit(&self, id: u64, req: &crate::api::CircuitMove) -> Result<crate::api::Circuit, ClientError> {
        self.request(Method::Post, &format!("/v1/circuits/{id}/move"), Some(req))
    }

    /// `GET /v1/graph`.
    pub fn graph(&self) -> Result<Graph, ClientError> {
        self.get("/v1/graph")
    }

    /// `GET /healthz`.
    pub fn health(&self) -> Result<Health, ClientError> {
        self.get("/healthz")
    }

    /// `GET /v1/leader` of the control plane the client uses now (answered by followers too).
    pub fn leader(&self) -> Result<LeaderInfo, ClientError> {
        self.get("/v1/leader")
    }
}
