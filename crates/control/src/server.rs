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

use crate::api::*;
use crate::auth::{AuthError, Principal, Role as AuthRole, TokenTable};
use crate::graph::Topology;
use crate::plane::{ControlPlane, PlaneError};
use crate::store::{Leadership, Role, Store, StoreError};
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Request, State};
use axum::http::{header, request::Parts, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use utoipa::OpenApi;
use utoipa_axum::{router::OpenApiRouter, routes};

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
        }
    }
}

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

// ---------------------------------------------------------------------------------------------
// Errors and extractors

/// An error reply.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    leader: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            leader: None,
        }
    }

    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
}

impl From<PlaneError> for ApiError {
    fn from(e: PlaneError) -> Self {
        if let PlaneError::Store(StoreError::NotLeader { leader, .. }) = &e {
            let leader = leader.clone();
            let mut a = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_leader", e.to_string());
            a.leader = leader;
            return a;
        }
        let (status, code) = match &e {
            PlaneError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            PlaneError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            PlaneError::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid"),
            PlaneError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            PlaneError::InsufficientCapacity(_) => (StatusCode::CONFLICT, "insufficient_capacity"),
            PlaneError::InsufficientBandwidth(_) => (StatusCode::CONFLICT, "insufficient_bandwidth"),
            PlaneError::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, "store"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
                leader: self.leader,
            },
        };
        let mut r = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"rackmem\""),
            );
        }
        r
    }
}

/// The principal a request proves: a client certificate's (put in the request's extensions
/// by the HTTPS acceptor), else the bearer token's; 401 otherwise. Extracted before the body,
/// so an unauthenticated request is refused before its body is read.
struct Caller(Principal);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Self, Self::Rejection> {
        let unauthorized = |e: AuthError| {
            // A follower's tokens are as of its last load: one made since is unknown here.
            // Send the client on to the leader rather than refuse what the leader accepts.
            match refusal(&st.leadership, &st.store) {
                Some(r) => ApiError::from(r),
                None => ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", e.to_string()),
            }
        };
        if let Some(p) = parts.extensions.get::<Principal>() {
            return Ok(Caller(p.clone()));
        }
        if let Some(e) = parts.extensions.get::<AuthError>() {
            return Err(unauthorized(e.clone()));
        }
        let Some(v) = parts.headers.get(header::AUTHORIZATION) else {
            return Err(unauthorized(AuthError::Missing));
        };
        let token = v
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .ok_or_else(|| unauthorized(AuthError::Missing))?;
        st.tokens.authenticate(token).map(Caller).map_err(unauthorized)
    }
}

/// An object a request touches, for [`may`].
enum Target {
    /// Only admins.
    Admin,
    /// The node of this name.
    NodeName(String),
    /// The node of this id.
    Node(u64),
    /// The brick of this name.
    BrickName(String),
    /// The brick of this id.
    Brick(u64),
    /// An allocation (its node's).
    Allocation(u64),
}

/// Runs `f` on the control plane (see [`with_plane`]) once `c` may touch `t` (see [`may`]),
/// checked under the same lock, so the object cannot change owner in between.
async fn authorized<T, F>(st: &AppState, c: Principal, t: Target, f: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&mut ControlPlane) -> Result<T, PlaneError> + Send + 'static,
{
    with_plane(st, move |p| {
        may(p, &c, &t)?;
        f(p)
    })
    .await
}

