//! The fault path, top to bottom: a missing-page fault in the window becomes a run of pages
//! installed from their brick, after room was made for them in the local buffer.
//!
//! [`serve`] runs it for one fault. Its steps, in the order they run:
//!
//! 1. **plan** the run ([`plan`]): the faulting page, plus the following pages when the stream
//!    is sequential ([`crate::prefetch`]), or the remote pages after a random fault while the
//!    local buffer has free room (read-around), within one region; waits while the page is
//!    being written back;
//! 2. **make room** ([`make_room`]): if the run would overflow the local buffer, the eviction
//!    policy picks victims ([`Core::choose_victims`]); the backend moves them out of the window
//!    into their staging slots and hands them to the write-back ([`crate::writeback`]);
//! 3. **claim** the run ([`claim`]): its pages are resident before their contents arrive, so a
//!    release read meanwhile turns them back to empty; a run passes over pages already resident;
//! 4. **fetch** the remote pages from their bricks (the backend: one batched read per brick, or
//!    a read-ahead sent at the previous fault of the stream);
//! 5. **install** them ([`install`]), stretch by stretch, skipping pages released meanwhile and
//!    applying queued events when the kernel says EAGAIN; spent staging slots that received the
//!    run are freed or kept spent;
//! 6. keep the stream's next run on its way (read-ahead).
//!
//! The sequence holds the core's lock only between backend calls, never across one: every
//! backend call is a point where the program's threads and the write-back may act. The runtime
//! implements [`Backend`] with userfaultfd and links (`rackmem-runtime`, `fault.rs`); the
//! simulation (`tests/simulation.rs`) with maps, running the program's threads and the
//! write-back inside those calls, so it checks this very sequence.
//!
//! A backend that loses a brick does not return: the runtime stops the program rather than go
//! on with missing data, the simulation unwinds.

use crate::core::{Core, Source, Victim};
use crate::slots::SpentRun;
use crate::state::{Location, PageState};
use std::sync::{Mutex, MutexGuard};

/// Default of the shortest run received into spent slots and moved in (shorter runs are
/// copied: for single pages a move gains nothing over the fresh page a copy takes; GUPS at 25%
/// local on shared memory: 80.0 k updates/s moving, 83.1 k copying). `rackmem run` measures
/// the machine's own crossover at start and sets it ([`Core::set_recycle_min_pages`]).
pub const RECYCLE_MIN_PAGES: u64 = 4;

/// Locks the core, whether or not a thread panicked while holding it (the core's state is
/// changed by whole methods, each consistent on its own).
pub fn lock(core: &Mutex<Core>) -> MutexGuard<'_, Core> {
    core.lock().unwrap_or_else(|e| e.into_inner())
}

/// The point the sequence has reached, for a backend that times its steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The run is planned.
    Planned,
    /// Victims are chosen (if room had to be made).
    Chosen,
    /// The victims are out of the window.
    Staged,
    /// The run is claimed.
    Claimed,
    /// Its contents are read.
    Fetched,
    /// It is installed.
    Installed,
}

/// A run planned for a fault (step 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The faulting page.
    pub fault: u64,
    /// First page of the run (the fault, or below it for a descending stream).
    pub start: u64,
    /// Pages planned.
    pub n: u64,
    /// The stream's run length (what prefetch asked for).
    pub run: usize,
    /// The prefetch stream's slot.
    pub stream: usize,
    /// The stream walks down.
    pub down: bool,
    /// A strided stream's run: the pages after the fault that the stride predicts, ascending,
    /// all below `start + n` (the other pages of the run are passed over, left as they are).
    /// Empty for a contiguous run.
    pub picks: Vec<u64>,
}

impl Plan {
    /// Pages the run may claim (the room made for it).
    pub fn pages(&self) -> u64 {
        if self.picks.is_empty() {
            self.n
        } else {
            1 + self.picks.len() as u64
        }
    }
}

