//! The one-sided functions of `include/rackmem.h` (`rackmem_seg_alloc` … `rackmem_quiet`, the
//! atomics): the C boundary over `rackmem-putget`. Raw pointers become slices here, under the
//! contract the header states; errors become -1 (or NULL, or `UINT64_MAX` for the atomics) and
//! `errno`.
//!
//! The engine is configured by the same environment as the window (`RACKMEM_BRICKS`,
//! `RACKMEM_SECRET`, `RACKMEM_TIMEOUT_MS`, `RACKMEM_SHARED_MEMORY`, `RACKMEM_TLS_CA`, or
//! `RACKMEM_AGENT` for agent memory) plus `RACKMEM_TRANSFER_THRESHOLD`, read at the first call:
//! under `rackmem run`, or in a program linked with `-lrackmem` whose environment names a brick
//! or an agent. With no brick named, segments come from the node agent (its control plane
//! places them and names them across nodes). It does not need the window's runtime to be up.

use crate::{get_errno, set_errno, Inside};
use libc::{c_char, c_int, c_void, size_t};
use rackmem_putget::{
    keep_alive_loop, BrickAddr, Engine, EngineConfig, Granted, Granter, Pending, PutGetError, Retry, Segment,
    SegmentGrant, Sharing, Threshold,
};
use rackmem_runtime::config::{Config, ShareChoice};
use rackmem_runtime::CallGuard;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The process's engine, or why there is none (printed once, then `errno` on every call).
static ENGINE: OnceLock<Result<Arc<Engine>, (c_int, String)>> = OnceLock::new();

/// Set in a child of `fork()`: its parent's segments are reached over the parent's connections,
/// which the child shares, so any use of them (or a close: `shutdown(2)` would cut the
/// parent's) would corrupt the parent's traffic. The child makes an engine of its own instead
/// ([`CHILD_ENGINE`]): its own connections, its own segments; the parent's handles name none of
/// them (EBADF).
static FORKED: AtomicBool = AtomicBool::new(false);

/// A forked child's engine, with the process it was made in: a grandchild finds its parent's
/// here, and makes its own in turn. An engine inherited this way is never dropped (dropping
/// would shut its parent's connections down).
type Built = Result<Arc<Engine>, (c_int, String)>;
static CHILD_ENGINE: Mutex<Option<(u32, Built)>> = Mutex::new(None);

/// The engine (its address) whose connections a forked child of this lineage closed last.
static CLOSED_FOR: AtomicUsize = AtomicUsize::new(0);

/// The first handle of an engine made in process `pid`: above any handle the first engine
/// (numbered from one) or another process's could hand out, so handles never name a segment of
/// another generation's engine.
fn first_handle(pid: u32) -> u64 {
    (u64::from(pid) << 40) | 1
}

extern "C" fn forked_child() {
    FORKED.store(true, Ordering::Release);
    // This thread's transfers in flight are the parent's: forget them, never wait on them (an
    // exiting thread completes its transfers, which here would read the parent's answers).
    let _ = PENDING.try_with(|p| {
        if let Ok(mut p) = p.try_borrow_mut() {
            std::mem::forget(std::mem::take(&mut *p));
        }
    });
    // Close (never shut down) the parent's connections here, so that they end when the parent
    // exits rather than when the last of its children does: a brick frees a segment, and an
    // agent a grant, when its connection ends. Only tried: a lock held at the fork by another
    // of the parent's threads stays held here.
    let parents = match CHILD_ENGINE.try_lock() {
        Ok(c) => c.as_ref().and_then(|(_, e)| e.as_ref().ok().cloned()),
        Err(_) => None,
    }
    .or_else(|| ENGINE.get().and_then(|e| e.as_ref().ok().cloned()));
    // Once per engine: in a grandchild, the descriptors of an engine its parent already closed
    // them for may be numbers the parent reused for files of its own.
    let id = parents.as_ref().map_or(0, |e| Arc::as_ptr(e) as usize);
    let first_time = id != 0 && CLOSED_FOR.swap(id, Ordering::AcqRel) != id;
    if let Some(e) = parents.as_ref().filter(|_| first_time) {
        e.try_for_each_fd(|fd| {
            // SAFETY: closes a descriptor the parent's engine owns in this child, where that engine
            // is never used or dropped again (calls go to the child's own engine), so nothing
            // reads, writes or closes it after this.
            unsafe { libc::close(fd) };
        });
    }
    // The engine is not dropped: it stays in ENGINE / CHILD_ENGINE until replaced, and a
    // replaced one is forgotten.
    std::mem::forget(parents);
}

thread_local! {
    /// This thread's non-blocking transfers, completed by `rackmem_quiet`.
    static PENDING: RefCell<Pending> = RefCell::new(Pending::default());
}

