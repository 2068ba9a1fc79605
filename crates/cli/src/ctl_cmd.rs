//! `rackmem ctl`: look at and change the control plane's state from a shell.

use crate::values::{parse_port, parse_rate, parse_size_arg};
use anyhow::Result;
use clap::{Args, Subcommand};
use rackmem_control::api::{AllocationRequest, MoveState, NodeRegistration, PortSpec, TokenRequest};
use rackmem_control::client::{Client, ClientError};
use rackmem_runtime::size::format_size;
use serde::Serialize;

/// Exit statuses of `rackmem ctl`.
pub mod exit {
    /// The control plane reported an error (not found, no capacity, ...).
    pub const SERVER_ERROR: i32 = 1;
    /// The input is wrong (bad URL, unknown node name); clap's own usage errors exit with 2.
    pub const BAD_INPUT: i32 = 65;
    /// No control plane could be reached.
    pub const UNREACHABLE: i32 = 69;
    /// The control plane refused the credentials (401) or the role (403).
    pub const DENIED: i32 = 77;
    /// `drain`: the brick still held segments when --timeout ran out (it stays draining);
    /// `rebalance`: moves were still under way.
    pub const TIMED_OUT: i32 = 75;
}

#[derive(Args)]
#[command(
    long_about = "Look at and change the control plane's state.\n\n\
        Examples:\n  \
        rackmem ctl bricks\n  \
        rackmem ctl add-node --name web1 --port eth0:10GB/s\n  \
        rackmem ctl alloc --node web1 --size 8GiB --stripe 2 --bandwidth 2GB/s\n  \
        rackmem ctl --json allocations | jq '.[].segments[].brick_address'\n  \
        rackmem ctl free 7\n  \
        rackmem ctl token create --role node --name web1 > web1.token\n\n\
        Credentials: --token-file (or RACKMEM_TOKEN); on the control plane's host the admin token \
        file it made is found by itself.\n\n\
        Exit status: 0 done; 1 the control plane refused (the message says why); 2 or 65 bad \
        input; 69 no control plane reachable; 75 drain: the brick still held segments at --timeout; \
        77 the token is missing, invalid or not allowed this.",
    after_help = "Sizes: 4096, 64MiB, 8GiB, 1.5G. Rates are bytes per second: 10GB/s, 1.25G, 500MB/s."
)]
pub struct CtlArgs {
    /// Control plane URL(s), comma-separated: the next one is tried when one is unreachable.
    #[arg(
        long,
        value_name = "URL[,URL...]",
        env = crate::client_args::CONTROL_ENV,
        default_value = crate::client_args::DEFAULT_CONTROL
    )]
    control: String,
    #[command(flatten)]
    auth: crate::client_args::ControlAuthArgs,
    /// Print JSON (the API's own objects) instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Subcommand)]
