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
    /// First and only request of a runtime's second connection: the agent keeps it to send
    /// this process orders ([`AgentRequest::Migrate`]) and read their answers.
    Orders,
    /// Move window range `addr..addr+len` of process `pid` to `to` (`local`, or a brick's
    /// address): asked of the agent by `rackmem migrate --pid` (root or the process's owner
    /// only), forwarded by the agent on the process's order connection.
    Migrate {
        /// The process (the agent's caller names it; the runtime ignores it).
        pid: u32,
        /// First byte of the range.
        addr: u64,
        /// Its length in bytes.
        len: u64,
        /// `local`, or a brick (its name, id or address to the agent; its address to the
        /// runtime).
        to: String,
        /// The agent's number for this order, repeated in the answer (an answer to an order
        /// the agent stopped waiting for is told from the next one's).
        #[serde(default)]
        order: u64,
        /// How long the caller waits for the answer, ms (0: the agent's default).
        #[serde(default)]
        timeout_ms: u64,
    },
    /// Move every page held on segments `moves[].segment_id` (a draining brick's) to a new
    /// segment on `moves[].to`, then return their allocations: sent by the agent, on a process's
    /// order connection, when the control plane drains a brick (`rackmem ctl drain`).
    Evacuate {
        /// The segments and where each goes.
        moves: Vec<EvacuateMove>,
        /// As in [`AgentRequest::Migrate`].
        #[serde(default)]
        order: u64,
    },
    /// Copy-on-write clones of segments this connection holds, for the child of a `fork` (asked
    /// in the parent before the fork): the agent has the control plane place each as a new
    /// allocation and keeps it for the child until it adopts them ([`AgentRequest::Adopt`])
    /// or a deadline passes.
    Clone {
        /// The segments to clone, grouped by the allocation that holds them.
        sources: Vec<CloneSource>,
    },
    /// A one-sided segment for `rackmem_seg_open` / `rackmem_seg_alloc` (issue 24): with a
    /// `name`, the control plane's named segment of that name, shared by every process of the
    /// same user that opens it on any node (created with `bytes` if it does not exist; `bytes`
    /// 0: open only); without, a segment of `bytes` of its own. The answer is one segment and
    /// the allocation to `release` when done (which, for a name, closes this process's hold:
    /// the last close frees it). Everything a connection opened is closed when it closes.
    Segment {
        /// The segment's name (1 to 128 of `A-Z a-z 0-9 - _ . :`), or none for a segment of
        /// its own.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// Bytes to create it with.
        bytes: u64,
    },
    /// The forked child takes the clones its parent asked for: they are this connection's from
    /// now on (returned when it closes). `ticket` is the one the `clone` answer carried.
    Adopt {
        /// The clones' allocation ids.
        allocations: Vec<u64>,
        /// The clone answer's ticket (hex).
        ticket: String,
    },
}

/// Segments of one allocation to clone ([`AgentRequest::Clone`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloneSource {
    /// The allocation, which the asking connection holds.
    pub allocation: u64,
    /// Its segments to clone, in the order of the clone's segments.
    pub segments: Vec<u64>,
}

/// One clone of an [`AgentRequest::Clone`] answer: a new allocation whose segments are clones
/// of the source's, in the order asked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentClone {
    /// The clone's allocation id.
    pub allocation: u64,
    /// Its segments.
    pub segments: Vec<AgentSegment>,
}

/// One segment of an [`AgentRequest::Evacuate`] order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvacuateMove {
    /// The control plane's id of the segment to empty.
    pub segment_id: u64,
    /// The address of the brick its pages go to (the control plane picked it).
    pub to: String,
}

impl AgentRequest {
    /// The `op` of every request, as the wire names it.
    pub const OPS: [&'static str; 11] = [
        "hello", "grow", "release", "rates", "report", "orders", "migrate", "evacuate", "clone", "adopt", "segment",
    ];
}

