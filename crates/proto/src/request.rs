//! Requests: the [`Extent`] lists of batched READ and WRITE, [`Request`] with its frame encoding and
//! payload decoding, the zero-copy WRITE helpers, and whole request frames decoded from byte slices.

use crate::bytes::{array_at, exact, u32_at, u64_at};
use crate::{
    DecodeError, Grant, Header, Opcode, HEADER_LEN, KEY_LEN, MAX_EXTENTS, MAX_NAME, MAX_PAYLOAD, MAX_SECRET, PAGE_SIZE,
};

/// One run of pages: offset within the segment, length in bytes.
pub type Extent = (u64, u32);

/// A decoded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// ATTACH_PULL with a pull grant and the proof that this connection holds its pull key.
    AttachPull {
        /// The delegation.
        pull: crate::PullGrant,
        /// [`attach_proof`](crate::attach_proof) made with the pull key, for this connection's
        /// HELLO nonce and the grant's segment.
        proof: [u8; KEY_LEN],
    },
    /// PULL.
    Pull(crate::PullOrder),
    /// HELLO.
    Hello,
    /// ALLOC of `size_bytes` with the shared secret.
    Alloc {
        /// Requested size.
        size_bytes: u64,
        /// Shared secret.
        secret: Vec<u8>,
    },
    /// ATTACH with a grant and the proof that this connection holds its session key.
    Attach {
        /// The grant.
        grant: Grant,
        /// [`attach_proof`](crate::attach_proof) for this connection's HELLO nonce and the grant's segment.
        proof: [u8; KEY_LEN],
    },
    /// READ of extents.
    Read(Vec<Extent>),
    /// WRITE of extents; `data` holds their bytes in order.
    Write {
        /// Extents.
        extents: Vec<Extent>,
        /// Data.
        data: Vec<u8>,
    },
    /// DISCARD.
    Discard {
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
    },
    /// COPY within the segment.
    Copy {
        /// Source offset.
        src: u64,
        /// Destination offset.
        dst: u64,
        /// Length.
        len: u64,
    },
    /// CLONE.
    Clone,
    /// CLONE_LAZY.
    CloneLazy,
    /// UNSHARE of a range (length 0: only the count of live lazy clones).
    Unshare {
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
    },
    /// CLONE_INTO the segment of a grant, with the proof that this connection holds its
    /// session key.
    CloneInto {
        /// The new segment's grant.
        grant: Grant,
        /// [`attach_proof`](crate::attach_proof) for this connection's HELLO nonce and the grant's segment.
        proof: [u8; KEY_LEN],
    },
    /// DETACH.
    Detach,
    /// PING.
    Ping,
    /// STATS.
    Stats,
    /// SHARE.
    Share,
    /// POPULATE.
    Populate {
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
    },
    /// OPEN of the named segment (created of `size_bytes` if absent and `size_bytes > 0`).
    Open {
        /// Segment name (1 to [`MAX_NAME`] bytes).
        name: Vec<u8>,
        /// Size to create with; 0 opens an existing segment only.
        size_bytes: u64,
        /// Shared secret.
        secret: Vec<u8>,
    },
    /// PUT of `data` at byte `offset`.
    Put {
        /// Byte offset in the segment.
        offset: u64,
        /// Bytes to store.
        data: Vec<u8>,
    },
    /// GET of `len` bytes at byte `offset`.
    Get {
        /// Byte offset in the segment.
        offset: u64,
        /// Bytes to load (at most [`MAX_PAYLOAD`]).
        len: u32,
    },
    /// FETCH_ADD of `value` to the word at `offset`.
    FetchAdd {
        /// Byte offset of the word (a multiple of 8).
        offset: u64,
        /// Addend (wrapping).
        value: u64,
    },
    /// COMPARE_SWAP of the word at `offset`.
    CompareSwap {
        /// Byte offset of the word (a multiple of 8).
        offset: u64,
        /// Value the word must hold.
        expected: u64,
        /// Value it then takes.
        desired: u64,
    },
}

fn encode_extents(extents: &[Extent], out: &mut Vec<u8>) {
    out.extend_from_slice(&(extents.len() as u32).to_le_bytes());
    for &(o, l) in extents {
        out.extend_from_slice(&o.to_le_bytes());
        out.extend_from_slice(&l.to_le_bytes());
    }
}

