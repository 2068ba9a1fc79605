//! The brick's Prometheus metrics (`rackmem brick --metrics ADDR`): its traffic and pool from
//! the STATS counters, what its guard refused and cut, and a latency histogram and outcome
//! counters per opcode, kept by the connection threads as they answer.

use crate::guard::GuardStats;
use crate::PaceStats;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use rackmem_proto::{BrickStats, Opcode};
use std::time::Duration;

/// Opcode bytes with a slot of their own; opcodes are small numbers (`rackmem_proto::Opcode`).
const OPCODE_SLOTS: usize = 64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    opcode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    opcode: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SegmentLabels {
    segment: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

fn latency_histogram() -> Histogram {
    Histogram::new(rackmem_metrics::LATENCY_BUCKETS_S)
}

/// One opcode's handles, shared with the families that encode them.
struct Slot {
    latency: Histogram,
    ok: Counter,
    refused: Counter,
}

/// Per-opcode latencies and outcomes of the requests served on authenticated connections.
pub(crate) struct RequestMetrics {
    latency: Family<OpLabels, Histogram, fn() -> Histogram>,
    outcomes: Family<OutcomeLabels, Counter>,
    /// Indexed by opcode byte, so that a request costs no label lookup.
    slots: Vec<Option<Slot>>,
}

impl Default for RequestMetrics {
    fn default() -> RequestMetrics {
        let latency: Family<OpLabels, Histogram, fn() -> Histogram> = Family::new_with_constructor(latency_histogram);
        let outcomes = Family::<OutcomeLabels, Counter>::default();
        let slots = (0..OPCODE_SLOTS)
            .map(|b| {
                let op = Opcode::from_u8(u8::try_from(b).ok()?)?;
                let opcode = opcode_label(op);
                // One statement per handle: a family's guard lives to the end of its statement,
                // and a second insertion into the same family meanwhile would wait for it forever.
                let latency = latency.get_or_create(&OpLabels { opcode: opcode.clone() }).clone();
                let ok = outcomes
                    .get_or_create(&OutcomeLabels {
                        opcode: opcode.clone(),
                        outcome: "ok",
                    })
                    .clone();
                let refused = outcomes
                    .get_or_create(&OutcomeLabels {
                        opcode,
                        outcome: "error",
                    })
                    .clone();
                Some(Slot { latency, ok, refused })
            })
            .collect();
        RequestMetrics {
            latency,
            outcomes,
            slots,
        }
    }
}

fn opcode_label(op: Opcode) -> String {
    format!("{op:?}").to_lowercase()
}

impl RequestMetrics {
    /// Counts one request answered after `took` (from its whole frame read to its answer
    /// queued), `ok` when its status was OK.
    pub(crate) fn observe(&self, op: Opcode, took: Duration, ok: bool) {
        if let Some(Some(s)) = self.slots.get(op as usize) {
            s.latency.observe(took.as_secs_f64());
            if ok { &s.ok } else { &s.refused }.inc();
        }
    }
}

fn gauge(v: u64) -> ConstGauge {
    ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX))
}

/// The brick's metrics as exposition text.
pub(crate) fn render(
    capacity: u64,
    stats: &BrickStats,
    guard: &GuardStats,
    pace: &PaceStats,
    requests: &RequestMetrics,
) -> String {
    let mut r = Registry::with_prefix("rackmem_brick");
    r.register("capacity_bytes", "Size of the pool lent as segments", gauge(capacity));
    r.register("free_bytes", "Bytes of the pool in no segment", gauge(stats.free_bytes));
    r.register(
        "resident_bytes",
        "Bytes of pool memory allocated now (the pool is backed on first write)",
        gauge(stats.resident_bytes),
    );
    r.register("segments", "Live segments", gauge(stats.segments));
    r.register(
        "connections",
        "Authenticated connections open now",
        gauge(stats.connections),
    );
    r.register(
        "handshakes",
        "Connections authenticating now (held without a thread)",
        gauge(guard.handshakes_open),
    );
    r.register(
        "read_bytes",
        "Bytes served by READ",
        ConstCounter::new(stats.bytes_read),
    );
    r.register(
        "written_bytes",
        "Bytes stored by WRITE",
        ConstCounter::new(stats.bytes_written),
    );
    r.register(
        "requests",
        "Requests handled on authenticated connections",
        ConstCounter::new(stats.requests),
    );
    r.register(
        "errors",
        "Requests refused or malformed",
        ConstCounter::new(stats.errors),
    );
    r.register(
        "request_seconds",
        "Time from a request's whole frame read to its answer queued, per opcode",
        requests.latency.clone(),
    );
    r.register(
        "request_outcomes",
        "Requests answered per opcode, by outcome (ok, or error status)",
        requests.outcomes.clone(),
    );
    let refused = Family::<ReasonLabels, Counter>::default();
    for (reason, n) in [
        ("total_cap", guard.refused_total),
        ("peer_cap", guard.refused_per_peer),
        ("prefix_cap", guard.refused_per_prefix),
        ("handshake_evicted", guard.handshakes_evicted),
        ("handshake_timeout", guard.handshake_timeouts),
        ("idle_timeout", guard.idle_timeouts),
        ("send_timeout", guard.send_timeouts),
        ("bad_header", guard.refused_headers),
    ] {
        refused.get_or_create(&ReasonLabels { reason }).inc_by(n);
    }
    r.register(
        "connections_closed",
        "Connections refused or closed by the brick's limits, by reason",
        refused,
    );
    r.register(
        "auth_failures",
        "Wrong shared secrets, and grants that did not verify or were not proven",
        ConstCounter::new(guard.auth_failures),
    );
    r.register(
        "auth_delayed",
        "Authentication attempts checked only after a wait (throttled peers)",
        ConstCounter::new(guard.auth_delayed),
    );
    r.register(
        "auth_throttled",
        "Authentication attempts refused unchecked (Busy): the peer's next check was too far ahead",
        ConstCounter::new(guard.auth_throttled),
    );
    pace_families(&mut r, pace);
    rackmem_metrics::encode(&r)
}

