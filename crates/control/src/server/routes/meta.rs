//! Routes about the server itself: health, the election, this OpenAPI document and the
//! metrics.

use crate::api::{ErrorBody, Health, LeaderInfo};
use crate::auth::Role as AuthRole;
use crate::server::error::ApiError;
use crate::server::extract::Caller;
use crate::server::state::{with_plane, AppState};
use crate::store::Role;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Leader => "leader",
        Role::Follower => "follower",
    }
}

/// Liveness of the control plane, its role and the leader.
#[utoipa::path(get, path = "/healthz", tag = "meta", responses((status = 200, body = Health)))]
pub(crate) async fn healthz(State(st): State<AppState>) -> Json<Health> {
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
pub(crate) async fn leader(State(st): State<AppState>) -> Json<LeaderInfo> {
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
pub(crate) async fn openapi_json(State(st): State<AppState>, c: Result<Caller, ApiError>) -> Response {
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

/// Prometheus metrics: for admin tokens and `metrics` (scrape) tokens, or anyone when the
/// deployment opens them (`--public-metrics`). They show the rack's capacity, usage and every
/// brick's name: not for node or brick tokens.
#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses(
        (status = 200, description = "OpenMetrics 1.0 text (Prometheus reads it)", content_type = "application/openmetrics-text"),
        (status = 401, description = "No token, or an unknown one", body = ErrorBody),
        (status = 403, description = "A token of another role than admin or metrics", body = ErrorBody),
    ))]
pub(crate) async fn metrics(State(st): State<AppState>, c: Result<Caller, ApiError>) -> Result<Response, ApiError> {
    if !st.public.metrics {
        let Caller(c) = c?;
        if !matches!(c.role, AuthRole::Admin | AuthRole::Metrics) {
            return Err(ApiError::from(crate::plane::PlaneError::Forbidden(format!(
                "{} may not read /metrics: they are for admin tokens and scrape tokens \
                 (rackmem ctl token create --role metrics --name NAME)",
                c.describe()
            ))));
        }
    }
    let serving = st.leadership.serving();
    // A follower's state is as of its last load: it reports only its role and its requests.
    let g = if serving {
        Some(with_plane(&st, |p| Ok(p.gauges())).await?)
    } else {
        None
    };
    Ok((
        [(header::CONTENT_TYPE, rackmem_metrics::CONTENT_TYPE)],
        st.metrics.render(serving, g.as_ref(), &st.conns),
    )
        .into_response())
}
