//! `rackmem bench control`: allocation and release latency and throughput of a real control plane
//! over HTTP, per store, beside a floor measured on the same server in the same run (the
//! `GET /healthz` round trip: HTTP and the server's request path without the plane or the store).
//!
//! For each store it starts a control plane on a free loopback port (etcd: a throwaway etcd
//! server too), registers the bricks and nodes and fills the live allocations through the REST
//! API, then times `samples` allocations back to back (each against that many live ones), the
//! release of those same allocations, and `samples` health checks.

use crate::{BenchError, Context, Output, Summary};
use rackmem_control::api::{AllocationRequest, BrickRegistration, NodeRegistration, PortSpec};
use rackmem_control::client::Client;
use rackmem_control::server::{spawn, ServerConfig, ServerHandle};
use std::path::Path;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// The target for one allocation with SQLite.
const TARGET_P99_US: f64 = 5000.0;
/// Nodes the allocations are spread over.
const NODES: usize = 100;
/// The target for one circuit set up and applied.
const CIRCUIT_TARGET_US: f64 = 100_000.0;

/// What `bench control` measures.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    /// Bricks in the resource graph (64 GiB each, registered through the API).
    pub bricks: usize,
    /// Live allocations while measuring (1 to 64 MiB, striped over 1 to 4 bricks).
    pub allocations: usize,
    /// Allocations, releases and floor round trips timed per store.
    pub samples: usize,
    /// Stores to measure: `sqlite`, `etcd` (skipped, with why, when this build or machine
    /// cannot run it).
    pub stores: Vec<String>,
}

/// The figures of one store.
#[derive(serde::Serialize)]
struct StoreResult {
    store: String,
    /// Why it was not measured.
    skipped: Option<String>,
    fill_seconds: f64,
    allocate: Summary,
    release: Summary,
    floor: Summary,
    allocations_per_s: f64,
    releases_per_s: f64,
    allocate_p50_vs_floor: f64,
    allocate_p99_vs_floor: f64,
    /// SQLite only: the target, p99 of one allocation under 5 ms.
    target_p99_us: Option<f64>,
    target_met: Option<bool>,
    /// A circuit set up (POST /v1/allocations with circuit: true, the switch driver's update
    /// included) and released, one at a time, beside the same live allocations.
    circuit: Summary,
    circuit_release: Summary,
    /// The target: a circuit set up and applied in under 100 ms (p99).
    circuit_target_met: Option<bool>,
}

