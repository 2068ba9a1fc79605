//! The dashboard at `/ui/`: one static page, its script and its style, compiled into the binary.
//! The page holds no data and needs no token; its script calls the REST API with the token the
//! user signs in with (or gives in the URL fragment, which never reaches a server). Not part of
//! the OpenAPI document: it is a client of it.

use axum::http::header;
use axum::response::{IntoResponse, Redirect, Response};

const INDEX: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/app.css");

/// Only this origin's script and style run, the page cannot be framed, and nothing is cached
/// (a new build serves its own page at once).
fn page(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; \
                 base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

/// `GET /ui`: to `/ui/`, so relative paths and the fragment survive.
pub(crate) async fn redirect() -> Redirect {
    Redirect::permanent("/ui/")
}

/// `GET /ui/`: the page.
pub(crate) async fn index() -> Response {
    page("text/html; charset=utf-8", INDEX)
}

/// `GET /ui/app.js`.
pub(crate) async fn script() -> Response {
    page("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /ui/app.css`.
pub(crate) async fn style() -> Response {
    page("text/css; charset=utf-8", STYLE)
}
