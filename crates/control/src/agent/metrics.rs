//! The agent's metrics: its counters as `prometheus-client` families, and each connected
//! process's latest figures (`report`), encoded for its `--metrics` endpoint (served by
//! `rackmem_metrics::serve`).

use super::{pending_releases, Agent};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};

impl Agent {
    /// The agent's metrics as exposition text.
    pub fn metrics_text(&self) -> String {
        let c = &self.shared.counters;
        let g = |v: &AtomicU64| ConstGauge::new(i64::try_from(v.load(Ordering::Relaxed)).unwrap_or(i64::MAX));
        let n = |v: &AtomicU64| ConstCounter::new(v.load(Ordering::Relaxed));
        let mut r = Registry::with_prefix("rackmem_agent");
        r.register("processes", "Processes connected to the agent", g(&c.processes));
        r.register(
            "allocations",
            "Allocations handed to processes and not returned",
            g(&c.allocations),
        );
        r.register("allocated_bytes", "Bytes in those allocations", g(&c.bytes));
        r.register(
            "refusals",
            "Requests refused by the agent or the control plane",
            n(&c.refusals),
        );
        r.register(
            "pending_releases",
            "Releases the control plane has not taken yet",
            ConstGauge::new(i64::try_from(pending_releases(self)).unwrap_or(i64::MAX)),
        );
        r.register(
            "node",
            "Node id of this agent",
            ConstGauge::new(i64::try_from(self.node()).unwrap_or(i64::MAX)),
        );
        r.register(
            "connections_refused",
            "Connections turned away (peer not admitted, or over --max-connections)",
            n(&c.connections_refused),
        );
        r.register(
            "reclaimed",
            "Allocations nobody held, released by reconciliation",
            n(&c.reclaimed),
        );
        r.register("renewed", "Grant renewals of allocations processes hold", n(&c.renewed));
        r.register_collector(Box::new(super::report::ProcessCollector::of(&self.shared)));
        rackmem_metrics::encode(&r)
    }
}