/// A claimed run (step 3), on its way to install.
#[derive(Debug)]
pub struct Run<A> {
    /// First page.
    pub page: u64,
    /// Where each page's contents come from ([`Source::Held`]: already resident, passed over).
    pub kinds: Vec<Source>,
    /// The core's epoch at the claim (a read-ahead sent before a release since cannot serve it).
    pub epoch: u64,
    /// The claim's id: only pages still claimed under it are installed ([`Core::is_claimed_by`]).
    pub claim: u64,
    /// The backend's read-ahead that holds the run's contents, if one does.
    pub ahead: Option<A>,
    /// Spent staging slots the run is received into (their pages then move into the window).
    pub spent: Option<SpentRun>,
    /// For a run in spent slots: which slots gave their page to the window (set by the
    /// backend's [`Backend::install`]).
    pub moved: Vec<bool>,
}

impl<A> Run<A> {
    /// Pages in the run.
    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    /// True for a run of no pages (never made by [`claim`]).
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }
}

/// What one install call got done, in pages from its first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Install {
    /// Placed this many pages (the whole stretch, or up to an error the backend dealt with).
    Placed(usize),
    /// Placed this many, then found the next page already mapped (its waiters are woken).
    Exists(usize),
    /// Placed this many, then the kernel said EAGAIN: events are queued that change the window.
    Again(usize),
}

/// What the fault sequence needs from the world. Methods that take `&mut Core` run under the
/// core's lock; the others without it (the program and the write-back may act meanwhile).
pub trait Backend {
    /// The backend's read-ahead: a read in flight that holds a run's contents.
    type Ahead;

    // --- The environment ---

    /// The local buffer's size now, in pages.
    fn budget(&mut self, c: &Core) -> u64;
    /// Longest run a sequential stream fetches, in pages.
    fn prefetch_pages(&self) -> usize;
    /// Most pages a fault that starts no stream fetches from the faulting page on, while the
    /// local buffer has room nobody claims (see [`plan`]). 0: the faulting page alone.
    fn read_around_pages(&self) -> usize {
        0
    }
    /// The checksum of a page of zeros (what a page never fetched is compared with).
    fn zero_hash(&self) -> u64;
    /// Waits until the write-back gives back a slot or finishes a page, with the lock
    /// released meanwhile; returns the lock again.
    fn wait<'a>(&mut self, lock: &'a Mutex<Core>, c: MutexGuard<'a, Core>) -> MutexGuard<'a, Core>;
    /// The sequence reached `step` (for timings).
    fn mark(&mut self, _step: Step) {}
    /// Wakes whoever waits for the core (the sequence gave slots back).
    fn notify(&mut self);

    // --- The window ---

    /// Wakes the threads waiting for `page`, which is mapped.
    fn wake(&mut self, page: u64);
    /// The fault's page was installed by an earlier fault: wake its waiters.
    fn already_installed(&mut self, page: u64) {
        self.wake(page);
    }
    /// The fault's page is claimed by another fault in flight, whose install (or, if the page is
    /// released first, whose wake of the pages it gave up) wakes its threads: nothing to do, and
    /// no wake now (the thread would fault again at once, and again, until the install).
    fn claimed_elsewhere(&mut self, _page: u64) {}
    /// Moves the victims of job `id` out of the window into their slots (setting `moved` on
    /// those that were there), then writes them back or hands them to the write-back thread.
    fn move_out(&mut self, lock: &Mutex<Core>, id: u64, victims: Vec<Victim>);
    /// Installs pages `from..to` of the run (all claimed), from where `read` put them.
    fn install(&mut self, run: &mut Run<Self::Ahead>, from: usize, to: usize) -> Install;
    /// Applies the non-fault events queued in the window's event queue (they made an install
    /// say EAGAIN); faults stay queued.
    fn pump_events(&mut self);
    /// An install (its check that the pages are still claimed, then [`Backend::install`])
    /// begins (`true`) or ends: no event may be read and applied by another handler in between
    /// (the runtime's event gate). Never held across [`Backend::pump_events`].
    fn install_gate(&mut self, _enter: bool) {}
    /// Gives the memory of staging slots `start..start+count` back (they become free).
    fn discard_slots(&mut self, start: u32, count: u32);

    // --- The bricks ---

    /// Reads the run's contents: brick pages from their bricks or the run's read-ahead,
    /// same-filled pages filled, the others zeroed; into `run.spent` if set.
    fn read(&mut self, run: &mut Run<Self::Ahead>);
    /// The install checksums of the run's pages that are compared by checksum at eviction.
    fn checksums(&mut self, run: &mut Run<Self::Ahead>, out: &mut Vec<(u32, u64)>);

