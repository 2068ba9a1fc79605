//! `tls://` links against a real brick serving TLS with a certificate from a CA made here:
//! pages written and read back by checksum (a multi-megabyte pipelined batch, and writers and
//! readers on one link at once, so records are sealed and opened concurrently), a client that
//! does not trust the CA refused with a clear error, plain clients on either side failing
//! cleanly while the brick keeps serving. No timing assertions.

use rackmem_brick::{Brick, BrickConfig, BrickHandle, BrickLimits, ListenAddr};
use rackmem_transport::{BrickAddr, Link, LinkError, TlsClient};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

const SECRET: &[u8] = b"s3cret";
const T: Duration = Duration::from_secs(20);
const PAGE: usize = 4096;

/// A CA (its certificate, PEM) and a certificate it signs for `names`, with its key (PEM).
fn ca_and_leaf(names: &[&str]) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca_params.distinguished_name.push(DnType::CommonName, "rackmem test CA");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().expect("brick key");
    let mut p = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).expect("params");
    p.distinguished_name.push(DnType::CommonName, "brick");
    let cert = p.signed_by(&key, &issuer).expect("brick certificate");
    (ca.pem(), cert.pem(), key.serialize_pem())
}

struct Setup {
    _dir: tempfile::TempDir,
    brick: BrickHandle,
    addr: BrickAddr,
    ca_file: PathBuf,
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write PEM");
    p
}

fn tls_brick() -> Setup {
    tls_brick_with(Default::default())
}

fn tls_brick_with(limits: BrickLimits) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, cert, key) = ca_and_leaf(&["127.0.0.1", "localhost"]);
    let cert_file = write(dir.path(), "brick.pem", &cert);
    let key_file = write(dir.path(), "brick.key", &key);
    let ca_file = write(dir.path(), "ca.pem", &ca);
    let brick = Brick::start(BrickConfig {
        listen: ListenAddr::Tls("127.0.0.1:0".into()),
        size_bytes: 256 << 20,
        key: b"k".to_vec(),
        secret: Some(SECRET.to_vec()),
        managed: false,
        limits,
        tls: Some(rackmem_brick::tls_server_config(&cert_file, &key_file).expect("TLS config")),
    })
    .expect("brick starts");
    let addr: BrickAddr = brick.local_addr().parse().expect("address parses");
    assert!(matches!(addr, BrickAddr::Tls(_)), "{addr}");
    Setup {
        _dir: dir,
        brick,
        addr,
        ca_file,
    }
}