/// Whether `c` may touch `t` (deny by default: each role passes only where named here).
fn may(p: &ControlPlane, c: &Principal, t: &Target) -> Result<(), PlaneError> {
    let ok = match (c.role, t) {
        (AuthRole::Admin, _) => true,
        (AuthRole::Node, Target::NodeName(n)) => *n == c.name,
        (AuthRole::Node, Target::Node(id)) => p.node_id(&c.name) == Some(*id),
        (AuthRole::Node, Target::Allocation(id)) => {
            let Some(node) = p.allocation_node(*id) else {
                return Err(PlaneError::NotFound(format!("allocation {id}")));
            };
            p.node_id(&c.name) == Some(node)
        }
        (AuthRole::Brick, Target::BrickName(n)) => *n == c.name,
        (AuthRole::Brick, Target::Brick(id)) => p.brick_name(*id) == Some(c.name.as_str()),
        _ => false,
    };
    if ok {
        return Ok(());
    }
    let what = match t {
        Target::Admin => "this (admins only)".to_string(),
        Target::NodeName(n) => format!("node {n:?}"),
        Target::Node(id) => format!("node {id}"),
        Target::BrickName(n) => format!("brick {n:?}"),
        Target::Brick(id) => format!("brick {id}"),
        Target::Allocation(id) => format!("allocation {id}"),
    };
    Err(PlaneError::Forbidden(format!(
        "{} may not touch {what}: a node token acts for its own node, a brick token for its own brick",
        c.describe()
    )))
}

/// A JSON body whose rejections are JSON errors (400, 413, 415) instead of axum's plain text.
struct ApiJson<T>(T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(r) => Err(json_rejection(&r)),
        }
    }
}

fn json_rejection(r: &JsonRejection) -> ApiError {
    match r.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(r.status(), "payload_too_large", r.body_text()),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::new(r.status(), "unsupported_media_type", r.body_text()),
        _ => ApiError::bad_request(r.body_text()),
    }
}

/// A numeric id from the path; anything else is a JSON 400.
struct Id(u64);

impl<S: Send + Sync> FromRequestParts<S> for Id {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<u64>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(id)) => Ok(Id(id)),
            Err(e) => Err(ApiError::bad_request(format!(
                "the id in the path must be a number: {e}"
            ))),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Metrics

/// Upper bounds (seconds) of the allocation latency histogram buckets.
const LATENCY_BUCKETS_S: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; LATENCY_BUCKETS_S.len()],
    count: u64,
    sum_s: f64,
}

