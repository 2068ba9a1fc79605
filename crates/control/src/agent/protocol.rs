//! The JSON-lines protocol between the agent and its processes (`docs/control-plane.md`, "The
//! agent and its processes"): reading one request line within the request timeout, parsing it,
//! and writing one reply line, refusals included.

use crate::client::ClientError;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Longest request line a process may send.
pub const MAX_LINE: usize = 64 << 10;

/// How long a reply may take to be written before the connection is dropped (a process that
/// does not read its replies must not hold a thread forever).
pub(super) const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A request of a process (one definition, shared with the runtime that sends it).
pub(super) use rackmem_proto::AgentRequest as Request;

/// The operations of the protocol.
const OPS: [&str; 11] = Request::OPS;

/// A reply (one definition, shared with the runtime that reads it).
pub(super) use rackmem_proto::AgentReply as Reply;

/// A refusal reply with its error code and message.
pub(super) fn refusal(code: &str, message: impl Into<String>) -> Reply {
    Reply::refused(code, message)
}

/// The refusal that passes on why the control plane failed or refused.
pub(super) fn client_refusal(e: &ClientError) -> Reply {
    match e {
        ClientError::Server { code, message, .. } => refusal(code, message.clone()),
        ClientError::Unreachable { .. } => refusal("control_plane_unreachable", e.to_string()),
        other => refusal("control_plane_error", other.to_string()),
    }
}

/// What reading one request line gave.
pub(super) enum Line {
    /// A whole line (without its newline).
    Got,
    /// The peer closed (or the connection broke).
    Closed,
    /// Longer than [`MAX_LINE`].
    TooLong,
    /// Begun but not finished within the request timeout.
    TimedOut,
}

/// Reads one request line into `buf`: waits as long as it takes for its first byte (a process
/// may stay quiet for its whole life), then at most `timeout` for the whole rest of the line,
/// however it trickles in (each wait gets only what is left of the deadline, and the deadline
/// is checked after every piece: a byte a second cannot keep the connection open).
pub(super) fn read_request(reader: &mut BufReader<UnixStream>, buf: &mut Vec<u8>, timeout: Duration) -> Line {
    buf.clear();
    if reader.get_ref().set_read_timeout(None).is_err() {
        return Line::Closed;
    }
    loop {
        match reader.fill_buf() {
            Ok([]) => return Line::Closed,
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Line::Closed,
        }
    }
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Line::TimedOut;
        }
        // Each wait gets only what is left of the line's deadline.
        if reader.buffer().is_empty() && reader.get_ref().set_read_timeout(Some(left)).is_err() {
            return Line::Closed;
        }
        let piece = match reader.fill_buf() {
            // End of stream in the middle of a line: nobody is left to answer.
            Ok([]) => return Line::Closed,
            Ok(b) => b,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(_) => return Line::Closed,
        };
        let (take, whole) = match piece.iter().position(|b| *b == b'\n') {
            Some(i) => (i, true),
            None => (piece.len(), false),
        };
        // Never more than one byte past the limit is kept.
        let room = (MAX_LINE + 1).saturating_sub(buf.len());
        buf.extend_from_slice(&piece[..take.min(room)]);
        reader.consume(if whole { take + 1 } else { take });
        if buf.len() > MAX_LINE {
            return Line::TooLong;
        }
        if whole {
            return Line::Got;
        }
    }
}

/// Parses one request line, or says why it is not one.
pub(super) fn parse_request(line: &[u8]) -> Result<Request, Box<Reply>> {
    let v: serde_json::Value = serde_json::from_slice(line)
        .map_err(|e| Box::new(refusal("bad_request", format!("not a JSON object on one line: {e}"))))?;
    let op = match v.get("op") {
        Some(serde_json::Value::String(op)) => op.clone(),
        Some(_) | None => {
            return Err(Box::new(refusal(
                "bad_request",
                format!("a request is a JSON object with \"op\": one of {}", OPS.join(", ")),
            )))
        }
    };
    if !OPS.contains(&op.as_str()) {
        return Err(Box::new(refusal(
            "unknown_op",
            format!("unknown op {op:?}: this agent knows {}", OPS.join(", ")),
        )));
    }
    serde_json::from_value(v).map_err(|e| Box::new(refusal("bad_request", format!("{op}: {e}"))))
}

/// Writes one reply line.
pub(super) fn reply(out: &mut UnixStream, v: &Reply) -> std::io::Result<()> {
    let mut s = serde_json::to_string(v).map_err(std::io::Error::other)?;
    s.push('\n');
    out.write_all(s.as_bytes())
}
