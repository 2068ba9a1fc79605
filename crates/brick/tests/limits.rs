//! A real brick under the attacks a peer on its network can mount without a secret or a grant,
//! and the limits that hold them off: headers claiming huge payloads, floods of silent
//! connections, too many connections from one address, guessing secrets, malformed headers in
//! every connection state, and clients that stop reading. Each test also checks that a
//! legitimate client is still served and gets its data back intact. No timing assertions: only
//! that bounded things stay bounded (memory under a generous cap, waits under generous
//! deadlines) and what the brick answered and counted.

use rackmem_brick::{Brick, BrickConfig, BrickHandle, BrickLimits, GuardStats, ListenAddr};
use rackmem_proto::{
    Grant, Header, Opcode, Request, Status, HEADER_LEN, MAGIC, MAX_EXTENT_LIST, MAX_PAYLOAD, MAX_SECRET,
};
use rackmem_transport::{BrickAddr, Link, LinkError};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

const KEY: &[u8] = b"brick-key";
const SECRET: &[u8] = b"shared-secret";
const T: Duration = Duration::from_secs(10);

fn start(listen: ListenAddr, limits: BrickLimits) -> (BrickHandle, BrickAddr) {
    let h = Brick::start(BrickConfig {
        listen,
        size_bytes: 256 << 20,
        key: KEY.to_vec(),
        secret: Some(SECRET.to_vec()),
        managed: false,
        limits,
        tls: None,
    })
    .expect("brick starts");
    let a = h.local_addr().parse().expect("address");
    (h, a)
}

fn tcp(limits: BrickLimits) -> (BrickHandle, BrickAddr, String) {
    let (h, a) = start(ListenAddr::Tcp("127.0.0.1:0".into()), limits);
    let hp = h.local_addr().trim_start_matches("tcp://").to_string();
    (h, a, hp)
}

/// Waits (at most `limit`) until `ok` holds; panics with `what` otherwise.
fn wait_until(limit: Duration, what: &str, mut ok: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < end, "{what} (waited {limit:?})");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn pages(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n * 4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A legitimate client: carves a segment, writes 64 pages, reads them back and compares.
fn legitimate_round_trip(addr: &BrickAddr, seed: u64) -> Link {
    let l = Link::connect(addr, T).expect("a legitimate client connects");
    l.alloc_segment(SECRET, 4 << 20).expect("and carves a segment");
    let ext: Vec<(u64, u32)> = (0..64).map(|i| (i * 2 * 4096, 4096)).collect();
    let data = pages(64, seed);
    l.write_pages(&ext, &data).expect("write");
    let mut back = vec![0u8; data.len()];
    l.read_pages(&ext, &mut back).expect("read");
    assert_eq!(checksum(&back), checksum(&data), "the data comes back intact");
    l
}

/// A request header with any opcode byte and claimed payload length.
fn header(opcode: u8, payload_len: u32) -> Vec<u8> {
    let mut h = Header {
        opcode: Opcode::Ping,
        flags: 0,
        tag: 7,
        status: 0,
        offset: 0,
        length: 0,
        payload_len: 0,
    }
    .encode()
    .to_vec();
    h[5] = opcode;
    h[28..32].copy_from_slice(&payload_len.to_le_bytes());
    h
}

/// The responses in `all`: (opcode byte, tag, status, message).
fn responses(all: &[u8]) -> Vec<(u8, u32, u32, String)> {
    let mut out = Vec::new();
    let mut at = 0;
    while all.len() >= at + HEADER_LEN {
        let f = &all[at..];
        let len = u32::from_le_bytes([f[28], f[29], f[30], f[31]]) as usize;
        let end = (HEADER_LEN + len).min(f.len());
        out.push((
            f[5],
            u32::from_le_bytes([f[8], f[9], f[10], f[11]]),
            u32::from_le_bytes([f[12], f[13], f[14], f[15]]),
            String::from_utf8_lossy(&f[HEADER_LEN..end]).into_owned(),
        ));
        at += HEADER_LEN + len;
    }
    out
}

/// Reads until the brick closes the connection (it must, within `T`).
fn read_until_closed(s: &mut impl Read) -> Vec<u8> {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return all,
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return all,
            Err(e) => panic!("the brick did not close the connection: {e}"),
        }
    }
}

