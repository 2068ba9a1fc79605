//! `/v1/graph`: the resource graph.

use crate::api::Graph;
use crate::server::authz::{authorized, Target};
use crate::server::error::ApiError;
use crate::server::extract::Caller;
use crate::server::state::AppState;
use axum::extract::State;
use axum::Json;

/// The resource graph with reserved and free bandwidth per link.
#[utoipa::path(get, path = "/v1/graph", tag = "graph", responses((status = 200, body = Graph)))]
pub(crate) async fn get_graph(State(st): State<AppState>, Caller(c): Caller) -> Result<Json<Graph>, ApiError> {
    authorized(&st, c, Target::Admin, move |p| Ok(p.graph()))
        .await
        .map(Json)
}
