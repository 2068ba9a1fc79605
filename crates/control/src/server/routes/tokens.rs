//! `/v1/tokens`: creating, listing and revoking API tokens (admins only).

use crate::api::{ErrorBody, TokenCreated, TokenInfo, TokenRequest};
use crate::server::authz::{authorized, Target};
use crate::server::error::ApiError;
use crate::server::extract::{ApiJson, Caller, Id};
use crate::server::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

/// Creates a token (admins only); the reply holds the secret, shown this once.
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", request_body = TokenRequest,
    responses(
        (status = 201, body = TokenCreated),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub(crate) async fn create_token(
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
pub(crate) async fn list_tokens(
    State(st): State<AppState>,
    Caller(c): Caller,
) -> Result<Json<Vec<TokenInfo>>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| Ok(p.tokens()))
        .await
        .map(Json)
}

/// Revokes a token (admins only): it stops working at once.
#[utoipa::path(delete, path = "/v1/tokens/{id}", tag = "tokens",
    params(("id" = u64, Path, description = "Token id")),
    responses((status = 200, body = TokenInfo), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn revoke_token(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
) -> Result<Json<TokenInfo>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| p.revoke_token(id))
        .await
        .map(Json)
}
