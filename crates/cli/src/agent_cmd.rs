//! `rackmem agent`: the node agent; see `rackmem_control::agent`.

use anyhow::{Context, Result};
use clap::Args;
use rackmem_control::agent::{Agent, AgentConfig};
use rackmem_control::api::{NodeRegistration, PortSpec};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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
        back to the control plane when it exits, crashes or is killed."
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
    #[arg(long = "port", value_name = "NAME:BW[:SWITCH]", value_parser = crate::ctl_cmd::parse_port)]
    ports: Vec<PortSpec>,
    /// Spread each allocation over this many bricks.
    #[arg(long, value_name = "K", default_value_t = 1)]
    stripe: u32,
    /// Serve Prometheus metrics (GET /metrics) on this address, e.g. 127.0.0.1:9101.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
}

pub fn run(args: AgentArgs) -> Result<i32> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let client = args.auth.client(&args.control, None)?;
    let ports = if args.ports.is_empty() {
        vec![crate::ctl_cmd::parse_port("eth0:10GB/s").map_err(anyhow::Error::msg)?]
    } else {
        args.ports
    };
    let name = args.name.unwrap_or_else(crate::brick_cmd::hostname);
    let agent = Agent::start(
        client,
        AgentConfig {
            socket: args.socket.clone(),
            registration: NodeRegistration {
                name: name.clone(),
                ports,
            },
            stripe: args.stripe,
        },
    )
    .context("starting the agent")?;
    eprintln!(
        "rackmem agent: node {name} (id {}) serving programs on {} (SIGTERM or Ctrl-C stops it)",
        agent.node(),
        args.socket.display()
    );
    let agent = Arc::new(agent);
    if let Some(addr) = args.metrics {
        let a = agent.clone();
        let bound = rackmem_control::agent::serve_metrics(addr, move || a.metrics_text())
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
