//! Each connected process's latest figures (the `report` request, about once a second), exported
//! in the agent's metrics per process and passed on to the control plane
//! (`PUT /v1/nodes/{id}/processes`) for the dashboard and `rackmem top`.
//!
//! Bounded: one entry per connection (at most `--max-connections`), dropped when it closes.

use super::{lock, Shared};
use crate::api::{level_counts, ProcessReports};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use rackmem_proto::{BrickLevelReport, ProcessReport, FAULT_LATENCY_BOUNDS_NS};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How often the agent passes its processes' figures on, at most.
const FORWARD_EVERY: Duration = Duration::from_secs(2);
/// How often it does so even when nothing changed (the control plane forgets a node's
/// processes after 30 s without a report).
const REFRESH_EVERY: Duration = Duration::from_secs(10);

/// Largest report body sent: under the control plane's default body limit (64 KiB).
const MAX_BODY: usize = 60 << 10;

/// The reports by connection, and what was last passed on.
#[derive(Default)]
pub(super) struct Reports {
    by_connection: HashMap<u64, (u32, ProcessReport)>,
    changed: bool,
    last_forward: Option<Instant>,
}

/// Keeps `r` as connection `id`'s (user `uid`) latest report.
pub(super) fn store(shared: &Shared, id: u64, uid: u32, r: ProcessReport) {
    let mut t = lock(&shared.reports);
    t.by_connection.insert(id, (uid, r));
    t.changed = true;
}

/// Drops connection `id`'s report (it closed).
pub(super) fn forget(shared: &Shared, id: u64) {
    let mut t = lock(&shared.reports);
    if t.by_connection.remove(&id).is_some() {
        t.changed = true;
    }
}

