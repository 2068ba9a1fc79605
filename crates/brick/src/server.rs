//! Starting and stopping a brick: binding its listen address, spawning the acceptor, and the
//! handles that stop it, wait for it and manage its segments from other threads.

use crate::accept::Listener;
use crate::config::{BrickConfig, ListenAddr, DEFAULT_SPIN_US};
use crate::error::BrickError;
use crate::guard::{Guard, GuardStats};
use crate::handshake::{accept_loop, fit_handshakes};
use crate::pool::{Store, CHUNK};
use crate::state::{Counters, Shared};
use crate::sync::lock;
use rackmem_proto::BrickStats;
use std::collections::HashMap;
use std::io;
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// What a heartbeat thread needs of a running brick: its statistics, and the segment list the
/// control plane sends back (see [`BrickHandle::retain_segments_as_of`]).
#[derive(Clone)]
pub struct BrickManager(Arc<Shared>);

impl BrickManager {
    /// The brick's metrics as Prometheus exposition text (what `rackmem brick --metrics`
    /// serves): pool, segments, traffic, what the guard refused, latency per opcode.
    pub fn metrics_text(&self) -> String {
        let s = &self.0;
        crate::metrics::render(
            s.cfg.size_bytes,
            &s.stats(),
            &s.guard.counters.snapshot(),
            &s.pacer.stats(),
            &s.requests,
        )
    }

    /// Statistics so far.
    pub fn stats(&self) -> BrickStats {
        self.0.stats()
    }

    /// See [`BrickHandle::retain_segments_as_of`].
    pub fn retain_segments_as_of(&self, keep: &[(u64, u64, u64)], listed_at: Instant) -> Vec<u64> {
        self.0.store.retain(keep, listed_at)
    }

    /// See [`BrickHandle::set_rates_as_of`].
    pub fn set_rates_as_of(&self, rates: &[(u64, u64)], listed_at: Instant) {
        self.0.pacer.set_rates(rates, listed_at);
    }

    /// See [`BrickHandle::pace_stats`].
    pub fn pace_stats(&self) -> crate::PaceStats {
        self.0.pacer.stats()
    }

    /// Sets the brick's total rate (bytes/s; 0: unpaced), as the control plane's heartbeat
    /// replies carry it: an operator's rate reaches the brick's own pacing, not only its
    /// segments' grants.
    pub fn set_serve_rate(&self, serve_bps: u64) {
        self.0.pacer.set_total(serve_bps);
    }

    /// Applies the moves of a control plane's heartbeat reply (`docs/migration.md`, "Named
    /// segments"): segments `frozen` answer `Moving` and `moved` ones `Moved` to node requests,
    /// without executing them (every other segment is served as usual again), and `pulls` run
    /// here, each on a thread of its own. Freezing waits for the requests under way on the
    /// segment; a segment a process on this host maps is not frozen but reported unmovable.
    pub fn apply_moves(&self, frozen: &[u64], moved: &[u64], pulls: Vec<crate::PullSpec>) {
        crate::moving::apply(&self.0, frozen, moved, pulls);
    }

    /// What the next heartbeat reports of moves: segments frozen now, those that cannot be,
    /// and the pulls that ended (reported until a reply stops listing them).
    pub fn move_report(&self) -> crate::MoveReport {
        crate::moving::report(&self.0)
    }
}

/// A running brick. Dropping it stops the brick, as [`BrickHandle::shutdown`] does.
pub struct BrickHandle {
    shared: Arc<Shared>,
    addr: String,
    acceptor: Option<JoinHandle<()>>,
    unix_path: Option<PathBuf>,
}

/// Stops a brick from another thread (a signal handler's thread, a test): cheap to clone.
#[derive(Clone)]
pub struct BrickStopper(Arc<Shared>);

impl BrickStopper {
    /// Asks the brick to stop; [`BrickHandle::wait`] then returns.
    pub fn stop(&self) {
        self.0.request_stop();
    }
}

/// Starts bricks.
pub struct Brick;