#[derive(Default)]
struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    allocation_latency: Mutex<Histogram>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a lock cannot leave these structures half-updated in a way that
    // matters more than refusing all further requests would.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Metrics {
    fn observe_allocation(&self, d: Duration) {
        let s = d.as_secs_f64();
        let mut h = lock(&self.allocation_latency);
        for (i, le) in LATENCY_BUCKETS_S.iter().enumerate() {
            if s <= *le {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum_s += s;
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

// ---------------------------------------------------------------------------------------------
// State and helpers

#[derive(Clone)]
struct AppState {
    plane: Arc<Mutex<ControlPlane>>,
    metrics: Arc<Metrics>,
    openapi_json: Arc<String>,
    store: Arc<String>,
    leadership: Arc<Leadership>,
    advertise: Arc<String>,
    tokens: Arc<TokenTable>,
    /// `/openapi.json` and `/metrics` without a token.
    public: PublicRoutes,
    conns: Arc<crate::serve::ConnStats>,
    request_timeout: Duration,
}

/// Why this control plane may not serve the API now, if so: it follows (`not_leader`), or it
/// leads but has not reloaded the state of its term yet (`store`, retry shortly).
fn refusal(leadership: &Leadership, store: &str) -> Option<PlaneError> {
    let s = leadership.status();
    if s.role == Role::Follower {
        return Some(PlaneError::Store(StoreError::NotLeader {
            store: store.to_string(),
            leader: s.leader,
        }));
    }
    (s.synced_term != s.term).then(|| {
        PlaneError::Store(StoreError::Backend {
            store: store.to_string(),
            message: "this control plane is reloading the state (it just became leader, or a commit \
                      failed); retry shortly"
                .to_string(),
        })
    })
}

/// Runs `f` on the control plane on a blocking thread (it may commit to the store), provided
/// this control plane leads and has loaded the state (checked under the lock, so a reload
/// cannot slip in between).
async fn with_plane<T, F>(st: &AppState, f: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&mut ControlPlane) -> Result<T, PlaneError> + Send + 'static,
{
    let plane = st.plane.clone();
    let leadership = st.leadership.clone();
    let store = st.store.clone();
    let run = move || {
        let mut p = lock(&plane);
        match refusal(&leadership, &store) {
            Some(e) => Err(e),
            None => f(&mut p),
        }
    };
    match tokio::task::spawn_blocking(run).await {
        Ok(r) => r.map_err(ApiError::from),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("the request failed inside the control plane: {e}"),
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Handlers

/// Registers a brick (or re-registers it by name).
#[utoipa::path(post, path = "/v1/bricks", tag = "bricks", request_body = BrickRegistration,
    responses(
        (status = 200, description = "Registered; the id is stable across re-registrations", body = BrickRegistered),
        (status = 400, description = "Malformed body", body = ErrorBody),
        (status = 409, description = "Address taken by another brick, or live segments would be orphaned", body = ErrorBody),
        (status = 422, description = "Invalid name, address, key, capacity or ports", body = ErrorBody),
    ))]
async fn register_brick(
    State(st): State<AppState>,
    Caller(c): Caller,
    ApiJson(reg): ApiJson<BrickRegistration>,
) -> Result<Json<BrickRegistered>, ApiError> {
    authorized(&st, c, Target::BrickName(reg.name.clone()), move |p| {
        p.register_brick(reg)
    })
    .await
    .map(Json)
}

/// Lists the bricks.
#[utoipa::path(get, path = "/v1/bricks", tag = "bricks", responses((status = 200, body = Vec<Brick>)))]
async fn list_bricks(State(st): State<AppState>, Caller(c): Caller) -> Result<Json<Vec<Brick>>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| Ok(p.bricks()))
        .await
        .map(Json)
}

/// One brick.
#[utoipa::path(get, path = "/v1/bricks/{id}", tag = "bricks",
    params(("id" = u64, Path, description = "Brick id")),
    responses((status = 200, body = Brick), (status = 404, body = ErrorBody)))]
async fn get_brick(State(st): State<AppState>, Caller(c): Caller, Id(id): Id) -> Result<Json<Brick>, ApiError> {
    authorized(&st, c, Target::Brick(id), move |p| p.brick(id))
        .await
        .map(Json)
}

/// Forgets a brick that holds no segment: its name is free for a brick with another key.
#[utoipa::path(delete, path = "/v1/bricks/{id}", tag = "bricks",
    params(("id" = u64, Path, description = "Brick id")),
    responses((status = 200, body = Brick), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn forget_brick(State(st): State<AppState>, Caller(c): Caller, Id(id): Id) -> Result<Json<Brick>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| p.forget_brick(id))
        .await
        .map(Json)
}

/// A brick's heartbeat; the reply lists the segments it must keep (it releases the others).
#[utoipa::path(put, path = "/v1/bricks/{id}/heartbeat", tag = "bricks",
    params(("id" = u64, Path, description = "Brick id")),
    request_body(content = Option<HeartbeatStats>, description = "Optional statistics (the body may be empty)"),
    responses((status = 200, body = HeartbeatReply), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn heartbeat(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
    body: axum::body::Bytes,
) -> Result<Json<HeartbeatReply>, ApiError> {
    let stats = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        Some(
            serde_json::from_slice::<HeartbeatStats>(&body)
                .map_err(|e| ApiError::bad_request(format!("heartbeat body is not valid: {e}")))?,
        )
    };
    authorized(&st, c, Target::Brick(id), move |p| p.heartbeat(id, stats))
        .await
        .map(Json)
}

