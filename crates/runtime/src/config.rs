//! Runtime configuration, read from the environment that `rackmem run` (or a user) sets.
//!
//! The runtime lives inside an unmodified program, so it has no command line of its own: every
//! option is an environment variable, documented here and in `rackmem run --help`.

use crate::policy::{Eviction, UnknownEviction};
use crate::size::{parse_size, Budget, SizeError};
use rackmem_transport::{BrickAddr, TlsClient};
use std::time::Duration;

/// The environment variables the runtime reads, named once for the runtime and for `rackmem run`,
/// which sets them for the program (documented in `docs/architecture.md`).
pub mod env {
    /// comma-separated brick addresses to carve segments from.
    pub const BRICKS: &str = "RACKMEM_BRICKS";
    /// the bricks' shared secret.
    pub const SECRET: &str = "RACKMEM_SECRET";
    /// the node agent's socket: memory comes from the control plane through it.
    pub const AGENT: &str = "RACKMEM_AGENT";
    /// the local buffer's budget (bytes, or a percentage of the peak footprint).
    pub const LOCAL: &str = "RACKMEM_LOCAL";
    /// allocations of at least this size go to the window.
    pub const THRESHOLD: &str = "RACKMEM_THRESHOLD";
    /// the window's size.
    pub const WINDOW: &str = "RACKMEM_WINDOW";
    /// how the fault handler waits (auto, blocking, busy-poll, hybrid[:US]).
    pub const HANDLER: &str = "RACKMEM_HANDLER";
    /// fault handler threads.
    pub const HANDLERS: &str = "RACKMEM_HANDLERS";
    /// faults a handler keeps in flight over a link (early reads of faults queued behind it).
    pub const PIPELINE: &str = "RACKMEM_PIPELINE";
    /// most pages fetched per fault on a sequential stream.
    pub const PREFETCH: &str = "RACKMEM_PREFETCH";
    /// most pages fetched per random fault while the local buffer has room.
    pub const READ_AROUND: &str = "RACKMEM_READ_AROUND";
    /// one read-ahead page in this many is left remote as a probe.
    pub const READAHEAD_SAMPLE: &str = "RACKMEM_READAHEAD_SAMPLE";
    /// how long a brick may take to answer.
    pub const TIMEOUT_MS: &str = "RACKMEM_TIMEOUT_MS";
    /// how long a fault may wait before the watchdog reports it.
    pub const WATCHDOG_MS: &str = "RACKMEM_WATCHDOG_MS";
    /// idle time after which a link is pinged.
    pub const KEEPALIVE_MS: &str = "RACKMEM_KEEPALIVE_MS";
    /// where statistics are appended at exit.
    pub const STATS_FILE: &str = "RACKMEM_STATS_FILE";
    /// say what the runtime does.
    pub const VERBOSE: &str = "RACKMEM_VERBOSE";
    /// the step in which agent memory grows.
    pub const GROW: &str = "RACKMEM_GROW";
    /// how long a link polls for a response before sleeping.
    pub const LINK_SPIN_US: &str = "RACKMEM_LINK_SPIN_US";
    /// map same-host segments (1), never (0), or decide (unset).
    pub const SHARED_MEMORY: &str = "RACKMEM_SHARED_MEMORY";
    /// where once-per-run notices are recorded, so children do not repeat them.
    pub const NOTICE_DIR: &str = "RACKMEM_NOTICE_DIR";
    /// A file shared by the processes of one `rackmem run` holding the run's budget (see
    /// `run_budget`): `--local` is then the whole process tree's limit, as a memory cgroup's is.
    pub const RUN_BUDGET: &str = "RACKMEM_RUN_BUDGET";
    /// the eviction policy.
    pub const EVICTION: &str = "RACKMEM_EVICTION";
    /// how a migration between bricks carries pages: direct (the default) or bounce.
    pub const MIGRATION: &str = "RACKMEM_MIGRATION";
    /// shortest fetched run (4 KiB pages) moved into the window from recycled pages rather than
    /// copied (`rackmem run` measures it at start: `crate::calibrate`).
    pub const RECYCLE_MIN_PAGES: &str = "RACKMEM_RECYCLE_MIN_PAGES";
    /// the least a percentage budget gives a run (bytes; default [`super::LOCAL_FLOOR_BYTES`],
    /// `0`: none), never more than the footprint so far.
    pub const LOCAL_FLOOR: &str = "RACKMEM_LOCAL_FLOOR";
    /// where `rackmem run` finds the runtime library (default: next to its own binary).
    pub const PRELOAD: &str = "RACKMEM_PRELOAD";
    /// Huge units: `1`/`on` backs the window by 2 MiB transparent huge pages, `0`/`off` (the
    /// default) keeps 4 KiB pages.
    pub const HUGE_PAGES: &str = "RACKMEM_HUGE_PAGES";
    /// How `fork` gives the child its copy: `lazy` (the default) or `eager`.
    pub const FORK: &str = "RACKMEM_FORK";
    /// Load control: `1`/`on` (the default) favours one thread at a time when several threads'
    /// faults thrash the local buffer together; `0`/`off` serves every fault as it comes.
    pub const LOAD_CONTROL: &str = "RACKMEM_LOAD_CONTROL";
}

