//! `rackmem bench transfer`: one-sided put and get (issue 24) from 8 B to 64 MiB on each link
//! kind (shared memory, Unix socket, TCP loopback, each to a brick in this process; and, asked
//! for, `granted-tcp`: a named segment a control plane in this process grants on a managed
//! brick, as programs on agent memory get theirs), by the
//! inline path, the bulk path and the calibrated engine, beside a local `memcpy` of the same
//! size and Open MPI's `MPI_Put`/`MPI_Get` with passive target (two ranks on this machine,
//! over its shared memory and over TCP), all in the same run, rounds interleaved.
//!
//! What it answers: where the bulk path starts beating the inline one on each link (the
//! crossover seed 003 measured between the processor's copy and DMA), how close the
//! calibrated engine stays to the better path at every size (the target: within 10%),
//! and how an 8-byte put or get compares with MPI's over the same kind of link.

use crate::chart::{Chart, Line, LinePanel};
use crate::{BenchError, Output};
use rackmem_brick::{Brick, BrickConfig, BrickHandle, ListenAddr};
use rackmem_putget::{Engine, EngineConfig, Path as XferPath, Segment, Sharing, Threshold};
use rackmem_transport::BrickAddr;

/// The engine's default polling bound, µs (`RACKMEM_PUTGET_SPIN_US`), for the bench's option.
pub use rackmem_putget::DEFAULT_LINK_SPIN_US;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sizes measured by default: 8 B to 64 MiB.
pub const DEFAULT_SIZES: [u64; 9] = [8, 64, 512, 4096, 32 << 10, 256 << 10, 2 << 20, 16 << 20, 64 << 20];

/// What to measure.
#[derive(Debug, Clone)]
pub struct TransferConfig {
    /// Transfer sizes in bytes.
    pub sizes: Vec<u64>,
    /// Interleaved rounds per size; the median counts.
    pub rounds: usize,
    /// Link kinds: `shm`, `unix`, `tcp`.
    pub links: Vec<String>,
    /// Also run the MPI peer (needs `mpicc` and `mpirun`: Debian's openmpi-bin and
    /// libopenmpi-dev, which `scripts/programs.sh` installs).
    pub mpi: bool,
    /// Where `putget_mpi.c` is (the repository's `bench/`).
    pub bench_dir: PathBuf,
    /// Scratch directory.
    pub tmp: PathBuf,
    /// How long the engine's links poll for an answer before sleeping.
    pub link_spin: Duration,
}

/// One measured size of one operation on one link.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    /// Link kind.
    pub link: String,
    /// `put` or `get`.
    pub op: String,
    /// Bytes per operation.
    pub bytes: u64,
    /// Inline path, ns per operation (median of rounds).
    pub inline_ns: f64,
    /// Bulk path.
    pub bulk_ns: f64,
    /// The calibrated engine (the path its measured threshold picks).
    pub engine_ns: f64,
    /// The engine against the better of the two paths measured in the same rounds (1.0: as
    /// fast as the better one).
    pub engine_vs_best: f64,
    /// A local `memcpy` of the same size.
    pub memcpy_ns: f64,
    /// MPI's operation over the comparable link (shared memory for `shm`, TCP for `tcp`).
    pub mpi_ns: Option<f64>,
}

/// Operations per measurement: enough to last a few milliseconds, at least 3 (the MPI peer
/// uses the same rule).
fn reps_for(bytes: u64) -> usize {
    ((32u64 << 20) / bytes.max(1)).clamp(3, 500) as usize
}

fn step<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> BenchError + '_ {
    move |e| BenchError::Step {
        what: what.to_string(),
        why: e.to_string(),
    }
}

/// What one link kind is measured on: its brick, its engine and a segment of it.
struct Target {
    link: String,
    _brick: BrickHandle,
    _engine: Engine,
    /// The control plane that granted the segment (`granted-tcp`).
    _server: Option<rackmem_control::server::ServerHandle>,
    seg: Arc<Segment>,
}

/// Grants named segments of an in-process control plane, as a node agent would hand them to a
/// process (the agent only passes the grant on: the transfers go to the brick either way).
struct PlaneGranter {
    client: rackmem_control::client::Client,
    node: u64,
    /// Allocation → name, to close it.
    names: std::sync::Mutex<BTreeMap<u64, String>>,
    next: std::sync::atomic::AtomicU64,
}

