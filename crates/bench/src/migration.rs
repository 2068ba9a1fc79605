//! `rackmem bench migration`: seed 001's Tables I–III on this machine. `bench/migration.c`
//! runs under `rackmem run` with two loopback bricks and, for buffers of 4 KiB to 32 MiB that
//! live on brick A, measures in interleaved rounds: on-demand migration into the local buffer
//! (the program touches the pages, ODPM), user-managed migration into it (`rackmem_migrate`
//! to "local", UMPM), user-managed migration to brick B bounced through the process and pulled
//! by B from A (direct), each with the four step times, and the link's floor: one plain read of
//! the same size from brick A over the same kind of link. Medians over the rounds; every
//! migrated buffer is checked word by word. It runs twice: over TCP loopback, and over Unix
//! sockets, where the program maps both bricks' segments (shared memory: the seed's single 4 KiB
//! page target is measured there).

use crate::loopback::{LinkKind, LoopbackBrick, SECRET};
use crate::programs::{build, num, run as run_program};
use crate::rackmem::Rackmem;
use crate::{BenchError, Output};
use rackmem_brick::{Brick, BrickConfig, BrickHandle, ListenAddr};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
/// Seed 001, Table II: direct transfers are this much faster than the bounce, at least.
const SEED_DIRECT_OVER_BOUNCE: f64 = 1.3;
/// Seed 001: a single 4 KiB page migrated in this long, µs.
const SEED_PAGE_US: f64 = 11.6;
/// The local buffer: twice the largest buffer (a pin takes at most half of it).
const LOCAL_MIB: u64 = 64;
/// The buffer swept to push a measured buffer out of the local buffer.
const FLUSH_MIB: u64 = 2 * LOCAL_MIB;
/// Each brick's pool.
const BRICK_BYTES: u64 = 8 << 30;

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

/// A brick on a Unix socket in `dir`: a program on this host maps its segments.
fn unix_brick(dir: &Path, name: &str) -> Result<(BrickHandle, String), BenchError> {
    let handle = Brick::start(BrickConfig {
        listen: ListenAddr::Unix(dir.join(name)),
        size_bytes: BRICK_BYTES,
        key: b"bench".to_vec(),
        secret: Some(SECRET.as_bytes().to_vec()),
        managed: false,
        limits: Default::default(),
        tls: None,
    })
    .map_err(|e| BenchError::Brick(format!("starting the Unix-socket brick {name}: {e}")))?;
    let addr = handle.local_addr();
    Ok((handle, addr))
}

/// One pass of `bench/migration.c` between bricks `a` and `b`.
fn pass(
    cfg: &MigrationConfig,
    prog: &Path,
    a: &str,
    b: &str,
    a_args: Vec<String>,
) -> Result<BTreeMap<String, String>, BenchError> {
    let mut extra = a_args;
    extra.extend(["--brick".to_string(), b.to_string()]);
    let args = vec![
        a.to_string(),
        b.to_string(),
        FLUSH_MIB.to_string(),
        cfg.rounds.to_string(),
        SIZES.len().to_string(),
    ];
    run_program(cfg.rackmem.run(&format!("{LOCAL_MIB}MiB"), &extra, prog, &args))
}

/// The four steps of `method` at `size`, as fractions of their sum, and the times.
fn steps(kv: &BTreeMap<String, String>, method: &str, size: u64) -> ([f64; 4], [f64; 4]) {
    let step = |k: &str| num(kv, &format!("{method}_{size}_{k}"));
    let parts = [step("setup"), step("allocate"), step("transfer"), step("finalize")];
    let total: f64 = parts.iter().sum();
    let frac = parts.map(|p| if total > 0.0 { p / total } else { 0.0 });
    (frac, parts)
}

fn percent(f: [f64; 4]) -> String {
    format!(
        "{:.0}% / {:.0}% / {:.0}% / {:.0}%",
        f[0] * 100.0,
        f[1] * 100.0,
        f[2] * 100.0,
        f[3] * 100.0
    )
}

