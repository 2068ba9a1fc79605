//! `rackmem bench emulate`: is the link emulator (`rackmem run --emulate`) the network it claims
//! to be? Two checks, each a ratio measured in one run:
//!
//! 1. **Model against emulator.** The remote 4 KiB fault of `bench/fault_latency.c` (prefetch
//!    off) over the embedded brick's Unix link, plain and emulated at each setting, rounds
//!    interleaved. The link model predicts the emulated fault as the plain one plus what the
//!    wire adds (two latencies and both frames' packets at the line rate): measured ÷ predicted.
//! 2. **Emulator against a real shaped link** (`--veth RATE`, root): `bench/scan.c` at 25% local
//!    against a brick in another network namespace behind a veth pair whose both ends a `tbf`
//!    qdisc holds to RATE, and against a TCP loopback brick with `--emulate bandwidth=RATE`
//!    (packet overhead as `tbf` counts it: Ethernet, IPv4 and TCP headers): emulated ÷ veth.

use crate::loopback::{LinkKind, LoopbackBrick, SECRET};
use crate::programs::{build, num, run as run_program};
use crate::rackmem::Rackmem;
use crate::{BenchError, Output};
use rackmem_model::link::{Link, LinkSpec, Software, Transfer};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The settings checked when none are given: latency-bound, balanced and bandwidth-bound.
pub const DEFAULT_SETTINGS: [&str; 3] = [
    "latency=25us,bandwidth=10Gbit",
    "latency=10us,bandwidth=2Gbit",
    "latency=5us,bandwidth=400Mbit",
];

/// What `bench emulate` measures.
#[derive(Debug, Clone)]
pub struct EmulateConfig {
    /// Networks to emulate (parsed link specifications).
    pub settings: Vec<Link>,
    /// Random touches of the fault program per run.
    pub samples: usize,
    /// Footprint of the fault program, MiB.
    pub mib: usize,
    /// Interleaved rounds; each figure is the median over them.
    pub repeat: u32,
    /// Line rate of the veth comparison (`1Gbit`), when asked for.
    pub veth: Option<String>,
    /// Footprint of the scan of the veth comparison, MiB.
    pub scan_mib: usize,
    /// The `rackmem` measured.
    pub rackmem: Rackmem,
    /// Directory with the C programs.
    pub bench_dir: PathBuf,
    /// Scratch directory.
    pub tmp: PathBuf,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

/// What the wire adds to one request and its response, with no software: the model's round
/// trip with every software cost zero.
pub fn wire_extra_us(link: &Link, t: Transfer) -> f64 {
    let none = Software {
        fault_s: 0.0,
        request_s: 0.0,
        page_s: 0.0,
    };
    link.round_trip_s(t, none) * 1e6
}

/// Runs `bench emulate`.
pub fn run(cfg: &EmulateConfig) -> Result<Output, BenchError> {
    let steps = u64::from(cfg.repeat) * (1 + cfg.settings.len() as u64) + if cfg.veth.is_some() { 2 } else { 0 };
    let pb = crate::progress::bar(steps);
    let r = measure(cfg, &pb);
    pb.finish_and_clear();
    r
}

fn measure(cfg: &EmulateConfig, pb: &indicatif::ProgressBar) -> Result<Output, BenchError> {
    let prog = build(&cfg.bench_dir, "fault_latency", &cfg.tmp)?;
    let pargs = vec![cfg.mib.to_string(), cfg.samples.to_string()];
    let fault = |extra: &[String]| -> Result<f64, BenchError> {
        let mut e: Vec<String> = vec!["--prefetch".into(), "0".into()];
        e.extend_from_slice(extra);
        let kv = run_program(cfg.rackmem.run("25%", &e, &prog, &pargs))?;
        Ok(num(&kv, "p50_us"))
    };
    let mut plain = Vec::new();
    let mut emulated: Vec<Vec<f64>> = vec![Vec::new(); cfg.settings.len()];
    for round in 0..cfg.repeat {
        pb.set_message(format!("round {}: plain Unix link", round + 1));
        plain.push(fault(&["--no-shared-memory".into()])?);
        pb.inc(1);
        for (i, s) in cfg.settings.iter().enumerate() {
            pb.set_message(format!("round {}: emulated {}", round + 1, s.name));
            emulated[i].push(fault(&["--emulate".into(), s.name.clone()])?);
            pb.inc(1);
        }
    }
    let base = median(plain.clone());
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "setting",
        "wire adds (model) µs",
        "predicted fault p50 µs",
        "emulated fault p50 µs",
        "emulated ÷ predicted",
    ]);
    t.add_row(vec![
        "plain Unix link (the software)".to_string(),
        "0".into(),
        String::new(),
        format!("{base:.1}"),
        String::new(),
    ]);
    let mut rows = Vec::new();
    let mut bars = vec![crate::chart::LatencyBar {
        label: "plain Unix link, measured".into(),
        p50_us: base,
        p99_us: base,
    }];
    for (s, values) in cfg.settings.iter().zip(emulated) {
        let extra = wire_extra_us(s, Transfer::read(1));
        let predicted = base + extra;
        let measured = median(values.clone());
        let ratio = measured / predicted;
        t.add_row(vec![
            s.name.clone(),
            format!("{extra:.1}"),
            format!("{predicted:.1}"),
            format!("{measured:.1}"),
            format!("{ratio:.3}"),
        ]);
        bars.push(crate::chart::LatencyBar {
            label: format!("{}, predicted", s.name),
            p50_us: predicted,
            p99_us: predicted,
        });
        bars.push(crate::chart::LatencyBar {
            label: format!("{}, emulated", s.name),
            p50_us: measured,
            p99_us: measured,
        });
        rows.push(serde_json::json!({
            "setting": s.name, "wire_extra_us": extra, "predicted_p50_us": predicted,
            "measured_p50_us": measured, "values_us": values, "ratio": ratio,
        }));
    }
    let mut text = format!(
        "Link model against the emulator: remote 4 KiB fault p50, prefetch off, 25% local, median of {} interleaved \
         rounds\n{t}\n",
        cfg.repeat
    );
    let mut veth_json = serde_json::Value::Null;
    if let Some(rate) = &cfg.veth {
        let (table, json) = veth_against_emulator(cfg, rate, pb)?;
        text += &table;
        veth_json = json;
    }
    Ok(Output {
        text,
        chart: Some(crate::chart::latencies(
            "Remote 4 KiB fault p50: the link model's prediction beside the emulator (same run)",
            bars,
        )),
        json: serde_json::json!({ "plain_p50_us": base, "plain_values_us": plain, "settings": rows, "veth": veth_json }),
    })
}

