//! Direct brick-to-brick migration: the [`PullGrant`] a node issues so that one brick may read
//! one range of a segment on another, and the [`PullOrder`] that tells the target brick what to
//! pull.
//!
//! Whoever holds a segment's session key (the node it was granted to, or the control plane that
//! signed the grant) can *delegate* a read of part of it: a pull grant names the segment's
//! grant, a byte range of it and an expiry, and is signed with the session key. The source brick
//! derives the session key from the grant (it holds the brick key), so it can check the
//! delegation without having seen it before; the puller proves it holds the pull key (derived
//! from the session key and the pull grant's MAC) against its own connection's HELLO nonce, as
//! any ATTACH does. What it gets is narrower than the grant in every way: reads only, of that
//! range only, until the expiry, which a pull grant must have. The session key itself never
//! leaves the node.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::bytes::{array_at, u32_at, u64_at};
use crate::{DecodeError, Grant, GrantError, SegmentGrant, KEY_LEN, MAX_NAME, PAGE_SIZE};

/// Most pieces one [`PullOrder`] names.
pub const MAX_PULL_PIECES: usize = 2048;
/// Most bytes one [`PullOrder`] moves: bounds how long its answer takes (a node sends several).
pub const MAX_PULL_BYTES: u64 = 16 << 20;
/// Longest a pull grant may live: a migration pulls within seconds, and a leaked grant should
/// not outlive it by much.
pub const MAX_PULL_LIFETIME_S: u64 = 600;

/// Why a pull grant is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PullError {
    /// The segment's grant does not verify (or expired).
    #[error("the segment's grant: {0}")]
    Grant(GrantError),
    /// The delegation is not signed with the grant's session key, or was altered.
    #[error("pull grant signature does not verify (forged, altered, or not issued by the segment's holder)")]
    BadSignature,
    /// The delegation expired, or has no expiry, or one too far away.
    #[error("pull grant expired, or has no expiry within {MAX_PULL_LIFETIME_S} s")]
    Expired,
    /// The range is empty, not page-aligned, or outside the segment.
    #[error("pull grant range is empty, not page-aligned or outside its segment")]
    Range,
}

/// A delegated, read-only credential for one byte range of one segment (see the module
/// documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullGrant {
    /// The segment's grant (as its brick signed it).
    pub grant: Grant,
    /// First byte of the range, within the segment.
    pub offset: u64,
    /// Bytes in the range.
    pub len: u64,
    /// Seconds since the Unix epoch after which it is void (never 0).
    pub expiry_unix_s: u64,
    /// `HMAC-SHA256(session_key, "rackmem-pull-v1" || grant.mac || offset || len || expiry)`.
    pub mac: [u8; 32],
}

fn hmac(key: &[u8]) -> Hmac<Sha256> {
    // HMAC accepts keys of any length; new_from_slice cannot fail for HMAC.
    <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC takes any key length"))
}

impl PullGrant {
    /// Fixed part of the encoding, before the grant.
    const HEAD: usize = 8 * 3 + 32;
    /// Longest encoding (with a rated grant).
    pub const MAX_LEN: usize = Self::HEAD + Grant::RATED_LEN;

    fn compute_mac(session_key: &[u8; KEY_LEN], grant: &Grant, offset: u64, len: u64, expiry: u64) -> Hmac<Sha256> {
        let mut m = hmac(session_key);
        m.update(b"rackmem-pull-v1");
        m.update(&grant.mac);
        m.update(&offset.to_le_bytes());
        m.update(&len.to_le_bytes());
        m.update(&expiry.to_le_bytes());
        m
    }

    /// Issues a pull grant for `[offset, offset + len)` of `sg`'s segment, void after
    /// `expiry_unix_s`, and returns it with its pull key (which the puller proves it holds).
    pub fn issue(sg: &SegmentGrant, offset: u64, len: u64, expiry_unix_s: u64) -> (PullGrant, [u8; KEY_LEN]) {
        let mac: [u8; 32] = Self::compute_mac(&sg.session_key, &sg.grant, offset, len, expiry_unix_s)
            .finalize()
            .into_bytes()
            .into();
        let p = PullGrant {
            grant: sg.grant.clone(),
            offset,
            len,
            expiry_unix_s,
            mac,
        };
        let key = pull_key(&sg.session_key, &p.mac);
        (p, key)
    }

