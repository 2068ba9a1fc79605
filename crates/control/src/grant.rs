//! Grants the control plane issues on behalf of bricks, and their session keys.
//!
//! The control plane knows every brick's grant key (bricks send it when they register), so it
//! signs the same 73-byte [`Grant`] a standalone brick would, and derives the session key the
//! node must prove it holds when it attaches (see the contract in `docs/control-plane.md`).

use rackmem_proto::{rights, Grant};
// One derivation for bricks, control planes and nodes: the brick checks the proof against the
// key derived here.
pub use rackmem_proto::{session_key, SESSION_KEY_LABEL};

/// A signed grant for one segment and its session key, both hex, as the API returns them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// The encoded grant.
    pub grant_hex: String,
    /// Its session key.
    pub session_key_hex: String,
}

/// Signs a grant giving `node` every right on `[offset, offset + size_bytes)` of the brick
/// until `expiry_unix_s` (0: never), to be served at `rate_bps` at most (0: no rate; the brick
/// paces the segment by its total alone). The expiry bounds what a stolen grant is worth: a
/// brick refuses it at ATTACH once past; holders renew it while the segment is in use.
/// Revocation itself is the control plane dropping the segment from the brick's heartbeat
/// reply, which also carries each segment's current rate.
pub fn issue(
    brick_key: &[u8],
    segment_id: u64,
    offset: u64,
    size_bytes: u64,
    node: u64,
    expiry_unix_s: u64,
    rate_bps: u64,
) -> Issued {
    let g = Grant::sign_rated(
        brick_key,
        segment_id,
        offset,
        size_bytes,
        node,
        rights::ALL,
        expiry_unix_s,
        rate_bps,
    );
    Issued {
        grant_hex: hex::encode(g.encode()),
        session_key_hex: hex::encode(session_key(brick_key, &g)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_grant_verifies_and_session_key_follows_the_formula() {
        let key = b"0123456789abcdef0123456789abcdef";
        let i = issue(key, 7, 1 << 20, 4 << 20, 3, 0, 0);
        let g = Grant::decode(&hex::decode(&i.grant_hex).unwrap()).unwrap();
        g.verify(key, 1).unwrap();
        assert_eq!(
            (g.segment_id, g.brick_offset, g.size_bytes, g.node),
            (7, 1 << 20, 4 << 20, 3)
        );
        use hmac::{Hmac, Mac};
        let mut m = <Hmac<sha2::Sha256> as Mac>::new_from_slice(key).unwrap();
        m.update(b"rackmem-session-v1");
        m.update(&g.mac);
        let want: [u8; 32] = m.finalize().into_bytes().into();
        assert_eq!(i.session_key_hex, hex::encode(want));
        assert!(g.verify(b"another key", 1).is_err());
    }
}
