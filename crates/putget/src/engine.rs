//! The process's one-sided segments: allocation and naming on the configured bricks, or, with
//! no brick configured, segments a [`Granter`] obtains (the node agent's control plane, which
//! names segments across nodes); handles that stay invalid once freed, the plan of each link
//! (measured once per brick and kind of link, then cached), and the keep-alive that stops a
//! brick from closing, and so freeing, a segment that a program holds without using for a
//! while.

use crate::error::PutGetError;
use crate::plan::{calibrate, Plan, Threshold, CALIBRATION_BYTES};
use crate::segment::Segment;
use rackmem_proto::MAX_NAME;
use rackmem_transport::{BrickAddr, Link, TlsClient, KEEPALIVE_INTERVAL};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::Duration;

/// Longest name of a segment a [`Granter`] gives (the control plane's limit).
pub const MAX_GRANTED_NAME: usize = 128;

/// Most segments one process holds at once (each has its own connection, and a brick serves a
/// connection with a thread).
pub const MAX_SEGMENTS: usize = 64;

/// Whether segments of bricks on this host are mapped into the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// Never: every transfer goes over the link.
    Never,
    /// Map segments of `unix:` bricks; keep the link if the brick cannot share.
    Auto,
    /// Map segments of `unix:` bricks, and fail if one cannot share.
    Always,
}

/// A segment a [`Granter`] obtained: the allocation to give back, the brick that holds it, and
/// the grant (with its session key) to attach to it with.
#[derive(Debug, Clone)]
pub struct Granted {
    /// The granter's id for it, for [`Granter::give_back`].
    pub allocation: u64,
    /// The brick that holds it.
    pub brick: BrickAddr,
    /// The grant and its session key.
    pub grant: rackmem_proto::SegmentGrant,
}

/// Where segments come from when no brick is configured: in a program on agent memory, the
/// node agent (the C layer wires in the runtime's connection to it), whose control plane places
/// segments and names them for processes on every node.
pub trait Granter: Send + Sync {
    /// A segment: the one named `name` (created with `bytes` unless it exists; `bytes` 0: open
    /// only), or, with no name, one of `bytes` for this process alone.
    fn grant(&self, name: Option<&str>, bytes: u64) -> Result<Granted, PutGetError>;
    /// Gives back what [`Granter::grant`] returned (for a name: this process's hold, the last
    /// of which frees it).
    fn give_back(&self, allocation: u64) -> Result<(), PutGetError>;
    /// The file descriptors of the granter's own connections (a forked child closes its
    /// parent's, so that the parent's exit is seen where they lead). Called in a child of
    /// fork(): it must take no lock another thread may have held.
    fn raw_fds(&self) -> &[std::os::fd::RawFd] {
        &[]
    }
}

/// Default of [`EngineConfig::link_spin`], µs: the fault path's own default. Measured on the
/// 2-vCPU guest (`docs/benchmarks.md`, "Links that poll only while it pays"): an 8-byte put
/// over TCP loopback took 7.3 µs polling against 21 µs sleeping on a quiet machine (Open MPI's
/// `MPI_Put` 9.1 µs), and polling lost by up to 10 × beside busy CPUs, which the link's
/// measured choice avoids.
pub const DEFAULT_LINK_SPIN_US: u64 = 50;

/// What the engine needs: the bricks and how to reach them.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Bricks to allocate from, in turn.
    pub bricks: Vec<BrickAddr>,
    /// The bricks' shared secret (standalone bricks).
    pub secret: Vec<u8>,
    /// Longest wait for a brick's answer.
    pub timeout: Duration,
    /// Mapping of segments of bricks on this host.
    pub sharing: Sharing,
    /// CA for `tls://` bricks.
    pub tls: Option<TlsClient>,
    /// How the inline/bulk threshold is set.
    pub threshold: Threshold,
    /// How long a link may poll for an answer before it sleeps (`RACKMEM_PUTGET_SPIN_US`,
    /// [`DEFAULT_LINK_SPIN_US`] by default; 0 never polls). Above 0 each link measures polled and
    /// slept waits and takes the shorter (`rackmem_transport`'s `spin` module), so polling is
    /// used where it pays (a quiet machine) and dropped where the poller would hold off the
    /// brick's thread (a loaded one).
    pub link_spin: Duration,
}

