//! The runtime's side of the node agent's protocol (JSON lines on a Unix socket; see the
//! control-plane document): hello, grow, release, rates, report.
//!
//! The connection stays open for the life of the process: the agent returns every allocation
//! of a connection that closes, so memory comes back even when the program is killed.

use rackmem_proto::{AgentRefusal, AgentReply, AgentRequest, Grant, KEY_LEN};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::time::Duration;

/// Errors talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The socket could not be reached or broke.
    #[error("node agent at {path}: {cause}")]
    Unreachable {
        /// Socket path.
        path: String,
        /// What failed.
        cause: String,
    },
    /// The agent (or the control plane behind it) refused.
    #[error("node agent refused {op}: {code}: {message}")]
    Refused {
        /// The request.
        op: &'static str,
        /// Error code (the control plane's, when it refused).
        code: String,
        /// Message.
        message: String,
    },
    /// The agent answered something this runtime does not understand.
    #[error("node agent sent a malformed answer to {op}: {why}")]
    Malformed {
        /// The request.
        op: &'static str,
        /// What was wrong.
        why: String,
    },
}

pub use rackmem_proto::{AgentRate, AgentSegment};

/// The decoded grant and session key of a segment the agent handed over, checked against it.
pub fn credentials(s: &AgentSegment) -> Result<(Grant, [u8; KEY_LEN]), String> {
    let g = hex::decode(&s.grant_hex).map_err(|e| format!("grant is not hex: {e}"))?;
    let grant = Grant::decode(&g).map_err(|e| format!("grant does not decode: {e}"))?;
    let k = hex::decode(&s.session_key_hex).map_err(|e| format!("session key is not hex: {e}"))?;
    let key: [u8; KEY_LEN] = k
        .try_into()
        .map_err(|_| format!("session key is not {KEY_LEN} bytes"))?;
    if grant.segment_id != s.segment_id || grant.size_bytes != s.size_bytes {
        return Err("grant does not match the segment it came with".into());
    }
    Ok((grant, key))
}

/// Opens the order connection: a second connection whose first line is `orders`; afterwards
/// only the agent speaks first on it (orders), and the runtime answers.
fn open_orders(path: &str, timeout: Duration) -> std::io::Result<UnixStream> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut line = serde_json::to_string(&AgentRequest::Orders).map_err(std::io::Error::other)?;
    line.push('\n');
    rackmem_sys::NoSignal(s.as_fd()).write_all(line.as_bytes())?;
    let mut answer = String::new();
    BufReader::new(std::io::Read::take(&mut s, 64 << 10)).read_line(&mut answer)?;
    let r: AgentReply = serde_json::from_str(&answer).map_err(std::io::Error::other)?;
    if !r.ok {
        return Err(std::io::Error::other("the agent takes no order connection"));
    }
    // Orders come when someone asks: wait for them as long as the process lives.
    s.set_read_timeout(None)?;
    Ok(s)
}

/// A granted allocation.
#[derive(Debug, Clone)]
pub struct AgentAllocation {
    /// Allocation id (to release it).
    pub allocation: u64,
    /// Its segments, in order.
    pub segments: Vec<AgentSegment>,
}

/// A connection to the node agent.
pub struct Agent {
    path: String,
    conn: Mutex<(UnixStream, BufReader<UnixStream>)>,
    node: u64,
    /// The order connection (`rackmem migrate --pid`), when the agent keeps one.
    orders: Option<UnixStream>,
}

impl Agent {
    /// Connects and says hello, and opens the order connection.
    pub fn connect(path: &str, timeout: Duration) -> Result<Agent, AgentError> {
        Agent::connect_with(path, timeout, true)
    }

    /// Connects and says hello, without the order connection: a second connection of a
    /// process whose runtime has its own (one-sided segments), which must not take the
    /// runtime's orders.
    pub fn connect_without_orders(path: &str, timeout: Duration) -> Result<Agent, AgentError> {
        Agent::connect_with(path, timeout, false)
    }

    fn connect_with(path: &str, timeout: Duration, orders: bool) -> Result<Agent, AgentError> {
        let unreachable = |cause: String| AgentError::Unreachable {
            path: path.to_string(),
            cause,
        };
        let s = UnixStream::connect(path).map_err(|e| unreachable(e.to_string()))?;
        s.set_read_timeout(Some(timeout))
            .map_err(|e| unreachable(e.to_string()))?;
        s.set_write_timeout(Some(timeout))
            .map_err(|e| unreachable(e.to_string()))?;
        let r = s.try_clone().map_err(|e| unreachable(e.to_string()))?;
        let mut a = Agent {
            path: path.to_string(),
            conn: Mutex::new((s, BufReader::new(r))),
            node: 0,
            orders: None,
        };
        let program = std::env::args().next().unwrap_or_default();
        let r = a.call(
            "hello",
            AgentRequest::Hello {
                pid: std::process::id(),
                program,
            },
        )?;
        a.node = r.node.ok_or(AgentError::Malformed {
            op: "hello",
            why: "no node id".into(),
        })?;
        // An agent too old to take orders refuses `orders`: the program runs all the same, and
        // `rackmem migrate --pid` says the process takes no orders.
        if orders {
            a.orders = open_orders(path, timeout).ok();
        }
        Ok(a)
    }