/// Registers a node (or re-registers it by name).
#[utoipa::path(post, path = "/v1/nodes", tag = "nodes", request_body = NodeRegistration,
    responses(
        (status = 200, body = NodeRegistered),
        (status = 400, body = ErrorBody),
        (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
async fn register_node(
    State(st): State<AppState>,
    Caller(c): Caller,
    ApiJson(reg): ApiJson<NodeRegistration>,
) -> Result<Json<NodeRegistered>, ApiError> {
    authorized(&st, c, Target::NodeName(reg.name.clone()), move |p| {
        p.register_node(reg)
    })
    .await
    .map(Json)
}

/// Lists the nodes.
#[utoipa::path(get, path = "/v1/nodes", tag = "nodes", responses((status = 200, body = Vec<Node>)))]
async fn list_nodes(State(st): State<AppState>, Caller(c): Caller) -> Result<Json<Vec<Node>>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| Ok(p.nodes()))
        .await
        .map(Json)
}

/// One node.
#[utoipa::path(get, path = "/v1/nodes/{id}", tag = "nodes",
    params(("id" = u64, Path, description = "Node id")),
    responses((status = 200, body = Node), (status = 404, body = ErrorBody)))]
async fn get_node(State(st): State<AppState>, Caller(c): Caller, Id(id): Id) -> Result<Json<Node>, ApiError> {
    authorized(&st, c, Target::Node(id), move |p| p.node(id))
        .await
        .map(Json)
}

/// The rate limit of each segment of a node, for its agent's token buckets.
#[utoipa::path(get, path = "/v1/nodes/{id}/rates", tag = "nodes",
    params(("id" = u64, Path, description = "Node id")),
    responses((status = 200, body = NodeRates), (status = 404, body = ErrorBody)))]
async fn node_rates(State(st): State<AppState>, Caller(c): Caller, Id(id): Id) -> Result<Json<NodeRates>, ApiError> {
    authorized(&st, c, Target::Node(id), move |p| p.rates(id))
        .await
        .map(Json)
}

/// Allocates memory for a node: all segments or none.
#[utoipa::path(post, path = "/v1/allocations", tag = "allocations", request_body = AllocationRequest,
    responses(
        (status = 201, description = "Allocated", body = Allocation),
        (status = 200, description = "An earlier request with the same idempotency key made this live allocation", body = Allocation),
        (status = 400, description = "Malformed body", body = ErrorBody),
        (status = 404, description = "Unknown node or brick", body = ErrorBody),
        (status = 409, description = "Not enough free memory or bandwidth now, or the idempotency key made an allocation from a different request", body = ErrorBody),
        (status = 422, description = "Can never succeed as written", body = ErrorBody),
    ))]
async fn create_allocation(
    State(st): State<AppState>,
    Caller(c): Caller,
    ApiJson(req): ApiJson<AllocationRequest>,
) -> Result<(StatusCode, Json<Allocation>), ApiError> {
    let start = Instant::now();
    let r = authorized(&st, c, Target::Node(req.node), move |p| p.allocate_once(req)).await;
    st.metrics.observe_allocation(start.elapsed());
    r.map(|(a, how)| match how {
        crate::plane::Allocated::Created => (StatusCode::CREATED, Json(a)),
        crate::plane::Allocated::Replayed => (StatusCode::OK, Json(a)),
    })
}

/// Query of `GET /v1/allocations`.
#[derive(serde::Deserialize, utoipa::IntoParams)]
struct AllocationQuery {
    /// Only the allocations of this node.
    node: Option<u64>,
}

/// Lists the allocations.
#[utoipa::path(get, path = "/v1/allocations", tag = "allocations", params(AllocationQuery),
    responses((status = 200, body = Vec<Allocation>), (status = 400, body = ErrorBody)))]
