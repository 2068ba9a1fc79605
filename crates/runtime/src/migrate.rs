//! User-managed migration (seed 001's UMPM): the program asks for a window range to move to
//! another memory, and the call returns when it is there.
//!
//! Targets: the local buffer (the range is fetched and pinned until unpinned or released) or a
//! brick named in `RACKMEM_BRICKS`. A move to a brick is *bounced* through this process (seed
//! 001, section V): the brick-valid pages are read from their old home and written to a
//! segment on the target, then the segment table sends the range there. Each migration is
//! timed in the seed's four steps (Table III):
//!
//! - **Setup**: check the request, split the range into per-source pieces (the core's
//!   [`Placement`](rackmem_pager::placement)), begin the move in the core and wait until no
//!   write-back to the old home is in flight;
//! - **Allocate**: find room on the target: the range's own place in the window's segment on
//!   that brick, else a segment carved for migrations there;
//! - **Transfer**: read the pages from the old home, write them to the target, in bounded
//!   batches;
//! - **Finalize**: in one step under the core's lock, the core's placement and the segment
//!   table point the range at the target; the write-backs parked meanwhile go to the write-back
//!   thread, which sends them there.
//!
//! The program keeps running: faults read the old home, which nothing writes during the move
//! (the core parks the range's write-backs: see `Core::begin_move`), and a write lands on a
//! resident page, whose eviction is written to the new home once the move ends. The old home's
//! pages are left as they are: a fault that looked up the old home before the Finalize may
//! still be reading them.

use crate::inner::Job;
use crate::segment;
use crate::{writeback, Runtime, PAGE, PAGE_SIZE};
use rackmem_pager::placement::Memory;
use rackmem_proto::{Extent, PullGrant, PullOrder, PullPiece, SegmentGrant, Status, MAX_PULL_PIECES};
use rackmem_transport::{BrickAddr, Link, LinkError};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Pages per transfer batch: bounds the bytes a migration holds in flight (1 MiB).
const BATCH_PAGES: usize = 256;
/// Smallest segment carved on a brick for migrations (later migrations to the brick share it).
const MIGRATION_SEGMENT_BYTES: u64 = 64 << 20;
/// Most bytes one pull order asks of the target brick: bounds how long the order's answer
/// takes, and how long write-backs to the target's segment queue behind it on its link.
const ORDER_BYTES: u64 = 8 << 20;
/// Pull orders of one migration queued on the target at once (at most 32 MiB): the target
/// serves them one after another without waiting for this node between two; a slow target
/// simply answers later, and no more is sent until it does.
const ORDERS_IN_FLIGHT: usize = 4;
/// Smallest piece a target brick pulls; smaller ones are bounced. A target keeps its links to
/// sources between orders, so an order costs a round trip to it and an ATTACH_PULL and DETACH
/// on the kept link, no connection: measured in one run of `rackmem bench migration`
/// (`docs/benchmarks.md`, "Direct migration"), direct beat the bounce from 1 MiB on and lost
/// below 128 KiB, where the order's round trips outweigh a bounce of a few pages.
const DIRECT_MIN_BYTES: u64 = 1 << 20;
/// Pages of a migration segment on a mapped brick that one POPULATE asks the brick to hold
/// memory for, ahead of small bounced moves (1 MiB): later moves into them copy into the
/// mapping instead of sending a request, and the request is paid once per step.
const POPULATE_STEP_PAGES: u64 = 256;
/// How long a pull grant is valid: far more than an order takes, and no longer.
const PULL_GRANT_LIFETIME: Duration = Duration::from_secs(60);
/// Longest a move waits for the write-backs to its old home already in flight.
const READY_WAIT: Duration = Duration::from_secs(30);

/// Where a migration sends a range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The local buffer: fetched and pinned.
    Local,
    /// A brick of `RACKMEM_BRICKS`, and how the pages get there.
    Brick(BrickAddr, Route),
}

/// How a move to a brick carries its pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `RACKMEM_MIGRATION`'s choice: pulled by the target from pieces of
    /// [`DIRECT_MIN_BYTES`] on, bounced below (and always with `RACKMEM_MIGRATION=bounce`).
    Chosen,
    /// Pulled by the target whatever the size (`"direct:ADDR"`; bounced only when the target
    /// cannot reach the source): for measuring the two against each other in one run.
    Pull,
    /// Bounced through this process (`"bounce:ADDR"`).
    Bounce,
}

/// The four steps of one migration (seed 001, Table III), and what it moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MigrationTimes {
    /// Checking the request, beginning the move, waiting out write-backs in flight.
    pub setup_ns: u64,
    /// Finding room on the target (carving a segment if needed).
    pub allocate_ns: u64,
    /// Reading from the old home and writing to the target (or fetching, for the local buffer).
    pub transfer_ns: u64,
    /// Pointing the range at the target and sending the parked write-backs.
    pub finalize_ns: u64,
    /// Bytes carried (read and written once each).
    pub bytes: u64,
}

/// Why a migration failed; the range is where it was.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The range is empty, or not inside allocated window memory.
    #[error("{addr:#x}+{len} is not a range of allocated window memory")]
    Outside {
        /// Address asked for.
        addr: usize,
        /// Length asked for.
        len: usize,
    },
    /// The target names no brick of `RACKMEM_BRICKS`.
    #[error("no brick {0:?} to migrate to (give \"local\", an address of RACKMEM_BRICKS, or with a node agent one the control plane lists)")]
    UnknownBrick(String),
    /// The target has no room: the brick cannot carve a segment, or the local buffer cannot pin
    /// that much.
    #[error("{0}")]
    NoSpace(String),
    /// Part of the range is moving already, or write-backs to it did not end in time.
    #[error("window pages {first}..{end} are busy: {why}")]
    Busy {
        /// First page.
        first: u64,
        /// End page (exclusive).
        end: u64,
        /// What holds them.
        why: String,
    },
    /// The source brick failed during the migration: the range stays where it was (on a brick
    /// the program may no longer reach: its next fault there stops it).
    #[error("source brick {addr} failed during the migration: {err}; the range stays where it was")]
    SourceLost {
        /// The source.
        addr: String,
        /// What failed.
        err: String,
    },
    /// The target brick failed during the migration: the range stays on its source.
    #[error("brick {addr} failed during the migration: {err}; the range stays where it was")]
    TargetLost {
        /// The target.
        addr: String,
        /// What failed.
        err: String,
    },
}

