//! Bricks on TCP loopback, plain (`tcp://`) or inside TLS (`tls://`), for programs run under
//! `rackmem run --brick`: the same brick and link code on both, so the difference between their
//! results is what TLS costs a link. The TLS brick's certificate comes from a throwaway CA
//! made at run time (written next to the caller's other temporary files).

use crate::BenchError;
use rackmem_brick::{Brick, BrickConfig, BrickHandle, ListenAddr};
use std::path::{Path, PathBuf};

/// The secret of loopback bricks (standalone ALLOC).
pub const SECRET: &str = "bench";

/// Which kind of link a loopback brick serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkKind {
    /// Plain TCP.
    Tcp,
    /// TLS over TCP, certificate from a throwaway CA.
    Tls,
}

impl LinkKind {
    /// `tcp` or `tls`, as in addresses and command lines.
    pub fn name(self) -> &'static str {
        match self {
            LinkKind::Tcp => "tcp",
            LinkKind::Tls => "tls",
        }
    }
}

impl std::str::FromStr for LinkKind {
    type Err = BenchError;

    fn from_str(s: &str) -> Result<LinkKind, BenchError> {
        match s {
            "tcp" => Ok(LinkKind::Tcp),
            "tls" => Ok(LinkKind::Tls),
            other => Err(BenchError::Config(format!("unknown link {other}: use tcp, tls"))),
        }
    }
}

/// A running loopback brick and what `rackmem run` needs to use it.
pub struct LoopbackBrick {
    /// The brick; dropping it stops it.
    pub handle: BrickHandle,
    /// `tcp://127.0.0.1:PORT` or `tls://127.0.0.1:PORT`.
    pub addr: String,
    /// The CA file a `tls://` brick's certificate chains to.
    pub ca_file: Option<PathBuf>,
}

impl LoopbackBrick {
    /// Starts a brick of `size_bytes` serving `kind` on 127.0.0.1; a TLS brick's certificate,
    /// key and CA are written into `dir`.
    pub fn start(kind: LinkKind, size_bytes: u64, dir: &Path) -> Result<LoopbackBrick, BenchError> {
        let (listen, tls, ca_file) = match kind {
            LinkKind::Tcp => (ListenAddr::Tcp("127.0.0.1:0".into()), None, None),
            LinkKind::Tls => {
                let (ca, cert, key) = throwaway_certificate(dir)?;
                let config =
                    rackmem_brick::tls_server_config(&cert, &key).map_err(|e| BenchError::Brick(e.to_string()))?;
                (ListenAddr::Tls("127.0.0.1:0".into()), Some(config), Some(ca))
            }
        };
        let handle = Brick::start(BrickConfig {
            listen,
            size_bytes,
            key: b"bench".to_vec(),
            secret: Some(SECRET.as_bytes().to_vec()),
            managed: false,
            limits: Default::default(),
            tls,
        })
        .map_err(|e| BenchError::Brick(format!("starting the {} loopback brick: {e}", kind.name())))?;
        let addr = handle.local_addr();
        Ok(LoopbackBrick { handle, addr, ca_file })
    }

    /// Starts one brick of `size_bytes` for each of `kinds`, in that order.
    pub fn start_each(kinds: &[LinkKind], size_bytes: u64, dir: &Path) -> Result<Vec<LoopbackBrick>, BenchError> {
        kinds
            .iter()
            .map(|&k| LoopbackBrick::start(k, size_bytes, dir))
            .collect()
    }

    /// The `rackmem run` options that use this brick.
    pub fn run_args(&self) -> Vec<String> {
        let mut v = vec!["--brick".into(), self.addr.clone(), "--secret".into(), SECRET.into()];
        if let Some(ca) = &self.ca_file {
            v.push("--tls-ca".into());
            v.push(ca.display().to_string());
        }
        v
    }
}

/// A CA and a certificate it signs for 127.0.0.1, written as PEM files into `dir`: (CA,
/// certificate, key).
fn throwaway_certificate(dir: &Path) -> Result<(PathBuf, PathBuf, PathBuf), BenchError> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let fail = |e: rcgen::Error| BenchError::Brick(format!("making a throwaway certificate: {e}"));
    let ca_key = KeyPair::generate().map_err(fail)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "rackmem bench throwaway CA");
    let ca = ca_params.self_signed(&ca_key).map_err(fail)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().map_err(fail)?;
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).map_err(fail)?;
    params.distinguished_name.push(DnType::CommonName, "bench brick");
    let cert = params.signed_by(&key, &issuer).map_err(fail)?;
    let write = |name: &str, text: String| -> Result<PathBuf, BenchError> {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| BenchError::Brick(format!("writing {}: {e}", p.display())))?;
        Ok(p)
    };
    Ok((
        write("bench-ca.pem", ca.pem())?,
        write("bench-brick.pem", cert.pem())?,
        write("bench-brick.key", key.serialize_pem())?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rackmem_transport::{BrickAddr, Link, TlsClient};

    #[test]
    fn the_tls_loopback_brick_serves_links_that_trust_its_ca() {
        let dir = tempfile::tempdir().expect("tempdir");
        let b = LoopbackBrick::start(LinkKind::Tls, 64 << 20, dir.path()).expect("starts");
        let addr: BrickAddr = b.addr.parse().expect("address");
        let ca = TlsClient::from_ca_file(b.ca_file.as_deref().expect("CA")).expect("CA loads");
        let link = Link::connect_with(&addr, std::time::Duration::from_secs(20), Some(&ca)).expect("connects");
        link.ping().expect("ping");
        assert!(b.run_args().iter().any(|a| a == "--tls-ca"));
    }
}