async fn list_allocations(
    State(st): State<AppState>,
    Caller(c): Caller,
    q: Result<axum::extract::Query<AllocationQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<Allocation>>, ApiError> {
    let q = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let node = q.node;
    with_plane(&st, move |p| {
        let node = match (c.role, node) {
            (AuthRole::Admin, n) => n,
            // A node sees its own allocations only (none before it registers).
            (AuthRole::Node, None) => match p.node_id(&c.name) {
                Some(id) => Some(id),
                None => return Ok(Vec::new()),
            },
            (_, Some(n)) => {
                may(p, &c, &Target::Node(n))?;
                Some(n)
            }
            (_, None) => {
                may(p, &c, &Target::Admin)?;
                None
            }
        };
        Ok(p.allocations(node))
    })
    .await
    .map(Json)
}

/// One allocation, with current rate limits.
#[utoipa::path(get, path = "/v1/allocations/{id}", tag = "allocations",
    params(("id" = u64, Path, description = "Allocation id")),
    responses((status = 200, body = Allocation), (status = 404, body = ErrorBody)))]
async fn get_allocation(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
) -> Result<Json<Allocation>, ApiError> {
    authorized(&st, c, Target::Allocation(id), move |p| p.allocation(id))
        .await
        .map(Json)
}

/// Releases an allocation; the reply lists the extents given back.
#[utoipa::path(delete, path = "/v1/allocations/{id}", tag = "allocations",
    params(("id" = u64, Path, description = "Allocation id")),
    responses((status = 200, body = Released), (status = 404, body = ErrorBody)))]
async fn delete_allocation(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
) -> Result<Json<Released>, ApiError> {
    authorized(&st, c, Target::Allocation(id), move |p| p.free(id))
        .await
        .map(Json)
}

/// Renews the grants of an allocation (a lease): fresh grants with a new expiry, for holders
/// that still use the segments.
#[utoipa::path(post, path = "/v1/allocations/{id}/renew", tag = "allocations",
    params(("id" = u64, Path, description = "Allocation id")),
    responses((status = 200, body = Allocation), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn renew_allocation(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
) -> Result<Json<Allocation>, ApiError> {
    authorized(&st, c, Target::Allocation(id), move |p| p.renew(id))
        .await
        .map(Json)
}

/// Grows (adds segments) or shrinks (drops whole segments from the end) an allocation.
#[utoipa::path(patch, path = "/v1/allocations/{id}", tag = "allocations", request_body = ResizeRequest,
    params(("id" = u64, Path, description = "Allocation id")),
    responses(
        (status = 200, body = Allocation),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
async fn resize_allocation(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
    ApiJson(req): ApiJson<ResizeRequest>,
) -> Result<Json<Allocation>, ApiError> {
    authorized(&st, c, Target::Allocation(id), move |p| p.resize(id, req.size_bytes))
        .await
        .map(Json)
}

/// The resource graph with reserved and free bandwidth per link.
#[utoipa::path(get, path = "/v1/graph", tag = "graph", responses((status = 200, body = Graph)))]
async fn get_graph(State(st): State<AppState>, Caller(c): Caller) -> Result<Json<Graph>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| Ok(p.graph()))
        .await
        .map(Json)
}

/// Creates a token (admins only); the reply holds the secret, shown this once.
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", request_body = TokenRequest,
    responses(
        (status = 201, body = TokenCreated),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
async fn create_token(
    State(st): State<AppState>,
    Caller(c): Caller,
    ApiJson(req): ApiJson<TokenRequest>,
) -> Result<(StatusCode, Json<TokenCreated>), ApiError> {
    authorized(&st, c, Target::Admin, move |p| p.create_token(req))
        .await
        .map(|t| (StatusCode::CREATED, Json(t)))
}

/// Lists the tokens, without secrets (admins only).
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens",
    responses((status = 200, body = Vec<TokenInfo>), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
async fn list_tokens(State(st): State<AppState>, Caller(c): Caller) -> Result<Json<Vec<TokenInfo>>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| Ok(p.tokens()))
        .await
        .map(Json)
}

