//! `rackmem migrate --pid PID --range ADDR:LEN --to local|BRICK`: moves a range of a running
//! program's memory through the node agent (the program runs on agent memory; the agent passes
//! the order to its runtime, which moves the range as `rackmem_migrate` would and answers with
//! the four step times).

use crate::agent_cmd::DEFAULT_SOCKET;
use anyhow::Result;
use clap::Args;
use rackmem_proto::{AgentReply, AgentRequest};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Exit statuses of `rackmem migrate` (sysexits where one fits).
pub mod exit {
    /// The move failed (a brick failed during it, or the range is busy): the range stays where
    /// it was.
    pub const FAILED: i32 = 1;
    /// A bad request: a range outside the program's window, an unknown brick.
    pub const BAD_INPUT: i32 = 65;
    /// No such process takes orders from this agent.
    pub const NO_PROCESS: i32 = 67;
    /// The agent cannot be reached.
    pub const UNREACHABLE: i32 = 69;
    /// The target has no room (the brick is full, or the local buffer too small to pin it).
    pub const NO_SPACE: i32 = 73;
    /// The process is busy with another order, or did not answer in time.
    pub const TEMPORARY: i32 = 75;
    /// Only root and the process's owner may move its memory.
    pub const DENIED: i32 = 77;
}

#[derive(Args)]
#[command(
    long_about = "Move a range of a running program's memory to the local buffer or to a brick, while it \
        runs. The program runs on agent memory (rackmem run --agent); the node agent passes the \
        order to the program's runtime, which moves the range (no write is lost) and answers with \
        the migration's four step times.\n\n\
        Examples:\n  \
        rackmem migrate --pid 4242 --range 0x7f0000000000:64MiB --to b1\n  \
        rackmem migrate --pid 4242 --range 0x7f0000000000:8MiB --to local --json\n\n\
        Exit status: 0 moved; 1 the move failed (the range stays where it was); 65 bad request \
        (range outside the program's window, unknown brick); 67 no such process on agent memory; \
        69 the agent cannot be reached; 73 the target has no room; 75 the process is busy with \
        another order or did not answer within --timeout; 77 not root nor the process's owner."
)]
pub struct MigrateArgs {
    /// The process whose memory moves.
    #[arg(long)]
    pid: u32,
    /// The range: ADDR:LEN, the address in hex (0x...) or decimal, the length a size (64MiB).
    #[arg(long, value_name = "ADDR:LEN", value_parser = parse_range)]
    range: (u64, u64),
    /// Where to: `local` (fetched and pinned in the local buffer) or a brick (name, id or address).
    #[arg(long, value_name = "local|BRICK")]
    to: String,
    /// The node agent's socket.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    agent: String,
    /// How long to wait for the move (500ms, 30s, 2m; at most 10m).
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = crate::values::parse_duration)]
    timeout: Duration,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// `ADDR:LEN`.
fn parse_range(s: &str) -> Result<(u64, u64), String> {
    let (a, l) = s
        .split_once(':')
        .ok_or_else(|| format!("`{s}`: a range is ADDR:LEN, e.g. 0x7f0000000000:64MiB"))?;
    let a = a.trim();
    let addr = match a.strip_prefix("0x").or_else(|| a.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => a.parse(),
    }
    .map_err(|_| format!("`{a}` is not an address (hex 0x... or decimal)"))?;
    let len = crate::values::parse_size_arg(l)?;
    if len == 0 {
        return Err(format!("`{s}`: the length is zero"));
    }
    Ok((addr, len))
}

/// The exit status of a refusal's code.
fn status(code: &str) -> i32 {
    match code {
        "outside_window" | "unknown_brick" | "not_found" | "bad_request" => exit::BAD_INPUT,
        "unknown_process" => exit::NO_PROCESS,
        "no_space" => exit::NO_SPACE,
        "busy" | "timeout" => exit::TEMPORARY,
        "permission_denied" => exit::DENIED,
        "control_plane_unreachable" => exit::UNREACHABLE,
        _ => exit::FAILED,
    }
}