fn pages(first: u64, count: usize, round: u64) -> Vec<u8> {
    let mut v = vec![0u8; count * PAGE];
    for (i, p) in v.chunks_mut(PAGE).enumerate() {
        let mut x =
            (first + i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ round.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1;
        for b in p.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
    }
    v
}

fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn trusted(s: &Setup) -> Link {
    let ca = TlsClient::from_ca_file(&s.ca_file).expect("CA loads");
    Link::connect_with(&s.addr, T, Some(&ca)).expect("TLS link connects")
}

#[test]
fn pages_round_trip_over_tls_with_concurrent_readers_and_writers() {
    let s = tls_brick();
    let link = trusted(&s);
    let seg = link.alloc_segment(SECRET, 64 << 20).expect("alloc");
    // 24 MiB in one call: several batches of up to MAX_BATCH_BYTES, all pipelined, each sealed
    // in pieces while the brick answers.
    let big_pages = 6144;
    let data = pages(0, big_pages, 1);
    let ext = [(0u64, (big_pages * PAGE) as u32)];
    link.write_pages(&ext, &data).expect("big write");
    let mut back = vec![0u8; data.len()];
    link.read_pages(&ext, &mut back).expect("big read");
    assert_eq!(checksum(&back), checksum(&data), "24 MiB read back over TLS differs");

    // Writers and readers on the same link at once: one thread rewrites the first half while
    // others read the second half, then every page is checked.
    let half = big_pages / 2;
    let fresh = pages(0, half, 2);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for (i, chunk) in fresh.chunks(64 * PAGE).enumerate() {
                let off = (i * 64 * PAGE) as u64;
                link.write_pages(&[(off, chunk.len() as u32)], chunk)
                    .expect("concurrent write");
            }
        });
        for r in 0..2u64 {
            let link = &link;
            let data = &data;
            sc.spawn(move || {
                for i in 0..(half / 64) {
                    let page = half + i * 64;
                    let mut got = vec![0u8; 64 * PAGE];
                    let off = (page * PAGE) as u64;
                    let t = link.submit_read(&[(off, got.len() as u32)]).expect("submit read");
                    t.wait(&mut got).expect("concurrent read");
                    let want = &data[page * PAGE..(page + 64) * PAGE];
                    assert_eq!(checksum(&got), checksum(want), "reader {r}: pages at {page} differ");
                }
            });
        }
    });
    let mut all = vec![0u8; data.len()];
    link.read_pages(&ext, &mut all).expect("final read");
    assert_eq!(
        checksum(&all[..half * PAGE]),
        checksum(&fresh),
        "rewritten half differs"
    );
    assert_eq!(
        checksum(&all[half * PAGE..]),
        checksum(&data[half * PAGE..]),
        "untouched half differs"
    );

    // A second link attaches with the grant over its own TLS connection and sees the data.
    let other = trusted(&s);
    other.attach(&seg.grant, &seg.session_key).expect("attach over TLS");
    let mut first = vec![0u8; 16 * PAGE];
    other.read_pages(&[(0, first.len() as u32)], &mut first).expect("read");
    assert_eq!(checksum(&first), checksum(&fresh[..16 * PAGE]));
    // Descriptors cannot cross TLS: shared memory is refused before anything is sent.
    let Err(e) = other.share() else {
        panic!("SHARE over TLS must fail")
    };
    assert!(matches!(e, LinkError::Invalid { .. }), "{e}");
    assert!(!other.is_broken());
    other.ping().expect("the link still works");
}

#[test]
fn a_client_that_does_not_trust_the_ca_is_refused() {
    let s = tls_brick();
    let (other_ca, _, _) = ca_and_leaf(&["127.0.0.1"]);
    let stranger = TlsClient::from_ca_pem(other_ca.as_bytes()).expect("CA loads");
    let e = Link::connect_with(&s.addr, T, Some(&stranger)).expect_err("untrusted certificate accepted");
    let text = e.to_string();
    assert!(matches!(e, LinkError::Unreachable { .. }), "{text}");
    assert!(text.contains("not trusted") && text.contains("--tls-ca"), "{text}");
    // No CA at all: refused before connecting, with what to do.
    let e = Link::connect_with(&s.addr, T, None).expect_err("tls:// without a CA");
    assert!(matches!(e, LinkError::TlsSetup { .. }), "{e}");
    assert!(e.to_string().contains("RACKMEM_TLS_CA"), "{e}");
    // A certificate for another name: refused too.
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, cert, key) = ca_and_leaf(&["elsewhere.example"]);
    let brick = Brick::start(BrickConfig {
        listen: ListenAddr::Tls("127.0.0.1:0".into()),
        size_bytes: 16 << 20,
        key: b"k".to_vec(),
        secret: Some(SECRET.to_vec()),
        managed: false,
        limits: Default::default(),
        tls: Some(
            rackmem_brick::tls_server_config(&write(dir.path(), "c.pem", &cert), &write(dir.path(), "k.pem", &key))
                .expect("TLS config"),
        ),
    })
    .expect("brick starts");
    let addr: BrickAddr = brick.local_addr().parse().expect("address");
    let ca = TlsClient::from_ca_pem(ca.as_bytes()).expect("CA loads");
    let e = Link::connect_with(&addr, T, Some(&ca)).expect_err("certificate for another name accepted");
    assert!(e.to_string().contains("not trusted"), "{e}");
    // The first brick still serves a trusted client.
    trusted(&s).ping().expect("trusted client served");
}