/// Decodes a WRITE payload without copying its data: the extents, and the bytes that follow
/// them (exactly as many as the extents cover). A brick uses this to store pages straight from
/// its receive buffer.
pub fn decode_write(p: &[u8]) -> Result<(Vec<Extent>, &[u8]), DecodeError> {
    let (ext, used) = decode_extents(p)?;
    let want = extents_bytes(&ext) as usize;
    exact(&p[used..], want)?;
    Ok((ext, &p[used..]))
}

/// Decodes the extent list at the start of `b`; returns the extents and the bytes consumed.
fn decode_extents(b: &[u8]) -> Result<(Vec<Extent>, usize), DecodeError> {
    if b.len() < 4 {
        return Err(DecodeError::Truncated { need: 4, have: b.len() });
    }
    let n = u32_at(b, 0);
    if n == 0 {
        return Err(DecodeError::Invalid("empty extent list"));
    }
    if n > MAX_EXTENTS {
        return Err(DecodeError::TooManyExtents(n));
    }
    let need = 4 + n as usize * 12;
    if b.len() < need {
        return Err(DecodeError::Truncated { need, have: b.len() });
    }
    let mut v = Vec::with_capacity(n as usize);
    for i in 0..n as usize {
        let o = u64_at(b, 4 + i * 12);
        let l = u32_at(b, 12 + i * 12);
        if l == 0 || l % PAGE_SIZE != 0 || o % PAGE_SIZE as u64 != 0 || o.checked_add(l as u64).is_none() {
            return Err(DecodeError::Misaligned { offset: o, len: l });
        }
        v.push((o, l));
    }
    Ok((v, need))
}

/// Total bytes of an extent list (saturating).
pub fn extents_bytes(extents: &[Extent]) -> u64 {
    extents.iter().map(|e| e.1 as u64).sum()
}

