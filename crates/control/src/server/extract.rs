//! What handlers take from a request besides the state: the principal it proves ([`Caller`]),
//! a JSON body ([`ApiJson`]) and a numeric path id ([`Id`]), each refusing with a JSON error.

use super::error::{json_rejection, ApiError};
use super::state::{refusal, AppState};
use crate::auth::{AuthError, Principal};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, request::Parts, StatusCode};
use axum::Json;
use serde::de::DeserializeOwned;

/// The principal a request proves: a client certificate's (put in the request's extensions
/// by the HTTPS acceptor), else the bearer token's; 401 otherwise. Extracted before the body,
/// so an unauthenticated request is refused before its body is read.
pub(crate) struct Caller(pub(crate) Principal);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Self, Self::Rejection> {
        let unauthorized = |e: AuthError| {
            // A follower's tokens are as of its last load: one made since is unknown here.
            // Send the client on to the leader rather than refuse what the leader accepts.
            match refusal(&st.leadership, &st.store) {
                Some(r) => ApiError::from(r),
                None => ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", e.to_string()),
            }
        };
        if let Some(p) = parts.extensions.get::<Principal>() {
            return Ok(Caller(p.clone()));
        }
        if let Some(e) = parts.extensions.get::<AuthError>() {
            return Err(unauthorized(e.clone()));
        }
        let Some(v) = parts.headers.get(header::AUTHORIZATION) else {
            return Err(unauthorized(AuthError::Missing));
        };
        let token = v
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .ok_or_else(|| unauthorized(AuthError::Missing))?;
        st.tokens.authenticate(token).map(Caller).map_err(unauthorized)
    }
}

/// A JSON body whose rejections are JSON errors (400, 413, 415) instead of axum's plain text.
pub(crate) struct ApiJson<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(r) => Err(json_rejection(&r)),
        }
    }
}

/// A numeric id from the path; anything else is a JSON 400.
pub(crate) struct Id(pub(crate) u64);

impl<S: Send + Sync> FromRequestParts<S> for Id {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<u64>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(id)) => Ok(Id(id)),
            Err(e) => Err(ApiError::bad_request(format!(
                "the id in the path must be a number: {e}"
            ))),
        }
    }
}
