//! `/v1/circuits`: the circuits, the rules the switches were given, and moving a circuit to
//! other links (admins only).

use crate::api::{Circuit, CircuitMove, Circuits, ErrorBody};
use crate::server::authz::{authorized, Target};
use crate::server::error::ApiError;
use crate::server::extract::{ApiJson, Caller, Id};
use crate::server::state::AppState;
use axum::extract::State;
use axum::Json;

/// Every circuit with the links it holds and its switch rules, and what each switch was last
/// given by the switch driver.
#[utoipa::path(get, path = "/v1/circuits", tag = "circuits", responses((status = 200, body = Circuits)))]
pub(crate) async fn list_circuits(State(st): State<AppState>, Caller(c): Caller) -> Result<Json<Circuits>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| Ok(p.circuits()))
        .await
        .map(Json)
}

/// Moves a circuit to other links (same bricks, segments and grants): new paths avoiding
/// `avoid`, the switches given their new rules at once, then the allocation stored.
#[utoipa::path(post, path = "/v1/circuits/{id}/move", tag = "circuits", request_body = CircuitMove,
    params(("id" = u64, Path, description = "Allocation id of the circuit")),
    responses(
        (status = 200, body = Circuit),
        (status = 404, body = ErrorBody),
        (status = 409, description = "No other path free of other segments", body = ErrorBody),
        (status = 422, description = "Not a circuit", body = ErrorBody),
        (status = 502, description = "A switch could not be configured; nothing changed", body = ErrorBody),
    ))]
pub(crate) async fn move_circuit(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
    ApiJson(req): ApiJson<CircuitMove>,
) -> Result<Json<Circuit>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| p.move_circuit(id, &req.avoid))
        .await
        .map(Json)
}
