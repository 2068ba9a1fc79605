//! `rackmem bench rates`: two clients sharing one managed brick, held by the brick to the
//! shares the control plane set (issue 26: "two programs sharing a brick whose rate is set to
//! half its measured capacity each get within 10% of their share").
//!
//! Each round has two halves, interleaved so that both see the same machine: first the brick's
//! capacity is measured (a brick that paces nothing, two clients reading as fast as it serves,
//! for `seconds`); then a brick that serves `fraction` of that capacity in total registers with
//! the control plane, which gives each of the two segments half, and the same two clients read
//! again as fast as they can for `seconds`. Each client's figure is what it moved divided by
//! its share. The clients speak the wire protocol directly and ignore every limit: only the
//! brick holds them back. Control plane and bricks run in this process, on TCP loopback.

use crate::{BenchError, Context, Output};
use rackmem_brick::{Brick, BrickConfig, BrickHandle, BrickLimits, ListenAddr};
use rackmem_control::api::{AllocationRequest, BrickRegistration, NodeRegistration, PortSpec};
use rackmem_control::client::Client;
use rackmem_control::heartbeat::{spawn_brick_heartbeat, BrickHeartbeat};
use rackmem_control::server::{spawn, ServerConfig, ServerHandle};
use rackmem_proto::Grant;
use rackmem_transport::{BrickAddr, Link};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// Each client's segment.
const SEGMENT: u64 = 64 * MIB;
/// The target: each client within 10% of its share.
const TARGET: f64 = 0.10;

/// What `bench rates` measures.
#[derive(Debug, Clone)]
pub struct RatesConfig {
    /// Rounds (capacity, then paced), interleaved.
    pub rounds: usize,
    /// Seconds each half of a round reads for.
    pub seconds: f64,
    /// The paced brick's total rate as a fraction of the capacity measured in the same round
    /// (each client's share is half of it).
    pub fraction: f64,
    /// Bytes per READ.
    pub request_bytes: u32,
}

#[derive(serde::Serialize)]
struct Round {
    /// Both clients together, unpaced (bytes/s).
    capacity_bps: f64,
    /// The paced brick's total (bytes/s).
    serve_bps: u64,
    /// Each segment's rate as the control plane set it.
    share_bps: Vec<u64>,
    /// What each client moved per second, paced.
    achieved_bps: Vec<f64>,
    /// `achieved / share`.
    ratio: Vec<f64>,
    /// Requests the paced brick delayed.
    delayed: u64,
}

pub(crate) struct Setup {
    pub(crate) server: ServerHandle,
    pub(crate) client: Client,
    pub(crate) token: String,
    pub(crate) node: u64,
}

