//! What a peer without a secret costs a running brick: opens connections that each send one
//! 32-byte WRITE header claiming a 16 MiB payload (`headers`), or nothing at all (`silent`),
//! holds them, and reports the brick's resident memory (`VmRSS` of the given process) before
//! and after, then whether a HELLO on a fresh connection is still answered. The figures in
//! `docs/benchmarks.md` ("Hostile peers") come from it:
//!
//! ```text
//! rackmem brick --listen tcp://127.0.0.1:7070 --size 1GiB --secret s3cret &
//! cargo run --release -p rackmem-brick --example flood -- tcp://127.0.0.1:7070 $! headers 128
//! cargo run --release -p rackmem-brick --example flood -- tcp://127.0.0.1:7070 $! silent 1024
//! ```
//!
//! Arguments: the brick's address (`tcp://HOST:PORT`), its process id, `headers` or `silent`,
//! and how many connections.

use rackmem_proto::{Header, Opcode, Request, HEADER_LEN, MAX_PAYLOAD};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn vm_rss_kib(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(addr), Some(pid), Some(kind)) = (
        args.get(1).and_then(|a| a.strip_prefix("tcp://")),
        args.get(2),
        args.get(3),
    ) else {
        eprintln!("usage: flood tcp://HOST:PORT BRICK_PID headers|silent [CONNECTIONS]");
        std::process::exit(2);
    };
    let n: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(128);
    let claim = Header {
        opcode: Opcode::Write,
        flags: 0,
        tag: 1,
        status: 0,
        offset: 0,
        length: 0,
        payload_len: MAX_PAYLOAD,
    }
    .encode();
    let before = vm_rss_kib(pid);
    let mut held = Vec::new();
    for i in 0..n {
        match TcpStream::connect(addr) {
            Ok(mut s) => {
                if kind == "headers" {
                    let _ = s.write_all(&claim);
                }
                held.push(s);
            }
            Err(e) => {
                println!("connection {i} failed: {e}");
                break;
            }
        }
        if i % 64 == 63 {
            // Stay within the brick's listen backlog: beyond it the kernel leaves connections
            // half-open, never reaching the brick.
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    std::thread::sleep(Duration::from_secs(2));
    let after = vm_rss_kib(pid);
    println!(
        "{} {kind} connections: brick VmRSS {} MiB before, {} MiB after",
        held.len(),
        before / 1024,
        after / 1024
    );
    let answered = TcpStream::connect(addr).and_then(|mut s| {
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(&Request::Hello.encode(1))?;
        let mut h = [0u8; HEADER_LEN];
        s.read_exact(&mut h)?;
        Ok(Header::decode(&h).map(|h| rackmem_proto::Status::from_u32(h.status)))
    });
    match answered {
        Ok(Ok(status)) => println!("a fresh HELLO from the same address is answered: {status:?}"),
        Ok(Err(e)) => println!("a fresh HELLO gets a malformed answer: {e}"),
        Err(e) => println!("a fresh HELLO is not answered: {e}"),
    }
}