impl MigrateError {
    /// The `errno` that `rackmem_migrate` reports for this error.
    pub fn errno(&self) -> i32 {
        match self {
            MigrateError::Outside { .. } => libc::EINVAL,
            MigrateError::UnknownBrick(_) => libc::ENOENT,
            MigrateError::NoSpace(_) => libc::ENOSPC,
            MigrateError::Busy { .. } => libc::EBUSY,
            MigrateError::TargetLost { .. } | MigrateError::SourceLost { .. } => libc::EIO,
        }
    }
}

/// Most freed runs a migration segment remembers (joined where adjacent once past their
/// grace); a run freed past it is left unused, as all were before runs were reused.
const MAX_FREE_RUNS: usize = 256;

/// How long a run of a segment that no window page names any more is left alone before it is
/// reused or retired: a fault that looked the old home up just before a Finalize reads it a
/// moment later, and has had far longer than that once the watchdog's limit for one fault has
/// passed.
pub(crate) fn fault_grace(cfg: &crate::config::Config) -> Duration {
    cfg.watchdog.clamp(Duration::from_millis(100), Duration::from_secs(2))
}

/// A segment carved on a brick for migrations: filled from its start, and the runs that ranges
/// moved out of are reused, after [`fault_grace`], by later moves of more than
/// [`POPULATE_STEP_PAGES`] (a move into pages the brick has already written is a copy, not a
/// first touch: fresh memory cost a 32 MiB pull 3 to 10 times the link floor here,
/// `docs/benchmarks.md`). Smaller moves keep taking fresh pages, which the brick populates
/// ahead of them ([`Runtime::held_by_brick`]).
pub(crate) struct MigrationSegment {
    index: usize,
    addr: BrickAddr,
    pages: u64,
    next_page: u64,
    /// Runs of segment pages below `next_page` no window page names any more, and since when.
    free: Vec<(std::ops::Range<u64>, Instant)>,
    /// Pages its brick holds memory for (populated at this process's request): the last
    /// POPULATE that answered.
    held: std::ops::Range<u64>,
    /// A POPULATE sent ahead of the next moves, not yet waited for, and its pages.
    ahead: Option<(rackmem_transport::DetachedTicket, std::ops::Range<u64>)>,
}

/// True if every window page of `[first, end)` lies in an allocation of the program.
fn allocated(c: &rackmem_pager::Core, first: u64, end: u64) -> bool {
    let mut p = first;
    while p < end {
        let Some((s, l)) = c.regions().region_containing(p) else {
            return false;
        };
        p = s + l;
    }
    true
}

/// Joins neighbouring free runs that have both waited out `grace` (the joined run has too),
/// in segment order.
fn coalesce(free: &mut Vec<(std::ops::Range<u64>, Instant)>, now: Instant, grace: Duration) {
    free.sort_unstable_by_key(|(r, _)| r.start);
    let ripe = |since: &Instant| now.duration_since(*since) >= grace;
    let mut out: Vec<(std::ops::Range<u64>, Instant)> = Vec::with_capacity(free.len());
    for (r, since) in free.drain(..) {
        match out.last_mut() {
            Some((p, ps)) if p.end == r.start && ripe(ps) && ripe(&since) => {
                p.end = r.end;
                *ps = (*ps).max(since);
            }
            _ => out.push((r, since)),
        }
    }
    *free = out;
}

/// The pages of a mapped migration segment held now, after its brick answered a POPULATE of
/// `answered`: joined to `held` where they meet. This process maps the answered pages too
/// (the brick owns them already, so nothing is charged to this process): a small move's copy
/// into them then takes no page fault (about 5 µs each here, most of a single page's
/// transfer).
fn held_now(
    seg: &crate::segment::Segment,
    held: &std::ops::Range<u64>,
    answered: std::ops::Range<u64>,
) -> std::ops::Range<u64> {
    if let Some(m) = seg.shared.get() {
        // Advisory: a failure leaves the faults to the copy.
        let _ = m.populate(
            (answered.start * PAGE) as usize,
            ((answered.end - answered.start) * PAGE) as usize,
        );
    }
    if held.start <= answered.start && answered.start <= held.end {
        held.start..held.end.max(answered.end)
    } else {
        answered
    }
}

/// The runtime's migration state: the segments carved for migrations.
#[derive(Default)]
pub(crate) struct Migrations {
    segments: Mutex<Vec<MigrationSegment>>,
    /// Serialises migrations to bricks (one at a time; each splits into one move per piece).
    one: Mutex<()>,
}

impl Migrations {
    /// Held while a migration or an evacuation runs.
    pub(crate) fn lock_one(&self) -> std::sync::MutexGuard<'_, ()> {
        self.one.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pages `pages` of segment `index` are no window page's home any more (a move took their
    /// range elsewhere): if it is a migration segment, a later move reuses them once
    /// [`fault_grace`] has passed.
    fn freed(&self, index: usize, pages: std::ops::Range<u64>) {
        let mut list = self.segments.lock().unwrap_or_else(|e| e.into_inner());
        let Some(m) = list.iter_mut().find(|m| m.index == index) else {
            return;
        };
        if pages.is_empty() || pages.end > m.next_page {
            return;
        }
        debug_assert!(
            !m.free.iter().any(|(f, _)| f.start < pages.end && pages.start < f.end),
            "segment pages {pages:?} freed twice"
        );
        // Kept apart from its neighbours until both have waited out the grace (see
        // `coalesce`): joined now, the older one's pages would wait for this one's.
        if m.free.len() >= MAX_FREE_RUNS {
            coalesce(&mut m.free, Instant::now(), Duration::ZERO);
        }
        if m.free.len() < MAX_FREE_RUNS {
            m.free.push((pages, Instant::now()));
        }
    }