/// Revokes a token (admins only): it stops working at once.
#[utoipa::path(delete, path = "/v1/tokens/{id}", tag = "tokens",
    params(("id" = u64, Path, description = "Token id")),
    responses((status = 200, body = TokenInfo), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn revoke_token(State(st): State<AppState>, Caller(c): Caller, Id(id): Id) -> Result<Json<TokenInfo>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| p.revoke_token(id))
        .await
        .map(Json)
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Leader => "leader",
        Role::Follower => "follower",
    }
}

/// Liveness of the control plane, its role and the leader.
#[utoipa::path(get, path = "/healthz", tag = "meta", responses((status = 200, body = Health)))]
async fn healthz(State(st): State<AppState>) -> Json<Health> {
    let s = st.leadership.status();
    Json(Health {
        status: "ok".to_string(),
        store: st.store.to_string(),
        role: role_name(s.role).to_string(),
        leader: s
            .leader
            .or_else(|| (s.role == Role::Leader).then(|| st.advertise.to_string())),
    })
}

/// The election as this control plane sees it (answered by followers too).
#[utoipa::path(get, path = "/v1/leader", tag = "meta", responses((status = 200, body = LeaderInfo)))]
async fn leader(State(st): State<AppState>) -> Json<LeaderInfo> {
    let s = st.leadership.status();
    Json(LeaderInfo {
        role: role_name(s.role).to_string(),
        serving: st.leadership.serving(),
        leader: s
            .leader
            .or_else(|| (s.role == Role::Leader).then(|| st.advertise.to_string())),
        advertise: st.advertise.to_string(),
        term: s.term,
        store: st.store.to_string(),
    })
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "meta",
    responses((status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json")))]
async fn openapi_json(State(st): State<AppState>, c: Result<Caller, ApiError>) -> Response {
    if !st.public.openapi {
        if let Err(e) = c {
            return e.into_response();
        }
    }
    (
        [(header::CONTENT_TYPE, "application/json")],
        st.openapi_json.to_string(),
    )
        .into_response()
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses((status = 200, description = "Prometheus text format 0.0.4", content_type = "text/plain")))]
async fn metrics(State(st): State<AppState>, c: Result<Caller, ApiError>) -> Result<Response, ApiError> {
    if !st.public.metrics {
        c?;
    }
    let serving = st.leadership.serving();
    // A follower's state is as of its last load: it reports only its role and its requests.
    let g = if serving {
        Some(with_plane(&st, |p| Ok(p.gauges())).await?)
    } else {
        None
    };
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, rows: &[(String, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (labels, v) in rows {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    gauge(
        "rackmem_control_leader",
        "1 when this control plane leads and serves the API, 0 when it follows.",
        &[(String::new(), u64::from(serving))],
    );
    if let Some(g) = g {
        plane_gauges(&g, &mut gauge);
    }
    gauge(
        "rackmem_control_connections",
        "HTTP connections open now.",
        &[(
            String::new(),
            st.conns.open.load(std::sync::atomic::Ordering::Relaxed) as u64,
        )],
    );
    let _ = writeln!(
        out,
        "# HELP rackmem_control_connections_refused_total Connections closed at accept: a connection cap was reached.\n\
         # TYPE rackmem_control_connections_refused_total counter\n\
         rackmem_control_connections_refused_total {}\n\
         # HELP rackmem_control_tls_failures_total TLS handshakes that failed or timed out.\n\
         # TYPE rackmem_control_tls_failures_total counter\n\
         rackmem_control_tls_failures_total {}",
        st.conns.refused.load(std::sync::atomic::Ordering::Relaxed),
        st.conns.tls_failures.load(std::sync::atomic::Ordering::Relaxed),
    );
    let _ = writeln!(
        out,
        "# HELP rackmem_control_requests_total HTTP requests by route, method and status.\n\
         # TYPE rackmem_control_requests_total counter"
    );
    for ((route, method, status), n) in lock(&st.metrics.requests).iter() {
        let _ = writeln!(
            out,
            "rackmem_control_requests_total{{route=\"{}\",method=\"{method}\",status=\"{status}\"}} {n}",
            escape_label(route)
        );
    }
    let _ = writeln!(
        out,
        "# HELP rackmem_control_allocation_seconds Time to serve POST /v1/allocations.\n\
         # TYPE rackmem_control_allocation_seconds histogram"
    );
    {
        let h = lock(&st.metrics.allocation_latency);
        for (le, n) in LATENCY_BUCKETS_S.iter().zip(h.counts) {
            let _ = writeln!(out, "rackmem_control_allocation_seconds_bucket{{le=\"{le}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "rackmem_control_allocation_seconds_bucket{{le=\"+Inf\"}} {}",
            h.count
        );
        let _ = writeln!(out, "rackmem_control_allocation_seconds_sum {}", h.sum_s);
        let _ = writeln!(out, "rackmem_control_allocation_seconds_count {}", h.count);
    }
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response())
}

/// The gauges of the state (allocations, segments, nodes, bricks).
fn plane_gauges(g: &crate::plane::Gauges, gauge: &mut impl FnMut(&str, &str, &[(String, u64)])) {
    gauge(
        "rackmem_control_allocations",
        "Live allocations.",
        &[(String::new(), g.allocations)],
    );
    gauge(
        "rackmem_control_segments",
        "Live segments.",
        &[(String::new(), g.segments)],
    );
    gauge(
        "rackmem_control_nodes",
        "Registered nodes.",
        &[(String::new(), g.nodes)],
    );
    gauge(
        "rackmem_control_bricks",
        "Registered bricks by state.",
        &[
            ("{state=\"up\"}".to_string(), g.bricks_up),
            ("{state=\"down\"}".to_string(), g.bricks_down),
        ],
    );
    let per_brick = |f: fn(&(String, u64, u64, u64)) -> u64| -> Vec<(String, u64)> {
        g.bricks
            .iter()
            .map(|b| (format!("{{brick=\"{}\"}}", escape_label(&b.0)), f(b)))
            .collect()
    };
    gauge(
        "rackmem_control_brick_capacity_bytes",
        "Pool size of each brick.",
        &per_brick(|b| b.1),
    );
    gauge(
        "rackmem_control_brick_free_bytes",
        "Bytes in no segment, per brick.",
        &per_brick(|b| b.2),
    );
    gauge(
        "rackmem_control_brick_allocated_bytes",
        "Bytes in segments, per brick.",
        &per_brick(|b| b.3),
    );
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route (see /openapi.json)")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method (see /openapi.json)",
    )
}

async fn count_requests(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |m| m.as_str().to_string());
    let method = req.method().to_string();
    // The body is read inside: a client that trickles it is cut here.
    let resp = match tokio::time::timeout(st.request_timeout, next.run(req)).await {
        Ok(r) => r,
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!(
                "the request took longer than {} s (body sent too slowly?)",
                st.request_timeout.as_secs_f64()
            ),
        )
        .into_response(),
    };
    *lock(&st.metrics.requests)
        .entry((route, method, resp.status().as_u16()))
        .or_insert(0) += 1;
    resp
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "rackmem control plane",
        description = "Bricks, nodes, the resource graph and allocations of segments with grants. \
                       The contract is docs/control-plane.md."
    ),
    tags(
        (name = "bricks", description = "Memory bricks: registration and heartbeats"),
        (name = "nodes", description = "Nodes (compute bricks) and their rate limits"),
        (name = "allocations", description = "Segments of bricks granted to nodes"),
        (name = "graph", description = "The resource graph"),
        (name = "tokens", description = "API tokens (admins only)"),
        (name = "meta", description = "Health, metrics, this document"),
    ),
    components(schemas(ErrorBody, ErrorDetail, LeaderInfo, Endpoint, BrickState, PortSpec, Port, LiveSegment, Segment))
)]
struct ApiDoc;

/// Every route, each with its OpenAPI operation.
fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(register_brick, list_bricks))
        .routes(routes!(get_brick, forget_brick))
        .routes(routes!(heartbeat))
        .routes(routes!(register_node, list_nodes))
        .routes(routes!(get_node))
        .routes(routes!(node_rates))
        .routes(routes!(create_allocation, list_allocations))
        .routes(routes!(get_allocation, delete_allocation, resize_allocation))
        .routes(routes!(renew_allocation))
        .routes(routes!(get_graph))
        .routes(routes!(create_token, list_tokens))
        .routes(routes!(revoke_token))
        .routes(routes!(healthz))
        .routes(routes!(leader))
        .routes(routes!(openapi_json))
        .routes(routes!(metrics))
}

