//! `rackmem run --camat`: samples the program's page accesses while it runs, and at exit
//! combines them with the runtime's fault counters into C-AMAT (`rackmem_model::camat`).

use rackmem_model::camat::FromCounters;
use rackmem_runtime::stats::StatsSnapshot;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Every this often the program's accessed bits are read and cleared: shorter counts repeated
/// touches of a page more often (closer to the true access count) at the cost of a walk of its
/// page tables each time.
const INTERVAL: Duration = Duration::from_millis(50);

/// A thread that counts the pages a process touches, interval by interval.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl Sampler {
    /// Starts sampling process `pid`.
    pub fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut pages = 0u64;
            let _ = rackmem_sys::process::clear_referenced(pid);
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(INTERVAL);
                // The process is gone (or not readable) once these fail: what was counted stays.
                let Ok(bytes) = rackmem_sys::process::referenced_anon_bytes(pid) else {
                    break;
                };
                pages += bytes / rackmem_proto::PAGE_SIZE as u64;
                if rackmem_sys::process::clear_referenced(pid).is_err() {
                    break;
                }
            }
            pages
        });
        Sampler { stop, thread }
    }

    /// Stops sampling; returns the page accesses counted.
    pub fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

/// Prints C-AMAT for process `pid` from the statistics file and the sampled accesses; with
/// `rewrite`, adds it to the process's line of the file as `"camat"`.
pub fn report(stats: &Path, pid: u32, page_accesses: u64, wall: Duration, rewrite: bool) {
    let Ok(text) = std::fs::read_to_string(stats) else {
        eprintln!("rackmem: no C-AMAT: the program made no allocation large enough for remote memory");
        return;
    };
    let Some(s) = text
        .lines()
        .filter_map(|l| serde_json::from_str::<StatsSnapshot>(l).ok())
        .find(|s| s.pid == pid)
    else {
        eprintln!("rackmem: no C-AMAT: no statistics of process {pid}");
        return;
    };
    let c = FromCounters {
        page_accesses,
        faults: s.faults,
        fault_mean_s: s.fault_mean_ns as f64 * 1e-9,
        miss_concurrency: s.faults_in_flight_mean,
        wall_s: wall.as_secs_f64(),
    };
    let levels = Levels::of(&s, &c);
    let us = |x: f64| format!("{:.2} µs", x * 1e6);
    let ns_us = |x: f64| us(x * 1e-9);
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "level",
        "accesses",
        "misses / faults served",
        "pure misses",
        "miss concurrency C_M",
        "pure miss penalty pAMP",
        "C-AMAT",
    ]);
    let l = &s.local_buffer;
    t.add_row(vec![
        "local buffer".to_string(),
        format!("≥ {page_accesses} page touches"),
        format!("{} faults (MR₁ {:.4})", s.faults, c.miss_ratio()),
        l.pure_misses.to_string(),
        format!("{:.2} (max {})", l.miss_concurrency(), l.max_outstanding),
        ns_us(l.pure_avg_miss_penalty_ns()),
        format!("miss term MR₁ × κ₁ × C-AMAT₂ = {}", us(levels.local_miss_term_s)),
    ]);
    for b in &s.bricks {
        let k = &b.counts;
        t.add_row(vec![
            format!("brick {}", b.brick),
            format!("{} faults", k.faults),
            format!("{} faults", k.faults),
            k.pure_misses.to_string(),
            format!("{:.2} (max {})", k.miss_concurrency(), k.max_outstanding),
            ns_us(k.pure_avg_miss_penalty_ns()),
            ns_us(k.camat_ns()),
        ]);
    }
    t.add_row(vec![
        "bricks together".to_string(),
        format!("{} faults", levels.brick_faults),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        format!("C-AMAT₂ = {}", us(levels.bricks_camat_s)),
    ]);
    eprintln!(
        "rackmem C-AMAT of pid {pid} (seed 002; docs/model.md): page touches sampled every {} ms (a lower bound); \
         a pure miss overlapped no other (faults at the local buffer, brick reads at the bricks); a brick's C-AMAT \
         is the time any read of it was outstanding per fault it served, C-AMAT₂ their mean weighted by faults; \
         a fault was outstanding {:.3} s of {:.3} s ({:.0}% of the run: its stall on remote memory when no other \
         thread computes meanwhile)\n{t}",
        INTERVAL.as_millis(),
        c.miss_time_s(),
        c.wall_s,
        100.0 * c.stall_share()
    );
    if rewrite {
        let camat = serde_json::json!({
            "page_accesses": page_accesses,
            "sample_interval_ms": INTERVAL.as_millis() as u64,
            "miss_ratio": c.miss_ratio(),
            "bricks_camat_us": levels.bricks_camat_s * 1e6,
            "local_miss_term_us": levels.local_miss_term_s * 1e6,
            "levels": levels.json(&s),
            "miss_time_s": c.miss_time_s(),
            "wall_s": c.wall_s,
            "stall_share": c.stall_share(),
        });
        let lines: Vec<String> = text
            .lines()
            .map(|l| match serde_json::from_str::<serde_json::Value>(l) {
                Ok(mut v) if v["pid"].as_u64() == Some(u64::from(pid)) => {
                    v["camat"] = camat.clone();
                    v.to_string()
                }
                _ => l.to_string(),
            })
            .collect();
        if let Err(e) = std::fs::write(stats, lines.join("\n") + "\n") {
            eprintln!("rackmem: cannot add C-AMAT to {}: {e}", stats.display());
        }
    }
}

/// The levels of C-AMAT from a snapshot: the bricks' level as the faults-weighted mean of each
/// brick's C-AMAT, and the local buffer's miss term through the recursive form (Eq. 4, κ₁ = 1).
/// Without per-brick figures (a runtime that served no fault from a brick), C-AMAT₂ is the
/// counters' (mean fault time ÷ miss concurrency).
struct Levels {
    brick_faults: u64,
    bricks_camat_s: f64,
    local_miss_term_s: f64,
}

impl Levels {
    fn of(s: &StatsSnapshot, c: &FromCounters) -> Levels {
        let brick_faults: u64 = s.bricks.iter().map(|b| b.counts.faults).sum();
        let parts: Vec<(u64, f64)> = s
            .bricks
            .iter()
            .map(|b| (b.counts.faults, b.counts.camat_ns() * 1e-9))
            .collect();
        let bricks_camat_s = rackmem_model::camat::weighted(&parts).unwrap_or_else(|| c.bricks_camat_s());
        let first = rackmem_model::Level {
            hit_time: 0.0,
            hit_concurrency: 0.0,
            miss_ratio: c.miss_ratio(),
            kappa: 1.0,
        };
        Levels {
            brick_faults,
            bricks_camat_s,
            local_miss_term_s: rackmem_model::camat::recursive(&[first], bricks_camat_s),
        }
    }

    fn json(&self, s: &StatsSnapshot) -> serde_json::Value {
        let level = |name: &str, k: &rackmem_model::LevelCounts| {
            serde_json::json!({
                "level": name,
                "faults": k.faults,
                "pure_misses": k.pure_misses,
                "miss_concurrency": k.miss_concurrency(),
                "pure_avg_miss_penalty_us": k.pure_avg_miss_penalty_ns() / 1e3,
                "camat_us": k.camat_ns() / 1e3,
            })
        };
        let mut v = vec![level("local buffer", &s.local_buffer)];
        v.extend(s.bricks.iter().map(|b| level(&format!("brick {}", b.brick), &b.counts)));
        serde_json::Value::Array(v)
    }
}
