//! Authorization: [`rights`], signed [`Grant`]s, the session key derived from a grant, the ATTACH
//! proof that binds that key to one connection's nonce, and [`SegmentGrant`] (a grant with its key).

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::bytes::{array_at, exact, u64_at};
use crate::{DecodeError, KEY_LEN, NONCE_LEN};

/// Rights a grant gives.
pub mod rights {
    /// READ.
    pub const READ: u8 = 1;
    /// WRITE, DISCARD, COPY.
    pub const WRITE: u8 = 2;
    /// CLONE.
    pub const CLONE: u8 = 4;
    /// Everything.
    pub const ALL: u8 = READ | WRITE | CLONE;
}

/// A brick's permission for one node to use one segment, signed with the brick's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Segment identity on the brick.
    pub segment_id: u64,
    /// Where the segment starts in the brick's pool.
    pub brick_offset: u64,
    /// Segment size.
    pub size_bytes: u64,
    /// Node the grant is for.
    pub node: u64,
    /// [`rights`] bits.
    pub rights: u8,
    /// Seconds since the Unix epoch after which the grant is void (0 = never).
    pub expiry_unix_s: u64,
    /// HMAC-SHA256 over the fields above (and `rate_bps`, when not 0).
    pub mac: [u8; 32],
    /// The rate in bytes/s the brick serves this segment at most (0: the grant sets none, and
    /// the brick paces the segment by its total alone). A grant with a rate is
    /// [`Grant::RATED_LEN`] bytes and signed under its own label, so a v1 grant cannot be
    /// turned into a rated one, nor a rate altered, without the brick's key.
    pub rate_bps: u64,
}

/// Why a grant is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    /// The signature does not verify.
    #[error("grant signature does not verify (forged, altered, or signed by another brick)")]
    BadSignature,
    /// The grant expired.
    #[error("grant expired")]
    Expired,
}

impl Grant {
    /// Encoded length of a grant without a rate (`rate_bps == 0`).
    pub const LEN: usize = 8 * 5 + 1 + 32;
    /// Encoded length of a grant with a rate: the rate follows the expiry, before the MAC.
    pub const RATED_LEN: usize = Self::LEN + 8;

    /// Encoded length of this grant.
    pub fn encoded_len(&self) -> usize {
        if self.rate_bps == 0 {
            Self::LEN
        } else {
            Self::RATED_LEN
        }
    }