/// One segment of an allocation, as the agent hands it to a process (the control plane's
/// allocation segment, the fields a process uses).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentSegment {
    /// The brick's id.
    #[serde(default)]
    pub brick_id: u64,
    /// Brick address (`tcp://H:P`, `tls://H:P` or `unix:PATH`).
    pub brick_address: String,
    /// Segment id.
    pub segment_id: u64,
    /// Offset in the brick's pool.
    #[serde(default)]
    pub offset: u64,
    /// Size in bytes.
    pub size_bytes: u64,
    /// `Grant::encode`, hex.
    pub grant_hex: String,
    /// Session key, hex.
    pub session_key_hex: String,
    /// Rate limit in bytes per second (0: none).
    #[serde(default)]
    pub rate_limit_bps: u64,
    /// When the grant expires (Unix seconds; 0: never).
    #[serde(default)]
    pub grant_expires_unix_s: u64,
}

/// A segment's current rate limit, in a [`AgentReply`] to `rates`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRate {
    /// Segment id.
    pub segment_id: u64,
    /// Bytes per second (0: none).
    pub rate_limit_bps: u64,
}

/// Why the agent refused a request: a code a program can act on, and a message for people.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRefusal {
    /// Error code (the control plane's, when it refused).
    pub code: String,
    /// What happened.
    pub message: String,
}

/// The agent's answer to one [`AgentRequest`], one JSON object per line: `ok`, and what the
/// request asked for (`hello`: `node`; `grow`: `allocation` and `segments`; `rates`: `rates`),
/// or `ok: false` with `error`. One definition for the agent that writes it and the runtime
/// that reads it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentReply {
    /// True if the request was carried out.
    pub ok: bool,
    /// Why not, when `ok` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<AgentRefusal>,
    /// `hello`: the node's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u64>,
    /// `grow`: the allocation's id (to release it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<u64>,
    /// `grow`: its segments, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments: Option<Vec<AgentSegment>>,
    /// `rates`: the rate of each segment the process holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rates: Option<Vec<AgentRate>>,
    /// `migrate`: the order's number (see [`AgentRequest::Migrate`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<u64>,
    /// `migrate`: the four step times of the move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<AgentMigration>,
    /// `evacuate`: the segments emptied and returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evacuated: Option<Vec<u64>>,
    /// `clone`: the clones, in the order of the sources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clones: Option<Vec<AgentClone>>,
    /// `clone`: what the child presents to adopt them (hex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticket: Option<String>,
}

/// The four step times of a migration (seed 001's Setup, Allocate, Transfer, Finalize), in the
/// answer to `migrate`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentMigration {
    /// Setup, ns.
    pub setup_ns: u64,
    /// Allocate, ns.
    pub allocate_ns: u64,
    /// Transfer, ns.
    pub transfer_ns: u64,
    /// Finalize, ns.
    pub finalize_ns: u64,
    /// Bytes carried.
    pub bytes: u64,
}

impl AgentReply {
    /// Done, nothing to return (`release`, `report`).
    pub fn done() -> AgentReply {
        AgentReply {
            ok: true,
            ..AgentReply::default()
        }
    }

    /// The answer to `hello`.
    pub fn hello(node: u64) -> AgentReply {
        AgentReply {
            node: Some(node),
            ..AgentReply::done()
        }
    }

    /// The answer to `grow`.
    pub fn grown(allocation: u64, segments: Vec<AgentSegment>) -> AgentReply {
        AgentReply {
            allocation: Some(allocation),
            segments: Some(segments),
            ..AgentReply::done()
        }
    }

    /// The answer to `clone`.
    pub fn cloned(clones: Vec<AgentClone>, ticket: String) -> AgentReply {
        AgentReply {
            clones: Some(clones),
            ticket: Some(ticket),
            ..AgentReply::done()
        }
    }

    /// The answer to `rates`.
    pub fn rates(rates: Vec<AgentRate>) -> AgentReply {
        AgentReply {
            rates: Some(rates),
            ..AgentReply::done()
        }
    }

    /// The answer to `migrate`.
    pub fn migrated(order: u64, migration: AgentMigration) -> AgentReply {
        AgentReply {
            order: Some(order),
            migration: Some(migration),
            ..AgentReply::done()
        }
    }

    /// A refusal.
    pub fn refused(code: impl Into<String>, message: impl Into<String>) -> AgentReply {
        AgentReply {
            ok: false,
            error: Some(AgentRefusal {
                code: code.into(),
                message: message.into(),
            }),
            ..AgentReply::default()
        }
    }
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
    /// The bricks' level of C-AMAT, brick by brick (at most [`MAX_REPORTED_BRICKS`]): what each
    /// brick served the program so far. Absent from older runtimes' reports.
    #[serde(default)]
    pub bricks: Vec<BrickLevelReport>,
}