fn vm_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// HELLO then ALLOC with the right secret: what an authenticated connection starts with.
fn authenticate(size_bytes: u64) -> Vec<u8> {
    let mut v = Request::Hello.encode(1);
    v.extend(
        Request::Alloc {
            size_bytes,
            secret: SECRET.to_vec(),
        }
        .encode(2),
    );
    v
}

#[test]
fn headers_claiming_huge_payloads_allocate_nothing_and_clients_are_still_served() {
    let (h, addr, hp) = tcp(BrickLimits::default());
    let before_kib = vm_rss_kib();
    // 128 connections, no secret, each sending one 32-byte header claiming 16 MiB: half of
    // them WRITE (not allowed before authentication), half ALLOC (whose payload, a secret, is
    // at most 1 KiB). The brick used to allocate (and zero) every claimed payload: 2 GiB.
    let mut flood: Vec<TcpStream> = (0..128)
        .map(|i| {
            let mut s = TcpStream::connect(&hp).expect("connect");
            let op = if i % 2 == 0 { Opcode::Write } else { Opcode::Alloc };
            s.write_all(&header(op as u8, MAX_PAYLOAD)).expect("send the header");
            s
        })
        .collect();
    wait_until(T, "the brick refused all 128 headers", || {
        h.guard_stats().refused_headers >= 128
    });
    let grown_mib = vm_rss_kib().saturating_sub(before_kib) / 1024;
    assert!(
        grown_mib < 256,
        "128 headers claiming 16 MiB each grew this process (the brick runs in it) by {grown_mib} MiB"
    );
    for (i, s) in flood.iter_mut().enumerate() {
        s.set_read_timeout(Some(T)).expect("timeout");
        let got = responses(&read_until_closed(s));
        let (status, message) = (got[0].2, &got[0].3);
        if i % 2 == 0 {
            assert_eq!(status, Status::NotAttached.code(), "{message}");
            assert!(message.contains("before authentication"), "{message}");
        } else {
            assert_eq!(status, Status::BadRequest.code(), "{message}");
            assert!(message.contains(&format!("limit of {MAX_SECRET}")), "{message}");
        }
    }
    legitimate_round_trip(&addr, 1);
}