impl Brick {
    /// Binds the listen address, spawns the acceptor and returns. A Unix socket file left by a
    /// brick that died is replaced; one that still answers is [`BrickError::InUse`].
    pub fn start(cfg: BrickConfig) -> Result<BrickHandle, BrickError> {
        if cfg.size_bytes < CHUNK {
            return Err(BrickError::Size(cfg.size_bytes));
        }
        let mut rnd = [0u8; 16];
        // Without OS randomness ids merely become predictable, which grants do not rely on.
        let _ = getrandom::fill(&mut rnd);
        let brick_id = u64::from_le_bytes([rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]]);
        let first_segment = u64::from(u32::from_le_bytes([rnd[8], rnd[9], rnd[10], rnd[11]])) << 32 | 1;
        let shown = cfg.listen.to_string();
        let bind_err = |e: io::Error| match e.kind() {
            io::ErrorKind::AddrInUse => BrickError::InUse(shown.clone()),
            _ => BrickError::Bind {
                addr: shown.clone(),
                err: e,
            },
        };
        match (&cfg.listen, &cfg.tls) {
            (ListenAddr::Tls(_), None) => {
                return Err(BrickError::Tls(format!(
                    "{shown} needs a certificate and its key (--tls-cert, --tls-key)"
                )))
            }
            (ListenAddr::Tcp(_) | ListenAddr::Unix(_), Some(_)) => {
                return Err(BrickError::Tls(format!(
                    "a certificate was given, but {shown} is not a tls:// address"
                )))
            }
            _ => {}
        }
        let (listener, addr, unix_path) = match &cfg.listen {
            ListenAddr::Tls(a) => {
                let l = TcpListener::bind(a).map_err(bind_err)?;
                let local = l.local_addr().map_err(bind_err)?;
                (Listener::Tcp(l), format!("tls://{local}"), None)
            }
            ListenAddr::Tcp(a) => {
                let l = TcpListener::bind(a).map_err(bind_err)?;
                let local = l.local_addr().map_err(bind_err)?;
                (Listener::Tcp(l), format!("tcp://{local}"), None)
            }
            ListenAddr::Unix(p) => {
                if let Ok(meta) = std::fs::symlink_metadata(p) {
                    if !meta.file_type().is_socket() {
                        return Err(BrickError::NotASocket(shown));
                    }
                    // A socket file nobody answers on is stale (a brick that was killed).
                    if UnixStream::connect(p).is_ok() {
                        return Err(BrickError::InUse(shown));
                    }
                    let _ = std::fs::remove_file(p);
                }
                let l = UnixListener::bind(p).map_err(bind_err)?;
                (Listener::Unix(l), shown.clone(), Some(p.clone()))
            }
        };
        // The standard library listens with a backlog of 128: a burst of connections beyond it
        // (nodes reconnecting after a restart, or a flood) would be left half-open by the
        // kernel, never reaching the acceptor. Queue as many as the brick may serve.
        let fd = match &listener {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Unix(l) => l.as_fd(),
        };
        let backlog = cfg.limits.max_connections.max(cfg.limits.max_handshakes);
        let _ = rackmem_sys::set_listen_backlog(fd, backlog.min(65_535) as u32);
        let spin_us = std::env::var("RACKMEM_BRICK_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_SPIN_US);
        // Each authenticated connection holds two descriptors (its stream and the handle that
        // shuts it down at stop), one still authenticating one: allow what the limits need, as
        // far as the hard limit goes, and hold fewer handshakes if it does not go that far.
        let open_files = rackmem_sys::raise_open_files_limit().ok();
        let max_handshakes = fit_handshakes(&cfg.limits, open_files);
        let shared = Arc::new(Shared {
            spin_us,
            guard: Guard::new(cfg.limits.clone()),
            pacer: crate::pace::Pacer::new(cfg.limits.serve_bps),
            store: Store::new(cfg.size_bytes, first_segment),
            cfg,
            counters: Counters::default(),
            requests: crate::metrics::RequestMetrics::default(),
            stop: AtomicBool::new(false),
            bell: rackmem_sys::Doorbell::new().map_err(BrickError::Thread)?,
            stop_lock: Mutex::new(()),
            stopped_cv: Condvar::new(),
            conns: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
            brick_id,
            names: Default::default(),
            pull_links: Default::default(),
            moves: Default::default(),
        });
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("brick-accept".into())
            .spawn(move || accept_loop(s, listener, max_handshakes))
            .map_err(BrickError::Thread)?;
        Ok(BrickHandle {
            shared,
            addr,
            acceptor: Some(acceptor),
            unix_path,
        })
    }
}