    // --- Read-ahead ---

    /// Planning the fault at `fault` (under the lock): drops read-aheads that went stale and
    /// returns the length of the one starting at `fault`, if any.
    fn planning(&mut self, c: &mut Core, fault: u64, budget: u64) -> Option<usize>;
    /// Victims need slots that read-aheads hold: drops those; false if none held any.
    fn release_slots_held(&mut self, _c: &mut Core) -> bool {
        false
    }
    /// The run was just claimed (under the lock): takes its read-ahead into `run.ahead` if one
    /// holds exactly this run, and drops the others that overlap it (they would go stale).
    fn claimed(&mut self, c: &mut Core, run: &mut Run<Self::Ahead>);
    /// Keeps the next runs of sequential stream `stream` on their way, from page `next`.
    fn read_ahead(&mut self, lock: &Mutex<Core>, stream: usize, next: u64, run: usize);
    /// Sends the brick read of the fault queued at `page` now, ahead of its turn, as a read-ahead
    /// of that one page (the fault collects it through [`Backend::planning`] and
    /// [`Backend::claimed`] like any other); the core said it may ([`Core::early_readable`]).
    /// Takes the core's lock and releases it before sending, after recording what a claim needs
    /// to find or drop the read. Returns whether it sent one. By default no early reads.
    fn send_early(&mut self, _c: MutexGuard<'_, Core>, _page: u64) -> bool {
        false
    }
    /// The run is installed. `full`: room had to be made for it.
    fn installed(&mut self, _plan: &Plan, _run: &Run<Self::Ahead>, _full: bool) {}
}

/// Serves the fault at window page `fault`, step by step (see the module documentation).
/// Returns false if an earlier fault had installed the page already.
pub fn serve<B: Backend>(lock: &Mutex<Core>, b: &mut B, fault: u64) -> bool {
    loop {
        // 1. Plan the run (or find that another thread's fault already installed the page).
        let Some((c, plan)) = plan(lock, b, fault) else {
            return false;
        };
        b.mark(Step::Planned);
        // 2. Make room; may wait for staging slots.
        let need = room(&c, &plan);
        let (c, staged) = make_room(lock, c, b, need);
        drop(c);
        b.mark(Step::Chosen);
        let full = staged.is_some();
        if let Some((id, victims)) = staged {
            b.move_out(lock, id, victims);
            // Victims released meanwhile may be claimed now; faults on them waited.
            self::lock(lock).moved_out(id);
            b.notify();
        }
        b.mark(Step::Staged);
        // 3. Claim what is still claimable: the write-back may have finished pages while we
        // staged. Nothing left (the page is being evicted again): plan anew.
        let Some(mut run) = claim(lock, b, &plan) else {
            continue;
        };
        b.mark(Step::Claimed);
        // 4. Fetch.
        b.read(&mut run);
        b.mark(Step::Fetched);
        // 5. Install, waking the faulting threads.
        install(lock, b, &mut run);
        b.mark(Step::Installed);
        b.installed(&plan, &run, full);
        // 6. Ahead of the next faults: a sequential stream gets its next runs read.
        if plan.run > 1 && !plan.down && plan.picks.is_empty() && run.kinds.iter().all(|&k| k != Source::Zeros) {
            b.read_ahead(lock, plan.stream, run.page + run.len() as u64, plan.run);
        }
        return true;
    }
}

/// Pipelining over links: while its handler serves one fault and is about to wait on a brick,
/// a fault queued behind it at `fault` gets its brick read sent at once (if the core allows:
/// [`Core::early_readable`]), so that the brick answers several faults in one wait. The fault
/// is served in its turn by [`serve`], which finds the read among the read-aheads (one page, so
/// only where its plan is one page: a sequential stream keeps its run). Nothing is claimed
/// here: a release since makes the read stale, a claim of the page by another fault drops it.
/// Returns whether a read was sent.
pub fn read_early<B: Backend>(lock: &Mutex<Core>, b: &mut B, fault: u64) -> bool {
    let c = self::lock(lock);
    if !c.early_readable(fault, b.prefetch_pages().max(1)) {
        return false;
    }
    b.send_early(c, fault)
}

