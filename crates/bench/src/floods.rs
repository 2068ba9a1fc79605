//! `rackmem bench floods`: what a legitimate client waits for while attackers flood the control
//! plane and a brick with idle connections (issue 26, item 5's target: "under the floods above,
//! a legitimate client's allocation and its program's first fault succeed with p99 latency
//! under 2 × the unloaded figure").
//!
//! The floods are the ones the security probe ran (docs/security.md): 640 idle connections
//! from 16 addresses of one /24 to the control plane (they once held all its 512 slots), and
//! 8,000 silent connections (by default) from as many addresses in 40 /24s to a brick (they once cost a
//! thread each and filled its 4,096). The legitimate client sits in another network (127.0.0.1),
//! as it would: the defences cap and throttle by address prefix. Each sample is what a program
//! starting on a node does first: a new client asks the control plane for an allocation (timed:
//! *allocation*), then connects to its brick, attaches with the grant and reads one 4 KiB page
//! (timed: *first fault*, a fresh link's first fetch), and releases it (untimed). Rounds
//! alternate quiet and flooded batches, so both see the same machine. Control plane, brick and
//! attackers run in this process on TCP loopback.

use crate::rates::{brick, first_segment, serve};
use crate::{BenchError, Context, Output};
use rackmem_control::api::AllocationRequest;
use rackmem_control::client::Client;
use rackmem_transport::Link;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The target: p99 under flood below this many times the quiet p99.
const TARGET: f64 = 2.0;
/// Idle connections to the control plane, as the probe opened them: 40 from each of 16
/// addresses of one /24.
const CONTROL_FLOOD: (u8, usize) = (16, 40);

/// What `bench floods` measures.
#[derive(Debug, Clone)]
pub struct FloodsConfig {
    /// Rounds, each a quiet batch then a flooded one.
    pub rounds: usize,
    /// Samples per batch.
    pub samples: usize,
    /// Silent connections held on the brick during a flooded batch.
    pub brick_flood: usize,
}

#[derive(serde::Serialize, Default)]
struct Batch {
    /// Allocation latencies, µs.
    allocation_us: Vec<f64>,
    /// First-fault latencies (connect, attach, one 4 KiB read), µs.
    first_fault_us: Vec<f64>,
    /// Samples that failed, with the reason of the first.
    failed: usize,
    first_failure: Option<String>,
}

#[derive(serde::Serialize)]
struct Summary {
    quiet_p50_us: f64,
    quiet_p99_us: f64,
    flooded_p50_us: f64,
    flooded_p99_us: f64,
    /// `flooded_p99 / quiet_p99`.
    p99_ratio: f64,
}

/// A TCP connection to `to` from the loopback address `from`, saying nothing.
fn connect_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.bind(&SocketAddr::new(from.into(), 0).into())?;
    s.connect_timeout(&to.into(), Duration::from_secs(5))?;
    Ok(s.into())
}

/// The floods, opened. Connections the defences refuse are accepted and closed by the far side
/// at once; [`Flood::still_held`] counts the ones it keeps.
struct Flood {
    control: Vec<TcpStream>,
    brick: Vec<TcpStream>,
}

impl Flood {
    fn open(control: SocketAddr, brick: SocketAddr, brick_silent: usize) -> Flood {
        let (addrs, per) = CONTROL_FLOOD;
        let mut f = Flood {
            control: Vec::with_capacity(usize::from(addrs) * per),
            brick: Vec::with_capacity(brick_silent),
        };
        for a in 1..=addrs {
            for _ in 0..per {
                if let Ok(s) = connect_from(Ipv4Addr::new(127, 0, 20, a), control) {
                    f.control.push(s);
                }
            }
        }
        for i in 0..brick_silent {
            let from = Ipv4Addr::new(127, 0, 100 + (i / 200) as u8, 1 + (i % 200) as u8);
            if let Ok(s) = connect_from(from, brick) {
                f.brick.push(s);
            }
        }
        f
    }