impl BrickHandle {
    /// The address clients use (`tcp://127.0.0.1:PORT` or `unix:PATH`), in the form
    /// `rackmem_transport::BrickAddr` parses.
    pub fn local_addr(&self) -> String {
        self.addr.clone()
    }

    /// Counters now.
    pub fn stats(&self) -> BrickStats {
        self.shared.stats()
    }

    /// What pacing did so far: the total rate, requests delayed, and per segment its rate, bytes
    /// and requests served and requests delayed.
    pub fn pace_stats(&self) -> crate::PaceStats {
        self.shared.pacer.stats()
    }

    /// Sets the rates of managed segments (`(segment id, bytes/s)`, 0: unpaced but for the
    /// brick's total), as a control plane's heartbeat reply sent at `listed_at` lists them;
    /// segments it does not list and that are older than it are forgotten.
    pub fn set_rates_as_of(&self, rates: &[(u64, u64)], listed_at: Instant) {
        self.shared.pacer.set_rates(rates, listed_at);
    }

    /// What the brick refused or cut so far (connections over its limits, timeouts, refused
    /// headers, authentication failures and how they were slowed down).
    pub fn guard_stats(&self) -> GuardStats {
        self.shared.guard.counters.snapshot()
    }

    /// The brick's metrics as Prometheus exposition text ([`BrickManager::metrics_text`]).
    pub fn metrics_text(&self) -> String {
        self.manager().metrics_text()
    }

    /// A handle that stops this brick from another thread.
    pub fn stopper(&self) -> BrickStopper {
        BrickStopper(self.shared.clone())
    }

    /// Managed mode: releases every managed segment that `keep` does not list as exactly
    /// `(segment_id, brick_offset, size_bytes)` (the control plane's heartbeat answer), and
    /// returns the ids released. A released segment's memory is discarded and its range returned
    /// to the free list once requests in flight on it finish; connections still attached to it
    /// stay open, but their data requests fail with `NoSegment` (and close the connection). Its
    /// grant, while unexpired, would create an empty segment again if its range is still free,
    /// which the next list releases in turn: control planes should give grants an expiry.
    ///
    /// Segments created from grants after the list was drawn up are released too; a heartbeat
    /// should call [`BrickHandle::retain_segments_as_of`] with the time it sent its request.
    /// Standalone segments are never touched.
    pub fn retain_segments(&self, keep: &[(u64, u64, u64)]) -> Vec<u64> {
        self.retain_segments_as_of(keep, Instant::now())
    }

    /// A handle for another thread (a heartbeat) to manage segments and read statistics.
    pub fn manager(&self) -> BrickManager {
        BrickManager(self.shared.clone())
    }

    /// As [`BrickHandle::retain_segments`], but only for segments created before `listed_at`
    /// (when the heartbeat that brought `keep` was sent): a grant the control plane issued after
    /// drawing up the list may already have created its segment here, and must not lose it.
    pub fn retain_segments_as_of(&self, keep: &[(u64, u64, u64)], listed_at: Instant) -> Vec<u64> {
        self.shared.store.retain(keep, listed_at)
    }

    /// Stops accepting, closes every connection (their clients see the brick lost), joins the
    /// brick's threads and removes the Unix socket file.
    pub fn shutdown(mut self) {
        self.stop();
    }

    /// Blocks until a [`BrickStopper`] asks the brick to stop, then shuts it down.
    pub fn wait(mut self) {
        {
            let mut g = lock(&self.shared.stop_lock);
            while !self.shared.stop.load(Relaxed) {
                g = self.shared.stopped_cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
        }
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.request_stop();
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        // The acceptor is gone: no connection is added from here on.
        for c in lock(&self.shared.conns).values() {
            c.shutdown();
        }
        let threads = std::mem::take(&mut *lock(&self.shared.threads));
        for t in threads {
            let _ = t.join();
        }
        if let Some(p) = self.unix_path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for BrickHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves until SIGTERM or SIGINT, then shuts the brick down; returns the signal number.
pub fn run_until_signal(handle: BrickHandle) -> io::Result<i32> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT])?;
    let sig = signals.forever().next().unwrap_or(signal_hook::consts::SIGTERM);
    signals.handle().close();
    handle.shutdown();
    Ok(sig)
}