/// Moves resident pages out, with no fault to serve, until the local buffer fits its budget
/// again or `most` pages have gone: a process whose budget shrank while it was idle (the other
/// processes of its run grew) gives the room back now rather than at its next fault, which may
/// never come. Victims go the way a fault's do (staged, then written back). Pinned pages and
/// pages that cannot move stay, so the buffer may still be over its budget when no victim is
/// left. Returns the pages moved out.
pub fn give_back<B: Backend>(lock: &Mutex<Core>, b: &mut B, most: u64) -> u64 {
    let mut moved = 0u64;
    while moved < most {
        let c = self::lock(lock);
        // Room for no page: make_room evicts only what is over the budget (and its slack).
        let (c, staged) = make_room(lock, c, b, 0);
        drop(c);
        let Some((id, victims)) = staged else {
            break;
        };
        moved += victims.len() as u64;
        b.move_out(lock, id, victims);
        self::lock(lock).moved_out(id);
        b.notify();
    }
    moved
}

/// The room a plan needs in the local buffer: the pages it may claim.
fn room(c: &Core, plan: &Plan) -> u64 {
    let n = plan.pages();
    if c.short_stride_room() && !plan.picks.is_empty() {
        return n - 1;
    }
    n
}

/// Step 1: plans the run for the fault at `fault`. `None` if the page is already installed
/// (another thread faulted it first: its waiters are woken). Waits while the page is being
/// written back.
pub fn plan<'a, B: Backend>(lock: &'a Mutex<Core>, b: &mut B, fault: u64) -> Option<(MutexGuard<'a, Core>, Plan)> {
    let mut c = self::lock(lock);
    loop {
        match c.location(fault) {
            Location::Resident if c.is_in_flight(fault) => {
                drop(c);
                b.claimed_elsewhere(fault);
                return None;
            }
            Location::Resident => {
                drop(c);
                b.already_installed(fault);
                return None;
            }
            Location::Evicting => c = b.wait(lock, c),
            // Released while a victim, and its job has not moved it out yet.
            Location::Empty | Location::Remote if c.is_moving_out(fault) => c = b.wait(lock, c),
            Location::Empty | Location::Remote => break,
        }
    }
    if c.probe_touched(fault) {
        // A read-ahead probe the program used (see `crate::probe`): that page alone, and no
        // step of any stream (the stream it came from went on past it).
        let plan = Plan {
            fault,
            start: fault,
            n: 1,
            run: 1,
            stream: usize::MAX,
            down: false,
            picks: Vec::new(),
        };
        return Some((c, plan));
    }
    let p = c.streams.plan(fault, b.prefetch_pages().max(1));
    // In units: a run of huge units stays within the units its region touches.
    let (region_start, region_end) = c.region_units(fault);
    let budget = b.budget(&c);
    // A run passes over resident pages (installing around them), but stops at a page on its
    // way out.
    let fits = |s: PageState| s.installable() || s.location() == Location::Resident;
    let cap = (p.run as u64).min((budget / 4).max(1));
    if let Some(stride) = p.stride {
        // A strided stream: the pages its stride predicts, passing over resident ones, up to a
        // page on its way out or the region's end. A read-ahead sent for a sequential stream
        // here is not what this stream needs (`Backend::claimed` drops it).
        let mut picks = Vec::with_capacity(stride.count() as usize);
        let mut steps = 0;
        for q in stride.pages() {
            if q >= region_end || picks.len() as u64 + 1 >= cap {
                break;
            }
            let s = c.state(q);
            if !fits(s) {
                break;
            }
            steps += 1;
            if q > picks.last().copied().unwrap_or(fault) && s.installable() {
                picks.push(q);
            }
        }
        c.streams.advance_strided(p.slot, steps);
        b.planning(&mut c, fault, budget);
        let n = picks.last().map_or(1, |&l| l - fault + 1);
        let plan = Plan {
            fault,
            start: fault,
            n,
            run: p.run,
            stream: p.slot,
            down: false,
            picks,
        };
        return Some((c, plan));
    }
    let mut n = 1u64;
    // An ascending run starts at the fault; a descending one ends there.
    let mut start = fault;
    if p.down {
        while n < cap.min(fault - region_start + 1) && fits(c.state(fault - n)) {
            n += 1;
        }
        start = fault + 1 - n;
    } else {
        while n < cap.min(region_end.saturating_sub(fault).max(1)) && fits(c.state(fault + n)) {
            n += 1;
        }
    }
    // The read-ahead sent at the previous fault of this stream, if it covers this run (and
    // fits in it: room is made for at most `cap` pages).
    let ahead = b.planning(&mut c, fault, budget);
    if !p.down {
        // A read of one page (a fault's early read) serves a plan of one page only: the stream
        // may have become sequential since it was sent, and its run must not shrink.
        if let Some(len) = ahead.filter(|&l| l as u64 <= cap && (l > 1 || n == 1)) {
            n = len as u64;
        }
    }
    if !p.down && n == 1 && p.run == 1 && ahead.is_none() {
        n = read_around(&c, b.read_around_pages() as u64, fault, region_end, budget);
    }
    c.streams.advance(p.slot, start, start + n);
    let plan = Plan {
        fault,
        start,
        n,
        run: p.run,
        stream: p.slot,
        down: p.down,
        picks: Vec::new(),
    };
    Some((c, plan))
}