#[test]
fn silent_and_trickling_connections_are_cut_at_the_handshake_deadline() {
    rackmem_sys::raise_open_files_limit().expect("raise the open files limit");
    let (h, addr, hp) = tcp(BrickLimits {
        handshake_timeout: Duration::from_secs(4),
        // Every connection here comes from 127.0.0.1.
        max_connections_per_peer: 4096,
        max_connections_per_prefix: 4096,
        ..BrickLimits::default()
    });
    // 1,024 connections that never say anything: the brick used to serve at most 1,024
    // connections and keep silent ones forever, locking every client out.
    // Connected in batches the brick accepts before the next: beyond its listen backlog the
    // kernel would leave connections half-open, never reaching the brick at all.
    let mut silent: Vec<TcpStream> = Vec::new();
    while silent.len() < 1024 {
        silent.extend((0..64).map(|_| TcpStream::connect(&hp).expect("connect")));
        wait_until(T, "the brick accepts the batch", || {
            h.stats().connections + h.guard_stats().handshake_timeouts >= silent.len() as u64
        });
    }
    // And one that sends a header a byte at a time, each byte well within any per-read
    // timeout: the deadline is for the whole handshake.
    let mut trickle = TcpStream::connect(&hp).expect("connect");
    let trickler = std::thread::spawn(move || {
        let hello = Request::Hello.encode(1);
        for b in hello.iter().cycle().take(400) {
            if trickle.write_all(&[*b]).is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    });
    assert_eq!(h.guard_stats().handshake_timeouts, 0, "all 1,024 were open at once");
    // A legitimate client is served meanwhile, its data intact.
    let good = legitimate_round_trip(&addr, 2);
    wait_until(
        T * 3,
        "the silent connections were cut at the handshake deadline",
        || h.guard_stats().handshake_timeouts >= 1025,
    );
    for s in silent.iter_mut() {
        s.set_read_timeout(Some(T)).expect("timeout");
        assert!(read_until_closed(s).is_empty(), "closed without an answer");
    }
    assert!(trickler.join().expect("trickler"), "the trickling connection was cut");
    // The authenticated client outlives the deadline.
    let mut back = vec![0u8; 4096];
    good.read_pages(&[(0, 4096)], &mut back).expect("still served");
    assert_eq!(checksum(&back), checksum(&pages(64, 2)[..4096]));
    wait_until(T, "only the legitimate connection is left", || {
        h.stats().connections == 1
    });
}

#[test]
fn connections_over_the_caps_are_refused_with_the_reason() {
    let (_h, addr, _) = tcp(BrickLimits {
        max_connections_per_peer: 3,
        ..BrickLimits::default()
    });
    let mut links: Vec<Link> = (0..3).map(|_| Link::connect(&addr, T).expect("connect")).collect();
    let refusal = |r: Result<Link, LinkError>| match r {
        Err(LinkError::Unreachable { cause, .. }) => cause,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let cause = refusal(Link::connect(&addr, T));
    assert!(
        cause.contains("Busy") && cause.contains("maximum of 3 connections from 127.0.0.1"),
        "{cause}"
    );
    assert!(
        cause.contains("--max-connections-per-peer"),
        "the message says which limit: {cause}"
    );
    for l in &links {
        l.ping().expect("existing connections are still served");
    }
    links.pop();
    wait_until(T, "a slot frees when a connection closes", || {
        Link::connect(&addr, T).is_ok()
    });

    // Unix-socket peers count towards the total of authenticated connections: a third
    // connection is held while it authenticates, and told `Busy` when it tries.
    let dir = tempfile::tempdir().expect("tempdir");
    let (_u, ua) = start(
        ListenAddr::Unix(dir.path().join("b.sock")),
        BrickLimits {
            max_connections: 2,
            ..BrickLimits::default()
        },
    );
    let _a = legitimate_round_trip(&ua, 3);
    let _b = legitimate_round_trip(&ua, 4);
    let c = Link::connect(&ua, T).expect("a third connection says HELLO");
    match c.alloc_segment(SECRET, 4 << 20) {
        Err(LinkError::Refused {
            status: Status::Busy,
            message,
            ..
        }) => assert!(
            message.contains("maximum of 2 connections") && message.contains("--max-connections"),
            "{message}"
        ),
        other => panic!("expected Busy, got {other:?}"),
    }
}

/// One ALLOC with `secret` on a new connection; the answer's status and message.
fn try_secret(hp: &str, secret: &[u8]) -> (Status, String) {
    let mut s = TcpStream::connect(hp).expect("connect");
    s.set_read_timeout(Some(T * 2)).expect("timeout");
    s.write_all(
        &Request::Alloc {
            size_bytes: 1 << 20,
            secret: secret.to_vec(),
        }
        .encode(1),
    )
    .expect("send");
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).expect("an answer");
    let len = u32::from_le_bytes([h[28], h[29], h[30], h[31]]) as usize;
    let mut message = vec![0u8; len];
    s.read_exact(&mut message).expect("the answer's payload");
    let status = Status::from_u32(u32::from_le_bytes([h[12], h[13], h[14], h[15]]));
    (status, String::from_utf8_lossy(&message).into_owned())
}

#[test]
fn repeated_authentication_failures_are_slowed_then_refused_unchecked() {
    let (h, _addr, hp) = tcp(BrickLimits {
        auth_failures_free: 3,
        auth_delay: Duration::from_secs(1),
        auth_delay_max: Duration::from_secs(2),
        ..BrickLimits::default()
    });
    for _ in 0..3 {
        assert_eq!(try_secret(&hp, b"guess").0, Status::Denied);
    }
    let s = h.guard_stats();
    assert_eq!((s.auth_failures, s.auth_delayed, s.auth_throttled), (3, 0, 0), "{s:?}");
    // Eight guesses at once, on eight connections: the brick checks them one per delay, and
    // refuses unchecked those whose turn would be more than 2 s away.
    let guesses: Vec<_> = (0..8)
        .map(|i| {
            let hp = hp.clone();
            std::thread::spawn(move || try_secret(&hp, format!("guess-{i}").as_bytes()))
        })
        .collect();
    let answers: Vec<(Status, String)> = guesses.into_iter().map(|g| g.join().expect("guess")).collect();
    let denied = answers.iter().filter(|a| a.0 == Status::Denied).count() as u64;
    let busy: Vec<&String> = answers.iter().filter(|a| a.0 == Status::Busy).map(|a| &a.1).collect();
    assert_eq!(denied + busy.len() as u64, 8, "{answers:?}");
    assert!(!busy.is_empty(), "some guesses were refused unchecked: {answers:?}");
    assert!(
        busy[0].contains("too many failed authentications from 127.0.0.1"),
        "{}",
        busy[0]
    );
    let s = h.guard_stats();
    assert_eq!(s.auth_failures, 3 + denied, "only the checked guesses count: {s:?}");
    assert_eq!(s.auth_throttled, busy.len() as u64, "{s:?}");
    assert!(s.auth_delayed >= denied, "every checked guess waited its turn: {s:?}");
    // The right secret gets through once its turn comes, and forgives the address.
    let mut tries = 0;
    wait_until(T * 3, "the right secret is accepted in its turn", || {
        tries += 1;
        try_secret(&hp, SECRET).0 == Status::Ok
    });
    let delayed = h.guard_stats().auth_delayed;
    assert_eq!(try_secret(&hp, b"typo").0, Status::Denied);
    assert_eq!(
        h.guard_stats().auth_delayed,
        delayed,
        "a forgiven address is answered at once"
    );
}

/// The states a connection can be in, as the bytes that bring a new connection there.
fn states() -> Vec<(&'static str, Vec<u8>)> {
    let mut detached = authenticate(1 << 20);
    detached.extend(Request::Detach.encode(3));
    vec![
        ("new", Vec::new()),
        ("after HELLO", Request::Hello.encode(1)),
        ("attached", authenticate(1 << 20)),
        ("detached", detached),
    ]
}

#[test]
fn malformed_headers_are_refused_in_every_connection_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("b.sock");
    let (h, addr) = start(ListenAddr::Unix(path.clone()), BrickLimits::default());
    let good = legitimate_round_trip(&addr, 4);
    let mut bad_magic = header(Opcode::Ping as u8, 0);
    bad_magic[0..4].copy_from_slice(&(MAGIC ^ 0xff).to_le_bytes());
    let mut bad_version = header(Opcode::Ping as u8, 0);
    bad_version[4] = 9;
    let attach_len = (Grant::RATED_LEN + 32) as u32;
    let cases: Vec<(&str, Vec<u8>, Status)> = vec![
        ("bad magic", bad_magic, Status::BadRequest),
        ("bad version", bad_version, Status::BadVersion),
        ("unknown opcode", header(99, 0), Status::BadRequest),
        (
            "over the protocol's limit",
            header(Opcode::Write as u8, MAX_PAYLOAD + 1),
            Status::BadRequest,
        ),
        ("PING with a payload", header(Opcode::Ping as u8, 1), Status::BadRequest),
        (
            "HELLO claiming 16 MiB",
            header(Opcode::Hello as u8, MAX_PAYLOAD),
            Status::BadRequest,
        ),
        (
            "ALLOC over the secret limit",
            header(Opcode::Alloc as u8, MAX_SECRET as u32 + 1),
            Status::BadRequest,
        ),
        (
            "ATTACH over its size",
            header(Opcode::Attach as u8, attach_len + 1),
            Status::BadRequest,
        ),
    ];
    let after_auth: Vec<(&str, Vec<u8>, Status)> = vec![
        (
            "READ over an extent list",
            header(Opcode::Read as u8, MAX_EXTENT_LIST + 1),
            Status::BadRequest,
        ),
        (
            "DISCARD over its size",
            header(Opcode::Discard as u8, 9),
            Status::BadRequest,
        ),
        (
            "STATS with a payload",
            header(Opcode::Stats as u8, 4096),
            Status::BadRequest,
        ),
    ];
    let data_ops = [
        Opcode::Read,
        Opcode::Write,
        Opcode::Stats,
        Opcode::Clone,
        Opcode::Share,
        Opcode::Copy,
    ];
    for (state, prefix) in states() {
        let authenticated = state == "attached" || state == "detached";
        let mut all = cases.clone();
        if authenticated {
            all.extend(after_auth.iter().cloned());
        } else {
            for op in data_ops {
                all.push(("before authentication", header(op as u8, 24), Status::NotAttached));
            }
        }
        for (what, bytes, want) in all {
            let mut s = UnixStream::connect(&path).expect("connect");
            s.set_read_timeout(Some(T)).expect("timeout");
            s.write_all(&prefix).expect("prefix");
            s.write_all(&bytes).expect("frame");
            let got = responses(&read_until_closed(&mut s));
            let last = got.last().unwrap_or_else(|| panic!("{state}, {what}: no answer"));
            assert_eq!(
                Status::from_u32(last.2),
                want,
                "{state}, {what}: answered {:?}: {}",
                Status::from_u32(last.2),
                last.3
            );
            assert!(!last.3.is_empty(), "{state}, {what}: the refusal says why");
            // Everything before the bad frame was served.
            assert!(
                got[..got.len() - 1].iter().all(|r| r.2 == 0),
                "{state}, {what}: {got:?}"
            );
        }
    }
    // The frames refused on their header alone (the others fail to decode as a header at all).
    assert_eq!(h.guard_stats().refused_headers, 34, "{:?}", h.guard_stats());
    let mut back = vec![0u8; 4096];
    good.read_pages(&[(0, 4096)], &mut back)
        .expect("the legitimate client is still served");
    assert_eq!(checksum(&back), checksum(&pages(64, 4)[..4096]));
}

