//! The bench commands on tiny sizes: they run, write well-formed JSON and a chart, and leave the
//! machine as they found it (no swap on, zram reset, no cgroup left), also when they fail.
//! Figures are never asserted here.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The tests that switch a swap peer on take turns: each compares the machine before and after
/// itself (swap, zram, cgroups), and a second one running beside it (`--test-threads=2`) would
/// find the first one's zram device set up and fail, or reset it under the first.
static SWAP_PEERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn swap_turn() -> std::sync::MutexGuard<'static, ()> {
    SWAP_PEERS.lock().unwrap_or_else(|e| e.into_inner())
}

fn machine_state() -> (String, String, Vec<String>) {
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    let zram = std::fs::read_to_string("/sys/block/zram0/disksize").unwrap_or_default();
    let mut cgroups: Vec<String> = ["/sys/fs/cgroup/memory", "/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("rackmem-bench"))
        .collect();
    cgroups.sort();
    (swaps, zram, cgroups)
}

fn bench(args: &[&str]) -> std::process::Output {
    let mut c = Command::new(rackmem());
    c.arg("bench")
        .args(args)
        .arg("--bench-dir")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench"));
    run_with_deadline(c, Duration::from_secs(300))
}

#[test]
fn floors_latency_and_scan_write_json() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let chart = |name: &str, labels: &[&str]| {
        let svg = std::fs::read_to_string(dir.path().join(name)).expect("chart written");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
        for l in labels {
            assert!(svg.contains(l), "chart {name} lacks {l}: {svg}");
        }
    };
    let svg_arg = |name: &str| dir.path().join(name).to_str().expect("path").to_string();
    let j = dir.path().join("floors.json");
    let o = bench(&[
        "floors",
        "--samples",
        "400",
        "--json",
        j.to_str().expect("path"),
        "--svg",
        &svg_arg("floors.svg"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&j).expect("json")).expect("well-formed JSON");
    let floors = v["floors"].as_array().expect("floors array");
    assert_eq!(floors.len(), 6, "two uffd floors and four link floors: {v}");
    assert!(floors
        .iter()
        .all(|f| f["p50_us"].as_f64().is_some_and(|x| x > 0.0) && f["samples"].as_u64() > Some(0)));
    chart("floors.svg", &["uffd floor", "link floor, unix", "link floor, tcp"]);

    let j = dir.path().join("latency.json");
    let o = bench(&[
        "latency",
        "--samples",
        "400",
        "--mib",
        "16",
        "--links",
        "tcp,tls",
        "--json",
        j.to_str().expect("path"),
        "--svg",
        &svg_arg("latency.svg"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    chart("latency.svg", &["remote 4 KiB fault", "uffd floor"]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&j).expect("json")).expect("well-formed JSON");
    assert!(v["ratio_to_floors"].as_f64().is_some_and(|r| r > 0.0), "{v}");
    // Over plain and TLS loopback bricks too, with what TLS costs (no bound on it: timings).
    assert!(v["tls_vs_tcp"]["p50"].as_f64().is_some_and(|r| r > 0.0), "{v}");
    let rows = v["rows"].as_array().expect("rows");
    assert!(
        rows.iter()
            .any(|r| r["name"].as_str().is_some_and(|n| n.contains("tls link"))),
        "{v}"
    );

    let j = dir.path().join("scan.json");
    let o = bench(&[
        "scan",
        "--mib",
        "16",
        "--passes",
        "1",
        "--links",
        "tcp,tls",
        "--json",
        j.to_str().expect("path"),
        "--svg",
        &svg_arg("scan.svg"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    chart("scan.svg", &["rackmem 25% local"]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&j).expect("json")).expect("well-formed JSON");
    // Native, then 100%, 50% and 25% local on the embedded brick, over tcp and over tls; each
    // run's checksum was checked against native's by the bench itself.
    assert_eq!(v["scan"].as_array().map(Vec::len), Some(10), "{v}");
    assert_eq!(v["tls_vs_tcp"].as_array().map(Vec::len), Some(3), "{v}");
}

/// A held-out program (Debian's sysbench, which nobody here wrote) through the same bench:
/// natively, under rackmem's defaults and under zram, its throughput parsed from its own output.
#[test]
fn held_out_sysbench_runs_natively_under_rackmem_and_under_zram() {
    require_root();
    let _turn = swap_turn();
    assert!(
        Path::new("/usr/bin/sysbench").exists(),
        "this test needs sysbench (apt-get install sysbench; ./scripts/programs.sh does)"
    );
    let before = machine_state();
    let dir = tempfile::tempdir().expect("tempdir");
    let j = dir.path().join("w.json");
    let o = bench(&[
        "workloads",
        "--scale",
        "0.05",
        "--only",
        "sysbench-write,sysbench-read",
        "--locals",
        "25",
        "--transports",
        "defaults",
        "--peers",
        "zram",
        "--peer-locals",
        "25",
        "--json",
        j.to_str().expect("path"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&j).expect("json")).expect("well-formed JSON");
    let rows = v["workloads"].as_array().expect("rows");
    for w in ["sysbench-write", "sysbench-read"] {
        for setup in ["native", "rackmem defaults", "zram"] {
            let r = rows
                .iter()
                .find(|r| r["workload"] == w && r["setup"] == setup)
                .unwrap_or_else(|| panic!("no {w} row for {setup}: {v}"));
            assert_eq!(r["metric"], "mib_per_s", "{r}");
            assert!(r["value"].as_f64().is_some_and(|x| x > 0.0), "{r}");
        }
    }
    assert_eq!(machine_state(), before, "swap, zram and cgroups are as they were");
}

#[test]
fn workloads_with_swap_peers_clean_up_on_success_and_on_failure() {
    require_root();
    let _turn = swap_turn();
    let before = machine_state();
    assert_eq!(
        before.0.lines().count(),
        1,
        "this test needs swap off to start with: {}",
        before.0
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let (j, svg) = (dir.path().join("w.json"), dir.path().join("w.svg"));
    let o = bench(&[
        "workloads",
        "--scale",
        "0.01",
        "--only",
        "scan,gups",
        "--locals",
        "25,100",
        "--transports",
        "defaults,previous-defaults",
        "--cpus",
        "0",
        "--repeat",
        "2",
        "--peers",
        "zram,file",
        "--peer-locals",
        "25",
        "--swap-dir",
        dir.path().to_str().expect("path"),
        "--json",
        j.to_str().expect("path"),
        "--svg",
        svg.to_str().expect("path"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&j).expect("json")).expect("well-formed JSON");
    assert_eq!(v["cpus"], serde_json::json!([0]), "{v}");
    let rows = v["workloads"].as_array().expect("rows");
    for setup in ["rackmem defaults", "rackmem previous-defaults"] {
        assert!(
            rows.iter().any(|r| r["setup"] == setup),
            "the {setup} setup ran, side by side with the other: {v}"
        );
    }
    // Per workload: native, 2 locals × 2 setups, 2 peers × 1 local.
    assert_eq!(rows.len(), 2 * (1 + 4 + 2), "{v}");
    // rackmem rows carry each run's counters and wall time, so that `rackmem model check`
    // predicts their slowdowns from C-AMAT.
    for r in rows
        .iter()
        .filter(|r| r["setup"].as_str().is_some_and(|s| s.starts_with("rackmem")))
    {
        assert_eq!(r["counters"].as_array().map(Vec::len), Some(2), "{r}");
        assert_eq!(r["wall_s"].as_array().map(Vec::len), Some(2), "{r}");
    }
    let mut c = Command::new(rackmem());
    c.args(["model", "check"]).arg(&j);
    let check = run_with_deadline(c, Duration::from_secs(60));
    assert!(check.status.success(), "{}", show(&check));
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(text.contains("C-AMAT predicts") && text.contains("gups"), "{text}");
    assert!(rows.iter().all(|r| r["value"].as_f64().is_some_and(|x| x > 0.0)));
    assert_eq!(v["repeat"], 2);
    for r in rows {
        let vals: Vec<f64> = r["values"]
            .as_array()
            .expect("values")
            .iter()
            .filter_map(|x| x.as_f64())
            .collect();
        assert_eq!(vals.len(), 2, "every setup ran twice: {r}");
        let median = (vals[0] + vals[1]) / 2.0;
        let value = r["value"].as_f64().expect("value");
        assert!(
            (value - median).abs() <= 1e-9 * median.abs().max(1.0),
            "value is the median: {r}"
        );
    }
    // Native and the rackmem setups take turns: each rackmem run starts after the native run of
    // its round and before the next round's.
    let started = |r: &serde_json::Value| -> Vec<f64> {
        r["started_s"]
            .as_array()
            .expect("started_s")
            .iter()
            .filter_map(|x| x.as_f64())
            .collect()
    };
    for w in ["scan", "gups"] {
        let native = rows
            .iter()
            .find(|r| r["workload"] == w && r["setup"] == "native")
            .map(started)
            .expect("native row");
        assert_eq!(native.len(), 2, "{v}");
        for r in rows
            .iter()
            .filter(|r| r["workload"] == w && r["setup"].as_str().is_some_and(|s| s.starts_with("rackmem")))
        {
            let s = started(r);
            assert!(
                s[0] > native[0] && s[0] < native[1] && s[1] > native[1],
                "rounds interleave: native {native:?}, {r}"
            );
        }
    }
    assert!(
        rows.iter().any(|r| r["speedup_vs_zram"].as_f64().is_some()),
        "speed-ups against the peers: {v}"
    );
    let chart = std::fs::read_to_string(&svg).expect("chart");
    assert!(chart.starts_with("<svg") && chart.contains("scan") && chart.contains("zram"));
    assert_eq!(machine_state(), before, "the machine must be left as it was found");

    // A failing peer (its swap file cannot be created) still leaves nothing behind.
    let o = bench(&[
        "workloads",
        "--scale",
        "0.01",
        "--only",
        "scan",
        "--locals",
        "25",
        "--transports",
        "unix",
        "--peers",
        "zram,file",
        "--peer-locals",
        "25",
        "--swap-dir",
        "/nonexistent/dir",
    ]);
    assert!(!o.status.success(), "a swap file in a missing directory must fail");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("/nonexistent/dir"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        machine_state(),
        before,
        "the machine must be left as it was found after a failure"
    );

    // Interrupted like Ctrl-C (SIGINT to the whole process group) while a peer runs: swap, zram
    // and the cgroup are undone all the same, and the exit status says it did not finish.
    let mut c = Command::new(rackmem());
    c.args([
        "bench",
        "workloads",
        "--scale",
        "0.25",
        "--only",
        "scan",
        "--locals",
        "25",
        "--transports",
        "unix",
        "--peers",
        "zram",
        "--peer-locals",
        "25",
        "--bench-dir",
    ])
    .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench"))
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    let mut g = Guard::spawn(&mut c);
    let start = std::time::Instant::now();
    while std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .count()
        < 2
    {
        assert!(
            g.child().try_wait().expect("wait").is_none(),
            "the bench ended before its swap peer started"
        );
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the swap peer never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let sent = Command::new("kill")
        .args(["-INT", "--", &format!("-{}", g.id())])
        .status()
        .expect("kill");
    assert!(sent.success());
    let status = g
        .wait_until(Duration::from_secs(120))
        .expect("the bench stops after SIGINT");
    assert!(!status.success(), "an interrupted bench must not report success");
    assert_eq!(
        machine_state(),
        before,
        "the machine must be left as it was found after an interruption"
    );
}

/// The effective user is root, or the test fails saying why it needs it.
fn need_root(what: &str) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .unwrap_or("?")
        .to_string();
    assert_eq!(
        euid, "0",
        "{what} needs root (userfaultfd for rackmem run; swap and memory cgroups for the peers); run ./scripts/test as root"
    );
}

fn apps_json(path: &Path) -> Vec<serde_json::Value> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("json")).expect("well-formed JSON");
    v["apps"].as_array().expect("an apps array").clone()
}

/// Every row is well formed, and every run of every setup computed what the native run did.
fn check_rows(rows: &[serde_json::Value], apps: &[&str], setups_per_app: usize) {
    assert_eq!(rows.len(), apps.len() * setups_per_app, "{rows:#?}");
    for app in apps {
        let of: Vec<&serde_json::Value> = rows.iter().filter(|r| r["app"] == *app).collect();
        let native = of.iter().find(|r| r["setup"] == "native").expect("a native row");
        let expect = native["results"][0].as_str().expect("native result").to_string();
        assert!(!expect.is_empty(), "{native}");
        assert_eq!(native["vs_native"].as_f64(), Some(1.0), "{native}");
        let footprint = native["footprint_bytes"].as_u64().expect("footprint");
        assert!(footprint > 1 << 20, "peak RSS measured natively: {native}");
        for r in &of {
            assert_eq!(r["footprint_bytes"].as_u64(), Some(footprint), "{r}");
            assert!(r["metric"].as_str().is_some_and(|m| !m.is_empty()), "{r}");
            let results: Vec<&str> = r["results"]
                .as_array()
                .expect("results")
                .iter()
                .filter_map(|x| x.as_str())
                .collect();
            if r["oom"].is_object() {
                // A peer killed by its cgroup says why, with the cgroup's figures.
                assert!(r["error"].as_str().is_some_and(|e| e.contains("OOM-killed")), "{r}");
                assert!(
                    r["oom"]["limit_bytes"].as_u64() == r["cgroup_limit_bytes"].as_u64(),
                    "{r}"
                );
                assert!(r["oom"]["failcnt"].as_u64().is_some(), "{r}");
                continue;
            }
            assert!(
                r["error"].is_null(),
                "{app} under {} {}%: {r}",
                r["setup"],
                r["local_pct"]
            );
            assert_eq!(r["result_matches_native"], true, "{r}");
            assert!(!results.is_empty() && results.iter().all(|x| *x == expect), "{r}");
            let values = r["values"].as_array().expect("values");
            assert_eq!(values.len(), results.len(), "{r}");
            assert!(r["value"].as_f64().is_some_and(|v| v > 0.0), "{r}");
            assert!(r["vs_native"].as_f64().is_some_and(|v| v > 0.0), "{r}");
        }
    }
}

#[test]
fn apps_under_rackmem_compute_what_they_compute_natively() {
    need_root("bench apps");
    let dir = tempfile::tempdir().expect("tempdir");
    let (j, svg) = (dir.path().join("apps.json"), dir.path().join("apps.svg"));
    let o = bench(&[
        "apps",
        "--scale",
        "0.02",
        "--only",
        "kmeans,memcached,sqlite,xz",
        "--locals",
        "25,50",
        "--peers",
        "",
        "--repeat",
        "2",
        "--json",
        j.to_str().expect("path"),
        "--svg",
        svg.to_str().expect("path"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows = apps_json(&j);
    // Per application: native and rackmem at two local buffers.
    check_rows(&rows, &["memcached", "sqlite", "kmeans", "xz"], 3);
    for r in &rows {
        assert_eq!(
            r["values"].as_array().map(Vec::len),
            Some(2),
            "every setup ran twice: {r}"
        );
    }
    let kv = rows
        .iter()
        .find(|r| r["app"] == "memcached" && r["setup"] == "rackmem")
        .expect("row");
    assert!(
        kv["p99_ms"].as_f64().is_some_and(|p| p > 0.0),
        "a key-value server reports p99: {kv}"
    );
    // Every run under rackmem says what it moved; a batch program at 25% faulted.
    for r in rows.iter().filter(|r| r["setup"] == "rackmem") {
        let stats = r["rackmem_stats"].as_array().cloned().unwrap_or_default();
        assert_eq!(stats.len(), 2, "one statistics object per run: {r}");
        if r["app"] != "memcached" && r["local_pct"] == 25 {
            for s in &stats {
                assert!(
                    s["processes"].as_u64().is_some_and(|n| n >= 1) && s["faults"].as_u64().is_some_and(|n| n > 0),
                    "a run at 25% with no process statistics or no fault: {r}"
                );
            }
        }
    }
    assert!(
        rows.iter()
            .filter(|r| r["setup"] == "native")
            .all(|r| r.get("rackmem_stats").is_none()),
        "native rows carry no rackmem statistics"
    );
    let chart = std::fs::read_to_string(&svg).expect("chart");
    assert!(chart.starts_with("<svg") && chart.contains("kmeans") && chart.contains("rackmem 25%"));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("= native"), "{table}");
}

/// The far-memory papers' kinds of work (issue 21) at a tiny scale: each runs natively and under
/// rackmem at 25% and computes what it computed natively (the bench compares every checksum);
/// the random updates end with the same array for 1, 2 and all threads; seed 002's slowdowns sit
/// beside ours.
#[test]
fn papers_kinds_of_work_compute_what_they_compute_natively() {
    need_root("bench apps");
    let dir = tempfile::tempdir().expect("tempdir");
    let j = dir.path().join("apps.json");
    let apps = [
        "numpy-linalg",
        "numpy-kmeans",
        "qsort",
        "pydict",
        "updates-1",
        "updates-2",
        "updates-all",
    ];
    let o = bench(&[
        "apps",
        "--scale",
        "0.01",
        "--only",
        &apps.join(","),
        "--locals",
        "25",
        "--peers",
        "",
        "--json",
        j.to_str().expect("path"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows = apps_json(&j);
    check_rows(&rows, &apps, 2);
    let updates: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["app"].as_str().is_some_and(|a| a.starts_with("updates-")))
        .map(|r| &r["results"][0])
        .collect();
    assert!(
        updates.len() == 6 && updates.iter().all(|r| *r == updates[0]),
        "the same updates leave the same array whatever the threads: {updates:?}"
    );
    for r in &rows {
        let s = r["slowdown_vs_native"].as_f64().expect("slowdown");
        let v = r["vs_native"].as_f64().expect("vs native");
        assert!((s * v - 1.0).abs() < 1e-9, "slowdown is native ÷ value: {r}");
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&j).expect("json")).expect("well-formed JSON");
    let seed: Vec<&str> = v["against_peers"]["apps"]
        .as_array()
        .expect("against_peers")
        .iter()
        .filter_map(|a| a["seed_002_xmem_25"]["app"].as_str())
        .collect();
    assert_eq!(seed, ["DGEMM", "GUPS", "GUPS", "GUPS"], "{v}");
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("seed 002, Xmem(25%)"), "{table}");
}

#[test]
fn apps_against_swap_peers_leave_the_machine_as_found() {
    need_root("bench apps with swap peers");
    let _turn = swap_turn();
    let before = machine_state();
    assert_eq!(
        before.0.lines().count(),
        1,
        "this test needs swap off to start with (another bench may be using it): {}",
        before.0
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let j = dir.path().join("apps.json");
    let o = bench(&[
        "apps",
        "--scale",
        "0.02",
        "--only",
        "kmeans,zstd",
        "--locals",
        "50",
        "--peers",
        "zram,file",
        "--swap-dir",
        dir.path().to_str().expect("path"),
        "--json",
        j.to_str().expect("path"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows = apps_json(&j);
    // Per application: native, rackmem at 50% of the footprint, rackmem at the peers' bytes,
    // zram, swap file.
    check_rows(&rows, &["kmeans", "zstd"], 5);
    for r in rows
        .iter()
        .filter(|r| r["setup"] == "zram" || r["setup"] == "swap file")
    {
        let limit = r["cgroup_limit_bytes"].as_u64().expect("the peer's cgroup limit");
        let footprint = r["footprint_bytes"].as_u64().expect("footprint");
        assert_eq!(limit, footprint / 2 + (8 << 20), "50% of the footprint and 8 MiB: {r}");
        // rackmem ran with the same bytes, as a fixed `--local`.
        let same = rows
            .iter()
            .find(|s| s["app"] == r["app"] && s["setup"] == "rackmem same-memory")
            .unwrap_or_else(|| panic!("no same-memory row for {}: {rows:#?}", r["app"]));
        assert_eq!(same["local_bytes"].as_u64(), Some(limit), "the peers' bytes: {same}");
        assert_eq!(same["local_pct"], r["local_pct"], "{same}");
        if r["setup"] == "zram" && r["error"].is_null() {
            assert!(same["vs_zram"].as_f64().is_some_and(|x| x > 0.0), "{same}");
        }
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&j).expect("json")).expect("well-formed JSON");
    assert!(
        v["against_peers_same_memory"]["apps"]
            .as_array()
            .is_some_and(|a| a.len() == 2),
        "rackmem at the peers' bytes against them: {v}"
    );
    assert!(
        rows.iter()
            .all(|r| r["setup"] != "rackmem" || r["local_bytes"].is_null()),
        "the defaults' rows ran at a share of the footprint: {rows:#?}"
    );
    assert!(
        rows.iter()
            .any(|r| r["setup"] == "rackmem" && r["vs_zram"].as_f64().is_some()),
        "rackmem against zram in the same run: {rows:#?}"
    );
    assert_eq!(machine_state(), before, "the machine must be left as it was found");
}

/// The skewed workload (four in five updates to a hot fifth of the pages) runs natively and
/// under rackmem with the same checksum (the bench refuses a differing one) and reports its
/// cold updates, the part of its faults no eviction policy can avoid.
#[test]
fn skewed_workload_runs_under_rackmem_with_the_native_checksum() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let j = dir.path().join("w.json");
    let o = bench(&[
        "workloads",
        "--scale",
        "0.05",
        "--only",
        "skewed",
        "--locals",
        "25",
        "--transports",
        "defaults",
        "--peers",
        "",
        "--json",
        j.to_str().expect("path"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&j).expect("json")).expect("well-formed JSON");
    let rows = v["workloads"].as_array().expect("rows");
    for setup in ["native", "rackmem defaults"] {
        let r = rows
            .iter()
            .find(|r| r["workload"] == "skewed" && r["setup"] == setup)
            .unwrap_or_else(|| panic!("no skewed row for {setup}: {v}"));
        assert_eq!(r["metric"], "updates_per_s", "{r}");
        assert!(r["value"].as_f64().is_some_and(|x| x > 0.0), "{r}");
    }
    // The program's own report: cold updates are about a fifth of all updates.
    let bin = dir.path().join("skewed");
    let built = Command::new("gcc")
        .args(["-O2", "-std=gnu11", "-o"])
        .arg(&bin)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/skewed.c"))
        .status()
        .expect("gcc");
    assert!(built.success());
    let out = Command::new(&bin).args(["16", "100000"]).output().expect("skewed runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let cold: f64 = text
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("cold_updates="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no cold_updates in {text}"));
    assert!((15_000.0..25_000.0).contains(&cold), "{text}");
}

/// Two builds and two configurations in one run: every rackmem setup, the built-in one and one
/// added with --setup, runs with this build and with a baseline (this same binary here), and
/// the JSON holds both variants and current ÷ baseline, saying which direction is better.
#[test]
fn workloads_compare_a_baseline_build_and_an_extra_setup_in_one_run() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let j = dir.path().join("w.json");
    let o = bench(&[
        "workloads",
        "--scale",
        "0.01",
        "--only",
        "scan",
        "--locals",
        "25",
        "--transports",
        "defaults",
        "--peers",
        "",
        "--setup",
        "unix-link=--no-shared-memory  --prefetch 0",
        "--baseline",
        rackmem(),
        "--json",
        j.to_str().expect("path"),
    ]);
    assert!(o.status.success(), "{}", show(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&j).expect("json")).expect("well-formed JSON");
    let rows = v["workloads"].as_array().expect("rows");
    let setups: Vec<&str> = rows.iter().filter_map(|r| r["setup"].as_str()).collect();
    assert_eq!(
        setups,
        [
            "native",
            "rackmem defaults",
            "rackmem defaults@baseline",
            "rackmem unix-link",
            "rackmem unix-link@baseline"
        ],
        "{v}"
    );
    assert_eq!(
        v["setups"],
        serde_json::json!([{"name": "unix-link", "args": ["--no-shared-memory", "--prefetch", "0"]}]),
        "{v}"
    );
    let ratios = v["baseline"]["vs_baseline"].as_array().expect("current ÷ baseline");
    assert_eq!(ratios.len(), 2, "one per setup: {v}");
    for setup in ["defaults", "unix-link"] {
        let r = ratios
            .iter()
            .find(|r| r["setup"] == setup)
            .unwrap_or_else(|| panic!("no ratio for {setup}: {v}"));
        assert_eq!(
            (r["workload"].as_str(), r["local_pct"].as_u64()),
            (Some("scan"), Some(25)),
            "{r}"
        );
        assert_eq!(r["metric"], "mb_per_s", "{r}");
        assert_eq!(r["higher_is_better"], true, "throughput: higher is better: {r}");
        let row = |name: &str| {
            rows.iter()
                .find(|x| x["setup"] == name)
                .and_then(|x| x["value"].as_f64())
                .expect("value")
        };
        let (cur, base) = (
            row(&format!("rackmem {setup}")),
            row(&format!("rackmem {setup}@baseline")),
        );
        assert!(cur > 0.0 && base > 0.0, "{v}");
        let ratio = r["ratio"].as_f64().expect("ratio");
        assert!(
            (ratio - cur / base).abs() <= 1e-9 * ratio,
            "ratio is current ÷ baseline: {r}"
        );
        let current_row = rows
            .iter()
            .find(|x| x["setup"] == format!("rackmem {setup}"))
            .expect("row");
        assert_eq!(current_row["vs_baseline"].as_f64(), Some(ratio), "{current_row}");
    }
    // The baseline preloads the library next to it.
    let lib = Path::new(rackmem()).with_file_name("librackmem.so");
    assert_eq!(
        v["baseline"]["preload"].as_str().map(Path::new),
        Some(lib.canonicalize().expect("librackmem.so next to rackmem").as_path()),
        "{v}"
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("current ÷ baseline") && out.contains("higher"), "{out}");
}

/// bench apps takes the same comparisons: its defaults (`rackmem`) and an extra setup, each
/// with the baseline too; its key-value servers' p99 is compared with lower as better.
#[test]
fn apps_compare_a_baseline_build_and_an_extra_setup_in_one_run() {
    need_root("bench apps");
    let dir = tempfile::tempdir().expect("tempdir");
    let j = dir.path().join("apps.json");
    let o = bench(&[
        "apps",
        "--scale",
        "0.02",
        "--only",
        "memcached",
        "--locals",
        "50",
        "--peers",
        "",
        "--setup",
        "unix-link=--no-shared-memory",
        "--baseline",
        rackmem(),
        "--json",
        j.to_str().expect("path"),
    ]);
    assert!(o.status.success(), "{}", show(&o));
    let rows = apps_json(&j);
    // native, then rackmem and rackmem unix-link, each with both builds.
    check_rows(&rows, &["memcached"], 5);
    let setups: Vec<&str> = rows.iter().filter_map(|r| r["setup"].as_str()).collect();
    assert_eq!(
        setups,
        [
            "native",
            "rackmem",
            "rackmem@baseline",
            "rackmem unix-link",
            "rackmem unix-link@baseline"
        ]
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&j).expect("json")).expect("well-formed JSON");
    let ratios = v["baseline"]["vs_baseline"].as_array().expect("current ÷ baseline");
    for (setup, metric, higher) in [
        ("defaults", "get_ops_per_s", true),
        ("defaults", "p99_ms", false),
        ("unix-link", "get_ops_per_s", true),
        ("unix-link", "p99_ms", false),
    ] {
        let r = ratios
            .iter()
            .find(|r| r["setup"] == setup && r["metric"] == metric)
            .unwrap_or_else(|| panic!("no {metric} ratio for {setup}: {v}"));
        assert_eq!(r["higher_is_better"], higher, "{r}");
        assert!(r["ratio"].as_f64().is_some_and(|x| x > 0.0), "{r}");
    }
}

/// Wrong comparisons are refused before anything runs, saying what is wrong.
#[test]
fn a_malformed_setup_or_a_missing_baseline_is_refused() {
    for part in ["workloads", "apps"] {
        let o = bench(&[part, "--peers", "", "--setup", "fifo"]);
        assert!(!o.status.success(), "{}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("--setup") && err.contains("NAME=ARGS"), "{err}");

        let o = bench(&[part, "--peers", "", "--setup", "defaults=--stats"]);
        assert!(!o.status.success(), "{}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("defaults") && err.contains("taken"), "{err}");

        if part == "apps" {
            // The rows at the swap peers' bytes have this name.
            let o = bench(&[part, "--peers", "", "--setup", "same-memory=--stats"]);
            assert!(!o.status.success(), "{}", show(&o));
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains("same-memory") && err.contains("taken"), "{err}");
        }

        let o = bench(&[part, "--peers", "", "--baseline", "/nonexistent/old/rackmem"]);
        assert!(!o.status.success(), "{}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("--baseline /nonexistent/old/rackmem") && err.contains("no such file"),
            "{err}"
        );
    }
}

#[test]
fn migration_bench_moves_every_size_and_writes_json() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let j = dir.path().join("migration.json");
    let svg = dir.path().join("migration.svg");
    let o = bench(&[
        "migration",
        "--rounds",
        "1",
        "--json",
        j.to_str().expect("path"),
        "--svg",
        svg.to_str().expect("path"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&j).expect("json")).expect("well-formed JSON");
    // One table per link kind: TCP loopback, and Unix sockets with the segments mapped.
    for kind in ["tcp", "unix"] {
        let rows = v["migration"][kind]
            .as_array()
            .unwrap_or_else(|| panic!("migration rows over {kind}: {v}"));
        assert_eq!(rows.len(), 6, "{kind}: {v}");
        for r in rows {
            for k in [
                "odpm_ns",
                "umpm_local_ns",
                "umpm_bounce_ns",
                "umpm_direct_ns",
                "floor_ns",
            ] {
                assert!(r[k].as_f64().is_some_and(|x| x > 0.0), "{kind}: {k} in {r}");
            }
            // Both routes carry their pages: Transfer is measured.
            for steps in ["bounce_steps_ns", "direct_steps_ns"] {
                assert!(
                    r[steps]["transfer"].as_f64().is_some_and(|x| x > 0.0),
                    "{kind}: {steps} in {r}"
                );
            }
        }
    }
    assert!(
        v["single_page_shared_memory_ns"]["bounce"]
            .as_f64()
            .is_some_and(|x| x > 0.0),
        "{v}"
    );
    let chart = std::fs::read_to_string(&svg).expect("chart written");
    assert!(chart.starts_with("<svg"), "{chart}");
}