/// The node agent as the engine's [`Granter`] (agent memory: no `RACKMEM_BRICKS`): a
/// connection of its own, without orders (the window's runtime, if any, keeps its own). The
/// agent closes everything a connection holds when it closes, so a process that dies gives its
/// segments (and its holds on named ones) back.
struct AgentGranter {
    agent: rackmem_runtime::agent::Agent,
    /// The connection's descriptors, taken when it was made (see [`Granter::raw_fds`]).
    fds: Vec<std::os::fd::RawFd>,
}

fn agent_error(e: rackmem_runtime::agent::AgentError) -> PutGetError {
    use rackmem_runtime::agent::AgentError as E;
    match e {
        E::Refused { code, message, .. } => PutGetError::Granter { code, message },
        E::Unreachable { .. } => PutGetError::Granter {
            code: "unreachable".into(),
            message: e.to_string(),
        },
        E::Malformed { .. } => PutGetError::Granter {
            code: "malformed".into(),
            message: e.to_string(),
        },
    }
}

impl Granter for AgentGranter {
    fn grant(&self, name: Option<&str>, bytes: u64) -> Result<Granted, PutGetError> {
        let a = self.agent.segment(name, bytes).map_err(agent_error)?;
        let malformed = |why: String| PutGetError::Granter {
            code: "malformed".into(),
            message: why,
        };
        let given = (|| {
            let s = a.segments.first().ok_or_else(|| malformed("no segment".into()))?;
            let (grant, session_key) = rackmem_runtime::agent::credentials(s).map_err(malformed)?;
            let brick = s
                .brick_address
                .parse::<BrickAddr>()
                .map_err(|e| malformed(format!("brick address {:?}: {e}", s.brick_address)))?;
            Ok(Granted {
                allocation: a.allocation,
                brick,
                grant: SegmentGrant { grant, session_key },
            })
        })();
        if given.is_err() {
            let _ = self.agent.release(a.allocation);
        }
        given
    }

    fn give_back(&self, allocation: u64) -> Result<(), PutGetError> {
        self.agent.release(allocation).map_err(agent_error)
    }

    fn raw_fds(&self) -> &[std::os::fd::RawFd] {
        &self.fds
    }
}

/// Registers [`forked_child`] once per process image (a forked child's engines share it).
static ATFORK: OnceLock<c_int> = OnceLock::new();

fn build(first: u64) -> Result<Arc<Engine>, (c_int, String)> {
    let fail = |e: PutGetError| (e.errno(), e.to_string());
    let cfg = Config::from_env()
        .map_err(|e| (libc::EINVAL, format!("bad configuration: {e}")))?
        .ok_or_else(|| fail(PutGetError::NotConfigured))?;
    let threshold = match std::env::var("RACKMEM_TRANSFER_THRESHOLD") {
        Ok(v) => v
            .parse::<Threshold>()
            .map_err(|e| (libc::EINVAL, format!("RACKMEM_TRANSFER_THRESHOLD: {e}")))?,
        Err(_) => Threshold::Calibrate,
    };
    // Agent memory (no brick named): segments come from the node agent's control plane.
    let granter: Option<Arc<dyn Granter>> = match (&cfg.agent, cfg.bricks.is_empty()) {
        (Some(path), true) => {
            let agent = rackmem_runtime::agent::Agent::connect_without_orders(path, cfg.timeout)
                .map_err(|e| fail(agent_error(e)))?;
            let fds = agent.raw_fds();
            Some(Arc::new(AgentGranter { agent, fds }))
        }
        _ => None,
    };
    let from_agent = granter.is_some();
    let engine = Arc::new(
        Engine::with_granter(
            EngineConfig {
                bricks: cfg.bricks.clone(),
                secret: cfg.secret.clone(),
                timeout: cfg.timeout,
                sharing: match cfg.shared_memory {
                    ShareChoice::Never => Sharing::Never,
                    ShareChoice::Auto => Sharing::Auto,
                    ShareChoice::Always => Sharing::Always,
                },
                tls: cfg.tls.clone(),
                threshold,
                link_spin: std::time::Duration::from_micros(
                    std::env::var("RACKMEM_PUTGET_SPIN_US")
                        .ok()
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(rackmem_putget::DEFAULT_LINK_SPIN_US),
                ),
            },
            granter,
        )
        .with_first_handle(first),
    );
    if cfg.bricks.is_empty() && !from_agent {
        return Err(fail(PutGetError::NotConfigured));
    }
    // SAFETY: registers a plain `extern "C" fn()` with static lifetime as a fork child hook.
    let rc = *ATFORK.get_or_init(|| unsafe { libc::pthread_atfork(None, None, Some(forked_child)) });
    if rc != 0 {
        return Err((rc, "pthread_atfork failed: fork() could not be made safe".into()));
    }
    // A brick closes a connection idle for its idle timeout, which would free a segment the
    // program holds without using: one thread pings idle links.
    let e = engine.clone();
    if let Err(err) = std::thread::Builder::new()
        .name("rackmem-putget".into())
        .spawn(move || keep_alive_loop(&e))
    {
        return Err((libc::EAGAIN, format!("cannot start the keep-alive thread: {err}")));
    }
    Ok(engine)
}