    /// Connections of `v` the far side neither answered nor closed.
    fn still_held(v: &mut [TcpStream]) -> usize {
        use std::io::Read;
        let mut b = [0u8; 16];
        let mut held = 0;
        for s in v.iter_mut() {
            if s.set_nonblocking(true).is_ok()
                && matches!(s.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            {
                held += 1;
            }
        }
        held
    }
}

/// One legitimate sample: (allocation µs, first fault µs).
fn sample(url: &str, token: &str, node: u64, brick_id: u64) -> Result<(f64, f64), BenchError> {
    let t0 = Instant::now();
    let c = Client::with_timeout(&[url.to_string()], Duration::from_secs(30))
        .context("a client of the control plane")?
        .with_token(Some(token.to_string()));
    let a = c
        .allocate(&AllocationRequest {
            node,
            size_bytes: 1 << 20,
            bricks: Some(vec![brick_id]),
            ..Default::default()
        })
        .context("allocating")?;
    let alloc_us = t0.elapsed().as_secs_f64() * 1e6;
    let result = (|| -> Result<f64, BenchError> {
        let (addr, grant, key) = first_segment(&a)?;
        let t1 = Instant::now();
        let link = Link::connect(&addr, Duration::from_secs(30)).context("connecting to the brick")?;
        link.attach(&grant, &key).context("attaching")?;
        let mut page = vec![0u8; 4096];
        link.read_pages(&[(0, 4096)], &mut page).context("reading a page")?;
        Ok(t1.elapsed().as_secs_f64() * 1e6)
    })();
    c.free(a.id).context("releasing")?;
    Ok((alloc_us, result?))
}

fn batch(url: &str, token: &str, node: u64, brick_id: u64, n: usize) -> Batch {
    let mut b = Batch::default();
    for _ in 0..n {
        match sample(url, token, node, brick_id) {
            Ok((a, f)) => {
                b.allocation_us.push(a);
                b.first_fault_us.push(f);
            }
            Err(e) => {
                b.failed += 1;
                b.first_failure.get_or_insert_with(|| e.to_string());
            }
        }
    }
    b
}

fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((s.len() - 1) as f64 * q).round() as usize;
    s[i.min(s.len() - 1)]
}

fn summary(quiet: &[f64], flooded: &[f64]) -> Summary {
    let (q99, f99) = (percentile(quiet, 0.99), percentile(flooded, 0.99));
    Summary {
        quiet_p50_us: percentile(quiet, 0.5),
        quiet_p99_us: q99,
        flooded_p50_us: percentile(flooded, 0.5),
        flooded_p99_us: f99,
        p99_ratio: f99 / q99,
    }
}

