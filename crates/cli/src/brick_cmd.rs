//! `rackmem brick`: serve memory.

use crate::values::{parse_port, parse_size_arg};
use anyhow::{bail, Context, Result};
use clap::Args;
use rackmem_brick::{Brick, BrickConfig, BrickLimits, ListenAddr};
use rackmem_control::api::{BrickRegistration, LiveSegment, PortSpec};
use rackmem_runtime::size::format_size;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args)]
pub struct BrickArgs {
    /// Where to listen: tcp://HOST:PORT, tls://HOST:PORT or unix:PATH. tls:// serves the same
    /// protocol inside TLS, with the certificate of --tls-cert and --tls-key: nodes verify it
    /// against the CA given to them (rackmem run --tls-ca, RACKMEM_TLS_CA), and it must name the
    /// host they connect to. Shared memory is not offered over TLS.
    #[arg(long, value_name = "ADDR")]
    listen: String,
    /// PEM certificate chain a tls:// brick presents (its first certificate names this host as
    /// nodes reach it: DNS name or IP address).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Size of the pool this brick lends (lazily backed: memory is used only when written).
    #[arg(long, value_name = "SIZE", default_value = "4GiB", value_parser = parse_size_arg)]
    size: u64,
    /// Shared secret a node must present to carve a segment (standalone mode, no control plane).
    #[arg(
        long,
        value_name = "SECRET",
        env = rackmem_runtime::config::env::SECRET,
        hide_env_values = true,
        conflicts_with = "secret_file"
    )]
    secret: Option<String>,
    /// File holding the shared secret (first line).
    #[arg(long, value_name = "PATH")]
    secret_file: Option<std::path::PathBuf>,
    /// File holding the key grants are signed with (created with a random key if absent). A
    /// managed brick re-registers under its name only with the same key; with --control and
    /// --name and no --key-file, the key is kept in $XDG_STATE_HOME/rackmem/brick-NAME.key
    /// (else ~/.local/state/rackmem/brick-NAME.key).
    #[arg(long, value_name = "PATH")]
    key_file: Option<std::path::PathBuf>,
    /// Control plane URL(s), comma-separated: register there, send heartbeats, and serve the
    /// segments it grants (a managed brick). Without it the brick is standalone.
    #[arg(long, value_name = "URL[,URL...]")]
    control: Option<String>,
    #[command(flatten)]
    auth: crate::client_args::ControlAuthArgs,
    /// Name to register under, unique in the control plane (default: HOSTNAME-PORT). The name is
    /// bound to the brick's key: keep --key-file across restarts.
    #[arg(long, value_name = "NAME", requires = "control")]
    name: Option<String>,
    /// A port of this brick: NAME:RATE[:SWITCH], rate in bytes/s; repeatable. Default: one port
    /// `p0:10GB/s` on the switch the control plane's topology gives it (else `rack`).
    #[arg(long = "port", value_name = "NAME:RATE[:SWITCH]", value_parser = parse_port, requires = "control")]
    ports: Vec<PortSpec>,
    /// What this brick's memory serves, in bytes/s, READ and WRITE together (e.g. 4GB/s):
    /// the brick holds its total to it, and registers it so the control plane sets the
    /// segments' rates to add up to at most this. `probe` measures it at start (the best of a
    /// few 32 MiB copies; on a busy host it reads low, and everything served is held to it).
    /// `none` (the default) leaves the total unpaced and the segments' rates bound by the ports
    /// alone; a managed brick still holds each segment to the rate the control plane set.
    #[arg(long, value_name = "RATE|probe|none", default_value = "none", value_parser = parse_serve_rate)]
    serve_rate: ServeRate,
    /// Milliseconds between heartbeats to the control plane.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=600_000))]
    heartbeat_ms: u64,
    /// Address nodes reach this brick at, as registered (default: the listening address, with
    /// this host's name when listening on all interfaces).
    #[arg(long, value_name = "ADDR", requires = "control")]
    advertise: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. `127.0.0.1:9102`): pool and
    /// segments, bytes each way, requests and a latency histogram per opcode, connections, and
    /// what the brick's limits refused. Scrapers are held on one thread, 64 at most, 2 s each
    /// to send their request; bind it where only your monitoring reaches (it has no token).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Most authenticated connections served at once. A program uses two per brick it has
    /// memory on; an ALLOC or ATTACH beyond the limit is told why (`Busy`) and its connection
    /// closed, and the brick goes on serving the others. Each costs a thread and two
    /// descriptors (the brick raises its open-files limit as far as the hard limit allows).
    /// Connections still authenticating are held apart, without a thread (--max-handshakes).
    #[arg(long, value_name = "N", default_value_t = BrickLimits::default().max_connections,
          value_parser = parse_count)]
    max_connections: usize,
    /// Most connections at once from one IP address (TCP; Unix-socket peers count towards the
    /// totals only), counted apart among authenticating and authenticated connections, so
    /// that one host cannot take every slot. Raise it for nodes that run more than about 100
    /// programs at once.
    #[arg(long, value_name = "N", default_value_t = BrickLimits::default().max_connections_per_peer,
          value_parser = parse_count)]
    max_connections_per_peer: usize,
    /// As --max-connections-per-peer, for all the addresses of one network (--peer-prefix-v4,
    /// --peer-prefix-v6): rotating source addresses does not lift the cap.
    #[arg(long, value_name = "N", default_value_t = BrickLimits::default().max_connections_per_prefix,
          value_parser = parse_count)]
    max_connections_per_prefix: usize,
    /// Leading bits of an IPv4 address that name its network, for the per-prefix caps and
    /// authentication throttles.
    #[arg(long, value_name = "BITS", default_value_t = BrickLimits::default().peer_prefix.v4,
          value_parser = clap::value_parser!(u8).range(0..=32))]
    peer_prefix_v4: u8,
    /// Leading bits of an IPv6 address that name its network.
    #[arg(long, value_name = "BITS", default_value_t = BrickLimits::default().peer_prefix.v6,
          value_parser = clap::value_parser!(u8).range(0..=128))]
    peer_prefix_v6: u8,
    /// Most connections held at once while they authenticate (HELLO to a successful ALLOC or
    /// ATTACH), on one thread with epoll, a descriptor and a few hundred bytes each; when it is
    /// reached the connection that has waited longest is closed to admit the new one. Lowered
    /// to fit the open-files limit.
    #[arg(long, value_name = "N", default_value_t = BrickLimits::default().max_handshakes,
          value_parser = parse_count)]
    max_handshakes: usize,
    /// Milliseconds a new connection has to authenticate (ALLOC with the secret, or ATTACH with
    /// a grant) before it is closed, TLS handshake included on tls://: bounds what silent or slow
    /// connections hold.
    #[arg(long, value_name = "MS", default_value_t = BrickLimits::default().handshake_timeout.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(100..=600_000))]
    handshake_timeout_ms: u64,
    /// Seconds an authenticated connection may stay silent before it is closed (0: never).
    /// Programs ping their links after 60 s without requests (RACKMEM_KEEPALIVE_MS), so only
    /// dead or hung peers reach it; below 120 s, programs need a shorter RACKMEM_KEEPALIVE_MS.
    #[arg(long, value_name = "S", default_value_t = BrickLimits::default().idle_timeout.map_or(0, |t| t.as_secs()))]
    idle_timeout_s: u64,
    /// Milliseconds one response may take to leave: a client that stops reading is
    /// disconnected after this.
    #[arg(long, value_name = "MS", default_value_t = BrickLimits::default().send_timeout.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(100..=600_000))]
    send_timeout_ms: u64,
    /// Failed authentications (wrong secret, forged or unproven grant) from one address that
    /// are answered at once. After them each further check from that address waits its turn,
    /// spaced by a delay that doubles with every failure up to --auth-delay-max-ms, and an
    /// attempt whose turn is further away than that is refused unchecked (`Busy`). A success
    /// forgives the address; so do 10 minutes without failures.
    #[arg(long, value_name = "N", default_value_t = BrickLimits::default().auth_failures_free)]
    auth_failures_free: u32,
    /// As --auth-failures-free, for all the addresses of one network together: failures spread
    /// over many addresses of a prefix are slowed down as if they came from one. A success
    /// forgives its address, not its network.
    #[arg(long, value_name = "N", default_value_t = BrickLimits::default().auth_failures_free_per_prefix)]
    auth_failures_free_per_prefix: u32,
    /// The first delay after --auth-failures-free failures, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = BrickLimits::default().auth_delay.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    auth_delay_ms: u64,
    /// The longest delay, and how far ahead a check may be scheduled, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = BrickLimits::default().auth_delay_max.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    auth_delay_max_ms: u64,
}

