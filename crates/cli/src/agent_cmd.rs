//! `rackmem agent`: the node agent; see `rackmem_control::agent`.

use anyhow::{Context, Result};
use clap::Args;
use rackmem_control::agent::{Agent, AgentConfig};
use rackmem_control::api::{NodeRegistration, PortSpec};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Where processes find the agent unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/rackmem/agent.sock";

#[derive(Args)]
#[command(
    long_about = "Run the node agent: it registers this machine (a node) with the control plane and \
        hands memory segments to local programs as they need them.\n\n\
        Programs reach it through its Unix socket:\n  \
        rackmem agent --control http://ctl:7080 --token-file web1.token &\n  \
        rackmem run --agent /run/rackmem/agent.sock --local 25% -- ./app\n\n\
        Each program's memory grows in steps as it allocates, and everything it was given goes \
        back to the control plane when it exits, crashes or is killed.\n\n\
        Who may ask: root and the agent's own user, by default. The agent reads each \
        connection's credentials from the kernel (SO_PEERCRED) and turns others away with a \
        message naming the option that would admit them (--allow-uid, --allow-gid). Each \
        process and each user is held to a quota, at most --max-connections programs are \
        served at once, and allocations nobody holds any more (a reply lost to a control-plane \
        crash, a program that outlived an earlier agent and then exited) are released every \
        --reconcile-interval."
)]
pub struct AgentArgs {
    /// The control plane's URL; several (comma-separated) for replicated control planes.
    #[arg(long, value_name = "URL[,URL...]")]
    control: String,
    #[command(flatten)]
    auth: crate::client_args::ControlAuthArgs,
    /// The Unix socket programs connect to.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// The node's name (unique in the control plane); default: the host name.
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// A port of this node: NAME:BANDWIDTH[:SWITCH] (e.g. eth0:10GB/s); repeat for several.
    #[arg(long = "port", value_name = "NAME:BW[:SWITCH]", value_parser = crate::values::parse_port)]
    ports: Vec<PortSpec>,
    /// Spread each allocation over this many bricks.
    #[arg(long, value_name = "K", default_value_t = 1)]
    stripe: u32,
    /// Serve Prometheus metrics (GET /metrics) on this address, e.g. 127.0.0.1:9101.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Also admit the processes of this user id (repeat for several). Root and the agent's
    /// own user are always admitted. Admitting a user other than those opens the socket file
    /// to everyone (mode 0666): the kernel-checked credentials are then what keeps others out.
    #[arg(long = "allow-uid", value_name = "UID")]
    allow_uids: Vec<u32>,
    /// Also admit processes whose primary or supplementary group is this group id (repeat for
    /// several). With exactly one group (and no --allow-uid) the socket is mode 0660 and owned
    /// by that group; without either option it is 0600.
    #[arg(long = "allow-gid", value_name = "GID")]
    allow_gids: Vec<u32>,
    /// Most memory one process may hold at once (e.g. 64GiB), checked before the control plane
    /// is asked; a grow past it is refused with quota_exceeded. The default stops one runaway
    /// program from taking a whole rack's pool; raise it for programs that need more.
    #[arg(long, value_name = "SIZE", default_value = "64GiB", value_parser = crate::values::parse_size_arg)]
    quota_per_process: u64,
    /// Most memory all processes of one user may hold at once (e.g. 256GiB): several programs of
    /// one user, or one program forking many, stay within it. Default: four full-size programs.
    #[arg(long, value_name = "SIZE", default_value = "256GiB", value_parser = crate::values::parse_size_arg)]
    quota_per_uid: u64,
    /// Most programs served at once (each costs a thread with a 256 KiB stack while it is
    /// connected); over it a connection gets a too_many_connections line and is closed.
    #[arg(long, value_name = "N", default_value_t = rackmem_control::agent::DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=65_536))]
    max_connections: usize,
    /// Most programs of one user served at once (root's included), so that one admitted user
    /// cannot hold every connection and lock the others out; over it a connection gets a
    /// too_many_connections line naming this option and is closed.
    #[arg(long, value_name = "N", default_value_t = rackmem_control::agent::DEFAULT_MAX_CONNECTIONS_PER_UID,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=65_536))]
    max_connections_per_uid: usize,
    /// How long a whole request line may take to arrive once its first byte has, however it
    /// trickles in (a client that sends a byte now and then is cut off with request_timeout). Idle time between requests is
    /// unlimited: programs hold their connection for life.
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = crate::values::parse_duration)]
    request_timeout: Duration,
    /// How often to release this node's agent-made allocations that nobody holds: none of this
    /// agent's connections has it and its process is gone (it also runs at start). Allocations
    /// pushed to the node by hand (rackmem ctl alloc --node) are never released by the agent
    /// unless an admin asks (they are its pool, see --pool-interval).
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = crate::values::parse_duration)]
    reconcile_interval: Duration,
    /// How often to look for memory pushed to this node (rackmem ctl alloc --node NODE): the
    /// agent attaches it into the node's pool, serves processes' grows from the pool before
    /// asking for more, and reports what the pool holds and what is in use.
    #[arg(long, value_name = "DUR", default_value = "1s", value_parser = crate::values::parse_duration)]
    pool_interval: Duration,
}

pub fn run(args: AgentArgs) -> Result<i32> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let client = args.auth.client(&args.control, None)?;
    let ports = if args.ports.is_empty() {
        vec![crate::values::parse_port("eth0:10GB/s").map_err(anyhow::Error::msg)?]
    } else {
        args.ports
    };
    let name = args.name.unwrap_or_else(crate::brick_cmd::hostname);
    let mut cfg = AgentConfig::new(
        args.socket.clone(),
        NodeRegistration {
            name: name.clone(),
            ports,
        },
    );
    cfg.stripe = args.stripe;
    cfg.allow_uids = args.allow_uids;
    cfg.allow_gids = args.allow_gids;
    cfg.quota_per_process_bytes = args.quota_per_process;
    cfg.quota_per_uid_bytes = args.quota_per_uid;
    cfg.max_connections = args.max_connections;
    cfg.max_connections_per_uid = args.max_connections_per_uid;
    cfg.request_timeout = args.request_timeout;
    cfg.reconcile_interval = args.reconcile_interval;
    cfg.pool_interval = args.pool_interval;
    let agent = Agent::start(client, cfg).context("starting the agent")?;
    eprintln!(
        "rackmem agent: node {name} (id {}) serving programs on {} (SIGTERM or Ctrl-C stops it)",
        agent.node(),
        args.socket.display()
    );
    let agent = Arc::new(agent);
    if let Some(addr) = args.metrics {
        let a = agent.clone();
        let bound = rackmem_metrics::serve(addr, "agent-metrics", move || a.metrics_text())
            .with_context(|| format!("serving metrics on {addr}"))?;
        eprintln!("rackmem agent: metrics at http://{bound}/metrics");
    }
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    eprintln!("rackmem agent: stopping");
    match Arc::try_unwrap(agent) {
        Ok(a) => a.stop(),
        // The metrics thread still holds it: the socket goes when the process exits.
        Err(a) => {
            let _ = std::fs::remove_file(&args.socket);
            drop(a);
        }
    }
    Ok(0)
}
