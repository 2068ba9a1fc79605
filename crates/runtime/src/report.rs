//! The figures a running program's runtime reports to its node agent (`ProcessReport`), so
//! that the agent's metrics, the control plane's dashboard and `rackmem top` see a program while
//! it runs, not only its `--stats` at exit. Sent by the watchdog once a second when the program's
//! memory comes from an agent.

use crate::inner::Inner;
use crate::PAGE;
use rackmem_proto::{
    BrickLevelReport, LatencyHistogram, ProcessReport, FAULT_LATENCY_BOUNDS_NS, MAX_BRICK_NAME_LEN, MAX_PROGRAM_LEN,
};
use std::sync::atomic::Ordering::Relaxed;

/// The process's figures now.
pub(crate) fn report(inner: &Inner) -> ProcessReport {
    let probes = {
        let c = inner.lock();
        inner.budget_pages(&c);
        c.probe_counts()
    };
    let s = &inner.stats;
    let g = |a: &std::sync::atomic::AtomicU64| a.load(Relaxed);
    let (miss_concurrency, faults_in_flight_max) = s.in_flight.mean_and_max();
    let program = cut(std::env::args().next().unwrap_or_default(), MAX_PROGRAM_LEN);
    ProcessReport {
        pid: std::process::id(),
        program,
        uptime_ms: inner.now_ns() / 1_000_000,
        faults: g(&s.faults),
        faults_remote: g(&s.faults_remote),
        bytes_fetched: g(&s.bytes_fetched),
        bytes_prefetched: g(&s.bytes_prefetched),
        bytes_written_back: g(&s.bytes_written_back),
        evictions: g(&s.evictions),
        resident_bytes: g(&s.resident_pages) * PAGE,
        budget_bytes: g(&s.budget_pages) * PAGE,
        window_bytes: g(&s.window_bytes_allocated),
        peak_footprint_bytes: g(&s.peak_committed_pages) * PAGE,
        miss_concurrency,
        faults_in_flight_max,
        readahead_accuracy: probes.accuracy(),
        fault_latency: LatencyHistogram {
            cumulative: FAULT_LATENCY_BOUNDS_NS
                .iter()
                .map(|b| s.fault_latency.count_at_most(*b))
                .collect(),
            count: s.fault_latency.count(),
            sum_ns: s.fault_latency.sum_ns(),
        },
        bricks: s
            .bricks
            .snapshot()
            .into_iter()
            .map(|b| BrickLevelReport {
                brick: cut(b.brick, MAX_BRICK_NAME_LEN),
                faults: b.counts.faults,
                pure_misses: b.counts.pure_misses,
                pure_miss_ns: b.counts.pure_miss_ns,
                busy_ns: b.counts.busy_ns,
                accum_ns: b.counts.accum_ns,
                max_outstanding: b.counts.max_outstanding,
            })
            .collect(),
    }
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut at = max;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}