/// Runs `bench floods`.
pub fn run(a: &FloodsConfig) -> Result<Output, BenchError> {
    if a.rounds == 0 || a.samples == 0 {
        return Err(BenchError::Config("--rounds and --samples must be positive".into()));
    }
    // Both ends of every connection live in this process, plus the control plane's and the
    // samples' own files.
    let need = (a.brick_flood * 2 + 2 * 640 + 1_000) as u64;
    let got = rackmem_sys::raise_open_files_limit().context("raising the open-files limit")?;
    if got < need {
        return Err(BenchError::Config(format!(
            "the floods hold {} connections (both ends in this process: {need} files); the open-files \
             hard limit is {got}: raise it (ulimit -Hn) or lower --brick-flood",
            a.brick_flood + 640
        )));
    }
    let s = serve()?;
    let (brick_handle, hb, brick_id) = brick(&s, "flooded", None)?;
    let url = s.server.url();
    let control: SocketAddr = url
        .trim_start_matches("http://")
        .parse()
        .context("the control plane's address")?;
    let brick_addr: SocketAddr = brick_handle
        .local_addr()
        .trim_start_matches("tcp://")
        .parse()
        .context("the brick's address")?;
    let token = s.token.clone();
    let mut quiet = Batch::default();
    let mut flooded = Batch::default();
    let (mut held_control, mut held_brick) = (0, 0);
    let bar = crate::progress::bar(a.rounds as u64 * 2);
    bar.set_message("quiet and flooded batches");
    for _ in 0..a.rounds {
        let q = batch(&url, &token, s.node, brick_id, a.samples);
        bar.inc(1);
        let mut f = Flood::open(control, brick_addr, a.brick_flood);
        // Let the listeners take the flood in before the first legitimate sample.
        std::thread::sleep(Duration::from_millis(300));
        let fl = batch(&url, &token, s.node, brick_id, a.samples);
        held_control = held_control.max(Flood::still_held(&mut f.control));
        held_brick = held_brick.max(Flood::still_held(&mut f.brick));
        drop(f);
        bar.inc(1);
        for (all, one) in [(&mut quiet, q), (&mut flooded, fl)] {
            all.allocation_us.extend(one.allocation_us);
            all.first_fault_us.extend(one.first_fault_us);
            all.failed += one.failed;
            if all.first_failure.is_none() {
                all.first_failure = one.first_failure;
            }
        }
        // The brick closes the silent connections it still holds at their handshake deadline;
        // the next quiet batch should not pay for the closing.
        std::thread::sleep(Duration::from_millis(300));
    }
    bar.finish_and_clear();
    hb.stop();
    brick_handle.shutdown();
    let _ = s.server.stop();
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("rackmem-bench-rates-{}", std::process::id())));

    let alloc = summary(&quiet.allocation_us, &flooded.allocation_us);
    let fault = summary(&quiet.first_fault_us, &flooded.first_fault_us);
    let met = flooded.failed == 0 && alloc.p99_ratio < TARGET && fault.p99_ratio < TARGET;
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "legitimate request",
        "quiet p50 µs",
        "quiet p99 µs",
        "flooded p50 µs",
        "flooded p99 µs",
        "p99 flooded ÷ quiet",
    ]);
    for (name, x) in [("allocation", &alloc), ("first fault (connect, attach, 4 KiB)", &fault)] {
        t.add_row(vec![
            name.to_string(),
            format!("{:.0}", x.quiet_p50_us),
            format!("{:.0}", x.quiet_p99_us),
            format!("{:.0}", x.flooded_p50_us),
            format!("{:.0}", x.flooded_p99_us),
            format!("{:.2}", x.p99_ratio),
        ]);
    }
    let text = format!(
        "A legitimate client under the probe's floods ({} idle connections to the control plane from \
         16 addresses of one /24, of which it kept {}; {} silent connections to the brick from {} \
         /24s, of which it kept {}), {} rounds of {} quiet then {} flooded samples (same run)\n{t}\n\
         failed samples: {} quiet, {} flooded{}\n\
         target (p99 under flood below {TARGET} × quiet, nothing failed): {}\n",
        CONTROL_FLOOD.0 as usize * CONTROL_FLOOD.1,
        held_control,
        a.brick_flood,
        a.brick_flood.div_ceil(200),
        held_brick,
        a.rounds,
        a.samples,
        a.samples,
        quiet.failed,
        flooded.failed,
        flooded
            .first_failure
            .as_deref()
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default(),
        if met { "met" } else { "NOT met" },
    );
    let bars = [("allocation", &alloc), ("first fault", &fault)]
        .iter()
        .map(|(name, x)| crate::chart::Bar {
            group: (*name).to_string(),
            label: "p99 flooded ÷ quiet".into(),
            fraction: x.p99_ratio,
        })
        .collect();
    Ok(Output {
        text,
        chart: Some(crate::chart::fractions(
            "A legitimate client under floods: p99 latency flooded ÷ quiet",
            bars,
        )),
        json: serde_json::json!({
            "floods": {
                "rounds": a.rounds,
                "samples": a.samples,
                "control_flood": CONTROL_FLOOD.0 as usize * CONTROL_FLOOD.1,
                "brick_flood": a.brick_flood,
                "control_held": held_control,
                "brick_held": held_brick,
                "allocation": alloc,
                "first_fault": fault,
                "quiet": quiet,
                "flooded": flooded,
                "target": TARGET,
                "target_met": met,
            }
        }),
    })
}