/// The process's one-sided segments. `Send + Sync`: every call may come from any thread.
pub struct Engine {
    cfg: EngineConfig,
    /// Where segments come from when `cfg.bricks` is empty.
    pub(crate) granter: Option<Arc<dyn Granter>>,
    pub(crate) segments: RwLock<HashMap<u64, Arc<Segment>>>,
    /// Held while a segment is re-attached (`reattach`): one at a time, so threads whose
    /// calls failed on one broken link wait for one new link instead of each making one.
    pub(crate) reattaching: Mutex<()>,
    next_handle: AtomicU64,
    next_brick: AtomicUsize,
    /// Plans by (brick, mapped): measured once, under this lock.
    plans: Mutex<HashMap<(String, bool), Arc<Plan>>>,
    stop: Arc<(Mutex<bool>, Condvar)>,
}

impl Engine {
    /// An engine over `cfg`'s bricks; connects to nothing until a segment is asked for.
    pub fn new(cfg: EngineConfig) -> Engine {
        Engine::with_granter(cfg, None)
    }

    /// An engine whose segments come from `granter` when `cfg` names no brick.
    pub fn with_granter(cfg: EngineConfig, granter: Option<Arc<dyn Granter>>) -> Engine {
        Engine {
            cfg,
            granter,
            segments: RwLock::new(HashMap::new()),
            reattaching: Mutex::new(()),
            // Handles are never reused, so a freed one stays invalid; never 0 (NULL in C).
            next_handle: AtomicU64::new(1),
            next_brick: AtomicUsize::new(0),
            plans: Mutex::new(HashMap::new()),
            stop: Arc::new((Mutex::new(false), Condvar::new())),
        }
    }

    /// This engine hands out handles from `first` on (never 0). A forked child's engine starts
    /// where its parent's can never reach, so that a parent's handle used in the child names
    /// no segment of the child's (EBADF) instead of another segment.
    pub fn with_first_handle(self, first: u64) -> Engine {
        self.next_handle.store(first.max(1), Ordering::Relaxed);
        self
    }

    /// Calls `f` with the file descriptor of every segment's link and of the granter's
    /// connections; false (and no call) when the segment table is locked. For a forked child,
    /// which must close its parent's connections without using them: a lock another thread of
    /// the parent held at the fork stays held in the child for ever, so it is only tried, and
    /// nothing is allocated (the child's allocator may not be ready in a fork hook).
    pub fn try_for_each_fd(&self, mut f: impl FnMut(std::os::fd::RawFd)) -> bool {
        let Ok(segments) = self.segments.try_read() else {
            return false;
        };
        segments.values().flat_map(|s| s.fds.iter()).for_each(|fd| f(*fd));
        if let Some(g) = &self.granter {
            g.raw_fds().iter().for_each(|fd| f(*fd));
        }
        true
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Allocates a segment of at least `bytes` (zero-filled) on the next brick in turn and
    /// returns its handle.
    pub fn alloc(&self, bytes: u64) -> Result<u64, PutGetError> {
        if bytes == 0 {
            return Err(PutGetError::Invalid("a segment of 0 bytes".into()));
        }
        if let (true, Some(g)) = (self.cfg.bricks.is_empty(), &self.granter) {
            return self.add_granted(g.as_ref(), None, bytes);
        }
        self.add(|link| Ok(link.alloc_segment(&self.cfg.secret, bytes)?), None)
    }

    /// Opens the segment named `name` on the first brick, creating it with `bytes` if no live
    /// segment has that name (`bytes == 0`: open only). Every process that opens the name gets
    /// the same memory; it lives while one of them holds it.
    pub fn open(&self, name: &[u8], bytes: u64) -> Result<u64, PutGetError> {
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(PutGetError::Invalid(format!(
                "a segment name has 1 to {MAX_NAME} bytes, not {}",
                name.len()
            )));
        }
        if let (true, Some(g)) = (self.cfg.bricks.is_empty(), &self.granter) {
            // The control plane's names are of a charset it can put in a URL and a log.
            let name = std::str::from_utf8(name)
                .ok()
                .filter(|n| {
                    n.len() <= MAX_GRANTED_NAME && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
                })
                .ok_or_else(|| {
                    PutGetError::Invalid(format!(
                        "a segment name on agent memory is 1 to {MAX_GRANTED_NAME} characters of A-Z a-z 0-9 - _ . :"
                    ))
                })?;
            return self.add_granted(g.as_ref(), Some(name), bytes);
        }
        // A name lives on one brick: always the first, so every process finds it there.
        self.add(|link| Ok(link.open_segment(&self.cfg.secret, name, bytes)?), Some(0))
    }

