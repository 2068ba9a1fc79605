//! The node agent's protocol as the runtime speaks it ([`AgentRequest`], one JSON object per
//! line; `docs/control-plane.md`, "The agent and its processes"), and what a running program's
//! runtime reports in it while it runs ([`ProcessReport`]), which the agent passes on to the
//! control plane: the figures a dashboard or `rackmem top` shows per process.
//!
//! One definition for the parties, so that a field renamed on one side cannot silently read as
//! zero on another: the runtime serialises these, the agent and the control plane deserialise
//! them.

use serde::{Deserialize, Serialize};

/// Upper bounds, in nanoseconds, of [`LatencyHistogram`]'s buckets: 1 µs to 100 ms, about a
/// factor 2.5 apart (a shared-memory fault takes ~10 µs, a TCP one ~30–300 µs, a stalled one
/// milliseconds).
pub const FAULT_LATENCY_BOUNDS_NS: [u64; 14] = [
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    100_000_000,
];

/// Longest program name a report carries (longer ones are cut on a character boundary).
pub const MAX_PROGRAM_LEN: usize = 256;

/// A request of a process to its node agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum AgentRequest {
    /// First on every connection: who is asking (the agent trusts the kernel's pid, not this).
    Hello {
        /// The process's own idea of its pid (logged only).
        #[serde(default)]
        pid: u32,
        /// The program (argv\[0\]).
        #[serde(default)]
        program: String,
    },
    /// An allocation of at least `bytes`.
    Grow {
        /// Bytes asked for.
        bytes: u64,
        /// Only on this brick (its address), in one segment: a migration's target. Unset: where
        /// the control plane picks.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        brick: Option<String>,
    },
    /// Return an allocation this connection holds.
    Release {
        /// Its id.
        allocation: u64,
    },
    /// The current rate limit of each segment this connection holds.
    Rates,
    /// The process's figures now, about once a second.
    Report(Box<ProcessReport>),
}

impl AgentRequest {
    /// The `op` of every request, as the wire names it.
    pub const OPS: [&'static str; 5] = ["hello", "grow", "release", "rates", "report"];
}

/// A histogram of fault service times: cumulative counts at [`FAULT_LATENCY_BOUNDS_NS`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LatencyHistogram {
    /// Faults served within each bound of [`FAULT_LATENCY_BOUNDS_NS`] (cumulative, same length).
    pub cumulative: Vec<u64>,
    /// Faults served in all.
    pub count: u64,
    /// Their total service time, ns.
    pub sum_ns: u64,
}

impl LatencyHistogram {
    /// True if the counts have the shape the bounds give them (one per bound, never decreasing,
    /// none above the total): what a receiver checks before it trusts a report.
    pub fn is_well_formed(&self) -> bool {
        self.cumulative.len() == FAULT_LATENCY_BOUNDS_NS.len()
            && self.cumulative.windows(2).all(|w| w[0] <= w[1])
            && self.cumulative.last().is_none_or(|l| *l <= self.count)
    }
}

/// One process's figures, as of `uptime_ms` after its runtime started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProcessReport {
    /// Process id (the agent checks it against the connection's peer).
    pub pid: u32,
    /// The program (argv\[0\]), at most [`MAX_PROGRAM_LEN`] bytes.
    pub program: String,
    /// Milliseconds since the runtime started.
    pub uptime_ms: u64,
    /// Faults served (misses of the local buffer).
    pub faults: u64,
    /// Faults whose page came from a brick (the rest were zero-filled or found resident).
    pub faults_remote: u64,
    /// Bytes fetched from bricks for faults.
    pub bytes_fetched: u64,
    /// Bytes fetched ahead of faults (read-ahead).
    pub bytes_prefetched: u64,
    /// Bytes written back to bricks.
    pub bytes_written_back: u64,
    /// Pages evicted from the local buffer.
    pub evictions: u64,
    /// Pages in the local buffer now, in bytes.
    pub resident_bytes: u64,
    /// The local buffer's budget now, in bytes.
    pub budget_bytes: u64,
    /// Window bytes the program holds now.
    pub window_bytes: u64,
    /// The largest window footprint so far, in bytes.
    pub peak_footprint_bytes: u64,
    /// Faults outstanding at once, time-weighted over the time any was (miss concurrency).
    pub miss_concurrency: f64,
    /// Most faults outstanding at once.
    pub faults_in_flight_max: u32,
    /// Share of pages read ahead that the program used, where sampled.
    pub readahead_accuracy: Option<f64>,
    /// Fault service times.
    pub fault_latency: LatencyHistogram,
}

