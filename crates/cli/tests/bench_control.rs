//! `rackmem bench control` on tiny sizes: it runs, writes well-formed JSON and a chart. Figures
//! are never asserted. The etcd store is measured when this build has the feature and the
//! machine an `etcd` binary; otherwise the JSON says why it was skipped.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

#[test]
fn bench_control_on_tiny_sizes_writes_json_and_a_chart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (json, svg) = (dir.path().join("control.json"), dir.path().join("control.svg"));
    let mut c = Command::new(rackmem());
    c.args([
        "bench",
        "control",
        "--bricks",
        "20",
        "--allocations",
        "50",
        "--samples",
        "50",
        "--stores",
        "sqlite,etcd",
        "--json",
        json.to_str().expect("path"),
        "--svg",
        svg.to_str().expect("path"),
    ]);
    let o = run_with_deadline(c, Duration::from_secs(300));
    assert!(o.status.success(), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("allocate") && out.contains("GET /healthz"), "{out}");

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written")).expect("well-formed JSON");
    let c = &v["control"];
    assert_eq!((c["bricks"].as_u64(), c["allocations"].as_u64()), (Some(20), Some(50)));
    let results = c["results"].as_array().expect("results");
    assert_eq!(results.len(), 2, "{v}");
    let sqlite = &results[0];
    assert_eq!(sqlite["store"], "sqlite");
    assert!(sqlite["skipped"].is_null());
    for k in ["allocate", "release", "floor", "circuit", "circuit_release"] {
        assert_eq!(sqlite[k]["samples"].as_u64(), Some(50), "{k}: {sqlite}");
        assert!(sqlite[k]["p99_us"].as_f64().is_some_and(|x| x > 0.0), "{k}: {sqlite}");
    }
    assert!(sqlite["allocations_per_s"].as_f64().is_some_and(|x| x > 0.0));
    assert!(sqlite["target_met"].is_boolean());
    assert!(sqlite["circuit_target_met"].is_boolean());
    let etcd = &results[1];
    assert_eq!(etcd["store"], "etcd");
    let etcd_ran = cfg!(feature = "etcd") && rackmem_control::etcd_server::binary().is_some();
    if etcd_ran {
        assert!(etcd["skipped"].is_null(), "{etcd}");
        assert_eq!(etcd["allocate"]["samples"].as_u64(), Some(50));
    } else {
        eprintln!("note: etcd was skipped: {}", etcd["skipped"]);
        assert!(etcd["skipped"].is_string(), "{etcd}");
    }

    let chart = std::fs::read_to_string(&svg).expect("chart written");
    assert!(
        chart.starts_with("<svg") && chart.trim_end().ends_with("</svg>"),
        "{chart}"
    );
    assert!(chart.contains("sqlite: allocate"), "{chart}");
    assert_eq!(chart.contains("etcd: allocate"), etcd_ran, "{chart}");
}
