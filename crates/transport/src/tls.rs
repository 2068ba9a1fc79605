//! TLS for `tls://` links: the CA a node trusts, and the client handshake.
//!
//! After the handshake a link keeps its one `rustls::ClientConnection` behind a mutex that is
//! never held across blocking I/O (see `docs/architecture.md`, "TLS links"): senders seal
//! plaintext under it and write the records to the socket after releasing it, under the link's
//! send lock, so records reach the socket in the order they were sealed; the reader reads raw
//! bytes without it and decrypts under it. No thread is started for TLS.

use rackmem_proto::{Header, Status, HEADER_LEN};
use rustls::pki_types::ServerName;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// The environment variable naming the PEM file of CA certificates that `tls://` bricks'
/// certificates must chain to (used by [`crate::Link::connect`]).
pub const TLS_CA_ENV: &str = "RACKMEM_TLS_CA";

/// What a node trusts for `tls://` links: the CA certificates that sign bricks' certificates.
/// Cheap to clone.
#[derive(Clone)]
pub struct TlsClient {
    config: Arc<rustls::ClientConfig>,
}

impl fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsClient").finish_non_exhaustive()
    }
}

impl TlsClient {
    /// Trusts the CA certificates in the PEM file at `path` (one or more `CERTIFICATE` blocks).
    pub fn from_ca_file(path: &Path) -> Result<TlsClient, String> {
        let pem = std::fs::read(path).map_err(|e| format!("cannot read the CA file {}: {e}", path.display()))?;
        Self::from_ca_pem(&pem).map_err(|e| format!("the CA file {}: {e}", path.display()))
    }

    /// Trusts the CA certificates in `pem` (one or more `CERTIFICATE` blocks).
    pub fn from_ca_pem(pem: &[u8]) -> Result<TlsClient, String> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::CertificateDer;
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(pem) {
            let c = c.map_err(|e| format!("not PEM certificates: {e}"))?;
            roots
                .add(c)
                .map_err(|e| format!("a certificate is not usable as a CA: {e}"))?;
        }
        if roots.is_empty() {
            return Err("holds no CERTIFICATE block".into());
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(TlsClient {
            config: Arc::new(config),
        })
    }

    /// Reads the CA file named by [`TLS_CA_ENV`]; `None` when it is unset or empty.
    pub fn from_env() -> Option<Result<TlsClient, String>> {
        let path = std::env::var_os(TLS_CA_ENV).filter(|p| !p.is_empty())?;
        Some(Self::from_ca_file(Path::new(&path)).map_err(|e| format!("{TLS_CA_ENV}: {e}")))
    }
}

/// The server name a certificate must carry for `HOST:PORT`: the host, without the brackets of
/// an IPv6 literal.
fn server_name(host_port: &str) -> Result<ServerName<'static>, String> {
    let host = host_port.rsplit_once(':').map_or(host_port, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string()).map_err(|e| format!("`{host}` cannot name a TLS server: {e}"))
}

/// Runs the client handshake on `sock` (blocking, with the socket's timeouts) and returns the
/// connection, ready for application data. Bounded by `deadline` however the peer trickles.
pub(crate) fn handshake(
    client: &TlsClient,
    host_port: &str,
    sock: &TcpStream,
    deadline: Instant,
) -> Result<rustls::ClientConnection, String> {
    let mut conn =
        rustls::ClientConnection::new(client.config.clone(), server_name(host_port)?).map_err(|e| e.to_string())?;
    // Senders seal whole batches (up to a request's payload) before writing them out.
    conn.set_buffer_limit(None);
    let mut s = sock;
    // Records go out with MSG_NOSIGNAL: a handshake runs on a program's thread (a link made at
    // first use), where a brick that hung up must be an error, not a SIGPIPE.
    let mut out = rackmem_sys::NoSignal(sock.as_fd());
    let mut buf = vec![0u8; 16 << 10];
    let mut first_bytes: Option<Vec<u8>> = None;
    loop {
        while conn.wants_write() {
            conn.write_tls(&mut out)
                .map_err(|e| format!("TLS handshake: send failed: {e}"))?;
        }
        if !conn.is_handshaking() {
            return Ok(conn);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match rackmem_sys::poll_readable(sock.as_fd(), left) {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "TLS handshake did not finish within the link timeout ({left:?} left)"
                ))
            }
            Err(e) => return Err(format!("TLS handshake: {e}")),
        }
        let n = match s.read(&mut buf) {
            Ok(0) => {
                return Err(
                    "the brick closed the connection during the TLS handshake (over its connection \
                            limits, or not a tls:// brick)"
                        .into(),
                )
            }
            Ok(n) => n,
            Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock) => continue,
            Err(e) => return Err(format!("TLS handshake: receive failed: {e}")),
        };
        first_bytes.get_or_insert_with(|| buf[..n].to_vec());
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            let used = conn.read_tls(&mut rest).map_err(|e| format!("TLS handshake: {e}"))?;
            if let Err(e) = conn.process_new_packets() {
                // Tell the brick why (the alert rustls queued), then say what went wrong here.
                let _ = conn.write_tls(&mut out);
                return Err(explain_failure(&e, first_bytes.as_deref().unwrap_or_default()));
            }
            if used == 0 {
                break;
            }
        }
    }
}

/// A failed handshake's error, with what the peer evidently is when its first bytes are a
/// plain rackmem answer (a `tcp://` brick answering the ClientHello as a malformed frame, or a
/// brick refusing a connection over its limits).
fn explain_failure(e: &rustls::Error, first: &[u8]) -> String {
    if let Some(h) = first.get(..HEADER_LEN).and_then(|b| Header::decode(b).ok()) {
        let msg = first.get(HEADER_LEN..).map(String::from_utf8_lossy).unwrap_or_default();
        if h.tag == 0 && h.status == Status::Busy.code() {
            return format!("the brick refused the connection: {}: {msg}", Status::Busy);
        }
        return format!(
            "the brick answered in plain text, not TLS: it serves tcp://, not tls:// (it said: {}: {msg})",
            Status::from_u32(h.status)
        );
    }
    match e {
        rustls::Error::InvalidCertificate(c) => format!(
            "TLS handshake failed: the brick's certificate is not trusted ({c:?}): \
             give the CA that signed it ({TLS_CA_ENV}, --tls-ca), and check it names the host"
        ),
        _ => format!("TLS handshake failed: {e}"),
    }
}

/// Seals `bufs` as TLS records into `out` (cleared first). Runs under the connection lock.
pub(crate) fn seal(conn: &mut rustls::ClientConnection, bufs: &[io::IoSlice<'_>], out: &mut Vec<u8>) -> io::Result<()> {
    out.clear();
    let want: usize = bufs.iter().map(|b| b.len()).sum();
    // The buffer limit is off (see `handshake`), so rustls takes all of it at once.
    let took = conn.writer().write_vectored(bufs)?;
    if took != want {
        return Err(io::Error::other(format!("TLS took {took} of {want} bytes")));
    }
    // Also whatever the reader left queued (a key update's answer): it goes out in order.
    while conn.wants_write() {
        conn.write_tls(out)?;
    }
    Ok(())
}
