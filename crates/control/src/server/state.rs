//! What every handler shares ([`AppState`]) and the one way to the control plane: on a
//! blocking thread, under its lock, and only while this replica leads and has loaded the state
//! of its term ([`with_plane`]). The background tasks that take the same lock live here too:
//! marking bricks down, and reloading the state when leadership changes.

use super::config::PublicRoutes;
use super::error::ApiError;
use super::metrics::Metrics;
use crate::auth::TokenTable;
use crate::plane::{ControlPlane, PlaneError};
use crate::store::{Leadership, Role, StoreError};
use axum::http::StatusCode;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Locks `m`, also after a panic in another holder.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a lock cannot leave these structures half-updated in a way that
    // matters more than refusing all further requests would.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The state of the router, shared by every request.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) plane: Arc<Mutex<ControlPlane>>,
    pub(crate) metrics: Arc<Metrics>,
    /// What each node's agent last reported of its processes.
    pub(crate) processes: Arc<Mutex<super::routes::processes::ProcessTable>>,
    pub(crate) openapi_json: Arc<String>,
    pub(crate) store: Arc<String>,
    pub(crate) leadership: Arc<Leadership>,
    pub(crate) advertise: Arc<String>,
    pub(crate) tokens: Arc<TokenTable>,
    /// `/openapi.json` and `/metrics` without a token.
    pub(crate) public: PublicRoutes,
    pub(crate) conns: Arc<crate::serve::ConnStats>,
    pub(crate) request_timeout: Duration,
}

/// Why this control plane may not serve the API now, if so: it follows (`not_leader`), or it
/// leads but has not reloaded the state of its term yet (`store`, retry shortly).
pub(crate) fn refusal(leadership: &Leadership, store: &str) -> Option<PlaneError> {
    let s = leadership.status();
    if s.role == Role::Follower {
        return Some(PlaneError::Store(StoreError::NotLeader {
            store: store.to_string(),
            leader: s.leader,
        }));
    }
    (s.synced_term != s.term).then(|| {
        PlaneError::Store(StoreError::Backend {
            store: store.to_string(),
            message: "this control plane is reloading the state (it just became leader, or a commit \
                      failed); retry shortly"
                .to_string(),
        })
    })
}

/// Runs `f` on the control plane on a blocking thread (it may commit to the store), provided
/// this control plane leads and has loaded the state (checked under the lock, so a reload
/// cannot slip in between).
pub(crate) async fn with_plane<T, F>(st: &AppState, f: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&mut ControlPlane) -> Result<T, PlaneError> + Send + 'static,
{
    let plane = st.plane.clone();
    let leadership = st.leadership.clone();
    let store = st.store.clone();
    let run = move || {
        let mut p = lock(&plane);
        match refusal(&leadership, &store) {
            Some(e) => Err(e),
            None => f(&mut p),
        }
    };
    match tokio::task::spawn_blocking(run).await {
        Ok(r) => r.map_err(ApiError::from),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("the request failed inside the control plane: {e}"),
        )),
    }
}

/// Marks down, every `period`, the bricks whose heartbeats stopped.
pub(crate) async fn expire_bricks(plane: Arc<Mutex<ControlPlane>>, period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // The lock may be held by a commit in progress: wait for it off the async workers.
        let p = plane.clone();
        let down = tokio::task::spawn_blocking(move || {
            let mut p = lock(&p);
            // A switch whose update failed is retried here, once a period, until it takes.
            p.retry_switches();
            p.expire_bricks(Instant::now())
        })
        .await
        .unwrap_or_default();
        for name in down {
            tracing::warn!(brick = %name, "brick missed its heartbeats: marked down");
        }
    }
}

/// Reloads the state whenever this control plane leads a term whose state it has not loaded
/// (it just won the election, or a commit's outcome is unknown), then lets it serve.
pub(crate) async fn follow_leadership(plane: Arc<Mutex<ControlPlane>>, leadership: Arc<Leadership>, period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        let s = leadership.status();
        if s.role != Role::Leader || s.synced_term == s.term {
            continue;
        }
        let (p, l) = (plane.clone(), leadership.clone());
        let r = tokio::task::spawn_blocking(move || {
            let mut p = lock(&p);
            // Loaded under the lock: no request runs on the old state meanwhile.
            p.reload().map(|()| {
                l.synced(s.term);
                p.gauges()
            })
        })
        .await;
        match r {
            Ok(Ok(g)) => {
                failing = false;
                tracing::info!(
                    term = s.term,
                    allocations = g.allocations,
                    bricks = g.bricks_up + g.bricks_down,
                    "state reloaded: serving as leader"
                );
            }
            Ok(Err(e)) => {
                if !failing {
                    tracing::warn!("reloading the state: {e}; retrying");
                    failing = true;
                }
            }
            Err(e) => tracing::warn!("reloading the state: {e}"),
        }
    }
}