#[test]
fn plain_clients_fail_cleanly_and_the_brick_keeps_serving() {
    let s = tls_brick();
    // A plain TCP link to the TLS port: its HELLO is not a TLS record; the brick answers with
    // an alert and closes, and the link reports the brick unreachable (within its timeout).
    let BrickAddr::Tls(hp) = &s.addr else { unreachable!() };
    let plain: BrickAddr = format!("tcp://{hp}").parse().expect("address");
    let e = Link::connect(&plain, T).expect_err("plain TCP accepted by a TLS brick");
    assert!(matches!(e, LinkError::Unreachable { .. }), "{e}");
    // The brick keeps serving TLS clients, data and all.
    let link = trusted(&s);
    link.alloc_segment(SECRET, 8 << 20).expect("alloc");
    let data = pages(0, 8, 3);
    link.write_pages(&[(0, data.len() as u32)], &data).expect("write");
    let mut back = vec![0u8; data.len()];
    link.read_pages(&[(0, back.len() as u32)], &mut back).expect("read");
    assert_eq!(checksum(&back), checksum(&data));

    // A TLS client to a plain brick learns that it serves tcp://, not tls://.
    let plain_brick = Brick::start(BrickConfig {
        listen: ListenAddr::Tcp("127.0.0.1:0".into()),
        size_bytes: 16 << 20,
        key: b"k".to_vec(),
        secret: Some(SECRET.to_vec()),
        managed: false,
        limits: Default::default(),
        tls: None,
    })
    .expect("brick starts");
    let hp = plain_brick.local_addr().trim_start_matches("tcp://").to_string();
    let as_tls: BrickAddr = format!("tls://{hp}").parse().expect("address");
    let ca = TlsClient::from_ca_file(&s.ca_file).expect("CA loads");
    let e = Link::connect_with(&as_tls, T, Some(&ca)).expect_err("TLS to a plain brick");
    assert!(e.to_string().contains("serves tcp://"), "{e}");
}

#[test]
fn tls_handshakes_count_toward_the_caps_and_end_by_the_handshake_deadline() {
    // Connections still authenticating are held apart from authenticated ones; the cap per
    // address applies to them.
    let s = tls_brick_with(BrickLimits {
        max_connections_per_peer: 2,
        handshake_timeout: Duration::from_secs(1),
        ..BrickLimits::default()
    });
    let BrickAddr::Tls(hp) = &s.addr else { unreachable!() };
    // One peer stalls inside its ClientHello (a record header promising 512 bytes), another
    // says nothing at all: both hold a connection slot.
    let mut stalled = TcpStream::connect(hp).expect("connect");
    stalled
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00])
        .expect("partial record");
    let mut silent = TcpStream::connect(hp).expect("connect");
    // A link over the cap learns why, although the refusal is not TLS.
    let ca = TlsClient::from_ca_file(&s.ca_file).expect("CA loads");
    let e = loop {
        // The acceptor may not have counted both stalled peers yet.
        match Link::connect_with(&s.addr, T, Some(&ca)) {
            Ok(l) => drop(l),
            Err(e) => break e,
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        e.to_string().contains("refused the connection") && e.to_string().contains("Busy"),
        "{e}"
    );
    // Both stalled peers are cut at the handshake deadline (the test waits at most T).
    for (name, sock) in [("stalled", &mut stalled), ("silent", &mut silent)] {
        sock.set_read_timeout(Some(T)).expect("timeout");
        let mut b = [0u8; 64];
        let ended = loop {
            match sock.read(&mut b) {
                Ok(0) | Err(_) => break true,
                // An alert or anything else the brick says first.
                Ok(_) => continue,
            }
        };
        assert!(ended, "{name} peer not cut");
    }
    assert!(
        s.brick.guard_stats().handshake_timeouts >= 2,
        "{:?}",
        s.brick.guard_stats()
    );
    // Their slots are free again: a trusted link is served.
    let link = loop {
        if let Ok(l) = Link::connect_with(&s.addr, T, Some(&ca)) {
            break l;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    link.ping().expect("served after the stalled peers were cut");
}
