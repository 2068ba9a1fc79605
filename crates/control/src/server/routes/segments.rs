//! `/v1/segments`: named segments that processes on several nodes open and close by name
//! (create-or-open, close, list).

use crate::api::{ErrorBody, NamedClosed, NamedSegment, SegmentClose, SegmentOpen};
use crate::plane::Allocated;
use crate::server::authz::{authorized, listing_scope, Target};
use crate::server::error::ApiError;
use crate::server::extract::{ApiJson, Caller};
use crate::server::state::{with_plane, AppState};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;

/// Creates the named segment, or opens it if it exists; the opener's process holds it from
/// now on. The reply carries the segment with a grant for the opener's node.
#[utoipa::path(post, path = "/v1/segments", tag = "segments", request_body = SegmentOpen,
    responses(
        (status = 201, description = "Created", body = NamedSegment),
        (status = 200, description = "Opened: it existed", body = NamedSegment),
        (status = 400, description = "Malformed body", body = ErrorBody),
        (status = 403, description = "The name belongs to another user", body = ErrorBody),
        (status = 404, description = "Unknown node, or no segment of that name and a size of 0", body = ErrorBody),
        (status = 409, description = "It exists with fewer bytes than asked for; no room; over the node's quota", body = ErrorBody),
        (status = 422, description = "Bad name or holder", body = ErrorBody),
    ))]
pub(crate) async fn open_segment(
    State(st): State<AppState>,
    Caller(c): Caller,
    ApiJson(req): ApiJson<SegmentOpen>,
) -> Result<(StatusCode, Json<NamedSegment>), ApiError> {
    authorized(&st, c, Target::Node(req.node), move |p| p.open_named(req))
        .await
        .map(|(s, how)| match how {
            Allocated::Created => (StatusCode::CREATED, Json(s)),
            Allocated::Replayed => (StatusCode::OK, Json(s)),
        })
}

/// A holder closes the named segment; the last close releases it.
#[utoipa::path(post, path = "/v1/segments/{name}/close", tag = "segments", request_body = SegmentClose,
    params(("name" = String, Path, description = "Segment name")),
    responses(
        (status = 200, body = NamedClosed),
        (status = 400, body = ErrorBody),
        (status = 404, description = "No such name, or not held by that process", body = ErrorBody),
    ))]
pub(crate) async fn close_segment(
    State(st): State<AppState>,
    Caller(c): Caller,
    name: Result<Path<String>, axum::extract::rejection::PathRejection>,
    ApiJson(req): ApiJson<SegmentClose>,
) -> Result<Json<NamedClosed>, ApiError> {
    let Path(name) = name.map_err(|e| ApiError::bad_request(e.body_text()))?;
    authorized(&st, c, Target::Node(req.node), move |p| {
        p.close_named(&name, req.node, &req.holder)
    })
    .await
    .map(Json)
}

/// Query of `GET /v1/segments`.
#[derive(serde::Deserialize, utoipa::IntoParams)]
pub(crate) struct SegmentQuery {
    /// Only the segments this node created or holds.
    node: Option<u64>,
}

/// Lists the named segments (a node token: those its node created or holds).
#[utoipa::path(get, path = "/v1/segments", tag = "segments", params(SegmentQuery),
    responses((status = 200, body = Vec<NamedSegment>), (status = 400, body = ErrorBody)))]
pub(crate) async fn list_segments(
    State(st): State<AppState>,
    Caller(c): Caller,
    q: Result<axum::extract::Query<SegmentQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<NamedSegment>>, ApiError> {
    let q = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let node = q.node;
    with_plane(&st, move |p| {
        Ok(match listing_scope(p, &c, node)? {
            Some(node) => p.named_segments(node),
            None => Vec::new(),
        })
    })
    .await
    .map(Json)
}
