//! Where a brick is: `tcp://HOST:PORT`, `tls://HOST:PORT` or `unix:PATH`, parsed and shown.

use crate::error::LinkError;
use std::fmt;
use std::path::PathBuf;

/// Where a brick is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BrickAddr {
    /// `tcp://HOST:PORT`.
    Tcp(String),
    /// `unix:PATH`.
    Unix(PathBuf),
    /// `tls://HOST:PORT`: TCP carrying TLS; the brick's certificate must name HOST and chain to
    /// a CA the node trusts ([`TlsClient`](crate::TlsClient)).
    Tls(String),
}

impl std::str::FromStr for BrickAddr {
    type Err = LinkError;
    fn from_str(s: &str) -> Result<Self, LinkError> {
        let bad = || LinkError::BadAddress(s.to_string());
        let host_port =
            |a: &str| matches!(a.rsplit_once(':'), Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok());
        if let Some(a) = s.strip_prefix("tcp://") {
            host_port(a).then(|| BrickAddr::Tcp(a.to_string())).ok_or_else(bad)
        } else if let Some(a) = s.strip_prefix("tls://") {
            host_port(a).then(|| BrickAddr::Tls(a.to_string())).ok_or_else(bad)
        } else if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                Err(bad())
            } else {
                Ok(BrickAddr::Unix(PathBuf::from(p)))
            }
        } else {
            Err(bad())
        }
    }
}

impl fmt::Display for BrickAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BrickAddr::Tcp(a) => write!(f, "tcp://{a}"),
            BrickAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            BrickAddr::Tls(a) => write!(f, "tls://{a}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip() {
        for s in [
            "tcp://127.0.0.1:7070",
            "unix:/tmp/b.sock",
            "tcp://host:1",
            "tls://brick.example:7070",
        ] {
            let a: BrickAddr = s.parse().unwrap();
            assert_eq!(a.to_string(), s);
        }
        for s in [
            "",
            "tcp://",
            "tcp://host",
            "tcp://:80",
            "http://x:1",
            "unix:",
            "tls://",
            "tls://host",
            "tls://:1",
        ] {
            assert!(s.parse::<BrickAddr>().is_err(), "{s}");
        }
    }
}
