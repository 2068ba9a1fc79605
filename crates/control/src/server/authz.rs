//! Authorization: which objects a principal may touch (deny by default), checked under the
//! control plane's lock together with the request it guards.

use super::error::ApiError;
use super::state::{with_plane, AppState};
use crate::auth::{Principal, Role};
use crate::plane::{ControlPlane, PlaneError};

/// An object a request touches, for [`may`].
pub(crate) enum Target {
    /// Only admins.
    Admin,
    /// The node of this name.
    NodeName(String),
    /// The node of this id.
    Node(u64),
    /// The brick of this name.
    BrickName(String),
    /// The brick of this id.
    Brick(u64),
    /// An allocation (its node's).
    Allocation(u64),
}

/// Runs `f` on the control plane (see [`with_plane`]) once `c` may touch `t` (see [`may`]),
/// checked under the same lock, so the object cannot change owner in between.
pub(crate) async fn authorized<T, F>(st: &AppState, c: Principal, t: Target, f: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&mut ControlPlane) -> Result<T, PlaneError> + Send + 'static,
{
    with_plane(st, move |p| {
        may(p, &c, &t)?;
        f(p)
    })
    .await
}

/// Which node's records a listing by `c` shows, asked for `node` (`None`: every node):
/// `Ok(Some(filter))`, or `Ok(None)` for a node token whose node has not registered yet, which
/// sees nothing. An admin lists any node or all; a node token lists its own node (its own when
/// it names none); anyone else must be allowed the node it names, or be an admin to list all.
pub(crate) fn listing_scope(
    p: &ControlPlane,
    c: &Principal,
    node: Option<u64>,
) -> Result<Option<Option<u64>>, PlaneError> {
    match (c.role, node) {
        (Role::Admin, n) => Ok(Some(n)),
        (Role::Node, None) => Ok(p.node_id(&c.name).map(Some)),
        (_, Some(n)) => may(p, c, &Target::Node(n)).map(|()| Some(Some(n))),
        (_, None) => may(p, c, &Target::Admin).map(|()| Some(None)),
    }
}

/// Whether `c` may touch `t` (deny by default: each role passes only where named here).
pub(crate) fn may(p: &ControlPlane, c: &Principal, t: &Target) -> Result<(), PlaneError> {
    let ok = match (c.role, t) {
        (Role::Admin, _) => true,
        (Role::Node, Target::NodeName(n)) => *n == c.name,
        (Role::Node, Target::Node(id)) => p.node_id(&c.name) == Some(*id),
        (Role::Node, Target::Allocation(id)) => {
            let Some(node) = p.allocation_node(*id) else {
                return Err(PlaneError::NotFound(format!("allocation {id}")));
            };
            p.node_id(&c.name) == Some(node)
        }
        (Role::Brick, Target::BrickName(n)) => *n == c.name,
        (Role::Brick, Target::Brick(id)) => p.brick_name(*id) == Some(c.name.as_str()),
        _ => false,
    };
    if ok {
        return Ok(());
    }
    let what = match t {
        Target::Admin => "this (admins only)".to_string(),
        Target::NodeName(n) => format!("node {n:?}"),
        Target::Node(id) => format!("node {id}"),
        Target::BrickName(n) => format!("brick {n:?}"),
        Target::Brick(id) => format!("brick {id}"),
        Target::Allocation(id) => format!("allocation {id}"),
    };
    Err(PlaneError::Forbidden(format!(
        "{} may not touch {what}: a node token acts for its own node, a brick token for its own brick",
        c.describe()
    )))
}
