//! Error replies: every refusal is JSON, `{"error": {"code", "message"}}`, with the status the
//! table in the module above gives; the fallbacks for unknown routes and methods too.

use crate::api::{ErrorBody, ErrorDetail};
use crate::plane::PlaneError;
use crate::store::StoreError;
use axum::extract::rejection::JsonRejection;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

/// An error reply.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    leader: Option<String>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            leader: None,
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
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
            PlaneError::QuotaExceeded(_) => (StatusCode::CONFLICT, "quota_exceeded"),
            PlaneError::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, "store"),
            PlaneError::Switch(_) => (StatusCode::BAD_GATEWAY, "switch"),
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

/// The error reply for a body axum could not take as JSON.
pub(crate) fn json_rejection(r: &JsonRejection) -> ApiError {
    match r.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(r.status(), "payload_too_large", r.body_text()),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::new(r.status(), "unsupported_media_type", r.body_text()),
        _ => ApiError::bad_request(r.body_text()),
    }
}

/// The reply to a request for a route that does not exist.
pub(crate) async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route (see /openapi.json)")
}

/// The reply to a route asked with a method it does not take.
pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method (see /openapi.json)",
    )
}
