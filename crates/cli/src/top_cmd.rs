//! `rackmem top`: the bricks and the programs running on agent memory, refreshed every second
//! from the control plane (`GET /v1/bricks`, `GET /v1/processes`), with rates computed between
//! refreshes. The terminal's view of what the dashboard at `/ui/` shows.

use crate::ctl_cmd::table;
use anyhow::{Context, Result};
use clap::Args;
use rackmem_control::api::{Brick, ProcessView};
use rackmem_proto::FAULT_LATENCY_BOUNDS_NS;
use rackmem_runtime::size::format_size;
use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

#[derive(Args)]
#[command(
    long_about = "Watch the rack like top: every brick (state, memory used, segments) and \
    every program running on memory from a node agent, with its local buffer, faults per second, \
    bytes fetched and written back per second, fault latency, miss concurrency (faults \
    outstanding at once), C-AMAT of the bricks' level (seed 002: mean fault time over miss \
    concurrency) and the share of its run spent waiting on remote memory.\n\n\
    Programs report to their agent every second and agents to the control plane every two, so \
    figures are a few seconds old at most; the age column says how old. Needs an admin or a \
    metrics token (`rackmem ctl token create --role metrics --name top`).\n\n\
    Examples:\n  rackmem top\n  rackmem top --once\n  rackmem top --json --once | jq '.processes[].report.faults'"
)]
pub struct TopArgs {
    /// Control plane URL(s), comma-separated.
    #[arg(
        long,
        value_name = "URL[,URL...]",
        env = crate::client_args::CONTROL_ENV,
        default_value = crate::client_args::DEFAULT_CONTROL
    )]
    control: String,
    #[command(flatten)]
    auth: crate::client_args::ControlAuthArgs,
    /// Seconds between refreshes.
    #[arg(long, value_name = "S", default_value_t = 1.0, value_parser = parse_interval)]
    interval: f64,
    /// Print one view and exit (no screen clearing: for logs and scripts).
    #[arg(long)]
    once: bool,
    /// Print each view as one JSON object (`{"bricks": [...], "processes": [...]}`).
    #[arg(long)]
    json: bool,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.1..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: give seconds between 0.1 and 3600")),
    }
}

/// What the previous refresh saw of each process, by node and pid.
pub(crate) type Previous = HashMap<(u64, u32), Seen>;

/// What one refresh saw of a process, to turn counters into rates at the next.
#[derive(Clone, Copy)]
pub(crate) struct Seen {
    at: Instant,
    faults: u64,
    fetched: u64,
    written: u64,
}

pub fn run(args: TopArgs) -> Result<i32> {
    let c = args
        .auth
        .client(&args.control, Some(crate::control_cmd::default_admin_token_file()))?;
    let mut seen = Previous::new();
    loop {
        let bricks = c.bricks().context("listing bricks")?;
        let processes = c.processes().context("listing processes")?;
        let now = Instant::now();
        let mut out = String::new();
        if args.json {
            out = serde_json::to_string(&serde_json::json!({"bricks": bricks, "processes": processes}))?;
            out.push('\n');
        } else {
            if !args.once {
                // Clear the screen and go home, as top does.
                out.push_str("\x1b[2J\x1b[H");
            }
            out.push_str(&format!("rackmem top: {}\n\n", args.control));
            out.push_str(&bricks_table(&bricks).to_string());
            out.push('\n');
            out.push_str(&processes_table(&processes, Some((&seen, now))).to_string());
            out.push('\n');
            if processes.iter().any(|p| !p.bricks.is_empty()) {
                out.push_str(&brick_levels_table(&processes).to_string());
                out.push('\n');
            }
        }
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(out.as_bytes())?;
        stdout.flush()?;
        if args.once {
            return Ok(0);
        }
        seen = processes
            .iter()
            .map(|p| {
                let r = &p.report;
                (
                    (p.node, r.pid),
                    Seen {
                        at: now,
                        faults: r.faults,
                        fetched: r.bytes_fetched + r.bytes_prefetched,
                        written: r.bytes_written_back,
                    },
                )
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(args.interval));
    }
}

fn bricks_table(bricks: &[Brick]) -> comfy_table::Table {
    let mut t = table(&["brick", "state", "used", "capacity", "segments", "resident"]);
    for b in bricks {
        t.add_row(vec![
            b.name.clone(),
            format!("{:?}", b.state).to_lowercase(),
            format_size(b.capacity_bytes.saturating_sub(b.free_bytes)),
            format_size(b.capacity_bytes),
            b.segments.to_string(),
            b.stats
                .as_ref()
                .and_then(|s| s.resident_bytes)
                .map_or("-".into(), format_size),
        ]);
    }
    t
}

/// The upper bound of the bucket where `q` of the faults fall (`-` before the first fault).
fn quantile(p: &ProcessView, q: f64) -> String {
    let h = &p.report.fault_latency;
    if h.count == 0 {
        return "-".into();
    }
    let want = (h.count as f64 * q).ceil() as u64;
    match FAULT_LATENCY_BOUNDS_NS
        .iter()
        .zip(&h.cumulative)
        .find(|(_, c)| **c >= want)
    {
        Some((b, _)) => format!("≤{}", micros(*b as f64)),
        None => format!(
            ">{}",
            micros(FAULT_LATENCY_BOUNDS_NS[FAULT_LATENCY_BOUNDS_NS.len() - 1] as f64)
        ),
    }
}

fn micros(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.0} ms", ns / 1e6)
    } else {
        format!("{:.0} µs", ns / 1e3)
    }
}