fn built(first: u64) -> Built {
    let r = build(first);
    if let Err((_, why)) = &r {
        eprintln!("rackmem: one-sided segments unavailable: {why}");
    }
    r
}

fn engine() -> Result<Arc<Engine>, c_int> {
    let r = if FORKED.load(Ordering::Acquire) {
        // A child of fork(): an engine made in this process, or one made now.
        let pid = std::process::id();
        let mut c = CHILD_ENGINE.lock().unwrap_or_else(|e| e.into_inner());
        if c.as_ref().is_some_and(|(made_in, _)| *made_in != pid) {
            // The parent's (or a grandparent's) engine is forgotten, never dropped.
            std::mem::forget(c.take());
        }
        c.get_or_insert_with(|| (pid, built(first_handle(pid)))).1.clone()
    } else {
        ENGINE.get_or_init(|| built(1)).clone()
    };
    r.map_err(|(errno, _)| errno)
}

fn segment(seg: *mut c_void) -> Result<Arc<Segment>, c_int> {
    engine()?.segment(seg as u64).map_err(|e| e.errno())
}

/// The segment, for starting a non-blocking transfer: not one whose contents are lost (a
/// mapped one would take the transfer silently, into memory no brick serves any more).
/// Non-blocking transfers are not retried on a broken link (the blocking calls re-attach).
fn live_segment(seg: *mut c_void) -> Result<Arc<Segment>, c_int> {
    let s = segment(seg)?;
    match s.lost() {
        Some(_) => Err(libc::EIO),
        None => Ok(s),
    }
}

/// Runs `f` as one API call (fork waits for it; what it allocates stays local); `Err(errno)`
/// sets errno and yields `fail`. A call that succeeds leaves errno as the caller set it: the
/// atomics' callers tell an error from a word holding `UINT64_MAX` by errno alone (the header
/// says so), and the system calls under a call may set it on their way (a polling read's
/// `EAGAIN`).
fn call<T>(fail: T, f: impl FnOnce() -> Result<T, c_int>) -> T {
    let _call = CallGuard::enter();
    let _inside = Inside::enter();
    let saved = get_errno();
    match f() {
        Ok(v) => {
            set_errno(saved);
            v
        }
        Err(e) => {
            set_errno(e);
            fail
        }
    }
}

fn verbose() -> bool {
    std::env::var("RACKMEM_VERBOSE").is_ok_and(|v| !v.is_empty() && v != "0")
}

fn handle(e: &Engine, h: u64) -> *mut c_void {
    if verbose() {
        if let Ok(s) = e.segment(h) {
            let p = s.plan();
            eprintln!(
                "rackmem: segment {h} on {}: {} bytes, {}, bulk from {} bytes (put) and {} (get) ({}, {:?})",
                s.brick(),
                s.size(),
                if s.is_mapped() { "mapped" } else { "over the link" },
                p.put_threshold_bytes,
                p.get_threshold_bytes,
                if p.pinned { "pinned" } else { "measured" },
                p.probe_time
            );
        }
    }
    h as *mut c_void
}

#[no_mangle]
pub extern "C" fn rackmem_seg_alloc(bytes: size_t) -> *mut c_void {
    call(std::ptr::null_mut(), || {
        let e = engine()?;
        let h = e.alloc(bytes as u64).map_err(|e| e.errno())?;
        Ok(handle(&e, h))
    })
}