    /// A segment `g` grants, attached by a link of its own; given back if anything after the
    /// grant fails.
    fn add_granted(&self, g: &dyn Granter, name: Option<&str>, bytes: u64) -> Result<u64, PutGetError> {
        let held = self.segments.read().unwrap_or_else(|e| e.into_inner()).len();
        if held >= MAX_SEGMENTS {
            return Err(PutGetError::TooManySegments(MAX_SEGMENTS));
        }
        let granted = g.grant(name, bytes)?;
        let r = self
            .granted_segment(g, &granted, name)
            .and_then(|seg| self.insert(Arc::new(seg)));
        if r.is_err() {
            let _ = g.give_back(granted.allocation);
        }
        r
    }

    /// `granted` attached by a link of its own, with the plan of its brick (measured now if
    /// this is the brick's first segment). The caller gives `granted` back if this fails.
    pub(crate) fn granted_segment(
        &self,
        g: &dyn Granter,
        granted: &Granted,
        name: Option<&str>,
    ) -> Result<Segment, PutGetError> {
        let mut seg = self.attach_granted(granted)?;
        seg.allocation = Some(granted.allocation);
        seg.name = name.map(str::to_string);
        let plan = self.plan_at(&granted.brick, seg.is_mapped(), || {
            let scratch = g.grant(None, CALIBRATION_BYTES)?;
            let s = self.attach_granted(&scratch);
            // Measured, then given back: the scratch segment is this process's alone.
            Ok((s, Some((scratch.allocation, scratch.brick))))
        })?;
        let _ = seg.plan.set(plan);
        Ok(seg)
    }

    /// A new link to `granted`'s brick, attached with its grant.
    fn attach_granted(&self, granted: &Granted) -> Result<Segment, PutGetError> {
        self.segment_at(&granted.brick, |link| {
            link.attach(&granted.grant.grant, &granted.grant.session_key)?;
            Ok(granted.grant.clone())
        })
    }

    /// Keeps `seg` under a new handle, unless [`MAX_SEGMENTS`] are held already.
    fn insert(&self, seg: Arc<Segment>) -> Result<u64, PutGetError> {
        let mut segments = self.segments.write().unwrap_or_else(|e| e.into_inner());
        // Checked again where it counts: other threads may have added segments meanwhile.
        // Refused here, the new segment's connection closes and the brick frees it.
        if segments.len() >= MAX_SEGMENTS {
            return Err(PutGetError::TooManySegments(MAX_SEGMENTS));
        }
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let _ = seg.handle.set(handle);
        segments.insert(handle, seg);
        Ok(handle)
    }

    fn add(
        &self,
        carve: impl FnOnce(&Link) -> Result<rackmem_proto::SegmentGrant, PutGetError>,
        brick: Option<usize>,
    ) -> Result<u64, PutGetError> {
        if self.cfg.bricks.is_empty() {
            return Err(PutGetError::NotConfigured);
        }
        let held = self.segments.read().unwrap_or_else(|e| e.into_inner()).len();
        if held >= MAX_SEGMENTS {
            return Err(PutGetError::TooManySegments(MAX_SEGMENTS));
        }
        let i = brick.unwrap_or_else(|| self.next_brick.fetch_add(1, Ordering::Relaxed)) % self.cfg.bricks.len();
        let addr = &self.cfg.bricks[i];
        let seg = Arc::new(self.segment_at(addr, carve)?);
        let plan = self.plan_at(addr, seg.is_mapped(), || {
            let scratch = self.segment_at(addr, |l| Ok(l.alloc_segment(&self.cfg.secret, CALIBRATION_BYTES)?));
            Ok((scratch, None))
        })?;
        let _ = seg.plan.set(plan);
        self.insert(seg)
    }

    /// A new link to brick `addr`, a segment for it (`carve`), and its mapping where the brick
    /// is on this host and sharing is wanted.
    fn segment_at(
        &self,
        addr: &BrickAddr,
        carve: impl FnOnce(&Link) -> Result<rackmem_proto::SegmentGrant, PutGetError>,
    ) -> Result<Segment, PutGetError> {
        let link = Link::connect_with(addr, self.cfg.timeout, self.cfg.tls.as_ref())?;
        link.set_receive_spin(self.cfg.link_spin);
        let grant = carve(&link)?;
        let mapping = match (self.cfg.sharing, addr) {
            (Sharing::Never, _) | (_, BrickAddr::Tcp(_) | BrickAddr::Tls(_)) => None,
            (Sharing::Auto, BrickAddr::Unix(_)) => link.share().ok(),
            (Sharing::Always, BrickAddr::Unix(_)) => Some(link.share()?),
        };
        let brick_id = link.info().brick_id;
        Ok(Segment {
            fds: link.raw_fds(),
            link,
            grant,
            mapping,
            plan: OnceLock::new(),
            allocation: None,
            name: None,
            brick_id,
            lost: OnceLock::new(),
            handle: OnceLock::new(),
        })
    }