impl Request {
    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::Hello => Opcode::Hello,
            Request::Alloc { .. } => Opcode::Alloc,
            Request::Attach { .. } => Opcode::Attach,
            Request::Read(_) => Opcode::Read,
            Request::Write { .. } => Opcode::Write,
            Request::Discard { .. } => Opcode::Discard,
            Request::Copy { .. } => Opcode::Copy,
            Request::Clone => Opcode::Clone,
            Request::CloneLazy => Opcode::CloneLazy,
            Request::Unshare { .. } => Opcode::Unshare,
            Request::CloneInto { .. } => Opcode::CloneInto,
            Request::Detach => Opcode::Detach,
            Request::Ping => Opcode::Ping,
            Request::Stats => Opcode::Stats,
            Request::Share => Opcode::Share,
            Request::Populate { .. } => Opcode::Populate,
            Request::Open { .. } => Opcode::Open,
            Request::Put { .. } => Opcode::Put,
            Request::Get { .. } => Opcode::Get,
            Request::FetchAdd { .. } => Opcode::FetchAdd,
            Request::CompareSwap { .. } => Opcode::CompareSwap,
            Request::AttachPull { .. } => Opcode::AttachPull,
            Request::Pull(_) => Opcode::Pull,
        }
    }

    /// Encodes a whole frame (header and payload) with `tag`.
    ///
    /// A WRITE's data is copied into the frame; [`encode_write_head`] avoids that copy.
    pub fn encode(&self, tag: u32) -> Vec<u8> {
        if let Request::Write { extents, data } = self {
            let mut frame = encode_write_head(tag, extents, data.len());
            frame.extend_from_slice(data);
            return frame;
        }
        if let Request::Put { offset, data } = self {
            let mut frame = encode_put_head(tag, *offset, data.len());
            frame.extend_from_slice(data);
            return frame;
        }
        let mut payload = Vec::new();
        let mut offset = 0;
        let mut length = 0;
        match self {
            Request::Hello
            | Request::Clone
            | Request::CloneLazy
            | Request::Detach
            | Request::Ping
            | Request::Stats
            | Request::Share => {}
            Request::Alloc { size_bytes, secret } => {
                offset = *size_bytes;
                payload.extend_from_slice(secret);
            }
            Request::Attach { grant, proof } | Request::CloneInto { grant, proof } => {
                payload = grant.encode();
                payload.extend_from_slice(proof);
            }
            Request::Read(ext) => encode_extents(ext, &mut payload),
            // Encoded above, without the intermediate payload.
            Request::Write { .. } => {}
            Request::Discard { offset: o, len }
            | Request::Populate { offset: o, len }
            | Request::Unshare { offset: o, len } => {
                offset = *o;
                payload.extend_from_slice(&len.to_le_bytes());
            }
            Request::Copy { src, dst, len } => {
                for v in [src, dst, len] {
                    payload.extend_from_slice(&v.to_le_bytes());
                }
            }
            Request::Open {
                name,
                size_bytes,
                secret,
            } => {
                offset = *size_bytes;
                length = name.len() as u32;
                payload.extend_from_slice(name);
                payload.extend_from_slice(secret);
            }
            // Encoded above, without the intermediate payload.
            Request::Put { .. } => {}
            Request::Get { offset: o, len } => {
                offset = *o;
                length = *len;
            }
            Request::FetchAdd { offset: o, value } => {
                offset = *o;
                payload.extend_from_slice(&value.to_le_bytes());
            }
            Request::CompareSwap {
                offset: o,
                expected,
                desired,
            } => {
                offset = *o;
                payload.extend_from_slice(&expected.to_le_bytes());
                payload.extend_from_slice(&desired.to_le_bytes());
            }
            Request::AttachPull { pull, proof } => {
                payload = pull.encode();
                payload.extend_from_slice(proof);
            }
            Request::Pull(order) => payload = order.encode(),
        }
        let h = Header {
            opcode: self.opcode(),
            flags: 0,
            tag,
            status: 0,
            offset,
            length,
            payload_len: payload.len() as u32,
        };
        let mut frame = Vec::with_capacity(HEADER_LEN + payload.len());
        frame.extend_from_slice(&h.encode());
        frame.extend_from_slice(&payload);
        frame
    }

    /// Decodes a request from its validated header and its payload.
    pub fn decode(h: &Header, p: &[u8]) -> Result<Request, DecodeError> {
        if p.len() != h.payload_len as usize {
            return Err(DecodeError::PayloadSize {
                want: h.payload_len as usize,
                have: p.len(),
            });
        }
        if h.is_response() {
            return Err(DecodeError::Invalid("response flag in a request"));
        }
        let empty = |r: Request| {
            exact(p, 0)?;
            Ok(r)
        };
        match h.opcode {
            Opcode::Hello => empty(Request::Hello),
            Opcode::Clone => empty(Request::Clone),
            Opcode::CloneLazy => empty(Request::CloneLazy),
            Opcode::Detach => empty(Request::Detach),
            Opcode::Ping => empty(Request::Ping),
            Opcode::Stats => empty(Request::Stats),
            Opcode::Share => empty(Request::Share),
            Opcode::Alloc => {
                if p.len() > MAX_SECRET {
                    return Err(DecodeError::Invalid("secret too long"));
                }
                Ok(Request::Alloc {
                    size_bytes: h.offset,
                    secret: p.to_vec(),
                })
            }
            Opcode::Attach | Opcode::CloneInto => {
                if p.len() == Grant::LEN || p.len() == Grant::RATED_LEN {
                    return Err(DecodeError::MissingProof);
                }
                let grant_len = if p.len() == Grant::RATED_LEN + KEY_LEN {
                    Grant::RATED_LEN
                } else {
                    exact(p, Grant::LEN + KEY_LEN)?;
                    Grant::LEN
                };
                let (grant, proof) = (Grant::decode(&p[..grant_len])?, array_at(p, grant_len));
                Ok(if h.opcode == Opcode::Attach {
                    Request::Attach { grant, proof }
                } else {
                    Request::CloneInto { grant, proof }
                })
            }
            Opcode::Read => {
                let (ext, used) = decode_extents(p)?;
                exact(&p[used..], 0)?;
                Ok(Request::Read(ext))
            }
            Opcode::Write => {
                let (extents, data) = decode_write(p)?;
                Ok(Request::Write {
                    extents,
                    data: data.to_vec(),
                })
            }
            Opcode::Discard => {
                exact(p, 8)?;
                Ok(Request::Discard {
                    offset: h.offset,
                    len: u64_at(p, 0),
                })
            }
            Opcode::Unshare => {
                exact(p, 8)?;
                Ok(Request::Unshare {
                    offset: h.offset,
                    len: u64_at(p, 0),
                })
            }
            Opcode::Populate => {
                exact(p, 8)?;
                Ok(Request::Populate {
                    offset: h.offset,
                    len: u64_at(p, 0),
                })
            }
            Opcode::Copy => {
                exact(p, 24)?;
                Ok(Request::Copy {
                    src: u64_at(p, 0),
                    dst: u64_at(p, 8),
                    len: u64_at(p, 16),
                })
            }
            Opcode::Open => {
                let name_len = h.length as usize;
                if name_len == 0 || name_len > MAX_NAME {
                    return Err(DecodeError::Invalid("segment name must be 1 to 255 bytes"));
                }
                if p.len() < name_len {
                    return Err(DecodeError::Truncated {
                        need: name_len,
                        have: p.len(),
                    });
                }
                if p.len() - name_len > MAX_SECRET {
                    return Err(DecodeError::Invalid("secret too long"));
                }
                Ok(Request::Open {
                    name: p[..name_len].to_vec(),
                    size_bytes: h.offset,
                    secret: p[name_len..].to_vec(),
                })
            }
            Opcode::Put => Ok(Request::Put {
                offset: h.offset,
                data: p.to_vec(),
            }),
            Opcode::Get => {
                exact(p, 0)?;
                if h.length > MAX_PAYLOAD {
                    return Err(DecodeError::TooLong(h.length));
                }
                Ok(Request::Get {
                    offset: h.offset,
                    len: h.length,
                })
            }
            Opcode::FetchAdd => {
                exact(p, 8)?;
                Ok(Request::FetchAdd {
                    offset: h.offset,
                    value: u64_at(p, 0),
                })
            }
            Opcode::CompareSwap => {
                exact(p, 16)?;
                Ok(Request::CompareSwap {
                    offset: h.offset,
                    expected: u64_at(p, 0),
                    desired: u64_at(p, 8),
                })
            }
            Opcode::AttachPull => {
                if p.len() < KEY_LEN {
                    return Err(DecodeError::MissingProof);
                }
                let (pull, proof) = p.split_at(p.len() - KEY_LEN);
                Ok(Request::AttachPull {
                    pull: crate::PullGrant::decode(pull)?,
                    proof: array_at(proof, 0),
                })
            }
            Opcode::Pull => Ok(Request::Pull(crate::PullOrder::decode(p)?)),
        }
    }
}