    fn signed_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::RATED_LEN);
        b.extend_from_slice(&self.segment_id.to_le_bytes());
        b.extend_from_slice(&self.brick_offset.to_le_bytes());
        b.extend_from_slice(&self.size_bytes.to_le_bytes());
        b.extend_from_slice(&self.node.to_le_bytes());
        b.push(self.rights);
        b.extend_from_slice(&self.expiry_unix_s.to_le_bytes());
        if self.rate_bps != 0 {
            b.extend_from_slice(&self.rate_bps.to_le_bytes());
        }
        b
    }

    fn compute_mac(&self, key: &[u8]) -> Hmac<Sha256> {
        let mut m = hmac(key);
        m.update(if self.rate_bps == 0 {
            b"rackmem-grant-v1"
        } else {
            b"rackmem-grant-v2"
        });
        m.update(&self.signed_bytes());
        m
    }

    /// Builds and signs a grant.
    pub fn sign(
        key: &[u8],
        segment_id: u64,
        brick_offset: u64,
        size_bytes: u64,
        node: u64,
        rights: u8,
        expiry_unix_s: u64,
    ) -> Grant {
        Self::sign_rated(
            key,
            segment_id,
            brick_offset,
            size_bytes,
            node,
            rights,
            expiry_unix_s,
            0,
        )
    }

    /// [`Grant::sign`] with the rate the brick is to serve the segment at (0: none).
    #[allow(clippy::too_many_arguments)]
    pub fn sign_rated(
        key: &[u8],
        segment_id: u64,
        brick_offset: u64,
        size_bytes: u64,
        node: u64,
        rights: u8,
        expiry_unix_s: u64,
        rate_bps: u64,
    ) -> Grant {
        let mut g = Grant {
            segment_id,
            brick_offset,
            size_bytes,
            node,
            rights,
            expiry_unix_s,
            mac: [0; 32],
            rate_bps,
        };
        g.mac = g.compute_mac(key).finalize().into_bytes().into();
        g
    }

    /// Verifies the signature (in constant time) and the expiry.
    pub fn verify(&self, key: &[u8], now_unix_s: u64) -> Result<(), GrantError> {
        self.compute_mac(key)
            .verify_slice(&self.mac)
            .map_err(|_| GrantError::BadSignature)?;
        if self.expiry_unix_s != 0 && now_unix_s > self.expiry_unix_s {
            return Err(GrantError::Expired);
        }
        Ok(())
    }

    /// Encodes ([`Grant::LEN`] bytes, or [`Grant::RATED_LEN`] with a rate).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = self.signed_bytes();
        v.extend_from_slice(&self.mac);
        v
    }

    /// Decodes either length.
    pub fn decode(b: &[u8]) -> Result<Grant, DecodeError> {
        let (rate_bps, mac_at) = if b.len() == Self::RATED_LEN {
            let rate = u64_at(b, 41);
            if rate == 0 {
                // Encoded as the shorter grant; this form would never verify.
                return Err(DecodeError::Invalid("rated grant with a rate of 0"));
            }
            (rate, 49)
        } else {
            exact(b, Self::LEN)?;
            (0, 41)
        };
        Ok(Grant {
            segment_id: u64_at(b, 0),
            brick_offset: u64_at(b, 8),
            size_bytes: u64_at(b, 16),
            node: u64_at(b, 24),
            rights: b[32],
            expiry_unix_s: u64_at(b, 33),
            mac: array_at(b, mac_at),
            rate_bps,
        })
    }
}

fn hmac(key: &[u8]) -> Hmac<Sha256> {
    // HMAC accepts keys of any length; new_from_slice cannot fail for HMAC.
    <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC takes any key length"))
}

/// Domain separation of the session-key derivation (part of the contract between control
/// planes, bricks and nodes: `docs/control-plane.md`).
pub const SESSION_KEY_LABEL: &[u8] = b"rackmem-session-v1";

/// The session key of a grant: `HMAC-SHA256(brick_key, "rackmem-session-v1" || grant.mac)`.
///
/// Whoever holds the brick's key (the brick, its control plane) can derive it; a node receives
/// it only along with its own grant (ALLOC and CLONE replies, or the control plane's allocation
/// reply). The grant alone, which crosses the network in clear at every ATTACH, does not reveal
/// it. Keep it as secret as the data in the segment.
pub fn session_key(brick_key: &[u8], grant: &Grant) -> [u8; KEY_LEN] {
    let mut m = hmac(brick_key);
    m.update(SESSION_KEY_LABEL);
    m.update(&grant.mac);
    m.finalize().into_bytes().into()
}

fn proof_mac(session_key: &[u8; KEY_LEN], nonce: &[u8; NONCE_LEN], segment_id: u64) -> Hmac<Sha256> {
    let mut m = hmac(session_key);
    m.update(b"rackmem-attach-v1");
    m.update(nonce);
    m.update(&segment_id.to_le_bytes());
    m
}

/// The proof an ATTACH carries: `HMAC-SHA256(session_key, "rackmem-attach-v1" || nonce ||
/// segment_id as u64 LE)`, where `nonce` is the one the brick returned at this connection's
/// HELLO ([`BrickInfo::nonce`](crate::BrickInfo::nonce)). Valid on that connection only.
pub fn attach_proof(session_key: &[u8; KEY_LEN], nonce: &[u8; NONCE_LEN], segment_id: u64) -> [u8; KEY_LEN] {
    proof_mac(session_key, nonce, segment_id).finalize().into_bytes().into()
}

/// True if `proof` is [`attach_proof`] of these inputs; compared in constant time, so a peer
/// cannot learn a valid proof byte by byte from response timing.
pub fn verify_attach_proof(
    session_key: &[u8; KEY_LEN],
    nonce: &[u8; NONCE_LEN],
    segment_id: u64,
    proof: &[u8; KEY_LEN],
) -> bool {
    proof_mac(session_key, nonce, segment_id).verify_slice(proof).is_ok()
}

