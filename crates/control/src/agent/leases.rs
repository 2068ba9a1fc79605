//! Leases: the grants of the allocations processes hold are renewed before they expire, so a
//! holder can always attach again.

use super::Shared;
use crate::api::Allocation;
use crate::client::ClientError;
use std::sync::atomic::Ordering;

/// Renews the grants of the allocations processes still hold (agent-made, not `orphans`) once
/// they come within three reconcile periods (at least a minute) of expiring, so a holder can
/// always attach again while a grant copied elsewhere soon expires.
pub(super) fn renew_leases(shared: &Shared, allocations: &[Allocation], orphans: &[u64]) {
    let now_s = crate::plane::now_unix_ms() / 1000;
    let margin_s = (shared.cfg.reconcile_interval * 3).as_secs().max(60);
    for a in allocations {
        // Pool allocations (no holder) are the node's while they live: renewed too, so the
        // process handed one can attach again.
        if orphans.contains(&a.id) || (a.holder.is_none() && !shared.in_pool(a.id)) {
            continue;
        }
        let soonest = a
            .segments
            .iter()
            .map(|s| s.grant_expires_unix_s)
            .filter(|&e| e != 0)
            .min();
        let Some(expiry) = soonest else { continue };
        if expiry.saturating_sub(now_s) > margin_s {
            continue;
        }
        match shared.client.renew(a.id) {
            Ok(_) => {
                shared.counters.renewed.fetch_add(1, Ordering::Relaxed);
            }
            Err(ClientError::Server { status: 404, .. }) => {}
            Err(e) => eprintln!(
                "rackmem agent: renewing the grants of allocation {}: {e}; will retry",
                a.id
            ),
        }
    }
}
