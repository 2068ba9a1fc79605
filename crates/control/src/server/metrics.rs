//! The control plane's Prometheus metrics: requests by route, method and status, the latency
//! of allocations, and, at each scrape, the state's gauges and the connection counters, encoded
//! by `prometheus-client` (through `rackmem-metrics`) as `GET /metrics` serves them.

use crate::plane::Gauges;
use crate::serve::ConnStats;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    method: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BrickLabels {
    brick: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

/// Requests and allocation latencies since the server started.
pub(crate) struct Metrics {
    requests: Family<RequestLabels, Counter>,
    allocation_latency: Histogram,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            requests: Family::default(),
            allocation_latency: Histogram::new(rackmem_metrics::LATENCY_BUCKETS_S),
        }
    }
}

impl Metrics {
    /// Counts one answered request.
    pub(crate) fn count_request(&self, route: String, method: String, status: u16) {
        self.requests
            .get_or_create(&RequestLabels { route, method, status })
            .inc();
    }

    /// Counts the time one `POST /v1/allocations` took.
    pub(crate) fn observe_allocation(&self, d: Duration) {
        self.allocation_latency.observe(d.as_secs_f64());
    }

    /// The metrics as exposition text: whether this control plane leads and serves
    /// (`serving`), the state's gauges (`plane`; `None` on a follower, whose state is as of its
    /// last load), the connection counters and the requests counted here.
    pub(crate) fn render(&self, serving: bool, plane: Option<&Gauges>, conns: &ConnStats) -> String {
        // The gauges are read from the state at each scrape, so the registry is built per scrape;
        // the counters and the histogram registered in it are handles on the long-lived ones.
        let mut r = Registry::with_prefix("rackmem_control");
        r.register(
            "leader",
            "1 when this control plane leads and serves the API, 0 when it follows",
            gauge(u64::from(serving)),
        );
        if let Some(g) = plane {
            plane_gauges(&mut r, g);
            circuit_metrics(&mut r, g);
            rack_metrics(&mut r, g);
        }
        r.register(
            "connections",
            "HTTP connections open now",
            gauge(conns.open.load(Ordering::Relaxed) as u64),
        );
        r.register(
            "connections_refused",
            "Connections closed at accept: a connection cap was reached",
            ConstCounter::new(conns.refused.load(Ordering::Relaxed)),
        );
        r.register(
            "tls_failures",
            "TLS handshakes that failed or timed out",
            ConstCounter::new(conns.tls_failures.load(Ordering::Relaxed)),
        );
        r.register(
            "requests",
            "HTTP requests by route, method and status",
            self.requests.clone(),
        );
        r.register(
            "allocation_seconds",
            "Time to serve POST /v1/allocations",
            self.allocation_latency.clone(),
        );
        rackmem_metrics::encode(&r)
    }
}

fn gauge(v: u64) -> Gauge {
    let g = Gauge::default();
    g.set(i64::try_from(v).unwrap_or(i64::MAX));
    g
}

/// The gauges of the state (allocations, segments, nodes, bricks).
fn plane_gauges(r: &mut Registry, g: &Gauges) {
    r.register("allocations", "Live allocations", gauge(g.allocations));
    r.register("segments", "Live segments", gauge(g.segments));
    r.register("nodes", "Registered nodes", gauge(g.nodes));
    let bricks = Family::<StateLabels, Gauge>::default();
    for (state, n) in [("up", g.bricks_up), ("down", g.bricks_down)] {
        bricks
            .get_or_create(&StateLabels { state })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    r.register("bricks", "Registered bricks by state", bricks);
    let per_brick = |f: fn(&(String, u64, u64, u64)) -> u64| {
        let fam = Family::<BrickLabels, Gauge>::default();
        for b in &g.bricks {
            fam.get_or_create(&BrickLabels { brick: b.0.clone() })
                .set(i64::try_from(f(b)).unwrap_or(i64::MAX));
        }
        fam
    };
    r.register("brick_capacity_bytes", "Pool size of each brick", per_brick(|b| b.1));
    r.register("brick_free_bytes", "Bytes in no segment, per brick", per_brick(|b| b.2));
    r.register(
        "brick_allocated_bytes",
        "Bytes in segments, per brick",
        per_brick(|b| b.3),
    );
}

/// The circuits: how many live, and how long each took to set up (placed, switches configured,
/// stored; moves included).
fn circuit_metrics(r: &mut Registry, g: &Gauges) {
    r.register(
        "circuits",
        "Live circuits (allocations holding their links alone)",
        gauge(g.circuits),
    );
    if let Some(h) = &g.circuit_setup {
        r.register(
            "circuit_setup_seconds",
            "Time to set up or move a circuit, switches configured and the allocation stored",
            h.clone(),
        );
    }
}

/// The rack's annotations (seed 004, section V): each brick's load and connections from its
/// heartbeats, what its memory serves and what is promised to its segments; each node's pool.
fn rack_metrics(r: &mut Registry, g: &Gauges) {
    type Row = crate::plane::BrickRates;
    let per_brick = |f: fn(&Row) -> Option<u64>| {
        let fam = Family::<BrickLabels, Gauge>::default();
        for b in &g.brick_rates {
            if let Some(v) = f(b) {
                let labels = BrickLabels { brick: b.0.clone() };
                fam.get_or_create(&labels).set(i64::try_from(v).unwrap_or(i64::MAX));
            }
        }
        fam
    };
    r.register(
        "brick_load_bytes_per_second",
        "Bytes per second a brick served between its last two heartbeats",
        per_brick(|b| b.1),
    );
    r.register(
        "brick_connections",
        "Connections a brick had open at its last heartbeat",
        per_brick(|b| b.2),
    );
    r.register(
        "brick_serve_bytes_per_second",
        "What a brick's memory serves, as registered or set by an operator",
        per_brick(|b| b.3),
    );
    r.register(
        "brick_promised_bytes_per_second",
        "The rates of a brick's segments added up",
        per_brick(|b| Some(b.4)),
    );
    let per_node = |f: fn(&(String, u64, u64)) -> u64| {
        let fam = Family::<NodeLabels, Gauge>::default();
        for n in &g.node_pools {
            let labels = NodeLabels { node: n.0.clone() };
            fam.get_or_create(&labels).set(i64::try_from(f(n)).unwrap_or(i64::MAX));
        }
        fam
    };
    r.register(
        "node_pool_bytes",
        "Bytes pushed to a node's pool (allocations without a holder)",
        per_node(|n| n.1),
    );
    r.register(
        "node_pool_in_use_bytes",
        "Bytes of a node's pool its processes use, as its agent last reported",
        per_node(|n| n.2),
    );
}
