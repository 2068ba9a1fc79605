//! The handlers of the REST API, a file per resource. Each handler's `utoipa::path` is its
//! route and its OpenAPI operation; `router` lists them.

pub(crate) mod allocations;
pub(crate) mod bricks;
pub(crate) mod circuits;
pub(crate) mod graph;
pub(crate) mod meta;
pub(crate) mod nodes;
pub(crate) mod processes;
pub(crate) mod segments;
pub(crate) mod tokens;
pub(crate) mod ui;
