//! Response frames: a header with [`FLAG_RESPONSE`] and a status, then a payload whose meaning
//! depends on the request.

use crate::{DecodeError, Header, Opcode, Status, FLAG_RESPONSE, HEADER_LEN};

/// Encodes a response frame.
pub fn encode_response(opcode: Opcode, tag: u32, status: Status, payload: &[u8]) -> Vec<u8> {
    let h = Header {
        opcode,
        flags: FLAG_RESPONSE,
        tag,
        status: status as u32,
        offset: 0,
        length: 0,
        payload_len: payload.len() as u32,
    };
    let mut v = Vec::with_capacity(HEADER_LEN + payload.len());
    v.extend_from_slice(&h.encode());
    v.extend_from_slice(payload);
    v
}

/// Decodes a whole response frame from a byte slice: returns the header, the payload and the
/// bytes consumed. The payload's meaning depends on the request (see `docs/protocol.md`).
pub fn decode_response_frame(b: &[u8]) -> Result<(Header, &[u8], usize), DecodeError> {
    let h = Header::decode(b)?;
    if !h.is_response() {
        return Err(DecodeError::Invalid("request where a response was expected"));
    }
    let end = HEADER_LEN + h.payload_len as usize;
    if b.len() < end {
        return Err(DecodeError::Truncated {
            need: end,
            have: b.len(),
        });
    }
    Ok((h, &b[HEADER_LEN..end], end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode_request_frame;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn response_round_trip(op in 1u8..19, code in 0u32..19, tag in any::<u32>(), payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let op = Opcode::from_u8(op).unwrap();
            let status = Status::from_u32(code);
            prop_assert_eq!(status.code(), code);
            let frame = encode_response(op, tag, status, &payload);
            let (h, p, used) = decode_response_frame(&frame).unwrap();
            prop_assert_eq!(used, frame.len());
            prop_assert_eq!((h.opcode, h.tag, Status::from_u32(h.status)), (op, tag, status));
            prop_assert_eq!(p, &payload[..]);
            // A response is never taken for a request, nor the other way round.
            prop_assert!(decode_request_frame(&frame).is_err());
        }
    }
}
