//! A link model: what a fault and a stream cost over a given network, from how rackmem's frames
//! are cut into packets.
//!
//! Seed 000 (section V, Table I) predicts a link's effective throughput by counting how a memory
//! transaction is cut into *databeats*, and shows that sending the pieces of many transactions
//! pipelined uses the link better than sending each transaction back to back. The same
//! reasoning holds one level up for rackmem: a fault is a READ request frame (a 32-byte header
//! and an extent list) answered by a response frame (a header and the pages); each frame is cut
//! into packets of at most `packet_payload` bytes, each adding `packet_overhead` bytes on the
//! wire (headers, checksums, preamble and gap); one fault at a time pays the round trip on
//! every request, many in flight (tags, read-ahead, several faulting threads) overlap it.
//!
//! Time for one request of `p` pages, one at a time:
//!
//! ```text
//! round trip = 2 × latency + wire(request) / bandwidth + wire(response) / bandwidth
//!              + software per request + p × software per page
//! fault      = userfaultfd's own cost (trap, event, wake) + round trip
//! ```
//!
//! and `depth` requests in flight stream at `p × 4096 / max(round trip / depth, the busiest
//! direction's wire time / lanes, the software time of one request)`. The software figures
//! come from `rackmem bench latency` on the machine (the floors it measures), so a prediction
//! for another network is "this machine's software over that wire".

use crate::ModelError;
use rackmem_proto::{HEADER_LEN, PAGE_SIZE};

/// Bytes of one extent in an extent list, and of the list's count (docs/protocol.md).
const EXTENT_BYTES: u64 = 12;
const EXTENT_COUNT_BYTES: u64 = 4;

/// A network between a node and a brick.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Link {
    /// A name for tables (`25gbe`, or the specification given).
    pub name: String,
    /// One-way latency (propagation, switching, NIC), seconds.
    pub latency_s: f64,
    /// Line rate of one lane, bytes per second.
    pub bandwidth_bytes_per_s: f64,
    /// Lanes (links) used at once, as seed 000's cBlock aggregates its links.
    pub lanes: u32,
    /// Largest payload one packet carries, bytes.
    pub packet_payload: u32,
    /// Bytes each packet adds on the wire.
    pub packet_overhead: u32,
}

/// What the node and the brick spend in software, per fault, per request and per page.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Software {
    /// userfaultfd's own cost of a fault: the trap, the event read and the wake, seconds.
    pub fault_s: f64,
    /// Node and brick per request (framing, system calls, lookups, the handler's bookkeeping).
    pub request_s: f64,
    /// Node and brick per 4 KiB page (copies, checksum, install).
    pub page_s: f64,
}

/// The direction of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Op {
    /// Pages from the brick (a fault, a read-ahead).
    Read,
    /// Pages to the brick (a write-back).
    Write,
}

/// One request and its response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Transfer {
    /// Read or write.
    pub op: Op,
    /// Pages moved.
    pub pages: u32,
    /// Extents in the request's list (1 for a contiguous run).
    pub extents: u32,
}

impl Transfer {
    /// A read of one contiguous run of `pages`.
    pub fn read(pages: u32) -> Transfer {
        Transfer {
            op: Op::Read,
            pages,
            extents: 1,
        }
    }

    /// A write of one contiguous run of `pages`.
    pub fn write(pages: u32) -> Transfer {
        Transfer {
            op: Op::Write,
            pages,
            extents: 1,
        }
    }

    /// Payload bytes: the pages.
    pub fn payload_bytes(&self) -> u64 {
        u64::from(self.pages) * u64::from(PAGE_SIZE)
    }

    /// The request frame's bytes (header, extent list, and the pages of a write).
    pub fn request_bytes(&self) -> u64 {
        let list = EXTENT_COUNT_BYTES + EXTENT_BYTES * u64::from(self.extents);
        HEADER_LEN as u64
            + list
            + match self.op {
                Op::Read => 0,
                Op::Write => self.payload_bytes(),
            }
    }

    /// The response frame's bytes (header, and the pages of a read).
    pub fn response_bytes(&self) -> u64 {
        HEADER_LEN as u64
            + match self.op {
                Op::Read => self.payload_bytes(),
                Op::Write => 0,
            }
    }
}

