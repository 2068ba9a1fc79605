//! Leases: a grant is good until the expiry signed into it; holders renew their allocations'
//! grants before then. This file holds how long a grant is good for and the renewal.

use super::{now_unix_ms, ControlPlane, PlaneError};
use crate::api;
use crate::grant;
use crate::store::{Op, Record};
use std::time::Duration;

/// How long grants are good for unless configured: long enough that clocks a little apart do
/// not matter, short enough that a stolen grant is soon worth nothing.
pub const DEFAULT_GRANT_LIFETIME: Duration = Duration::from_secs(600);

/// The expiry inside an encoded grant (0 when it does not decode: shown, never trusted).
pub(super) fn grant_expiry_of(grant_hex: &str) -> u64 {
    hex::decode(grant_hex)
        .ok()
        .and_then(|b| rackmem_proto::Grant::decode(&b).ok())
        .map_or(0, |g| g.expiry_unix_s)
}

impl ControlPlane {
    /// Sets how long grants issued from now on are good for (zero: forever).
    pub fn set_grant_lifetime(&mut self, lifetime: Duration) {
        self.grant_lifetime = lifetime;
    }

    /// The expiry to sign into a grant issued now.
    pub(super) fn grant_expiry(&self) -> u64 {
        if self.grant_lifetime.is_zero() {
            return 0;
        }
        now_unix_ms() / 1000 + self.grant_lifetime.as_secs().max(1)
    }

    /// `POST /v1/allocations/{id}/renew`: signs every segment's grant again with a fresh
    /// expiry (same segment, range and node: a new session key), so its holder can attach
    /// again. The old grants stay valid until their own expiry.
    pub fn renew(&mut self, id: u64) -> Result<api::Allocation, PlaneError> {
        let mut rec = self
            .allocations
            .get(&id)
            .cloned()
            .ok_or_else(|| PlaneError::NotFound(format!("allocation {id}")))?;
        let expiry = self.grant_expiry();
        for s in &mut rec.segments {
            let b = self
                .bricks
                .get(&s.brick_id)
                .ok_or_else(|| PlaneError::NotFound(format!("brick {} of allocation {id}", s.brick_id)))?;
            let rate = self.graph.rate_limit(&s.links, s.bandwidth_bps);
            let issued = grant::issue(&b.key, s.segment_id, s.offset, s.size_bytes, rec.node, expiry, rate);
            s.grant_hex = issued.grant_hex;
            s.session_key_hex = issued.session_key_hex;
        }
        self.store.commit(&[Op::Put(Record::Allocation(rec.clone()))])?;
        Ok(self.keep(rec))
    }
}
