//! `rackmem bench migration`: seed 001's Tables I–III on this machine. `bench/migration.c`
//! runs under `rackmem run` with two loopback bricks and, for buffers of 4 KiB to 32 MiB that
//! live on brick A, measures in interleaved rounds: on-demand migration into the local buffer
//! (the program touches the pages, ODPM), user-managed migration into it (`rackmem_migrate`
//! to "local", UMPM) and user-managed migration to brick B bounced through the process, with
//! the four step times of each. Medians over the rounds; every buffer is checked word by word.
//! Direct brick-to-brick transfers are a later slice: the seed's Table II compares them with the
//! bounce, so only its bounce row has a peer here.

use crate::loopback::{LinkKind, LoopbackBrick};
use crate::programs::{build, num, run as run_program};
use crate::rackmem::Rackmem;
use crate::{BenchError, Output};
use std::path::PathBuf;

/// Buffer sizes, as `bench/migration.c` measures them.
const SIZES: [(u64, &str); 6] = [
    (4096, "4 KiB"),
    (32768, "32 KiB"),
    (131072, "128 KiB"),
    (1 << 20, "1 MiB"),
    (4 << 20, "4 MiB"),
    (32 << 20, "32 MiB"),
];
/// Seed 001, Table I: UMPM (PCIe, the bounce) and ODPM (PCIe) total runtimes, µs, same sizes.
const SEED_UMPM_US: [f64; 6] = [38.2, 47.4, 110.0, 610.0, 2180.0, 16900.0];
const SEED_ODPM_US: [f64; 6] = [45.7, 60.4, 160.0, 1010.0, 3900.0, 30300.0];
/// Seed 001, Table II: a single UMPM D2D migration bounced through the host (PCIe), µs.
const SEED_BOUNCE_US: [f64; 6] = [16.3, 24.6, 50.4, 310.0, 1080.0, 8420.0];
/// The local buffer: twice the largest buffer (a pin takes at most half of it).
const LOCAL_MIB: u64 = 64;
/// The buffer swept to push a measured buffer out of the local buffer.
const FLUSH_MIB: u64 = 2 * LOCAL_MIB;

/// What `bench migration` measures.
#[derive(Debug, Clone)]
pub struct MigrationConfig {
    /// Interleaved rounds (figures are medians).
    pub rounds: u32,
    /// The `rackmem` the program runs under.
    pub rackmem: Rackmem,
    /// Directory with the C programs.
    pub bench_dir: PathBuf,
    /// Scratch directory.
    pub tmp: PathBuf,
}

/// Runs `bench migration`.
pub fn run(cfg: &MigrationConfig) -> Result<Output, BenchError> {
    let a = LoopbackBrick::start(LinkKind::Tcp, 8 << 30, &cfg.tmp)?;
    let b = LoopbackBrick::start(LinkKind::Tcp, 8 << 30, &cfg.tmp)?;
    let pb = crate::progress::bar(1);
    pb.set_message("migration: building and running bench/migration.c");
    let prog = build(&cfg.bench_dir, "migration", &cfg.tmp)?;
    let mut extra = a.run_args();
    extra.extend(["--brick".to_string(), b.addr.clone()]);
    let args = vec![
        a.addr.clone(),
        b.addr.clone(),
        FLUSH_MIB.to_string(),
        cfg.rounds.to_string(),
    ];
    let kv = run_program(cfg.rackmem.run(&format!("{LOCAL_MIB}MiB"), &extra, &prog, &args));
    pb.finish_and_clear();
    let kv = kv?;
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "buffer",
        "ODPM (fault in)",
        "UMPM (to local)",
        "ODPM ÷ UMPM",
        "seed: ODPM ÷ UMPM",
        "UMPM A→B bounce",
        "seed: bounce",
        "setup / alloc / transfer / finalize",
    ]);
    let mut rows = Vec::new();
    let mut bars = Vec::new();
    for (i, &(size, name)) in SIZES.iter().enumerate() {
        let odpm = num(&kv, &format!("odpm_{size}_ns"));
        let local = num(&kv, &format!("umpm_local_{size}_ns"));
        let bounce = num(&kv, &format!("umpm_bounce_{size}_ns"));
        let step = |k: &str| num(&kv, &format!("umpm_bounce_{size}_{k}"));
        let parts = [step("setup"), step("allocate"), step("transfer"), step("finalize")];
        let total: f64 = parts.iter().sum();
        let frac: Vec<f64> = parts
            .iter()
            .map(|p| if total > 0.0 { p / total } else { 0.0 })
            .collect();
        t.add_row(vec![
            name.to_string(),
            us(odpm),
            us(local),
            format!("{:.2}", odpm / local),
            format!("{:.2}", SEED_ODPM_US[i] / SEED_UMPM_US[i]),
            us(bounce),
            format!("{:.1} µs", SEED_BOUNCE_US[i]),
            format!(
                "{:.0}% / {:.0}% / {:.0}% / {:.0}%",
                frac[0] * 100.0,
                frac[1] * 100.0,
                frac[2] * 100.0,
                frac[3] * 100.0
            ),
        ]);
        rows.push(serde_json::json!({
            "bytes": size,
            "odpm_ns": odpm,
            "umpm_local_ns": local,
            "odpm_over_umpm": odpm / local,
            "seed_odpm_over_umpm": SEED_ODPM_US[i] / SEED_UMPM_US[i],
            "umpm_bounce_ns": bounce,
            "seed_bounce_ns": SEED_BOUNCE_US[i] * 1e3,
            "bounce_steps_ns": {"setup": parts[0], "allocate": parts[1], "transfer": parts[2], "finalize": parts[3]},
        }));
        bars.push(crate::chart::Bar {
            group: name.to_string(),
            label: "ODPM time ÷ UMPM time (to local)".into(),
            fraction: odpm / local,
        });
        bars.push(crate::chart::Bar {
            group: name.to_string(),
            label: "seed 001 Table I, ODPM ÷ UMPM (PCIe)".into(),
            fraction: SEED_ODPM_US[i] / SEED_UMPM_US[i],
        });
    }
    let text = format!(
        "Migration of a buffer on brick A (TCP loopback), medians of {} interleaved rounds, local buffer {LOCAL_MIB} MiB\n{t}\n",
        cfg.rounds
    );
    Ok(Output {
        text,
        chart: Some(crate::chart::fractions(
            "Migration: on-demand ÷ user-managed time (higher: UMPM faster), beside seed 001",
            bars,
        )),
        json: serde_json::json!({ "migration": rows, "rounds": cfg.rounds, "local_mib": LOCAL_MIB }),
    })
}

fn us(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.1} µs", ns / 1e3)
    }
}
