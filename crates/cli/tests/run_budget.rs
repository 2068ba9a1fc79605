//! One budget for the whole run: every process of one `rackmem run` shares `--local`, the way
//! the processes of a memory cgroup share its limit. `tests/c/run_budget.c` forks children at
//! once that each need more than the run's budget; their output must be the native run's, and
//! the sum of their `RssAnon` (sampled from /proc while they run) must stay under the run's
//! budget plus [`ALLOWANCE_PER_PROCESS`] per process, far below the budget per process that
//! each would have on its own.

mod common;
use common::*;
use std::process::Command;

const MIB: u64 = 1 << 20;

/// Local memory a process of the run may hold beyond its share of the budget: the runtime's own
/// memory (about 6 MiB: its threads, tables, the C library's blocks for it) and its staging
/// area for pages on their way to the brick (4 MiB). docs/architecture.md states it.
const ALLOWANCE_PER_PROCESS: u64 = 12 * MIB;

fn sorted_lines(b: &[u8]) -> Vec<String> {
    let mut v: Vec<String> = String::from_utf8_lossy(b).lines().map(str::to_string).collect();
    v.sort();
    v
}

/// Runs `run_budget MIB CHILDREN PASSES` natively and under `--local LOCAL`; returns the
/// largest sum of `RssAnon` under rackmem and the statistics of its processes.
fn shared(mib: u64, children: u64, local: &str) -> (u64, Vec<ProcStats>) {
    require_root();
    let prog = program("run_budget");
    let args = [mib.to_string(), children.to_string(), "3".to_string()];
    let mut native = Command::new(&prog);
    native.args(&args);
    let (n, _) = run_sampled_tree(native);
    assert!(n.status.success(), "run_budget failed natively: {}", show(&n));
    let stats = build_dir().join(format!("stats-run-budget-{}.jsonl", unique()));
    let mut c = Command::new(rackmem());
    c.args(["run", "--local", local, "--stats-json"])
        .arg(&stats)
        .arg("--")
        .arg(&prog)
        .args(&args);
    let (o, sample) = run_sampled_tree(c);
    assert!(o.status.success(), "run_budget failed under rackmem: {}", show(&o));
    assert_eq!(
        sorted_lines(&o.stdout),
        sorted_lines(&n.stdout),
        "checksums differ from the native run"
    );
    assert_eq!(
        sorted_lines(&o.stdout).len() as u64,
        children,
        "a child printed no checksum"
    );
    (sample.largest_sum, read_stats(&stats))
}

#[test]
fn children_together_stay_within_one_byte_budget() {
    // Four children of 48 MiB each at once; 32 MiB for the whole run. Each alone would be
    // allowed 32 MiB (128 MiB together).
    let (children, budget) = (4, 32 * MIB);
    let (sum, stats) = shared(48, children, "32MiB");
    let workers: Vec<&ProcStats> = stats
        .iter()
        .filter(|s| s.window_bytes_allocated > 0 || s.faults > 0)
        .collect();
    assert!(
        workers.len() as u64 >= children,
        "not every child reported statistics: {stats:?}"
    );
    let limit = budget + (children + 1) * ALLOWANCE_PER_PROCESS;
    eprintln!(
        "RssAnon of the run at once: at most {} MiB (limit {} MiB)",
        sum / MIB,
        limit / MIB
    );
    assert!(
        sum <= limit,
        "the run's processes held {} MiB of anonymous memory at once, more than the run's budget of {} MiB + {} MiB",
        sum / MIB,
        budget / MIB,
        (children + 1) * ALLOWANCE_PER_PROCESS / MIB
    );
    for s in &stats {
        assert_eq!(
            s.extra("run_budget_bytes"),
            budget,
            "the run's budget as reported: {s:?}"
        );
    }
    // Window pages resident at once, summed as each process last published them: a process
    // over its share gives room back at its next faults, not at once, so the sum may pass the
    // budget for a while (a child that allocated first held the whole budget before the others
    // allocated); it stays far under the budget per process that each would have alone.
    let resident = stats
        .iter()
        .map(|s| s.extra("run_peak_resident_bytes"))
        .max()
        .unwrap_or(0);
    eprintln!(
        "window pages of the run resident at once: at most {} MiB",
        resident / MIB
    );
    assert!(
        resident <= children * budget / 2,
        "the run's window pages resident at once reached {} MiB, half of a budget per process ({} MiB)",
        resident / MIB,
        children * budget / MIB
    );
}

