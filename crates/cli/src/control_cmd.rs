//! `rackmem control`: serve the control plane.

use crate::values::parse_duration;
use anyhow::{bail, Context, Result};
use clap::Args;
use rackmem_control::graph::Topology;
use rackmem_control::plane::NodeQuota;
use rackmem_control::serve::{HttpLimits, TlsFiles};
use rackmem_control::server::{spawn, PublicRoutes, ServerConfig};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args)]
#[command(
    long_about = "Serve the control plane: bricks register and send heartbeats, agents and \
        `rackmem ctl` allocate segments for nodes, and every change is stored before it is answered.\n\n\
        Every request but GET /healthz and GET /v1/leader needs a token (deny by default). The first \
        admin token is made at start in --admin-token-file (mode 0600) if that file is absent; with it, \
        `rackmem ctl token create` makes tokens for nodes (agents) and bricks.\n\n\
        Example (one brick, one node):\n  \
        rackmem control --listen 0.0.0.0:7080 --store sqlite:/var/lib/rackmem/control.db \\\n      \
        --admin-token-file /etc/rackmem/admin.token\n  \
        rackmem ctl --control http://ctl:7080 --token-file /etc/rackmem/admin.token \\\n      \
        token create --role brick --name mem1 > mem1.token\n  \
        rackmem brick --listen tcp://0.0.0.0:7070 --size 64GiB --control http://ctl:7080 --name mem1 \\\n      \
        --token-file mem1.token --key-file /var/lib/rackmem/mem1.key\n\n\
        HTTPS: --tls-cert and --tls-key; clients then use https:// URLs (and --control-ca for a private \
        CA). With --tls-client-ca, client certificates signed by that CA whose subject CN is ROLE:NAME \
        (e.g. node:web1) are accepted instead of tokens.\n\n\
        Replicas (cargo feature `etcd`): start several with --store etcd:http://etcd1:2379,... and a \
        distinct --advertise each; one leads, the others answer 503 not_leader until it fails, and \
        clients given every URL (--control URL1,URL2) follow the leader.\n\n\
        The REST API is described by GET /openapi.json; metrics are at GET /metrics (both need a \
        token unless opened with --public-openapi, --public-metrics)."
)]
pub struct ControlArgs {
    /// Address and port to listen on (HTTP, or HTTPS with --tls-cert).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7080")]
    listen: std::net::SocketAddr,
    /// Where the state lives: sqlite:PATH (default: $XDG_STATE_HOME/rackmem/control.db, else
    /// ~/.local/state/rackmem/control.db, else ./rackmem-control.db), or etcd:URL[,URL...]
    /// (shared by replicas; needs a build with the cargo feature `etcd`).
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// The URL clients reach this control plane at, which followers name while it leads
    /// (default: http:// and the --listen address, the host's name replacing 0.0.0.0).
    #[arg(long, value_name = "URL")]
    advertise: Option<String>,
    /// JSON file declaring switches, the links between them and which port goes to which switch
    /// (see docs/control-plane.md). Without it every port is on one switch, `rack`.
    #[arg(long, value_name = "FILE")]
    topology: Option<PathBuf>,
    /// A brick without heartbeat for this long is marked down (no new segments go there).
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = parse_duration)]
    brick_timeout: Duration,
    /// How often bricks are told to send heartbeats.
    #[arg(long, value_name = "DUR", default_value = "1s", value_parser = parse_duration)]
    heartbeat_interval: Duration,
    /// File holding the first admin token; created with a fresh token (mode 0600) if absent
    /// (default: admin.token next to the default store, $XDG_STATE_HOME/rackmem/admin.token or
    /// ~/.local/state/rackmem/admin.token). Only its hash is kept in memory. `rackmem ctl` on this
    /// host reads the default file by itself.
    #[arg(long, value_name = "PATH")]
    admin_token_file: Option<PathBuf>,
    /// Certificate chain (PEM) to serve HTTPS with (needs --tls-key).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// CA (PEM) whose client certificates authenticate callers instead of tokens: the subject
    /// CN names the principal, ROLE:NAME (admin:ops, node:web1, brick:mem1). Needs --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Serve GET /metrics without a token (for scrapers that cannot send one).
    #[arg(long)]
    public_metrics: bool,
    /// Serve GET /openapi.json without a token.
    #[arg(long)]
    public_openapi: bool,
    /// Open connections at most; more are closed at accept (keep it under the descriptor limit).
    #[arg(long, value_name = "N", default_value_t = 512)]
    max_connections: usize,
    /// Open connections from one IP address at most.
    #[arg(long, value_name = "N", default_value_t = 64)]
    max_connections_per_peer: usize,
    /// Open connections from the addresses of one network at most (--peer-prefix-v4,
    /// --peer-prefix-v6), so that rotating source addresses does not lift the per-address cap.
    #[arg(long, value_name = "N", default_value_t = 128)]
    max_connections_per_prefix: usize,
    /// Leading bits of an IPv4 address that name its network, for --max-connections-per-prefix.
    #[arg(long, value_name = "BITS", default_value_t = 24, value_parser = clap::value_parser!(u8).range(0..=32))]
    peer_prefix_v4: u8,
    /// Leading bits of an IPv6 address that name its network.
    #[arg(long, value_name = "BITS", default_value_t = 64, value_parser = clap::value_parser!(u8).range(0..=128))]
    peer_prefix_v6: u8,
    /// The most memory one node may hold at once, a size (64GiB) or a share of the registered
    /// bricks' capacity (50%), so that one node's token cannot take all free memory. An admin
    /// sets a node's own with `rackmem ctl node-quota NODE SIZE`.
    #[arg(long, value_name = "SIZE|PCT%", default_value = "50%", value_parser = parse_node_quota)]
    node_quota: NodeQuota,
    /// How bricks are picked for segments an allocation does not place itself: `spread` (the
    /// least loaded brick, by the bytes/s its heartbeats report, then the one with fewest
    /// segments, then the most free space) or `pack` (bricks already serving first, the fullest
    /// first, so whole bricks stay idle; among idle ones, the lowest `busy_watts` of the
    /// topology's `power` first). An allocation may ask for either (`placement`).
    #[arg(long, value_name = "spread|pack", default_value = "spread")]
    placement: rackmem_control::api::Objective,
    /// A brick that registers or comes back up starts a rebalance onto it: allocations move
    /// from the fullest bricks until every brick's used share is within 10 points of the mean,
    /// as `rackmem ctl rebalance` does (off by default: moving pages costs the programs).
    #[arg(long)]
    rebalance_on_join: bool,
    /// Time a connection has to send a request's headers (also how long an idle kept-alive
    /// connection stays open).
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = parse_duration)]
    header_timeout: Duration,
    /// How long a grant is good for: a brick refuses it at ATTACH once expired, and agents renew
    /// the grants of segments their processes still use. Short limits what a stolen grant is
    /// worth; keep it well above the clock skew between this host and the bricks'. 0: forever.
    #[arg(long, value_name = "DUR", default_value = "10m", value_parser = parse_duration)]
    grant_lifetime: Duration,
    /// What configures the switches for circuits: `dry-run` (the rules are recorded and shown
    /// by `rackmem ctl circuits`, nothing is configured) or `nft:FILE` (Linux hosts acting as
    /// switches, configured with nftables: FILE names each switch's network namespace and the
    /// interface of each of its ports; see docs/control-plane.md).
    #[arg(long, value_name = "dry-run|nft:FILE", default_value = "dry-run")]
    switch_driver: String,
    /// Time a request has to send its body and be answered (slower: 408).
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = parse_duration)]
    request_timeout: Duration,
}

