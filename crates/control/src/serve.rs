//! The control plane's accept loop: HTTP/1.1 over TCP or TLS, with a limit on everything a
//! client can hold.
//!
//! `axum::serve` has no header timeout, no connection cap and no TLS; a few hundred silent
//! connections starved it of descriptors and `/healthz` stopped answering. This loop serves
//! the same router through hyper with:
//!
//! - a cap on open connections, total, per peer address and per network (IPv4 /24, IPv6 /64
//!   by default: 16 loopback addresses with 40 idle connections each held all 512 slots when
//!   only addresses were counted), checked at accept (a refused connection is closed at once,
//!   before any byte is read);
//! - a header timeout: a connection must send a whole request head within it, counted from
//!   the connection's start or the end of its previous response, so silent and slow-header
//!   (slowloris) connections are closed;
//! - a request timeout around each request (body included): a slow body gets `408`;
//! - TLS when configured, the handshake bounded by the header timeout, with optional client
//!   certificates that stand for a principal ([`crate::auth::certificate_principal`]).

use crate::auth::{certificate_principal, AuthError, Principal};
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What one control plane lets its clients hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Open connections at most (beyond: closed at accept).
    pub max_connections: usize,
    /// Open connections from one IP address at most.
    pub max_connections_per_peer: usize,
    /// Open connections from the addresses of one network ([`HttpLimits::peer_prefix`]) at
    /// most: rotating source addresses within a network does not lift the per-address cap.
    pub max_connections_per_prefix: usize,
    /// How addresses are grouped into networks (IPv4 /24 and IPv6 /64 by default).
    pub peer_prefix: rackmem_sys::PrefixLen,
    /// Time to send a whole request head (and the TLS handshake), from the connection's start
    /// or the end of the previous response: also the idle timeout of kept-alive connections.
    pub header_timeout: Duration,
    /// Time to receive a request's body and answer it.
    pub request_timeout: Duration,
}

