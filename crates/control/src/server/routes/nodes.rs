//! `/v1/nodes`: registration, reading nodes and the rate limits of their segments.

use crate::api::{
    ErrorBody, Node, NodeQuotaRequest, NodeRates, NodeRegistered, NodeRegistration, PoolReply, PoolReport,
};
use crate::server::authz::{authorized, Target};
use crate::server::error::ApiError;
use crate::server::extract::{ApiJson, Caller, Id};
use crate::server::state::AppState;
use axum::extract::State;
use axum::Json;

/// Registers a node (or re-registers it by name).
#[utoipa::path(post, path = "/v1/nodes", tag = "nodes", request_body = NodeRegistration,
    responses(
        (status = 200, body = NodeRegistered),
        (status = 400, body = ErrorBody),
        (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub(crate) async fn register_node(
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
pub(crate) async fn list_nodes(State(st): State<AppState>, Caller(c): Caller) -> Result<Json<Vec<Node>>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| Ok(p.nodes()))
        .await
        .map(Json)
}

/// One node.
#[utoipa::path(get, path = "/v1/nodes/{id}", tag = "nodes",
    params(("id" = u64, Path, description = "Node id")),
    responses((status = 200, body = Node), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_node(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
) -> Result<Json<Node>, ApiError> {
    authorized(&st, c, Target::Node(id), move |p| p.node(id))
        .await
        .map(Json)
}

/// The rate limit of each segment of a node, for its agent's token buckets.
#[utoipa::path(get, path = "/v1/nodes/{id}/rates", tag = "nodes",
    params(("id" = u64, Path, description = "Node id")),
    responses((status = 200, body = NodeRates), (status = 404, body = ErrorBody)))]
pub(crate) async fn node_rates(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
) -> Result<Json<NodeRates>, ApiError> {
    authorized(&st, c, Target::Node(id), move |p| p.rates(id))
        .await
        .map(Json)
}

/// Sets a node's own quota (admins only): the most bytes its allocations may hold at once, or
/// `null` for the control plane's default. Allocations beyond a lowered quota stay; new ones
/// are refused (`409 quota_exceeded`) until the node is under it.
#[utoipa::path(put, path = "/v1/nodes/{id}/quota", tag = "nodes", request_body = NodeQuotaRequest,
    params(("id" = u64, Path, description = "Node id")),
    responses(
        (status = 200, body = Node),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ))]
pub(crate) async fn set_node_quota(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
    ApiJson(q): ApiJson<NodeQuotaRequest>,
) -> Result<Json<Node>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| p.set_node_quota_of(id, q.quota_bytes))
        .await
        .map(Json)
}

/// The node agent's report of its pool (the allocations pushed to the node): which it attached
/// and which a process uses. The reply lists those to release once no process uses them.
#[utoipa::path(put, path = "/v1/nodes/{id}/pool", tag = "nodes", request_body = PoolReport,
    params(("id" = u64, Path, description = "Node id")),
    responses(
        (status = 200, body = PoolReply),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ))]
pub(crate) async fn report_pool(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
    ApiJson(r): ApiJson<PoolReport>,
) -> Result<Json<PoolReply>, ApiError> {
    authorized(&st, c, Target::Node(id), move |p| p.report_pool(id, r))
        .await
        .map(Json)
}