/// A connection count: 1 to a million.
fn parse_count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if (1..=1_000_000).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a count from 1 to 1000000")),
    }
}

impl BrickArgs {
    /// The limits the options ask for.
    fn limits(&self) -> Result<BrickLimits> {
        if self.auth_delay_max_ms < self.auth_delay_ms {
            bail!(
                "--auth-delay-max-ms {} is below --auth-delay-ms {}: the longest delay cannot be shorter than the first",
                self.auth_delay_max_ms,
                self.auth_delay_ms
            );
        }
        let every = rackmem_transport::KEEPALIVE_INTERVAL.as_secs();
        if self.idle_timeout_s != 0 && self.idle_timeout_s < 2 * every {
            eprintln!(
                "rackmem brick: warning: --idle-timeout-s {} closes the links of programs idle for \
                 longer, unless they run with RACKMEM_KEEPALIVE_MS below {} (default {} s); 0 \
                 (never) or {} and more suit the default",
                self.idle_timeout_s,
                self.idle_timeout_s * 1000 / 2,
                every,
                2 * every
            );
        }
        Ok(BrickLimits {
            max_connections: self.max_connections,
            max_connections_per_peer: self.max_connections_per_peer,
            max_connections_per_prefix: self.max_connections_per_prefix,
            peer_prefix: rackmem_sys::PrefixLen {
                v4: self.peer_prefix_v4,
                v6: self.peer_prefix_v6,
            },
            max_handshakes: self.max_handshakes,
            handshake_timeout: Duration::from_millis(self.handshake_timeout_ms),
            idle_timeout: (self.idle_timeout_s > 0).then(|| Duration::from_secs(self.idle_timeout_s)),
            send_timeout: Duration::from_millis(self.send_timeout_ms),
            auth_failures_free: self.auth_failures_free,
            auth_failures_free_per_prefix: self.auth_failures_free_per_prefix,
            auth_delay: Duration::from_millis(self.auth_delay_ms),
            auth_delay_max: Duration::from_millis(self.auth_delay_max_ms),
            // Set by `run` from --serve-rate (the probe runs only when the brick starts).
            serve_bps: None,
        })
    }
}