/// The router, and the control plane it serves.
/// What [`build`] needs besides the state.
struct Settings {
    body_limit_bytes: usize,
    leadership: Arc<Leadership>,
    advertise: String,
    tokens: Arc<TokenTable>,
    public: PublicRoutes,
    conns: Arc<crate::serve::ConnStats>,
    request_timeout: Duration,
}

fn build(mut plane: ControlPlane, s: Settings) -> (axum::Router, Arc<Mutex<ControlPlane>>) {
    plane.share_tokens(s.tokens.clone());
    let (router, api) = api_router().split_for_parts();
    let openapi_json = api
        .to_json()
        .unwrap_or_else(|e| format!("{{\"error\":{{\"code\":\"internal\",\"message\":\"{e}\"}}}}"));
    let store = plane.store_description();
    let plane = Arc::new(Mutex::new(plane));
    let state = AppState {
        plane: plane.clone(),
        metrics: Arc::new(Metrics::default()),
        openapi_json: Arc::new(openapi_json),
        store: Arc::new(store),
        leadership: s.leadership,
        advertise: Arc::new(s.advertise),
        tokens: s.tokens,
        public: s.public,
        conns: s.conns,
        request_timeout: s.request_timeout,
    };
    let router = router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), count_requests))
        .layer(axum::extract::DefaultBodyLimit::max(s.body_limit_bytes))
        .with_state(state);
    (router, plane)
}