impl PlaneGranter {
    fn holder() -> rackmem_control::api::Holder {
        rackmem_control::api::Holder {
            agent: "bench".into(),
            connection: 1,
            pid: std::process::id(),
            uid: 0,
            start_ticks: 0,
        }
    }
}

impl rackmem_putget::Granter for PlaneGranter {
    fn grant(&self, name: Option<&str>, bytes: u64) -> Result<rackmem_putget::Granted, rackmem_putget::PutGetError> {
        use rackmem_putget::PutGetError;
        let fail = |message: String| PutGetError::Granter {
            code: "bench".into(),
            message,
        };
        let name = name.map_or_else(
            || {
                format!(
                    "scratch-{}",
                    self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                )
            },
            str::to_string,
        );
        let s = self
            .client
            .open_segment(&rackmem_control::api::SegmentOpen {
                node: self.node,
                name: name.clone(),
                size_bytes: bytes,
                holder: PlaneGranter::holder(),
            })
            .map_err(|e| fail(e.to_string()))?;
        let seg = s.segment.ok_or_else(|| fail("no grant in the reply".into()))?;
        let grant = hex::decode(&seg.grant_hex)
            .ok()
            .and_then(|g| rackmem_proto::Grant::decode(&g).ok())
            .ok_or_else(|| fail("a grant that does not decode".into()))?;
        let session_key: [u8; rackmem_proto::KEY_LEN] = hex::decode(&seg.session_key_hex)
            .ok()
            .and_then(|k| k.try_into().ok())
            .ok_or_else(|| fail("a session key that does not decode".into()))?;
        let brick = seg.brick_address.parse().map_err(|e| fail(format!("{e}")))?;
        self.names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(s.allocation, name);
        Ok(rackmem_putget::Granted {
            allocation: s.allocation,
            brick,
            grant: rackmem_putget::SegmentGrant { grant, session_key },
        })
    }

    fn give_back(&self, allocation: u64) -> Result<(), rackmem_putget::PutGetError> {
        let name = self.names.lock().unwrap_or_else(|e| e.into_inner()).remove(&allocation);
        if let Some(name) = name {
            let req = rackmem_control::api::SegmentClose {
                node: self.node,
                holder: PlaneGranter::holder(),
            };
            let _ = self.client.close_segment(&name, &req);
        }
        Ok(())
    }
}

/// `granted-tcp`: a control plane in this process, a managed brick on TCP loopback registered
/// with it, and a named segment the control plane grants (what `rackmem_seg_open` gets on agent
/// memory), attached with its grant.
fn granted_target(bytes: u64, link_spin: Duration) -> Result<Target, BenchError> {
    use crate::Context;
    let key = [0x6bu8; 32].to_vec();
    let brick = Brick::start(BrickConfig {
        listen: ListenAddr::Tcp("127.0.0.1:0".into()),
        size_bytes: (bytes * 4).max(64 << 20),
        key: key.clone(),
        secret: None,
        managed: true,
        limits: Default::default(),
        tls: None,
    })
    .map_err(step("starting a managed brick"))?;
    let store: Box<dyn rackmem_control::store::Store> = Box::<rackmem_control::store::MemoryStore>::default();
    let token = rackmem_control::auth::new_admin_token().context("making an admin token")?;
    let mut cfg = rackmem_control::server::ServerConfig::new(std::net::SocketAddr::from(([127, 0, 0, 1], 0)), store)
        .with_admin_token(&token);
    // No heartbeats here: the brick must not be marked down while it is measured.
    cfg.brick_timeout = Duration::from_secs(7 * 24 * 3600);
    let server = rackmem_control::server::spawn(cfg).context("starting the control plane")?;
    let client = rackmem_control::client::Client::new(&[server.url()])
        .context("a client of the control plane")?
        .with_token(Some(token));
    let port = |name: &str| rackmem_control::api::PortSpec {
        name: name.into(),
        bandwidth_bps: 100_000_000_000,
        switch: None,
    };
    client
        .register_brick(&rackmem_control::api::BrickRegistration {
            name: "bench-brick".into(),
            address: format!("tcp://{}", brick.local_addr().trim_start_matches("tcp://")),
            capacity_bytes: (bytes * 4).max(64 << 20),
            ports: vec![port("p0")],
            key_hex: hex::encode(&key),
            serve_bps: None,
        })
        .context("registering the brick")?;
    let node = client
        .register_node(&rackmem_control::api::NodeRegistration {
            name: "bench-node".into(),
            ports: vec![port("eth0")],
        })
        .context("registering the node")?
        .id;
    let granter = Arc::new(PlaneGranter {
        client,
        node,
        names: Default::default(),
        next: Default::default(),
    });
    let engine = Engine::with_granter(
        EngineConfig {
            bricks: Vec::new(),
            secret: Vec::new(),
            timeout: Duration::from_secs(30),
            sharing: Sharing::Never,
            tls: None,
            threshold: Threshold::Calibrate,
            link_spin,
        },
        Some(granter),
    );
    let h = engine
        .open(b"bench-transfer", bytes)
        .map_err(step("opening a granted segment"))?;
    let seg = engine.segment(h).map_err(step("the segment"))?;
    Ok(Target {
        link: "granted-tcp".to_string(),
        _brick: brick,
        _engine: engine,
        _server: Some(server),
        seg,
    })
}

