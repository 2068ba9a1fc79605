//! The thread a managed brick runs: register with the control plane (retrying with backoff while
//! it is unreachable), then send a heartbeat every interval and hand each reply's live segments
//! to the brick.
//!
//! When the control plane cannot be reached the callback is not called: a brick keeps its
//! segments through a control-plane outage and releases only what a reply no longer lists. A
//! heartbeat answered with 404 (the control plane lost its state) registers again.

use crate::api::{BrickRegistration, HeartbeatReply, HeartbeatStats};
use crate::client::{Client, ClientError};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// First wait after a failed registration; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between registration attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

struct Stop {
    stopped: Mutex<bool>,
    cv: Condvar,
}

impl Stop {
    /// Sleeps `d` unless stopped first; true when stopped.
    fn sleep(&self, d: Duration) -> bool {
        let g = self.stopped.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (g, _) = self
            .cv
            .wait_timeout_while(g, d, |s| !*s)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *g
    }
}

/// The running heartbeat thread of a brick; dropping it stops the thread.
pub struct BrickHeartbeat {
    stop: Arc<Stop>,
    id: Arc<OnceLock<u64>>,
    thread: Option<JoinHandle<()>>,
}

impl BrickHeartbeat {
    /// The brick's id, once registered.
    pub fn brick_id(&self) -> Option<u64> {
        self.id.get().copied()
    }

    /// Stops the thread and waits for it (at most one request's timeout).
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        *self
            .stop
            .stopped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        self.stop.cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for BrickHeartbeat {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Registers `registration` and sends heartbeats every `interval` on a thread of its own,
/// calling `on_reply` with every reply (the segments the brick must keep, its rate) and the
/// instant its request was sent.
pub fn spawn_brick_heartbeat(
    client: Client,
    registration: BrickRegistration,
    interval: Duration,
    on_reply: impl FnMut(&HeartbeatReply, std::time::Instant) + Send + 'static,
) -> std::io::Result<BrickHeartbeat> {
    spawn_brick_heartbeat_with_stats(client, registration, interval, HeartbeatStats::default, on_reply)
}

/// [`spawn_brick_heartbeat`], with `stats` called before each heartbeat for the numbers to
/// report.
pub fn spawn_brick_heartbeat_with_stats(
    client: Client,
    registration: BrickRegistration,
    interval: Duration,
    stats: impl FnMut() -> HeartbeatStats + Send + 'static,
    on_reply: impl FnMut(&HeartbeatReply, std::time::Instant) + Send + 'static,
) -> std::io::Result<BrickHeartbeat> {
    let stop = Arc::new(Stop {
        stopped: Mutex::new(false),
        cv: Condvar::new(),
    });
    let id = Arc::new(OnceLock::new());
    let (s, i) = (stop.clone(), id.clone());
    let thread = std::thread::Builder::new()
        .name("rackmem-heartbeat".to_string())
        .spawn(move || run(&client, &registration, interval, &s, &i, stats, on_reply))?;
    Ok(BrickHeartbeat {
        stop,
        id,
        thread: Some(thread),
    })
}

fn register(client: &Client, reg: &BrickRegistration, stop: &Stop) -> Option<u64> {
    let mut backoff = FIRST_BACKOFF;
    let mut complained = false;
    loop {
        match client.register_brick(reg) {
            Ok(r) => {
                tracing::info!(
                    brick = %reg.name,
                    id = r.id,
                    control = %client.urls().join(","),
                    "registered with the control plane"
                );
                return Some(r.id);
            }
            Err(e) => {
                // Say it once per outage, then again only when the wait grows to its maximum.
                if !complained || backoff == MAX_BACKOFF {
                    let what = match &e {
                        ClientError::Unreachable { .. } => "control plane unreachable",
                        _ => "control plane refused the registration",
                    };
                    tracing::warn!(brick = %reg.name, "{what}: {e}; retrying in {backoff:?}");
                    complained = true;
                }
            }
        }
        if stop.sleep(backoff) {
            return None;
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

fn run(
    client: &Client,
    reg: &BrickRegistration,
    interval: Duration,
    stop: &Stop,
    id_cell: &OnceLock<u64>,
    mut stats: impl FnMut() -> HeartbeatStats,
    mut on_reply: impl FnMut(&HeartbeatReply, std::time::Instant),
) {
    let Some(mut id) = register(client, reg, stop) else {
        return;
    };
    let _ = id_cell.set(id);
    let mut lost = false;
    loop {
        // The reply lists what the control plane held when it answered; a segment the brick
        // created after this instant may be newer than the list (see `retain_segments_as_of`).
        let sent = std::time::Instant::now();
        match client.heartbeat(id, &stats()) {
            Ok(reply) => {
                if lost {
                    tracing::info!(brick = %reg.name, "control plane reachable again");
                    lost = false;
                }
                on_reply(&reply, sent);
            }
            Err(ClientError::Server { status: 404, .. }) => {
                tracing::warn!(brick = %reg.name, id, "control plane does not know this brick: registering again");
                match register(client, reg, stop) {
                    Some(new_id) => id = new_id,
                    None => return,
                }
            }
            Err(e) => {
                if !lost {
                    tracing::warn!(brick = %reg.name, "heartbeat failed: {e}; keeping every segment meanwhile");
                    lost = true;
                }
            }
        }
        if stop.sleep(interval) {
            return;
        }
    }
}
