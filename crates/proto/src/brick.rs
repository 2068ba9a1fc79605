//! What a brick says about itself: [`BrickInfo`] in the HELLO response and [`BrickStats`] in the
//! STATS response.

use crate::bytes::{array_at, exact, u32_at, u64_at};
use crate::{DecodeError, NONCE_LEN};

/// What a brick tells a client at HELLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrickInfo {
    /// Pool size in bytes.
    pub pool_bytes: u64,
    /// Free bytes now.
    pub free_bytes: u64,
    /// Page size.
    pub page_size: u32,
    /// Largest payload accepted.
    pub max_payload: u32,
    /// Brick identity (random per start).
    pub brick_id: u64,
    /// Random per connection: an ATTACH proof on this connection is bound to it, so a proof seen
    /// on the wire cannot be replayed on another connection.
    pub nonce: [u8; NONCE_LEN],
}

impl BrickInfo {
    /// Encoded length.
    pub const LEN: usize = 32 + NONCE_LEN;
    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::LEN);
        v.extend_from_slice(&self.pool_bytes.to_le_bytes());
        v.extend_from_slice(&self.free_bytes.to_le_bytes());
        v.extend_from_slice(&self.page_size.to_le_bytes());
        v.extend_from_slice(&self.max_payload.to_le_bytes());
        v.extend_from_slice(&self.brick_id.to_le_bytes());
        v.extend_from_slice(&self.nonce);
        v
    }
    /// Decodes.
    pub fn decode(b: &[u8]) -> Result<BrickInfo, DecodeError> {
        exact(b, Self::LEN)?;
        Ok(BrickInfo {
            pool_bytes: u64_at(b, 0),
            free_bytes: u64_at(b, 8),
            page_size: u32_at(b, 16),
            max_payload: u32_at(b, 20),
            brick_id: u64_at(b, 24),
            nonce: array_at(b, 32),
        })
    }
}

/// Brick-wide counters, returned by STATS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BrickStats {
    /// Bytes served by READ.
    pub bytes_read: u64,
    /// Bytes stored by WRITE.
    pub bytes_written: u64,
    /// Requests handled.
    pub requests: u64,
    /// Connections open now.
    pub connections: u64,
    /// Requests refused or malformed.
    pub errors: u64,
    /// Bytes of pool memory allocated now.
    pub resident_bytes: u64,
    /// Live segments.
    pub segments: u64,
    /// Free bytes.
    pub free_bytes: u64,
}

impl BrickStats {
    /// Encoded length.
    pub const LEN: usize = 64;
    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        [
            self.bytes_read,
            self.bytes_written,
            self.requests,
            self.connections,
            self.errors,
            self.resident_bytes,
            self.segments,
            self.free_bytes,
        ]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
    }
    /// Decodes.
    pub fn decode(b: &[u8]) -> Result<BrickStats, DecodeError> {
        exact(b, Self::LEN)?;
        let f = |i: usize| u64_at(b, i * 8);
        Ok(BrickStats {
            bytes_read: f(0),
            bytes_written: f(1),
            requests: f(2),
            connections: f(3),
            errors: f(4),
            resident_bytes: f(5),
            segments: f(6),
            free_bytes: f(7),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn info_and_stats_round_trip(v in proptest::collection::vec(any::<u64>(), 8), small in any::<(u32, u32)>(), nonce in any::<[u8; 16]>()) {
            let info = BrickInfo { pool_bytes: v[0], free_bytes: v[1], page_size: small.0, max_payload: small.1, brick_id: v[2], nonce };
            prop_assert_eq!(BrickInfo::decode(&info.encode()).unwrap(), info);
            // A HELLO answer from a brick without nonces is refused, not misread.
            prop_assert!(BrickInfo::decode(&info.encode()[..32]).is_err());
            let stats = BrickStats {
                bytes_read: v[0], bytes_written: v[1], requests: v[2], connections: v[3],
                errors: v[4], resident_bytes: v[5], segments: v[6], free_bytes: v[7],
            };
            prop_assert_eq!(BrickStats::decode(&stats.encode()).unwrap(), stats);
            prop_assert!(BrickStats::decode(&stats.encode()[1..]).is_err());
        }
    }
}