/// The port a brick registers when none is given: 10 GB/s, a common NIC.
const DEFAULT_PORT: &str = "p0:10GB/s";

/// This machine's host name (the default name of a brick or a node).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// Registration names allow letters, digits, `-`, `_` and `.`.
fn sanitize_name(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect()
}

/// What the brick registers: its address as nodes reach it, and a name.
fn advertised(local_addr: &str) -> (String, String) {
    let scheme = &local_addr[..local_addr.len().min(6)];
    if let Some(hp) = local_addr
        .strip_prefix("tcp://")
        .or_else(|| local_addr.strip_prefix("tls://"))
    {
        if let Some((host, port)) = hp.rsplit_once(':') {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let reachable = if host == "0.0.0.0" || host == "::" {
                hostname()
            } else {
                host.to_string()
            };
            let shown = if reachable.contains(':') {
                format!("[{reachable}]")
            } else {
                reachable
            };
            return (
                format!("{scheme}{shown}:{port}"),
                sanitize_name(&format!("{}-{port}", hostname())),
            );
        }
    }
    let base = local_addr.rsplit('/').next().unwrap_or("brick");
    (local_addr.to_string(), sanitize_name(&format!("{}-{base}", hostname())))
}

/// What the brick does with the segments the control plane lists in each heartbeat reply:
/// (segment id, offset, size).
fn on_live_segments(live: &[(u64, u64, u64)], dropped: &[u64], last_count: &mut Option<usize>) {
    if !dropped.is_empty() {
        eprintln!("rackmem brick: released segments {dropped:?}: the control plane no longer lists them");
    }
    if *last_count != Some(live.len()) {
        eprintln!("rackmem brick: the control plane lists {} live segments", live.len());
        *last_count = Some(live.len());
    }
}

/// `--serve-rate`.
#[derive(Debug, Clone, Copy)]
enum ServeRate {
    Probe,
    Unpaced,
    Bps(u64),
}

fn parse_serve_rate(s: &str) -> Result<ServeRate, String> {
    match s.trim() {
        "probe" => Ok(ServeRate::Probe),
        "none" => Ok(ServeRate::Unpaced),
        r => match crate::values::parse_rate(r)? {
            0 => Err("--serve-rate 0 would serve nothing: give a rate, probe or none".to_string()),
            b => Ok(ServeRate::Bps(b)),
        },
    }
}

pub fn read_secret(secret: Option<String>, file: Option<&std::path::Path>) -> Result<Option<Vec<u8>>> {
    if let Some(s) = secret {
        return Ok(Some(s.into_bytes()));
    }
    let Some(path) = file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the secret file {}", path.display()))?;
    let line = text.lines().next().unwrap_or("").trim().to_string();
    if line.is_empty() {
        bail!("the secret file {} is empty", path.display());
    }
    Ok(Some(line.into_bytes()))
}