/// Read-around: the pages a fault at `fault` that starts no stream (a random access) takes,
/// itself and up to `most - 1` remote pages after it, as long as the local buffer has room for
/// them that neither resident pages nor other faults in flight take, beyond the slack an eviction
/// batch leaves ([`eviction_slack`]: that room is the next faults'; read around into it, BFS's
/// first search at 25% local fetched 850 MB ahead of which 23% was used, and ran 0.7 × as fast as
/// without read-around). Room appears when the program frees memory or its footprint (and with it a percentage budget) grows, and pages
/// evicted before come back at random: Graph500 BFS frees its edge list, then its first search
/// faults its adjacency array back a page at a time (13.5 k faults at 50% local), where Linux's
/// swap reads clusters of 8 pages around each fault. A full buffer takes the faulting page
/// alone, so read-around never evicts a page: in the steady state of a random workload (GUPS)
/// nothing changes. Only remote pages are taken (the brick's copy is the page's contents), not
/// empty ones, which the program has never written: zero pages it may never touch would fill
/// the room for nothing.
fn read_around(c: &Core, most: u64, fault: u64, region_end: u64, budget: u64) -> u64 {
    let room = budget.saturating_sub(c.resident() + c.reserved() + eviction_slack(budget));
    let most = most
        .min(room)
        .min(region_end.saturating_sub(fault))
        .min((budget / 4).max(1));
    let mut n = 1;
    while n < most {
        let p = fault + n;
        if c.state(p).location() != Location::Remote || c.is_moving_out(p) {
            break;
        }
        n += 1;
    }
    n
}

/// Pages an eviction batch frees beyond what its fault needs, so that the next faults of a
/// stream find room: a sixteenth of the budget, 1 to 32 pages.
fn eviction_slack(budget: u64) -> u64 {
    (budget / 16).clamp(1, 32)
}

/// Step 2: picks victims so that `need` more pages fit in the budget, marks them evicting and
/// gives each a staging slot, and reserves the room for the claim (other faults in flight count
/// it as taken). Returns the lock (it may have waited for slots) and the job.
pub fn make_room<'a, B: Backend>(
    lock: &'a Mutex<Core>,
    mut c: MutexGuard<'a, Core>,
    b: &mut B,
    need: u64,
) -> (MutexGuard<'a, Core>, Option<(u64, Vec<Victim>)>) {
    let budget = b.budget(&c);
    let want = loop {
        // Room taken: resident pages (installed or on their way in) and room other faults in
        // flight made and have not claimed yet.
        let taken = c.resident() + c.reserved();
        if taken + need <= budget {
            c.reserve(need);
            return (c, None);
        }
        // Evict a little more than needed so the next faults of a stream find room; at most
        // half the staging area per batch, so the next batch finds slots while this one is
        // written.
        let slack = eviction_slack(budget);
        let want = ((taken + need - budget + slack) as usize)
            .min(c.slots.total() as usize / 2)
            .min(c.resident() as usize);
        if c.slots.free_count() >= want {
            break want;
        }
        if c.slots.spent_is_empty() {
            // Read-aheads may hold the slots victims need: they go first.
            if b.release_slots_held(&mut c) {
                continue;
            }
            c = b.wait(lock, c);
            continue;
        }
        // Spent slots hold pages kept for recycling; victims need empty slots more.
        for (start, len) in c.slots.take_all_spent() {
            b.discard_slots(start, len);
            c.slots.put_free((start..start + len).rev());
        }
    };
    let mut out = Vec::with_capacity(want);
    let id = c.choose_victims(want, budget, b.zero_hash(), &mut out);
    c.reserve(need);
    (c, id.map(|id| (id, out)))
}

