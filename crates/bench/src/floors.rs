//! The floors: a fault resolved from local memory (no network), and a request-response on a link
//! (no fault). A remote fault costs at least one of each.
//!
//! [`run`] is `rackmem bench floors`: every floor, as a table, a JSON document and a chart.

use crate::{BenchError, Output, Summary};
use rackmem_brick::{Brick, BrickConfig, ListenAddr};
use rackmem_sys::{Mapping, PAGE_SIZE};
use rackmem_transport::{BrickAddr, Link};
use rackmem_uffd::{CopyMode, Event, Features, OpenOptions, RegisterMode, Uffd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the floor's handler waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// `poll(2)` then read.
    Blocking,
    /// Spin on a non-blocking read.
    BusyPoll,
}

fn shuffle(v: &mut [usize], mut seed: u64) {
    for i in (1..v.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        v.swap(i, (seed % (i as u64 + 1)) as usize);
    }
}

/// Touches `pages` missing pages in random order; a handler thread resolves each with
/// `UFFDIO_COPY` of a local page. Latency is seen by the faulting thread.
pub fn uffd_floor(waiting: Waiting, pages: usize) -> Result<Summary, BenchError> {
    let u = Arc::new(Uffd::open(&OpenOptions {
        features: Features::default(),
        nonblocking: true,
    })?);
    let m = Mapping::reserve(pages * PAGE_SIZE, PAGE_SIZE)?;
    u.register(
        m.addr(),
        m.len(),
        RegisterMode {
            missing: true,
            wp: false,
            minor: false,
        },
    )?;
    let stop = Arc::new(AtomicBool::new(false));
    let handler = {
        let (u, stop) = (u.clone(), stop.clone());
        std::thread::spawn(move || {
            let src = vec![0x42u8; PAGE_SIZE];
            let mut ev = Vec::with_capacity(64);
            while !stop.load(Ordering::Relaxed) {
                if waiting == Waiting::Blocking && !u.poll_readable(10).unwrap_or(false) {
                    continue;
                }
                ev.clear();
                if u.read_events(&mut ev, 64).is_err() {
                    return;
                }
                for e in &ev {
                    if let Event::Pagefault { addr, .. } = e {
                        if u.copy(*addr, &src, CopyMode::default()).is_err() {
                            let _ = u.wake(*addr, PAGE_SIZE);
                        }
                    }
                }
            }
        })
    };
    let mut order: Vec<usize> = (0..pages).collect();
    shuffle(&mut order, 7);
    let mut ns = Vec::with_capacity(pages);
    let mut b = [0u8; 1];
    for p in order {
        let t = Instant::now();
        m.read(p * PAGE_SIZE, &mut b);
        ns.push(t.elapsed().as_nanos() as u64);
    }
    stop.store(true, Ordering::Relaxed);
    let _ = handler.join();
    u.unregister(m.addr(), m.len())?;
    let name = match waiting {
        Waiting::Blocking => "uffd floor, blocking handler",
        Waiting::BusyPoll => "uffd floor, busy-polling handler",
    };
    Ok(Summary::from_ns(name, ns))
}

/// Request-response of `bytes` (4 KiB or 64 KiB) reads on a link to an in-process brick.
pub fn link_floor(transport: &str, bytes: u32, rounds: usize) -> Result<Summary, BenchError> {
    let dir = std::env::temp_dir().join(format!("rackmem-bench-{}-{transport}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let listen = match transport {
        "unix" => ListenAddr::Unix(dir.join("floor.sock")),
        _ => ListenAddr::Tcp("127.0.0.1:0".into()),
    };
    let brick = Brick::start(BrickConfig {
        listen,
        size_bytes: 64 << 20,
        key: b"k".to_vec(),
        secret: Some(b"s".to_vec()),
        managed: false,
        limits: Default::default(),
        tls: None,
    })
    .map_err(|e| BenchError::Brick(e.to_string()))?;
    let addr: BrickAddr = brick
        .local_addr()
        .parse()
        .map_err(|e: rackmem_transport::LinkError| BenchError::Brick(e.to_string()))?;
    let link = Link::connect(&addr, Duration::from_secs(10)).map_err(|e| BenchError::Brick(e.to_string()))?;
    link.alloc_segment(b"s", 16 << 20)
        .map_err(|e| BenchError::Brick(e.to_string()))?;
    let data = vec![1u8; bytes as usize];
    link.write_pages(&[(0, bytes)], &data)
        .map_err(|e| BenchError::Brick(e.to_string()))?;
    let mut out = vec![0u8; bytes as usize];
    let mut ns = Vec::with_capacity(rounds);
    for i in 0..rounds + rounds / 10 {
        let t = Instant::now();
        link.read_pages(&[(0, bytes)], &mut out)
            .map_err(|e| BenchError::Brick(e.to_string()))?;
        if i >= rounds / 10 {
            ns.push(t.elapsed().as_nanos() as u64);
        }
    }
    drop(link);
    brick.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Summary::from_ns(
        &format!("link floor, {transport}, {} KiB read", bytes / 1024),
        ns,
    ))
}

/// Floors measured by [`all`], for a progress bar's length.
pub const STEPS: u64 = 6;

/// Every floor, `samples` faults each (a quarter as many link round trips); `pb` advances once
/// per floor.
pub fn all(samples: usize, pb: &indicatif::ProgressBar) -> Result<Vec<Summary>, BenchError> {
    let mut v = Vec::new();
    for w in [Waiting::Blocking, Waiting::BusyPoll] {
        pb.set_message(format!("userfaultfd floor, {w:?} handler"));
        v.push(uffd_floor(w, samples).map_err(|e| BenchError::Workload(format!("userfaultfd floor: {e}")))?);
        pb.inc(1);
    }
    for t in ["unix", "tcp"] {
        for bytes in [4096, 65536] {
            pb.set_message(format!("link floor, {t}, {} KiB", bytes / 1024));
            v.push(link_floor(t, bytes, samples / 4).map_err(|e| BenchError::Workload(format!("link floor: {e}")))?);
            pb.inc(1);
        }
    }
    Ok(v)
}

/// `rackmem bench floors`: every floor, `samples` each.
pub fn run(samples: usize) -> Result<Output, BenchError> {
    let pb = crate::progress::bar(STEPS);
    let f = all(samples, &pb);
    pb.finish_and_clear();
    let f = f?;
    Ok(Output {
        text: crate::summary::table("Floors (same run)", &f),
        chart: Some(crate::summary::latency_chart(
            "Floors: the best this machine can do (same run)",
            &f,
        )),
        json: serde_json::json!({ "floors": f }),
    })
}