pub fn random_hex(bytes: usize) -> Result<String> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("no randomness from the OS: {e}"))?;
    Ok(hex::encode(b))
}

fn load_key(path: Option<&std::path::Path>) -> Result<Vec<u8>> {
    let Some(path) = path else {
        return Ok(random_hex(32)?.into_bytes());
    };
    match std::fs::read_to_string(path) {
        Ok(k) if !k.trim().is_empty() => Ok(k.trim().as_bytes().to_vec()),
        Ok(_) => bail!("the key file {} is empty", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let k = random_hex(32)?;
            // Written whole to a file of its own, then linked into place (a link fails if the
            // name exists): a brick of the same name starting at the same moment reads either
            // nothing or the whole key, never an empty file. Readable by the brick's user only:
            // the key signs grants.
            let tmp = path.with_extension(format!("key.{}.{}", std::process::id(), random_hex(4)?));
            let written = {
                use std::os::unix::fs::OpenOptionsExt as _;
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&tmp)
                    .and_then(|mut f| std::io::Write::write_all(&mut f, format!("{k}\n").as_bytes()))
            };
            let linked = written.and_then(|()| std::fs::hard_link(&tmp, path));
            let _ = std::fs::remove_file(&tmp);
            match linked {
                Ok(()) => Ok(k.into_bytes()),
                // Another brick of the same name made it meanwhile: use its key.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => load_key(Some(path)),
                Err(e) => Err(e).with_context(|| format!("creating the key file {}", path.display())),
            }
        }
        Err(e) => Err(e).with_context(|| format!("reading the key file {}", path.display())),
    }
}