/// Step 3: claims the planned run, or what is still claimable of it from the faulting page
/// outward. `None` if the faulting page itself no longer is.
pub fn claim<B: Backend>(lock: &Mutex<Core>, b: &mut B, plan: &Plan) -> Option<Run<B::Ahead>> {
    let mut c = self::lock(lock);
    // The room made for the run is the claim's now (or nobody's, if nothing is claimable).
    let reserved = room(&c, plan);
    c.unreserve(reserved);
    let fault = plan.fault;
    // A run stays within one protection: read-ahead must not fill a reservation (PROT_NONE)
    // next to committed memory, nor pages lent to a file mapping (no longer registered with
    // the userfaultfd).
    let fault_prot = c.unit_prot(fault);
    let claimable = |c: &Core, p: u64| c.state(p).installable() && c.unit_prot(p) == fault_prot && !c.is_moving_out(p);
    if !claimable(&c, fault) {
        return None;
    }
    // Outward from the fault: claimable pages, and resident ones to pass over; the run ends on
    // a claimable page.
    let held = |c: &Core, p: u64| c.location(p) == Location::Resident;
    // A strided run: the predicted pages still claimable; the pages between are passed over.
    let picked = |p: u64| plan.picks.is_empty() || p == fault || plan.picks.binary_search(&p).is_ok();
    let (page, n) = if plan.down {
        let (mut first, mut p) = (fault, fault);
        while p > plan.start && (claimable(&c, p - 1) || held(&c, p - 1)) {
            p -= 1;
            if claimable(&c, p) {
                first = p;
            }
        }
        (first, fault + 1 - first)
    } else {
        let (mut k, mut end) = (1, 1);
        while k < plan.n {
            let p = plan.start + k;
            if !picked(p) {
                k += 1;
                continue;
            }
            if !(claimable(&c, p) || held(&c, p)) {
                break;
            }
            if claimable(&c, p) {
                end = k + 1;
            }
            k += 1;
        }
        (plan.start, end)
    };
    // A sample of the pages read ahead stays remote, to measure how many the program uses
    // (`crate::probe`); the run passes over them.
    let probes: Vec<u64> = if n > 1 {
        (page..page + n)
            .filter(|&p| p != fault && picked(p) && claimable(&c, p) && c.take_probe(p, fault))
            .collect()
    } else {
        Vec::new()
    };
    // Resident before the copy, so a REMOVE event read while copying (EAGAIN) turns the claimed
    // pages back to empty and the install skips them. A page of a range that is not read-write
    // stays out of the eviction policy (it cannot move to the staging area) until the program
    // makes it read-write again or frees it.
    let id = c.new_claim();
    let kinds: Vec<Source> = (page..page + n)
        .map(|p| {
            if picked(p) && claimable(&c, p) && (probes.is_empty() || !probes.contains(&p)) {
                c.claim_for(id, p)
            } else {
                Source::Held
            }
        })
        .collect();
    let mut run = Run {
        page,
        kinds,
        claim: id,
        epoch: c.epoch(),
        ahead: None,
        spent: None,
        moved: Vec::new(),
    };
    b.claimed(&mut c, &mut run);
    // Receive into spent staging slots when a run of them is long enough (their pages then move
    // into the window); else into the backend's buffer, copied in.
    // Not a strided run: its slots would be the span's, most of them passed over.
    if run.ahead.is_none() && n * c.unit().pages() >= c.recycle_min_pages() && plan.picks.is_empty() {
        run.spent = c.slots.take_spent(n as usize);
    }
    Some(run)
}