/// Encodes the header of a PUT frame of `data_len` bytes at byte `offset`, whose data the caller
/// sends right after (so the bytes are never copied into a frame buffer). `data_len` must be at
/// most [`MAX_PAYLOAD`].
pub fn encode_put_head(tag: u32, offset: u64, data_len: usize) -> Vec<u8> {
    Header {
        opcode: Opcode::Put,
        flags: 0,
        tag,
        status: 0,
        offset,
        length: 0,
        payload_len: data_len as u32,
    }
    .encode()
    .to_vec()
}

/// Encodes the header and extent list of a WRITE frame whose `data_len` bytes of data the caller
/// sends right after (so page data is never copied into a frame buffer). `data_len` must be the
/// extents' total and the extents must respect [`MAX_EXTENTS`] and [`MAX_PAYLOAD`](crate::MAX_PAYLOAD), or the
/// brick refuses the frame.
pub fn encode_write_head(tag: u32, extents: &[Extent], data_len: usize) -> Vec<u8> {
    let mut frame = Vec::with_capacity(HEADER_LEN + 4 + extents.len() * 12);
    frame.extend_from_slice(&[0u8; HEADER_LEN]);
    encode_extents(extents, &mut frame);
    let payload_len = (frame.len() - HEADER_LEN + data_len) as u32;
    let h = Header {
        opcode: Opcode::Write,
        flags: 0,
        tag,
        status: 0,
        offset: 0,
        length: 0,
        payload_len,
    };
    frame[..HEADER_LEN].copy_from_slice(&h.encode());
    frame
}

