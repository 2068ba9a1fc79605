//! Parsing of the sizes users type (`64MiB`, `4GiB`, `4096`, `1.5G`) and of local-buffer budgets
//! that are either a size or a percentage of the footprint (`25%`, the seeds' Xmem(25%)).

use std::fmt;
use std::str::FromStr;

/// A size in bytes parsed from text; binary (`KiB`, `MiB`, `GiB`, `TiB`) and decimal (`KB`, `MB`,
/// `GB`) suffixes, `K`/`M`/`G`/`T` meaning binary, case-insensitive, optional `B`.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| SizeError::Number(text.to_string()))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "kb" => 1000,
        "m" | "mib" => 1 << 20,
        "mb" => 1_000_000,
        "g" | "gib" => 1 << 30,
        "gb" => 1_000_000_000,
        "t" | "tib" => 1 << 40,
        "tb" => 1_000_000_000_000,
        _ => return Err(SizeError::Unit(text.to_string())),
    };
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(SizeError::Number(text.to_string()));
    }
    Ok(bytes as u64)
}

/// Formats bytes the way `parse_size` reads them back (`1.5 GiB`).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// Why a size could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SizeError {
    /// Nothing was given.
    #[error("empty size")]
    Empty,
    /// The number part is not a number.
    #[error("`{0}` is not a size: expected a number with an optional unit, e.g. 64MiB or 4GiB")]
    Number(String),
    /// The unit is unknown.
    #[error("`{0}` has an unknown unit: use B, KiB, MiB, GiB, TiB (or KB, MB, GB)")]
    Unit(String),
    /// A percentage outside (0, 100].
    #[error("`{0}` is not a percentage in (0, 100]")]
    Percent(String),
}

/// The local buffer's budget: the resident remote-backed pages a process may hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    /// A fixed number of bytes.
    Bytes(u64),
    /// A fraction of the peak footprint in the window so far (Xmem(X%) in seed 002, section
    /// 4.1); the caller passes that peak to [`Budget::pages`].
    Percent(f64),
}

impl Budget {
    /// The budget in pages for a footprint of `footprint_bytes`, never below `min_pages`.
    pub fn pages(&self, footprint_bytes: u64, page_size: u64, min_pages: u64) -> u64 {
        let bytes = match *self {
            Budget::Bytes(b) => b,
            Budget::Percent(p) => (footprint_bytes as f64 * p / 100.0) as u64,
        };
        (bytes / page_size).max(min_pages)
    }

    /// As [`Budget::pages`], and for a percentage never below `floor_bytes` or the footprint,
    /// whichever is smaller (a size is the size asked for).
    pub fn pages_with_floor(&self, footprint_bytes: u64, page_size: u64, min_pages: u64, floor_bytes: u64) -> u64 {
        let pages = self.pages(footprint_bytes, page_size, min_pages);
        match self {
            Budget::Bytes(_) => pages,
            Budget::Percent(_) => pages.max(floor_bytes.min(footprint_bytes) / page_size),
        }
    }
}

impl FromStr for Budget {
    type Err = SizeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p.trim().parse().map_err(|_| SizeError::Percent(s.to_string()))?;
            if !(v > 0.0 && v <= 100.0) {
                return Err(SizeError::Percent(s.to_string()));
            }
            Ok(Budget::Percent(v))
        } else {
            parse_size(t).map(Budget::Bytes)
        }
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Budget::Bytes(b) => write!(f, "{}", format_size(*b)),
            Budget::Percent(p) => write!(f, "{p}%"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("4g"), Ok(4 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("2KB"), Ok(2000));
        assert_eq!(parse_size("1MB"), Ok(1_000_000));
        assert!(matches!(parse_size("12XB"), Err(SizeError::Unit(_))));
        assert!(matches!(parse_size("abc"), Err(SizeError::Number(_))));
        assert_eq!(parse_size(""), Err(SizeError::Empty));
    }

    #[test]
    fn budgets() {
        assert_eq!("25%".parse::<Budget>(), Ok(Budget::Percent(25.0)));
        assert_eq!("8MiB".parse::<Budget>(), Ok(Budget::Bytes(8 << 20)));
        assert!("0%".parse::<Budget>().is_err());
        assert!("101%".parse::<Budget>().is_err());
        assert_eq!(Budget::Percent(25.0).pages(400 << 12, 4096, 1), 100);
        assert_eq!(Budget::Percent(1.0).pages(4096, 4096, 16), 16);
        assert_eq!(Budget::Bytes(1 << 20).pages(0, 4096, 1), 256);
        // A floor lifts a percentage up to the footprint, never past it; a size stays a size.
        let pct = Budget::Percent(25.0);
        assert_eq!(pct.pages_with_floor(16 << 20, 4096, 1, 8 << 20), 2048);
        assert_eq!(pct.pages_with_floor(4 << 20, 4096, 1, 8 << 20), 1024);
        assert_eq!(pct.pages_with_floor(64 << 20, 4096, 1, 8 << 20), 4096);
        assert_eq!(pct.pages_with_floor(16 << 20, 4096, 1, 0), 1024);
        assert_eq!(Budget::Bytes(1 << 20).pages_with_floor(64 << 20, 4096, 1, 8 << 20), 256);
    }
}
