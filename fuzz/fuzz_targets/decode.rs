//! Feeds arbitrary bytes to every decoder a brick or a link runs on untrusted input. Decoding
//! must never panic, and whatever decodes must encode back to the same frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rackmem_proto::{
    decode_request_frame, decode_response_frame, BrickInfo, BrickStats, Grant, Header, SegmentGrant, HEADER_LEN,
};

fuzz_target!(|data: &[u8]| {
    if let Ok((h, req, used)) = decode_request_frame(data) {
        assert_eq!(used, HEADER_LEN + h.payload_len as usize);
        let again = req.encode(h.tag);
        let (_, back, _) = decode_request_frame(&again).expect("a re-encoded request decodes");
        assert_eq!(back, req);
    }
    if let Ok((_, payload, _)) = decode_response_frame(data) {
        let _ = BrickInfo::decode(payload);
        let _ = BrickStats::decode(payload);
        let _ = Grant::decode(payload);
        let _ = SegmentGrant::decode(payload);
    }
    // The streaming path: header first, then the payload it announces.
    if let Ok(h) = Header::decode(data) {
        assert!(h.payload_len <= rackmem_proto::MAX_PAYLOAD);
    }
});
