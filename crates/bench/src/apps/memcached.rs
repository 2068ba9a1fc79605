//! The `memcached` application: Debian's `memcached`, loaded and then read with random GETs by a
//! small generator in this crate ([`crate::kvload`]: four connections, one request at a time
//! each, every answer checked); GET ops/s and p99; the hash of every answer is the result.

use super::app::{which, Prepared, Sizes};
use super::launch::{fail, Failure, Launch, Outcome};
use super::process::{exited, start_server, stop, vm_hwm};
use crate::BenchError;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// `memcached`; its options depend on the run (socket, memory).
pub(super) fn prepare(sizes: Sizes, dir: PathBuf) -> Result<Prepared, BenchError> {
    Ok(Prepared {
        name: "memcached",
        metric: "get_ops_per_s",
        prog: which("memcached")?,
        args: vec![],
        input: None,
        stdin: None,
        sizes,
        dir,
        env: Vec::new(),
    })
}

/// The `memcached` application: server where `launch` says, the generator here.
pub(super) fn run(p: &Prepared, launch: &mut Launch) -> Result<Outcome, Failure> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let sock = p
        .dir
        .join(format!("memcached-{}.sock", N.fetch_add(1, Ordering::Relaxed)));
    // Room for twice the data: nothing is evicted, so every GET finds its key and the answers
    // are the same in every setup.
    let mem_mib = ((p.sizes.redis_keys * (p.sizes.redis_value + 100) * 2) >> 20).max(64);
    let mut args: Vec<String> = vec![
        "-s".into(),
        sock.to_string_lossy().into_owned(),
        "-m".into(),
        mem_mib.to_string(),
        "-t".into(),
        "2".into(),
        "-U".into(),
        "0".into(),
    ];
    if crate::swap::require_root("").is_ok() {
        // memcached refuses to run as root unless told which user to be.
        args.extend(["-u".into(), "root".into()]);
    }
    let (mut child, errs) = start_server(launch.command(&p.prog, &args), "memcached")?;
    let t0 = Instant::now();
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        if child.try_wait().ok().flatten().is_some() || t0.elapsed() > Duration::from_secs(60) {
            stop(&mut child);
            let status = child.wait().map_err(|e| fail(format!("waiting for memcached: {e}")))?;
            return Err(launch.failure("memcached", status, &errs.join().unwrap_or_default()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let load = crate::kvload::Load {
        keys: p.sizes.redis_keys,
        value_bytes: p.sizes.redis_value as usize,
        gets: p.sizes.redis_requests,
        connections: 4,
    };
    let r = crate::kvload::run(&sock, &load);
    let rss = match launch {
        Launch::Native => vm_hwm(child.id()),
        _ => None,
    };
    let alive = !exited(&mut child, Duration::from_secs(if r.is_err() { 2 } else { 0 }));
    if alive {
        stop(&mut child);
    }
    let status = child.wait().map_err(|e| fail(format!("waiting for memcached: {e}")))?;
    let e = errs.join().unwrap_or_default();
    match r {
        Ok(o) if alive => Ok(Outcome {
            metric: o.gets_per_s,
            p99_ms: Some(o.p99_us / 1000.0),
            result: o.digest,
            peak_rss_bytes: rss,
        }),
        Ok(_) => Err(launch.failure("memcached", status, &e)),
        Err(err) if !alive => {
            let f = launch.failure("memcached", status, &e);
            Err(Failure {
                reason: format!("{}; the load generator saw: {err}", f.reason),
                oom: f.oom,
            })
        }
        Err(err) => Err(fail(format!("memcached load: {err}"))),
    }
}
