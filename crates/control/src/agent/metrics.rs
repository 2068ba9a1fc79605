//! The agent's metrics: its counters in the Prometheus text format, and a minimal `GET
//! /metrics` responder to serve them.

use super::{pending_releases, Agent};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

impl Agent {
    /// The agent's counters in the Prometheus text format.
    pub fn metrics_text(&self) -> String {
        let c = &self.shared.counters;
        let pending = pending_releases(self);
        let g = |v: &AtomicU64| v.load(Ordering::Relaxed);
        format!(
            "# HELP rackmem_agent_processes Processes connected to the agent.\n\
             # TYPE rackmem_agent_processes gauge\n\
             rackmem_agent_processes {}\n\
             # HELP rackmem_agent_allocations Allocations handed to processes and not returned.\n\
             # TYPE rackmem_agent_allocations gauge\n\
             rackmem_agent_allocations {}\n\
             # HELP rackmem_agent_allocated_bytes Bytes in those allocations.\n\
             # TYPE rackmem_agent_allocated_bytes gauge\n\
             rackmem_agent_allocated_bytes {}\n\
             # HELP rackmem_agent_refusals_total Requests refused by the agent or the control plane.\n\
             # TYPE rackmem_agent_refusals_total counter\n\
             rackmem_agent_refusals_total {}\n\
             # HELP rackmem_agent_pending_releases Releases the control plane has not taken yet.\n\
             # TYPE rackmem_agent_pending_releases gauge\n\
             rackmem_agent_pending_releases {pending}\n\
             # HELP rackmem_agent_node Node id of this agent.\n\
             # TYPE rackmem_agent_node gauge\n\
             rackmem_agent_node {}\n\
             # HELP rackmem_agent_connections_refused_total Connections turned away (peer not admitted, or over --max-connections).\n\
             # TYPE rackmem_agent_connections_refused_total counter\n\
             rackmem_agent_connections_refused_total {}\n\
             # HELP rackmem_agent_reclaimed_total Allocations nobody held, released by reconciliation.\n\
             # TYPE rackmem_agent_reclaimed_total counter\n\
             rackmem_agent_reclaimed_total {}\n\
             # HELP rackmem_agent_renewed_total Grant renewals of allocations processes hold.\n\
             # TYPE rackmem_agent_renewed_total counter\n\
             rackmem_agent_renewed_total {}\n",
            g(&c.processes),
            g(&c.allocations),
            g(&c.bytes),
            g(&c.refusals),
            self.node(),
            g(&c.connections_refused),
            g(&c.reclaimed),
            g(&c.renewed),
        )
    }
}

/// Serves `GET /metrics` (Prometheus text) on `addr` from a thread of its own: a plain HTTP/1.1
/// responder, enough for a scraper, so the agent needs no web framework.
pub fn serve_metrics(
    addr: std::net::SocketAddr,
    text: impl Fn() -> String + Send + 'static,
) -> std::io::Result<std::net::SocketAddr> {
    let l = std::net::TcpListener::bind(addr)?;
    let bound = l.local_addr()?;
    std::thread::Builder::new().name("agent-metrics".into()).spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
            let mut req = [0u8; 2048];
            let n = conn.read(&mut req).unwrap_or(0);
            let head = String::from_utf8_lossy(&req[..n]);
            let (status, body) = if head.starts_with("GET /metrics ") {
                ("200 OK", text())
            } else {
                ("404 Not Found", "only GET /metrics is served here\n".to_string())
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    })?;
    Ok(bound)
}