impl Link {
    /// Packets a frame of `bytes` is cut into.
    pub fn packets(&self, bytes: u64) -> u64 {
        bytes.div_ceil(u64::from(self.packet_payload.max(1)))
    }

    /// Bytes a frame of `bytes` takes on the wire.
    pub fn wire_bytes(&self, bytes: u64) -> u64 {
        bytes + self.packets(bytes) * u64::from(self.packet_overhead)
    }

    /// Seconds one lane takes to send a frame of `bytes`.
    pub fn serialize_s(&self, bytes: u64) -> f64 {
        self.wire_bytes(bytes) as f64 / self.bandwidth_bytes_per_s
    }

    /// Payload over everything on the wire, both directions (seed 000's effective link
    /// utilisation when the link is kept busy).
    pub fn efficiency(&self, t: Transfer) -> f64 {
        t.payload_bytes() as f64 / (self.wire_bytes(t.request_bytes()) + self.wire_bytes(t.response_bytes())) as f64
    }

    /// Request sent to response received, one request at a time.
    pub fn round_trip_s(&self, t: Transfer, sw: Software) -> f64 {
        2.0 * self.latency_s
            + self.serialize_s(t.request_bytes())
            + self.serialize_s(t.response_bytes())
            + sw.request_s
            + f64::from(t.pages) * sw.page_s
    }

    /// A fault that fetches `t`, as the faulting thread sees it.
    pub fn fault_s(&self, t: Transfer, sw: Software) -> f64 {
        sw.fault_s + self.round_trip_s(t, sw)
    }

    /// Payload bytes per second with `depth` requests like `t` in flight.
    pub fn stream_bytes_per_s(&self, t: Transfer, sw: Software, depth: u32) -> f64 {
        let wire = self
            .serialize_s(t.request_bytes())
            .max(self.serialize_s(t.response_bytes()))
            / f64::from(self.lanes.max(1));
        let software = sw.request_s + f64::from(t.pages) * sw.page_s;
        let per_request = (self.round_trip_s(t, sw) / f64::from(depth.max(1)))
            .max(wire)
            .max(software);
        t.payload_bytes() as f64 / per_request
    }

    /// Share of the link's time carrying payload when requests go one at a time (seed 000's
    /// back-to-back case, one level up): the response's payload time over the round trip.
    pub fn one_at_a_time_utilisation(&self, t: Transfer, sw: Software) -> f64 {
        (t.payload_bytes() as f64 / self.bandwidth_bytes_per_s) / self.round_trip_s(t, sw)
    }
}

/// A link as users write it: `latency=5us,bandwidth=25Gbit[,lanes=2][,mtu=9000]`, or a preset's
/// name (see [`presets`]), optionally followed by overrides (`100g-rdma,latency=3us`).
#[derive(Debug, Clone, PartialEq)]
pub struct LinkSpec(pub Link);

impl std::str::FromStr for LinkSpec {
    type Err = ModelError;