/// A network namespace joined to this one by a veth pair, both ends shaped by `tbf`; removed
/// (with its veth pair and whatever runs in it) when dropped.
struct ShapedNamespace {
    name: String,
    /// The veth end in this namespace.
    host_if: String,
    brick: Option<Child>,
}

impl ShapedNamespace {
    const HOST_IP: &'static str = "10.213.77.1";
    const NS_IP: &'static str = "10.213.77.2";

    fn new(rate: &str) -> Result<ShapedNamespace, BenchError> {
        let pid = std::process::id();
        let name = format!("rackmem-emu-{pid}");
        let (host_if, ns_if) = (format!("rme{}a", pid % 100_000), format!("rme{}b", pid % 100_000));
        let ns = ShapedNamespace {
            name: name.clone(),
            host_if: host_if.clone(),
            brick: None,
        };
        let rate = rate.to_lowercase().replace("gbps", "gbit").replace("mbps", "mbit");
        let burst = "256kb";
        let cmds: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), name.clone()],
            vec![
                "link".into(),
                "add".into(),
                host_if.clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                ns_if.clone(),
                "netns".into(),
                name.clone(),
            ],
            vec![
                "addr".into(),
                "add".into(),
                format!("{}/30", Self::HOST_IP),
                "dev".into(),
                host_if.clone(),
            ],
            vec!["link".into(), "set".into(), host_if.clone(), "up".into()],
            vec![
                "-n".into(),
                name.clone(),
                "addr".into(),
                "add".into(),
                format!("{}/30", Self::NS_IP),
                "dev".into(),
                ns_if.clone(),
            ],
            vec![
                "-n".into(),
                name.clone(),
                "link".into(),
                "set".into(),
                ns_if.clone(),
                "up".into(),
            ],
            vec![
                "-n".into(),
                name.clone(),
                "link".into(),
                "set".into(),
                "lo".into(),
                "up".into(),
            ],
        ];
        for c in cmds {
            sh("ip", &c)?;
        }
        let tbf = |dev: &str| -> Vec<String> {
            [
                "qdisc", "replace", "dev", dev, "root", "tbf", "rate", &rate, "burst", burst, "latency", "200ms",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        };
        sh("tc", &tbf(&host_if))?;
        let mut in_ns = vec!["netns".to_string(), "exec".into(), name.clone(), "tc".into()];
        in_ns.extend(tbf(&ns_if));
        sh("ip", &in_ns)?;
        Ok(ns)
    }

    fn start_brick(&mut self, exe: &std::path::Path) -> Result<String, BenchError> {
        let addr = format!("{}:7070", Self::NS_IP);
        let child = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .arg(exe)
            .args([
                "brick",
                "--listen",
                &format!("tcp://{addr}"),
                "--size",
                "4GiB",
                "--secret",
                SECRET,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| BenchError::Brick(format!("starting a brick in namespace {}: {e}", self.name)))?;
        self.brick = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let sa: std::net::SocketAddr = addr.parse().map_err(|e| BenchError::Brick(format!("{addr}: {e}")))?;
            if std::net::TcpStream::connect_timeout(&sa, Duration::from_millis(200)).is_ok() {
                return Ok(format!("tcp://{addr}"));
            }
            if Instant::now() > deadline {
                return Err(BenchError::Brick(format!(
                    "the brick in namespace {} did not listen on {addr} within 10 s",
                    self.name
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ShapedNamespace {
    fn drop(&mut self) {
        if let Some(mut c) = self.brick.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Deleting the namespace would take the veth pair with it, but only later (the kernel
        // tears namespaces down asynchronously): delete this end first, which is immediate.
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

fn sh(prog: &str, args: &[String]) -> Result<(), BenchError> {
    let o = Command::new(prog)
        .args(args)
        .output()
        .map_err(|e| BenchError::Config(format!("cannot run {prog} (package iproute2): {e}")))?;
    if !o.status.success() {
        return Err(BenchError::Config(format!(
            "{prog} {}: {} (the veth comparison needs root and iproute2)",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        )));
    }
    Ok(())
}

fn veth_against_emulator(
    cfg: &EmulateConfig,
    rate: &str,
    pb: &indicatif::ProgressBar,
) -> Result<(String, serde_json::Value), BenchError> {
    // What tbf counts of a full TCP segment on a veth: Ethernet 14, IPv4 20, TCP with
    // timestamps 32 (no preamble, checksum or gap: there is no wire).
    let spec = format!("latency=0us,bandwidth={rate},packet-overhead=66");
    let wire: LinkSpec = spec
        .parse()
        .map_err(|e: rackmem_model::ModelError| BenchError::Config(format!("--veth {rate}: {e}")))?;
    let scan = build(&cfg.bench_dir, "scan", &cfg.tmp)?;
    let sargs = vec![cfg.scan_mib.to_string(), "2".to_string()];
    let mut ns = ShapedNamespace::new(rate)?;
    let veth_addr = ns.start_brick(&cfg.rackmem.exe)?;
    let lo = LoopbackBrick::start(LinkKind::Tcp, 4 << 30, &cfg.tmp)?;
    pb.set_message(format!("scan over veth + tbf {rate}"));
    let over_veth = run_program(cfg.rackmem.run(
        "25%",
        &["--brick".to_string(), veth_addr, "--secret".into(), SECRET.into()],
        &scan,
        &sargs,
    ))?;
    pb.inc(1);
    pb.set_message(format!("scan over TCP loopback, emulated {rate}"));
    let mut args = lo.run_args();
    args.extend(["--emulate".to_string(), spec.clone()]);
    let emulated = run_program(cfg.rackmem.run("25%", &args, &scan, &sargs))?;
    pb.inc(1);
    drop(ns);
    let (v, e) = (num(&over_veth, "mb_per_s"), num(&emulated, "mb_per_s"));
    if over_veth.get("checksum") != emulated.get("checksum") {
        return Err(BenchError::Workload(format!(
            "scan checksums differ: veth {:?}, emulated {:?}",
            over_veth.get("checksum"),
            emulated.get("checksum")
        )));
    }
    let ceiling = wire.0.bandwidth_bytes_per_s * wire.0.efficiency(Transfer::read(16)) / 1e6;
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec!["link", "scan MB/s (read + write-back)", "÷ veth"]);
    t.add_row(vec![
        format!("veth pair, tbf {rate} both ways"),
        format!("{v:.1}"),
        "1".into(),
    ]);
    t.add_row(vec![
        format!("TCP loopback, --emulate {spec}"),
        format!("{e:.1}"),
        format!("{:.3}", e / v),
    ]);
    Ok((
        format!(
            "Emulator against a shaped veth link: scan of {} MiB at 25% local, 2 passes; one direction's payload \
             ceiling at {rate} is {ceiling:.0} MB/s\n{t}\n",
            cfg.scan_mib
        ),
        serde_json::json!({
            "rate": rate, "spec": spec, "veth_mb_per_s": v, "emulated_mb_per_s": e, "ratio": e / v,
            "payload_ceiling_mb_per_s": ceiling,
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_adds_latency_both_ways_and_both_frames() {
        let l = "latency=10us,bandwidth=8Gbit".parse::<LinkSpec>().expect("spec").0;
        // 20 µs + (48 + 90) + (4128 + 3 × 90) bytes at 1 GB/s.
        let x = wire_extra_us(&l, Transfer::read(1));
        assert!((x - (20.0 + 0.138 + 4.398)).abs() < 1e-9, "{x}");
    }

    #[test]
    fn default_settings_parse() {
        for s in DEFAULT_SETTINGS {
            assert!(s.parse::<LinkSpec>().is_ok(), "{s}");
        }
    }
}