    /// Segment `old` is being emptied into segment `new` (`pages` pages on `addr`), page for
    /// page: if it was a migration segment, `new` takes its place, with its free rest.
    pub(crate) fn replaced(&self, old: usize, new: usize, addr: &BrickAddr, pages: u64) {
        let mut list = self.segments.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = list.iter_mut().find(|m| m.index == old) {
            m.index = new;
            m.addr = addr.clone();
            m.pages = pages;
            // Held pages were the old segment's; its POPULATE's answer is dropped with its link.
            m.held = 0..0;
            m.ahead = None;
            // Its free runs are forgotten: the evacuation's moves freed every run of the old
            // segment, and the same pages of the new one are those ranges' homes now.
            m.free.clear();
        }
    }
}

impl Runtime {
    /// Parses a `rackmem_migrate` target: `"local"` or an address of `RACKMEM_BRICKS`,
    /// optionally prefixed by `direct:` or `bounce:` to force the route (see [`Route`]).
    pub fn migration_target(&self, target: &str) -> Result<Target, MigrateError> {
        if target == "local" {
            return Ok(Target::Local);
        }
        let (route, brick) = if let Some(b) = target.strip_prefix("direct:") {
            (Route::Pull, b)
        } else if let Some(b) = target.strip_prefix("bounce:") {
            (Route::Bounce, b)
        } else {
            (Route::Chosen, target)
        };
        let addr: BrickAddr = brick
            .parse()
            .map_err(|_| MigrateError::UnknownBrick(target.to_string()))?;
        // With an agent, the control plane says which bricks the node may use (at Allocate).
        if self.inner.agent.is_none() && !self.inner.cfg.bricks.contains(&addr) {
            return Err(MigrateError::UnknownBrick(target.to_string()));
        }
        Ok(Target::Brick(addr, route))
    }

    /// Moves `[addr, addr+len)` (page-rounded outward) to `target` and returns when it is
    /// there, with the step times; see the module documentation.
    pub fn migrate(&self, addr: usize, len: usize, target: &Target) -> Result<MigrationTimes, MigrateError> {
        let t0 = Instant::now();
        let inner = &self.inner;
        let outside = || MigrateError::Outside { addr, len };
        let base = inner.window.addr();
        let end_addr = addr.checked_add(len).ok_or_else(outside)?;
        if len == 0 || addr < base || end_addr > base + inner.window.len() {
            return Err(outside());
        }
        let first = ((addr - base) / PAGE_SIZE) as u64;
        let end = ((end_addr - base).div_ceil(PAGE_SIZE)) as u64;
        // No SIGPIPE mask around the move (it cost four system calls a move): everything it
        // writes on this program thread goes out with MSG_NOSIGNAL (links, the agent's lines,
        // a TLS handshake), so a peer that hung up is an error here, never the signal.
        let times = match target {
            Target::Local => {
                if !allocated(&inner.lock_soon(), first, end) {
                    return Err(outside());
                }
                self.pin_local(first, end, t0)?
            }
            // Checked there, under the lock the move's Setup takes anyway.
            Target::Brick(b, route) => self.move_to_brick(first, end, b, *route, t0, outside)?,
        };
        let s = &inner.stats;
        s.migrations.fetch_add(1, Ordering::Relaxed);
        s.migration_bytes.fetch_add(times.bytes, Ordering::Relaxed);
        s.migration_setup_ns.fetch_add(times.setup_ns, Ordering::Relaxed);
        s.migration_allocate_ns.fetch_add(times.allocate_ns, Ordering::Relaxed);
        s.migration_transfer_ns.fetch_add(times.transfer_ns, Ordering::Relaxed);
        s.migration_finalize_ns.fetch_add(times.finalize_ns, Ordering::Relaxed);
        Ok(times)
    }

    /// Ends the pin of `[addr, addr+len)` (page-rounded outward): its pages may be evicted again.
    pub fn unpin(&self, addr: usize, len: usize) -> Result<(), MigrateError> {
        let inner = &self.inner;
        let base = inner.window.addr();
        let end_addr = addr.checked_add(len).ok_or(MigrateError::Outside { addr, len })?;
        if len == 0 || addr < base || end_addr > base + inner.window.len() {
            return Err(MigrateError::Outside { addr, len });
        }
        let first = ((addr - base) / PAGE_SIZE) as u64;
        let end = ((end_addr - base).div_ceil(PAGE_SIZE)) as u64;
        inner.lock().unpin(first, end - first);
        Ok(())
    }

    /// The local buffer as target: pin the range, then fault it in from this thread (the
    /// handler serves the faults as any other, in sequential runs).
    fn pin_local(&self, first: u64, end: u64, t0: Instant) -> Result<MigrationTimes, MigrateError> {
        let inner = &self.inner;
        let n = end - first;
        {
            let mut c = inner.lock();
            let budget = inner.budget_pages(&c);
            // Pinned outside the range (pins inside it are taken again).
            let pinned: u64 = c
                .placement()
                .held_by(Memory::Local)
                .iter()
                .map(|r| (r.end - r.start) - r.end.min(end).saturating_sub(r.start.max(first)))
                .sum();
            // Pins take at most half the local buffer: faults elsewhere must still find room.
            if pinned + n > budget / 2 {
                return Err(MigrateError::NoSpace(format!(
                    "pinning {} in the local buffer would pin more than half of its {} (already pinned: {})",
                    crate::size::format_size(n * PAGE),
                    crate::size::format_size(budget * PAGE),
                    crate::size::format_size(pinned * PAGE)
                )));
            }
            c.pin(first, n);
        }
        let setup = t0.elapsed();
        let t1 = Instant::now();
        let mut byte = [0u8; 1];
        for p in first..end {
            // A read faults the page in if it is not resident (and does nothing if it is).
            inner.window.read(p as usize * PAGE_SIZE, &mut byte);
        }
        Ok(MigrationTimes {
            setup_ns: setup.as_nanos() as u64,
            allocate_ns: 0,
            transfer_ns: t1.elapsed().as_nanos() as u64,
            finalize_ns: 0,
            bytes: n * PAGE,
        })
    }