/// Runs `bench migration`.
pub fn run(cfg: &MigrationConfig) -> Result<Output, BenchError> {
    let pb = crate::progress::bar(2);
    pb.set_message("migration: building bench/migration.c, running it over TCP loopback");
    let prog = build(&cfg.bench_dir, "migration", &cfg.tmp)?;
    let tcp = {
        let a = LoopbackBrick::start(LinkKind::Tcp, BRICK_BYTES, &cfg.tmp)?;
        let b = LoopbackBrick::start(LinkKind::Tcp, BRICK_BYTES, &cfg.tmp)?;
        pass(cfg, &prog, &a.addr, &b.addr, a.run_args())
    };
    pb.inc(1);
    pb.set_message("migration: over Unix sockets (shared memory)");
    let unix = tcp.and_then(|tcp| {
        let (_ha, a) = unix_brick(&cfg.tmp, "migration-a.sock")?;
        let (_hb, b) = unix_brick(&cfg.tmp, "migration-b.sock")?;
        let args = vec!["--brick".into(), a.clone(), "--secret".into(), SECRET.into()];
        Ok((tcp, pass(cfg, &prog, &a, &b, args)?))
    });
    pb.finish_and_clear();
    let (tcp, unix) = unix?;
    let mut text = String::new();
    let mut json = serde_json::Map::new();
    let mut bars = Vec::new();
    for (kind, kv) in [("tcp", &tcp), ("unix", &unix)] {
        let mut t = comfy_table::Table::new();
        t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
        t.set_header(vec![
            "buffer",
            "ODPM (fault in)",
            "UMPM (to local)",
            "ODPM ÷ UMPM (seed)",
            "A→B bounce",
            "A→B direct",
            "direct ÷ bounce speed",
            "link floor (read)",
            "direct ÷ floor speed",
            "bounce steps",
            "direct steps",
        ]);
        let mut rows = Vec::new();
        for (i, &(size, name)) in SIZES.iter().enumerate() {
            let odpm = num(kv, &format!("odpm_{size}_ns"));
            let local = num(kv, &format!("umpm_local_{size}_ns"));
            let bounce = num(kv, &format!("umpm_bounce_{size}_ns"));
            let direct = num(kv, &format!("umpm_direct_{size}_ns"));
            let floor = num(kv, &format!("floor_{size}_ns"));
            let (bf, bp) = steps(kv, "umpm_bounce", size);
            let (df, dp) = steps(kv, "umpm_direct", size);
            let seed_odpm_over_umpm = SEED_ODPM_US[i] / SEED_UMPM_US[i];
            t.add_row(vec![
                name.to_string(),
                us(odpm),
                us(local),
                format!("{:.2} ({seed_odpm_over_umpm:.2})", odpm / local),
                us(bounce),
                us(direct),
                format!("{:.2}", bounce / direct),
                us(floor),
                format!("{:.2}", floor / direct),
                percent(bf),
                percent(df),
            ]);
            let step_json =
                |p: [f64; 4]| serde_json::json!({"setup": p[0], "allocate": p[1], "transfer": p[2], "finalize": p[3]});
            rows.push(serde_json::json!({
                "bytes": size,
                "odpm_ns": odpm,
                "umpm_local_ns": local,
                "odpm_over_umpm": odpm / local,
                "seed_odpm_over_umpm": seed_odpm_over_umpm,
                "umpm_bounce_ns": bounce,
                "umpm_direct_ns": direct,
                "direct_over_bounce_speed": bounce / direct,
                "seed_direct_over_bounce_speed": SEED_DIRECT_OVER_BOUNCE,
                "floor_ns": floor,
                "direct_over_floor_speed": floor / direct,
                "seed_bounce_ns": SEED_BOUNCE_US[i] * 1e3,
                "bounce_steps_ns": step_json(bp),
                "direct_steps_ns": step_json(dp),
            }));
            let group = format!("{name} ({kind})");
            bars.push(crate::chart::Bar {
                group: group.clone(),
                label: "direct ÷ bounce speed".into(),
                fraction: bounce / direct,
            });
            bars.push(crate::chart::Bar {
                group: group.clone(),
                label: "direct ÷ link floor speed".into(),
                fraction: floor / direct,
            });
            bars.push(crate::chart::Bar {
                group,
                label: "ODPM time ÷ UMPM time (to local)".into(),
                fraction: odpm / local,
            });
        }
        let link = if kind == "tcp" {
            "TCP loopback"
        } else {
            "Unix sockets, segments mapped (shared memory)"
        };
        text.push_str(&format!(
            "Migration of a buffer on brick A ({link}), medians of {} interleaved rounds, local buffer {LOCAL_MIB} MiB\n{t}\n",
            cfg.rounds
        ));
        json.insert(kind.to_string(), serde_json::Value::Array(rows));
    }
    let page_bounce = num(&unix, "umpm_bounce_4096_ns");
    let page_direct = num(&unix, "umpm_direct_4096_ns");
    text.push_str(&format!(
        "A single 4 KiB page A→B on shared memory: bounced {}, pulled {} (seed 001: {SEED_PAGE_US} µs)\n\
         Seed 001: direct ≥ {SEED_DIRECT_OVER_BOUNCE} × the bounce's speed; UMPM direct at 32 MiB ≥ 0.80 of the link floor's speed (issue 23)\n",
        us(page_bounce),
        us(page_direct),
    ));
    Ok(Output {
        text,
        chart: Some(crate::chart::fractions(
            "Migration: direct ÷ bounce, direct ÷ link floor, ODPM ÷ UMPM (higher is better)",
            bars,
        )),
        json: serde_json::json!({
            "migration": json,
            "single_page_shared_memory_ns": {"bounce": page_bounce, "direct": page_direct, "seed": SEED_PAGE_US * 1e3},
            "rounds": cfg.rounds,
            "local_mib": LOCAL_MIB,
        }),
    })
}

fn us(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.1} µs", ns / 1e3)
    }
}