/// Compares two byte strings in time that depends on their lengths only, never on where they
/// differ (for secrets and MACs).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A grant with its session key: what ALLOC and CLONE return, and what a node needs to attach.
#[derive(Clone, PartialEq, Eq)]
pub struct SegmentGrant {
    /// The grant.
    pub grant: Grant,
    /// Its session key ([`session_key`]).
    pub session_key: [u8; KEY_LEN],
}

// Hand-written so the session key never lands in a log.
impl std::fmt::Debug for SegmentGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentGrant")
            .field("grant", &self.grant)
            .field("session_key", &"<secret>")
            .finish()
    }
}

impl SegmentGrant {
    /// Encoded length: the grant, then the key.
    pub const LEN: usize = Grant::LEN + KEY_LEN;

    /// The grant and the session key derived from it with `brick_key`.
    pub fn new(brick_key: &[u8], grant: Grant) -> SegmentGrant {
        SegmentGrant {
            session_key: session_key(brick_key, &grant),
            grant,
        }
    }

    /// Encodes as `grant || session_key`.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = self.grant.encode();
        v.extend_from_slice(&self.session_key);
        v
    }

    /// Decodes `grant || session_key` (either grant length).
    pub fn decode(b: &[u8]) -> Result<SegmentGrant, DecodeError> {
        let grant_len = if b.len() == Grant::RATED_LEN + KEY_LEN {
            Grant::RATED_LEN
        } else {
            exact(b, Self::LEN)?;
            Grant::LEN
        };
        Ok(SegmentGrant {
            grant: Grant::decode(&b[..grant_len])?,
            session_key: array_at(b, grant_len),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::BrickInfo;
    use proptest::prelude::*;

    // Shared with request's tests, whose ATTACH requests carry these grants.
    pub(crate) fn grant() -> impl Strategy<Value = Grant> {
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u8>(),
            any::<u64>(),
            any::<[u8; 32]>(),
        )
            .prop_map(
                |(segment_id, brick_offset, size_bytes, node, rights, expiry_unix_s, mac)| Grant {
                    segment_id,
                    brick_offset,
                    size_bytes,
                    node,
                    rights,
                    expiry_unix_s,
                    mac,
                    rate_bps: 0,
                },
            )
    }

    proptest! {
        #[test]
        fn grant_round_trip_and_signature(g in grant(), key in proptest::collection::vec(any::<u8>(), 1..64)) {
            let s = Grant::sign(&key, g.segment_id, g.brick_offset, g.size_bytes, g.node, g.rights, 0);
            prop_assert_eq!(Grant::decode(&s.encode()).unwrap(), s.clone());
            prop_assert!(s.verify(&key, 1).is_ok());
            let mut forged = s.clone();
            forged.size_bytes ^= 1;
            prop_assert_eq!(forged.verify(&key, 1), Err(GrantError::BadSignature));
        }

        #[test]
        fn segment_grant_round_trip(g in grant(), key in any::<[u8; 32]>()) {
            let sg = SegmentGrant { grant: g, session_key: key };
            let bytes = sg.encode();
            prop_assert_eq!(bytes.len(), SegmentGrant::LEN);
            prop_assert_eq!(SegmentGrant::decode(&bytes).unwrap(), sg);
            prop_assert!(SegmentGrant::decode(&bytes[..Grant::LEN]).is_err());
        }

        #[test]
        fn segment_grant_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..160)) {
            let _ = SegmentGrant::decode(&bytes);
            let _ = BrickInfo::decode(&bytes);
        }

        #[test]
        fn proofs_bind_key_nonce_and_segment(
            g in grant(),
            brick_key in proptest::collection::vec(any::<u8>(), 1..64),
            nonce in any::<[u8; 16]>(),
            flip in 0usize..16,
        ) {
            let g = Grant::sign(&brick_key, g.segment_id, g.brick_offset, g.size_bytes, g.node, g.rights, 0);
            let key = session_key(&brick_key, &g);
            let proof = attach_proof(&key, &nonce, g.segment_id);
            prop_assert!(verify_attach_proof(&key, &nonce, g.segment_id, &proof));
            let mut other_nonce = nonce;
            other_nonce[flip] ^= 1;
            prop_assert!(!verify_attach_proof(&key, &other_nonce, g.segment_id, &proof), "replayed on another connection");
            prop_assert!(!verify_attach_proof(&key, &nonce, g.segment_id ^ 1, &proof), "used for another segment");
            let other = Grant::sign(&brick_key, g.segment_id ^ 1, g.brick_offset, g.size_bytes, g.node, g.rights, 0);
            prop_assert_ne!(session_key(&brick_key, &other), key, "every grant has its own session key");
            let mut other_brick = brick_key.clone();
            // Not a trailing zero: HMAC pads short keys with zeros, so "k" and "k\0" are one key.
            other_brick[0] ^= 1;
            prop_assert_ne!(session_key(&other_brick, &g), key);
        }
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Pins the derivations of `docs/control-plane.md` to values computed independently (Python's
    /// `hmac`), so a control plane written in another language agrees with the brick.
    #[test]
    fn session_key_and_proof_known_answers() {
        let g = Grant::sign(b"brick-key", 7, 1 << 20, 2 << 20, 3, rights::ALL, 0);
        assert_eq!(
            g.mac.to_vec(),
            unhex("aa7ff9e506f8a4fe226fba0815ec7abdf3fdfbf1daac31d9b3afdc2d9c5232cf")
        );
        let key = session_key(b"brick-key", &g);
        assert_eq!(
            key.to_vec(),
            unhex("350aedf7471a46fbe2b3a106b9364984a115e1ca2e4c7b4b87bf1b4ae2f564d2")
        );
        let nonce: [u8; 16] = std::array::from_fn(|i| i as u8);
        assert_eq!(
            attach_proof(&key, &nonce, 7).to_vec(),
            unhex("bb3079a8beeaec30d7596aea3b8f2fca9cd1d1df60e9dea6e40d0c5f6f538ade")
        );
    }

    #[test]
    fn constant_time_eq_compares() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn segment_grant_debug_hides_the_key() {
        let sg = SegmentGrant::new(b"k", Grant::sign(b"k", 1, 0, 4096, 2, rights::ALL, 0));
        let shown = format!("{sg:?}");
        assert!(!shown.contains(&format!("{:?}", sg.session_key)), "{shown}");
    }

    proptest! {
        #[test]
        fn rated_grants_round_trip_and_bind_their_rate(g in grant(), rate in 1u64.., key in any::<[u8; 32]>()) {
            let s = Grant::sign_rated(&key, g.segment_id, g.brick_offset, g.size_bytes, g.node, g.rights, 0, rate);
            let bytes = s.encode();
            prop_assert_eq!(bytes.len(), Grant::RATED_LEN);
            prop_assert_eq!(Grant::decode(&bytes).unwrap(), s.clone());
            prop_assert!(s.verify(&key, 1).is_ok());
            let mut faster = s.clone();
            faster.rate_bps = rate.wrapping_add(1).max(1);
            prop_assert_eq!(faster.verify(&key, 1), Err(GrantError::BadSignature), "a rate cannot be raised");
            let mut unrated = s.clone();
            unrated.rate_bps = 0;
            prop_assert_eq!(unrated.verify(&key, 1), Err(GrantError::BadSignature), "nor dropped");
            let sg = SegmentGrant::new(&key, s);
            prop_assert_eq!(SegmentGrant::decode(&sg.encode()).unwrap(), sg);
        }
    }

    #[test]
    fn expired_grant() {
        let g = Grant::sign(b"k", 1, 0, 4096, 2, rights::ALL, 100);
        assert_eq!(g.verify(b"k", 101), Err(GrantError::Expired));
        assert!(g.verify(b"k", 100).is_ok());
        assert_eq!(g.verify(b"other", 50), Err(GrantError::BadSignature));
    }
}
