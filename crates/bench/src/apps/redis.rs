//! The `redis` application: Debian's `redis-server` (jemalloc inside) loaded with a key space
//! through `redis-cli --pipe`, then `redis-benchmark` issues random GETs over it from outside the
//! server's cgroup; GET ops/s and p99; `DEBUG DIGEST` of the data set is the result.

use super::app::{which, Prepared, Sizes};
use super::launch::{fail, Failure, Launch, Outcome};
use super::process::{exited, run_deadline, start_server, stop, vm_hwm};
use crate::BenchError;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// `redis-server`, once `redis-cli` and `redis-benchmark` are found too.
pub(super) fn prepare(sizes: Sizes, dir: PathBuf) -> Result<Prepared, BenchError> {
    which("redis-cli")?;
    which("redis-benchmark")?;
    Ok(Prepared {
        name: "redis",
        metric: "get_ops_per_s",
        prog: which("redis-server")?,
        args: vec![],
        input: None,
        stdin: None,
        sizes,
        dir,
        env: Vec::new(),
    })
}

/// The RESP protocol of `SET key:%012d value` for every key: values derived from the key, so
/// the data set (and its digest) is the same on every run.
fn redis_load(keys: u64, value: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity((keys * (value + 64)) as usize);
    for i in 0..keys {
        let key = format!("key:{i:012}");
        let mut v = format!("{i:x}-").into_bytes();
        let fill = b'a' + (i % 26) as u8;
        v.resize(value as usize, fill);
        out.extend_from_slice(format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n", key.len(), v.len()).as_bytes());
        out.extend_from_slice(&v);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn cli(sock: &Path, args: &[&str]) -> Result<String, Failure> {
    let mut c = Command::new("redis-cli");
    c.arg("-s").arg(sock).args(args);
    let d = run_deadline(c, None, Duration::from_secs(600))?;
    if !d.status.success() {
        return Err(fail(format!("redis-cli {}: {}", args.join(" "), d.stderr.trim())));
    }
    Ok(String::from_utf8_lossy(&d.stdout).trim().to_string())
}

/// The `redis` application: server where `launch` says, load and benchmark from here.
pub(super) fn run(p: &Prepared, launch: &mut Launch) -> Result<Outcome, Failure> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let sock = p.dir.join(format!("redis-{n}.sock"));
    // One log per run: a server that crashes before logging must not show an earlier run's lines.
    let log = p.dir.join(format!("redis-{n}.log"));
    let args: Vec<String> = [
        "--port",
        "0",
        "--unixsocket",
        &sock.to_string_lossy(),
        "--save",
        "",
        "--appendonly",
        "no",
        "--enable-debug-command",
        "local",
        "--logfile",
        &log.to_string_lossy(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (mut child, errs) = start_server(launch.command(&p.prog, &args), "redis-server")?;
    let died = |child: &mut std::process::Child, launch: &mut Launch, errs: std::thread::JoinHandle<String>| {
        let status = child.wait().ok();
        let mut e = errs.join().unwrap_or_default();
        e += &std::fs::read_to_string(&log).unwrap_or_default();
        match status {
            Some(s) => launch.failure("redis-server", s, &e),
            None => fail("redis-server: cannot wait for it"),
        }
    };
    let t0 = Instant::now();
    while !sock.exists() || cli(&sock, &["ping"]).map(|r| r != "PONG").unwrap_or(true) {
        if child.try_wait().ok().flatten().is_some() {
            return Err(died(&mut child, launch, errs));
        }
        if t0.elapsed() > Duration::from_secs(60) {
            stop(&mut child);
            return Err(fail("redis-server did not answer PING within 60 s"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let work = (|| -> Result<(f64, f64, String), Failure> {
        let mut c = Command::new("redis-cli");
        c.arg("-s").arg(&sock).arg("--pipe");
        let d = run_deadline(
            c,
            Some(redis_load(p.sizes.redis_keys, p.sizes.redis_value)),
            Duration::from_secs(900),
        )?;
        let out = String::from_utf8_lossy(&d.stdout);
        if !d.status.success() || !out.contains("errors: 0") {
            return Err(fail(format!("redis-cli --pipe: {} {}", out.trim(), d.stderr.trim())));
        }
        let mut b = Command::new("redis-benchmark");
        b.arg("-s")
            .arg(&sock)
            .args(["-t", "get", "-c", "32", "--csv", "-n"])
            .arg(p.sizes.redis_requests.to_string())
            .arg("-r")
            .arg(p.sizes.redis_keys.to_string())
            .arg("-d")
            .arg(p.sizes.redis_value.to_string());
        let d = run_deadline(b, None, Duration::from_secs(1800))?;
        let csv = String::from_utf8_lossy(&d.stdout);
        let (ops, p99) = parse_benchmark_csv(&csv).ok_or_else(|| {
            fail(format!(
                "redis-benchmark printed no GET line: {} {}",
                csv.trim(),
                d.stderr.trim()
            ))
        })?;
        let digest = cli(&sock, &["debug", "digest"])?;
        let size = cli(&sock, &["dbsize"])?;
        Ok((ops, p99, format!("{digest}/{size}")))
    })();
    let rss = match launch {
        Launch::Native => vm_hwm(child.id()),
        _ => None,
    };
    if work.is_err() && exited(&mut child, Duration::from_secs(2)) {
        let f = died(&mut child, launch, errs);
        let e = work.err().map(|e| e.reason).unwrap_or_default();
        return Err(Failure {
            reason: format!("{}; the load generator saw: {e}", f.reason),
            oom: f.oom,
        });
    }
    let _ = cli(&sock, &["shutdown", "nosave"]);
    let t1 = Instant::now();
    while child.try_wait().ok().flatten().is_none() && t1.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    match work {
        Ok((ops, p99, result)) => {
            stop(&mut child);
            let _ = child.wait();
            Ok(Outcome {
                metric: ops,
                p99_ms: Some(p99),
                result,
                peak_rss_bytes: rss,
            })
        }
        Err(e) => {
            // The server is still alive (see above): the load generator's error is the reason.
            stop(&mut child);
            let _ = child.wait();
            Err(e)
        }
    }
}

/// `(requests per second, p99 ms)` of the GET line of `redis-benchmark --csv`.
pub fn parse_benchmark_csv(csv: &str) -> Option<(f64, f64)> {
    let header: Vec<String> = csv
        .lines()
        .next()?
        .split(',')
        .map(|s| s.trim_matches('"').to_string())
        .collect();
    let rps = header.iter().position(|h| h == "rps")?;
    let p99 = header.iter().position(|h| h == "p99_latency_ms")?;
    let row: Vec<String> = csv
        .lines()
        .find(|l| l.starts_with("\"GET\""))?
        .split(',')
        .map(|s| s.trim_matches('"').to_string())
        .collect();
    Some((row.get(rps)?.parse().ok()?, row.get(p99)?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn benchmark_csv_gives_get_rps_and_p99() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                   \"GET\",\"84033.61\",\"0.343\",\"0.104\",\"0.327\",\"0.519\",\"0.671\",\"2.135\"\n";
        assert_eq!(parse_benchmark_csv(csv), Some((84033.61, 0.671)));
        assert_eq!(parse_benchmark_csv("\"test\",\"rps\"\n"), None);
    }

    #[test]
    fn redis_load_is_resp() {
        let l = redis_load(2, 16);
        let s = String::from_utf8_lossy(&l);
        assert!(
            s.starts_with("*3\r\n$3\r\nSET\r\n$16\r\nkey:000000000000\r\n$16\r\n0-aaaaaaaaaaaaaa\r\n"),
            "{s}"
        );
        assert_eq!(s.matches("SET").count(), 2);
    }
}
