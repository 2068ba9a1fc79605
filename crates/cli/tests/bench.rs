//! The bench commands on tiny sizes: they run, write well-formed JSON and a chart, and leave the
//! machine as they found it (no swap on, zram reset, no cgroup left), also when they fail.
//! Figures are never asserted here.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

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
    if !is_root() {
        return;
    }
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

    let j = dir.path().join("scan.json");
    let o = bench(&[
        "scan",
        "--mib",
        "16",
        "--passes",
        "1",
        "--json",
        j.to_str().expect("path"),
        "--svg",
        &svg_arg("scan.svg"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    chart("scan.svg", &["rackmem 25% local"]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&j).expect("json")).expect("well-formed JSON");
    assert_eq!(v["scan"].as_array().map(Vec::len), Some(4), "{v}");
}

#[test]
fn workloads_with_swap_peers_clean_up_on_success_and_on_failure() {
    if !is_root() {
        return;
    }
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