/// How the fault handler waits for page faults.
///
/// Measured on 2-vCPU KVM guests: waking a sleeping handler on the other vCPU costs ~30 µs per
/// fault, a spinning handler ~24 µs total, so the choice matters (see `docs/benchmarks.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandlerMode {
    /// Sleep in `poll(2)` until a fault arrives. Costs no CPU when idle.
    Blocking,
    /// Spin on a non-blocking read forever. Lowest latency; burns one CPU.
    BusyPoll,
    /// Spin for `spin_us` microseconds after the last fault, then sleep.
    Hybrid {
        /// How long to keep spinning after the last message.
        spin_us: u64,
    },
    /// Placed by the runtime from which threads fault (the default on more than one CPU): on
    /// the CPU of a thread that does nearly all the faulting, blocking, so that a fault is a
    /// context switch there; floating and spinning `spin_us` after each fault (as `Hybrid`)
    /// while several threads fault. See the runtime's `placement` module.
    Auto {
        /// Spin time while floating.
        spin_us: u64,
    },
}

impl std::str::FromStr for HandlerMode {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "blocking" => Ok(HandlerMode::Blocking),
            "busy-poll" | "busypoll" | "spin" => Ok(HandlerMode::BusyPoll),
            "hybrid" => Ok(HandlerMode::Hybrid { spin_us: 200 }),
            "auto" => Ok(HandlerMode::Auto { spin_us: 200 }),
            other => match other.strip_prefix("hybrid:") {
                Some(us) => us
                    .parse()
                    .map(|spin_us| HandlerMode::Hybrid { spin_us })
                    .map_err(|_| ConfigError::Invalid(env::HANDLER, s.to_string())),
                None => Err(ConfigError::Invalid(env::HANDLER, s.to_string())),
            },
        }
    }
}

/// The least a percentage budget (`--local P%`) gives a run: 8 MiB, or the run's footprint so
/// far when smaller. P% of the peak footprint *so far* is small early in a run, while a cgroup
/// limit set from the run's final peak is not: `pgbench -i`'s vacuum runs with PostgreSQL's
/// window at 16 MiB so far, a budget of 4 MiB, and made 150 000 faults for a working set of
/// about 8 MiB (2.0 s against 0.05 s native; at a fixed 8 MiB 0.44 s, 10 MiB 0.19 s). 8 MiB is
/// less than what the runtime itself keeps local in each process (its threads, tables and
/// staging area), so a program's local memory stays within P% of its peak plus that allowance.
pub const LOCAL_FLOOR_BYTES: u64 = 8 << 20;