    /// The source brick's check: the segment's grant under `brick_key`, the delegation under
    /// the session key derived from it, the expiry (required, and at most
    /// [`MAX_PULL_LIFETIME_S`] away) and the range. Returns the pull key, against which the
    /// puller's proof is checked.
    pub fn verify(&self, brick_key: &[u8], now_unix_s: u64) -> Result<[u8; KEY_LEN], PullError> {
        self.grant.verify(brick_key, now_unix_s).map_err(PullError::Grant)?;
        let session = crate::session_key(brick_key, &self.grant);
        Self::compute_mac(&session, &self.grant, self.offset, self.len, self.expiry_unix_s)
            .verify_slice(&self.mac)
            .map_err(|_| PullError::BadSignature)?;
        if self.expiry_unix_s == 0
            || now_unix_s > self.expiry_unix_s
            || self.expiry_unix_s > now_unix_s.saturating_add(MAX_PULL_LIFETIME_S)
        {
            return Err(PullError::Expired);
        }
        let page = PAGE_SIZE as u64;
        let in_segment = self
            .offset
            .checked_add(self.len)
            .is_some_and(|end| end <= self.grant.size_bytes);
        if self.len == 0 || self.offset % page != 0 || self.len % page != 0 || !in_segment {
            return Err(PullError::Range);
        }
        Ok(pull_key(&session, &self.mac))
    }

    /// Encodes as `offset || len || expiry || mac || grant`.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::MAX_LEN);
        v.extend_from_slice(&self.offset.to_le_bytes());
        v.extend_from_slice(&self.len.to_le_bytes());
        v.extend_from_slice(&self.expiry_unix_s.to_le_bytes());
        v.extend_from_slice(&self.mac);
        v.extend_from_slice(&self.grant.encode());
        v
    }

    /// Decodes [`PullGrant::encode`]'s form (either grant length, nothing after it).
    pub fn decode(b: &[u8]) -> Result<PullGrant, DecodeError> {
        if b.len() < Self::HEAD {
            return Err(DecodeError::Truncated {
                need: Self::HEAD,
                have: b.len(),
            });
        }
        Ok(PullGrant {
            offset: u64_at(b, 0),
            len: u64_at(b, 8),
            expiry_unix_s: u64_at(b, 16),
            mac: array_at(b, 24),
            grant: Grant::decode(&b[Self::HEAD..])?,
        })
    }
}

/// The key a puller proves it holds: `HMAC-SHA256(session_key, "rackmem-pull-key-v1" ||
/// pull_grant.mac)`. Its proof is [`attach_proof`](crate::attach_proof) made with this key.
pub fn pull_key(session_key: &[u8; KEY_LEN], pull_mac: &[u8; 32]) -> [u8; KEY_LEN] {
    let mut m = hmac(session_key);
    m.update(b"rackmem-pull-key-v1");
    m.update(pull_mac);
    m.finalize().into_bytes().into()
}

/// One run of a [`PullOrder`]: `len` bytes from `src` in the source segment to `dst` in the
/// target brick's attached segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullPiece {
    /// Offset in the target segment.
    pub dst: u64,
    /// Offset in the source segment (inside the pull grant's range).
    pub src: u64,
    /// Bytes (a multiple of the page size).
    pub len: u64,
}

/// PULL: sent to the target brick on a connection attached (with write rights) to the target
/// segment; the brick connects to `source`, attaches with the pull grant, and copies the pieces.
#[derive(Clone, PartialEq, Eq)]
pub struct PullOrder {
    /// The source brick's address, as the node reaches it.
    pub source: String,
    /// The credential for the source's range.
    pub pull: PullGrant,
    /// Its pull key.
    pub key: [u8; KEY_LEN],
    /// What to copy, in order.
    pub pieces: Vec<PullPiece>,
}

// Hand-written so the pull key never lands in a log.
impl std::fmt::Debug for PullOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullOrder")
            .field("source", &self.source)
            .field("pull", &self.pull)
            .field("key", &"<secret>")
            .field("pieces", &self.pieces)
            .finish()
    }
}

impl PullOrder {
    /// Longest payload: address, key, count, pieces, pull grant.
    pub const MAX_LEN: usize = 1 + MAX_NAME + KEY_LEN + 4 + MAX_PULL_PIECES * 24 + PullGrant::MAX_LEN;

