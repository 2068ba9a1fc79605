//! Making a link: resolving and connecting (with the TLS handshake for `tls://`), setting the
//! socket's timeouts, and HELLO, which brings the brick's description and this connection's
//! nonce.

use crate::addr::BrickAddr;
use crate::error::LinkError;
use crate::limits::SEND_SLICE;
use crate::link::{Link, RxState};
use crate::socket::{RxSock, Sock, TlsIn, Tx};
use crate::tls::{self, TlsClient, TLS_CA_ENV};
use rackmem_proto::{BrickInfo, Request, MAX_PAYLOAD, NONCE_LEN};
use std::io::BufReader;
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

impl Link {
    /// Connects, says HELLO and returns the link. `timeout` bounds the connection attempt (with
    /// its TLS handshake) and, from then on, every wait on this link (see [`DEFAULT_TIMEOUT`](crate::DEFAULT_TIMEOUT)).
    /// A `tls://` brick is verified against the CA file named by [`TLS_CA_ENV`]; use
    /// [`Link::connect_with`] to give the CA explicitly.
    pub fn connect(addr: &BrickAddr, timeout: Duration) -> Result<Link, LinkError> {
        let tls = match addr {
            BrickAddr::Tls(_) => match TlsClient::from_env() {
                Some(Ok(t)) => Some(t),
                Some(Err(reason)) => {
                    return Err(LinkError::TlsSetup {
                        addr: addr.to_string(),
                        reason,
                    })
                }
                None => None,
            },
            _ => None,
        };
        Self::connect_with(addr, timeout, tls.as_ref())
    }