impl StoreResult {
    fn skipped(store: &str, why: String) -> StoreResult {
        StoreResult {
            store: store.to_string(),
            skipped: Some(why),
            fill_seconds: 0.0,
            allocate: Summary::default(),
            release: Summary::default(),
            floor: Summary::default(),
            allocations_per_s: 0.0,
            releases_per_s: 0.0,
            allocate_p50_vs_floor: 0.0,
            allocate_p99_vs_floor: 0.0,
            target_p99_us: None,
            target_met: None,
            circuit: Summary::default(),
            circuit_release: Summary::default(),
            circuit_target_met: None,
        }
    }
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Why the etcd store cannot be measured by this binary on this machine, if so.
fn etcd_unavailable() -> Option<String> {
    if !cfg!(feature = "etcd") {
        return Some("this rackmem was built without the cargo feature `etcd`".to_string());
    }
    if rackmem_control::etcd_server::binary().is_none() {
        return Some("no etcd binary on PATH (Debian: apt-get install etcd-server)".to_string());
    }
    None
}

/// Starts the control plane on `url` and waits until it serves (an etcd replica campaigns first).
fn serve(url: &str) -> Result<(ServerHandle, Client), BenchError> {
    let store = rackmem_control::store::open(url).with_context(|| format!("opening the store {url}"))?;
    // Requests carry a token as in production: its check is part of each latency measured.
    let token = rackmem_control::auth::new_admin_token().context("making an admin token")?;
    let mut cfg = ServerConfig::new(std::net::SocketAddr::from(([127, 0, 0, 1], 0)), store).with_admin_token(&token);
    // No brick sends heartbeats here: none may be marked down while the graph fills.
    cfg.brick_timeout = Duration::from_secs(7 * 24 * 3600);
    let server = spawn(cfg).context("starting the control plane")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !server.leadership().serving() {
        if Instant::now() > deadline {
            return Err(BenchError::Workload(format!(
                "the control plane on {url} did not become leader within a minute"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = Client::new(&[server.url()])
        .context("a client of the control plane")?
        .with_token(Some(token));
    Ok((server, client))
}

fn measure(store: &str, url: &str, a: &ControlConfig, pb: &indicatif::ProgressBar) -> Result<StoreResult, BenchError> {
    let (server, client) = serve(url)?;
    let port = |name: &str| PortSpec {
        name: name.into(),
        bandwidth_bps: 100_000_000_000,
        switch: None,
    };
    let fill = Instant::now();
    pb.set_message(format!("{store}: registering {} bricks", a.bricks));
    for i in 0..a.bricks {
        client
            .register_brick(&BrickRegistration {
                name: format!("b{i}"),
                address: format!("tcp://10.{}.{}.{}:7070", i >> 16, (i >> 8) & 0xff, i & 0xff),
                capacity_bytes: 64 << 30,
                ports: vec![port("p0")],
                key_hex: hex::encode((i as u64).to_le_bytes().repeat(4)),
                serve_bps: None,
            })
            .with_context(|| format!("registering brick {i}"))?;
        pb.inc(1);
    }
    let nodes = (0..NODES)
        .map(|i| {
            client
                .register_node(&NodeRegistration {
                    name: format!("n{i}"),
                    ports: vec![port("eth0")],
                })
                .map(|r| r.id)
        })
        .collect::<Result<Vec<u64>, _>>()
        .context("registering nodes")?;
    let request = |i: usize| AllocationRequest {
        node: nodes[i % NODES],
        size_bytes: (1 + (i as u64) % 64) * MIB,
        stripe: Some(1 + (i % 4) as u32),
        ..Default::default()
    };
    pb.set_message(format!("{store}: {} live allocations", a.allocations));
    for i in 0..a.allocations {
        client
            .allocate(&request(i))
            .with_context(|| format!("filling: allocation {i}"))?;
        pb.inc(1);
    }
    let fill_seconds = fill.elapsed().as_secs_f64();

    pb.set_message(format!("{store}: timing"));
    let mut alloc_ns = Vec::with_capacity(a.samples);
    let mut ids = Vec::with_capacity(a.samples);
    let t = Instant::now();
    for i in 0..a.samples {
        let s = Instant::now();
        let r = client
            .allocate(&request(a.allocations + i))
            .context("timed allocation")?;
        alloc_ns.push(ns(s.elapsed()));
        ids.push(r.id);
    }
    let alloc_wall = t.elapsed().as_secs_f64();
    let mut release_ns = Vec::with_capacity(a.samples);
    let t = Instant::now();
    for id in ids {
        let s = Instant::now();
        client.free(id).context("timed release")?;
        release_ns.push(ns(s.elapsed()));
    }
    let release_wall = t.elapsed().as_secs_f64();
    let (circuit_ns, circuit_release_ns) = time_circuits(&client, a.samples, &port)?;
    let mut floor_ns = Vec::with_capacity(a.samples);
    for _ in 0..a.samples {
        let s = Instant::now();
        client.health().context("floor: GET /healthz")?;
        floor_ns.push(ns(s.elapsed()));
    }
    server.stop().context("stopping the control plane")?;

    let allocate = Summary::from_ns(&format!("{store}: allocate (POST /v1/allocations)"), alloc_ns);
    let release = Summary::from_ns(&format!("{store}: release (DELETE /v1/allocations/ID)"), release_ns);
    let floor = Summary::from_ns(&format!("{store}: floor (GET /healthz)"), floor_ns);
    let circuit = Summary::from_ns(&format!("{store}: circuit (POST, circuit: true)"), circuit_ns);
    let circuit_release = Summary::from_ns(&format!("{store}: circuit release"), circuit_release_ns);
    let per_s = |n: usize, wall: f64| if wall > 0.0 { n as f64 / wall } else { 0.0 };
    let sqlite = store == "sqlite";
    Ok(StoreResult {
        store: store.to_string(),
        skipped: None,
        fill_seconds,
        allocations_per_s: per_s(a.samples, alloc_wall),
        releases_per_s: per_s(a.samples, release_wall),
        allocate_p50_vs_floor: allocate.p50_us / floor.p50_us.max(f64::MIN_POSITIVE),
        allocate_p99_vs_floor: allocate.p99_us / floor.p99_us.max(f64::MIN_POSITIVE),
        target_p99_us: sqlite.then_some(TARGET_P99_US),
        target_met: sqlite.then_some(allocate.p99_us < TARGET_P99_US),
        circuit_target_met: Some(circuit.p99_us < CIRCUIT_TARGET_US),
        circuit,
        circuit_release,
        allocate,
        release,
        floor,
    })
}

/// Times `samples` circuits set up and released one after the other, between a node and a
/// brick registered for them (their ports held by no other segment), through the control
/// plane's switch driver (the default, dry-run: the control plane's own share of the time).
fn time_circuits(
    client: &Client,
    samples: usize,
    port: &dyn Fn(&str) -> PortSpec,
) -> Result<(Vec<u64>, Vec<u64>), BenchError> {
    let brick = client
        .register_brick(&BrickRegistration {
            name: "circuit-brick".into(),
            address: "tcp://10.255.255.1:7070".into(),
            capacity_bytes: 64 << 30,
            ports: vec![port("p0")],
            key_hex: hex::encode([0xc1u8; 32]),
            serve_bps: None,
        })
        .context("registering the circuits' brick")?
        .id;
    let node = client
        .register_node(&NodeRegistration {
            name: "circuit-node".into(),
            ports: vec![port("eth0")],
        })
        .context("registering the circuits' node")?
        .id;
    let (mut up, mut down) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    for _ in 0..samples {
        let s = Instant::now();
        let c = client
            .allocate(&AllocationRequest {
                node,
                size_bytes: MIB,
                bricks: Some(vec![brick]),
                circuit: Some(true),
                ..Default::default()
            })
            .context("timed circuit")?;
        up.push(ns(s.elapsed()));
        let s = Instant::now();
        client.free(c.id).context("timed circuit release")?;
        down.push(ns(s.elapsed()));
    }
    Ok((up, down))
}

/// Measures every store in turn, in a directory of its own under `tmp`.
fn measure_all(a: &ControlConfig, tmp: &Path) -> Result<Vec<StoreResult>, BenchError> {
    let mut results = Vec::new();
    for store in &a.stores {
        let dir = tmp.join(store);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // The etcd server lives as long as its measurement.
        let (url, etcd) = if store == "etcd" {
            if let Some(why) = etcd_unavailable() {
                eprintln!("rackmem bench control: etcd skipped: {why}");
                results.push(StoreResult::skipped(store, why));
                continue;
            }
            let e = rackmem_control::etcd_server::EtcdServer::start(&dir.join("etcd")).context("starting etcd")?;
            (e.store_url(), Some(e))
        } else {
            (format!("sqlite:{}", dir.join("control.db").display()), None)
        };
        let pb = crate::progress::bar((a.bricks + a.allocations) as u64);
        let r = measure(store, &url, a, &pb);
        pb.finish_and_clear();
        drop(etcd);
        results.push(r.with_context(|| format!("measuring the {store} store"))?);
    }
    Ok(results)
}

/// Runs `bench control`.
pub fn run(a: &ControlConfig) -> Result<Output, BenchError> {
    if a.bricks == 0 || a.samples == 0 {
        return Err(BenchError::Config("--bricks and --samples must be positive".into()));
    }
    for s in &a.stores {
        if s != "sqlite" && s != "etcd" {
            return Err(BenchError::Config(format!("unknown store {s:?}: use sqlite, etcd")));
        }
    }
    let tmp = std::env::temp_dir().join(format!("rackmem-bench-control-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let results = measure_all(a, &tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    let results = results?;

    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "store",
        "operation",
        "samples",
        "p50 µs",
        "p99 µs",
        "mean µs",
        "ops/s",
        "p50 vs floor",
    ]);
    let mut bars = Vec::new();
    for r in &results {
        if let Some(why) = &r.skipped {
            t.add_row(vec![r.store.clone(), format!("skipped: {why}")]);
            continue;
        }
        for (op, s, rate) in [
            ("allocate", &r.allocate, Some(r.allocations_per_s)),
            ("release", &r.release, Some(r.releases_per_s)),
            ("circuit set up", &r.circuit, None),
            ("circuit release", &r.circuit_release, None),
            ("floor: GET /healthz", &r.floor, None),
        ] {
            t.add_row(vec![
                r.store.clone(),
                op.to_string(),
                s.samples.to_string(),
                format!("{:.0}", s.p50_us),
                format!("{:.0}", s.p99_us),
                format!("{:.0}", s.mean_us),
                rate.map_or_else(String::new, |v| format!("{v:.0}")),
                format!("{:.1}×", s.p50_us / r.floor.p50_us.max(f64::MIN_POSITIVE)),
            ]);
            bars.push(crate::chart::LatencyBar {
                label: s.name.clone(),
                p50_us: s.p50_us,
                p99_us: s.p99_us,
            });
        }
    }
    let mut text = format!(
        "Control plane over HTTP: {} bricks, {} live allocations, {} samples (same run)\n{t}\n",
        a.bricks, a.allocations, a.samples
    );
    for r in results.iter().filter(|r| r.target_met.is_some()) {
        text += &format!(
            "target (p99 of one allocation with {} < {TARGET_P99_US:.0} µs): {} (p99 {:.0} µs)\n",
            r.store,
            if r.target_met == Some(true) { "met" } else { "NOT met" },
            r.allocate.p99_us
        );
    }
    for r in results.iter().filter(|r| r.circuit_target_met.is_some()) {
        text += &format!(
            "target (p99 of one circuit set up and applied with {} < {:.0} ms): {} (p99 {:.0} µs)\n",
            r.store,
            CIRCUIT_TARGET_US / 1000.0,
            if r.circuit_target_met == Some(true) {
                "met"
            } else {
                "NOT met"
            },
            r.circuit.p99_us
        );
    }
    let title = format!(
        "Control plane: allocation and release over HTTP, {} bricks, {} live allocations (same run)",
        a.bricks, a.allocations
    );
    Ok(Output {
        text,
        chart: Some(crate::chart::latencies(&title, bars)),
        json: serde_json::json!({
            "control": {
                "bricks": a.bricks,
                "allocations": a.allocations,
                "samples": a.samples,
                "results": results,
            }
        }),
    })
}
