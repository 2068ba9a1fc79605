//! The program's own allocator under `rackmem run`: a program linked with jemalloc, and the same
//! program with tcmalloc or mimalloc preloaded after `librackmem.so`, runs the whole malloc
//! family (small blocks stay with its allocator, large ones and its large mappings go to the
//! window) with the native run's results; redis-server, which links jemalloc, starts and serves.

mod common;
use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Builds `tests/c/alloc_family.c` linked with jemalloc (Debian's libjemalloc-dev).
fn alloc_family_jemalloc() -> PathBuf {
    with_jemalloc("alloc_family")
}

/// Builds `tests/c/NAME.c` linked with jemalloc (Debian's libjemalloc-dev).
fn with_jemalloc(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/c/{name}.c"));
    let out = std::env::temp_dir().join(format!("rackmem-{name}-je-{}", std::process::id()));
    let o = Command::new("gcc")
        .args([
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-std=gnu11",
            "-pthread",
            "-DWITH_JEMALLOC",
            "-o",
        ])
        .arg(&out)
        .arg(&src)
        .args(["-ldl", "-ljemalloc"])
        .output()
        .expect("run gcc");
    assert!(
        o.status.success(),
        "cannot build {name} with jemalloc (needs Debian's libjemalloc-dev, installed by \
         scripts/programs.sh):\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// A shared library of the distribution, which must be installed (scripts/programs.sh).
fn system_lib(name: &str) -> String {
    let p = format!("/usr/lib/x86_64-linux-gnu/{name}");
    assert!(
        Path::new(&p).exists(),
        "{p} is missing: install it with scripts/programs.sh (Debian packages \
         libgoogle-perftools-dev / libmimalloc-dev)"
    );
    p
}

/// Runs `prog` natively and under `rackmem run --local 10%`, both with `LD_PRELOAD=preload`
/// when given; the checksums must match and the window must have carried the large blocks.
fn same_as_native_preloaded(prog: &Path, preload: Option<&str>) {
    let args = ["48"];
    let mut n = Command::new(prog);
    n.args(args);
    if let Some(p) = preload {
        n.env("LD_PRELOAD", p);
    }
    let native = run_with_deadline(n, LIMIT);
    assert!(native.status.success(), "native run failed: {}", show(&native));
    let stats = build_dir_file(&format!("alloc-{}.jsonl", unique()));
    let mut r = Command::new(rackmem());
    r.args(["run", "--local", "10%", "--stats-json"])
        .arg(&stats)
        .arg("--")
        .arg(prog)
        .args(args);
    if let Some(p) = preload {
        r.env("LD_PRELOAD", p);
    }
    let remote = run_with_deadline(r, LIMIT);
    assert!(remote.status.success(), "run under rackmem failed: {}", show(&remote));
    let (cn, cr) = (checksums(&native), checksums(&remote));
    assert_eq!(cn.len(), 2, "parent and child checksums expected: {}", show(&native));
    assert_eq!(cn, cr, "results under rackmem differ from the native run ({preload:?})");
    let s = read_stats(&stats);
    let p = busiest(&s);
    assert!(
        p.footprint_bytes() >= 40 << 20,
        "the large blocks did not go to the window: {p:?}"
    );
    assert!(
        p.evictions > 0 && p.bytes_written_back > 0 && p.bytes_fetched > 0,
        "no remote traffic at 10% local: {p:?}"
    );
}

fn build_dir_file(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rackmem-tests-{}-{name}", std::process::id()))
}

#[test]
fn glibc_family() {
    require_root();
    same_as_native_preloaded(&program("alloc_family"), None);
}

#[test]
fn linked_jemalloc_family_and_extended_api() {
    require_root();
    same_as_native_preloaded(&alloc_family_jemalloc(), None);
}

#[test]
fn preloaded_tcmalloc_family() {
    require_root();
    let lib = system_lib("libtcmalloc_minimal.so.4");
    same_as_native_preloaded(&program("alloc_family"), Some(&lib));
}

#[test]
fn preloaded_mimalloc_family() {
    require_root();
    let lib = system_lib("libmimalloc.so.2");
    same_as_native_preloaded(&program("alloc_family"), Some(&lib));
}

/// Threads keep allocating small blocks from jemalloc while the main thread's first large
/// allocation starts the runtime: none of their allocations may fail, and every block must hold
/// what was written. While a runtime thread starts, every thread's C allocations go to the
/// runtime's glibc table (the new thread's own set-up must not reach the program's allocator);
/// a starting thread that the scheduler left waiting once let a program's threads fill that
/// table, and Redis aborted on ENOMEM in CI. The program runs on one CPU, which makes that wait
/// likely: before the fix, two runs in five failed.
#[test]
fn threads_allocating_while_the_runtime_starts_never_see_enomem() {
    require_root();
    let prog = with_jemalloc("spawn_window");
    let native = run_with_deadline(Command::new(&prog), LIMIT);
    assert!(native.status.success(), "native run failed: {}", show(&native));
    let want = String::from_utf8_lossy(&native.stdout).into_owned();
    assert!(
        want.starts_with("checksum="),
        "native run printed no checksum: {}",
        show(&native)
    );
    for round in 0..8 {
        let stats = build_dir_file(&format!("spawn-{}.jsonl", unique()));
        let mut r = Command::new(rackmem());
        r.args(["run", "--local", "25%", "--stats-json"])
            .arg(&stats)
            .arg("--")
            .arg(&prog);
        let o = run_with_deadline(r, LIMIT);
        assert!(o.status.success(), "round {round} under rackmem failed: {}", show(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            want,
            "round {round}: results under rackmem differ from the native run"
        );
        let s = read_stats(&stats);
        let p = busiest(&s);
        assert!(
            p.footprint_bytes() >= 64 << 20,
            "round {round}: the large block did not go to the window, so the runtime never started: {p:?}"
        );
        let _ = std::fs::remove_file(&stats);
    }
}

/// Sends one RESP command and reads one reply (bulk strings returned whole).
fn resp(conn: &mut BufReader<TcpStream>, args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n", a.len()).as_bytes());
        out.extend(*a);
        out.extend(b"\r\n");
    }
    conn.get_mut().write_all(&out).expect("send to redis");
    let mut line = String::new();
    conn.read_line(&mut line).expect("redis reply");
    if let Some(n) = line.strip_prefix('$') {
        let n: usize = n.trim().parse().expect("bulk length");
        let mut v = vec![0; n + 2];
        conn.read_exact(&mut v).expect("bulk body");
        v.truncate(n);
        return v;
    }
    line.into_bytes()
}

#[test]
fn redis_server_linked_with_jemalloc_serves() {
    require_root();
    assert!(
        Path::new("/usr/bin/redis-server").exists(),
        "redis-server is missing: install it with scripts/programs.sh"
    );
    let port = 17000 + (std::process::id() % 2000) as u16;
    let stats = build_dir_file("redis.jsonl");
    let mut cmd = Command::new(rackmem());
    cmd.args(["run", "--local", "25%", "--stats-json"])
        .arg(&stats)
        .args([
            "--",
            "redis-server",
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut g = Guard::spawn(&mut cmd);
    let start = Instant::now();
    let stream = loop {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
            break s;
        }
        if let Some(st) = g.child().try_wait().expect("try_wait") {
            let mut e = String::new();
            let _ = g.child().stderr.take().map(|mut x| x.read_to_string(&mut e));
            panic!("redis-server under rackmem exited ({st}) before serving:\n{e}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "redis-server did not start serving in 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let mut conn = BufReader::new(stream);
    let value = |i: usize| -> Vec<u8> {
        (0..(1usize << 20))
            .map(|k| (k.wrapping_mul(31) ^ (i * 7) ^ (k >> 9)) as u8)
            .collect()
    };
    for i in 0..24 {
        let r = resp(&mut conn, &[b"SET", format!("key{i}").as_bytes(), &value(i)]);
        assert_eq!(r, b"+OK\r\n", "SET key{i}: {}", String::from_utf8_lossy(&r));
    }
    for i in 0..24 {
        let r = resp(&mut conn, &[b"GET", format!("key{i}").as_bytes()]);
        assert!(r == value(i), "GET key{i} returned other bytes ({} bytes)", r.len());
    }
    let _ = resp(&mut conn, &[b"SHUTDOWN", b"NOSAVE"]);
    let st = g
        .wait_until(Duration::from_secs(30))
        .expect("redis-server did not stop after SHUTDOWN");
    let s = read_stats(&stats);
    let p = busiest(&s);
    assert!(
        p.footprint_bytes() >= 24 << 20,
        "the values did not go to the window: {p:?} ({st})"
    );
    assert!(
        p.evictions > 0 && p.bytes_fetched > 0,
        "no remote traffic at 25% local: {p:?}"
    );
}