    fn from_str(spec: &str) -> Result<LinkSpec, ModelError> {
        let err = |reason: String| ModelError::Spec {
            spec: spec.to_string(),
            reason,
        };
        let mut parts = spec.split(',').map(str::trim).filter(|p| !p.is_empty()).peekable();
        let mut link = match parts.peek() {
            Some(first) if !first.contains('=') => {
                let name = *first;
                parts.next();
                presets().into_iter().find(|l| l.name == name).ok_or_else(|| {
                    let names: Vec<String> = presets().into_iter().map(|l| l.name).collect();
                    err(format!("no preset named {name:?} (presets: {})", names.join(", ")))
                })?
            }
            _ => Link {
                name: spec.to_string(),
                latency_s: f64::NAN,
                bandwidth_bytes_per_s: f64::NAN,
                lanes: 1,
                // Ethernet's 1500-byte MTU carrying TCP with timestamps, and what each frame adds:
                // preamble 8, Ethernet header 14, FCS 4, inter-frame gap 12, IPv4 20, TCP 32.
                packet_payload: 1448,
                packet_overhead: 90,
            },
        };
        for p in parts {
            let (key, value) = p
                .split_once('=')
                .ok_or_else(|| err(format!("{p:?} is not key=value")))?;
            match key {
                "latency" => link.latency_s = parse_duration_s(value).map_err(err)?,
                "bandwidth" => link.bandwidth_bytes_per_s = parse_bandwidth(value).map_err(err)?,
                "lanes" => {
                    link.lanes = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=64).contains(n))
                        .ok_or_else(|| err(format!("lanes {value:?}: a whole number from 1 to 64")))?
                }
                "mtu" => {
                    // The payload of a packet of this MTU carrying TCP over IPv4 (52 bytes of
                    // headers); what the wire adds around it stays as set.
                    let mtu: u32 = value
                        .parse()
                        .ok()
                        .filter(|n| (576..=65536).contains(n))
                        .ok_or_else(|| err(format!("mtu {value:?}: bytes, from 576 to 65536")))?;
                    link.packet_payload = mtu - 52;
                }
                "packet-overhead" => {
                    link.packet_overhead = value
                        .parse()
                        .ok()
                        .filter(|n| *n <= 4096)
                        .ok_or_else(|| err(format!("packet-overhead {value:?}: bytes, at most 4096")))?
                }
                other => {
                    return Err(err(format!(
                        "unknown key {other:?} (keys: latency, bandwidth, lanes, mtu, packet-overhead)"
                    )))
                }
            }
        }
        if !link.latency_s.is_finite() {
            return Err(err("latency missing (for example latency=5us)".into()));
        }
        if !link.bandwidth_bytes_per_s.is_finite() {
            return Err(err("bandwidth missing (for example bandwidth=25Gbit)".into()));
        }
        link.name = spec.to_string();
        Ok(LinkSpec(link))
    }
}

/// `5us`, `800ns`, `1.5ms`, `0s`: seconds. A bare number is refused (the unit is the point).
pub fn parse_duration_s(text: &str) -> Result<f64, String> {
    let units = [("ns", 1e-9), ("us", 1e-6), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0)];
    for (suffix, scale) in units {
        if let Some(n) = text.strip_suffix(suffix) {
            let v: f64 = n
                .trim()
                .parse()
                .map_err(|_| format!("latency {text:?}: a number then ns, us, ms or s"))?;
            if !(v.is_finite() && (0.0..=10.0).contains(&(v * scale))) {
                return Err(format!("latency {text:?}: from 0 to 10 s"));
            }
            return Ok(v * scale);
        }
    }
    Err(format!(
        "latency {text:?}: a number then ns, us, ms or s (for example 5us)"
    ))
}

/// `25Gbit`, `100Gbps`, `800Mbit`, `12GB/s`, `500MB/s`: bytes per second (decimal prefixes, as
/// network rates are quoted).
pub fn parse_bandwidth(text: &str) -> Result<f64, String> {
    let units = [
        ("Gbit", 1e9 / 8.0),
        ("Gbps", 1e9 / 8.0),
        ("Mbit", 1e6 / 8.0),
        ("Mbps", 1e6 / 8.0),
        ("GB/s", 1e9),
        ("MB/s", 1e6),
    ];
    for (suffix, scale) in units {
        if let Some(n) = text.strip_suffix(suffix) {
            let v: f64 = n
                .trim()
                .parse()
                .map_err(|_| format!("bandwidth {text:?}: a number then Gbit, Mbit, GB/s or MB/s"))?;
            if !(v.is_finite() && v > 0.0 && v * scale <= 1e12) {
                return Err(format!("bandwidth {text:?}: above 0, at most 1 TB/s"));
            }
            return Ok(v * scale);
        }
    }
    Err(format!(
        "bandwidth {text:?}: a number then Gbit, Mbit, GB/s or MB/s (for example 25Gbit)"
    ))
}

