//! `/v1/allocations`: allocating (idempotent by key), listing, reading, resizing, renewing and
//! releasing allocations.

use crate::api::{Allocation, AllocationRequest, CloneRequest, ErrorBody, Released, ResizeRequest};
use crate::auth::Role;
use crate::plane::Allocated;
use crate::server::authz::{authorized, listing_scope, Target};
use crate::server::error::ApiError;
use crate::server::extract::{ApiJson, Caller, Id};
use crate::server::state::{with_plane, AppState};
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use std::time::Instant;

/// Allocates memory for a node: all segments or none.
#[utoipa::path(post, path = "/v1/allocations", tag = "allocations", request_body = AllocationRequest,
    responses(
        (status = 201, description = "Allocated", body = Allocation),
        (status = 200, description = "An earlier request with the same idempotency key made this live allocation", body = Allocation),
        (status = 400, description = "Malformed body", body = ErrorBody),
        (status = 404, description = "Unknown node or brick", body = ErrorBody),
        (status = 409, description = "Not enough free memory or bandwidth now, or the idempotency key made an allocation from a different request", body = ErrorBody),
        (status = 422, description = "Can never succeed as written", body = ErrorBody),
        (status = 502, description = "A circuit's switches could not be configured; nothing was reserved", body = ErrorBody),
    ))]
pub(crate) async fn create_allocation(
    State(st): State<AppState>,
    Caller(c): Caller,
    ApiJson(req): ApiJson<AllocationRequest>,
) -> Result<(StatusCode, Json<Allocation>), ApiError> {
    let start = Instant::now();
    if req.circuit == Some(true) && c.role != Role::Admin {
        // A circuit holds ports and switch links alone: a node asking for its own could take
        // every path from the others.
        return Err(ApiError::from(crate::plane::PlaneError::Forbidden(format!(
            "{} may not ask for a circuit (admins only: it holds ports and switch links alone)",
            c.describe()
        ))));
    }
    let r = authorized(&st, c, Target::Node(req.node), move |p| p.allocate_once(req)).await;
    st.metrics.observe_allocation(start.elapsed());
    r.map(|(a, how)| match how {
        Allocated::Created => (StatusCode::CREATED, Json(a)),
        Allocated::Replayed => (StatusCode::OK, Json(a)),
    })
}

/// Query of `GET /v1/allocations`.
#[derive(serde::Deserialize, utoipa::IntoParams)]
pub(crate) struct AllocationQuery {
    /// Only the allocations of this node.
    node: Option<u64>,
}

/// Lists the allocations.
#[utoipa::path(get, path = "/v1/allocations", tag = "allocations", params(AllocationQuery),
    responses((status = 200, body = Vec<Allocation>), (status = 400, body = ErrorBody)))]
pub(crate) async fn list_allocations(
    State(st): State<AppState>,
    Caller(c): Caller,
    q: Result<axum::extract::Query<AllocationQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<Allocation>>, ApiError> {
    let q = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let node = q.node;
    with_plane(&st, move |p| {
        // A node sees its own allocations only (none before it registers).
        Ok(match listing_scope(p, &c, node)? {
            Some(node) => p.allocations(node),
            None => Vec::new(),
        })
    })
    .await
    .map(Json)
}

/// One allocation, with current rate limits.
#[utoipa::path(get, path = "/v1/allocations/{id}", tag = "allocations",
    params(("id" = u64, Path, description = "Allocation id")),
    responses((status = 200, body = Allocation), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_allocation(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
) -> Result<Json<Allocation>, ApiError> {
    authorized(&st, c, Target::Allocation(id), move |p| p.allocation(id))
        .await
        .map(Json)
}

/// Releases an allocation; the reply lists the extents given back. An allocation pushed to a
/// node's pool that a process uses is released by the node's agent once none does (`deferred`).
#[utoipa::path(delete, path = "/v1/allocations/{id}", tag = "allocations",
    params(("id" = u64, Path, description = "Allocation id")),
    responses((status = 200, body = Released), (status = 404, body = ErrorBody)))]
pub(crate) async fn delete_allocation(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
) -> Result<Json<Released>, ApiError> {
    authorized(&st, c, Target::Allocation(id), move |p| p.free_or_defer(id))
        .await
        .map(Json)
}

/// Renews the grants of an allocation (a lease): fresh grants with a new expiry, for holders
/// that still use the segments.
#[utoipa::path(post, path = "/v1/allocations/{id}/renew", tag = "allocations",
    params(("id" = u64, Path, description = "Allocation id")),
    responses((status = 200, body = Allocation), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn renew_allocation(
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
pub(crate) async fn resize_allocation(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
    ApiJson(req): ApiJson<ResizeRequest>,
) -> Result<Json<Allocation>, ApiError> {
    authorized(&st, c, Target::Allocation(id), move |p| p.resize(id, req.size_bytes))
        .await
        .map(Json)
}

/// Clones segments of an allocation copy-on-write for a forked child: a new allocation of the
/// same node with one segment per segment named, on that segment's brick and of its size,
/// placed, quota-checked and accounted like any allocation. The node's process then has each
/// brick fill its clone (CLONE_INTO) from the segment it is attached to.
#[utoipa::path(post, path = "/v1/allocations/{id}/clone", tag = "allocations", request_body = CloneRequest,
    params(("id" = u64, Path, description = "Allocation id")),
    responses(
        (status = 201, description = "Cloned", body = Allocation),
        (status = 200, description = "An earlier request with the same idempotency key made this live clone", body = Allocation),
        (status = 400, description = "Malformed body", body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, description = "Unknown allocation, or a segment not of it", body = ErrorBody),
        (status = 409, description = "A brick is full, down or draining, or the node is over its quota", body = ErrorBody),
        (status = 422, description = "A segment named twice, or too many", body = ErrorBody),
    ))]
pub(crate) async fn clone_allocation(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
    ApiJson(req): ApiJson<CloneRequest>,
) -> Result<(StatusCode, Json<Allocation>), ApiError> {
    let start = Instant::now();
    let r = authorized(&st, c, Target::Allocation(id), move |p| p.clone_allocation(id, req)).await;
    st.metrics.observe_allocation(start.elapsed());
    r.map(|(a, how)| match how {
        Allocated::Created => (StatusCode::CREATED, Json(a)),
        Allocated::Replayed => (StatusCode::OK, Json(a)),
    })
}
