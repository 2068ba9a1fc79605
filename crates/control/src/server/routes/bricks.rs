//! `/v1/bricks`: registration, heartbeats, reading and forgetting bricks.

use crate::api::{
    Brick, BrickRegistered, BrickRegistration, DrainRequest, ErrorBody, HeartbeatReply, HeartbeatStats, Rebalance,
    RebalanceRequest, ServeRateRequest,
};
use crate::server::authz::{authorized, Target};
use crate::server::error::ApiError;
use crate::server::extract::{ApiJson, Caller, Id};
use crate::server::state::AppState;
use axum::extract::State;
use axum::Json;

/// Registers a brick (or re-registers it by name).
#[utoipa::path(post, path = "/v1/bricks", tag = "bricks", request_body = BrickRegistration,
    responses(
        (status = 200, description = "Registered; the id is stable across re-registrations", body = BrickRegistered),
        (status = 400, description = "Malformed body", body = ErrorBody),
        (status = 409, description = "Address taken by another brick, or live segments would be orphaned", body = ErrorBody),
        (status = 422, description = "Invalid name, address, key, capacity or ports", body = ErrorBody),
    ))]
pub(crate) async fn register_brick(
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
pub(crate) async fn list_bricks(State(st): State<AppState>, Caller(c): Caller) -> Result<Json<Vec<Brick>>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| Ok(p.bricks()))
        .await
        .map(Json)
}

/// One brick.
#[utoipa::path(get, path = "/v1/bricks/{id}", tag = "bricks",
    params(("id" = u64, Path, description = "Brick id")),
    responses((status = 200, body = Brick), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_brick(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
) -> Result<Json<Brick>, ApiError> {
    authorized(&st, c, Target::Brick(id), move |p| p.brick(id))
        .await
        .map(Json)
}

/// Forgets a brick that holds no segment: its name is free for a brick with another key.
#[utoipa::path(delete, path = "/v1/bricks/{id}", tag = "bricks",
    params(("id" = u64, Path, description = "Brick id")),
    responses((status = 200, body = Brick), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn forget_brick(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
) -> Result<Json<Brick>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| p.forget_brick(id))
        .await
        .map(Json)
}

/// A brick's heartbeat; the reply lists the segments it must keep (it releases the others).
#[utoipa::path(put, path = "/v1/bricks/{id}/heartbeat", tag = "bricks",
    params(("id" = u64, Path, description = "Brick id")),
    request_body(content = Option<HeartbeatStats>, description = "Optional statistics (the body may be empty)"),
    responses((status = 200, body = HeartbeatReply), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn heartbeat(
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

/// Starts or ends draining a brick (admins): while draining, no new segments are placed on
/// it; `drained` once it holds none.
#[utoipa::path(put, path = "/v1/bricks/{id}/drain", tag = "bricks", request_body = DrainRequest,
    params(("id" = u64, Path, description = "Brick id")),
    responses((status = 200, body = Brick), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn set_draining(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
    ApiJson(req): ApiJson<DrainRequest>,
) -> Result<Json<Brick>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| p.set_draining(id, req.draining))
        .await
        .map(Json)
}

/// Plans a rebalance (admins): moves of allocations from the fullest bricks onto bricks with
/// room until every brick's used share is within the tolerance of the mean; starts them unless
/// a dry run.
#[utoipa::path(post, path = "/v1/rebalance", tag = "bricks", request_body = RebalanceRequest,
    responses(
        (status = 200, description = "The plan (and, unless a dry run, its moves started)", body = Rebalance),
        (status = 409, description = "A rebalance is under way", body = ErrorBody),
        (status = 422, description = "Invalid tolerance", body = ErrorBody),
    ))]
pub(crate) async fn start_rebalance(
    State(st): State<AppState>,
    Caller(c): Caller,
    ApiJson(req): ApiJson<RebalanceRequest>,
) -> Result<Json<Rebalance>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| p.rebalance(req, "operator"))
        .await
        .map(Json)
}

/// The rebalance under way, or the last one (admins).
#[utoipa::path(get, path = "/v1/rebalance", tag = "bricks",
    responses((status = 200, body = Rebalance), (status = 404, description = "None since the control plane started", body = ErrorBody)))]
pub(crate) async fn get_rebalance(State(st): State<AppState>, Caller(c): Caller) -> Result<Json<Rebalance>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| p.rebalance_status())
        .await
        .map(Json)
}

/// Sets what a brick's memory serves (admins): its segments' rates are divided anew and reach
/// the brick with its next heartbeat reply.
#[utoipa::path(put, path = "/v1/bricks/{id}/serve-rate", tag = "bricks", request_body = ServeRateRequest,
    params(("id" = u64, Path, description = "Brick id")),
    responses((status = 200, body = Brick), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn set_serve_rate(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
    ApiJson(req): ApiJson<ServeRateRequest>,
) -> Result<Json<Brick>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| p.set_serve_rate(id, req.serve_bps))
        .await
        .map(Json)
}
