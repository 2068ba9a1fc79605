//! The control plane's Prometheus metrics: requests by route, method and status, the latency
//! of allocations, and their text (format 0.0.4) with the state's gauges and the connection
//! counters, as `GET /metrics` serves it.

use crate::plane::Gauges;
use crate::serve::ConnStats;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Upper bounds (seconds) of the allocation latency histogram buckets.
const LATENCY_BUCKETS_S: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; LATENCY_BUCKETS_S.len()],
    count: u64,
    sum_s: f64,
}

/// Requests and allocation latencies since the server started.
#[derive(Default)]
pub(crate) struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    allocation_latency: Mutex<Histogram>,
}

impl Metrics {
    /// Counts one answered request.
    pub(crate) fn count_request(&self, route: String, method: String, status: u16) {
        *self.requests().entry((route, method, status)).or_insert(0) += 1;
    }

    /// Counts the time one `POST /v1/allocations` took.
    pub(crate) fn observe_allocation(&self, d: Duration) {
        let s = d.as_secs_f64();
        let mut h = self.allocation_latency();
        for (i, le) in LATENCY_BUCKETS_S.iter().enumerate() {
            if s <= *le {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum_s += s;
    }

    /// The metrics in the Prometheus text format: whether this control plane leads and serves
    /// (`serving`), the state's gauges (`plane`; `None` on a follower, whose state is as of its
    /// last load), the connection counters and the requests counted here.
    pub(crate) fn render(&self, serving: bool, plane: Option<&Gauges>, conns: &ConnStats) -> String {
        let mut out = String::new();
        let mut gauge = |name: &str, help: &str, rows: &[(String, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (labels, v) in rows {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        gauge(
            "rackmem_control_leader",
            "1 when this control plane leads and serves the API, 0 when it follows.",
            &[(String::new(), u64::from(serving))],
        );
        if let Some(g) = plane {
            plane_gauges(g, &mut gauge);
        }
        gauge(
            "rackmem_control_connections",
            "HTTP connections open now.",
            &[(String::new(), conns.open.load(Ordering::Relaxed) as u64)],
        );
        let _ = writeln!(
            out,
            "# HELP rackmem_control_connections_refused_total Connections closed at accept: a connection cap was reached.\n\
             # TYPE rackmem_control_connections_refused_total counter\n\
             rackmem_control_connections_refused_total {}\n\
             # HELP rackmem_control_tls_failures_total TLS handshakes that failed or timed out.\n\
             # TYPE rackmem_control_tls_failures_total counter\n\
             rackmem_control_tls_failures_total {}",
            conns.refused.load(Ordering::Relaxed),
            conns.tls_failures.load(Ordering::Relaxed),
        );
        let _ = writeln!(
            out,
            "# HELP rackmem_control_requests_total HTTP requests by route, method and status.\n\
             # TYPE rackmem_control_requests_total counter"
        );
        for ((route, method, status), n) in self.requests().iter() {
            let _ = writeln!(
                out,
                "rackmem_control_requests_total{{route=\"{}\",method=\"{method}\",status=\"{status}\"}} {n}",
                escape_label(route)
            );
        }
        let _ = writeln!(
            out,
            "# HELP rackmem_control_allocation_seconds Time to serve POST /v1/allocations.\n\
             # TYPE rackmem_control_allocation_seconds histogram"
        );
        {
            let h = self.allocation_latency();
            for (le, n) in LATENCY_BUCKETS_S.iter().zip(h.counts) {
                let _ = writeln!(out, "rackmem_control_allocation_seconds_bucket{{le=\"{le}\"}} {n}");
            }
            let _ = writeln!(
                out,
                "rackmem_control_allocation_seconds_bucket{{le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(out, "rackmem_control_allocation_seconds_sum {}", h.sum_s);
            let _ = writeln!(out, "rackmem_control_allocation_seconds_count {}", h.count);
        }
        out
    }

    fn requests(&self) -> MutexGuard<'_, BTreeMap<(String, String, u16), u64>> {
        // A panic while holding the lock cannot leave a count half-updated in a way that
        // matters more than refusing all further requests would.
        self.requests.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn allocation_latency(&self) -> MutexGuard<'_, Histogram> {
        self.allocation_latency.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The gauges of the state (allocations, segments, nodes, bricks).
fn plane_gauges(g: &Gauges, gauge: &mut impl FnMut(&str, &str, &[(String, u64)])) {
    gauge(
        "rackmem_control_allocations",
        "Live allocations.",
        &[(String::new(), g.allocations)],
    );
    gauge(
        "rackmem_control_segments",
        "Live segments.",
        &[(String::new(), g.segments)],
    );
    gauge(
        "rackmem_control_nodes",
        "Registered nodes.",
        &[(String::new(), g.nodes)],
    );
    gauge(
        "rackmem_control_bricks",
        "Registered bricks by state.",
        &[
            ("{state=\"up\"}".to_string(), g.bricks_up),
            ("{state=\"down\"}".to_string(), g.bricks_down),
        ],
    );
    let per_brick = |f: fn(&(String, u64, u64, u64)) -> u64| -> Vec<(String, u64)> {
        g.bricks
            .iter()
            .map(|b| (format!("{{brick=\"{}\"}}", escape_label(&b.0)), f(b)))
            .collect()
    };
    gauge(
        "rackmem_control_brick_capacity_bytes",
        "Pool size of each brick.",
        &per_brick(|b| b.1),
    );
    gauge(
        "rackmem_control_brick_free_bytes",
        "Bytes in no segment, per brick.",
        &per_brick(|b| b.2),
    );
    gauge(
        "rackmem_control_brick_allocated_bytes",
        "Bytes in segments, per brick.",
        &per_brick(|b| b.3),
    );
}