/// Everything the runtime needs to start.
#[derive(Debug, Clone)]
pub struct Config {
    /// `RACKMEM_BRICKS`: comma-separated brick addresses (`unix:PATH`, `tcp://HOST:PORT`,
    /// `tls://HOST:PORT`).
    pub bricks: Vec<BrickAddr>,
    /// `RACKMEM_SECRET`: the shared secret that lets this process carve segments from a brick.
    pub secret: Vec<u8>,
    /// `RACKMEM_LOCAL`: local buffer budget, bytes or percent of the peak footprint so far (default 50%).
    pub budget: Budget,
    /// `RACKMEM_THRESHOLD`: allocations of at least this many bytes go to the window (1 MiB).
    pub threshold_bytes: u64,
    /// `RACKMEM_WINDOW`: window size; default: what the bricks can give, at most 64 GiB.
    pub window_bytes: Option<u64>,
    /// `RACKMEM_HANDLER`: `auto`, `blocking`, `busy-poll`, `hybrid[:US]` (default auto, or
    /// blocking when the program may run on one CPU only: see [`default_handler`]).
    pub handler: HandlerMode,
    /// `RACKMEM_HANDLERS`: fault handler threads reading the window's userfaultfd, so that
    /// faults of different pages are served at once (default: see [`default_handlers`]; at most
    /// [`MAX_HANDLERS`]).
    pub handlers: usize,
    /// `RACKMEM_HANDLERS` was set: the handlers beyond the first serve whatever the links (by
    /// default they serve only where a segment is reached over a link: see
    /// `docs/architecture.md`, "Faults in flight").
    pub handlers_explicit: bool,
    /// `RACKMEM_PIPELINE`: faults a handler keeps in flight at once over a link: while it waits
    /// on a brick for one fault, the reads of up to this many faults queued behind it are sent
    /// (default [`DEFAULT_PIPELINE`], at most [`MAX_PIPELINE`]; 0 = one fault at a time).
    pub pipeline: usize,
    /// `RACKMEM_PREFETCH`: most pages fetched per fault on a sequential stream (default 128; 0 = off).
    pub prefetch_pages: usize,
    /// `RACKMEM_READ_AROUND`: most pages fetched from a fault that starts no stream, while the
    /// local buffer has free room (`rackmem_pager::fault::plan`; default
    /// [`DEFAULT_READ_AROUND`]; 0 or 1 = the faulting page alone).
    pub read_around_pages: usize,
    /// `RACKMEM_READAHEAD_SAMPLE`: one page read ahead in this many is left remote to measure
    /// read-ahead accuracy (`rackmem_pager::probe`; default 256; 0 = off).
    pub readahead_sample: u32,
    /// `RACKMEM_TIMEOUT_MS`: longest wait for a brick's answer before it is declared lost.
    pub timeout: Duration,
    /// `RACKMEM_WATCHDOG_MS`: a fault waiting longer than this is reported on stderr.
    pub watchdog: Duration,
    /// `RACKMEM_KEEPALIVE_MS`: a link that has sent nothing for this long is pinged (by the
    /// watchdog), so that its brick, which closes connections silent for its idle timeout (10
    /// min by default), keeps the link of a program that has not needed remote memory for a
    /// while. 0: never.
    pub keepalive: Duration,
    /// `RACKMEM_STATS_FILE`: append one JSON line of statistics per process at exit.
    pub stats_file: Option<String>,
    /// `RACKMEM_VERBOSE`: print start-up and fork details on stderr.
    pub verbose: bool,
    /// `RACKMEM_AGENT`: the node agent's socket; memory then comes from the control plane as
    /// the program's allocations grow, instead of from `RACKMEM_BRICKS` at start.
    pub agent: Option<String>,
    /// `RACKMEM_GROW`: smallest allocation asked of the agent (default 256 MiB).
    pub grow_bytes: u64,
    /// `RACKMEM_LINK_SPIN_US`: the longest the fault handler polls a link for an answer before
    /// it sleeps (default 50; 0 = sleep at once). Each link measures whether polling pays and
    /// polls only while it does (`rackmem_transport`'s `Link::set_receive_spin`).
    pub link_spin: Duration,
    /// `RACKMEM_RECYCLE_MIN_PAGES`: the shortest fetched run, in 4 KiB pages, received into
    /// recycled pages and moved into the window; shorter runs are copied into fresh pages
    /// (default [`rackmem_pager::fault::RECYCLE_MIN_PAGES`]; `rackmem run` sets the crossover it
    /// measured on this machine, [`crate::calibrate`]).
    pub recycle_min_pages: u64,
    /// `RACKMEM_LOCAL_FLOOR`: the least a percentage budget gives the run, bytes (never more
    /// than its footprint so far); see [`LOCAL_FLOOR_BYTES`].
    pub local_floor_bytes: u64,
    /// `RACKMEM_SHARED_MEMORY`: whether to map the segments of bricks on this host (Unix-socket
    /// addresses) into the process, so faults and write-back copy memory instead of using the
    /// socket (default: yes, see [`ShareChoice::Auto`]; TCP bricks always use their links).
    pub shared_memory: ShareChoice,
    /// `RACKMEM_RUN_BUDGET`: the run's shared budget file; without it each process has its own
    /// budget.
    pub run_budget: Option<String>,
    /// `RACKMEM_NOTICE_DIR`: a directory shared by the processes of one `rackmem run`, where
    /// one-time notices are marked as given, so that forked and exec'd children do not repeat
    /// them (unset: once per process).
    pub notice_dir: Option<String>,
    /// `RACKMEM_TLS_CA`: PEM file of the CA certificates that `tls://` bricks' certificates must
    /// chain to, read at start (unset: `tls://` bricks cannot be used).
    pub tls: Option<TlsClient>,
    /// `RACKMEM_EVICTION`: which resident pages leave the local buffer when it is full:
    /// `refault` (the default: pages that fault back soon after eviction are protected) or
    /// `fifo` (first in, first out). See [`crate::policy`].
    pub eviction: Eviction,
    /// `RACKMEM_MIGRATION`: `direct` (the default: the target brick pulls the pages from the
    /// source brick, and the range is bounced through this process only when the target cannot
    /// reach the source) or `bounce` (always through this process).
    pub migration_direct: bool,
    /// The window's unit: 4 KiB pages, or 2 MiB huge units where the kernel gives transparent
    /// huge pages (`docs/architecture.md`, "Huge pages").
    pub huge_pages: HugePages,
    /// `RACKMEM_FORK`: `lazy` (the default: a forked child inherits the window and keeps its
    /// parent's resident pages copy-on-write, in the kernel, as native memory; the parent writes
    /// nothing back) or `eager` (the window is not inherited: the parent writes back its dirty
    /// pages and the child fetches every page from its clone). Huge units and memory from a node
    /// agent always fork eagerly.
    pub fork_lazy: bool,
    /// `RACKMEM_LOAD_CONTROL`: when several threads' faults thrash the local buffer together,
    /// favour one thread at a time (`crate::load`; on by default).
    pub load_control: bool,
}

