//! The lazily backed, copy-on-write chunked pool and its segment allocator.

use rackmem_proto::PAGE_SIZE;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

/// Allocation granule of the pool and of segments: 1 MiB.
pub const CHUNK: u64 = 1 << 20;

type Chunk = Option<Arc<Vec<u8>>>;

/// The pool's bytes.
pub(crate) struct Pool {
    chunks: Vec<RwLock<Chunk>>,
}

fn lock_r<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}
fn lock_w<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    pub fn new(size: u64) -> Pool {
        let n = size.div_ceil(CHUNK) as usize;
        Pool {
            chunks: (0..n).map(|_| RwLock::new(None)).collect(),
        }
    }

    /// Calls `f(chunk index, offset in chunk, range in the caller's buffer)` for each chunk piece.
    fn pieces(off: u64, len: usize, mut f: impl FnMut(usize, usize, std::ops::Range<usize>)) {
        let mut done = 0usize;
        while done < len {
            let at = off + done as u64;
            let ci = (at / CHUNK) as usize;
            let co = (at % CHUNK) as usize;
            let n = (CHUNK as usize - co).min(len - done);
            f(ci, co, done..done + n);
            done += n;
        }
    }

    /// Copies `out.len()` bytes at pool offset `off` (bounds checked by the caller).
    pub fn read(&self, off: u64, out: &mut [u8]) {
        Self::pieces(off, out.len(), |ci, co, r| {
            let g = lock_r(&self.chunks[ci]);
            match &*g {
                Some(c) => out[r.clone()].copy_from_slice(&c[co..co + r.len()]),
                None => out[r].fill(0),
            }
        });
    }

    /// Stores `data` at pool offset `off` (bounds checked by the caller).
    pub fn write(&self, off: u64, data: &[u8]) {
        Self::pieces(off, data.len(), |ci, co, r| {
            let mut g = lock_w(&self.chunks[ci]);
            let c = g.get_or_insert_with(|| Arc::new(vec![0u8; CHUNK as usize]));
            Arc::make_mut(c)[co..co + r.len()].copy_from_slice(&data[r]);
        });
    }

    /// Zeroes `[off, off+len)`, dropping whole chunks.
    pub fn discard(&self, off: u64, len: u64) {
        let mut at = off;
        let end = off + len;
        while at < end {
            let ci = (at / CHUNK) as usize;
            let co = at % CHUNK;
            let n = (CHUNK - co).min(end - at);
            let mut g = lock_w(&self.chunks[ci]);
            if n == CHUNK {
                *g = None;
            } else if let Some(c) = g.as_mut() {
                Arc::make_mut(c)[co as usize..(co + n) as usize].fill(0);
            }
            at += n;
        }
    }

    /// Makes chunks `[dst, dst+len)` share the chunks of `[src, src+len)` (chunk aligned).
    pub fn share(&self, src: u64, dst: u64, len: u64) {
        for i in 0..(len / CHUNK) as usize {
            let s = lock_r(&self.chunks[(src / CHUNK) as usize + i]).clone();
            *lock_w(&self.chunks[(dst / CHUNK) as usize + i]) = s;
        }
    }

    /// Bytes of chunks allocated (shared chunks counted once per holder).
    pub fn resident_bytes(&self) -> u64 {
        self.chunks.iter().filter(|c| lock_r(c).is_some()).count() as u64 * CHUNK
    }
}

/// A live segment.
#[derive(Debug, Clone)]
pub(crate) struct Segment {
    pub offset: u64,
    pub size: u64,
    pub attached: u32,
    /// Freed if still unattached at this time (CLONE results waiting for their child).
    pub unattached_deadline: Option<Instant>,
}

/// Free extents and live segments.
#[derive(Default)]
pub(crate) struct Segments {
    pub free: BTreeMap<u64, u64>,
    pub live: HashMap<u64, Segment>,
    pub next_id: u64,
}

impl Segments {
    pub fn new(size: u64) -> Segments {
        let mut free = BTreeMap::new();
        let usable = size / CHUNK * CHUNK;
        if usable > 0 {
            free.insert(0, usable);
        }
        Segments {
            free,
            live: HashMap::new(),
            next_id: 1,
        }
    }

    pub fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }

    /// First fit; returns (id, offset).
    pub fn carve(&mut self, size: u64, deadline: Option<Instant>) -> Option<(u64, u64)> {
        let size = size.div_ceil(CHUNK).max(1) * CHUNK;
        let (&start, &len) = self.free.iter().find(|(_, &l)| l >= size)?;
        self.free.remove(&start);
        if len > size {
            self.free.insert(start + size, len - size);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.live.insert(
            id,
            Segment {
                offset: start,
                size,
                attached: 0,
                unattached_deadline: deadline,
            },
        );
        Some((id, start))
    }

    /// Returns a segment's range to the free list, coalescing.
    pub fn release(&mut self, id: u64) -> Option<Segment> {
        let seg = self.live.remove(&id)?;
        let (mut start, mut len) = (seg.offset, seg.size);
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            if ps + pl == start {
                self.free.remove(&ps);
                start = ps;
                len += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += nl;
        }
        self.free.insert(start, len);
        Some(seg)
    }
}

/// Pool plus segments, shared by all connections.
pub(crate) struct Store {
    pub pool: Pool,
    pub segments: Mutex<Segments>,
}

impl Store {
    pub fn new(size: u64) -> Store {
        Store {
            pool: Pool::new(size),
            segments: Mutex::new(Segments::new(size)),
        }
    }

    pub fn segs(&self) -> std::sync::MutexGuard<'_, Segments> {
        self.segments.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Frees a segment (zeroing its memory so a later tenant never sees it).
    pub fn free_segment(&self, id: u64) {
        let seg = self.segs().release(id);
        if let Some(s) = seg {
            self.pool.discard(s.offset, s.size);
        }
    }
}

/// Page-aligned extent check against a segment of `size` bytes.
pub(crate) fn in_segment(size: u64, off: u64, len: u64) -> bool {
    off % PAGE_SIZE as u64 == 0 && off.checked_add(len).is_some_and(|e| e <= size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lazily_backed_and_cow() {
        let p = Pool::new(8 * CHUNK);
        let mut b = vec![1u8; 4096];
        p.read(0, &mut b);
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(p.resident_bytes(), 0);
        p.write(CHUNK - 2048, &[7u8; 4096]);
        assert_eq!(p.resident_bytes(), 2 * CHUNK);
        p.share(0, 4 * CHUNK, 2 * CHUNK);
        p.write(4 * CHUNK + CHUNK - 2048, &[9u8; 16]);
        let mut a = vec![0u8; 16];
        p.read(CHUNK - 2048, &mut a);
        assert_eq!(a, vec![7u8; 16], "the original must not see the clone's write");
        p.read(4 * CHUNK + CHUNK - 2048, &mut a);
        assert_eq!(a, vec![9u8; 16]);
        p.discard(0, 2 * CHUNK);
        p.read(CHUNK - 2048, &mut a);
        assert_eq!(a, vec![0u8; 16]);
    }

    #[test]
    fn carve_and_coalesce() {
        let mut s = Segments::new(10 * CHUNK);
        let (a, ao) = s.carve(3 * CHUNK, None).unwrap();
        let (b, bo) = s.carve(CHUNK + 1, None).unwrap();
        assert_eq!((ao, bo), (0, 3 * CHUNK));
        assert!(s.carve(6 * CHUNK, None).is_none());
        s.release(a);
        s.release(b);
        assert_eq!(s.free.len(), 1);
        assert_eq!(s.free_bytes(), 10 * CHUNK);
    }
}