    /// The order connection, for the thread that serves it.
    pub(crate) fn orders(&self) -> Option<UnixStream> {
        self.orders.as_ref().and_then(|s| s.try_clone().ok())
    }

    /// The sockets' file descriptors (a forked child closes them).
    pub fn raw_fds(&self) -> Vec<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        let mut v = vec![self.raw_fd()];
        v.extend(self.orders.as_ref().map(|s| s.as_raw_fd()));
        v
    }

    /// The node id the agent registered.
    pub fn node(&self) -> u64 {
        self.node
    }

    /// The socket's file descriptor (a forked child closes it).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.conn.lock().unwrap_or_else(|e| e.into_inner()).0.as_raw_fd()
    }

    fn call(&self, op: &'static str, req: AgentRequest) -> Result<AgentReply, AgentError> {
        let broken = |cause: String| AgentError::Unreachable {
            path: self.path.clone(),
            cause,
        };
        let mut line = serde_json::to_string(&req).map_err(|e| broken(e.to_string()))?;
        line.push('\n');
        let mut c = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        rackmem_sys::NoSignal(c.0.as_fd())
            .write_all(line.as_bytes())
            .map_err(|e| broken(format!("sending {op}: {e}")))?;
        let mut answer = String::new();
        match c.1.read_line(&mut answer) {
            Ok(0) => return Err(broken(format!("the agent closed the connection during {op}"))),
            Ok(_) => {}
            Err(e) => return Err(broken(format!("waiting for the answer to {op}: {e}"))),
        }
        drop(c);
        let r: AgentReply =
            serde_json::from_str(&answer).map_err(|e| AgentError::Malformed { op, why: e.to_string() })?;
        if !r.ok {
            let e = r.error.unwrap_or(AgentRefusal {
                code: "unknown".into(),
                message: "no error given".into(),
            });
            return Err(AgentError::Refused {
                op,
                code: e.code,
                message: e.message,
            });
        }
        Ok(r)
    }

    /// Asks for an allocation of at least `bytes`.
    pub fn grow(&self, bytes: u64) -> Result<AgentAllocation, AgentError> {
        self.grow_on(bytes, None)
    }

    /// Asks for an allocation of at least `bytes`, on `brick` (its address) when given, in one
    /// segment there.
    pub fn grow_on(&self, bytes: u64, brick: Option<&str>) -> Result<AgentAllocation, AgentError> {
        let brick = brick.map(str::to_string);
        let r = self.call("grow", AgentRequest::Grow { bytes, brick })?;
        match (r.allocation, r.segments) {
            (Some(allocation), Some(segments)) => Ok(AgentAllocation { allocation, segments }),
            _ => Err(AgentError::Malformed {
                op: "grow",
                why: "no allocation and segments in the answer".into(),
            }),
        }
    }

    /// Asks for a one-sided segment (`rackmem_seg_open` / `rackmem_seg_alloc`): the named
    /// segment `name` (created with `bytes` if it does not exist; `bytes` 0: open only), or,
    /// without a name, one of `bytes` of its own; one segment. `release` its allocation when
    /// done.
    pub fn segment(&self, name: Option<&str>, bytes: u64) -> Result<AgentAllocation, AgentError> {
        let name = name.map(str::to_string);
        let r = self.call("segment", AgentRequest::Segment { name, bytes })?;
        match (r.allocation, r.segments) {
            (Some(allocation), Some(segments)) if segments.len() == 1 => Ok(AgentAllocation { allocation, segments }),
            _ => Err(AgentError::Malformed {
                op: "segment",
                why: "not one allocation with one segment in the answer".into(),
            }),
        }
    }

    /// Asks for copy-on-write clones of `sources` (allocations this connection holds, with the
    /// segments to clone) for the child of the `fork` about to happen; returns the clones, in the
    /// order of the sources, and the ticket the child adopts them with.
    pub fn clone_for_child(
        &self,
        sources: Vec<rackmem_proto::CloneSource>,
    ) -> Result<(Vec<rackmem_proto::AgentClone>, String), AgentError> {
        let r = self.call("clone", AgentRequest::Clone { sources })?;
        match (r.clones, r.ticket) {
            (Some(c), Some(t)) => Ok((c, t)),
            _ => Err(AgentError::Malformed {
                op: "clone",
                why: "no clones and ticket in the answer".into(),
            }),
        }
    }

    /// Takes, in a forked child, the clones its parent asked for (see
    /// [`Agent::clone_for_child`]): this connection holds them from now on.
    pub fn adopt(&self, allocations: Vec<u64>, ticket: String) -> Result<(), AgentError> {
        self.call("adopt", AgentRequest::Adopt { allocations, ticket })
            .map(|_| ())
    }

    /// The agent's socket.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Returns an allocation.
    pub fn release(&self, allocation: u64) -> Result<(), AgentError> {
        self.call("release", AgentRequest::Release { allocation }).map(|_| ())
    }

    /// Reports the process's figures now (the agent keeps the latest for its metrics and the
    /// control plane).
    pub fn report(&self, report: rackmem_proto::ProcessReport) -> Result<(), AgentError> {
        self.call("report", AgentRequest::Report(Box::new(report))).map(|_| ())
    }

    /// The current rate limits of this node's segments.
    pub fn rates(&self) -> Result<Vec<AgentRate>, AgentError> {
        Ok(self.call("rates", AgentRequest::Rates)?.rates.unwrap_or_default())
    }
}