/// Whether the window is backed by 2 MiB transparent huge pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HugePages {
    /// 4 KiB pages.
    #[default]
    Off,
    /// 2 MiB units where THP is not `never` (else 4 KiB pages, with a message).
    On,
}

/// Whether segments of bricks on this host are mapped into the process.
///
/// Mapping is the fast path (a fault is a memory copy, no socket round trip: 2.0 × zram on a
/// sequential scan against 1.6 × over the socket, `docs/benchmarks.md`), so it is the default;
/// the socket stays for bricks that cannot share and for whoever asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareChoice {
    /// Never map: every fetch and write-back goes over the link (`RACKMEM_SHARED_MEMORY=0`).
    Never,
    /// Map the segments of `unix:` bricks; a brick that cannot share keeps its link (the
    /// default, `RACKMEM_SHARED_MEMORY` unset).
    Auto,
    /// Map the segments of `unix:` bricks, and fail if one cannot share
    /// (`RACKMEM_SHARED_MEMORY=1`).
    Always,
}

impl ShareChoice {
    /// True unless sharing was turned off.
    pub fn wanted(self) -> bool {
        self != ShareChoice::Never
    }
}

/// The handler mode when `RACKMEM_HANDLER` is not set, for a program allowed on `cpus` CPUs.
///
/// Confined to one CPU (`rackmem run --cpus N`, `taskset`), the handler shares that CPU with the
/// program: a spinning handler would take the CPU the woken program needs, while a blocking one
/// makes each fault a context switch on that CPU, with no cross-CPU wake-up at all (9.4 µs per
/// fault against 24 µs with a handler spinning on another vCPU on 2-vCPU guests; with shared
/// memory, GUPS at 25% local ran 69–74 k updates/s on one CPU against 38 k on two,
/// `docs/benchmarks.md` runs 5, 6 and 8). On more CPUs the runtime places the handler itself
/// ([`HandlerMode::Auto`]): it gets the same context switch for a program whose faults come
/// from one thread, without confining the program's other threads.
pub fn default_handler(cpus: usize) -> HandlerMode {
    if cpus == 1 {
        HandlerMode::Blocking
    } else {
        HandlerMode::Auto { spin_us: 200 }
    }
}