impl ProcessReport {
    /// Checks what a receiver must before it stores a report: a program name within bounds,
    /// finite figures, a histogram of the right shape.
    pub fn validate(&self) -> Result<(), String> {
        if self.program.len() > MAX_PROGRAM_LEN {
            return Err(format!("program name longer than {MAX_PROGRAM_LEN} bytes"));
        }
        if !self.miss_concurrency.is_finite() || self.miss_concurrency < 0.0 {
            return Err("miss_concurrency must be a finite number, 0 or more".into());
        }
        if let Some(a) = self.readahead_accuracy {
            if !(0.0..=1.0).contains(&a) {
                return Err("readahead_accuracy must lie in 0..=1".into());
            }
        }
        if !self.fault_latency.is_well_formed() {
            return Err(format!(
                "fault_latency must hold {} cumulative counts, never decreasing, none above its count",
                FAULT_LATENCY_BOUNDS_NS.len()
            ));
        }
        Ok(())
    }

    /// Mean fault service time, ns (0 before the first fault).
    pub fn fault_mean_ns(&self) -> u64 {
        self.fault_latency
            .sum_ns
            .checked_div(self.fault_latency.count)
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> ProcessReport {
        ProcessReport {
            pid: 7,
            program: "stream".into(),
            fault_latency: LatencyHistogram {
                cumulative: vec![0, 1, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3],
                count: 3,
                sum_ns: 9_000,
            },
            miss_concurrency: 1.5,
            ..ProcessReport::default()
        }
    }

    #[test]
    fn requests_have_the_wire_names_the_agent_documents() {
        let grow = serde_json::to_value(AgentRequest::Grow { bytes: 7, brick: None }).unwrap();
        assert_eq!(grow, serde_json::json!({"op": "grow", "bytes": 7}));
        let rates = serde_json::to_value(AgentRequest::Rates).unwrap();
        assert_eq!(rates, serde_json::json!({"op": "rates"}));
        let r = AgentRequest::Report(Box::new(report()));
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["op"], "report");
        assert_eq!(v["program"], "stream");
        assert_eq!(serde_json::from_value::<AgentRequest>(v).unwrap(), r);
        for op in AgentRequest::OPS {
            assert!(serde_json::to_string(&AgentRequest::OPS).unwrap().contains(op));
        }
        assert!(serde_json::from_str::<AgentRequest>(r#"{"op":"grow","bytes":1,"x":2}"#).is_err());
    }

    #[test]
    fn a_report_survives_json_and_checks() {
        let r = report();
        let back: ProcessReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert_eq!(r.validate(), Ok(()));
        assert_eq!(r.fault_mean_ns(), 3_000);
    }

    #[test]
    fn malformed_reports_are_refused() {
        let mut r = report();
        r.fault_latency.cumulative.pop();
        assert!(r.validate().is_err());
        let mut r = report();
        r.fault_latency.cumulative[3] = 1;
        assert!(r.validate().is_err());
        let mut r = report();
        r.fault_latency.count = 2;
        assert!(r.validate().is_err());
        let mut r = report();
        r.miss_concurrency = f64::NAN;
        assert!(r.validate().is_err());
        let mut r = report();
        r.program = "x".repeat(MAX_PROGRAM_LEN + 1);
        assert!(r.validate().is_err());
        let mut r = report();
        r.readahead_accuracy = Some(1.5);
        assert!(r.validate().is_err());
    }
}