/// Bricks a [`ProcessReport`] tells apart (the runtime counts faults served by more bricks than
/// this under the last one's entry).
pub const MAX_REPORTED_BRICKS: usize = 32;

/// Longest brick address a [`BrickLevelReport`] carries.
pub const MAX_BRICK_NAME_LEN: usize = 512;

/// One brick's level of C-AMAT in a [`ProcessReport`] (seed 002, section 2.2, hits invisible):
/// plain counts, from which a receiver derives the figures (as `rackmem_model::LevelCounts`
/// does), so no float crosses the wire. Each fault whose page the brick served is one
/// access, from the start of its read to the page's data being here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BrickLevelReport {
    /// The brick's address.
    pub brick: String,
    /// Accesses served.
    pub faults: u64,
    /// Of those, the ones no other access (to any brick) overlapped.
    pub pure_misses: u64,
    /// The pure misses' time, summed, nanoseconds.
    pub pure_miss_ns: u64,
    /// Time at least one access to this brick was outstanding, nanoseconds.
    pub busy_ns: u64,
    /// Outstanding accesses integrated over time, access-nanoseconds.
    pub accum_ns: u64,
    /// Most accesses to this brick outstanding at once.
    pub max_outstanding: u32,
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
        if self.bricks.len() > MAX_REPORTED_BRICKS {
            return Err(format!("more than {MAX_REPORTED_BRICKS} bricks"));
        }
        for b in &self.bricks {
            if b.brick.len() > MAX_BRICK_NAME_LEN {
                return Err(format!("a brick address longer than {MAX_BRICK_NAME_LEN} bytes"));
            }
            if b.pure_misses > b.faults {
                return Err(format!("brick {}: more pure misses than faults", b.brick));
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
            bricks: vec![BrickLevelReport {
                brick: "unix:/run/b0.sock".into(),
                faults: 4,
                pure_misses: 2,
                pure_miss_ns: 40_000,
                busy_ns: 60_000,
                accum_ns: 90_000,
                max_outstanding: 2,
            }],
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
    fn replies_have_the_wire_shapes_the_agent_documents() {
        assert_eq!(
            serde_json::to_value(AgentReply::done()).unwrap(),
            serde_json::json!({"ok": true})
        );
        assert_eq!(
            serde_json::to_value(AgentReply::hello(3)).unwrap(),
            serde_json::json!({"ok": true, "node": 3})
        );
        let r = AgentReply::rates(vec![AgentRate {
            segment_id: 9,
            rate_limit_bps: 100,
        }]);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::json!({"ok": true, "rates": [{"segment_id": 9, "rate_limit_bps": 100}]})
        );
        assert_eq!(
            serde_json::to_value(AgentReply::refused("not_found", "no")).unwrap(),
            serde_json::json!({"ok": false, "error": {"code": "not_found", "message": "no"}})
        );
        let g = AgentReply::grown(
            5,
            vec![AgentSegment {
                brick_address: "unix:/b".into(),
                segment_id: 2,
                size_bytes: 4096,
                ..AgentSegment::default()
            }],
        );
        let back: AgentReply = serde_json::from_str(&serde_json::to_string(&g).unwrap()).unwrap();
        assert_eq!(back, g);
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
        let mut r = report();
        r.bricks = vec![BrickLevelReport::default(); MAX_REPORTED_BRICKS + 1];
        assert!(r.validate().is_err());
        let mut r = report();
        r.bricks[0].brick = "b".repeat(MAX_BRICK_NAME_LEN + 1);
        assert!(r.validate().is_err());
        let mut r = report();
        r.bricks[0].pure_misses = r.bricks[0].faults + 1;
        assert!(r.validate().is_err());
    }

    #[test]
    fn a_report_of_an_older_runtime_has_no_bricks() {
        let mut v = serde_json::to_value(report()).unwrap();
        v.as_object_mut().unwrap().remove("bricks");
        assert!(serde_json::from_value::<ProcessReport>(v).unwrap().bricks.is_empty());
    }
}