enum CtlCommand {
    /// List the bricks: capacity, free space, state; `bricks rate BRICK RATE|none` sets what a
    /// brick's memory serves.
    Bricks {
        #[command(subcommand)]
        command: Option<BrickCommand>,
    },
    /// List the nodes.
    Nodes,
    /// List the allocations and their segments.
    Allocations,
    /// List the named segments (one-sided segments processes open by name, on any node): owner,
    /// size, brick and holders.
    Segments,
    /// List the programs running on agent memory, with their figures as their agents last
    /// reported them (every second or two): local buffer, faults, bytes each way, fault
    /// latency, miss concurrency and C-AMAT. `rackmem top` shows the same, refreshing.
    Processes,
    /// Show the resource graph: switches and links with reserved bandwidth.
    Graph,
    /// Allocate memory for a node.
    Alloc {
        /// Node id or name.
        #[arg(long, value_name = "NODE")]
        node: String,
        /// How much.
        #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
        size: u64,
        /// Over how many bricks to spread it.
        #[arg(long, value_name = "K")]
        stripe: Option<u32>,
        /// Bandwidth to reserve on every link of each segment's path.
        #[arg(long, value_name = "RATE", value_parser = parse_rate)]
        bandwidth: Option<u64>,
        /// Use this brick (by id); repeat to stripe over several.
        #[arg(long = "brick", value_name = "ID")]
        bricks: Vec<u64>,
        /// How to pick the bricks not named: spread (least loaded) or pack (leave whole bricks
        /// idle). Default: the control plane's --placement.
        #[arg(long, value_name = "spread|pack")]
        placement: Option<rackmem_control::api::Objective>,
        /// Make it a circuit (admins only): every port and switch link of its paths is reserved
        /// for it alone and the switches on them are configured to connect its ports
        /// (`rackmem ctl circuits` shows the rules).
        #[arg(long)]
        circuit: bool,
    },
    /// List the circuits (the links each holds and its switch rules) and what each switch was
    /// last given; `circuits move ID --avoid LINK` re-routes one.
    Circuits {
        #[command(subcommand)]
        command: Option<CircuitCommand>,
    },
    /// Release an allocation.
    Free {
        /// Allocation id.
        id: u64,
    },
    /// Grow or shrink an allocation.
    Resize {
        /// Allocation id.
        id: u64,
        /// The new size.
        #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
        size: u64,
    },
    /// Set how much memory one node may hold at once (admins only), or put it back to the
    /// control plane's default (rackmem control --node-quota).
    NodeQuota {
        /// Node id or name.
        node: String,
        /// The most its allocations may hold, or `default`.
        #[arg(value_name = "SIZE|default")]
        size: String,
    },
    /// Create, list and revoke API tokens (admins only).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Forget a brick that holds no segment, so its name can be registered with another key.
    ForgetBrick {
        /// Brick id or name.
        brick: String,
    },
    /// Drain a brick (admins only): no new segments go to it, and the command waits, with a
    /// progress bar, until it holds none (then exits 0: the brick can be retired). It stays
    /// draining across restarts until `--cancel`.
    Drain {
        /// Brick id or name.
        brick: String,
        /// How long to wait for the brick to hold no segment (exit 75 then; it stays draining).
        #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = crate::values::parse_duration)]
        timeout: std::time::Duration,
        /// Mark it draining and return at once.
        #[arg(long)]
        no_wait: bool,
        /// End the drain: the brick takes segments again.
        #[arg(long)]
        cancel: bool,
    },
    /// Rebalance (admins only): move allocations from the fullest bricks onto bricks with room
    /// (a brick that joined) until every brick's used share is within --tolerance points of the
    /// mean, while programs run (the moves a drain makes). Prints the plan, then waits, with a
    /// progress bar, until every move is done (exit 0) or some were given up (exit 1).
    /// `--status` shows the rebalance under way or the last one, as one a brick's joining started
    /// (`rackmem control --rebalance-on-join`), and asks for nothing.
    Rebalance {
        /// Only print the plan: nothing moves.
        #[arg(long)]
        dry_run: bool,
        /// Show the rebalance under way (or the last one) and its moves; start none.
        #[arg(long, conflicts_with_all = ["dry_run", "no_wait"])]
        status: bool,
        /// How far (percentage points of used capacity) a brick may stay from the mean share.
        #[arg(long, value_name = "POINTS", default_value_t = rackmem_control::plane::DEFAULT_TOLERANCE_POINTS)]
        tolerance: f64,
        /// Most bytes of allocations moving at once (one always moves, however large).
        #[arg(long, value_name = "SIZE", default_value = "256MiB", value_parser = parse_size_arg)]
        max_in_flight: u64,
        /// How long to wait for the moves (exit 75 then; they go on).
        #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = crate::values::parse_duration)]
        timeout: std::time::Duration,
        /// Start the moves and return at once.
        #[arg(long)]
        no_wait: bool,
    },
    /// Register a node by hand (agents do this themselves).
    AddNode {
        /// Unique name.
        #[arg(long)]
        name: String,
        /// A port: NAME:RATE[:SWITCH]; repeatable.
        #[arg(long = "port", value_name = "NAME:RATE[:SWITCH]", value_parser = parse_port, default_value = "eth0:10GB/s")]
        ports: Vec<PortSpec>,
    },
}