/// A control plane in this process (SQLite in a temporary directory, heartbeats every 100 ms)
/// with one node registered.
pub(crate) fn serve() -> Result<Setup, BenchError> {
    let dir = std::env::temp_dir().join(format!("rackmem-bench-rates-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let url = format!("sqlite:{}", dir.join("control.db").display());
    let store = rackmem_control::store::open(&url).with_context(|| format!("opening the store {url}"))?;
    let token = rackmem_control::auth::new_admin_token().context("making an admin token")?;
    let mut cfg = ServerConfig::new(std::net::SocketAddr::from(([127, 0, 0, 1], 0)), store).with_admin_token(&token);
    cfg.heartbeat_interval = Duration::from_millis(100);
    let server = spawn(cfg).context("starting the control plane")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !server.leadership().serving() {
        if Instant::now() > deadline {
            return Err(BenchError::Workload(
                "the control plane did not start within a minute".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = Client::new(&[server.url()])
        .context("a client of the control plane")?
        .with_token(Some(token.clone()));
    let node = client
        .register_node(&NodeRegistration {
            name: "bench".into(),
            ports: vec![port("eth0")],
        })
        .context("registering the node")?
        .id;
    Ok(Setup {
        server,
        client,
        token,
        node,
    })
}

fn port(name: &str) -> PortSpec {
    PortSpec {
        name: name.into(),
        // Far above loopback: only the brick's memory rate binds.
        bandwidth_bps: 1 << 40,
        switch: None,
    }
}

/// A managed brick registered as `name`, serving `serve_bps` in total, with its heartbeat
/// applying the control plane's segment list and rates (as `rackmem brick --control` does).
pub(crate) fn brick(
    s: &Setup,
    name: &str,
    serve_bps: Option<u64>,
) -> Result<(BrickHandle, BrickHeartbeat, u64), BenchError> {
    // 64 hex characters, as `rackmem brick` keeps its key.
    let new_key = rackmem_control::client::new_idempotency_key;
    let key = format!("{}{}", new_key(), new_key()).into_bytes();
    let handle = Brick::start(BrickConfig {
        listen: ListenAddr::Tcp("127.0.0.1:0".into()),
        size_bytes: 4 * SEGMENT,
        key: key.clone(),
        secret: None,
        managed: true,
        limits: BrickLimits {
            serve_bps,
            ..BrickLimits::default()
        },
        tls: None,
    })
    .map_err(|e| BenchError::Brick(format!("starting brick {name}: {e}")))?;
    let manager = handle.manager();
    let hb = spawn_brick_heartbeat(
        Client::new(&[s.server.url()])
            .context("a client of the control plane")?
            .with_token(Some(s.token.clone())),
        BrickRegistration {
            name: name.into(),
            address: handle.local_addr(),
            capacity_bytes: 4 * SEGMENT,
            ports: vec![port("p0")],
            key_hex: hex::encode(&key),
            serve_bps,
        },
        Duration::from_millis(100),
        move |reply: &rackmem_control::api::HeartbeatReply, listed_at| {
            let segs = &reply.segments;
            let live: Vec<(u64, u64, u64)> = segs.iter().map(|s| (s.id, s.offset, s.size_bytes)).collect();
            manager.retain_segments_as_of(&live, listed_at);
            let rates: Vec<(u64, u64)> = segs.iter().map(|s| (s.id, s.rate_bps.unwrap_or(0))).collect();
            manager.set_rates_as_of(&rates, listed_at);
        },
    )
    .context("starting the heartbeat")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let id = loop {
        if let Some(id) = hb.brick_id() {
            break id;
        }
        if Instant::now() > deadline {
            return Err(BenchError::Workload(format!(
                "brick {name} did not register within 30 s"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok((handle, hb, id))
}

/// What a client needs to attach to an allocation's first segment: its brick's address, the
/// grant and the session key.
pub(crate) fn first_segment(a: &rackmem_control::api::Allocation) -> Result<(BrickAddr, Grant, [u8; 32]), BenchError> {
    let seg = a
        .segments
        .first()
        .ok_or_else(|| BenchError::Workload("an allocation without segments".into()))?;
    let addr: BrickAddr = seg.brick_address.parse().context("the brick's address")?;
    let grant = Grant::decode(&hex::decode(&seg.grant_hex).context("grant hex")?).context("the grant")?;
    let key: [u8; 32] = hex::decode(&seg.session_key_hex)
        .context("session key hex")?
        .try_into()
        .map_err(|_| BenchError::Workload("a session key of the wrong length".into()))?;
    Ok((addr, grant, key))
}

/// A segment as a client attaches to it: the brick's address, the grant, its session key, and
/// the rate the control plane set.
type Attachable = (BrickAddr, Grant, [u8; 32], u64);

/// Two allocations on brick `id`; returns their segments and the allocations' ids.
fn allocate_two(s: &Setup, id: u64) -> Result<(Vec<Attachable>, Vec<u64>), BenchError> {
    let mut out = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let a = s
            .client
            .allocate(&AllocationRequest {
                node: s.node,
                size_bytes: SEGMENT,
                bricks: Some(vec![id]),
                ..Default::default()
            })
            .context("allocating a segment")?;
        ids.push(a.id);
        out.push(first_segment(&a)?);
    }
    // The second allocation lowered the first segment's share: read the rates now.
    let rates = ids
        .iter()
        .map(|&id| {
            s.client
                .allocation(id)
                .map(|a| a.segments.first().map_or(0, |s| s.rate_limit_bps))
        })
        .collect::<Result<Vec<u64>, _>>()
        .context("reading the rates")?;
    Ok((
        out.into_iter()
            .zip(&rates)
            .map(|((a, g, k), &r)| (a, g, k, r))
            .collect(),
        ids,
    ))
}

/// Attaches, fills the segment once (untimed), then reads it in `request` bytes per READ
/// for `seconds`; returns bytes per second read.
fn flood(addr: &BrickAddr, grant: &Grant, key: &[u8; 32], request: u32, seconds: f64) -> Result<f64, BenchError> {
    let link = Link::connect(addr, Duration::from_secs(30)).context("connecting to the brick")?;
    link.attach(grant, key).context("attaching")?;
    let fill = vec![0x5au8; 4 * MIB as usize];
    for off in (0..SEGMENT).step_by(fill.len()) {
        link.write_pages(&[(off, fill.len() as u32)], &fill)
            .context("filling")?;
    }
    let mut buf = vec![0u8; request as usize];
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(seconds);
    let mut read = 0u64;
    while Instant::now() < until {
        let off = read % SEGMENT;
        link.read_pages(&[(off, request)], &mut buf).context("reading")?;
        read += u64::from(request);
    }
    Ok(read as f64 / start.elapsed().as_secs_f64())
}

/// Both clients at once; their rates.
fn both(segs: &[Attachable], request: u32, seconds: f64) -> Result<Vec<f64>, BenchError> {
    std::thread::scope(|sc| {
        let hs: Vec<_> = segs
            .iter()
            .map(|(a, g, k, _)| sc.spawn(move || flood(a, g, k, request, seconds)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(BenchError::Workload("a client panicked".into())))
            })
            .collect()
    })
}

/// Waits until `h` paces both segments at the control plane's rates (a heartbeat away).
fn wait_for_rates(h: &BrickHandle, want: &[(u64, u64)]) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = h.pace_stats();
        if want
            .iter()
            .all(|&(id, r)| st.segments.iter().any(|s| s.segment_id == id && s.rate_bps == r))
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(BenchError::Workload(format!(
                "the brick never paced at the control plane's rates {want:?}: {st:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn round(s: &Setup, n: usize, a: &RatesConfig) -> Result<Round, BenchError> {
    // Capacity: a brick that paces nothing.
    let (free, hb, id) = brick(s, &format!("free{n}"), None)?;
    let (segs, ids) = allocate_two(s, id)?;
    let capacity_bps: f64 = both(&segs, a.request_bytes, a.seconds)?.iter().sum();
    for id in ids {
        s.client.free(id).context("releasing")?;
    }
    hb.stop();
    free.shutdown();

    let serve_bps = (capacity_bps * a.fraction) as u64;
    let (paced, hb, id) = brick(s, &format!("paced{n}"), Some(serve_bps))?;
    let (segs, ids) = allocate_two(s, id)?;
    let want: Vec<(u64, u64)> = segs.iter().map(|(_, g, _, r)| (g.segment_id, *r)).collect();
    wait_for_rates(&paced, &want)?;
    let achieved_bps = both(&segs, a.request_bytes, a.seconds)?;
    let delayed = paced.pace_stats().delayed;
    for id in ids {
        s.client.free(id).context("releasing")?;
    }
    hb.stop();
    paced.shutdown();
    let share_bps: Vec<u64> = segs.iter().map(|(_, _, _, r)| *r).collect();
    let ratio = achieved_bps
        .iter()
        .zip(&share_bps)
        .map(|(got, &share)| got / share.max(1) as f64)
        .collect();
    Ok(Round {
        capacity_bps,
        serve_bps,
        share_bps,
        achieved_bps,
        ratio,
        delayed,
    })
}

/// Runs `bench rates`.
pub fn run(a: &RatesConfig) -> Result<Output, BenchError> {
    if a.rounds == 0 || a.seconds <= 0.0 || !(a.fraction > 0.0 && a.fraction <= 1.0) || a.request_bytes == 0 {
        return Err(BenchError::Config(
            "--rounds and --seconds must be positive, --fraction in (0, 1], --request positive".into(),
        ));
    }
    if !a.request_bytes.is_multiple_of(4096) || u64::from(a.request_bytes) > SEGMENT {
        return Err(BenchError::Config(format!(
            "--request {} must be whole pages and at most {SEGMENT} bytes",
            a.request_bytes
        )));
    }
    let s = serve()?;
    let mut rounds = Vec::with_capacity(a.rounds);
    for n in 0..a.rounds {
        rounds.push(round(&s, n, a)?);
    }
    let _ = s.server.stop();
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("rackmem-bench-rates-{}", std::process::id())));

    let worst = rounds
        .iter()
        .flat_map(|r| r.ratio.iter())
        .map(|x| (x - 1.0).abs())
        .fold(0.0f64, f64::max);
    let met = worst <= TARGET;
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "round",
        "capacity MiB/s",
        "brick serves MiB/s",
        "share MiB/s",
        "client A MiB/s",
        "client B MiB/s",
        "A ÷ share",
        "B ÷ share",
        "delayed",
    ]);
    let mib = |x: f64| format!("{:.1}", x / MIB as f64);
    let mut bars = Vec::new();
    for (i, r) in rounds.iter().enumerate() {
        t.add_row(vec![
            i.to_string(),
            mib(r.capacity_bps),
            mib(r.serve_bps as f64),
            r.share_bps
                .iter()
                .map(|&x| mib(x as f64))
                .collect::<Vec<_>>()
                .join(" / "),
            mib(r.achieved_bps[0]),
            mib(r.achieved_bps[1]),
            format!("{:.3}", r.ratio[0]),
            format!("{:.3}", r.ratio[1]),
            r.delayed.to_string(),
        ]);
        for (c, x) in ["client A", "client B"].iter().zip(&r.ratio) {
            bars.push(crate::chart::Bar {
                group: format!("round {i}"),
                label: (*c).to_string(),
                fraction: *x,
            });
        }
    }
    let text = format!(
        "Two clients that ignore their limits on one brick serving {:.0}% of its measured capacity \
         (each share half of it), {} rounds of {} s, {} KiB READs, loopback TCP (same run)\n{t}\n\
         target (each client within {:.0}% of its share): {} (worst {:.1}%)\n",
        a.fraction * 100.0,
        a.rounds,
        a.seconds,
        a.request_bytes / 1024,
        TARGET * 100.0,
        if met { "met" } else { "NOT met" },
        worst * 100.0
    );
    Ok(Output {
        text,
        chart: Some(crate::chart::fractions(
            "Rates the brick enforces: each client's throughput ÷ its share",
            bars,
        )),
        json: serde_json::json!({
            "rates": {
                "rounds": rounds,
                "seconds": a.seconds,
                "fraction": a.fraction,
                "request_bytes": a.request_bytes,
                "worst_deviation": worst,
                "target": TARGET,
                "target_met": met,
            }
        }),
    })
}