    /// A brick as target, bounced through this process.
    fn move_to_brick(
        &self,
        first: u64,
        end: u64,
        target: &BrickAddr,
        route: Route,
        t0: Instant,
        outside: impl FnOnce() -> MigrateError,
    ) -> Result<MigrationTimes, MigrateError> {
        let inner = &self.inner;
        let _one = inner.migrations.lock_one();
        let mut times = MigrationTimes::default();
        // Setup: the pieces of the range by source. Pieces already on the target stay. One
        // taking of the core's lock for both: the write-back thread takes it often while it
        // runs, and each wait for it costs a single page's move more than its copy.
        let pieces = {
            let mut c = inner.lock_soon();
            if !allocated(&c, first, end) {
                return Err(outside());
            }
            let pieces = c.placement().pieces(first..end);
            c.unpin(first, end - first);
            pieces
        };
        let mut todo: Vec<(u64, u64)> = Vec::new();
        for p in pieces {
            let on_target = match p.memory {
                Some(Memory::Segment(s)) => inner.table.get(s as usize).is_some_and(|seg| &seg.addr == target),
                _ => false,
            };
            if !on_target {
                // Pinned pieces too: a move to a brick ends their pin, and their home moves.
                todo.push((p.pages.start, p.pages.end));
            }
        }
        times.setup_ns = t0.elapsed().as_nanos() as u64;
        for (a, b) in todo {
            let t = self.move_piece(a, b, target, None, route)?;
            times.setup_ns += t.setup_ns;
            times.allocate_ns += t.allocate_ns;
            times.transfer_ns += t.transfer_ns;
            times.finalize_ns += t.finalize_ns;
            times.bytes += t.bytes;
        }
        Ok(times)
    }