#[test]
fn a_percentage_is_of_the_whole_run_s_peak_footprint() {
    let children = 3;
    let (sum, stats) = shared(40, children, "25%");
    let footprint = stats
        .iter()
        .map(|s| s.extra("run_peak_footprint_bytes"))
        .max()
        .unwrap_or(0);
    let budget = stats.iter().map(|s| s.extra("run_budget_bytes")).max().unwrap_or(0);
    // The three children's 40 MiB at once (the parent's window is empty).
    assert!(
        footprint >= children * 40 * MIB,
        "the run's peak footprint is {} MiB, less than its children's {} MiB together",
        footprint / MIB,
        children * 40
    );
    assert!(
        budget >= footprint / 4 - MIB && budget <= footprint / 4 + MIB,
        "the run's budget is {} MiB, not a quarter of its peak footprint ({} MiB)",
        budget / MIB,
        footprint / MIB
    );
    let limit = budget + (children + 1) * ALLOWANCE_PER_PROCESS;
    assert!(
        sum <= limit,
        "the run's processes held {} MiB of anonymous memory at once, more than {} MiB",
        sum / MIB,
        limit / MIB
    );
}

#[test]
fn an_idle_process_gives_its_excess_back_to_the_run() {
    // Child A fills 128 MiB alone (it may hold the whole 96 MiB budget), then goes idle; child B
    // fills and reads its own 128 MiB. Their shares are 48 MiB each: A, which makes no fault
    // while idle, must give the other 48 MiB back on its own.
    require_root();
    let prog = program("idle_share");
    let (mib, budget) = (128u64, 96 * MIB);
    let native = Command::new(&prog)
        .arg(mib.to_string())
        .output()
        .expect("run idle_share");
    assert!(native.status.success(), "idle_share failed natively: {}", show(&native));
    let stats = build_dir().join(format!("stats-idle-share-{}.jsonl", unique()));
    let o = Command::new(rackmem())
        .args(["run", "--local", "96MiB", "--stats-json"])
        .arg(&stats)
        .arg("--")
        .arg(&prog)
        .arg(mib.to_string())
        .output()
        .expect("run rackmem");
    assert!(o.status.success(), "idle_share failed under rackmem: {}", show(&o));
    let checksums = |b: &[u8]| -> Vec<String> {
        sorted_lines(b)
            .into_iter()
            .filter(|l| l.contains("checksum="))
            .collect()
    };
    assert_eq!(
        checksums(&o.stdout),
        checksums(&native.stdout),
        "checksums differ from the native run"
    );
    assert_eq!(
        checksums(&o.stdout).len(),
        2,
        "a child printed no checksum: {}",
        show(&o)
    );
    let idle_rss = String::from_utf8_lossy(&o.stdout)
        .lines()
        .find_map(|l| {
            l.strip_prefix("idle_rss_kib=")
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .unwrap_or_else(|| panic!("idle_share printed no idle_rss_kib: {}", show(&o)))
        * 1024;
    let share = budget / 2;
    eprintln!(
        "the idle child's RssAnon while the other worked: {} MiB (its share {} MiB)",
        idle_rss / MIB,
        share / MIB
    );
    assert!(
        idle_rss <= share + ALLOWANCE_PER_PROCESS,
        "the idle child held {} MiB of anonymous memory while the other needed its share: more than its share of {} MiB + {} MiB",
        idle_rss / MIB,
        share / MIB,
        ALLOWANCE_PER_PROCESS / MIB
    );
    let given: u64 = read_stats(&stats).iter().map(|s| s.extra("evictions_given_back")).sum();
    assert!(
        given * 4096 >= (budget - share) / 2,
        "the statistics count {given} pages given back, fewer than the idle child's excess: {}",
        show(&o)
    );
}

#[test]
fn a_percentage_gives_a_small_run_its_floor() {
    // One child of 16 MiB at 25%: a quarter of the run's footprint is 4 MiB, and the floor a
    // percentage gives a run (8 MiB by default, never more than the footprint) lifts it.
    require_root();
    let prog = program("run_budget");
    let args = ["16", "1", "3"];
    let native = Command::new(&prog).args(args).output().expect("run run_budget");
    assert!(native.status.success(), "run_budget failed natively: {}", show(&native));
    let stats = build_dir().join(format!("stats-run-budget-floor-{}.jsonl", unique()));
    let o = Command::new(rackmem())
        .env_remove(LOCAL_FLOOR_ENV)
        .args(["run", "--local", "25%", "--stats-json"])
        .arg(&stats)
        .arg("--")
        .arg(&prog)
        .args(args)
        .output()
        .expect("run rackmem");
    assert!(o.status.success(), "run_budget failed under rackmem: {}", show(&o));
    assert_eq!(
        sorted_lines(&o.stdout),
        sorted_lines(&native.stdout),
        "checksums differ from the native run"
    );
    let stats = read_stats(&stats);
    let footprint = stats
        .iter()
        .map(|s| s.extra("run_peak_footprint_bytes"))
        .max()
        .unwrap_or(0);
    let budget = stats.iter().map(|s| s.extra("run_budget_bytes")).max().unwrap_or(0);
    assert!(
        (16 * MIB..32 * MIB).contains(&footprint),
        "the run's peak footprint is {} KiB, not its child's 16 MiB and a little: {stats:?}",
        footprint >> 10
    );
    assert_eq!(
        budget,
        8 * MIB,
        "the run's budget is {} KiB, not the floor of 8 MiB (a quarter of its footprint is {} KiB)",
        budget >> 10,
        footprint >> 12
    );
}