/// Networks users ask about. Their figures are assumptions stated in `docs/model.md`, not
/// measurements: one-way latencies of the wire and switch alone (software is [`Software`]'s).
pub fn presets() -> Vec<Link> {
    vec![
        Link {
            // TCP over 25 Gbit/s Ethernet through one switch.
            name: "25gbe".into(),
            latency_s: 5e-6,
            bandwidth_bytes_per_s: 25e9 / 8.0,
            lanes: 1,
            packet_payload: 1448,
            packet_overhead: 90,
        },
        Link {
            // The InfiniBand of seed 002's cluster, as its section 4 describes it: about 3 µs
            // and 12 GB/s; 4 KiB IB MTU, local and base transport headers and CRCs per packet.
            name: "ib-seed002".into(),
            latency_s: 3e-6,
            bandwidth_bytes_per_s: 12e9,
            lanes: 1,
            packet_payload: 4096,
            packet_overhead: 26,
        },
        Link {
            // 100 Gbit/s RDMA over converged Ethernet (RoCE v2, 4 KiB MTU).
            name: "100g-rdma".into(),
            latency_s: 1.5e-6,
            bandwidth_bytes_per_s: 100e9 / 8.0,
            lanes: 1,
            packet_payload: 4096,
            packet_overhead: 82,
        },
        Link {
            // A CXL switch hop on a PCIe 5.0 x8 port: 64-byte payload in each 68-byte flit.
            name: "cxl-switch".into(),
            latency_s: 0.3e-6,
            bandwidth_bytes_per_s: 32e9,
            lanes: 1,
            packet_payload: 64,
            packet_overhead: 4,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sw() -> Software {
        Software {
            fault_s: 5e-6,
            request_s: 3e-6,
            page_s: 1e-6,
        }
    }

    #[test]
    fn a_read_is_a_short_request_and_a_long_response() {
        let t = Transfer::read(1);
        assert_eq!(t.request_bytes(), 32 + 4 + 12);
        assert_eq!(t.response_bytes(), 32 + 4096);
        let w = Transfer::write(2);
        assert_eq!(w.request_bytes(), 32 + 4 + 12 + 8192);
        assert_eq!(w.response_bytes(), 32);
    }

    #[test]
    fn packets_add_their_overhead() {
        let l: LinkSpec = "latency=1us,bandwidth=8Gbit".parse().unwrap();
        let l = l.0;
        assert_eq!(l.bandwidth_bytes_per_s, 1e9);
        assert_eq!(l.packets(4128), 3);
        assert_eq!(l.wire_bytes(4128), 4128 + 3 * 90);
        // 4 KiB over 1 GB/s with 1 µs each way: 2 µs + request + response + software.
        let rt = l.round_trip_s(Transfer::read(1), sw());
        let expect = 2e-6 + (48.0 + 90.0) / 1e9 + (4128.0 + 270.0) / 1e9 + 3e-6 + 1e-6;
        assert!((rt - expect).abs() < 1e-15);
    }

    #[test]
    fn pipelining_approaches_the_wire_and_batching_raises_efficiency() {
        let l = presets().into_iter().find(|l| l.name == "25gbe").unwrap();
        let one = l.stream_bytes_per_s(Transfer::read(16), sw(), 1);
        let many = l.stream_bytes_per_s(Transfer::read(16), sw(), 64);
        assert!(many > one);
        assert!(many <= l.bandwidth_bytes_per_s);
        assert!(l.efficiency(Transfer::read(16)) > l.efficiency(Transfer::read(1)));
        assert!(l.one_at_a_time_utilisation(Transfer::read(1), sw()) < l.efficiency(Transfer::read(1)));
    }

    #[test]
    fn specs_parse_presets_and_overrides_and_refuse_nonsense() {
        let l = "100g-rdma,latency=3us".parse::<LinkSpec>().unwrap().0;
        assert_eq!(l.latency_s, 3e-6);
        assert_eq!(l.bandwidth_bytes_per_s, 12.5e9);
        let l = "latency=800ns,bandwidth=12GB/s,lanes=2,mtu=9000"
            .parse::<LinkSpec>()
            .unwrap()
            .0;
        assert!((l.latency_s - 8e-7).abs() < 1e-18);
        assert_eq!(l.lanes, 2);
        assert_eq!(l.packet_payload, 8948);
        for bad in [
            "latency=5,bandwidth=1Gbit",
            "latency=5us",
            "bandwidth=1Gbit",
            "latency=5us,bandwidth=-1Gbit",
            "latency=5us,bandwidth=1Gbit,lanes=0",
            "latency=5us,bandwidth=1Gbit,colour=red",
            "token-ring",
            "latency=5us,bandwidth",
        ] {
            assert!(bad.parse::<LinkSpec>().is_err(), "{bad} parsed");
        }
    }
}
