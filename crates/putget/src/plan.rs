//! Which path serves a transfer of a given size, and how that was decided: measured on the
//! link at its first segment (a few milliseconds of GETs by both paths, interleaved), or pinned
//! by the user.
//!
//! Seed 003 (the DSM thesis, chapter 3) found that the processor's own loads and stores beat an
//! offloaded DMA transfer by up to 7× below a size threshold, and lose above it, and that the
//! threshold has to be measured on the machine. Here the same trade-off is between one frame
//! per transfer (one round trip of fixed cost, then a copy through the socket) and the bulk
//! path (pipelined pieces on a socket, or the processor's copy into a mapped segment); where the
//! crossover lies depends on the link, so each link is measured.

use crate::error::PutGetError;
use crate::segment::{Segment, BULK_PIECE_BYTES};
use std::time::{Duration, Instant};

/// How a transfer moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Path {
    /// One frame per transfer (several, one after another, beyond a frame's limit).
    Inline,
    /// Pipelined pieces on a socket; the processor's copy on a mapped segment.
    Bulk,
}

/// Where the threshold comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threshold {
    /// Measured on each link at its first segment (the default).
    Calibrate,
    /// Transfers of at least this many bytes take the bulk path (0: always bulk; `u64::MAX`:
    /// always inline). `RACKMEM_TRANSFER_THRESHOLD`.
    Pinned(u64),
}

impl std::str::FromStr for Threshold {
    type Err = PutGetError;
    /// `auto`, `inline`, `bulk`, or a size (`65536`, `64KiB`, `1MiB`).
    fn from_str(s: &str) -> Result<Threshold, PutGetError> {
        let s = s.trim();
        match s {
            "auto" | "" => return Ok(Threshold::Calibrate),
            "inline" => return Ok(Threshold::Pinned(u64::MAX)),
            "bulk" => return Ok(Threshold::Pinned(0)),
            _ => {}
        }
        let bad = || PutGetError::Invalid(format!("transfer threshold `{s}`: use auto, inline, bulk or a size"));
        let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let n: u64 = s[..digits].parse().map_err(|_| bad())?;
        let unit = match s[digits..].trim() {
            "" | "B" => 1,
            "K" | "KiB" | "k" => 1 << 10,
            "M" | "MiB" => 1 << 20,
            "G" | "GiB" => 1 << 30,
            _ => return Err(bad()),
        };
        n.checked_mul(unit).map(Threshold::Pinned).ok_or_else(bad)
    }
}

/// Which way a transfer goes: each has its own threshold (on a socket, a pipelined PUT gains
/// where a pipelined GET does not: the brick's copy of one piece overlaps the next piece's
/// send only in that direction).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Into the segment.
    Put,
    /// Out of the segment.
    Get,
}

/// One probed size: the best time of each path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probe {
    /// Bytes per transfer.
    pub bytes: u64,
    /// Best inline time.
    pub inline: Duration,
    /// Best bulk time.
    pub bulk: Duration,
}

/// Which path serves which sizes on one link.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// PUTs of at least this many bytes take the bulk path.
    pub put_threshold_bytes: u64,
    /// GETs of at least this many bytes take the bulk path.
    pub get_threshold_bytes: u64,
    /// True if the user pinned it; false if measured.
    pub pinned: bool,
    /// What was measured of PUT (empty when pinned).
    pub put_probes: Vec<Probe>,
    /// What was measured of GET (empty when pinned).
    pub get_probes: Vec<Probe>,
    /// How long the measurement took.
    pub probe_time: Duration,
}

impl Default for Plan {
    /// Before any measurement: bulk from the piece size on (the bulk path sends smaller
    /// transfers as one frame anyway).
    fn default() -> Plan {
        Plan::pinned(BULK_PIECE_BYTES as u64)
    }
}

impl Plan {
    /// The path for a transfer of `len` bytes.
    pub fn path_for(&self, dir: Direction, len: usize) -> Path {
        let t = match dir {
            Direction::Put => self.put_threshold_bytes,
            Direction::Get => self.get_threshold_bytes,
        };
        if len as u64 >= t {
            Path::Bulk
        } else {
            Path::Inline
        }
    }