#[derive(Subcommand)]
enum BrickCommand {
    /// Set what a brick's memory serves (admins only): its segments' rates are divided anew,
    /// and they and the brick's own total pacing reach the brick with its next heartbeat. The
    /// rate outlives the brick's restarts (its own --serve-rate no longer replaces it).
    Rate {
        /// Brick id or name.
        brick: String,
        /// Bytes per second (READ and WRITE together), or `none`.
        #[arg(value_name = "RATE|none")]
        rate: String,
    },
}

#[derive(Subcommand)]
enum CircuitCommand {
    /// Move a circuit to other links (same bricks, segments and grants; its programs keep
    /// running): new paths that avoid the links named, the switches reconfigured at once.
    Move {
        /// The circuit's allocation id.
        id: u64,
        /// A link id its new paths must not cross (`rackmem ctl graph` lists them); repeatable.
        #[arg(long = "avoid", value_name = "LINK")]
        avoid: Vec<String>,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Make a token and print it (only this once: the control plane keeps its hash).
    Create {
        /// admin (everything), node (an agent: that node's allocations), brick (that brick's
        /// registration and heartbeats), metrics (a scraper: GET /metrics only).
        #[arg(long, value_parser = ["admin", "node", "brick", "metrics"])]
        role: String,
        /// The node or brick it speaks for (for admins, a label).
        #[arg(long)]
        name: String,
    },
    /// List the tokens (ids, roles, names; never secrets).
    List,
    /// Revoke a token: it stops working at once.
    Revoke {
        /// Token id (the number in rmk_ID_...; `token list` shows them).
        id: u64,
    },
}

pub(crate) fn rate(bps: u64) -> String {
    if bps == 0 {
        "0".to_string()
    } else if bps >= 1_000_000_000 {
        format!("{:.1} GB/s", bps as f64 / 1e9)
    } else {
        format!("{:.1} MB/s", bps as f64 / 1e6)
    }
}

pub(crate) fn table(header: &[&str]) -> comfy_table::Table {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(header.to_vec());
    t
}

fn print<T: Serialize>(json: bool, value: &T, human: impl FnOnce(&T) -> String) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        println!("{}", human(value));
    }
    Ok(())
}

fn resolve_brick(c: &Client, brick: &str) -> Result<u64, CtlError> {
    if let Ok(id) = brick.parse::<u64>() {
        return Ok(id);
    }
    c.bricks()?
        .into_iter()
        .find(|b| b.name == brick)
        .map(|b| b.id)
        .ok_or_else(|| CtlError::BadInput(format!("no brick is named {brick:?} (rackmem ctl bricks lists them)")))
}

/// A brick's state as `rackmem ctl bricks` shows it: up or down, and draining or drained.
fn brick_state(b: &rackmem_control::api::Brick) -> String {
    let s = format!("{:?}", b.state).to_lowercase();
    if b.drained {
        format!("{s}, drained")
    } else if b.draining {
        format!("{s}, draining")
    } else {
        s
    }
}

/// Waits until draining brick `b` holds no segment, showing how many of the segments it held
/// at the start are gone (a bar on a terminal, unless `json`); at most `timeout`.
fn wait_drained(
    c: &Client,
    mut b: rackmem_control::api::Brick,
    timeout: std::time::Duration,
    json: bool,
) -> Result<rackmem_control::api::Brick, CtlError> {
    use std::io::IsTerminal;
    use std::time::{Duration, Instant};
    let start = b.segments;
    let bar = if json || !std::io::stderr().is_terminal() {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(start)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "draining {msg} [{bar:30}] {pos}/{len} segments moved or released ({elapsed})",
        )
        .map_err(|e| CtlError::Other(e.into()))?,
    );
    bar.set_message(b.name.clone());
    if !b.named_segments.is_empty() && !json {
        bar.suspend(|| eprintln!("{}", named_moving(&b)));
    }
    let deadline = Instant::now() + timeout;
    // Each reason a named segment waits is said once, as it first appears.
    let mut said: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    while !b.drained {
        if !json {
            for w in &b.named_waiting {
                if said.insert(w.clone()) {
                    bar.suspend(|| eprintln!("named segment {w}; tried again shortly"));
                }
            }
        }
        if Instant::now() >= deadline {
            bar.abandon();
            let named = if b.named_waiting.is_empty() {
                String::new()
            } else {
                format!("; named segments waiting: {}", b.named_waiting.join("; "))
            };
            return Err(CtlError::TimedOut(format!(
                "brick {} still holds {} segment(s) ({} in use) after {:?}: it stays draining (no new \
                 segments go to it); run the command again to wait longer, or --cancel{named}",
                b.name,
                b.segments,
                format_size(b.capacity_bytes.saturating_sub(b.free_bytes)),
                timeout
            )));
        }
        std::thread::sleep(Duration::from_millis(250).min(deadline.saturating_duration_since(Instant::now())));
        b = c.brick(b.id)?;
        bar.set_position(start.saturating_sub(b.segments));
    }
    bar.finish();
    Ok(b)
}