fn target(link: &str, bytes: u64, tmp: &std::path::Path, link_spin: Duration) -> Result<Target, BenchError> {
    if link == "granted-tcp" {
        return granted_target(bytes, link_spin);
    }
    let (listen, sharing) = match link {
        "shm" => (ListenAddr::Unix(tmp.join("transfer-shm.sock")), Sharing::Always),
        "unix" => (ListenAddr::Unix(tmp.join("transfer-unix.sock")), Sharing::Never),
        "tcp" => (ListenAddr::Tcp("127.0.0.1:0".into()), Sharing::Never),
        other => {
            return Err(BenchError::Config(format!(
                "--links: unknown link `{other}` (shm, unix, tcp, granted-tcp)"
            )))
        }
    };
    let brick = Brick::start(BrickConfig {
        listen,
        size_bytes: (bytes * 2).max(64 << 20),
        key: b"k".to_vec(),
        secret: Some(b"s".to_vec()),
        managed: false,
        limits: Default::default(),
        tls: None,
    })
    .map_err(step("starting a brick"))?;
    let addr: BrickAddr = brick.local_addr().parse().map_err(step("the brick's address"))?;
    let engine = Engine::new(EngineConfig {
        bricks: vec![addr],
        secret: b"s".to_vec(),
        timeout: Duration::from_secs(30),
        sharing,
        tls: None,
        threshold: Threshold::Calibrate,
        link_spin,
    });
    let h = engine.alloc(bytes).map_err(step("allocating a segment"))?;
    let seg = engine.segment(h).map_err(step("the segment"))?;
    Ok(Target {
        link: link.to_string(),
        _brick: brick,
        _engine: engine,
        _server: None,
        seg,
    })
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Way {
    Inline,
    Bulk,
    Engine,
    Memcpy,
}

fn measure(t: &Target, way: Way, put: bool, bytes: usize, buf: &mut [u8], local: &mut [u8]) -> Result<f64, BenchError> {
    let reps = reps_for(bytes as u64);
    let b = &mut buf[..bytes];
    let started = Instant::now();
    for i in 0..reps {
        let r = match (way, put) {
            (Way::Memcpy, true) => {
                local[..bytes].copy_from_slice(std::hint::black_box(&b[..]));
                Ok(())
            }
            (Way::Memcpy, false) => {
                b.copy_from_slice(std::hint::black_box(&local[..bytes]));
                Ok(())
            }
            (Way::Engine, true) => t.seg.put(0, b),
            (Way::Engine, false) => t.seg.get(0, b),
            (w, true) => t.seg.put_with(path(w), 0, b),
            (w, false) => t.seg.get_with(path(w), 0, b),
        };
        r.map_err(step("a transfer"))?;
        if i == 0 {
            b[0] = b[0].wrapping_add(1);
        }
    }
    Ok(started.elapsed().as_nanos() as f64 / reps as f64)
}

fn path(w: Way) -> XferPath {
    if w == Way::Bulk {
        XferPath::Bulk
    } else {
        XferPath::Inline
    }
}

/// Runs the MPI peer: `(op, bytes) → ns per operation` (median of rounds), or why not.
fn mpi(cfg: &TransferConfig, over_tcp: bool) -> Result<BTreeMap<(String, u64), f64>, BenchError> {
    let src = cfg.bench_dir.join("putget_mpi.c");
    let exe = cfg.tmp.join("putget_mpi");
    let o = Command::new("mpicc")
        .args(["-O2", "-Wall", "-Wextra", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .map_err(|e| {
            BenchError::Workload(format!(
                "cannot run mpicc (apt-get install openmpi-bin libopenmpi-dev, or ./scripts/programs.sh): {e}"
            ))
        })?;
    if !o.status.success() {
        return Err(BenchError::Workload(format!(
            "mpicc {}: {}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        )));
    }
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "--oversubscribe", "-n", "2"]);
    if over_tcp {
        // Open MPI 4's point-to-point one-sided component over its TCP transport: the socket
        // path, as rackmem's tcp link.
        c.args(["--mca", "btl", "self,tcp", "--mca", "osc", "pt2pt"]);
    }
    c.arg(&exe).arg(cfg.rounds.to_string());
    c.args(cfg.sizes.iter().map(u64::to_string));
    let o = c
        .output()
        .map_err(|e| BenchError::Workload(format!("cannot run mpirun: {e}")))?;
    if !o.status.success() {
        return Err(BenchError::Workload(format!(
            "mpirun putget_mpi failed: {}",
            String::from_utf8_lossy(&o.stderr)
        )));
    }
    let mut samples: BTreeMap<(String, u64), Vec<f64>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if let [op, bytes, ns] = f[..] {
            if let (Ok(b), Ok(n)) = (bytes.parse::<u64>(), ns.parse::<f64>()) {
                samples.entry((op.to_string(), b)).or_default().push(n);
            }
        }
    }
    Ok(samples
        .into_iter()
        .map(|(k, v)| (k, crate::summary::median(&v)))
        .collect())
}

/// The smallest size from which the bulk path is faster at that size and every larger one.
fn crossover(rows: &[&Row]) -> Option<u64> {
    let mut from = None;
    for r in rows.iter().rev() {
        if r.bulk_ns < r.inline_ns {
            from = Some(r.bytes);
        } else {
            break;
        }
    }
    from
}

fn show_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

fn show_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// `rackmem bench transfer`.
pub fn run(cfg: &TransferConfig) -> Result<Output, BenchError> {
    let max = cfg.sizes.iter().copied().max().unwrap_or(8);
    let mut targets = Vec::new();
    for l in &cfg.links {
        targets.push(target(l, max, &cfg.tmp, cfg.link_spin)?);
    }
    let (mpi_shm, mpi_tcp) = if cfg.mpi {
        (Some(mpi(cfg, false)?), Some(mpi(cfg, true)?))
    } else {
        (None, None)
    };
    let mut buf = vec![0x5au8; max as usize];
    let mut local = vec![0u8; max as usize];
    let mut rows = Vec::new();
    for t in &targets {
        for put in [true, false] {
            for &bytes in &cfg.sizes {
                let mut samples: BTreeMap<Way, Vec<f64>> = BTreeMap::new();
                let mut ways = [Way::Inline, Way::Bulk, Way::Engine, Way::Memcpy];
                for round in 0..cfg.rounds.max(1) {
                    ways.rotate_left(usize::from(round > 0));
                    for &w in &ways {
                        let ns = measure(t, w, put, bytes as usize, &mut buf, &mut local)?;
                        samples.entry(w).or_default().push(ns);
                    }
                }
                let m = |w: Way| crate::summary::median(&samples[&w]);
                let op = if put { "put" } else { "get" };
                let mpi_ns = match t.link.as_str() {
                    "shm" => mpi_shm.as_ref(),
                    "tcp" | "granted-tcp" => mpi_tcp.as_ref(),
                    _ => None,
                }
                .and_then(|m| m.get(&(op.to_string(), bytes)).copied());
                let (inline_ns, bulk_ns, engine_ns) = (m(Way::Inline), m(Way::Bulk), m(Way::Engine));
                rows.push(Row {
                    link: t.link.clone(),
                    op: op.into(),
                    bytes,
                    inline_ns,
                    bulk_ns,
                    engine_ns,
                    engine_vs_best: engine_ns / inline_ns.min(bulk_ns),
                    memcpy_ns: m(Way::Memcpy),
                    mpi_ns,
                });
            }
        }
    }
    let mut text = String::new();
    let mut summary = Vec::new();
    for t in &targets {
        let plan = t.seg.plan();
        for op in ["put", "get"] {
            let sel: Vec<&Row> = rows.iter().filter(|r| r.link == t.link && r.op == op).collect();
            let mut table = comfy_table::Table::new();
            table.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
            table.set_header(vec![
                "size",
                "inline",
                "bulk",
                "engine",
                "engine ÷ best",
                "memcpy",
                "MPI",
                "engine MiB/s",
            ]);
            for r in &sel {
                table.add_row(vec![
                    show_bytes(r.bytes),
                    show_ns(r.inline_ns),
                    show_ns(r.bulk_ns),
                    show_ns(r.engine_ns),
                    format!("{:.2}", r.engine_vs_best),
                    show_ns(r.memcpy_ns),
                    r.mpi_ns.map_or("-".into(), show_ns),
                    format!("{:.0}", r.bytes as f64 / r.engine_ns * 1e9 / (1 << 20) as f64),
                ]);
            }
            let worst = sel.iter().map(|r| r.engine_vs_best).fold(0.0, f64::max);
            let cross = crossover(&sel);
            text.push_str(&format!(
                "{} over {} (same run, medians of {} interleaved rounds; the machine may be shared)\n{table}\n\
                 crossover (bulk faster from): {}; calibrated threshold: {} (measured in {:?}); \
                 engine at worst {:.2} × the better path\n\n",
                op,
                t.link,
                cfg.rounds,
                cross.map_or("never".into(), show_bytes),
                {
                    let t = if op == "put" {
                        plan.put_threshold_bytes
                    } else {
                        plan.get_threshold_bytes
                    };
                    if t == u64::MAX {
                        "never bulk".into()
                    } else {
                        show_bytes(t)
                    }
                },
                plan.probe_time,
                worst,
            ));
            summary.push(serde_json::json!({
                "link": t.link, "op": op, "crossover_bytes": cross,
                "calibrated_threshold_bytes": if op == "put" { plan.put_threshold_bytes } else { plan.get_threshold_bytes },
                "calibration_us": plan.probe_time.as_micros() as u64,
                "engine_worst_vs_best": worst,
            }));
        }
    }
    Ok(Output {
        chart: Some(chart(&rows)),
        json: serde_json::json!({ "transfer": rows, "summary": summary }),
        text,
    })
}

/// Latency against size, log-log: one panel per operation, a line per link and path.
fn chart(rows: &[Row]) -> Chart {
    let panels = ["put", "get"]
        .into_iter()
        .map(|op| {
            let sel: Vec<&Row> = rows.iter().filter(|r| r.op == op).collect();
            let mut links: Vec<&str> = sel.iter().map(|r| r.link.as_str()).collect();
            links.dedup();
            let of = |l: &str, f: &dyn Fn(&Row) -> Option<f64>| -> Vec<(f64, f64)> {
                sel.iter()
                    .filter(|r| r.link == l)
                    .filter_map(|r| f(r).map(|v| (r.bytes as f64, v)))
                    .collect()
            };
            let mut lines = Vec::new();
            for &l in &links {
                let line = |label: String, points| Line { label, points };
                lines.push(line(format!("{l} inline"), of(l, &|r| Some(r.inline_ns))));
                lines.push(line(format!("{l} bulk"), of(l, &|r| Some(r.bulk_ns))));
                lines.push(line(format!("{l} engine"), of(l, &|r| Some(r.engine_ns))));
                let mpi = of(l, &|r| r.mpi_ns);
                if !mpi.is_empty() {
                    lines.push(line(format!("MPI ({l})"), mpi));
                }
            }
            if let Some(l) = links.first() {
                lines.push(Line {
                    label: "local memcpy".into(),
                    points: of(l, &|r| Some(r.memcpy_ns)),
                });
            }
            LinePanel {
                title: format!("rackmem_{op}: ns per operation against size (same run)"),
                x_desc: "bytes".into(),
                y_desc: "ns".into(),
                lines,
            }
        })
        .collect();
    Chart::Lines { panels }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(bytes: u64, inline_ns: f64, bulk_ns: f64) -> Row {
        Row {
            link: "tcp".into(),
            op: "get".into(),
            bytes,
            inline_ns,
            bulk_ns,
            engine_ns: inline_ns,
            engine_vs_best: 1.0,
            memcpy_ns: 1.0,
            mpi_ns: None,
        }
    }

    #[test]
    fn the_crossover_is_where_bulk_wins_for_good() {
        let rows = [
            row(8, 1.0, 2.0),
            row(64, 2.0, 1.0),
            row(512, 3.0, 4.0),
            row(4096, 9.0, 5.0),
        ];
        let refs: Vec<&Row> = rows.iter().collect();
        assert_eq!(crossover(&refs), Some(4096));
        let rows = [row(8, 1.0, 2.0)];
        assert_eq!(crossover(&rows.iter().collect::<Vec<_>>()), None);
    }
}
