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
    /// Transfers of at least this many bytes take the bulk path.
    pub threshold_bytes: u64,
    /// True if the user pinned it; false if measured.
    pub pinned: bool,
    /// What was measured (empty when pinned).
    pub probes: Vec<Probe>,
    /// How long the measurement took.
    pub probe_time: Duration,
}

impl Default for Plan {
    /// Before any measurement: bulk from the piece size on (the bulk path sends smaller
    /// transfers as one frame anyway).
    fn default() -> Plan {
        Plan {
            threshold_bytes: BULK_PIECE_BYTES as u64,
            pinned: false,
            probes: Vec::new(),
            probe_time: Duration::ZERO,
        }
    }
}

impl Plan {
    /// The path for a transfer of `len` bytes.
    pub fn path_for(&self, len: usize) -> Path {
        if len as u64 >= self.threshold_bytes {
            Path::Bulk
        } else {
            Path::Inline
        }
    }

    /// A pinned plan.
    pub fn pinned(threshold_bytes: u64) -> Plan {
        Plan {
            threshold_bytes,
            pinned: true,
            ..Plan::default()
        }
    }

    /// The threshold the probes call for: the smallest probed size from which the bulk path is
    /// at least 5% faster at that size and every larger one probed (5%: below that, a shared
    /// machine's noise decides), or never (`u64::MAX`) if it does not win at the largest. A
    /// bulk path that wins at the smallest probe wins from 0 on a mapped segment, where its
    /// cost does not grow with anything but the bytes.
    pub fn from_probes(probes: Vec<Probe>, mapped: bool, probe_time: Duration) -> Plan {
        let wins = |p: &Probe| p.bulk.as_nanos() * 100 <= p.inline.as_nanos() * 95;
        let mut threshold = u64::MAX;
        for (i, p) in probes.iter().enumerate().rev() {
            if !wins(p) {
                break;
            }
            threshold = if i == 0 && mapped { 0 } else { p.bytes };
        }
        Plan {
            threshold_bytes: threshold,
            pinned: false,
            probes,
            probe_time,
        }
    }
}

/// Sizes probed on a mapped segment: the bulk path is a memory copy there, so the question is
/// how small a transfer still pays a round trip's fixed cost less than a copy's.
const MAPPED_PROBES: [u64; 4] = [8, 512, 4096, 65536];
/// Sizes probed on a socket: below two bulk pieces both paths send one frame.
const SOCKET_PROBES: [u64; 3] = [512 << 10, 1 << 20, 4 << 20];
/// Interleaved rounds per size; the best time of each path counts (the least disturbed by
/// other processes on a shared machine).
const ROUNDS: usize = 3;

/// Measures both paths on `seg` with GETs at its start (reads only: the segment may be a named
/// one that others already use) and returns the plan. A few milliseconds on a local link.
pub fn calibrate(seg: &Segment) -> Result<Plan, PutGetError> {
    let started = Instant::now();
    let sizes: &[u64] = if seg.is_mapped() {
        &MAPPED_PROBES
    } else {
        &SOCKET_PROBES
    };
    let mut buf = Vec::new();
    let mut probes = Vec::new();
    for &bytes in sizes.iter().filter(|&&b| b <= seg.size()) {
        buf.resize(bytes as usize, 0);
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
                seg.get_with(path, 0, &mut buf)?;
                let i = usize::from(path == Path::Bulk);
                best[i] = best[i].min(t.elapsed());
            }
        }
        probes.push(Probe {
            bytes,
            inline: best[0],
            bulk: best[1],
        });
    }
    Ok(Plan::from_probes(probes, seg.is_mapped(), started.elapsed()))
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
        let plan = Plan::from_probes(vec![p(1, 10, 12), p(2, 20, 15), p(4, 40, 20)], false, Duration::ZERO);
        assert_eq!(plan.threshold_bytes, 2);
        // A win at a small size that is lost again at a larger one does not count.
        let plan = Plan::from_probes(vec![p(1, 10, 5), p(2, 20, 25), p(4, 40, 20)], false, Duration::ZERO);
        assert_eq!(plan.threshold_bytes, 4);
        let plan = Plan::from_probes(vec![p(1, 10, 12), p(2, 20, 25)], false, Duration::ZERO);
        assert_eq!(plan.threshold_bytes, u64::MAX, "bulk never wins");
        let plan = Plan::from_probes(vec![p(8, 10, 1), p(64, 10, 1)], true, Duration::ZERO);
        assert_eq!(plan.threshold_bytes, 0, "a mapping that wins everywhere wins from 0");
        assert_eq!(plan.path_for(0), Path::Bulk);
        // Within 5%: noise, not a win.
        let plan = Plan::from_probes(vec![p(1, 100, 97)], false, Duration::ZERO);
        assert_eq!(plan.threshold_bytes, u64::MAX);
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