#[test]
fn idle_links_outlive_the_idle_timeout_by_keeping_alive_and_silent_ones_are_cut() {
    let (h, addr, hp) = tcp(BrickLimits {
        idle_timeout: Some(Duration::from_secs(1)),
        ..BrickLimits::default()
    });
    // A program whose working set fits its local buffer: no request for longer than the
    // brick's idle timeout, but the runtime's watchdog keeps its link alive.
    let idle = std::sync::Arc::new(legitimate_round_trip(&addr, 5));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let (idle, stop) = (idle.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut pings = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if idle.keep_alive(Duration::from_millis(200)).expect("keep-alive") {
                    pings += 1;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            pings
        })
    };
    // The same without keep-alive, and a raw authenticated connection that goes silent.
    let mute = legitimate_round_trip(&addr, 6);
    let mut raw = TcpStream::connect(&hp).expect("connect");
    raw.set_read_timeout(Some(T)).expect("timeout");
    raw.write_all(&authenticate(1 << 20)).expect("authenticate");
    wait_until(T, "the silent connections were cut after the idle timeout", || {
        h.guard_stats().idle_timeouts >= 2
    });
    let got = responses(&read_until_closed(&mut raw));
    assert_eq!(got.len(), 2, "HELLO and ALLOC answered, then closed: {got:?}");
    assert!(
        matches!(mute.ping(), Err(LinkError::BrickLost { .. })),
        "a link without keep-alive is cut"
    );
    // Three idle timeouts later the idle link still works, and its data is intact.
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(watchdog.join().expect("watchdog") >= 3, "the idle link was pinged");
    let mut back = vec![0u8; 4096];
    idle.read_pages(&[(0, 4096)], &mut back)
        .expect("the idle link still works");
    assert_eq!(checksum(&back), checksum(&pages(64, 5)[..4096]));
    let s: GuardStats = h.guard_stats();
    assert_eq!(s.idle_timeouts, 2, "{s:?}");
}