#[no_mangle]
pub unsafe extern "C" fn rackmem_seg_open(name: *const c_char, bytes: size_t) -> *mut c_void {
    call(std::ptr::null_mut(), || {
        if name.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a NUL-terminated string (the header's contract).
        let name = unsafe { std::ffi::CStr::from_ptr(name) };
        let e = engine()?;
        let h = e.open(name.to_bytes(), bytes as u64).map_err(|e| e.errno())?;
        Ok(handle(&e, h))
    })
}

#[no_mangle]
pub extern "C" fn rackmem_seg_free(seg: *mut c_void) {
    if seg.is_null() {
        return;
    }
    call((), || {
        let e = engine()?;
        if let Ok(s) = e.segment(seg as u64) {
            // This thread's transfers on it finish first: their buffers are the caller's.
            PENDING.with(|p| p.borrow_mut().quiet_segment(&s));
        }
        e.free(seg as u64).map_err(|e| e.errno())
    })
}

#[no_mangle]
pub extern "C" fn rackmem_seg_size(seg: *mut c_void) -> size_t {
    call(0, || Ok(segment(seg)?.size() as size_t))
}

/// `len` bytes at `p` as a slice; EINVAL for a NULL pointer with a length.
///
/// # Safety
/// `p` must point to `len` readable bytes that stay valid for `'a`.
unsafe fn bytes<'a>(p: *const c_void, len: size_t) -> Result<&'a [u8], c_int> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's contract: `len` readable bytes at `p`, valid for 'a.
    Ok(unsafe { std::slice::from_raw_parts(p as *const u8, len) })
}

/// `len` writable bytes at `p` as a slice; EINVAL for a NULL pointer with a length.
///
/// # Safety
/// `p` must point to `len` writable bytes that stay valid, and that nothing else reads or
/// writes, for `'a`.
unsafe fn bytes_mut<'a>(p: *mut c_void, len: size_t) -> Result<&'a mut [u8], c_int> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's contract: `len` writable bytes at `p`, exclusively ours for 'a.
    Ok(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) })
}

#[no_mangle]
pub unsafe extern "C" fn rackmem_put(seg: *mut c_void, offset: u64, src: *const c_void, len: size_t) -> c_int {
    call(-1, || {
        // SAFETY: the header's contract: `len` readable bytes at `src` for the call.
        let data = unsafe { bytes(src, len) }?;
        engine()?
            .call(seg as u64, Retry::Idempotent, |s| s.put(offset, data))
            .map_err(|e| e.errno())?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rackmem_get(seg: *mut c_void, offset: u64, dst: *mut c_void, len: size_t) -> c_int {
    call(-1, || {
        // SAFETY: the header's contract: `len` writable bytes at `dst` for the call.
        let out = unsafe { bytes_mut(dst, len) }?;
        // A retry rewrites `out` whole, so bytes of a get cut short never survive it.
        let out = std::cell::RefCell::new(out);
        engine()?
            .call(seg as u64, Retry::Idempotent, |s| s.get(offset, &mut out.borrow_mut()))
            .map_err(|e| e.errno())?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rackmem_put_nbi(seg: *mut c_void, offset: u64, src: *const c_void, len: size_t) -> c_int {
    call(-1, || {
        let s = live_segment(seg)?;
        // SAFETY: as rackmem_put: the bytes are sent before this returns.
        let data = unsafe { bytes(src, len) }?;
        PENDING
            .with(|p| p.borrow_mut().put(&s, offset, data))
            .map_err(|e| e.errno())?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rackmem_get_nbi(seg: *mut c_void, offset: u64, dst: *mut c_void, len: size_t) -> c_int {
    call(-1, || {
        let s = live_segment(seg)?;
        // SAFETY: the header's contract for rackmem_get_nbi: `dst` stays valid, and the program
        // neither reads nor writes it, until this thread's next rackmem_quiet returns (or the
        // thread exits, which completes its transfers).
        let out: &'static mut [u8] = unsafe { bytes_mut(dst, len) }?;
        PENDING
            .with(|p| p.borrow_mut().get(&s, offset, out))
            .map_err(|e| e.errno())?;
        Ok(0)
    })
}

#[no_mangle]
pub extern "C" fn rackmem_quiet() -> c_int {
    call(-1, || {
        // With an engine, transfers on named segments that moved or lost their link are sent
        // again; without one (none configured) there is nothing to send them with.
        let e = engine().ok();
        PENDING
            .with(|p| {
                let mut p = p.borrow_mut();
                match &e {
                    Some(e) => p.quiet_with(e),
                    None => p.quiet(),
                }
            })
            .map_err(|e| e.errno())?;
        Ok(0)
    })
}

#[no_mangle]
pub extern "C" fn rackmem_atomic_fetch_add(seg: *mut c_void, offset: u64, value: u64) -> u64 {
    call(u64::MAX, || {
        engine()?
            .call(seg as u64, Retry::AtMostOnce, |s| s.fetch_add(offset, value))
            .map_err(|e| e.errno())
    })
}

#[no_mangle]
pub extern "C" fn rackmem_atomic_compare_swap(seg: *mut c_void, offset: u64, expected: u64, desired: u64) -> u64 {
    call(u64::MAX, || {
        engine()?
            .call(seg as u64, Retry::AtMostOnce, |s| {
                s.compare_swap(offset, expected, desired)
            })
            .map_err(|e| e.errno())
    })
}