    /// A pinned plan, one threshold for both directions.
    pub fn pinned(threshold_bytes: u64) -> Plan {
        Plan {
            put_threshold_bytes: threshold_bytes,
            get_threshold_bytes: threshold_bytes,
            pinned: true,
            put_probes: Vec::new(),
            get_probes: Vec::new(),
            probe_time: Duration::ZERO,
        }
    }

    /// The threshold the probes call for: the smallest probed size from which the bulk path is
    /// at least 5% faster at that size and every larger one probed (5%: below that, a shared
    /// machine's noise decides), or never (`u64::MAX`) if it does not win at the largest. A
    /// bulk path that wins at the smallest probe wins from 0 on a mapped segment, where its
    /// cost does not grow with anything but the bytes.
    ///
    /// Where the bulk path has not won by the largest probe (TCP loopback: its crossover lies
    /// near 16 MiB, and probing that far would take far more than milliseconds), each path is
    /// taken as a fixed cost plus a cost per byte through its two largest probes (seed 003's
    /// model: the fixed cost decides below the crossover), and the threshold is where the
    /// lines cross, if the bulk path's cost per byte is the lower one by 5% and they cross
    /// within [`MAX_EXTRAPOLATED`].
    pub fn threshold(probes: &[Probe], mapped: bool) -> u64 {
        let wins = |p: &Probe| p.bulk.as_nanos() * 100 <= p.inline.as_nanos() * 95;
        let mut threshold = u64::MAX;
        for (i, p) in probes.iter().enumerate().rev() {
            if !wins(p) {
                break;
            }
            threshold = if i == 0 && mapped { 0 } else { p.bytes };
        }
        if threshold == u64::MAX && !mapped {
            if let [.., a, b] = probes {
                return crossing(a, b).unwrap_or(u64::MAX);
            }
        }
        threshold
    }
}

/// The farthest an extrapolated threshold may lie: beyond it the two lines are too nearly
/// parallel for two probes to place their crossing.
pub const MAX_EXTRAPOLATED: u64 = 1 << 30;

/// Where the lines through probes `a` and `b` (smaller first) of the two paths cross, rounded
/// up to a power of two, if the bulk path's cost per byte is lower by 5% and the crossing lies
/// beyond `b` and within [`MAX_EXTRAPOLATED`].
fn crossing(a: &Probe, b: &Probe) -> Option<u64> {
    let span = b.bytes.checked_sub(a.bytes).filter(|&s| s > 0)? as f64;
    let line = |ta: Duration, tb: Duration| {
        let slope = (tb.as_secs_f64() - ta.as_secs_f64()) / span;
        (tb.as_secs_f64() - slope * b.bytes as f64, slope)
    };
    let (fi, si) = line(a.inline, b.inline);
    let (fb, sb) = line(a.bulk, b.bulk);
    if !(sb > 0.0 && sb * 100.0 <= si * 95.0) {
        return None;
    }
    let x = (fb - fi) / (si - sb);
    (x.is_finite() && x > b.bytes as f64 && x <= MAX_EXTRAPOLATED as f64).then(|| (x.ceil() as u64).next_power_of_two())
}

/// Sizes probed on a mapped segment: the bulk path is a memory copy there, so the question is
/// how small a transfer still pays a round trip's fixed cost less than a copy's.
const MAPPED_PROBES: [u64; 4] = [8, 512, 4096, 65536];
/// Sizes probed on a socket: below two bulk pieces both paths send one frame.
const SOCKET_PROBES: [u64; 3] = [512 << 10, 1 << 20, 4 << 20];
/// Interleaved rounds per size; the best time of each path counts (the least disturbed by
/// other processes on a shared machine).
const ROUNDS: usize = 3;
/// Bytes of the scratch segment calibration needs.
pub const CALIBRATION_BYTES: u64 = 4 << 20;

