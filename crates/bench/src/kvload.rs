//! A small load generator for memcached's text protocol over a Unix socket: it stores a key
//! space, then issues random GETs from several connections, one request in flight on each, and
//! checks every answer.
//!
//! Keys (`key:%012d`) and values (derived from the key) are deterministic, and each connection
//! draws its keys from its own seeded generator, so the answers, hashed per connection in order
//! and combined in connection order, are the same in every run that returns every value: the
//! digest is the application's result, compared with the native run's.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Instant;

/// What to send.
#[derive(Debug, Clone)]
pub struct Load {
    /// Keys stored before the GETs.
    pub keys: u64,
    /// Bytes per value.
    pub value_bytes: usize,
    /// GETs in all (spread over the connections).
    pub gets: u64,
    /// Connections, each a thread with one request in flight.
    pub connections: u64,
}

/// What the GETs measured.
#[derive(Debug, Clone)]
pub struct Measured {
    /// GETs per second, all connections together.
    pub gets_per_s: f64,
    /// 99th percentile of one GET's round trip, µs.
    pub p99_us: f64,
    /// Hash of every answer.
    pub digest: String,
}

/// The value stored under key `i`.
pub fn value(i: u64, bytes: usize) -> Vec<u8> {
    let mut v = format!("{i:x}-").into_bytes();
    v.resize(bytes, b'a' + (i % 26) as u8);
    v
}

fn key(i: u64) -> String {
    format!("key:{i:012}")
}

fn io(e: std::io::Error) -> String {
    e.to_string()
}

/// Stores every key (pipelined), then runs the GETs.
pub fn run(sock: &Path, load: &Load) -> Result<Measured, String> {
    let mut s = UnixStream::connect(sock).map_err(|e| format!("connecting to {}: {e}", sock.display()))?;
    // Pipelined SETs with noreply, then one GET as a barrier: the server answers it after every
    // SET before it on this connection.
    let mut w = std::io::BufWriter::with_capacity(1 << 20, s.try_clone().map_err(io)?);
    for i in 0..load.keys {
        let v = value(i, load.value_bytes);
        write!(w, "set {} 0 0 {} noreply\r\n", key(i), v.len()).map_err(io)?;
        w.write_all(&v).map_err(io)?;
        w.write_all(b"\r\n").map_err(io)?;
    }
    w.flush().map_err(io)?;
    drop(w);
    let mut r = BufReader::new(s.try_clone().map_err(io)?);
    let first = get(&mut s, &mut r, 0)?;
    if first != value(0, load.value_bytes) {
        return Err("key 0 does not hold what was stored".into());
    }
    let per = load.gets / load.connections.max(1);
    let t0 = Instant::now();
    let threads: Vec<_> = (0..load.connections.max(1))
        .map(|c| {
            let sock = sock.to_path_buf();
            let load = load.clone();
            std::thread::spawn(move || -> Result<(u64, Vec<u32>), String> {
                let mut s = UnixStream::connect(&sock).map_err(io)?;
                let mut r = BufReader::new(s.try_clone().map_err(io)?);
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (c + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                let mut h = 0u64;
                let mut lat = Vec::with_capacity(per as usize);
                for _ in 0..per {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let i = x % load.keys.max(1);
                    let t = Instant::now();
                    let v = get(&mut s, &mut r, i)?;
                    lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    if v != value(i, load.value_bytes) {
                        return Err(format!("GET {} returned {} bytes other than stored", key(i), v.len()));
                    }
                    h = xxhash_rust::xxh3::xxh3_64_with_seed(&v, h ^ i);
                }
                Ok((h, lat))
            })
        })
        .collect();
    let mut digest = 0u64;
    let mut lat = Vec::new();
    for t in threads {
        let (h, l) = t.join().map_err(|_| "a load thread panicked".to_string())??;
        digest = xxhash_rust::xxh3::xxh3_64_with_seed(&h.to_le_bytes(), digest);
        lat.extend(l);
    }
    let secs = t0.elapsed().as_secs_f64();
    lat.sort_unstable();
    let p99 = lat
        .get(((lat.len() as f64 * 0.99) as usize).min(lat.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0);
    Ok(Measured {
        gets_per_s: lat.len() as f64 / secs.max(1e-9),
        p99_us: p99 as f64,
        digest: format!("{digest:016x}"),
    })
}

/// One GET; its value (an error if the key is missing).
fn get(s: &mut UnixStream, r: &mut BufReader<UnixStream>, i: u64) -> Result<Vec<u8>, String> {
    write!(s, "get {}\r\n", key(i)).map_err(io)?;
    let mut line = String::new();
    r.read_line(&mut line).map_err(io)?;
    let len: usize = match line.trim_end().strip_prefix("VALUE ") {
        Some(rest) => rest
            .split_whitespace()
            .nth(2)
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("malformed answer {line:?}"))?,
        None => return Err(format!("GET {}: {:?}", key(i), line.trim_end())),
    };
    let mut v = vec![0; len + 2];
    r.read_exact(&mut v).map_err(io)?;
    v.truncate(len);
    let mut end = String::new();
    r.read_line(&mut end).map_err(io)?;
    if end.trim_end() != "END" {
        return Err(format!("GET {}: expected END, got {end:?}", key(i)));
    }
    Ok(v)
}
