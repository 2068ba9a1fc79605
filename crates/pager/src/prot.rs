//! A window page's protection when it is not the window's read-write, as one byte per page
//! (`Core::prot_of`). Read-write, the common case, is 0.

/// Set for every page whose protection differs from read-write.
pub const SET: u8 = 0x80;
/// The page is lent to a file or shared mapping the program made with `MAP_FIXED`: not the
/// window's until the program unmaps it.
pub const FOREIGN: u8 = 0x40;
/// Low bits: the `PROT_*` value.
pub const MASK: u8 = 7;
/// `PROT_READ | PROT_WRITE` as Linux numbers them (this crate makes no system call).
const READ_WRITE: i32 = 3;

/// The byte for protection `p` (0 for read-write).
pub fn encode(p: i32) -> u8 {
    if p == READ_WRITE {
        0
    } else {
        SET | (p as u8 & MASK)
    }
}

/// The `PROT_*` value of a byte (read-write for 0).
pub fn decode(b: u8) -> i32 {
    if b & SET == 0 {
        READ_WRITE
    } else {
        i32::from(b & MASK)
    }
}

/// True if a resident page with this byte may be evicted: any protection of the window's own
/// (the runtime moves it into a staging slot given the same protection), not a lent page.
pub fn evictable(b: u8) -> bool {
    b & FOREIGN == 0
}

/// True if the page is neither readable nor writable, or lent: it holds no committed memory.
pub fn uncommitted(b: u8) -> bool {
    b & FOREIGN != 0 || (b & SET != 0 && b & MASK == 0)
}