/// Most fault handler threads: faults in flight per program are at most this many.
pub const MAX_HANDLERS: usize = 4;

/// Pages a random fault fetches while the local buffer has room (`RACKMEM_READ_AROUND`): as
/// many as Linux's swap reads around a fault (`vm.page-cluster` 3).
pub const DEFAULT_READ_AROUND: usize = 8;

/// Most pages `RACKMEM_READ_AROUND` may ask for (a run is bounded by a quarter of the budget too).
pub const MAX_READ_AROUND: usize = 128;

/// Faults one handler keeps in flight over a link by default (`RACKMEM_PIPELINE`).
pub const DEFAULT_PIPELINE: usize = 16;

/// Most faults one handler keeps in flight (bytes in flight per link: a page each on top of the
/// runs and read-aheads).
pub const MAX_PIPELINE: usize = 64;

/// The handler threads when `RACKMEM_HANDLERS` is not set: one, whatever the CPUs. Measured on
/// a quiet 2-vCPU machine (docs/architecture.md, "Faults in flight"), two handlers made two
/// threads faulting at 25% local 13% slower on shared memory and 17% slower over a Unix socket
/// than one handler, which matched the build before faults could be in flight; one faulting
/// thread was the same either way. `rackmem run --handlers N` (at most [`MAX_HANDLERS`] and the
/// program's CPUs) is for bricks across a real network, where a fault waits on the wire and a
/// second handler has time to serve another: not measured here (the brick shared the CPUs).
pub fn default_handlers() -> usize {
    1
}