    /// Moves the window pages `[first, end)` (one source) to `target`: into `room` (segment
    /// index, segment page of `first`) when given, else where [`Runtime::room_on`] finds room.
    pub(crate) fn move_piece(
        &self,
        first: u64,
        end: u64,
        target: &BrickAddr,
        room: Option<(usize, u64)>,
        route: Route,
    ) -> Result<MigrationTimes, MigrateError> {
        let inner = &self.inner;
        let n = end - first;
        let t0 = Instant::now();
        // Setup: begin the move; wait out write-backs to the old home already in flight; list
        // the brick-valid pages to carry (no page becomes brick-valid during a move, its
        // write-backs are parked: listed now or at Transfer, the same pages), all under one
        // taking of the core's lock when no write-back is in the way.
        let (id, pages) = {
            let mut c = inner.lock_soon();
            let id = c.begin_move(first..end).map_err(|e| MigrateError::Busy {
                first,
                end,
                why: e.to_string(),
            })?;
            let deadline = Instant::now() + READY_WAIT;
            while !c.move_ready(id) {
                if Instant::now() >= deadline {
                    let parked = c.abort_move(id);
                    drop(c);
                    self.send_parked(parked);
                    return Err(MigrateError::Busy {
                        first,
                        end,
                        why: format!("write-backs to their brick did not end within {READY_WAIT:?}"),
                    });
                }
                c = inner
                    .core_cv
                    .wait_timeout(c, Duration::from_millis(1))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            (id, c.move_pages(id))
        };
        let setup_ns = t0.elapsed().as_nanos() as u64;
        // Allocate.
        let t1 = Instant::now();
        let (index, seg_page) = match room.map_or_else(|| self.room_on(target, first, n), Ok) {
            Ok(r) => r,
            Err(e) => {
                let parked = inner.lock().abort_move(id);
                self.send_parked(parked);
                return Err(e);
            }
        };
        // A move the bounce carries (the size says so before the pages are counted): into pages
        // the brick holds memory for, so that a mapped target takes them by a memory copy.
        let bounced = match route {
            Route::Bounce => true,
            Route::Pull => false,
            Route::Chosen => !inner.cfg.migration_direct || n * PAGE < DIRECT_MIN_BYTES,
        };
        let held = bounced && self.held_by_brick(index, seg_page, n);
        let allocate_ns = t1.elapsed().as_nanos() as u64;
        // Transfer: the brick-valid pages, old home → target: pulled by the target brick
        // (direct), or bounced through this process when it cannot reach the source.
        let t2 = Instant::now();
        let tried = match route {
            Route::Chosen => inner.cfg.migration_direct && pages.len() as u64 * PAGE >= DIRECT_MIN_BYTES,
            Route::Pull => true,
            Route::Bounce => false,
        };
        let direct = if tried {
            self.pull_direct(&pages, first, index, seg_page, target)
        } else {
            Ok(None)
        };
        let moved = match direct {
            Ok(Some(b)) => {
                inner.stats.migration_pieces_direct.fetch_add(1, Ordering::Relaxed);
                Ok(b)
            }
            Ok(None) => {
                if tried {
                    inner.stats.migration_direct_fallbacks.fetch_add(1, Ordering::Relaxed);
                }
                inner.stats.migration_pieces_bounced.fetch_add(1, Ordering::Relaxed);
                self.bounce(&pages, first, index, seg_page, target, held)
            }
            Err(e) => Err(e),
        };
        let bytes = match moved {
            Ok(b) => b,
            Err(e) => {
                let parked = inner.lock().abort_move(id);
                self.send_parked(parked);
                return Err(e);
            }
        };
        let transfer_ns = t2.elapsed().as_nanos() as u64;
        // Finalize: the core and the segment table point the range at the target together.
        let t3 = Instant::now();
        let old_homes = self.homes_of(first, end);
        let parked = {
            let mut c = inner.lock_soon();
            let parked = c.finish_move(id, index as u32, seg_page);
            inner.table.set_home(first..end, index, seg_page);
            parked
        };
        // Wakes whoever waits on the core (faults held by parked pages) once.
        self.send_parked(parked);
        let room = seg_page..seg_page + n;
        for (i, r) in old_homes {
            if i != index || r.end <= room.start || room.end <= r.start {
                inner.migrations.freed(i, r);
            }
        }
        let finalize_ns = t3.elapsed().as_nanos() as u64;
        // Not part of this move: readies the target for the next, whichever route this took.
        self.populate_ahead(index);
        Ok(MigrationTimes {
            setup_ns,
            allocate_ns,
            transfer_ns,
            finalize_ns,
            bytes,
        })
    }

    /// Bounces `pages` (window pages from `first` on, brick-valid, of one move) through this
    /// process into segment `index` from its page `seg_page`: read from their homes, grouped
    /// by source segment and merged where contiguous there, then written to the target, one
    /// batch of [`BATCH_PAGES`] at a time. `held`: the target brick holds memory for the
    /// target pages already (a mapped target then takes them by a memory copy). Returns the
    /// bytes carried.
    fn bounce(
        &self,
        pages: &[u64],
        first: u64,
        index: usize,
        seg_page: u64,
        target: &BrickAddr,
        held: bool,
    ) -> Result<u64, MigrateError> {
        let inner = &self.inner;
        let dst = inner.segment(index);
        let mut bytes = 0u64;
        // No bigger than the move: a single page's bounce would spend more on a batch-sized
        // buffer's mapping than on its copy.
        let mut buf = vec![0u8; pages.len().min(BATCH_PAGES) * PAGE_SIZE];
        for batch in pages.chunks(BATCH_PAGES) {
            let mut at = 0usize;
            let mut k = 0;
            while k < batch.len() {
                let Some((src_index, _)) = inner.table.lookup(batch[k]) else {
                    inner.internal_error(&format!("window page {} has no segment", batch[k]));
                };
                let mut extents: Vec<Extent> = Vec::new();
                let start_at = at;
                while k < batch.len() {
                    let Some((s, off)) = inner.table.lookup(batch[k]) else {
                        break;
                    };
                    if s != src_index {
                        break;
                    }
                    match extents.last_mut() {
                        Some(e) if e.0 + u64::from(e.1) == off => e.1 += PAGE_SIZE as u32,
                        _ => extents.push((off, PAGE_SIZE as u32)),
                    }
                    at += PAGE_SIZE;
                    k += 1;
                }
                let src = inner.segment(src_index);
                src.limiter.acquire((at - start_at) as u64);
                // The move is aborted and the error returned: the program decides what to do
                // about a brick it may not touch again (its next fault there stops it).
                src.read(&extents, &mut buf[start_at..at])
                    .map_err(|e| MigrateError::SourceLost {
                        addr: src.addr.to_string(),
                        err: e.to_string(),
                    })?;
            }
            let mut extents: Vec<Extent> = Vec::new();
            for &p in batch {
                let off = (seg_page + (p - first)) * PAGE;
                match extents.last_mut() {
                    Some(e) if e.0 + u64::from(e.1) == off => e.1 += PAGE_SIZE as u32,
                    _ => extents.push((off, PAGE_SIZE as u32)),
                }
            }
            // Unless the brick holds them, fresh: the target brick, not this process, first
            // touches its memory.
            dst.write(&extents, &buf[..at], !held)
                .map_err(|e| MigrateError::TargetLost {
                    addr: target.to_string(),
                    err: e.to_string(),
                })?;
            bytes += at as u64;
        }
        Ok(bytes)
    }

    /// Has the target brick pull `pages` (as for [`Runtime::bounce`]) straight from their source
    /// bricks: per source segment, orders of at most [`ORDER_BYTES`] ([`ORDERS_IN_FLIGHT`] of
    /// them queued on the target at once), each with a pull grant for
    /// exactly the source range it reads, signed with the source segment's session key and
    /// void after [`PULL_GRANT_LIFETIME`]. `Ok(None)`: the target cannot pull from a source
    /// (no route, or refused): bounce instead; nothing it copied is used.
    fn pull_direct(
        &self,
        pages: &[u64],
        first: u64,
        index: usize,
        seg_page: u64,
        target: &BrickAddr,
    ) -> Result<Option<u64>, MigrateError> {
        let inner = &self.inner;
        let dst = inner.segment(index);
        let mut bytes = 0u64;
        let mut orders: Vec<(PullOrder, String)> = Vec::new();
        let mut k = 0;
        while k < pages.len() {
            let Some((src_index, _)) = inner.table.lookup(pages[k]) else {
                inner.internal_error(&format!("window page {} has no segment", pages[k]));
            };
            let src = inner.segment(src_index);
            let mut pieces: Vec<PullPiece> = Vec::new();
            let mut order_bytes = 0u64;
            while k < pages.len() && order_bytes < ORDER_BYTES {
                let Some((s, off)) = inner.table.lookup(pages[k]) else {
                    break;
                };
                if s != src_index {
                    break;
                }
                let to = (seg_page + (pages[k] - first)) * PAGE;
                let full = pieces.len() == MAX_PULL_PIECES;
                match pieces.last_mut() {
                    Some(p) if p.src + p.len == off && p.dst + p.len == to => p.len += PAGE,
                    _ if full => break,
                    _ => pieces.push(PullPiece {
                        dst: to,
                        src: off,
                        len: PAGE,
                    }),
                }
                order_bytes += PAGE;
                k += 1;
            }
            let lo = pieces.iter().map(|p| p.src).min().unwrap_or(0);
            let hi = pieces.iter().map(|p| p.src + p.len).max().unwrap_or(0);
            let sg = SegmentGrant {
                grant: src.grant.clone(),
                session_key: src.session_key,
            };
            let expiry = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
                + PULL_GRANT_LIFETIME.as_secs();
            let (pull, key) = PullGrant::issue(&sg, lo, hi - lo, expiry);
            orders.push((
                PullOrder {
                    source: src.addr.to_string(),
                    pull,
                    key,
                    pieces,
                },
                src.addr.to_string(),
            ));
        }
        // Up to ORDERS_IN_FLIGHT orders queue on the target, which serves them one after the
        // other: no round trip to this node between two. Every order sent is answered before
        // this returns, even after a failure, so none runs on after the move has ended.
        let mut sent: std::collections::VecDeque<(rackmem_transport::Ticket<'_>, &str)> =
            std::collections::VecDeque::new();
        let mut next = 0usize;
        let mut failed: Option<Result<Option<u64>, MigrateError>> = None;
        loop {
            while failed.is_none() && sent.len() < ORDERS_IN_FLIGHT && next < orders.len() {
                let (order, from) = &orders[next];
                match dst.writeback().and_then(|l| l.submit_pull(order)) {
                    Ok(t) => sent.push_back((t, from.as_str())),
                    Err(e) => {
                        failed = Some(Err(MigrateError::TargetLost {
                            addr: target.to_string(),
                            err: e.to_string(),
                        }))
                    }
                }
                next += 1;
            }
            let Some((t, from)) = sent.pop_front() else {
                break;
            };
            let mut answer = [0u8; 8];
            let outcome = match t.wait(&mut answer) {
                Ok(()) => {
                    bytes += u64::from_le_bytes(answer);
                    continue;
                }
                Err(LinkError::Refused {
                    status: Status::SourceLost,
                    message,
                    ..
                }) => Err(MigrateError::SourceLost {
                    addr: from.to_string(),
                    err: message,
                }),
                Err(LinkError::Refused { status, message, .. }) => {
                    if inner.cfg.verbose {
                        eprintln!(
                            "rackmem[{}]: brick {target} cannot pull from {from} ({status:?}: {message}); bouncing",
                            std::process::id(),
                        );
                    }
                    Ok(None)
                }
                Err(e) => Err(MigrateError::TargetLost {
                    addr: target.to_string(),
                    err: e.to_string(),
                }),
            };
            // The first failure decides; later answers are collected and dropped.
            failed.get_or_insert(outcome);
        }
        if let Some(f) = failed {
            return f;
        }
        Ok(Some(bytes))
    }

    /// Where window pages `[first, end)` live now: runs of (segment index, segment pages).
    fn homes_of(&self, first: u64, end: u64) -> Vec<(usize, std::ops::Range<u64>)> {
        let mut out: Vec<(usize, std::ops::Range<u64>)> = Vec::new();
        let mut p = first;
        while p < end {
            let Some((index, off, run_end)) = self.inner.table.lookup_run(p) else {
                p += 1;
                continue;
            };
            let stop = run_end.clamp(p + 1, end);
            let at = off / PAGE;
            match out.last_mut() {
                Some((i, r)) if *i == index && r.end == at => r.end += stop - p,
                _ => out.push((index, at..at + (stop - p))),
            }
            p = stop;
        }
        out
    }

    /// Queues the write-backs a move parked (they go to wherever the range lives now).
    fn send_parked(&self, parked: Vec<(u64, Vec<rackmem_pager::Victim>)>) {
        for (id, victims) in parked {
            writeback::submit(&self.inner, Job::Evict { id, victims });
        }
        self.inner.core_cv.notify_all();
    }

    /// True if the brick of segment `index` holds memory for its pages `[page, page+n)`,
    /// making it so for a small move (at most [`POPULATE_STEP_PAGES`]) into a migration
    /// segment on a mapped brick: the POPULATE sent ahead at the last move is collected (it has
    /// usually answered by now), else one of [`POPULATE_STEP_PAGES`] from `page` is sent and
    /// waited for. Advisory: false when the segment is not mapped, is no migration segment,
    /// the move is larger, or the request fails (the bounce then writes over the link, as for
    /// any fresh page).
    fn held_by_brick(&self, index: usize, page: u64, n: u64) -> bool {
        let inner = &self.inner;
        if n > POPULATE_STEP_PAGES {
            return false;
        }
        let Some(seg) = inner.table.get(index).filter(|s| s.shared.get().is_some()) else {
            return false;
        };
        let mut list = inner.migrations.segments.lock().unwrap_or_else(|e| e.into_inner());
        let Some(m) = list.iter_mut().find(|m| m.index == index) else {
            return false;
        };
        let covers = |r: &std::ops::Range<u64>| r.start <= page && page + n <= r.end;
        // Most small moves find their pages held: no request, no wait.
        if covers(&m.held) {
            return true;
        }
        if let Some((t, r)) = m.ahead.take() {
            if seg.fault.wait_detached(t, &mut []).is_ok() {
                m.held = held_now(&seg, &m.held, r);
            }
        }
        if covers(&m.held) {
            return true;
        }
        let r = page..(page + POPULATE_STEP_PAGES).min(m.pages);
        match seg
            .fault
            .submit_populate(r.start * PAGE, (r.end - r.start) * PAGE)
            .and_then(|t| t.wait(&mut []))
        {
            Ok(()) => {
                m.held = held_now(&seg, &m.held, r);
                covers(&m.held)
            }
            Err(e) => {
                if inner.cfg.verbose {
                    eprintln!("rackmem: populating brick {} ahead of migrations: {e}", seg.addr);
                }
                false
            }
        }
    }

    /// After a move into migration segment `index` of a mapped brick: asks its brick, without
    /// waiting, to hold memory for the next [`POPULATE_STEP_PAGES`] it hands out (unless the
    /// last POPULATE covers them), so that the next small move finds them held
    /// ([`Runtime::held_by_brick`] collects the answer). At most one such request per segment
    /// is in flight, so a segment holds at most that much populated ahead of its use.
    fn populate_ahead(&self, index: usize) {
        let inner = &self.inner;
        let Some(seg) = inner.table.get(index).filter(|s| s.shared.get().is_some()) else {
            return;
        };
        let mut list = inner.migrations.segments.lock().unwrap_or_else(|e| e.into_inner());
        let Some(m) = list.iter_mut().find(|m| m.index == index) else {
            return;
        };
        let next = m.next_page;
        let r = next..(next + POPULATE_STEP_PAGES).min(m.pages);
        // Not while half a step is still held ahead of the next move: one request per half
        // step of moves, not one per move.
        if m.ahead.is_some()
            || r.is_empty()
            || (m.held.start <= r.start && r.start + POPULATE_STEP_PAGES / 2 <= m.held.end)
        {
            return;
        }
        let sent = seg
            .fault
            .submit_populate(r.start * PAGE, (r.end - r.start) * PAGE)
            .map(|t| t.detach());
        if let Ok(t) = sent {
            m.ahead = Some((t, r));
        }
    }

    /// Room for window pages `[first, first+n)` on `target`: their own place in the window's
    /// segment on that brick (where the concatenation puts them), else the next free pages of a
    /// segment carved there for migrations (carving one if none has room). Returns the segment
    /// index and the segment page for `first`.
    fn room_on(&self, target: &BrickAddr, first: u64, n: u64) -> Result<(usize, u64), MigrateError> {
        let inner = &self.inner;
        // The range's own place in the window's segment on the target, when it is there.
        if let (Some((index, off)), Some((_, end))) =
            (inner.table.concatenated(first), inner.table.concatenated(first + n - 1))
        {
            // A segment a drain emptied is no place to go back to.
            if let Some(seg) = inner.table.get(index) {
                if &seg.addr == target && end == off + (n - 1) * PAGE {
                    return Ok((index, off / PAGE));
                }
            }
        }
        let mut list = inner.migrations.segments.lock().unwrap_or_else(|e| e.into_inner());
        if n > POPULATE_STEP_PAGES {
            // The smallest free run that fits, past its grace: a smaller move carved out of a
            // large run would leave the next large move only fresh pages.
            let now = Instant::now();
            let grace = fault_grace(&inner.cfg);
            for m in list.iter_mut().filter(|m| &m.addr == target) {
                coalesce(&mut m.free, now, grace);
            }
            // A fault still being served that began before a run was freed may have looked the
            // run up as its pages' home and not read it yet: that run waits for it however long
            // it takes (the grace alone would be a guess about the scheduler on a loaded
            // machine). A handler's start time and `Instant` are the same monotonic clock, read a
            // moment apart: the millisecond covers that.
            let now_ns = inner.now_ns();
            let oldest_fault = inner
                .fault_started_ns
                .iter()
                .map(|s| s.load(Ordering::Acquire))
                .filter(|&s| s != 0)
                .map(|s| Duration::from_nanos(now_ns.saturating_sub(s)) + Duration::from_millis(1))
                .max();
            let unread = |since: &Instant| oldest_fault.is_some_and(|age| age >= now.duration_since(*since));
            let best = list
                .iter()
                .enumerate()
                .filter(|(_, m)| &m.addr == target)
                .flat_map(|(k, m)| m.free.iter().enumerate().map(move |(i, f)| (k, i, f)))
                .filter(|(_, _, (r, since))| {
                    r.end - r.start >= n && now.duration_since(*since) >= grace && !unread(since)
                })
                .min_by_key(|(_, _, (r, _))| r.end - r.start)
                .map(|(k, i, _)| (k, i));
            if let Some((k, i)) = best {
                let m = &mut list[k];
                let at = m.free[i].0.start;
                m.free[i].0.start += n;
                if m.free[i].0.is_empty() {
                    m.free.remove(i);
                }
                inner.stats.migration_pages_reused.fetch_add(n, Ordering::Relaxed);
                return Ok((m.index, at));
            }
        }
        // A small move goes where the brick populated pages ahead (see `populate_ahead`), else
        // to the first segment with room.
        let ahead = |m: &MigrationSegment| {
            let r = m.next_page..m.next_page + n;
            let covers = |h: &std::ops::Range<u64>| h.start <= r.start && r.end <= h.end;
            covers(&m.held) || m.ahead.as_ref().is_some_and(|(_, h)| covers(h))
        };
        let fits = |m: &MigrationSegment| &m.addr == target && m.pages - m.next_page >= n;
        let pick = list
            .iter()
            .position(|m| fits(m) && n <= POPULATE_STEP_PAGES && ahead(m))
            .or_else(|| list.iter().position(&fits));
        if let Some(m) = pick.map(|k| &mut list[k]) {
            let at = m.next_page;
            m.next_page += n;
            return Ok((m.index, at));
        }
        let lost = |e: &dyn std::fmt::Display| MigrateError::TargetLost {
            addr: target.to_string(),
            err: e.to_string(),
        };
        let cfg = &inner.cfg;
        let bytes = (n * PAGE).max(MIGRATION_SEGMENT_BYTES).div_ceil(2 << 20) * (2 << 20);
        if let Some(agent) = &inner.agent {
            return self.room_from_agent(agent, &mut list, target, bytes, n);
        }
        let fault = Link::connect_with(target, cfg.timeout, cfg.tls.as_ref()).map_err(|e| lost(&e))?;
        let seg = fault.alloc_segment(&cfg.secret, bytes).map_err(|e| {
            if e.is_no_space() {
                MigrateError::NoSpace(format!(
                    "brick {target} has no room for a segment of {}: {e}",
                    crate::size::format_size(bytes)
                ))
            } else {
                lost(&e)
            }
        })?;
        let (pages, build) = segment::standalone(target.clone(), seg, fault, cfg).map_err(|e| lost(&e))?;
        let _change = inner.table.change_lock();
        let index = inner
            .table
            .push(pages, build)
            .ok_or_else(|| MigrateError::NoSpace(format!("{} segments attached already", segment::MAX_SEGMENTS)))?;
        list.push(MigrationSegment {
            index,
            addr: target.clone(),
            pages,
            next_page: n,
            held: 0..0,
            ahead: None,
            free: Vec::new(),
        });
        Ok((index, 0))
    }

    /// Allocate on managed memory: the control plane places a segment of `bytes` on `target`
    /// (accounted to this process like any grow, refused when the brick is full or unknown),
    /// attached outside the window's concatenation as a migration segment.
    fn room_from_agent(
        &self,
        agent: &crate::agent::Agent,
        list: &mut Vec<MigrationSegment>,
        target: &BrickAddr,
        bytes: u64,
        n: u64,
    ) -> Result<(usize, u64), MigrateError> {
        let (index, pages) = self.attach_aside(agent, target, bytes, n)?;
        list.push(MigrationSegment {
            index,
            addr: target.clone(),
            pages,
            next_page: n,
            held: 0..0,
            ahead: None,
            free: Vec::new(),
        });
        Ok((index, 0))
    }

    /// A segment of `bytes` (at least `n` pages) the control plane places on `target`,
    /// attached aside ([`SegmentTable::push_aside`](crate::segment::SegmentTable::push_aside)):
    /// its index and pages.
    pub(crate) fn attach_aside(
        &self,
        agent: &crate::agent::Agent,
        target: &BrickAddr,
        bytes: u64,
        n: u64,
    ) -> Result<(usize, u64), MigrateError> {
        let inner = &self.inner;
        let cfg = &inner.cfg;
        let lost = |e: &dyn std::fmt::Display| MigrateError::TargetLost {
            addr: target.to_string(),
            err: e.to_string(),
        };
        let name = target.to_string();
        let a = agent.grow_on(bytes, Some(&name)).map_err(|e| match &e {
            crate::agent::AgentError::Refused { code, .. } if code == "not_found" => {
                MigrateError::UnknownBrick(name.clone())
            }
            crate::agent::AgentError::Refused { .. } => MigrateError::NoSpace(format!("brick {name}: {e}")),
            _ => lost(&e),
        })?;
        let give_back = |e: MigrateError| {
            // Not attached: return it, or it stays accounted to this process until it exits.
            let _ = agent.release(a.allocation);
            e
        };
        let [s] = a.segments.as_slice() else {
            return Err(give_back(lost(&format!(
                "the agent answered {} segments for a migration target, not one",
                a.segments.len()
            ))));
        };
        let (grant, session_key) = crate::agent::credentials(s).map_err(|e| give_back(lost(&e)))?;
        if s.brick_address != name {
            return Err(give_back(lost(&format!("the agent placed it on {}", s.brick_address))));
        }
        let fault = Link::connect_with(target, cfg.timeout, cfg.tls.as_ref()).map_err(|e| give_back(lost(&e)))?;
        fault.attach(&grant, &session_key).map_err(|e| give_back(lost(&e)))?;
        let seg = rackmem_proto::SegmentGrant { grant, session_key };
        let (pages, build) = segment::standalone(target.clone(), seg, fault, cfg).map_err(|e| give_back(lost(&e)))?;
        if pages < n {
            return Err(give_back(lost(&"the agent's segment is smaller than asked")));
        }
        let allocation = a.allocation;
        let _change = inner.table.change_lock();
        let index = inner
            .table
            .push_aside(pages, move |first_page| {
                let mut seg = build(first_page);
                seg.allocation = Some(allocation);
                seg
            })
            .ok_or_else(|| {
                give_back(MigrateError::NoSpace(format!(
                    "{} segments attached already",
                    segment::MAX_SEGMENTS
                )))
            })?;
        Ok((index, pages))
    }
}

impl MigrateError {
    /// The code an order's refusal carries to `rackmem migrate --pid` (its exit status follows
    /// from it).
    pub fn code(&self) -> &'static str {
        match self {
            MigrateError::Outside { .. } => "outside_window",
            MigrateError::UnknownBrick(_) => "unknown_brick",
            MigrateError::NoSpace(_) => "no_space",
            MigrateError::Busy { .. } => "busy",
            MigrateError::TargetLost { .. } | MigrateError::SourceLost { .. } => "brick_failed",
        }
    }
}

/// Longest order line read from the agent.
const MAX_ORDER_LINE: u64 = 64 << 10;

/// The order thread (`rackmem migrate --pid`, and a drain's `evacuate`): reads the agent's
/// orders on the order connection, one at a time, carries each out (a migration as
/// `rackmem_migrate` would; an evacuation: `evacuate.rs`), and answers with the step times,
/// the segments emptied, or why not. Ends when the agent closes the connection.
pub(crate) fn serve_orders(inner: std::sync::Arc<crate::inner::Inner>) {
    use rackmem_proto::{AgentMigration, AgentReply, AgentRequest};
    use std::io::{BufRead, BufReader, Read, Write};
    let Some(mut out) = inner.agent.as_ref().and_then(|a| a.orders()) else {
        return;
    };
    let Ok(r) = out.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(r);
    let rt = Runtime { inner };
    loop {
        let mut line = String::new();
        match Read::take(&mut reader, MAX_ORDER_LINE).read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let answer = match serde_json::from_str::<AgentRequest>(&line) {
            Ok(AgentRequest::Migrate {
                addr, len, to, order, ..
            }) => {
                // Like a program thread's call: a fork waits until the move has ended, so the
                // child never inherits the runtime's locks held.
                let _call = crate::CallGuard::enter();
                let done = rt.migration_target(&to).and_then(|t| {
                    let addr = usize::try_from(addr).map_err(|_| MigrateError::Outside { addr: 0, len: 0 })?;
                    let len = usize::try_from(len).map_err(|_| MigrateError::Outside { addr, len: 0 })?;
                    rt.migrate(addr, len, &t)
                });
                match done {
                    Ok(t) => AgentReply::migrated(
                        order,
                        AgentMigration {
                            setup_ns: t.setup_ns,
                            allocate_ns: t.allocate_ns,
                            transfer_ns: t.transfer_ns,
                            finalize_ns: t.finalize_ns,
                            bytes: t.bytes,
                        },
                    ),
                    Err(e) => AgentReply {
                        order: Some(order),
                        ..AgentReply::refused(e.code(), e.to_string())
                    },
                }
            }
            Ok(AgentRequest::Evacuate { moves, order }) => {
                let _call = crate::CallGuard::enter();
                let done = moves
                    .iter()
                    .map(|m| match rt.migration_target(&m.to)? {
                        Target::Brick(b, _) => Ok((m.segment_id, b)),
                        Target::Local => Err(MigrateError::UnknownBrick(m.to.clone())),
                    })
                    .collect::<Result<Vec<_>, MigrateError>>()
                    .and_then(|list| rt.evacuate(&list));
                match done {
                    Ok(ids) => AgentReply {
                        order: Some(order),
                        evacuated: Some(ids),
                        ..AgentReply::done()
                    },
                    Err(e) => AgentReply {
                        order: Some(order),
                        ..AgentReply::refused(e.code(), e.to_string())
                    },
                }
            }
            Ok(_) => AgentReply::refused(
                "bad_request",
                "the order connection takes migrate and evacuate orders only",
            ),
            Err(e) => AgentReply::refused("bad_request", format!("an order that does not parse: {e}")),
        };
        let Ok(mut text) = serde_json::to_string(&answer) else {
            return;
        };
        text.push('\n');
        if out.write_all(text.as_bytes()).is_err() {
            return;
        }
    }
}