    /// The plan of brick `addr`'s links (mapped or not): pinned, cached, or measured now on a
    /// scratch segment of the brick (`scratch`: made for it, with what to give back to the
    /// granter after; measuring PUT writes, and the program's own segment may be a named one
    /// others use).
    #[allow(clippy::type_complexity)]
    fn plan_at(
        &self,
        addr: &BrickAddr,
        mapped: bool,
        scratch: impl FnOnce() -> Result<(Result<Segment, PutGetError>, Option<(u64, BrickAddr)>), PutGetError>,
    ) -> Result<Arc<Plan>, PutGetError> {
        if let Threshold::Pinned(t) = self.cfg.threshold {
            return Ok(Arc::new(Plan::pinned(t)));
        }
        let key = (addr.to_string(), mapped);
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = plans.get(&key) {
            return Ok(p.clone());
        }
        // No scratch segment (a full brick), one on another brick (a granter places it where
        // it likes), or one the brick shares when it did not share the program's (or the other
        // way round): the default plan, rather than no segment or a measurement of the wrong
        // link. Kept, so the brick is not asked again.
        let (seg, give_back) = match scratch() {
            Ok(s) => s,
            Err(_) => (Err(PutGetError::NotConfigured), None),
        };
        let same_brick = give_back.as_ref().is_none_or(|(_, b)| b == addr);
        let p = match seg {
            Ok(s) if same_brick && s.is_mapped() == mapped => Arc::new(calibrate(&s).unwrap_or_default()),
            Ok(_) | Err(_) => Arc::new(Plan::default()),
        };
        if let (Some((allocation, _)), Some(g)) = (give_back, &self.granter) {
            let _ = g.give_back(allocation);
        }
        plans.insert(key, p.clone());
        Ok(p)
    }

    /// The plans measured so far, by brick and whether its segments are mapped.
    pub fn plans(&self) -> Vec<(String, bool, Arc<Plan>)> {
        let plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        plans.iter().map(|((b, m), p)| (b.clone(), *m, p.clone())).collect()
    }

    /// The live segment `handle`.
    pub fn segment(&self, handle: u64) -> Result<Arc<Segment>, PutGetError> {
        self.segments
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&handle)
            .cloned()
            .ok_or(PutGetError::BadHandle(handle))
    }

    /// Frees segment `handle`: later uses of the handle fail with
    /// [`PutGetError::BadHandle`]; the brick frees the memory once no process holds it (at
    /// once for an unnamed segment). Transfers of other threads still in flight on it fail.
    pub fn free(&self, handle: u64) -> Result<(), PutGetError> {
        let seg = self
            .segments
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&handle)
            .ok_or(PutGetError::BadHandle(handle))?;
        // Dropping the last reference closes the connection, which detaches as well; a DETACH
        // first tells the brick at once, even while another thread still holds the segment.
        let r = seg.link.detach();
        let allocation = seg.allocation;
        drop(seg);
        // A granted segment goes back to its granter too (for a name: this process's hold).
        if let (Some(a), Some(g)) = (allocation, &self.granter) {
            g.give_back(a)?;
        }
        r.map_err(PutGetError::from)
    }

    /// Pings every segment's link that has sent nothing for [`KEEPALIVE_INTERVAL`]: a brick
    /// closes a connection silent for its idle timeout (10 min by default), and closing a
    /// segment's only connection frees the segment. The owner calls this periodically (see
    /// [`keep_alive_loop`]).
    pub fn keep_alive(&self) {
        let segs: Vec<Arc<Segment>> = self
            .segments
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for s in segs {
            let _ = s.link.keep_alive(KEEPALIVE_INTERVAL);
        }
    }

    /// Asks [`keep_alive_loop`] to return.
    pub fn stop(&self) {
        let (m, cv) = &*self.stop;
        *m.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
    }
}

/// Runs [`Engine::keep_alive`] every few seconds until [`Engine::stop`]; the owner runs it on a
/// thread of its own (the C API starts one at the first segment).
pub fn keep_alive_loop(engine: &Engine) {
    let (m, cv) = &*engine.stop;
    let mut stopped = m.lock().unwrap_or_else(|e| e.into_inner());
    while !*stopped {
        stopped = cv
            .wait_timeout(stopped, KEEPALIVE_INTERVAL / 4)
            .unwrap_or_else(|e| e.into_inner())
            .0;
        if *stopped {
            break;
        }
        drop(stopped);
        engine.keep_alive();
        stopped = m.lock().unwrap_or_else(|e| e.into_inner());
    }
}
