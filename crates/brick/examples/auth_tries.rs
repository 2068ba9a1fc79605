//! How fast can a peer try shared secrets against a brick? Opens connections from several
//! threads, each sending one ALLOC with a wrong secret and reading the answer, for a while, and
//! prints the tries answered per second and how the brick answered them. The figures in
//! `docs/benchmarks.md` ("Authentication failures") come from it:
//!
//! ```text
//! cargo run --release -p rackmem-brick --example auth_tries -- tcp://127.0.0.1:7070 10 8
//! ```
//!
//! Arguments: the brick's address (`tcp://HOST:PORT`), seconds to run, threads.

use rackmem_proto::{Header, Request, Status, HEADER_LEN};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn one_try(addr: &str) -> Result<Status, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let frame = Request::Alloc {
        size_bytes: 1 << 20,
        secret: b"not-the-secret".to_vec(),
    }
    .encode(1);
    s.write_all(&frame).map_err(|e| format!("send: {e}"))?;
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).map_err(|e| format!("no answer: {e}"))?;
    let h = Header::decode(&h).map_err(|e| e.to_string())?;
    Ok(Status::from_u32(h.status))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(addr) = args.get(1).and_then(|a| a.strip_prefix("tcp://")).map(str::to_string) else {
        eprintln!("usage: auth_tries tcp://HOST:PORT [SECONDS] [THREADS]");
        std::process::exit(2);
    };
    let secs: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let threads: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(8);
    let outcomes: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (addr, outcomes) = (addr.clone(), outcomes.clone());
            std::thread::spawn(move || {
                while Instant::now() < end {
                    let k = match one_try(&addr) {
                        Ok(s) => format!("{s:?}"),
                        Err(e) => e,
                    };
                    *outcomes.lock().unwrap_or_else(|e| e.into_inner()).entry(k).or_default() += 1;
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let took = start.elapsed().as_secs_f64();
    let outcomes = outcomes.lock().unwrap_or_else(|e| e.into_inner());
    let answered: u64 = outcomes
        .iter()
        .filter(|(k, _)| k.as_str() == "Denied")
        .map(|(_, v)| v)
        .sum();
    println!(
        "{answered} wrong secrets checked and refused in {took:.1} s: {:.0} tries/s ({threads} threads)",
        answered as f64 / took
    );
    for (k, v) in outcomes.iter() {
        println!("  {v:>8}  {k}");
    }
}