fn call(s: &mut UnixStream, reader: &mut BufReader<UnixStream>, req: &AgentRequest) -> std::io::Result<AgentReply> {
    let mut line = serde_json::to_string(req).map_err(std::io::Error::other)?;
    line.push('\n');
    s.write_all(line.as_bytes())?;
    let mut answer = String::new();
    if Read::take(&mut *reader, 64 << 10).read_line(&mut answer)? == 0 {
        return Err(std::io::Error::other("the agent closed the connection"));
    }
    serde_json::from_str(&answer).map_err(std::io::Error::other)
}

pub fn run(args: MigrateArgs) -> Result<i32> {
    let (addr, len) = args.range;
    let timeout = args.timeout.min(Duration::from_secs(600));
    let unreachable = |e: std::io::Error| {
        eprintln!("rackmem migrate: node agent at {}: {e}", args.agent);
        exit::UNREACHABLE
    };
    let mut s = match UnixStream::connect(&args.agent) {
        Ok(s) => s,
        Err(e) => return Ok(unreachable(e)),
    };
    // The agent answers within the order's timeout; a little more for the control plane's
    // look-up of the brick.
    let wait = timeout + Duration::from_secs(10);
    let reader = s
        .set_read_timeout(Some(wait))
        .and_then(|_| s.set_write_timeout(Some(wait)))
        .and_then(|_| s.try_clone());
    let mut reader = match reader {
        Ok(r) => BufReader::new(r),
        Err(e) => return Ok(unreachable(e)),
    };
    let hello = AgentRequest::Hello {
        pid: std::process::id(),
        program: "rackmem migrate".into(),
    };
    let order = AgentRequest::Migrate {
        pid: args.pid,
        addr,
        len,
        to: args.to.clone(),
        order: 0,
        timeout_ms: timeout.as_millis().max(1) as u64,
    };
    let r =
        match call(&mut s, &mut reader, &hello).and_then(
            |h| {
                if h.ok {
                    call(&mut s, &mut reader, &order)
                } else {
                    Ok(h)
                }
            },
        ) {
            Ok(r) => r,
            Err(e) => return Ok(unreachable(e)),
        };
    match (r.ok, r.migration) {
        (true, Some(m)) => {
            if args.json {
                let v = serde_json::json!({
                    "pid": args.pid,
                    "addr": addr,
                    "len": len,
                    "to": args.to,
                    "setup_ns": m.setup_ns,
                    "allocate_ns": m.allocate_ns,
                    "transfer_ns": m.transfer_ns,
                    "finalize_ns": m.finalize_ns,
                    "bytes": m.bytes,
                });
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let total = m.setup_ns + m.allocate_ns + m.transfer_ns + m.finalize_ns;
                println!(
                    "moved {:#x}+{} of process {} to {}: {} carried in {:.3} ms",
                    addr,
                    rackmem_runtime::size::format_size(len),
                    args.pid,
                    args.to,
                    rackmem_runtime::size::format_size(m.bytes),
                    total as f64 / 1e6
                );
                let mut t = crate::ctl_cmd::table(&["step", "ms", "share"]);
                for (name, ns) in [
                    ("setup", m.setup_ns),
                    ("allocate", m.allocate_ns),
                    ("transfer", m.transfer_ns),
                    ("finalize", m.finalize_ns),
                ] {
                    t.add_row(vec![
                        name.to_string(),
                        format!("{:.3}", ns as f64 / 1e6),
                        format!("{:.0}%", 100.0 * ns as f64 / total.max(1) as f64),
                    ]);
                }
                println!("{t}");
            }
            Ok(0)
        }
        (true, None) => {
            eprintln!("rackmem migrate: the agent answered without the migration's times");
            Ok(exit::FAILED)
        }
        (false, _) => {
            let e = r.error.unwrap_or_default();
            if args.json {
                let v = serde_json::json!({ "pid": args.pid, "error": { "code": e.code, "message": e.message } });
                println!("{}", serde_json::to_string_pretty(&v)?);
            }
            eprintln!("rackmem migrate: {}: {}", e.code, e.message);
            Ok(status(&e.code))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse() {
        assert_eq!(parse_range("0x1000:8KiB"), Ok((0x1000, 8192)));
        assert_eq!(parse_range("4096:4096"), Ok((4096, 4096)));
        assert!(parse_range("0x1000").is_err());
        assert!(parse_range("zz:4096").is_err());
        assert!(parse_range("0x1000:0").is_err());
    }
}