/// What a drain says of brick `b`'s named segments: the control plane moves them itself.
fn named_moving(b: &rackmem_control::api::Brick) -> String {
    format!(
        "{} named segment(s) on {} ({}) move with the others: the control plane freezes each, \
         copies it to another brick and points its name there; their holders wait a moment and \
         follow by name",
        b.named_segments.len(),
        b.name,
        b.named_segments.join(", ")
    )
}

/// A rebalance's plan as `rackmem ctl rebalance` prints it: the moves, then each brick's used
/// share before and as planned.
fn rebalance_plan(r: &rackmem_control::api::Rebalance) -> String {
    let mut moves = table(&["allocation", "node", "segments (brick → brick)", "bytes", "state"]);
    for m in &r.moves {
        moves.add_row(vec![
            m.allocation.to_string(),
            m.node.to_string(),
            m.segments
                .iter()
                .map(|s| format!("{}: {} → {}", s.segment_id, s.from_brick_id, s.to_brick_id))
                .collect::<Vec<_>>()
                .join(", "),
            format_size(m.segments.iter().map(|s| s.size_bytes).sum()),
            format!("{:?}", m.state).to_lowercase(),
        ]);
    }
    let mut bricks = table(&["brick", "name", "capacity", "used", "planned"]);
    let share = |used: u64, cap: u64| {
        if cap == 0 {
            "-".to_string()
        } else {
            format!("{} ({:.1}%)", format_size(used), used as f64 * 100.0 / cap as f64)
        }
    };
    for b in &r.bricks {
        bricks.add_row(vec![
            b.brick_id.to_string(),
            b.name.clone(),
            format_size(b.capacity_bytes),
            share(b.used_bytes, b.capacity_bytes),
            share(b.planned_bytes, b.capacity_bytes),
        ]);
    }
    format!(
        "{} move(s){} (mean share {:.1}%, tolerance {} points):\n{moves}\n{bricks}",
        r.moves.len(),
        if r.dry_run { ", a dry run" } else { "" },
        r.mean_percent,
        r.tolerance_points
    )
}

/// Waits until every move of rebalance `r` is done or given up, showing how many are (a bar on
/// a terminal, unless `json`); at most `timeout`.
fn wait_rebalanced(
    c: &Client,
    mut r: rackmem_control::api::Rebalance,
    timeout: std::time::Duration,
    json: bool,
) -> Result<rackmem_control::api::Rebalance, CtlError> {
    use std::io::IsTerminal;
    use std::time::{Duration, Instant};
    let bar = if json || !std::io::stderr().is_terminal() {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(r.moves.len() as u64)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("rebalancing [{bar:30}] {pos}/{len} moves ended ({elapsed})")
            .map_err(|e| CtlError::Other(e.into()))?,
    );
    let deadline = Instant::now() + timeout;
    while !r.finished {
        if Instant::now() >= deadline {
            bar.abandon();
            let left = r
                .moves
                .iter()
                .filter(|m| matches!(m.state, MoveState::Pending | MoveState::Moving))
                .count();
            return Err(CtlError::TimedOut(format!(
                "{left} of {} move(s) still under way after {timeout:?}: they go on (GET /v1/rebalance shows them)",
                r.moves.len()
            )));
        }
        std::thread::sleep(Duration::from_millis(250).min(deadline.saturating_duration_since(Instant::now())));
        r = c.rebalance_status()?;
        let ended = r
            .moves
            .iter()
            .filter(|m| matches!(m.state, MoveState::Done | MoveState::Abandoned))
            .count();
        bar.set_position(ended as u64);
    }
    bar.finish();
    Ok(r)
}