pub fn run(args: BrickArgs) -> Result<i32> {
    let listen: ListenAddr = args
        .listen
        .parse()
        .with_context(|| format!("--listen {}", args.listen))?;
    if args.size < 2 << 20 {
        bail!("--size {} is too small: a brick lends at least 2 MiB", args.size);
    }
    let mut limits = args.limits()?;
    limits.serve_bps = match args.serve_rate {
        ServeRate::Unpaced => None,
        ServeRate::Bps(b) => Some(b),
        ServeRate::Probe => {
            let b = rackmem_brick::probe_serve_rate();
            eprintln!(
                "rackmem brick: memory serves {} per second (probed; --serve-rate sets it)",
                format_size(b)
            );
            Some(b)
        }
    };
    let serve_bps = limits.serve_bps;
    let secret = read_secret(args.secret, args.secret_file.as_deref())?;
    if secret.is_none() {
        eprintln!("rackmem brick: no --secret given: nodes cannot carve segments until a control plane issues grants");
    }
    // A managed brick's name is bound to its key: keep the key where a restart finds it.
    let key_file = args.key_file.clone().or_else(|| {
        let name = args.name.as_ref().filter(|_| args.control.is_some())?;
        Some(crate::control_cmd::state_dir()?.join(format!("rackmem/brick-{name}.key")))
    });
    if let Some(dir) = key_file
        .as_ref()
        .and_then(|f| f.parent())
        .filter(|d| !d.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let key = load_key(key_file.as_deref())?;
    // Handlers first: a SIGTERM that arrives as soon as the socket exists must stop the brick
    // cleanly, not kill it with the socket file left behind.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let key_hex = hex::encode(&key);
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(_), _) if !args.listen.starts_with("tls://") => {
            bail!(
                "--tls-cert and --tls-key serve TLS: listen on tls://HOST:PORT, not {}",
                args.listen
            )
        }
        (Some(cert), Some(key)) => {
            Some(rackmem_brick::tls_server_config(cert, key).context("loading --tls-cert and --tls-key")?)
        }
        _ => None,
    };
    let handle = Brick::start(BrickConfig {
        listen,
        size_bytes: args.size,
        key,
        secret,
        // With a control plane, segments come from its grants and live until it drops them.
        managed: args.control.is_some(),
        limits,
        tls,
    })
    .with_context(|| format!("starting the brick on {}", args.listen))?;
    eprintln!(
        "rackmem brick: serving {} on {} (SIGTERM or Ctrl-C stops it)",
        format_size(args.size),
        handle.local_addr()
    );
    if let Some(addr) = args.metrics {
        let m = handle.manager();
        let bound = rackmem_metrics::serve(addr, "brick-metrics", move || m.metrics_text())
            .with_context(|| format!("serving metrics on {addr}"))?;
        eprintln!("rackmem brick: metrics at http://{bound}/metrics");
    }
    let heartbeat = match &args.control {
        None => None,
        Some(urls) => {
            let client = args.auth.client(urls, None)?;
            let (address, default_name) = advertised(&handle.local_addr());
            let ports = if args.ports.is_empty() {
                vec![parse_port(DEFAULT_PORT).map_err(anyhow::Error::msg)?]
            } else {
                args.ports
            };
            let registration = BrickRegistration {
                name: args.name.unwrap_or(default_name),
                address: args.advertise.unwrap_or(address),
                capacity_bytes: args.size,
                ports,
                key_hex,
                serve_bps,
            };
            eprintln!(
                "rackmem brick: managed by the control plane at {urls} as {} ({})",
                registration.name, registration.address
            );
            let mut last_count = None;
            let (manager, stats_of) = (handle.manager(), handle.manager());
            let conns_of = handle.manager();
            Some(
                rackmem_control::heartbeat::spawn_brick_heartbeat_with_stats(
                    client,
                    registration,
                    std::time::Duration::from_millis(args.heartbeat_ms),
                    move || {
                        let s = stats_of.stats();
                        let pace = conns_of.pace_stats();
                        let moves = conns_of.move_report();
                        rackmem_control::api::HeartbeatStats {
                            resident_bytes: Some(s.resident_bytes),
                            segments: Some(s.segments),
                            bytes_served: Some(s.bytes_read.saturating_add(s.bytes_written)),
                            connections: Some(s.connections),
                            requests_delayed: Some(pace.delayed),
                            enforced_serve_bps: Some(pace.serve_bps),
                            frozen: moves.frozen,
                            unmovable: moves
                                .unmovable
                                .into_iter()
                                .map(|(segment_id, why)| rackmem_control::api::Unmovable { segment_id, why })
                                .collect(),
                            pulls_ended: moves
                                .pulls
                                .into_iter()
                                .map(|p| rackmem_control::api::PullEnded {
                                    segment_id: p.segment_id,
                                    bytes: p.bytes,
                                    error: p.error,
                                })
                                .collect(),
                        }
                    },
                    move |reply: &rackmem_control::api::HeartbeatReply, listed_at| {
                        let segs: &[LiveSegment] = &reply.segments;
                        if let Some(bps) = reply.serve_bps {
                            manager.set_serve_rate(bps);
                        }
                        let live: Vec<(u64, u64, u64)> = segs.iter().map(|s| (s.id, s.offset, s.size_bytes)).collect();
                        // Segments the control plane no longer lists are dropped; one created
                        // since the request went out may be newer than the list and stays.
                        let dropped = manager.retain_segments_as_of(&live, listed_at);
                        let rates: Vec<(u64, u64)> = segs.iter().map(|s| (s.id, s.rate_bps.unwrap_or(0))).collect();
                        manager.set_rates_as_of(&rates, listed_at);
                        let pulls = reply.pulls.iter().filter_map(pull_spec).collect();
                        manager.apply_moves(&reply.frozen, &reply.moved, pulls);
                        on_live_segments(&live, &dropped, &mut last_count);
                    },
                )
                .context("starting the heartbeat thread")?,
            )
        }
    };
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    eprintln!("rackmem brick: stopping");
    if let Some(h) = heartbeat {
        h.stop();
    }
    handle.shutdown();
    Ok(0)
}

/// A heartbeat reply's pull order as the brick runs it; one that does not decode is reported
/// and skipped (the control plane ends the move at its deadline).
fn pull_spec(p: &rackmem_control::api::MovePull) -> Option<rackmem_brick::PullSpec> {
    let decoded = (|| -> Result<rackmem_brick::PullSpec, String> {
        let bytes = |what: &str, h: &str| hex::decode(h).map_err(|e| format!("{what}: {e}"));
        let target =
            rackmem_proto::Grant::decode(&bytes("grant_hex", &p.grant_hex)?).map_err(|e| format!("grant_hex: {e}"))?;
        let pull = rackmem_proto::PullGrant::decode(&bytes("pull_grant_hex", &p.pull_grant_hex)?)
            .map_err(|e| format!("pull_grant_hex: {e}"))?;
        let key: [u8; rackmem_proto::KEY_LEN] = bytes("pull_key_hex", &p.pull_key_hex)?
            .try_into()
            .map_err(|_| "pull_key_hex: not a key".to_string())?;
        Ok(rackmem_brick::PullSpec {
            target,
            source: p.source.clone(),
            pull,
            key,
        })
    })();
    match decoded {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!(
                "rackmem brick: the control plane's pull order for segment {} does not decode: {e}",
                p.segment_id
            );
            None
        }
    }
}