/// Where the admin token lives unless --admin-token-file says otherwise.
pub fn default_admin_token_file() -> PathBuf {
    match state_dir() {
        Some(dir) => dir.join("rackmem/admin.token"),
        None => PathBuf::from("rackmem-admin.token"),
    }
}

/// `$XDG_STATE_HOME`, else `~/.local/state`.
pub fn state_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".local/state"))
        })
}

fn default_store() -> String {
    match state_dir() {
        Some(dir) => format!("sqlite:{}", dir.join("rackmem/control.db").display()),
        None => "sqlite:rackmem-control.db".to_string(),
    }
}

pub fn run(args: ControlArgs) -> Result<i32> {
    if args.brick_timeout.is_zero() || args.heartbeat_interval.is_zero() {
        bail!("--brick-timeout and --heartbeat-interval must be positive");
    }
    let topology = match &args.topology {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the topology file {}", path.display()))?;
            Some(Topology::parse(&text).with_context(|| format!("topology file {}", path.display()))?)
        }
        None => None,
    };
    if let Some(a) = &args.advertise {
        let rest = a.strip_prefix("http://").or_else(|| a.strip_prefix("https://"));
        if rest.is_none_or(str::is_empty) {
            bail!("--advertise {a:?} is not a URL: use http://HOST:PORT or https://HOST:PORT");
        }
    }
    let url = args.store.unwrap_or_else(default_store);
    let store = rackmem_control::store::open(&url).with_context(|| format!("opening the store {url}"))?;
    let token_file = args.admin_token_file.clone().unwrap_or_else(default_admin_token_file);
    if let Some(dir) = token_file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let (admin_token, created) = rackmem_control::auth::admin_token_file(&token_file)
        .with_context(|| format!("the admin token file {}", token_file.display()))?;
    if args.max_connections == 0 || args.max_connections_per_peer == 0 || args.max_connections_per_prefix == 0 {
        bail!("--max-connections, --max-connections-per-peer and --max-connections-per-prefix must be at least 1");
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let mut config = ServerConfig::new(args.listen, store);
    config.topology = topology;
    config.brick_timeout = args.brick_timeout;
    config.heartbeat_interval = args.heartbeat_interval;
    config.advertise = args.advertise.map(|a| a.trim_end_matches('/').to_string());
    config.admin_token = Some(admin_token);
    config.grant_lifetime = args.grant_lifetime;
    config.node_quota = args.node_quota;
    config.placement = args.placement;
    config.rebalance_on_join = args.rebalance_on_join;
    config.switch_driver = Some(
        rackmem_control::switch::open(&args.switch_driver)
            .with_context(|| format!("--switch-driver {}", args.switch_driver))?,
    );
    config.public = PublicRoutes {
        openapi: args.public_openapi,
        metrics: args.public_metrics,
    };
    config.limits = HttpLimits {
        max_connections: args.max_connections,
        max_connections_per_peer: args.max_connections_per_peer,
        max_connections_per_prefix: args.max_connections_per_prefix,
        peer_prefix: rackmem_sys::PrefixLen {
            v4: args.peer_prefix_v4,
            v6: args.peer_prefix_v6,
        },
        header_timeout: args.header_timeout,
        request_timeout: args.request_timeout,
    };
    config.tls = args.tls_cert.zip(args.tls_key).map(|(cert, key)| TlsFiles {
        cert,
        key,
        client_ca: args.tls_client_ca,
    });
    let server = spawn(config).context("starting the control plane")?;
    eprintln!(
        "rackmem control: admin token {} {}",
        if created { "created in" } else { "read from" },
        token_file.display()
    );
    eprintln!(
        "rackmem control: serving on {} (store {url}; advertised as {}; brick timeout {:?}; SIGTERM or Ctrl-C stops it)",
        server.url(),
        server.advertise(),
        args.brick_timeout
    );
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("rackmem control: stopping");
    server.stop().context("stopping the control plane")?;
    Ok(0)
}

/// `--node-quota`: `50%` (of the bricks' capacity) or a size.
fn parse_node_quota(s: &str) -> Result<NodeQuota, String> {
    if let Some(p) = s.strip_suffix('%') {
        return match p.parse::<u8>() {
            Ok(p) if (1..=100).contains(&p) => Ok(NodeQuota::PercentOfPool(p)),
            _ => Err(format!("`{s}`: a share is 1% to 100%")),
        };
    }
    crate::values::parse_size_arg(s).map(NodeQuota::Bytes)
}