fn resolve_node(c: &Client, node: &str) -> Result<u64, CtlError> {
    if let Ok(id) = node.parse::<u64>() {
        return Ok(id);
    }
    c.nodes()?
        .into_iter()
        .find(|n| n.name == node)
        .map(|n| n.id)
        .ok_or_else(|| CtlError::BadInput(format!("no node is named {node:?} (rackmem ctl nodes lists them)")))
}

#[derive(Debug, thiserror::Error)]
enum CtlError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("{0}")]
    BadInput(String),
    #[error("{0}")]
    TimedOut(String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// `rackmem ctl circuits`: the circuits and their rules, then each switch's state.
fn circuits_table(v: &rackmem_control::api::Circuits) -> String {
    let mut t = table(&["allocation", "node", "switch", "port", "port", "links held"]);
    for k in &v.circuits {
        for (i, r) in k.rules.iter().enumerate() {
            t.add_row(vec![
                if i == 0 {
                    k.allocation.to_string()
                } else {
                    String::new()
                },
                if i == 0 { k.node.to_string() } else { String::new() },
                r.switch.clone(),
                r.a.port.clone(),
                r.b.port.clone(),
                if i == 0 { k.links.join(", ") } else { String::new() },
            ]);
        }
    }
    let mut s = table(&["switch", "rules", "applied", "took", "error"]);
    for sw in &v.switches {
        s.add_row(vec![
            sw.switch.clone(),
            sw.rules.len().to_string(),
            sw.applied_unix_ms
                .map_or_else(|| "-".to_string(), |ms| format!("{} s after the epoch", ms / 1000)),
            sw.apply_us
                .map_or_else(|| "-".to_string(), |us| format!("{:.1} ms", us as f64 / 1000.0)),
            sw.error.clone().unwrap_or_default(),
        ]);
    }
    format!("switch driver: {}; {} circuits\n{t}\n{s}", v.driver, v.circuits.len())
}

pub fn run(args: CtlArgs) -> Result<i32> {
    let fallback = Some(crate::control_cmd::default_admin_token_file());
    let r = args
        .auth
        .client(&args.control, fallback)
        // A bad URL, CA or token file is the user's input.
        .map_err(|e| CtlError::BadInput(format!("{e:#}")))
        .and_then(|c| run_with(&c, args.json, args.command));
    Ok(match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rackmem ctl: {e}");
            match e {
                CtlError::Client(ClientError::Unreachable { .. }) => exit::UNREACHABLE,
                CtlError::Client(ClientError::Server { status: 401 | 403, .. }) => exit::DENIED,
                CtlError::Client(ClientError::BadUrl(_)) | CtlError::BadInput(_) => exit::BAD_INPUT,
                CtlError::TimedOut(_) => exit::TIMED_OUT,
                _ => exit::SERVER_ERROR,
            }
        }
    })
}

