//! The node this agent serves: registered at start (retrying while the control plane is
//! unreachable) and again whenever the control plane has forgotten it.

use super::Shared;
use crate::client::ClientError;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Registers the node, waiting (with a message) while the control plane is unreachable, until
/// it succeeds or the agent stops.
pub(super) fn register(shared: &Shared) {
    let mut wait = Duration::from_millis(100);
    let mut said = false;
    loop {
        match shared.client.register_node(&shared.cfg.registration) {
            Ok(r) => {
                shared.node.store(r.id, Ordering::Release);
                if said {
                    eprintln!("rackmem agent: registered as node {} after all", r.id);
                }
                return;
            }
            Err(e) => {
                if !said {
                    eprintln!(
                        "rackmem agent: cannot register node {}: {e}; retrying",
                        shared.cfg.registration.name
                    );
                    said = true;
                }
                if shared.stop.load(Ordering::Acquire) {
                    return;
                }
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Calls the control plane for this node, registering again if it forgot the node (its state
/// was lost) — the node keeps working across a control-plane reset.
pub(super) fn for_node<T>(shared: &Shared, f: impl Fn(u64) -> Result<T, ClientError>) -> Result<T, ClientError> {
    match f(shared.node.load(Ordering::Acquire)) {
        // The only object these requests name is the node: a 404 means it was forgotten.
        Err(ClientError::Server { status: 404, .. }) => {
            let r = shared.client.register_node(&shared.cfg.registration)?;
            shared.node.store(r.id, Ordering::Release);
            f(r.id)
        }
        other => other,
    }
}
