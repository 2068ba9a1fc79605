//! The figures a running program's runtime reports to its node agent (`ProcessReport`), so
//! that the agent's metrics, the control plane's dashboard and `rackmem top` see a program while
//! it runs, not only its `--stats` at exit. Sent by the watchdog once a second when the program's
//! memory comes from an agent.

use crate::inner::Inner;
use crate::PAGE;
use rackmem_proto::{LatencyHistogram, ProcessReport, FAULT_LATENCY_BOUNDS_NS, MAX_PROGRAM_LEN};
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
    let mut program = std::env::args().next().unwrap_or_default();
    if program.len() > MAX_PROGRAM_LEN {
        let mut cut = MAX_PROGRAM_LEN;
        while !program.is_char_boundary(cut) {
            cut -= 1;
        }
        program.truncate(cut);
    }
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
    }
}