/// Each process's bricks' level, brick by brick (seed 002's C-AMAT terms): which brick a
/// program waits on, and how much of that waiting overlaps.
pub(crate) fn brick_levels_table(processes: &[ProcessView]) -> comfy_table::Table {
    let mut t = table(&[
        "node",
        "pid",
        "program",
        "brick",
        "faults",
        "pure misses",
        "C_M",
        "pure miss penalty",
        "C-AMAT",
    ]);
    for p in processes {
        let r = &p.report;
        let program = r.program.rsplit('/').next().unwrap_or(&r.program).to_string();
        for b in &p.bricks {
            t.add_row(vec![
                p.node_name.clone(),
                r.pid.to_string(),
                program.clone(),
                b.brick.clone(),
                b.faults.to_string(),
                b.pure_misses.to_string(),
                format!("{:.2}", b.miss_concurrency),
                micros(b.pure_miss_penalty_ns),
                micros(b.camat_ns),
            ]);
        }
    }
    t
}

/// The processes, with per-second rates against `before` (the previous refresh) when given.
pub(crate) fn processes_table(processes: &[ProcessView], before: Option<(&Previous, Instant)>) -> comfy_table::Table {
    let mut t = table(&[
        "node",
        "pid",
        "program",
        "up",
        "local / budget",
        "window",
        "faults",
        "faults/s",
        "in MB/s",
        "out MB/s",
        "p50",
        "p99",
        "C_M",
        "C-AMAT₂",
        "stalled",
        "age",
    ]);
    for p in processes {
        let r = &p.report;
        let per_s = |f: fn(&Seen) -> u64, now_v: u64| -> String {
            let Some((seen, now)) = before else { return "-".into() };
            let Some(s) = seen.get(&(p.node, r.pid)) else {
                return "-".into();
            };
            let dt = now.duration_since(s.at).as_secs_f64();
            if dt <= 0.0 {
                return "-".into();
            }
            format!("{:.1}", now_v.saturating_sub(f(s)) as f64 / dt)
        };
        let faults_s = per_s(|s| s.faults, r.faults);
        let mb = |v: String| v.parse::<f64>().map_or(v, |x| format!("{:.1}", x / 1e6));
        let program = r.program.rsplit('/').next().unwrap_or(&r.program).to_string();
        t.add_row(vec![
            p.node_name.clone(),
            r.pid.to_string(),
            program,
            format!("{:.0} s", r.uptime_ms as f64 / 1e3),
            format!("{} / {}", format_size(r.resident_bytes), format_size(r.budget_bytes)),
            format_size(r.window_bytes),
            r.faults.to_string(),
            faults_s,
            mb(per_s(|s| s.fetched, r.bytes_fetched + r.bytes_prefetched)),
            mb(per_s(|s| s.written, r.bytes_written_back)),
            quantile(p, 0.5),
            quantile(p, 0.99),
            format!("{:.2}", r.miss_concurrency),
            micros(p.bricks_camat_ns),
            format!("{:.0}%", p.stall_share * 100.0),
            format!("{:.1} s", p.age_ms as f64 / 1e3),
        ]);
    }
    t
}
