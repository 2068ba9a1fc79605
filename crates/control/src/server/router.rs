//! The routes and the OpenAPI document, assembled together: each handler's `utoipa::path`
//! gives both its route and its operation, so the document cannot miss a route. Also the
//! router with its fallbacks, its middleware (request counting and the request timeout) and
//! its state.

use super::config::PublicRoutes;
use super::error::ApiError;
use super::error::{method_not_allowed, not_found};
use super::metrics::Metrics;
use super::routes::{allocations, bricks, circuits, graph, meta, nodes, processes, segments, tokens, ui};
use super::state::AppState;
use crate::api::{BrickState, Endpoint, ErrorBody, ErrorDetail, LeaderInfo, LiveSegment, Port, PortSpec, Segment};
use crate::auth::TokenTable;
use crate::plane::ControlPlane;
use crate::store::Leadership;
use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use utoipa::OpenApi;
use utoipa_axum::{router::OpenApiRouter, routes};

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
        (name = "segments", description = "Named segments, opened by processes on several nodes"),
        (name = "graph", description = "The resource graph"),
        (name = "circuits", description = "Circuits: links held by one allocation, and the switch rules connecting them"),
        (name = "tokens", description = "API tokens (admins only)"),
        (name = "meta", description = "Health, metrics, this document"),
    ),
    components(schemas(ErrorBody, ErrorDetail, LeaderInfo, Endpoint, BrickState, PortSpec, Port, LiveSegment, Segment))
)]
struct ApiDoc;

/// Every route, each with its OpenAPI operation.
fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(bricks::register_brick, bricks::list_bricks))
        .routes(routes!(bricks::get_brick, bricks::forget_brick))
        .routes(routes!(bricks::heartbeat))
        .routes(routes!(bricks::set_serve_rate))
        .routes(routes!(nodes::register_node, nodes::list_nodes))
        .routes(routes!(nodes::get_node))
        .routes(routes!(nodes::node_rates))
        .routes(routes!(nodes::set_node_quota))
        .routes(routes!(processes::report_processes))
        .routes(routes!(processes::list_processes))
        .routes(routes!(nodes::report_pool))
        .routes(routes!(allocations::create_allocation, allocations::list_allocations))
        .routes(routes!(
            allocations::get_allocation,
            allocations::delete_allocation,
            allocations::resize_allocation
        ))
        .routes(routes!(allocations::renew_allocation))
        .routes(routes!(allocations::clone_allocation))
        .routes(routes!(segments::open_segment, segments::list_segments))
        .routes(routes!(segments::close_segment))
        .routes(routes!(graph::get_graph))
        .routes(routes!(circuits::list_circuits))
        .routes(routes!(circuits::move_circuit))
        .routes(routes!(tokens::create_token, tokens::list_tokens))
        .routes(routes!(tokens::revoke_token))
        .routes(routes!(meta::healthz))
        .routes(routes!(meta::leader))
        .routes(routes!(meta::openapi_json))
        .routes(routes!(meta::metrics))
        .routes(routes!(bricks::set_draining))
        .routes(routes!(bricks::start_rebalance, bricks::get_rebalance))
}

/// What [`build`] needs besides the control plane.
pub(crate) struct Settings {
    pub(crate) body_limit_bytes: usize,
    pub(crate) leadership: Arc<Leadership>,
    pub(crate) advertise: String,
    pub(crate) tokens: Arc<TokenTable>,
    pub(crate) public: PublicRoutes,
    pub(crate) conns: Arc<crate::serve::ConnStats>,
    pub(crate) request_timeout: Duration,
}

/// The router, and the control plane it serves (behind its lock).
pub(crate) fn build(mut plane: ControlPlane, s: Settings) -> (axum::Router, Arc<Mutex<ControlPlane>>) {
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
        processes: Arc::default(),
        openapi_json: Arc::new(openapi_json),
        store: Arc::new(store),
        leadership: s.leadership,
        advertise: Arc::new(s.advertise),
        tokens: s.tokens,
        public: s.public,
        conns: s.conns,
        request_timeout: s.request_timeout,
    };
    // The dashboard: static files, outside the OpenAPI document (a client of it).
    let router = router
        .route("/ui", axum::routing::get(ui::redirect))
        .route("/ui/", axum::routing::get(ui::index))
        .route("/ui/app.js", axum::routing::get(ui::script))
        .route("/ui/app.css", axum::routing::get(ui::style))
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

/// Counts each request by route, method and status, and cuts one that takes longer than the
/// request timeout.
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
    st.metrics.count_request(route, method, resp.status().as_u16());
    resp
}