/// The OpenAPI document, as `GET /openapi.json` serves it.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api_router().split_for_parts().1
}

async fn expire_bricks(plane: Arc<Mutex<ControlPlane>>, period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // The lock may be held by a commit in progress: wait for it off the async workers.
        let p = plane.clone();
        let down = tokio::task::spawn_blocking(move || lock(&p).expire_bricks(Instant::now()))
            .await
            .unwrap_or_default();
        for name in down {
            tracing::warn!(brick = %name, "brick missed its heartbeats: marked down");
        }
    }
}

/// Reloads the state whenever this control plane leads a term whose state it has not loaded
/// (it just won the election, or a commit's outcome is unknown), then lets it serve.
async fn follow_leadership(plane: Arc<Mutex<ControlPlane>>, leadership: Arc<Leadership>, period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        let s = leadership.status();
        if s.role != Role::Leader || s.synced_term == s.term {
            continue;
        }
        let (p, l) = (plane.clone(), leadership.clone());
        let r = tokio::task::spawn_blocking(move || {
            let mut p = lock(&p);
            // Loaded under the lock: no request runs on the old state meanwhile.
            p.reload().map(|()| {
                l.synced(s.term);
                p.gauges()
            })
        })
        .await;
        match r {
            Ok(Ok(g)) => {
                failing = false;
                tracing::info!(
                    term = s.term,
                    allocations = g.allocations,
                    bricks = g.bricks_up + g.bricks_down,
                    "state reloaded: serving as leader"
                );
            }
            Ok(Err(e)) => {
                if !failing {
                    tracing::warn!("reloading the state: {e}; retrying");
                    failing = true;
                }
            }
            Err(e) => tracing::warn!("reloading the state: {e}"),
        }
    }
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