/// Step 5: installs the claimed run, stretch by stretch, skipping pages released meanwhile and
/// applying queued events after EAGAIN; then frees the spent slots whose pages moved in (the
/// others are spent again, or freed past the cap).
pub fn install<B: Backend>(lock: &Mutex<Core>, b: &mut B, run: &mut Run<B::Ahead>) {
    let n = run.len();
    let mut hashes = Vec::new();
    b.checksums(run, &mut hashes);
    if !hashes.is_empty() {
        self::lock(lock).record_hashes(hashes);
    }
    run.moved.clear();
    if run.spent.is_some() {
        run.moved.resize(n, false);
    }
    let mut i = 0usize;
    // Pages placed by the last install call, to mark installed at the next lock.
    let mut placed = 0..0;
    // Claimed pages given up (released meanwhile, perhaps claimed again by another fault):
    // their threads may wait in the kernel, woken by nobody else.
    let mut gave_up: Vec<u64> = Vec::new();
    loop {
        // The next stretch still claimed by this run: pages released while we fetched (or while
        // an earlier stretch was installed) are skipped, wherever they lie in the run. Checked at
        // every stretch, not only when the epoch moved: a stretch that ended at a released page
        // must not install that page next (it would map stale contents over a page that reads
        // zeros), nor a page released and claimed again by another fault in flight.
        b.install_gate(true);
        let j = {
            let mut c = self::lock(lock);
            for k in placed.clone() {
                c.installed(run.claim, run.page + k as u64);
            }
            let claimed =
                |c: &Core, i: usize| run.kinds[i] != Source::Held && c.is_claimed_by(run.claim, run.page + i as u64);
            while i < n && !claimed(&c, i) {
                if run.kinds[i] != Source::Held {
                    gave_up.push(run.page + i as u64);
                }
                i += 1;
            }
            if i >= n {
                drop(c);
                b.install_gate(false);
                break;
            }
            let mut j = i + 1;
            while j < n && claimed(&c, j) {
                j += 1;
            }
            j
        };
        let r = b.install(run, i, j);
        b.install_gate(false);
        match r {
            Install::Placed(k) => {
                assert!(
                    k > 0,
                    "the install of pages {i}..{j} of the run at {} placed none",
                    run.page
                );
                placed = i..i + k;
                i += k;
            }
            Install::Exists(k) => {
                b.wake(run.page + (i + k) as u64);
                placed = i..i + k + 1;
                i += k + 1;
            }
            Install::Again(k) => {
                b.pump_events();
                placed = i..i + k;
                i += k;
            }
        }
    }
    for p in gave_up {
        b.wake(p);
    }
    if let Some(spent) = run.spent.take() {
        // Slots whose page moved are empty again: free for victims. The others still hold a
        // page: spent again (or freed, past the cap).
        let mut c = self::lock(lock);
        for k in (0..n).rev() {
            let slot = spent.start() + k as u32;
            if run.moved[k] {
                c.slots.put_free([slot]);
            } else if !c.slots.give_spent(slot, 1) {
                b.discard_slots(slot, 1);
                c.slots.put_free([slot]);
            }
        }
        drop(c);
        b.notify();
    }
}

/// True if a read-ahead of `n` pages at `page`, sent at `epoch`, holds exactly the run just
/// claimed: as long, sent since the last release, and every page from the brick or passed over
/// (a read-ahead probe left remote: its part of the read is not installed).
pub fn ahead_serves<A>(page: u64, n: usize, epoch: u64, run: &Run<A>) -> bool {
    page == run.page
        && n == run.len()
        && epoch == run.epoch
        && run.kinds[0] == Source::Brick
        && run.kinds.iter().all(|&k| k == Source::Brick || k == Source::Held)
}

/// True if a read-ahead of `n` pages at `page`, sent at `epoch`, can no longer be used by the
/// fault at `fault`: pages were released since it was sent (the core is at `now`), or the fault
/// falls inside it rather than at its start (the stream jumped; its pages are fetched the
/// ordinary way).
pub fn ahead_stale(page: u64, n: usize, epoch: u64, fault: u64, now: u64) -> bool {
    epoch != now || (fault > page && fault < page + n as u64)
}

/// True if `[a, a+an)` and `[b, b+bn)` share a page.
pub fn overlaps(a: u64, an: u64, b: u64, bn: u64) -> bool {
    a < b + bn && b < a + an
}