/// What the brick's pacing did: its total rate, the requests it held back and for how long, and
/// per segment its rate and traffic.
fn pace_families(r: &mut Registry, pace: &PaceStats) {
    r.register(
        "serve_rate_bytes_per_second",
        "The total rate the brick paces its requests to (0: unpaced)",
        gauge(pace.serve_bps),
    );
    r.register(
        "paced_requests",
        "Requests that waited for a token bucket (the segment's or the brick's)",
        ConstCounter::new(pace.delayed),
    );
    r.register(
        "paced_wait_seconds",
        "Time requests spent waiting for a token bucket, summed",
        ConstCounter::new(pace.delayed_ns as f64 / 1e9),
    );
    r.register(
        "paced_waiting",
        "Requests waiting for a token bucket now",
        gauge(pace.waiting),
    );
    let per_segment = |f: fn(&crate::SegmentPaceStats) -> u64| {
        let fam = Family::<SegmentLabels, Counter>::default();
        for s in &pace.segments {
            fam.get_or_create(&SegmentLabels { segment: s.segment_id }).inc_by(f(s));
        }
        fam
    };
    let rates = Family::<SegmentLabels, prometheus_client::metrics::gauge::Gauge>::default();
    for s in &pace.segments {
        rates
            .get_or_create(&SegmentLabels { segment: s.segment_id })
            .set(i64::try_from(s.rate_bps).unwrap_or(i64::MAX));
    }
    r.register(
        "segment_rate_bytes_per_second",
        "Each paced segment's rate, as the control plane set it (0: only the brick's total)",
        rates,
    );
    r.register(
        "segment_bytes",
        "Bytes read and written per paced segment",
        per_segment(|s| s.bytes),
    );
    r.register(
        "segment_requests",
        "Requests served per paced segment",
        per_segment(|s| s.requests),
    );
    r.register(
        "segment_paced_requests",
        "Requests per segment that waited for a token bucket",
        per_segment(|s| s.delayed),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_opcode_has_its_histogram_and_outcomes() {
        let m = RequestMetrics::default();
        m.observe(Opcode::Read, Duration::from_micros(3), true);
        m.observe(Opcode::Read, Duration::from_micros(30), true);
        m.observe(Opcode::Write, Duration::from_micros(3), false);
        let pace = PaceStats {
            serve_bps: 1 << 30,
            delayed: 4,
            delayed_ns: 2_000_000_000,
            waiting: 1,
            segments: vec![crate::SegmentPaceStats {
                segment_id: 9,
                rate_bps: 1 << 29,
                bytes: 8192,
                requests: 2,
                delayed: 1,
            }],
        };
        let text = render(1 << 20, &BrickStats::default(), &GuardStats::default(), &pace, &m);
        for want in [
            "rackmem_brick_request_seconds_count{opcode=\"read\"} 2",
            "rackmem_brick_request_seconds_bucket{le=\"0.000005\",opcode=\"read\"} 1",
            "rackmem_brick_request_seconds_count{opcode=\"write\"} 1",
            "rackmem_brick_request_outcomes_total{opcode=\"read\",outcome=\"ok\"} 2",
            "rackmem_brick_request_outcomes_total{opcode=\"write\",outcome=\"error\"} 1",
            "rackmem_brick_capacity_bytes 1048576",
            "rackmem_brick_serve_rate_bytes_per_second 1073741824",
            "rackmem_brick_paced_requests_total 4",
            "rackmem_brick_paced_wait_seconds_total 2.0",
            "rackmem_brick_paced_waiting 1",
            "rackmem_brick_segment_rate_bytes_per_second{segment=\"9\"} 536870912",
            "rackmem_brick_segment_bytes_total{segment=\"9\"} 8192",
            "rackmem_brick_segment_requests_total{segment=\"9\"} 2",
            "rackmem_brick_segment_paced_requests_total{segment=\"9\"} 1",
        ] {
            assert!(text.contains(want), "{want} missing from:\n{text}");
        }
    }
}