/// Measures both paths in both directions on `seg`, which must be scratch memory (it is
/// overwritten), interleaved, and returns the plan. A few milliseconds on a local link.
pub fn calibrate(seg: &Segment) -> Result<Plan, PutGetError> {
    let started = Instant::now();
    let sizes: &[u64] = if seg.is_mapped() {
        &MAPPED_PROBES
    } else {
        &SOCKET_PROBES
    };
    let mut buf = Vec::new();
    let mut probes = [Vec::new(), Vec::new()];
    for &bytes in sizes.iter().filter(|&&b| b <= seg.size()) {
        buf.resize(bytes as usize, 0x5a);
        for (d, dir) in [Direction::Put, Direction::Get].into_iter().enumerate() {
            let mut best = [Duration::MAX; 2];
            for round in 0..ROUNDS {
                // Alternate which path goes first, so neither always finds the caches warm.
                let order = if round % 2 == 0 {
                    [Path::Inline, Path::Bulk]
                } else {
                    [Path::Bulk, Path::Inline]
                };
                for path in order {
                    let t = Instant::now();
                    match dir {
                        Direction::Put => seg.put_with(path, 0, &buf)?,
                        Direction::Get => seg.get_with(path, 0, &mut buf)?,
                    }
                    let i = usize::from(path == Path::Bulk);
                    best[i] = best[i].min(t.elapsed());
                }
            }
            probes[d].push(Probe {
                bytes,
                inline: best[0],
                bulk: best[1],
            });
        }
    }
    let [put_probes, get_probes] = probes;
    Ok(Plan {
        put_threshold_bytes: Plan::threshold(&put_probes, seg.is_mapped()),
        get_threshold_bytes: Plan::threshold(&get_probes, seg.is_mapped()),
        pinned: false,
        put_probes,
        get_probes,
        probe_time: started.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(bytes: u64, inline_us: u64, bulk_us: u64) -> Probe {
        Probe {
            bytes,
            inline: Duration::from_micros(inline_us),
            bulk: Duration::from_micros(bulk_us),
        }
    }

    #[test]
    fn threshold_is_where_bulk_starts_winning_for_good() {
        assert_eq!(Plan::threshold(&[p(1, 10, 12), p(2, 20, 15), p(4, 40, 20)], false), 2);
        // A win at a small size that is lost again at a larger one does not count.
        assert_eq!(Plan::threshold(&[p(1, 10, 5), p(2, 20, 25), p(4, 40, 20)], false), 4);
        assert_eq!(
            Plan::threshold(&[p(1, 10, 12), p(2, 20, 25)], false),
            u64::MAX,
            "bulk never wins"
        );
        assert_eq!(
            Plan::threshold(&[p(8, 10, 1), p(64, 10, 1)], true),
            0,
            "a mapping that wins everywhere wins from 0"
        );
        // Within 5%: noise, not a win.
        assert_eq!(Plan::threshold(&[p(1, 100, 97)], false), u64::MAX);
        // Not won by the largest probe, but cheaper per byte: inline 100 + 1/byte, bulk
        // 400 + 0.5/byte cross at 600 bytes, rounded up to 1024 (TCP's shape, scaled down).
        assert_eq!(
            Plan::threshold(&[p(100, 200, 450), p(200, 300, 500), p(400, 500, 600)], false),
            1024
        );
        // Parallel lines, a bulk path dearer per byte, or a crossing too far: never.
        assert_eq!(Plan::threshold(&[p(100, 200, 450), p(200, 300, 550)], false), u64::MAX);
        assert_eq!(Plan::threshold(&[p(100, 200, 450), p(200, 300, 600)], false), u64::MAX);
        assert_eq!(
            Plan::threshold(&[p(1 << 20, 1000, 30000), p(2 << 20, 1100, 30094)], false),
            u64::MAX
        );
        // Extrapolation is for sockets: on a mapping the probes reach far enough.
        assert_eq!(Plan::threshold(&[p(100, 200, 450), p(200, 300, 500)], true), u64::MAX);
        let plan = Plan {
            get_threshold_bytes: u64::MAX,
            ..Plan::pinned(0)
        };
        assert_eq!(plan.path_for(Direction::Put, 0), Path::Bulk);
        assert_eq!(plan.path_for(Direction::Get, 1 << 30), Path::Inline);
    }

    #[test]
    fn thresholds_parse() {
        assert_eq!("auto".parse::<Threshold>().ok(), Some(Threshold::Calibrate));
        assert_eq!("inline".parse::<Threshold>().ok(), Some(Threshold::Pinned(u64::MAX)));
        assert_eq!("bulk".parse::<Threshold>().ok(), Some(Threshold::Pinned(0)));
        assert_eq!("64KiB".parse::<Threshold>().ok(), Some(Threshold::Pinned(65536)));
        assert_eq!("4096".parse::<Threshold>().ok(), Some(Threshold::Pinned(4096)));
        assert!("lots".parse::<Threshold>().is_err());
        assert!("99999999999999999999G".parse::<Threshold>().is_err());
    }
}
