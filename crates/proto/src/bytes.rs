//! Little-endian field readers and the exact-length check that the decoders share. Callers
//! check lengths first: the readers index the slice directly.

use crate::DecodeError;

pub(crate) fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
pub(crate) fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
pub(crate) fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(array_at(b, o))
}
pub(crate) fn array_at<const N: usize>(b: &[u8], o: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[o..o + N]);
    a
}

pub(crate) fn exact(b: &[u8], want: usize) -> Result<(), DecodeError> {
    if b.len() == want {
        Ok(())
    } else {
        Err(DecodeError::PayloadSize { want, have: b.len() })
    }
}
