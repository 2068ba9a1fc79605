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
    let us = |x: f64| format!("{:.2} µs", x * 1e6);
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "level",
        "accesses",
        "misses",
        "miss ratio",
        "C-AMAT / miss term",
        "concurrency",
    ]);
    t.add_row(vec![
        "local buffer".to_string(),
        format!("≥ {page_accesses} page touches"),
        format!("{} faults", s.faults),
        format!("{:.4}", c.miss_ratio()),
        format!("miss term MR × C-AMAT₂ = {}", us(c.local_miss_term_s())),
        String::new(),
    ]);
    t.add_row(vec![
        "bricks".to_string(),
        format!("{} faults", s.faults),
        String::new(),
        String::new(),
        format!("C-AMAT₂ = {}", us(c.bricks_camat_s())),
        format!("C_M = {:.2} (max {})", s.faults_in_flight_mean, s.faults_in_flight_max),
    ]);
    eprintln!(
        "rackmem C-AMAT of pid {pid} (seed 002; docs/model.md): page touches sampled every {} ms (a lower bound); \
         C-AMAT₂ = mean fault time {} ÷ miss concurrency; a fault was outstanding {:.3} s of {:.3} s ({:.0}% of \
         the run: its stall on remote memory when no other thread computes meanwhile)\n{t}",
        INTERVAL.as_millis(),
        us(c.fault_mean_s),
        c.miss_time_s(),
        c.wall_s,
        100.0 * c.stall_share()
    );
    if rewrite {
        let camat = serde_json::json!({
            "page_accesses": page_accesses,
            "sample_interval_ms": INTERVAL.as_millis() as u64,
            "miss_ratio": c.miss_ratio(),
            "bricks_camat_us": c.bricks_camat_s() * 1e6,
            "local_miss_term_us": c.local_miss_term_s() * 1e6,
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