#[test]
fn a_client_that_stops_reading_is_cut_at_the_send_timeout() {
    let (h, addr, hp) = tcp(BrickLimits {
        send_timeout: Duration::from_secs(1),
        ..BrickLimits::default()
    });
    let mut s = TcpStream::connect(&hp).expect("connect");
    s.write_all(&authenticate(16 << 20)).expect("authenticate");
    // 64 reads of 8 MiB each, 512 MiB of answers, and never a byte read: the brick blocks
    // sending, and must give up after its send timeout rather than after one per write.
    let read = Request::Read(vec![(0, 8 << 20)]);
    let mut frames = Vec::new();
    for tag in 0..64 {
        frames.extend(read.encode(10 + tag));
    }
    s.write_all(&frames).expect("requests");
    wait_until(T * 2, "the brick cut the client that stopped reading", || {
        h.guard_stats().send_timeouts == 1
    });
    legitimate_round_trip(&addr, 7);
}

#[test]
fn a_burst_of_connections_beyond_the_default_backlog_reaches_the_brick() {
    // Nodes reconnecting after a restart connect all at once. With the standard library's
    // listen backlog (128), the kernel left the connections beyond it half-open: the client
    // believed itself connected, the brick never saw it. The brick queues as many as it may
    // serve, within the kernel's cap.
    rackmem_sys::raise_open_files_limit().expect("raise the open files limit");
    let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(128);
    let n = 1024.min(somaxconn);
    let (h, _addr, hp) = tcp(BrickLimits {
        max_connections_per_peer: 4096,
        ..BrickLimits::default()
    });
    let burst: Vec<TcpStream> = (0..n).map(|_| TcpStream::connect(&hp).expect("connect")).collect();
    wait_until(T, "every connection of the burst reached the brick", || {
        h.stats().connections as usize == n
    });
    drop(burst);
}
