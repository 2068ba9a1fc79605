//! TLS for `tls://` bricks: the server configuration, and a connection's stream.
//!
//! A connection thread reads and writes its socket in turn (`server` module), so one
//! `rustls::ServerConnection` next to its `TcpStream` serves it: [`TlsStream`] decrypts on
//! read and seals then flushes on write, bounding each by the deadline its caller set as the
//! socket's timeout (the handshake deadline, the idle timeout, the send timeout), so the TLS
//! handshake, which happens inside the first reads, is bound by the brick's handshake deadline.
//! Descriptors cannot cross TLS: such a connection never offers shared memory (SHARE).

use crate::error::BrickError;
use std::cell::Cell;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most plaintext bytes sealed by one write before they are flushed to the socket.
const SEAL_BYTES: usize = 256 << 10;

/// The rustls server configuration for a brick's certificate chain and key (PEM files).
/// Session tickets are off: links never resume a session, each connection is a full handshake.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, BrickError> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |reason: String| BrickError::Tls(reason);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(Iterator::collect)
        .map_err(|e| bad(format!("reading the certificate {}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(bad(format!("{} holds no CERTIFICATE block", cert.display())));
    }
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| bad(format!("reading the private key {}: {e}", key.display())))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| bad(format!("{} and {}: {e}", cert.display(), key.display())))?;
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// A TLS connection over an accepted TCP stream, read and written by one thread.
pub(crate) struct TlsStream {
    sock: TcpStream,
    conn: rustls::ServerConnection,
    /// What the caller set as the read timeout: one [`Read::read`] call ends by then.
    read_timeout: Cell<Option<Duration>>,
    /// What the caller set as the send timeout: one [`Write::write`] call ends by then.
    write_timeout: Cell<Option<Duration>>,
}

impl TlsStream {
    pub(crate) fn new(sock: TcpStream, config: Arc<rustls::ServerConfig>) -> io::Result<TlsStream> {
        let mut conn = rustls::ServerConnection::new(config).map_err(io::Error::other)?;
        // A READ answer is sealed in SEAL_BYTES pieces by `write`; no need for rustls to cap.
        conn.set_buffer_limit(None);
        Ok(TlsStream {
            sock,
            conn,
            read_timeout: Cell::new(None),
            write_timeout: Cell::new(None),
        })
    }

    pub(crate) fn tcp(&self) -> &TcpStream {
        &self.sock
    }

    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.read_timeout.set(t);
        self.sock.set_read_timeout(t)
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.write_timeout.set(t);
        self.sock.set_write_timeout(t)
    }

    /// Sends every queued TLS byte (handshake messages, sealed records, alerts) by `deadline`.
    fn flush_by(&mut self, deadline: Option<Instant>) -> io::Result<()> {
        let mut shortened = false;
        let mut first = true;
        while self.conn.wants_write() {
            if let (false, Some(d)) = (first, deadline) {
                // One blocked write may take the whole timeout: the rest gets what is left.
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client did not take TLS records in time",
                    ));
                }
                self.sock.set_write_timeout(Some(left))?;
                shortened = true;
            }
            first = false;
            match self.conn.write_tls(&mut self.sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if shortened {
            self.sock.set_write_timeout(self.write_timeout.get())?;
        }
        Ok(())
    }
}

impl Read for TlsStream {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        if b.is_empty() {
            return Ok(0);
        }
        let deadline = self.read_timeout.get().map(|t| Instant::now() + t);
        let mut shortened = false;
        let r = self.read_by(b, deadline, &mut shortened);
        if shortened {
            self.sock.set_read_timeout(self.read_timeout.get())?;
        }
        r
    }
}

impl TlsStream {
    /// [`Read::read`] by `deadline`; sets `shortened` if it changed the socket's read timeout.
    fn read_by(&mut self, b: &mut [u8], deadline: Option<Instant>, shortened: &mut bool) -> io::Result<usize> {
        let mut first = true;
        loop {
            match self.conn.reader().read(b) {
                // 0: the client closed the TLS session.
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            // Handshake messages the client waits for go out before the brick waits in turn.
            self.flush_by(deadline)?;
            if let (false, Some(d)) = (first, deadline) {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "no TLS record in time"));
                }
                self.sock.set_read_timeout(Some(left))?;
                *shortened = true;
            }
            first = false;
            let n = self.conn.read_tls(&mut self.sock)?;
            if n == 0 {
                return Ok(0);
            }
            if let Err(e) = self.conn.process_new_packets() {
                // The alert that says why, if the client still listens.
                let _ = self.flush_by(deadline);
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}")));
            }
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let deadline = self.write_timeout.get().map(|t| Instant::now() + t);
        self.flush_by(deadline)?;
        let n = self.conn.writer().write(&b[..b.len().min(SEAL_BYTES)])?;
        // Bytes taken are on their way: the caller moves on (to reading the next request), so
        // they must be on the socket, not sitting in rustls.
        self.flush_by(deadline)?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_by(self.write_timeout.get().map(|t| Instant::now() + t))
    }
}