impl Default for HttpLimits {
    /// 512 connections, 64 per address and 128 per /24 (/64), 10 s for a request head, 30 s
    /// for a request.
    fn default() -> Self {
        HttpLimits {
            max_connections: 512,
            max_connections_per_peer: 64,
            max_connections_per_prefix: 128,
            peer_prefix: rackmem_sys::PrefixLen::default(),
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// HTTPS: the server's certificate chain and key (PEM), and optionally the CA whose client
/// certificates stand for principals.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// Certificate chain, PEM.
    pub cert: PathBuf,
    /// Private key, PEM.
    pub key: PathBuf,
    /// CA of client certificates (PEM); `None`: clients authenticate with tokens only.
    pub client_ca: Option<PathBuf>,
}

/// Why TLS cannot be set up.
#[derive(Debug, thiserror::Error)]
#[error("TLS: {0}")]
pub struct TlsError(pub String);

/// Counters of the accept loop, for `/metrics`.
#[derive(Debug, Default)]
pub struct ConnStats {
    /// Connections open now.
    pub open: AtomicUsize,
    /// Connections closed at accept because a cap was reached.
    pub refused: AtomicU64,
    /// TLS handshakes that failed or timed out.
    pub tls_failures: AtomicU64,
}

/// The rustls server configuration of `files`.
pub fn tls_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(Iterator::collect)
        .map_err(|e| TlsError(format!("reading the certificate {}: {e}", files.cert.display())))?;
    if certs.is_empty() {
        return Err(TlsError(format!("{} holds no certificate", files.cert.display())));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| TlsError(format!("reading the private key {}: {e}", files.key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(e.to_string()))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca)
                .map_err(|e| TlsError(format!("reading the client CA {}: {e}", ca.display())))?
            {
                let c = c.map_err(|e| TlsError(format!("reading the client CA {}: {e}", ca.display())))?;
                roots
                    .add(c)
                    .map_err(|e| TlsError(format!("the client CA {}: {e}", ca.display())))?;
            }
            // Optional: clients without a certificate authenticate with a token instead.
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError(format!("the client CA {}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| TlsError(format!("{} and {}: {e}", files.cert.display(), files.key.display())))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The principal a verified client certificate names (subject CN `ROLE:NAME`).
fn peer_principal(certs: Option<&[rustls_pki_types::CertificateDer<'_>]>) -> Option<Result<Principal, AuthError>> {
    let leaf = certs?.first()?;
    let cn = match x509_parser::parse_x509_certificate(leaf.as_ref()) {
        Ok((_, cert)) => cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok().map(str::to_string))
            .unwrap_or_default(),
        Err(_) => String::new(),
    };
    Some(certificate_principal(&cn))
}

/// Open connections per peer address and per network.
#[derive(Default)]
struct PeerCounts {
    per_peer: HashMap<IpAddr, usize>,
    per_prefix: HashMap<IpAddr, usize>,
}

/// One open connection's place under the caps; released on drop.
struct Slot {
    ip: IpAddr,
    net: IpAddr,
    counts: Arc<Mutex<PeerCounts>>,
    stats: Arc<ConnStats>,
}

impl Slot {
    fn take(ip: IpAddr, limits: &HttpLimits, counts: &Arc<Mutex<PeerCounts>>, stats: &Arc<ConnStats>) -> Option<Slot> {
        let net = limits.peer_prefix.prefix_of(ip);
        let mut m = counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let total = stats.open.load(Ordering::Relaxed);
        let mine = m.per_peer.get(&ip).copied().unwrap_or(0);
        let ours = m.per_prefix.get(&net).copied().unwrap_or(0);
        if total >= limits.max_connections
            || mine >= limits.max_connections_per_peer
            || ours >= limits.max_connections_per_prefix
        {
            return None;
        }
        m.per_peer.insert(ip, mine + 1);
        m.per_prefix.insert(net, ours + 1);
        stats.open.fetch_add(1, Ordering::Relaxed);
        Some(Slot {
            ip,
            net,
            counts: counts.clone(),
            stats: stats.clone(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut m = self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let m = &mut *m;
        for (map, k) in [(&mut m.per_peer, self.ip), (&mut m.per_prefix, self.net)] {
            if let Some(n) = map.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&k);
                }
            }
        }
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Descriptors kept free of connections: the store, etcd clients, logs, the blocking pool.
const RESERVED_DESCRIPTORS: usize = 64;

/// The soft limit on open files of this process, from `/proc/self/limits`.
fn open_files_limit() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

/// `limits` with the connection cap lowered under the descriptor limit: past it, accept fails
/// and every client, the health check included, waits.
pub fn fit_to_descriptors(mut limits: HttpLimits) -> HttpLimits {
    if let Some(n) = open_files_limit() {
        let room = n.saturating_sub(RESERVED_DESCRIPTORS).max(1);
        if limits.max_connections > room {
            tracing::warn!(
                "at most {room} connections: the open-file limit is {n} (raise it with ulimit -n to allow \
                 the {} asked for)",
                limits.max_connections
            );
            limits.max_connections = room;
        }
    }
    limits.max_connections_per_peer = limits.max_connections_per_peer.min(limits.max_connections);
    limits.max_connections_per_prefix = limits.max_connections_per_prefix.min(limits.max_connections);
    limits
}

/// Serves `router` on `listener` until `shutdown` fires, then lets requests in flight finish
/// (at most the request timeout).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: HttpLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
    stats: Arc<ConnStats>,
    shutdown: tokio::sync::oneshot::Receiver<()>,
) {
    let limits = fit_to_descriptors(limits);
    let per_peer = Arc::new(Mutex::new(PeerCounts::default()));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let mut conns = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            // Reap finished connections so the set does not grow.
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors, or the peer left before accept: neither is fatal.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(slot) = Slot::take(peer.ip(), &limits, &per_peer, &stats) else {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (router, acceptor, stats, stop_rx) = (router.clone(), acceptor.clone(), stats.clone(), stop_rx.clone());
        conns.spawn(async move {
            let _slot = slot;
            match acceptor {
                None => serve_connection(stream, None, router, limits, stop_rx).await,
                Some(acc) => match tokio::time::timeout(limits.header_timeout, acc.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        let who = peer_principal(tls.get_ref().1.peer_certificates());
                        serve_connection(tls, who, router, limits, stop_rx).await;
                    }
                    _ => {
                        stats.tls_failures.fetch_add(1, Ordering::Relaxed);
                    }
                },
            }
        });
    }
    let _ = stop_tx.send(true);
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(limits.request_timeout, drain).await.is_err() {
        conns.abort_all();
    }
}

async fn serve_connection<IO>(
    io: IO,
    who: Option<Result<Principal, AuthError>>,
    router: axum::Router,
    limits: HttpLimits,
    mut stop: tokio::sync::watch::Receiver<bool>,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tower::ServiceExt as _;
    let svc = router.map_request(move |mut req: axum::http::Request<hyper::body::Incoming>| {
        match &who {
            Some(Ok(p)) => {
                req.extensions_mut().insert(p.clone());
            }
            Some(Err(e)) => {
                req.extensions_mut().insert(e.clone());
            }
            None => {}
        }
        req.map(axum::body::Body::new)
    });
    let svc = hyper_util::service::TowerToHyperService::new(svc);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(64 << 10)
        .keep_alive(true);
    let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(io), svc);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = async { let _ = stop.wait_for(|s| *s).await; } => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}