    /// Bytes the order moves.
    pub fn bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.len).sum()
    }

    /// Encodes as `addr_len u8 || addr || key || count u32 || (dst, src, len)* || pull grant`.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(64 + self.pieces.len() * 24 + PullGrant::MAX_LEN);
        let addr = self.source.as_bytes();
        let n = addr.len().min(MAX_NAME);
        v.push(n as u8);
        v.extend_from_slice(&addr[..n]);
        v.extend_from_slice(&self.key);
        v.extend_from_slice(&(self.pieces.len() as u32).to_le_bytes());
        for p in &self.pieces {
            for x in [p.dst, p.src, p.len] {
                v.extend_from_slice(&x.to_le_bytes());
            }
        }
        v.extend_from_slice(&self.pull.encode());
        v
    }

    /// Decodes, checking the counts and the sizes (not the credential: the source brick does).
    pub fn decode(b: &[u8]) -> Result<PullOrder, DecodeError> {
        let need = |n: usize| {
            if b.len() < n {
                Err(DecodeError::Truncated { need: n, have: b.len() })
            } else {
                Ok(())
            }
        };
        need(1)?;
        let alen = b[0] as usize;
        need(1 + alen + KEY_LEN + 4)?;
        let source = std::str::from_utf8(&b[1..1 + alen])
            .map_err(|_| DecodeError::Invalid("source address is not UTF-8"))?
            .to_string();
        let key = array_at(b, 1 + alen);
        let count = u32_at(b, 1 + alen + KEY_LEN) as usize;
        if count == 0 || count > MAX_PULL_PIECES {
            return Err(DecodeError::Invalid("a pull names 1 to 2048 pieces"));
        }
        let at = 1 + alen + KEY_LEN + 4;
        need(at + count * 24)?;
        let page = PAGE_SIZE as u64;
        let mut pieces = Vec::with_capacity(count);
        let mut total = 0u64;
        for i in 0..count {
            let o = at + i * 24;
            let p = PullPiece {
                dst: u64_at(b, o),
                src: u64_at(b, o + 8),
                len: u64_at(b, o + 16),
            };
            if p.len == 0 || p.len % page != 0 || p.dst % page != 0 || p.src % page != 0 {
                return Err(DecodeError::Invalid("pull pieces are whole pages"));
            }
            total = total.saturating_add(p.len);
            pieces.push(p);
        }
        if total > MAX_PULL_BYTES {
            return Err(DecodeError::Invalid("a pull moves at most 16 MiB"));
        }
        Ok(PullOrder {
            source,
            key,
            pieces,
            pull: PullGrant::decode(&b[at + count * 24..])?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rights;

    fn segment(key: &[u8]) -> SegmentGrant {
        SegmentGrant::new(key, Grant::sign(key, 9, 1 << 20, 8 << 20, 3, rights::ALL, 0))
    }

    #[test]
    fn a_pull_grant_verifies_only_as_issued() {
        let sg = segment(b"brick-a");
        let (p, key) = PullGrant::issue(&sg, 4096, 1 << 20, 1000);
        assert_eq!(p.verify(b"brick-a", 900), Ok(key));
        assert_eq!(PullGrant::decode(&p.encode()).unwrap(), p);
        // Another brick's key: the grant itself does not verify.
        assert!(matches!(p.verify(b"brick-b", 900), Err(PullError::Grant(_))));
        // A wider range, another offset, a later expiry: the delegation does not verify.
        for f in [
            |q: &mut PullGrant| q.len += 4096,
            |q: &mut PullGrant| q.offset = 0,
            |q: &mut PullGrant| q.expiry_unix_s += 1,
        ] {
            let mut q = p.clone();
            f(&mut q);
            assert_eq!(q.verify(b"brick-a", 900), Err(PullError::BadSignature));
        }
        // Signed with a key that is not the session key (the holder of the grant alone).
        let forged = SegmentGrant {
            grant: sg.grant.clone(),
            session_key: [7; KEY_LEN],
        };
        let (f, _) = PullGrant::issue(&forged, 4096, 1 << 20, 1000);
        assert_eq!(f.verify(b"brick-a", 900), Err(PullError::BadSignature));
        assert_eq!(p.verify(b"brick-a", 1001), Err(PullError::Expired));
        let (never, _) = PullGrant::issue(&sg, 0, 4096, 0);
        assert_eq!(never.verify(b"brick-a", 900), Err(PullError::Expired));
        let (far, _) = PullGrant::issue(&sg, 0, 4096, 900 + MAX_PULL_LIFETIME_S + 1);
        assert_eq!(far.verify(b"brick-a", 900), Err(PullError::Expired));
        let (outside, _) = PullGrant::issue(&sg, 4 << 20, 8 << 20, 1000);
        assert_eq!(outside.verify(b"brick-a", 900), Err(PullError::Range));
    }

    #[test]
    fn a_pull_order_round_trips_and_is_bounded() {
        let sg = segment(b"k");
        let (pull, key) = PullGrant::issue(&sg, 0, 8 << 20, 1000);
        let o = PullOrder {
            source: "tcp://127.0.0.1:7000".into(),
            pull,
            key,
            pieces: vec![PullPiece {
                dst: 0,
                src: 4096,
                len: 8192,
            }],
        };
        let b = o.encode();
        assert!(b.len() <= PullOrder::MAX_LEN);
        assert_eq!(PullOrder::decode(&b).unwrap(), o);
        assert!(!format!("{o:?}").contains(&format!("{key:?}")));
        for cut in 0..b.len() {
            assert!(PullOrder::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut big = o.clone();
        big.pieces = vec![
            PullPiece {
                dst: 0,
                src: 0,
                len: MAX_PULL_BYTES,
            },
            PullPiece {
                dst: 0,
                src: 0,
                len: 4096,
            },
        ];
        assert!(PullOrder::decode(&big.encode()).is_err());
    }
}