fn run_with(c: &Client, json: bool, cmd: CtlCommand) -> Result<(), CtlError> {
    match cmd {
        CtlCommand::Bricks {
            command: Some(BrickCommand::Rate { brick, rate: r }),
        } => {
            let id = resolve_brick(c, &brick)?;
            let bps = match r.as_str() {
                "none" => None,
                s => Some(parse_rate(s).map_err(CtlError::BadInput)?),
            };
            print(json, &c.set_serve_rate(id, bps)?, |b| {
                format!(
                    "brick {} serves {}; promised to its segments: {}",
                    b.name,
                    b.serve_bps.map_or_else(|| "no set rate".to_string(), rate),
                    rate(b.promised_bps)
                )
            })?
        }
        CtlCommand::Bricks { command: None } => print(json, &c.bricks()?, |bricks| {
            let mut t = table(&[
                "id", "name", "address", "state", "capacity", "free", "segments", "ports",
            ]);
            for b in bricks {
                t.add_row(vec![
                    b.id.to_string(),
                    b.name.clone(),
                    b.address.clone(),
                    brick_state(b),
                    format_size(b.capacity_bytes),
                    format_size(b.free_bytes),
                    b.segments.to_string(),
                    b.ports
                        .iter()
                        .map(|p| format!("{} {} @{}", p.name, rate(p.bandwidth_bps), p.switch))
                        .collect::<Vec<_>>()
                        .join(", "),
                ]);
            }
            t.to_string()
        })?,
        CtlCommand::Drain {
            brick,
            timeout,
            no_wait,
            cancel,
        } => {
            let id = resolve_brick(c, &brick)?;
            let b = c.set_draining(id, !cancel)?;
            if cancel || no_wait {
                print(json, &b, |b| format!("brick {}: {}", b.name, brick_state(b)))?
            } else {
                let b = wait_drained(c, b, timeout, json)?;
                print(json, &b, |b| {
                    format!("brick {} is drained: it holds no segment", b.name)
                })?
            }
        }
        CtlCommand::Rebalance { status: true, .. } => {
            let r = c.rebalance_status()?;
            print(json, &r, |r| {
                format!(
                    "{}\n{}",
                    if r.finished { "finished" } else { "under way" },
                    rebalance_plan(r)
                )
            })?
        }
        CtlCommand::Rebalance {
            dry_run,
            tolerance,
            max_in_flight,
            timeout,
            no_wait,
            status: false,
        } => {
            let req = rackmem_control::api::RebalanceRequest {
                dry_run,
                tolerance_points: Some(tolerance),
                max_in_flight_bytes: Some(max_in_flight),
            };
            let plan = c.rebalance(&req)?;
            if dry_run || no_wait || plan.moves.is_empty() {
                print(json, &plan, rebalance_plan)?
            } else {
                if !json {
                    eprintln!("{}", rebalance_plan(&plan));
                }
                let r = wait_rebalanced(c, plan, timeout, json)?;
                print(json, &r, |r| {
                    let done = r.moves.iter().filter(|m| m.state == MoveState::Done).count();
                    format!("rebalanced: {done} of {} move(s) done", r.moves.len())
                })?;
                let abandoned: Vec<String> = r
                    .moves
                    .iter()
                    .filter(|m| m.state == MoveState::Abandoned)
                    .map(|m| {
                        format!(
                            "allocation {}: {}",
                            m.allocation,
                            m.why.as_deref().unwrap_or("given up")
                        )
                    })
                    .collect();
                if !abandoned.is_empty() {
                    return Err(CtlError::Other(anyhow::anyhow!(
                        "{} move(s) were given up (their allocations stay where they were): {}",
                        abandoned.len(),
                        abandoned.join("; ")
                    )));
                }
            }
        }
        CtlCommand::Processes => print(json, &c.processes()?, |p| {
            crate::top_cmd::processes_table(p, None).to_string()
        })?,
        CtlCommand::Nodes => print(json, &c.nodes()?, |nodes| {
            let mut t = table(&[
                "id",
                "name",
                "allocations",
                "allocated",
                "pool (attached, in use)",
                "quota",
                "ports",
            ]);
            for n in nodes {
                t.add_row(vec![
                    n.id.to_string(),
                    n.name.clone(),
                    n.allocations.to_string(),
                    format_size(n.allocated_bytes),
                    format!(
                        "{} ({}, {})",
                        format_size(n.pool_bytes),
                        format_size(n.pool_attached_bytes),
                        format_size(n.pool_in_use_bytes)
                    ),
                    format!(
                        "{}{}",
                        format_size(n.quota_bytes),
                        if n.quota_set { "" } else { " (default)" }
                    ),
                    n.ports
                        .iter()
                        .map(|p| format!("{} {} @{}", p.name, rate(p.bandwidth_bps), p.switch))
                        .collect::<Vec<_>>()
                        .join(", "),
                ]);
            }
            t.to_string()
        })?,
        CtlCommand::Allocations => print(json, &c.allocations()?, |allocs| {
            let mut t = table(&[
                "id",
                "node",
                "size",
                "segment",
                "brick",
                "offset",
                "seg size",
                "rate limit",
            ]);
            for a in allocs {
                for (i, s) in a.segments.iter().enumerate() {
                    let first = i == 0;
                    t.add_row(vec![
                        if first { a.id.to_string() } else { String::new() },
                        if first { a.node.to_string() } else { String::new() },
                        if first {
                            format_size(a.size_bytes)
                        } else {
                            String::new()
                        },
                        s.segment_id.to_string(),
                        format!("{} {}", s.brick_id, s.brick_address),
                        s.offset.to_string(),
                        format_size(s.size_bytes),
                        rate(s.rate_limit_bps),
                    ]);
                }
            }
            t.to_string()
        })?,
        CtlCommand::Segments => print(json, &c.named_segments(None)?, |segs| {
            let mut t = table(&["name", "uid", "size", "allocation", "node", "holders"]);
            for s in segs {
                t.add_row(vec![
                    s.name.clone(),
                    s.uid.to_string(),
                    format_size(s.size_bytes),
                    s.allocation.to_string(),
                    s.node.to_string(),
                    s.holders
                        .iter()
                        .map(|h| format!("node {} pid {}", h.node, h.holder.pid))
                        .collect::<Vec<_>>()
                        .join(", "),
                ]);
            }
            t.to_string()
        })?,
        CtlCommand::Graph => print(json, &c.graph()?, |g| {
            let mut t = table(&["link", "from", "to", "capacity", "reserved", "free", "segments"]);
            let end = |e: &rackmem_control::api::Endpoint| match e {
                rackmem_control::api::Endpoint::Node { id } => format!("node {id}"),
                rackmem_control::api::Endpoint::Brick { id } => format!("brick {id}"),
                rackmem_control::api::Endpoint::Switch { name } => format!("switch {name}"),
            };
            for l in &g.links {
                t.add_row(vec![
                    l.id.clone(),
                    end(&l.a),
                    end(&l.b),
                    rate(l.capacity_bps),
                    rate(l.reserved_bps),
                    rate(l.free_bps),
                    l.segments.to_string(),
                ]);
            }
            let mut b = table(&[
                "brick",
                "state",
                "segments",
                "load",
                "serves",
                "promised",
                "power idle/busy",
                "connections",
            ]);
            for br in &g.bricks {
                b.add_row(vec![
                    format!("{} {}", br.id, br.name),
                    format!("{:?}", br.state).to_lowercase(),
                    br.segments.to_string(),
                    br.load_bps.map_or_else(|| "-".to_string(), rate),
                    br.serve_bps.map_or_else(|| "-".to_string(), rate),
                    rate(br.promised_bps),
                    br.power.map_or_else(
                        || "-".to_string(),
                        |p| format!("{} W / {} W", p.idle_watts, p.busy_watts),
                    ),
                    br.stats
                        .as_ref()
                        .and_then(|s| s.connections)
                        .map_or_else(|| "-".to_string(), |c| c.to_string()),
                ]);
            }
            format!(
                "{} nodes, {} bricks, switches: {}; placement: {}\n{t}\n{b}",
                g.nodes.len(),
                g.bricks.len(),
                g.switches
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                g.placement
            )
        })?,
        CtlCommand::Alloc {
            node,
            size,
            stripe,
            bandwidth,
            bricks,
            placement,
            circuit,
        } => {
            let node = resolve_node(c, &node)?;
            let a = c.allocate(&AllocationRequest {
                node,
                size_bytes: size,
                stripe,
                bandwidth_bps: bandwidth,
                bricks: (!bricks.is_empty()).then_some(bricks),
                links: None,
                // The client picks a key (so its retries are safe); no holder: made by hand,
                // no agent ever reclaims it.
                idempotency_key: None,
                holder: None,
                placement,
                circuit: circuit.then_some(true),
            })?;
            print(json, &a, |a| {
                let mut t = table(&["segment", "brick", "offset", "size", "rate limit"]);
                for s in &a.segments {
                    t.add_row(vec![
                        s.segment_id.to_string(),
                        format!("{} {}", s.brick_id, s.brick_address),
                        s.offset.to_string(),
                        format_size(s.size_bytes),
                        rate(s.rate_limit_bps),
                    ]);
                }
                format!(
                    "allocation {} for node {}: {}\n{t}",
                    a.id,
                    a.node,
                    format_size(a.size_bytes)
                )
            })?
        }
        CtlCommand::Circuits { command: None } => print(json, &c.circuits()?, circuits_table)?,
        CtlCommand::Circuits {
            command: Some(CircuitCommand::Move { id, avoid }),
        } => print(
            json,
            &c.move_circuit(id, &rackmem_control::api::CircuitMove { avoid })?,
            |k| {
                format!(
                    "circuit of allocation {} now holds {}",
                    k.allocation,
                    k.links.join(", ")
                )
            },
        )?,
        CtlCommand::Free { id } => print(json, &c.free(id)?, |r| {
            if r.deferred {
                format!(
                    "allocation {} is in its node's pool and a process uses it: its agent releases it \
                     once none does",
                    r.id
                )
            } else {
                format!("released allocation {} ({} segments)", r.id, r.extents.len())
            }
        })?,
        CtlCommand::NodeQuota { node, size } => {
            let id = resolve_node(c, &node)?;
            let quota = match size.as_str() {
                "default" => None,
                s => Some(crate::values::parse_size_arg(s).map_err(CtlError::BadInput)?),
            };
            print(json, &c.set_node_quota(id, quota)?, |n| {
                format!(
                    "node {} may hold {} ({}); it holds {}",
                    n.name,
                    format_size(n.quota_bytes),
                    if n.quota_set { "its own quota" } else { "the default" },
                    format_size(n.allocated_bytes)
                )
            })?
        }
        CtlCommand::Resize { id, size } => print(json, &c.resize(id, size)?, |a| {
            format!(
                "allocation {} is now {} in {} segments",
                a.id,
                format_size(a.size_bytes),
                a.segments.len()
            )
        })?,
        CtlCommand::Token(TokenCommand::Create { role, name }) => {
            let role = rackmem_control::auth::Role::parse(&role)
                .ok_or_else(|| CtlError::BadInput(format!("--role {role}: use admin, node, brick or metrics")))?;
            let t = c.create_token(&TokenRequest { role, name })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&t).map_err(anyhow::Error::from)?);
            } else {
                // The token alone on stdout (`> file` keeps it); what it is on stderr.
                eprintln!(
                    "token {} for {} {:?} (shown once; revoke with `rackmem ctl token revoke {}`)",
                    t.id, t.role, t.name, t.id
                );
                println!("{}", t.token);
            }
        }
        CtlCommand::Token(TokenCommand::List) => print(json, &c.tokens()?, |tokens| {
            let mut t = table(&["id", "role", "name", "created"]);
            for k in tokens {
                t.add_row(vec![
                    k.id.to_string(),
                    k.role.to_string(),
                    k.name.clone(),
                    format!("{} s after the epoch", k.created_unix_ms / 1000),
                ]);
            }
            t.to_string()
        })?,
        CtlCommand::Token(TokenCommand::Revoke { id }) => print(json, &c.revoke_token(id)?, |k| {
            format!("revoked token {} ({} {:?})", k.id, k.role, k.name)
        })?,
        CtlCommand::ForgetBrick { brick } => {
            let id = match brick.parse::<u64>() {
                Ok(id) => id,
                Err(_) => c
                    .bricks()?
                    .into_iter()
                    .find(|b| b.name == brick)
                    .map(|b| b.id)
                    .ok_or_else(|| CtlError::BadInput(format!("no brick is named {brick:?}")))?,
            };
            print(json, &c.forget_brick(id)?, |b| {
                format!("forgot brick {} ({})", b.id, b.name)
            })?
        }
        CtlCommand::AddNode { name, ports } => {
            print(json, &c.register_node(&NodeRegistration { name, ports })?, |r| {
                format!("node id {}", r.id)
            })?
        }
    }
    Ok(())
}