/// Decodes a whole frame from a byte slice (header, then exactly `payload_len` bytes): the entry
/// point for fuzzing and tests. Returns the header, the request and the bytes consumed.
pub fn decode_request_frame(b: &[u8]) -> Result<(Header, Request, usize), DecodeError> {
    let h = Header::decode(b)?;
    let end = HEADER_LEN + h.payload_len as usize;
    if b.len() < end {
        return Err(DecodeError::Truncated {
            need: end,
            have: b.len(),
        });
    }
    let r = Request::decode(&h, &b[HEADER_LEN..end])?;
    Ok((h, r, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grant::tests::grant;
    use crate::rights;
    use proptest::prelude::*;

    fn extents() -> impl Strategy<Value = Vec<Extent>> {
        proptest::collection::vec((0u64..1 << 40, 1u32..16), 1..20)
            .prop_map(|v| v.into_iter().map(|(o, l)| (o * 4096, l * 4096)).collect())
    }

    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            Just(Request::Hello),
            Just(Request::Clone),
            Just(Request::Detach),
            Just(Request::Ping),
            Just(Request::Stats),
            Just(Request::Share),
            (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..64))
                .prop_map(|(size_bytes, secret)| Request::Alloc { size_bytes, secret }),
            (grant(), any::<[u8; 32]>()).prop_map(|(grant, proof)| Request::Attach { grant, proof }),
            (grant(), any::<[u8; 32]>()).prop_map(|(grant, proof)| Request::CloneInto { grant, proof }),
            (grant(), any::<(u64, u64, u64)>(), any::<[u8; 32]>(), any::<[u8; 32]>()).prop_map(
                |(grant, (offset, len, expiry_unix_s), mac, proof)| Request::AttachPull {
                    pull: crate::PullGrant {
                        grant,
                        offset,
                        len,
                        expiry_unix_s,
                        mac,
                    },
                    proof
                }
            ),
            extents().prop_map(Request::Read),
            (extents(), any::<u8>()).prop_map(|(extents, fill)| {
                let n = extents_bytes(&extents) as usize;
                Request::Write {
                    extents,
                    data: vec![fill; n],
                }
            }),
            (any::<u64>(), any::<u64>()).prop_map(|(offset, len)| Request::Discard { offset, len }),
            (any::<u64>(), any::<u64>()).prop_map(|(offset, len)| Request::Populate { offset, len }),
            (any::<u64>(), any::<u64>()).prop_map(|(offset, len)| Request::Unshare { offset, len }),
            Just(Request::CloneLazy),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(src, dst, len)| Request::Copy { src, dst, len }),
            (
                proptest::collection::vec(any::<u8>(), 1..=MAX_NAME),
                any::<u64>(),
                proptest::collection::vec(any::<u8>(), 0..64)
            )
                .prop_map(|(name, size_bytes, secret)| Request::Open {
                    name,
                    size_bytes,
                    secret
                }),
            (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..300))
                .prop_map(|(offset, data)| Request::Put { offset, data }),
            (any::<u64>(), 0..=MAX_PAYLOAD).prop_map(|(offset, len)| Request::Get { offset, len }),
            (any::<u64>(), any::<u64>()).prop_map(|(offset, value)| Request::FetchAdd { offset, value }),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(offset, expected, desired)| Request::CompareSwap {
                offset,
                expected,
                desired
            }),
        ]
    }

    proptest! {
        #[test]
        fn request_round_trip(r in request(), tag in any::<u32>()) {
            let frame = r.encode(tag);
            let (h, back, used) = decode_request_frame(&frame).unwrap();
            prop_assert_eq!(used, frame.len());
            prop_assert_eq!(h.tag, tag);
            prop_assert_eq!(back, r);
            // A receiver enforcing the per-opcode bound accepts every well-formed request.
            prop_assert!(h.payload_len <= h.opcode.max_request_payload());
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_request_frame(&bytes);
        }

        #[test]
        fn decode_never_panics_with_valid_header(op in 0u8..24, payload in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut b = Header { opcode: Opcode::Ping, flags: 0, tag: 1, status: 0, offset: 4096, length: 0, payload_len: payload.len() as u32 }.encode().to_vec();
            b[5] = op;
            b.extend_from_slice(&payload);
            let _ = decode_request_frame(&b);
        }

        #[test]
        fn write_head_plus_data_is_a_write_frame(ext in extents(), tag in any::<u32>()) {
            let n = extents_bytes(&ext) as usize;
            let data: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
            let mut frame = encode_write_head(tag, &ext, n);
            frame.extend_from_slice(&data);
            let (_, back, _) = decode_request_frame(&frame).unwrap();
            prop_assert_eq!(back, Request::Write { extents: ext, data });
        }

        #[test]
        fn truncated_frames_are_errors(r in request(), cut in any::<prop::sample::Index>()) {
            let frame = r.encode(9);
            let cut = cut.index(frame.len());
            prop_assert!(decode_request_frame(&frame[..cut]).is_err());
        }
    }

    #[test]
    fn one_sided_requests_are_validated() {
        let get = |len: u32| Header {
            opcode: Opcode::Get,
            flags: 0,
            tag: 1,
            status: 0,
            offset: 3,
            length: len,
            payload_len: 0,
        };
        assert_eq!(
            Request::decode(&get(MAX_PAYLOAD + 1), &[]),
            Err(DecodeError::TooLong(MAX_PAYLOAD + 1))
        );
        assert_eq!(Request::decode(&get(5), &[]), Ok(Request::Get { offset: 3, len: 5 }));
        let open = |name_len: u32, payload: &[u8]| {
            let h = Header {
                opcode: Opcode::Open,
                payload_len: payload.len() as u32,
                length: name_len,
                ..get(0)
            };
            Request::decode(&h, payload)
        };
        assert!(matches!(open(0, b"secret"), Err(DecodeError::Invalid(_))));
        assert!(matches!(open(300, &[1u8; 300]), Err(DecodeError::Invalid(_))));
        assert!(matches!(open(9, b"short"), Err(DecodeError::Truncated { .. })));
        assert_eq!(
            open(4, b"nameSECRET"),
            Ok(Request::Open {
                name: b"name".to_vec(),
                size_bytes: 3,
                secret: b"SECRET".to_vec()
            })
        );
        let fa = Header {
            opcode: Opcode::FetchAdd,
            payload_len: 7,
            ..get(0)
        };
        assert!(matches!(
            Request::decode(&fa, &[0u8; 7]),
            Err(DecodeError::PayloadSize { want: 8, have: 7 })
        ));
    }

    #[test]
    fn write_data_must_match_extents() {
        let mut frame = encode_write_head(1, &[(0, 4096)], 4095);
        frame.extend_from_slice(&[0u8; 4095]);
        assert!(matches!(
            decode_request_frame(&frame),
            Err(DecodeError::PayloadSize { want: 4096, have: 4095 })
        ));
    }

    #[test]
    fn extents_are_validated() {
        let mut p = Vec::new();
        encode_extents(&[(100, 4096)], &mut p);
        let h = Header {
            opcode: Opcode::Read,
            flags: 0,
            tag: 1,
            status: 0,
            offset: 0,
            length: 0,
            payload_len: p.len() as u32,
        };
        assert!(matches!(Request::decode(&h, &p), Err(DecodeError::Misaligned { .. })));
        let mut p = Vec::new();
        p.extend_from_slice(&(MAX_EXTENTS + 1).to_le_bytes());
        let h = Header {
            payload_len: p.len() as u32,
            ..h
        };
        assert_eq!(
            Request::decode(&h, &p),
            Err(DecodeError::TooManyExtents(MAX_EXTENTS + 1))
        );
    }

    #[test]
    fn attach_without_proof_is_a_clear_error() {
        let g = Grant::sign(b"k", 1, 0, 4096, 2, rights::ALL, 0);
        let p = g.encode();
        let h = Header {
            opcode: Opcode::Attach,
            flags: 0,
            tag: 1,
            status: 0,
            offset: 0,
            length: 0,
            payload_len: p.len() as u32,
        };
        let e = Request::decode(&h, &p).unwrap_err();
        assert_eq!(e, DecodeError::MissingProof);
        assert!(e.to_string().contains("upgrade"), "{e}");
        let h = Header {
            payload_len: p.len() as u32 - 1,
            ..h
        };
        assert!(matches!(
            Request::decode(&h, &p[1..]),
            Err(DecodeError::PayloadSize { want: 105, have: 72 })
        ));
    }
}