/// Passes the reports on to the control plane when they changed (every [`FORWARD_EVERY`] at
/// most) or [`REFRESH_EVERY`] has passed. A failure is retried at the next call: the figures
/// are for watching, and the next ones replace them.
pub(super) fn forward(shared: &Shared) {
    let node = shared.node.load(Ordering::Acquire);
    let body = {
        let mut t = lock(&shared.reports);
        let since = t.last_forward.map(|at| at.elapsed());
        let due = match since {
            None => t.changed,
            Some(s) => (t.changed && s >= FORWARD_EVERY) || s >= REFRESH_EVERY,
        };
        if node == 0 || !due {
            return;
        }
        t.changed = false;
        t.last_forward = Some(Instant::now());
        let mut processes: Vec<ProcessReport> = t.by_connection.values().map(|(_, r)| r.clone()).collect();
        // The busiest, when there are more than a report carries.
        processes.sort_by_key(|r| std::cmp::Reverse(r.faults));
        processes.truncate(crate::api::MAX_REPORTED_PROCESSES);
        // Long program names and large counters can still exceed the API's body limit.
        while processes.len() > 1 && serde_json::to_vec(&processes).map_or(usize::MAX, |v| v.len()) > MAX_BODY {
            processes.pop();
        }
        processes.sort_by_key(|r| r.pid);
        ProcessReports { processes }
    };
    if shared.client.report_processes(node, &body).is_err() {
        lock(&shared.reports).changed = true;
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProcessLabels {
    pid: u32,
    uid: u32,
    program: String,
}

/// The per-process families of the agent's metrics, from a copy of the reports taken at the
/// scrape.
#[derive(Debug)]
pub(super) struct ProcessCollector(Vec<(ProcessLabels, ProcessReport)>);

impl ProcessCollector {
    pub(super) fn of(shared: &Shared) -> ProcessCollector {
        let t = lock(&shared.reports);
        let mut v: Vec<(ProcessLabels, ProcessReport)> = t
            .by_connection
            .values()
            .map(|(uid, r)| {
                (
                    ProcessLabels {
                        pid: r.pid,
                        uid: *uid,
                        program: r.program.clone(),
                    },
                    r.clone(),
                )
            })
            .collect();
        v.sort_by_key(|(l, _)| l.pid);
        ProcessCollector(v)
    }
}

type Figure = fn(&ProcessReport) -> u64;
type BrickFigure = fn(&BrickLevelReport) -> u64;
type BrickRatio = fn(&BrickLevelReport) -> f64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BrickLabels {
    pid: u32,
    uid: u32,
    program: String,
    brick: String,
}

fn brick_labels(p: &ProcessLabels, b: &BrickLevelReport) -> BrickLabels {
    BrickLabels {
        pid: p.pid,
        uid: p.uid,
        program: p.program.clone(),
        brick: b.brick.clone(),
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counters: [(&str, &str, Figure); 6] = [
            ("process_faults", "Faults the process's runtime served", |r| r.faults),
            ("process_remote_faults", "Faults whose page came from a brick", |r| {
                r.faults_remote
            }),
            ("process_fetched_bytes", "Bytes fetched from bricks for faults", |r| {
                r.bytes_fetched
            }),
            ("process_prefetched_bytes", "Bytes read ahead of faults", |r| {
                r.bytes_prefetched
            }),
            ("process_written_back_bytes", "Bytes written back to bricks", |r| {
                r.bytes_written_back
            }),
            ("process_evictions", "Pages evicted from the local buffer", |r| {
                r.evictions
            }),
        ];
        for (name, help, f) in counters {
            let mut m = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (labels, r) in &self.0 {
                ConstCounter::new(f(r)).encode(m.encode_family(labels)?)?;
            }
        }
        let gauges: [(&str, &str, Figure); 4] = [
            ("process_resident_bytes", "The process's local buffer now", |r| {
                r.resident_bytes
            }),
            ("process_budget_bytes", "The local buffer's budget now", |r| {
                r.budget_bytes
            }),
            ("process_window_bytes", "Window memory the process holds now", |r| {
                r.window_bytes
            }),
            ("process_faults_in_flight_max", "Most faults outstanding at once", |r| {
                u64::from(r.faults_in_flight_max)
            }),
        ];
        for (name, help, f) in gauges {
            let mut m = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (labels, r) in &self.0 {
                ConstGauge::new(i64::try_from(f(r)).unwrap_or(i64::MAX)).encode(m.encode_family(labels)?)?;
            }
        }
        let mut m = encoder.encode_descriptor(
            "process_miss_concurrency",
            "Faults outstanding at once, time-weighted over the time any was (seed 002's C_M)",
            None,
            MetricType::Gauge,
        )?;
        for (labels, r) in &self.0 {
            ConstGauge::new(r.miss_concurrency).encode(m.encode_family(labels)?)?;
        }
        // The bricks' level of C-AMAT, brick by brick: what a researcher reads to see which
        // brick a program waits on, while it runs.
        let brick_counters: [(&str, &str, BrickFigure); 2] = [
            ("process_brick_faults", "Faults whose page this brick served", |b| {
                b.faults
            }),
            (
                "process_brick_pure_misses",
                "Of those, faults no other outstanding fault overlapped (seed 002's pure misses)",
                |b| b.pure_misses,
            ),
        ];
        for (name, help, f) in brick_counters {
            let mut m = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (labels, r) in &self.0 {
                for b in &r.bricks {
                    ConstCounter::new(f(b)).encode(m.encode_family(&brick_labels(labels, b))?)?;
                }
            }
        }
        let brick_gauges: [(&str, &str, BrickRatio); 3] = [
            (
                "process_brick_camat_seconds",
                "C-AMAT of this brick's level: time any fault it serves is outstanding, per fault",
                |b| level_counts(b).camat_ns() / 1e9,
            ),
            (
                "process_brick_miss_concurrency",
                "Faults this brick serves outstanding at once, time-weighted over the time any was",
                |b| level_counts(b).miss_concurrency(),
            ),
            (
                "process_brick_pure_miss_penalty_seconds",
                "Mean time of this brick's pure misses (seed 002's pAMP)",
                |b| level_counts(b).pure_avg_miss_penalty_ns() / 1e9,
            ),
        ];
        for (name, help, f) in brick_gauges {
            let mut m = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (labels, r) in &self.0 {
                for b in &r.bricks {
                    ConstGauge::new(f(b)).encode(m.encode_family(&brick_labels(labels, b))?)?;
                }
            }
        }
        let mut m = encoder.encode_descriptor(
            "process_fault_seconds",
            "Fault service time",
            None,
            MetricType::Histogram,
        )?;
        for (labels, r) in &self.0 {
            let h = &r.fault_latency;
            // The encoder takes each bucket's own count and sums them up again.
            let mut below = 0;
            let mut buckets: Vec<(f64, u64)> = FAULT_LATENCY_BOUNDS_NS
                .iter()
                .zip(&h.cumulative)
                .map(|(b, c)| {
                    let own = c.saturating_sub(below);
                    below = *c;
                    (*b as f64 / 1e9, own)
                })
                .collect();
            buckets.push((f64::INFINITY, h.count.saturating_sub(below)));
            m.encode_family(labels)?
                .encode_histogram::<NoLabelSet>(h.sum_ns as f64 / 1e9, h.count, &buckets, None)?;
        }
        Ok(())
    }
}