/// A configuration variable that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The variable's value is malformed.
    #[error("{0}={1:?} is not valid")]
    Invalid(&'static str, String),
    /// A size could not be parsed.
    #[error("{0}: {1}")]
    Size(&'static str, SizeError),
    /// A brick address could not be parsed.
    #[error("RACKMEM_BRICKS: {0}")]
    Brick(String),
    /// `RACKMEM_EVICTION` names no eviction policy.
    #[error("RACKMEM_EVICTION: {0}")]
    Eviction(#[from] UnknownEviction),
    /// The CA file for `tls://` bricks cannot be used.
    #[error("{0}")]
    Tls(String),
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl Config {
    /// Reads the configuration; `Ok(None)` when neither `RACKMEM_BRICKS` nor `RACKMEM_AGENT` is
    /// set (the runtime stays off and every allocation goes to the C library).
    pub fn from_env() -> Result<Option<Config>, ConfigError> {
        let agent = var(env::AGENT);
        let bricks = match (var(env::BRICKS), &agent) {
            (Some(b), _) => b,
            (None, Some(_)) => String::new(),
            (None, None) => return Ok(None),
        };
        let bricks = bricks
            .split(',')
            .filter(|b| !b.trim().is_empty())
            .map(|b| {
                b.trim()
                    .parse::<BrickAddr>()
                    .map_err(|e| ConfigError::Brick(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let size = |name: &'static str, default: u64| -> Result<u64, ConfigError> {
            var(name).map_or(Ok(default), |v| parse_size(&v).map_err(|e| ConfigError::Size(name, e)))
        };
        let num = |name: &'static str, default: u64| -> Result<u64, ConfigError> {
            var(name).map_or(Ok(default), |v| {
                v.trim().parse().map_err(|_| ConfigError::Invalid(name, v))
            })
        };
        Ok(Some(Config {
            bricks,
            secret: var(env::SECRET).unwrap_or_default().into_bytes(),
            budget: match var(env::LOCAL) {
                Some(v) => v.parse().map_err(|e| ConfigError::Size(env::LOCAL, e))?,
                None => Budget::Percent(50.0),
            },
            threshold_bytes: size(env::THRESHOLD, 1 << 20)?.max(1),
            window_bytes: var(env::WINDOW)
                .map(|v| parse_size(&v).map_err(|e| ConfigError::Size(env::WINDOW, e)))
                .transpose()?,
            handler: var(env::HANDLER).map_or(Ok(default_handler(crate::sys::allowed_cpus())), |v| v.parse())?,
            handlers: (num(env::HANDLERS, default_handlers() as u64)? as usize).clamp(1, MAX_HANDLERS),
            handlers_explicit: var(env::HANDLERS).is_some(),
            pipeline: (num(env::PIPELINE, DEFAULT_PIPELINE as u64)? as usize).min(MAX_PIPELINE),
            prefetch_pages: num(env::PREFETCH, 128)? as usize,
            read_around_pages: (num(env::READ_AROUND, DEFAULT_READ_AROUND as u64)? as usize).min(MAX_READ_AROUND),
            readahead_sample: num(env::READAHEAD_SAMPLE, 256)?.min(u64::from(u32::MAX)) as u32,
            timeout: Duration::from_millis(num(env::TIMEOUT_MS, 10_000)?),
            watchdog: Duration::from_millis(num(env::WATCHDOG_MS, 2_000)?),
            keepalive: Duration::from_millis(num(
                env::KEEPALIVE_MS,
                rackmem_transport::KEEPALIVE_INTERVAL.as_millis() as u64,
            )?),
            stats_file: var(env::STATS_FILE),
            verbose: var(env::VERBOSE).is_some_and(|v| v != "0"),
            grow_bytes: size(env::GROW, 256 << 20)?.max(2 << 20),
            link_spin: Duration::from_micros(num(env::LINK_SPIN_US, 50)?),
            recycle_min_pages: num(env::RECYCLE_MIN_PAGES, rackmem_pager::fault::RECYCLE_MIN_PAGES)?.max(1),
            local_floor_bytes: size(env::LOCAL_FLOOR, LOCAL_FLOOR_BYTES)?,
            shared_memory: match var(env::SHARED_MEMORY).as_deref().map(str::trim) {
                // An emulated network is emulated on the link: mapping the segment would skip it.
                _ if var(rackmem_transport::EMULATE_ENV).is_some_and(|v| !v.trim().is_empty()) => ShareChoice::Never,
                None | Some("auto") => ShareChoice::Auto,
                Some("0") | Some("off") | Some("no") => ShareChoice::Never,
                Some("1") | Some("on") | Some("yes") => ShareChoice::Always,
                Some(v) => return Err(ConfigError::Invalid(env::SHARED_MEMORY, v.to_string())),
            },
            notice_dir: var(env::NOTICE_DIR),
            run_budget: var(env::RUN_BUDGET),
            tls: TlsClient::from_env().transpose().map_err(ConfigError::Tls)?,
            eviction: var(env::EVICTION).map_or(Ok(Eviction::default()), |v| v.parse())?,
            migration_direct: match var(env::MIGRATION).as_deref().map(str::trim) {
                None | Some("direct") => true,
                Some("bounce") => false,
                Some(v) => return Err(ConfigError::Invalid(env::MIGRATION, v.to_string())),
            },
            huge_pages: match var(env::HUGE_PAGES).as_deref().map(str::trim) {
                None | Some("0") | Some("off") | Some("no") => HugePages::Off,
                Some("1") | Some("on") | Some("yes") => HugePages::On,
                Some(v) => return Err(ConfigError::Invalid(env::HUGE_PAGES, v.to_string())),
            },
            fork_lazy: match var(env::FORK).as_deref().map(str::trim) {
                None | Some("lazy") => true,
                Some("eager") => false,
                Some(v) => return Err(ConfigError::Invalid(env::FORK, v.to_string())),
            },
            load_control: match var(env::LOAD_CONTROL).as_deref().map(str::trim) {
                None | Some("1") | Some("on") | Some("yes") => true,
                Some("0") | Some("off") | Some("no") => false,
                Some(v) => return Err(ConfigError::Invalid(env::LOAD_CONTROL, v.to_string())),
            },
            agent,
        }))
    }
}