    /// As [`Link::connect`], with the CA certificates that a `tls://` brick's certificate must
    /// chain to (ignored for other addresses). A `tls://` address without `tls` fails with
    /// [`LinkError::TlsSetup`]: a link never falls back to an unverified or plain connection.
    pub fn connect_with(addr: &BrickAddr, timeout: Duration, tls: Option<&TlsClient>) -> Result<Link, LinkError> {
        let text = addr.to_string();
        let unreachable = |cause: String| LinkError::Unreachable {
            addr: text.clone(),
            cause,
        };
        let started = Instant::now();
        let emulator = crate::emulate::Emulator::from_env().map_err(|reason| LinkError::Emulation {
            addr: text.clone(),
            reason,
        })?;
        let client = match (addr, tls) {
            (BrickAddr::Tls(_), None) => {
                return Err(LinkError::TlsSetup {
                    addr: text.clone(),
                    reason: format!(
                        "no CA to verify the brick's certificate with: set {TLS_CA_ENV} (or --tls-ca) to the \
                         PEM file of the CA that signed it"
                    ),
                })
            }
            (BrickAddr::Tls(_), Some(t)) => Some(t),
            _ => None,
        };
        let mut tls_conn = None;
        let sock = match addr {
            BrickAddr::Tcp(a) | BrickAddr::Tls(a) => {
                let sa = a
                    .to_socket_addrs()
                    .map_err(|e| unreachable(format!("cannot resolve: {e}")))?
                    .next()
                    .ok_or_else(|| unreachable("the name resolves to no address".into()))?;
                let s = TcpStream::connect_timeout(&sa, timeout).map_err(|e| unreachable(e.to_string()))?;
                s.set_nodelay(true).map_err(|e| unreachable(e.to_string()))?;
                if let Some(client) = client {
                    s.set_read_timeout(Some(timeout))
                        .and_then(|()| s.set_write_timeout(Some(timeout)))
                        .map_err(|e| unreachable(e.to_string()))?;
                    let conn = tls::handshake(client, a, &s, started + timeout).map_err(&unreachable)?;
                    tls_conn = Some(Arc::new(Mutex::new(conn)));
                }
                Sock::Tcp(s)
            }
            BrickAddr::Unix(p) => Sock::Unix(UnixStream::connect(p).map_err(|e| unreachable(e.to_string()))?),
        };
        // SO_RCVTIMEO and SO_SNDTIMEO belong to the socket, shared by the clones below.
        sock.set_timeouts(timeout, SEND_SLICE)
            .map_err(|e| unreachable(e.to_string()))?;
        let tx = sock.try_clone().map_err(|e| unreachable(e.to_string()))?;
        let control = sock.try_clone().map_err(|e| unreachable(e.to_string()))?;
        let received_fds = Arc::new(Mutex::new(Vec::new()));
        let mut link = Link {
            addr: addr.clone(),
            addr_text: text.clone(),
            info: BrickInfo {
                pool_bytes: 0,
                free_bytes: 0,
                page_size: rackmem_proto::PAGE_SIZE,
                max_payload: MAX_PAYLOAD,
                brick_id: 0,
                nonce: [0; NONCE_LEN],
            },
            timeout,
            tx: Mutex::new(Tx {
                sock: tx,
                sealed: Vec::new(),
            }),
            tls: tls_conn.clone(),
            rx_sock: Mutex::new(BufReader::with_capacity(
                256 << 10,
                RxSock {
                    sock,
                    spin: Duration::ZERO,
                    spin_choice: crate::spin::SpinChoice::for_peer(&text),
                    fds: received_fds.clone(),
                    deadline: None,
                    tls: tls_conn,
                    tls_in: TlsIn::default(),
                },
            )),
            rx: Mutex::new(RxState::default()),
            rx_cv: Condvar::new(),
            unread: AtomicI64::new(0),
            next_tag: AtomicU32::new(1),
            broken: OnceLock::new(),
            control,
            received_fds,
            share_lock: Mutex::new(()),
            born: Instant::now(),
            last_sent_ms: AtomicU64::new(0),
            emulator: None,
        };
        let r = link
            .call(&Request::Hello)
            .map_err(|e| unreachable(format!("no HELLO answer: {e}")))?;
        link.info = BrickInfo::decode(&r).map_err(|e| {
            if r.len() == BrickInfo::LEN - NONCE_LEN {
                unreachable(
                    "the brick predates per-connection nonces (grants with proof of possession): upgrade it".into(),
                )
            } else {
                unreachable(format!("bad HELLO answer: {e}"))
            }
        })?;
        link.emulator = emulator;
        Ok(link)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::DEFAULT_TIMEOUT;
    use crate::sync::lock;

    /// Both ends change keys mid-stream (TLS 1.3 KeyUpdate, which rustls also does by itself
    /// before a key's confidentiality limit): the node asks, the brick answers with its own,
    /// which the link's reader opens between responses; pages still round-trip.
    #[test]
    fn a_tls_key_update_mid_stream_keeps_the_link_working() {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};
        let ca_key = KeyPair::generate().expect("key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let ca = ca_params.self_signed(&ca_key).expect("CA");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
            .expect("params")
            .signed_by(&key, &issuer)
            .expect("certificate");
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert_file, key_file) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&cert_file, cert.pem()).expect("write");
        std::fs::write(&key_file, key.serialize_pem()).expect("write");
        let brick = rackmem_brick::Brick::start(rackmem_brick::BrickConfig {
            listen: rackmem_brick::ListenAddr::Tls("127.0.0.1:0".into()),
            size_bytes: 64 << 20,
            key: b"k".to_vec(),
            secret: Some(b"s".to_vec()),
            managed: false,
            limits: Default::default(),
            tls: Some(rackmem_brick::tls_server_config(&cert_file, &key_file).expect("config")),
        })
        .expect("brick");
        let addr: BrickAddr = brick.local_addr().parse().expect("address");
        let trust = TlsClient::from_ca_pem(ca.pem().as_bytes()).expect("CA");
        let link = Link::connect_with(&addr, DEFAULT_TIMEOUT, Some(&trust)).expect("link");
        link.alloc_segment(b"s", 8 << 20).expect("alloc");
        let page = |round: u8| (0..4096 * 64).map(|i| (i as u8) ^ round).collect::<Vec<u8>>();
        for round in 0..4u8 {
            let conn = link.tls.as_ref().expect("a TLS link");
            lock(conn).refresh_traffic_keys().expect("key update");
            let data = page(round);
            link.write_pages(&[(0, data.len() as u32)], &data)
                .expect("write after a key update");
            let mut back = vec![0u8; data.len()];
            link.read_pages(&[(0, back.len() as u32)], &mut back)
                .expect("read after a key update");
            assert!(back == data, "round {round}: pages differ after a key update");
        }
        assert!(!link.is_broken());
    }
}
