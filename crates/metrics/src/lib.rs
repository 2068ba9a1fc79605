//! Prometheus metrics for rackmem's services.
//!
//! Every service (control plane, node agent, brick) describes its metrics as typed families of
//! the Prometheus project's client library, `prometheus-client`, and this crate turns a registry
//! into exposition text ([`encode`]) and serves it to scrapers for the processes that have no web
//! framework of their own ([`serve`]: the agent and the brick). The control plane serves the same
//! text from its REST server, behind its own authorisation.
//!
//! What this crate is not: a place for the metrics themselves. Each service owns its families and
//! their names (`rackmem_control_*`, `rackmem_agent_*`, `rackmem_brick_*`), documented in
//! `docs/`.

mod serve;

pub use serve::{serve, MAX_SCRAPERS, SCRAPE_TIMEOUT};

use prometheus_client::registry::Registry;

/// The `Content-Type` of [`encode`]'s text: OpenMetrics 1.0, which Prometheus negotiates and
/// reads, with the `# EOF` line that tells a scraper the answer is whole.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds, in seconds, of the latency histograms of requests a service answers: 1 µs
/// (a shared-memory brick read) to 1 s (an allocation waiting on a store), a factor of about 2.5
/// apart, so that one histogram family serves both without losing the fast end.
pub const LATENCY_BUCKETS_S: [f64; 16] = [
    0.000_001,
    0.000_002_5,
    0.000_005,
    0.000_01,
    0.000_025,
    0.000_05,
    0.000_1,
    0.000_25,
    0.000_5,
    0.001,
    0.002_5,
    0.005,
    0.01,
    0.025,
    0.1,
    1.0,
];

/// The registry's metrics as exposition text.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail; an error here would come from a metric's own encoder,
    // and an empty answer tells the scraper more than a half-written one would.
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        out.clear();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::histogram::Histogram;

    #[test]
    fn encodes_counters_and_histograms_with_the_names_scrapers_see() {
        let mut r = Registry::with_prefix("rackmem_test");
        let c: Counter = Counter::default();
        c.inc_by(3);
        r.register("requests", "Requests answered", c);
        let h = Histogram::new(LATENCY_BUCKETS_S);
        h.observe(0.000_003);
        r.register("latency_seconds", "Latency", h);
        let text = encode(&r);
        assert!(text.contains("rackmem_test_requests_total 3"), "{text}");
        assert!(text.contains("rackmem_test_latency_seconds_count 1"), "{text}");
        assert!(
            text.contains("rackmem_test_latency_seconds_bucket{le=\"0.0000025\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("rackmem_test_latency_seconds_bucket{le=\"0.000005\"} 1"),
            "{text}"
        );
        // The library ends every help text with a full stop of its own.
        assert!(
            text.contains("# HELP rackmem_test_requests Requests answered.\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
