//! The core: every page's state, the local buffer's accounting, the staging slots and the
//! eviction policy, changed together by one method per event so they never disagree.
//!
//! The runtime holds one `Core` under a lock shared by the fault handler, the write-back thread
//! and the program's threads. Nothing here makes a system call or waits: the callers do the I/O
//! (moving pages, reading and writing bricks) between calls, with the lock dropped.

use crate::placement::Placement;
use crate::policy::EvictionPolicy;
use crate::prefetch::Streams;
use crate::probe::{ProbeCounts, Probes};
use crate::prot;
use crate::regions::RegionAllocator;
use crate::slots::{Slots, SpentRun};
use crate::state::{Evicted, Location, PageState, PageTable};
use crate::unit::{Check, Unit};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::Range;

/// Moves in progress at once at most (each is one range; a request over several sources is
/// split into one move per piece, run one after another).
pub const MAX_MOVES: usize = 16;

/// Why a move cannot begin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoveError {
    /// The range is empty or reaches past the window.
    #[error("window pages {first}..{end} are not a range of the window's {window} pages")]
    Outside {
        /// First page asked for.
        first: u64,
        /// End (exclusive) asked for.
        end: u64,
        /// Pages in the window.
        window: u64,
    },
    /// Part of the range is moving already.
    #[error("window pages {first}..{end} overlap move {other}, still in progress")]
    Busy {
        /// First page asked for.
        first: u64,
        /// End (exclusive) asked for.
        end: u64,
        /// The move in progress.
        other: u64,
    },
    /// [`MAX_MOVES`] moves are in progress.
    #[error("{MAX_MOVES} moves are in progress already")]
    TooMany,
}

/// A range whose brick copy is moving to another memory (see [`Core::begin_move`]).
#[derive(Debug)]
struct Moving {
    id: u64,
    pages: Range<u64>,
    /// Victims of this range whose write-back waits for the move's end, with their job.
    parked: Vec<(u64, Victim)>,
    /// The same, as (job, page), to look up.
    parked_set: HashSet<(u64, u32)>,
}

/// A resident page chosen for eviction, with the slot it is moved to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Victim {
    /// Window page.
    pub page: u32,
    /// Staging slot it is moved to.
    pub slot: u32,
    /// Its brick held its contents when it was chosen.
    pub brick_valid: bool,
    /// The page lies in a mapped segment whose memory already holds it (set by the caller):
    /// written by memory copy.
    pub backed: bool,
    /// Checksum of its contents when installed (the zero page's for a first touch).
    pub hash: u64,
    /// Its protection byte ([`crate::prot`]; 0: read-write): `UFFDIO_MOVE` needs its staging
    /// slot to have the same protection while it moves.
    pub prot: u8,
    /// The page was really moved into its slot (set by the caller; false: nothing to send).
    pub moved: bool,
}

/// What a claimed page of a fault's run needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Zeros (a first touch, or a released page).
    Zeros,
    /// Its brick's copy.
    Brick,
    /// One 8-byte word repeated (a same-filled page kept in the core).
    Fill(u64),
    /// Nothing: the run passes over the page, which is not its to install: already resident
    /// (a run is not cut by the hot pages the eviction policy keeps among cold ones), or a
    /// read-ahead probe left remote ([`crate::probe`]). Never returned by `claim`.
    Held,
}

/// The core. See the module documentation.
pub struct Core {
    pages: PageTable,
    /// Checksum of each resident page's clean contents, for pages fetched from a brick whose
    /// copy is compared by checksum (others compare with zeros or with the mapped segment).
    hashes: HashMap<u32, u64>,
    /// Remote pages whose contents are one 8-byte word repeated: their brick copy is stale, their
    /// next fetch is a fill. Only remote pages have an entry.
    fills: HashMap<u32, u64>,
    policy: Box<dyn EvictionPolicy>,
    resident: u64,
    /// Evicting pages, with the id of the eviction job that owns them.
    evicting: HashMap<u32, u64>,
    /// Victims chosen and not moved out of the window yet, with their job's id, until
    /// [`Core::moved_out`]. A page released meanwhile stays here: until its job's move is done,
    /// no fault may claim and install it (the move would take the new page out of the window,
    /// leaving it missing while the core calls it resident).
    unmoved: HashMap<u32, u64>,
    next_job: u64,
    /// Bumped whenever pages are released behind the fault handler's back.
    epoch: u64,
    /// Protection of each page that is not read-write, as `prot` bits (empty until one is set).
    prot: Vec<u8>,
    /// Allocated pages that hold no committed memory (`PROT_NONE`, or lent to a file mapping).
    uncommitted: u64,
    /// The staging slots (the runtime reaches them through the `*_slots` methods).
    pub(crate) slots: Slots,
    /// Sequential streams, for prefetch.
    pub(crate) streams: Streams,
    /// The window's address-space allocator (read through [`Core::regions`], changed through
    /// the `*_region*` methods).
    alloc: RegionAllocator,
    /// First pages of the regions handed out as malloc-family blocks; other regions are
    /// mappings, inside which the program's own allocator places its blocks.
    blocks: BTreeSet<u64>,
    /// Scratch for the policy's victims (kept: an eviction batch per fault must not allocate).
    victim_pages: Vec<u32>,
    /// Pages claimed by a fault in flight and not installed yet, with the claim's id. They are
    /// resident (counted in the local buffer) but not the policy's: a page on its way in is no
    /// victim, and only its own claim may install it (a page released and claimed again by
    /// another fault must not receive the first fault's older contents).
    claims: HashMap<u32, u64>,
    next_claim: u64,
    /// Pages that faults in flight made room for and have not claimed yet: counted against the
    /// budget with the resident pages, so that faults making room at once do not all find the
    /// same free room.
    reserved: u64,
    /// Test-only planted bug: room made for a fault is not reserved (see `plant_unreserved_room`).
    unreserved_room: bool,
    /// Test-only planted bug: a strided run makes room for one page less than it claims (see
    /// `plant_short_stride_room`).
    short_stride_room: bool,
    /// The sample of read-ahead pages left remote to measure read-ahead accuracy.
    probes: Probes,
    /// Which memory holds each window range: home segments, pinned ranges.
    placement: Placement,
    /// Ranges moving between memories.
    moves: Vec<Moving>,
    next_move: u64,
    /// Test-only planted bug: write-backs of a moving range are not parked (see
    /// `plant_unparked_writeback`).
    unparked_writeback: bool,
    /// What the core's entries are: pages, or huge units (every "page" argument and entry is
    /// then a unit index; see [`crate::unit`]).
    unit: Unit,
    /// Pages in the window (the units' table has `window_pages / unit.pages()` entries, rounded
    /// up): protections, regions, blocks and placement are per page.
    window_pages: u64,
    /// Per resident huge unit, the check of each subpage taken at its install (or its last
    /// write to its brick): what its eviction compares with to send only changed subpages.
    sums: HashMap<u32, Box<[Check]>>,
    /// The same for units chosen for eviction, until their write-back ends.
    staged_sums: HashMap<u32, Box<[Check]>>,
    /// Test-only planted bug: a unit's new install checks do not replace older ones (see
    /// `plant_stale_sums`).
    stale_sums: bool,
    /// Test-only planted bug: a fault's early read may be sent while its page is still being
    /// written back (see `plant_early_read_evicting`).
    early_read_evicting: bool,
    /// Shortest fetched run, in 4 KiB pages, received into spent slots and moved in rather than
    /// copied ([`crate::fault::RECYCLE_MIN_PAGES`] unless set).
    recycle_min_pages: u64,
}

impl Core {
    /// A window of `window_pages` pages, all empty and free, with `slots` staging slots.
    pub fn new(window_pages: u64, slots: u32, policy: Box<dyn EvictionPolicy>) -> Core {
        Core::with_unit(window_pages, Unit::Page, slots, policy)
    }

    /// A window of `window_pages` pages in units of `unit`, all empty and free, with `slots`
    /// staging slots (of one unit each).
    ///
    /// Two index spaces: residency is per unit (states, the policy, claims, evictions,
    /// checksums, fills, read-ahead, staging slots: their `page` arguments are unit indices),
    /// while protections, regions, blocks, placement, pins and moves are per 4 KiB page (glibc
    /// protects single guard pages; malloc blocks are a few KiB). A unit is movable only if all
    /// its pages have one evictable protection and none is pinned; [`Core::release`] releases
    /// the units it covers whole.
    pub fn with_unit(window_pages: u64, unit: Unit, slots: u32, policy: Box<dyn EvictionPolicy>) -> Core {
        Core {
            pages: PageTable::new(unit.units_for(window_pages)),
            hashes: HashMap::new(),
            fills: HashMap::new(),
            policy,
            resident: 0,
            evicting: HashMap::new(),
            unmoved: HashMap::new(),
            next_job: 1,
            epoch: 0,
            prot: Vec::new(),
            uncommitted: 0,
            slots: Slots::new(slots),
            streams: Streams::default(),
            alloc: RegionAllocator::new(window_pages),
            blocks: BTreeSet::new(),
            victim_pages: Vec::new(),
            claims: HashMap::new(),
            next_claim: 1,
            reserved: 0,
            unreserved_room: false,
            short_stride_room: false,
            probes: Probes::new(0),
            placement: Placement::new(),
            moves: Vec::new(),
            next_move: 1,
            unparked_writeback: false,
            unit,
            window_pages,
            sums: HashMap::new(),
            staged_sums: HashMap::new(),
            stale_sums: false,
            early_read_evicting: false,
            recycle_min_pages: crate::fault::RECYCLE_MIN_PAGES,
        }
    }

    /// Sets the shortest fetched run (4 KiB pages, at least 1) received into spent slots and
    /// moved into the window; shorter runs are copied. A choice of transfer path only: either
    /// path installs the same bytes, so any value keeps every invariant.
    pub fn set_recycle_min_pages(&mut self, pages: u64) {
        self.recycle_min_pages = pages.max(1);
    }

    /// See [`Core::set_recycle_min_pages`].
    pub fn recycle_min_pages(&self) -> u64 {
        self.recycle_min_pages
    }

    /// The window's unit.
    pub fn unit(&self) -> Unit {
        self.unit
    }

    /// Units in the window (its pages, for a window of 4 KiB units).
    pub fn units(&self) -> u64 {
        self.pages.len()
    }

    /// The window pages of unit `u` (the last unit may be short).
    pub fn pages_of(&self, u: u64) -> Range<u64> {
        let r = self.unit.page_range(u);
        r.start.min(self.window_pages)..r.end.min(self.window_pages)
    }

    /// The protection byte of unit `u`'s first page: what a run of units compares (a unit
    /// with pages of several protections is never moved whole, see `unit_movable`).
    pub fn unit_prot(&self, u: u64) -> u8 {
        self.prot_of(self.unit.page_range(u).start)
    }

    /// The units of the region holding unit `u`'s first page, as `(first, end)`: a fault's run
    /// stays within them (`(u, u + 1)` if no region holds it).
    pub fn region_units(&self, u: u64) -> (u64, u64) {
        let page = self.unit.page_range(u).start;
        match self.alloc.region_containing(page) {
            Some((s, l)) => (self.unit.of_page(s), self.unit.of_page(s + l - 1) + 1),
            None => (u, u + 1),
        }
    }

    /// The units any page of `[first, end)` lies in.
    pub fn units_touching(&self, first: u64, end: u64) -> Range<u64> {
        if end <= first {
            return 0..0;
        }
        self.unit.of_page(first)..self.unit.of_page(end - 1) + 1
    }

    /// True if any page of unit `u` is pinned.
    fn unit_pinned(&self, u: u64) -> bool {
        self.placement.any_pinned() && self.pages_of(u).any(|p| self.placement.pinned(p))
    }

    /// True if unit `u` may leave the window whole: all its pages have one evictable
    /// protection (`UFFDIO_MOVE` needs its slot to have the same).
    fn unit_movable(&self, u: u64) -> bool {
        let mut pages = self.pages_of(u);
        let Some(first) = pages.next() else {
            return false;
        };
        let b = self.prot_of(first);
        prot::evictable(b) && (self.prot.is_empty() || pages.all(|p| self.prot_of(p) == b))
    }

    /// True if unit `u` belongs in the eviction policy now.
    fn policy_member(&self, u: u64) -> bool {
        self.in_policy(u) && !self.unit_pinned(u)
    }

    /// Puts units into the policy or takes them out as their membership changed from `before`
    /// (one entry per unit of `units`).
    fn refresh_policy(&mut self, units: Range<u64>, before: &[bool]) {
        for (u, &was) in units.zip(before) {
            match (was, self.policy_member(u)) {
                (false, true) => self.policy.inserted(u as u32),
                (true, false) => self.policy.removed(u as u32),
                _ => {}
            }
        }
    }

    /// Bytes the resident units (and the room reserved for faults) charge the local buffer.
    pub fn resident_bytes(&self) -> u64 {
        (self.resident + self.reserved) * self.unit.bytes()
    }

    /// Records the subpage checks of a freshly installed (or freshly written back) huge unit,
    /// if it is still resident.
    pub fn record_sums(&mut self, unit: u64, checks: Box<[Check]>) {
        if self.location(unit) != Location::Resident {
            return;
        }
        let checks = match self.staged_sums.get(&(unit as u32)) {
            Some(old) if self.stale_sums => old.clone(),
            _ => checks,
        };
        self.sums.insert(unit as u32, checks);
    }

    /// The subpage checks of a resident unit.
    pub fn sums_of(&self, unit: u64) -> Option<&[Check]> {
        self.sums.get(&(unit as u32)).map(|b| &b[..])
    }

    /// The subpage checks a unit being evicted was installed with (`None`: none were taken,
    /// its brick holds nothing valid to compare with). Taken once, by its write-back.
    pub fn take_staged_sums(&mut self, unit: u64) -> Option<Box<[Check]>> {
        if self.stale_sums {
            return self.staged_sums.get(&(unit as u32)).cloned();
        }
        self.staged_sums.remove(&(unit as u32))
    }

    /// Plants a bug for the simulation to catch: the checks staged at a unit's eviction are not
    /// dropped when its write-back ends, and its next install keeps them instead of its new
    /// ones, so a later eviction compares with contents its brick no longer holds.
    pub fn plant_stale_sums(&mut self) {
        self.stale_sums = true;
    }

    /// Samples read-ahead accuracy with one read-ahead page in `one_in` left remote as a probe
    /// (0: off, the default). See [`crate::probe`].
    pub fn set_probe_rate(&mut self, one_in: u32) {
        self.probes = Probes::new(one_in);
    }

    /// What the read-ahead sample found so far.
    pub fn probe_counts(&self) -> ProbeCounts {
        self.probes.counts()
    }

    /// True if `page` is a pending read-ahead probe.
    pub fn is_probe(&self, page: u64) -> bool {
        self.probes.contains(page)
    }

    /// Draws whether the read-ahead page `page` of the run that faults at `fault` becomes a
    /// probe (it must be remote and read from its brick); if so, records it. The caller's run
    /// then passes over it.
    pub fn take_probe(&mut self, page: u64, fault: u64) -> bool {
        // A probe of an earlier run is claimed by this one instead (its outcome is unknowable).
        if self.location(page) != Location::Remote
            || self.is_filled(page)
            || self.probes.contains(page)
            || !self.probes.draw()
        {
            return false;
        }
        self.probes.take(page, fault);
        true
    }

    /// The program faulted on `page`: true if it was a probe (now counted as used).
    pub fn probe_touched(&mut self, page: u64) -> bool {
        !self.probes.is_empty() && self.probes.touched(page)
    }

    /// Plants a concurrency bug for the simulation to catch: room made for a fault is not
    /// reserved, so faults in flight at once each find the same room and overrun the budget.
    #[doc(hidden)]
    pub fn plant_unreserved_room(&mut self) {
        self.unreserved_room = true;
    }

    /// Plants a bug for the simulation to catch: a strided run makes room for its predicted pages
    /// but not for its faulting page, so a full local buffer overruns its budget by one.
    #[doc(hidden)]
    pub fn plant_short_stride_room(&mut self) {
        self.short_stride_room = true;
    }

    /// True if [`Core::plant_short_stride_room`] planted its bug.
    #[doc(hidden)]
    pub fn short_stride_room(&self) -> bool {
        self.short_stride_room
    }

    /// Plants a bug for the simulation to catch: a fault's early read (`fault::read_early`) may
    /// be sent while its page is still being written back, so it reads the brick's older copy
    /// and the fault installs that, losing the write the eviction was carrying.
    #[doc(hidden)]
    pub fn plant_early_read_evicting(&mut self) {
        self.early_read_evicting = true;
    }

    /// True if the fault queued at `page` may have its brick read sent now, ahead of its turn
    /// (`fault::read_early`): the page is remote and its brick holds its contents (not
    /// same-filled; no write-back of it in flight), it is no read-ahead probe, no fault claims
    /// it and no job has still to move it out; and its stream would plan that page alone (a
    /// random fault). A read of one page sent for a fault of a sequential or strided stream would
    /// shrink that stream's run to one page. `prefetch_max`: the longest run a stream plans.
    pub fn early_readable(&self, page: u64, prefetch_max: usize) -> bool {
        if self.unit != Unit::Page || page >= self.pages.len() {
            return false;
        }
        let at_brick = match self.location(page) {
            Location::Remote => true,
            Location::Evicting => self.early_read_evicting,
            _ => false,
        };
        at_brick
            && !self.is_filled(page)
            && !self.is_probe(page)
            && !self.is_in_flight(page)
            && !self.is_moving_out(page)
            && self.streams.plans_one(page, prefetch_max)
    }

    /// Plants a bug for the simulation to catch: the write-back of a page whose range is moving
    /// is not held until the move ends, so it writes the old home after the move copied it, and
    /// the move's end loses the write.
    #[doc(hidden)]
    pub fn plant_unparked_writeback(&mut self) {
        self.unparked_writeback = true;
    }

    /// Where each window range lives.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Where each window range lives, to change (homes are assigned by the runtime as segments
    /// attach, and by [`Core::finish_move`]; pins go through [`Core::pin`]).
    pub fn placement_mut(&mut self) -> &mut Placement {
        &mut self.placement
    }

    /// Pins `[first, first+count)` in the local buffer: its resident pages are no victims until
    /// unpinned or released. The caller faults the range in and keeps the pins within budget.
    pub fn pin(&mut self, first: u64, count: u64) {
        let end = (first + count).min(self.window_pages);
        let units = self.units_touching(first, end);
        let before: Vec<bool> = units.clone().map(|u| self.policy_member(u)).collect();
        self.placement.pin(first..end);
        self.refresh_policy(units, &before);
    }

    /// Unpins `[first, first+count)`: its resident pages are victims again.
    pub fn unpin(&mut self, first: u64, count: u64) {
        let end = (first + count).min(self.window_pages);
        if !self.placement.any_pinned() {
            return;
        }
        let units = self.units_touching(first, end);
        let before: Vec<bool> = units.clone().map(|u| self.policy_member(u)).collect();
        self.placement.unpin(first..end);
        self.refresh_policy(units, &before);
    }

    /// True if `page` is pinned in the local buffer.
    pub fn is_pinned(&self, page: u64) -> bool {
        self.placement.pinned(page)
    }

    /// True if a resident unit belongs in the eviction policy (installed, movable), pins
    /// aside.
    fn in_policy(&self, u: u64) -> bool {
        self.location(u) == Location::Resident && !self.is_in_flight(u) && self.unit_movable(u)
    }

    /// Begins moving the brick copy of `pages` to another memory (seed 001's migration, its
    /// Setup step). From now until [`Core::finish_move`] or [`Core::abort_move`], write-backs
    /// of victims in the range are *parked* ([`Core::park`]) instead of sent, so the old home
    /// changes only by write-backs already in flight, which [`Core::move_ready`] waits out.
    /// Faults and the program's writes go on: a fault reads the old home, which holds what the
    /// move copies; a write lands on a resident page, which leaves only by an eviction whose
    /// write-back is parked, then sent to the new home.
    pub fn begin_move(&mut self, pages: Range<u64>) -> Result<u64, MoveError> {
        let window = self.window_pages;
        if pages.is_empty() || pages.end > window {
            return Err(MoveError::Outside {
                first: pages.start,
                end: pages.end,
                window,
            });
        }
        if let Some(m) = self
            .moves
            .iter()
            .find(|m| m.pages.start < pages.end && pages.start < m.pages.end)
        {
            return Err(MoveError::Busy {
                first: pages.start,
                end: pages.end,
                other: m.id,
            });
        }
        if self.moves.len() >= MAX_MOVES {
            return Err(MoveError::TooMany);
        }
        let id = self.next_move;
        self.next_move += 1;
        self.moves.push(Moving {
            id,
            pages,
            parked: Vec::new(),
            parked_set: HashSet::new(),
        });
        Ok(id)
    }

    /// True if `page` lies in a range moving now.
    pub fn is_moving(&self, page: u64) -> bool {
        !self.moves.is_empty() && self.moves.iter().any(|m| m.pages.contains(&page))
    }

    /// Moves in progress.
    pub fn moves_in_progress(&self) -> usize {
        self.moves.len()
    }

    fn move_index(&self, id: u64) -> usize {
        match self.moves.iter().position(|m| m.id == id) {
            Some(i) => i,
            None => panic!("move {id} is not in progress"),
        }
    }

    /// True once no write-back to the old home of move `id`'s range is in flight (every
    /// evicting page of it is parked): what the old home holds now is what the move copies.
    pub fn move_ready(&self, id: u64) -> bool {
        let m = &self.moves[self.move_index(id)];
        self.units_touching(m.pages.start, m.pages.end).all(|u| {
            self.location(u) != Location::Evicting
                || self
                    .evicting
                    .get(&(u as u32))
                    .is_some_and(|&job| m.parked_set.contains(&(job, u as u32)))
        })
    }

    /// The pages of move `id` whose brick copy it must carry (brick-valid ones), once
    /// [`Core::move_ready`]. No page becomes brick-valid during a move (its write-backs are
    /// parked), so the list only grows stale by releases, whose pages read zeros anyway.
    pub fn move_pages(&self, id: u64) -> Vec<u64> {
        let m = &self.moves[self.move_index(id)];
        m.pages
            .clone()
            .filter(|&p| self.state(self.unit.of_page(p)).brick_valid())
            .collect()
    }

    /// The write-back of job `job` reached victim `v`, moved out and still the job's: if its
    /// page is moving, the write-back is held until the move ends (true), and the victim is
    /// handed back by [`Core::finish_move`].
    pub fn park(&mut self, job: u64, v: &Victim) -> bool {
        if self.moves.is_empty() || self.unparked_writeback {
            return false;
        }
        let page = self.unit.page_range(u64::from(v.page)).start;
        let Some(m) = self.moves.iter_mut().find(|m| m.pages.contains(&page)) else {
            return false;
        };
        m.parked.push((job, *v));
        m.parked_set.insert((job, v.page));
        true
    }

    /// Move `id` ended: its range's home is now `segment` from its page `offset_page` on (the
    /// Finalize step). Returns the parked write-backs, by job, for the caller to send (to the
    /// new home).
    pub fn finish_move(&mut self, id: u64, segment: u32, offset_page: u64) -> Vec<(u64, Vec<Victim>)> {
        let m = self.moves.swap_remove(self.move_index(id));
        self.placement.assign(m.pages.clone(), segment, offset_page);
        Self::by_job(m.parked)
    }

    /// Move `id` failed (its target is lost or full): the range stays where it was. Returns
    /// the parked write-backs, by job, for the caller to send (to the old home).
    pub fn abort_move(&mut self, id: u64) -> Vec<(u64, Vec<Victim>)> {
        let m = self.moves.swap_remove(self.move_index(id));
        Self::by_job(m.parked)
    }

    fn by_job(parked: Vec<(u64, Victim)>) -> Vec<(u64, Vec<Victim>)> {
        let mut jobs: Vec<(u64, Vec<Victim>)> = Vec::new();
        for (job, v) in parked {
            match jobs.iter_mut().find(|j| j.0 == job) {
                Some(j) => j.1.push(v),
                None => jobs.push((job, vec![v])),
            }
        }
        jobs
    }

    /// Pages claimed by faults in flight and not installed yet.
    pub fn in_flight_pages(&self) -> usize {
        self.claims.len()
    }

    /// True if `page` is claimed by a fault in flight and not installed yet.
    pub fn is_in_flight(&self, page: u64) -> bool {
        !self.claims.is_empty() && self.claims.contains_key(&(page as u32))
    }

    /// True if `page` is still claimed by claim `id` (not installed, not released since).
    pub fn is_claimed_by(&self, id: u64, page: u64) -> bool {
        self.claims.get(&(page as u32)) == Some(&id)
    }

    /// Pages reserved for faults that made room and have not claimed yet.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Reserves room for `n` pages a fault is about to claim (see [`Core::claim`]).
    pub fn reserve(&mut self, n: u64) {
        if !self.unreserved_room {
            self.reserved += n;
        }
    }

    /// Gives back a reservation of `n` pages (the fault claimed, or found nothing to claim).
    pub fn unreserve(&mut self, n: u64) {
        if !self.unreserved_room {
            assert!(
                self.reserved >= n,
                "unreserving {n} pages of {} reserved",
                self.reserved
            );
            self.reserved -= n;
        }
    }

    /// A new claim id, for the pages of one fault's run.
    pub fn new_claim(&mut self) -> u64 {
        let id = self.next_claim;
        self.next_claim += 1;
        id
    }

    /// The state of `page`.
    pub fn state(&self, page: u64) -> PageState {
        self.pages.get(page)
    }

    /// Where `page` is.
    pub fn location(&self, page: u64) -> Location {
        self.pages.location(page)
    }

    /// Every page's state, in order.
    pub fn states(&self) -> impl Iterator<Item = PageState> + '_ {
        self.pages.iter()
    }

    /// Pages in the window.
    pub fn window_pages(&self) -> u64 {
        self.window_pages
    }

    /// Resident pages (the local buffer's use).
    pub fn resident(&self) -> u64 {
        self.resident
    }

    /// Changes whenever pages are released: a fetch planned before must re-check its pages.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Evictions in flight (pages moved out whose write-back has not ended).
    pub fn evicting_count(&self) -> usize {
        self.evicting.len()
    }

    /// True if `page` is remote and same-filled (its fetch is a fill, not a brick read).
    pub fn is_filled(&self, page: u64) -> bool {
        !self.fills.is_empty() && self.fills.contains_key(&(page as u32))
    }

    /// How many pages from `page` (at most `limit`, within the window) are remote and read from
    /// their brick (not same-filled): what a read-ahead from `page` may read.
    pub fn remote_run(&self, page: u64, limit: u64) -> u64 {
        let limit = limit.min(self.pages.len().saturating_sub(page));
        let mut n = 0;
        while n < limit && self.location(page + n) == Location::Remote && !self.is_filled(page + n) {
            n += 1;
        }
        n
    }

    /// The word a same-filled remote page consists of.
    pub fn fill_of(&self, page: u64) -> Option<u64> {
        self.fills.get(&(page as u32)).copied()
    }

    /// True if `page` was chosen as a victim and its job has not moved it out yet: a fault on it
    /// waits, even if it was released meanwhile.
    pub fn is_moving_out(&self, page: u64) -> bool {
        !self.unmoved.is_empty() && self.unmoved.contains_key(&(page as u32))
    }

    /// Job `id`'s victims are out of the window (or were found gone): faults may claim those
    /// that were released meanwhile.
    pub fn moved_out(&mut self, id: u64) {
        self.unmoved.retain(|_, j| *j != id);
    }

    /// True if `page` is still being evicted by job `id`: not released since it was chosen. The
    /// write-back sends only such pages, so a stale staged copy never overwrites newer contents
    /// a later eviction wrote, whatever order the write-backs complete in.
    pub fn is_evicting_for(&self, id: u64, page: u32) -> bool {
        self.evicting.get(&page) == Some(&id)
    }

    /// Allocated pages holding committed memory: the local buffer's percentage is of these.
    pub fn committed_pages(&self) -> u64 {
        self.alloc.allocated_pages().saturating_sub(self.uncommitted)
    }

    /// The window's address-space allocator, to read (which regions exist, how much is
    /// allocated).
    pub fn regions(&self) -> &RegionAllocator {
        &self.alloc
    }

    /// Allocates a region of `pages` pages aligned to `align_pages` (see
    /// [`RegionAllocator::alloc`]); returns its first page.
    pub fn alloc_region(&mut self, pages: u64, align_pages: u64) -> Option<u64> {
        self.alloc.alloc(pages, align_pages)
    }

    /// Allocates the region `[start, start + pages)` if it is free (see
    /// [`RegionAllocator::alloc_at`]).
    pub fn alloc_region_at(&mut self, start: u64, pages: u64) -> bool {
        self.alloc.alloc_at(start, pages)
    }

    /// Grows or shrinks the region starting at `start` where it lies (see
    /// [`RegionAllocator::resize_in_place`]).
    pub fn resize_region_in_place(&mut self, start: u64, new_pages: u64) -> bool {
        self.alloc.resize_in_place(start, new_pages)
    }

    /// Frees `[start, start + pages)` of the regions (see [`RegionAllocator::free_range`]) and
    /// forgets the blocks that started there; returns the freed runs.
    pub fn free_region_range(&mut self, start: u64, pages: u64) -> Vec<(u64, u64)> {
        let gone: Vec<u64> = self.blocks.range(start..start + pages).copied().collect();
        for b in gone {
            self.blocks.remove(&b);
        }
        self.alloc.free_range(start, pages)
    }

    /// Records that the region starting at `page` is a malloc-family block.
    pub fn mark_block(&mut self, page: u64) {
        self.blocks.insert(page);
    }

    /// True if a malloc-family block starts at `page`.
    pub fn is_block(&self, page: u64) -> bool {
        self.blocks.contains(&page)
    }

    /// Takes a run of `n` spent staging slots for a read-ahead (see [`Slots::take_spent`]).
    pub fn take_spent_slots(&mut self, n: usize) -> Option<SpentRun> {
        self.slots.take_spent(n)
    }

    /// Gives slots back as spent; false past the spent cap, when the caller frees their pages
    /// and returns them with [`Core::put_free_slots`] (see [`Slots::give_spent`]).
    pub fn give_spent_slots(&mut self, start: u32, count: u32) -> bool {
        self.slots.give_spent(start, count)
    }

    /// Returns slots whose pages are freed to the free list (see [`Slots::put_free`]).
    pub fn put_free_slots(&mut self, slots: impl IntoIterator<Item = u32>) {
        self.slots.put_free(slots)
    }

    /// The protection byte of `page` (0: read-write).
    pub fn prot_of(&self, page: u64) -> u8 {
        self.prot.get(page as usize).copied().unwrap_or(0)
    }

    /// True if a resident page may be chosen as a victim: any protection of the window's own
    /// (read-only and `PROT_NONE` pages too: the runtime gives the staging slot the page's
    /// protection while it moves), never a page lent to a file mapping.
    pub fn movable(&self, page: u64) -> bool {
        prot::evictable(self.prot_of(page))
    }

    /// Records `b` as the protection of `[first, first+count)`: keeps the uncommitted count, and
    /// takes resident pages that cannot move out of the eviction policy (or puts them back).
    /// Lent pages keep their protection unless `force`.
    pub fn set_prot(&mut self, first: u64, count: u64, b: u8, force: bool) {
        if self.prot.is_empty() && b == 0 {
            return;
        }
        if (self.prot.len() as u64) < self.window_pages {
            self.prot.resize(self.window_pages as usize, 0);
        }
        let end = (first + count).min(self.window_pages);
        let units = self.units_touching(first, end);
        let before: Vec<bool> = units.clone().map(|u| self.policy_member(u)).collect();
        for p in first..end {
            let old = self.prot[p as usize];
            if old == b || (old & prot::FOREIGN != 0 && !force) {
                continue;
            }
            self.prot[p as usize] = b;
            match (prot::uncommitted(old), prot::uncommitted(b)) {
                (false, true) => self.uncommitted += 1,
                (true, false) => self.uncommitted -= 1,
                _ => {}
            }
        }
        self.refresh_policy(units, &before);
    }

    /// Every page's protection byte (empty if all are read-write).
    pub fn prot_bytes(&self) -> &[u8] {
        &self.prot
    }

    /// True if any page of `[first, first+count)` is being evicted.
    pub fn any_evicting(&self, first: u64, count: u64) -> bool {
        let end = (first + count).min(self.window_pages);
        !self.evicting.is_empty()
            && self
                .units_touching(first, end)
                .any(|u| self.location(u) == Location::Evicting)
    }

    /// A fault claims `page` for install and installs it at once (no other fault in flight):
    /// [`Core::claim_for`] then [`Core::installed`].
    pub fn claim(&mut self, page: u64) -> Source {
        let id = self.new_claim();
        let k = self.claim_for(id, page);
        self.installed(id, page);
        k
    }

    /// A fault claims `page` for install under claim `id`: it becomes resident before its
    /// contents arrive, so a release read meanwhile turns it back to empty and the install skips
    /// it; it joins the eviction policy (if it can move) when [`Core::installed`]. Returns where
    /// its contents come from.
    pub fn claim_for(&mut self, id: u64, page: u64) -> Source {
        let fill = match self.location(page) {
            Location::Remote if !self.fills.is_empty() => self.fills.remove(&(page as u32)),
            _ => None,
        };
        assert!(
            !self.is_moving_out(page),
            "claim of window page {page} while eviction job {:?} has not moved it out",
            self.unmoved.get(&(page as u32))
        );
        let old = self.pages.claim(page, fill.is_some());
        self.resident += 1;
        if !self.probes.is_empty() {
            // Claimed by a run without a fault on it: the probe's outcome is unknowable.
            self.probes.claimed(page);
        }
        let prev = self.claims.insert(page as u32, id);
        assert!(prev.is_none(), "page {page} claimed by claims {prev:?} and {id}");
        match (fill, old.location()) {
            (Some(w), _) => Source::Fill(w),
            (None, Location::Remote) => Source::Brick,
            _ => Source::Zeros,
        }
    }

    /// Claim `id` installed `page` (or gave it up): it leaves the pages in flight and, if it can
    /// move, joins the eviction policy. A page released since (no longer this claim's) is left
    /// alone. Returns true if the page was still the claim's.
    pub fn installed(&mut self, id: u64, page: u64) -> bool {
        if self.claims.get(&(page as u32)) != Some(&id) {
            return false;
        }
        self.claims.remove(&(page as u32));
        if self.unit_movable(page) && !self.unit_pinned(page) {
            self.policy.inserted(page as u32);
        }
        true
    }

    /// Records the checksums of freshly installed pages (those still resident).
    pub fn record_hashes(&mut self, hashes: impl IntoIterator<Item = (u32, u64)>) {
        for (p, h) in hashes {
            if self.location(p as u64) == Location::Resident {
                self.hashes.insert(p, h);
            }
        }
    }

    /// Load control favours another thread: the policy demotes the pages it protected, so the
    /// newly favoured thread's working set can take their room (`EvictionPolicy::demote_all`).
    /// The resident pages and the policy's membership do not change.
    pub fn demote_hot(&mut self) {
        self.policy.demote_all();
    }

    /// Picks up to `want` victims (at most the free slots), marks them evicting under a new job
    /// id and gives each a slot, in page order. `budget`: the local buffer's size in pages now
    /// (the policy sizes what it remembers by it); `zero_hash`: the checksum a page never
    /// fetched is compared with. Returns the job id, or `None` if nothing could be chosen.
    pub fn choose_victims(&mut self, want: usize, budget: u64, zero_hash: u64, out: &mut Vec<Victim>) -> Option<u64> {
        self.policy.set_capacity(budget as usize);
        let mut pages = std::mem::take(&mut self.victim_pages);
        pages.clear();
        self.policy.victims(want.min(self.slots.free_count()), &mut pages);
        // In page order, so runs of pages get runs of slots (one move each).
        pages.sort_unstable();
        if pages.is_empty() {
            self.victim_pages = pages;
            return None;
        }
        let id = self.next_job;
        self.next_job += 1;
        for &p in &pages {
            let Some(slot) = self.slots.pop_free() else {
                // Cannot happen (asked for at most the free slots); keep the page resident.
                self.policy.inserted(p);
                continue;
            };
            let old = self.pages.begin_eviction(p as u64);
            self.probes.partner_left(p as u64);
            self.evicting.insert(p, id);
            self.unmoved.insert(p, id);
            self.resident -= 1;
            let hash = self.hashes.remove(&p).unwrap_or(zero_hash);
            if let Some(sums) = self.sums.remove(&p) {
                self.staged_sums.insert(p, sums);
            } else {
                self.staged_sums.remove(&p);
            }
            out.push(Victim {
                page: p,
                slot,
                brick_valid: old.brick_valid(),
                backed: false,
                hash,
                prot: self.prot_of(self.unit.page_range(p as u64).start),
                moved: false,
            });
        }
        self.victim_pages = pages;
        Some(id)
    }

    /// The write-back of job `id` ended for `page` as `how`. A page released meanwhile (no
    /// longer this job's) is left alone. Returns true if the page was still the job's.
    pub fn finish_eviction(&mut self, id: u64, page: u32, how: Evicted) -> bool {
        if self.evicting.get(&page) != Some(&id) {
            return false;
        }
        self.evicting.remove(&page);
        if !self.stale_sums {
            self.staged_sums.remove(&page);
        }
        if self.pages.finish_eviction(page as u64, how) == Location::Remote {
            if let Evicted::Filled(w) = how {
                self.fills.insert(page, w);
            }
        }
        true
    }

    /// A resident page was written to its brick in place (before a fork); `hash`: its new
    /// checksum, for pages compared by checksum.
    pub fn mark_written(&mut self, page: u64, hash: Option<u64>) {
        self.pages.mark_brick_valid(page);
        if let Some(h) = hash {
            self.hashes.insert(page as u32, h);
        }
    }

    /// The install checksum of a resident page (`None`: compare with zeros or the mapping).
    pub fn hash_of(&self, page: u64) -> Option<u64> {
        self.hashes.get(&(page as u32)).copied()
    }

    /// Marks `[first, first+count)` (pages) released: any contents are gone, the next touch
    /// reads zeros. Units it covers whole are released; a unit it covers in part keeps its
    /// state (the caller zeroes those pages: resident, they became missing in the window).
    /// Returns the resident units dropped.
    pub fn release(&mut self, first: u64, count: u64) -> u64 {
        let mut dropped = 0;
        let end = (first + count).min(self.window_pages);
        let up = self.unit.pages();
        let u_first = first.div_ceil(up);
        let u_end = if end == self.window_pages {
            self.pages.len()
        } else {
            end / up
        };
        for p in u_first..u_end.max(u_first) {
            let old = self.pages.release(p);
            match old.location() {
                Location::Resident => {
                    if self.claims.remove(&(p as u32)).is_none() && !self.unit_pinned(p) {
                        self.policy.removed(p as u32);
                    }
                    self.hashes.remove(&(p as u32));
                    self.sums.remove(&(p as u32));
                    self.resident -= 1;
                    dropped += 1;
                    self.probes.partner_left(p);
                }
                Location::Evicting => {
                    self.evicting.remove(&(p as u32));
                    self.staged_sums.remove(&(p as u32));
                }
                Location::Remote => {
                    self.fills.remove(&(p as u32));
                    if !self.probes.is_empty() {
                        self.probes.released(p);
                    }
                }
                Location::Empty => {}
            }
        }
        if u_end > u_first {
            self.policy.released(u_first as u32, (u_end - u_first) as u32);
        }
        if end > first {
            // A pin lasts until the program releases the memory.
            self.placement.unpin(first..end);
        }
        self.epoch += 1;
        dropped
    }

    /// The core a forked child starts from, after the parent wrote back every dirty page:
    /// nothing resident or staged, every slot free, same regions, blocks, protections and
    /// same-filled pages.
    pub fn forked(&self, policy: Box<dyn EvictionPolicy>) -> Core {
        assert!(
            self.claims.is_empty() && self.reserved == 0,
            "fork with faults in flight ({} pages claimed, {} reserved)",
            self.claims.len(),
            self.reserved
        );
        assert!(self.unmoved.is_empty(), "fork with victims not moved out");
        assert!(
            self.moves.is_empty(),
            "fork with {} moves in progress",
            self.moves.len()
        );
        let mut c = Core::with_unit(self.window_pages, self.unit, self.slots.total(), policy);
        c.pages = self.pages.forked();
        c.fills = self.fills.clone();
        c.alloc = self.alloc.clone();
        c.blocks = self.blocks.clone();
        c.prot = self.prot.clone();
        c.uncommitted = self.uncommitted;
        // The child's segments are clones of the parent's, in the same order; its pins are its
        // own to make.
        c.placement = self.placement.clone();
        c.placement.unpin(0..self.window_pages);
        // The child measures its own read-ahead; the parent's probes stay the parent's.
        c.probes = Probes::new(self.probes.one_in());
        // Same machine, same crossover.
        c.recycle_min_pages = self.recycle_min_pages;
        c
    }

    /// Every resident unit without an install checksum stops being brick-valid (see
    /// [`PageTable::distrust_brick`]): for a forked child that compares checksums where its
    /// parent compared with a mapping. Returns how many.
    pub fn distrust_unchecked_resident(&mut self) -> u64 {
        let units: Vec<u64> = self
            .pages
            .iter()
            .enumerate()
            .filter(|(u, s)| {
                s.location() == Location::Resident && s.brick_valid() && !self.hashes.contains_key(&(*u as u32))
            })
            .map(|(u, _)| u as u64)
            .collect();
        for &u in &units {
            self.pages.distrust_brick(u);
        }
        units.len() as u64
    }

    /// The core a forked child starts from when it inherits the parent's window: the kernel
    /// keeps the parent's resident units mapped in the child (copy-on-write), so they stay
    /// resident here, with their brick-valid flags and install checksums, and join the child's
    /// eviction policy. The parent need not write anything back first: the child's clone of each
    /// segment holds what the parent's held at the fork, which is what those flags and checksums
    /// describe, so a unit dirty in the parent is dirty in the child against its clone too, and
    /// each side writes its own changes to its own segment when it evicts them. The rest is as
    /// in [`Core::forked`]. Panics if a unit is evicting (the fork drains write-back first).
    pub fn forked_keeping_resident(&self, policy: Box<dyn EvictionPolicy>) -> Core {
        assert!(
            self.evicting.is_empty(),
            "fork with {} units evicting",
            self.evicting.len()
        );
        let mut c = self.forked(policy);
        c.pages = self.pages.forked_keeping_resident();
        c.hashes = self.hashes.clone();
        c.sums = self.sums.clone();
        c.resident = self.resident;
        // O(units stored), in unit order: the child's policy has no history of its own yet.
        let resident: Vec<u64> = c
            .pages
            .iter()
            .enumerate()
            .filter(|(_, s)| s.location() == Location::Resident)
            .map(|(u, _)| u as u64)
            .collect();
        for u in resident {
            if c.policy_member(u) {
                c.policy.inserted(u as u32);
            }
        }
        c
    }

    /// Checks that the page states, the counts, the side tables, the policy and the slots agree.
    /// O(window): for tests and debugging.
    pub fn check(&self) -> Result<(), String> {
        let mut resident = 0u64;
        let mut movable = 0usize;
        let mut evicting = 0usize;
        for (p, s) in self.pages.iter().enumerate() {
            match s.location() {
                Location::Resident => {
                    resident += 1;
                    if self.policy_member(p as u64) {
                        movable += 1;
                    }
                }
                Location::Evicting => {
                    evicting += 1;
                    if !self.evicting.contains_key(&(p as u32)) {
                        return Err(format!("page {p} is evicting without a job"));
                    }
                }
                _ => {}
            }
        }
        if resident != self.resident {
            return Err(format!("{resident} pages resident, counted {}", self.resident));
        }
        if evicting != self.evicting.len() {
            return Err(format!(
                "{evicting} pages evicting, {} jobs entries",
                self.evicting.len()
            ));
        }
        if let Some(p) = self
            .claims
            .keys()
            .find(|&&p| self.location(p as u64) != Location::Resident)
        {
            return Err(format!(
                "page {p} is claimed in flight but is {:?}",
                self.state(*p as u64)
            ));
        }
        if self.policy.len() != movable {
            return Err(format!(
                "the policy tracks {} pages, {movable} are resident, installed and movable",
                self.policy.len()
            ));
        }
        if let Some(p) = self
            .hashes
            .keys()
            .find(|&&p| self.location(p as u64) != Location::Resident)
        {
            return Err(format!(
                "page {p} has an install checksum but is {:?}",
                self.state(*p as u64)
            ));
        }
        if let Some(u) = self
            .sums
            .keys()
            .find(|&&u| self.location(u as u64) != Location::Resident)
        {
            return Err(format!(
                "unit {u} has subpage checks but is {:?}",
                self.state(*u as u64)
            ));
        }
        if !self.stale_sums {
            if let Some(u) = self.staged_sums.keys().find(|&&u| !self.evicting.contains_key(&u)) {
                return Err(format!(
                    "unit {u} has staged subpage checks but is {:?}",
                    self.state(*u as u64)
                ));
            }
        }
        if let Some(p) = self
            .fills
            .keys()
            .find(|&&p| self.location(p as u64) != Location::Remote)
        {
            return Err(format!("page {p} has a fill word but is {:?}", self.state(*p as u64)));
        }
        if let Some(p) = self
            .unmoved
            .keys()
            .find(|&&p| self.location(u64::from(p)) == Location::Resident)
        {
            return Err(format!("page {p} is resident while its eviction has not moved it out"));
        }
        for m in &self.moves {
            for (job, v) in &m.parked {
                let page = u64::from(v.page);
                if !m.pages.contains(&self.unit.page_range(page).start) {
                    return Err(format!("unit {page} is parked by move {} of {:?}", m.id, m.pages));
                }
                if self.is_evicting_for(*job, v.page) && self.location(page) != Location::Evicting {
                    return Err(format!("parked page {page} of job {job} is {:?}", self.state(page)));
                }
            }
        }
        self.placement.check()?;
        self.probes.check()?;
        for (p, partner) in self.probes.pending_pairs() {
            if self.location(p) != Location::Remote || self.is_filled(p) {
                return Err(format!(
                    "read-ahead probe {p} is {:?} (a probe is a remote page read from its brick)",
                    self.state(p)
                ));
            }
            if self.location(partner) != Location::Resident {
                return Err(format!(
                    "read-ahead probe {p}'s partner {partner} is {:?}, not resident",
                    self.state(partner)
                ));
            }
        }
        if self.slots.out() < evicting as u32 {
            return Err(format!(
                "{evicting} pages evicting but only {} slots out",
                self.slots.out()
            ));
        }
        self.slots.check()?;
        self.alloc.check_invariants()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Fifo;

    fn core(pages: u64) -> Core {
        Core::new(pages, 8, Box::new(Fifo::default()))
    }

    /// A child that inherits the parent's window keeps its resident pages (brick flags and
    /// checksums too) and can evict them; remote and same-filled pages stay remote.
    #[test]
    fn a_child_keeping_the_window_starts_with_the_parents_resident_pages() {
        let mut c = core(16);
        assert_eq!(c.alloc_region(16, 1), Some(0));
        for p in 0..6 {
            c.claim(p);
        }
        c.record_hashes([(1, 11), (2, 22)]);
        // Page 3 goes remote, written.
        let mut v = Vec::new();
        c.set_prot(4, 1, prot::encode(1), false);
        let id = c.choose_victims(1, 16, 0, &mut v).expect("a victim");
        assert_eq!(v[0].page, 0);
        c.moved_out(id);
        c.finish_eviction(id, 0, Evicted::Written);
        c.check().expect("parent consistent");
        let mut child = c.forked_keeping_resident(Box::new(Fifo::default()));
        child.check().expect("child consistent");
        assert_eq!(child.resident(), 5);
        assert_eq!(child.location(0), Location::Remote);
        assert!(child.state(0).brick_valid());
        assert_eq!(child.location(1), Location::Resident);
        assert_eq!(child.hash_of(1), Some(11));
        assert_eq!(child.hash_of(2), Some(22));
        assert_eq!(child.prot_of(4), prot::encode(1));
        // The child's policy holds the inherited pages: it evicts them, in page order.
        v.clear();
        let id = child.choose_victims(8, 1, 0, &mut v).expect("victims in the child");
        let pages: Vec<u32> = v.iter().map(|x| x.page).collect();
        assert_eq!(pages, vec![1, 2, 3, 4, 5]);
        assert_eq!(
            v[0].hash, 11,
            "the parent's install checksum tells the child's dirty pages"
        );
        child.moved_out(id);
        for x in &v {
            child.finish_eviction(id, x.page, Evicted::Clean);
        }
        child.check().expect("child consistent after evicting");
        assert_eq!(child.resident(), 0);
        assert_eq!(c.resident(), 5, "the parent's core is its own");
    }

    /// A window of 3.5 huge units: residency per unit, protections, pins, regions and releases
    /// per page.
    #[test]
    fn huge_units_keep_residency_per_unit_and_the_rest_per_page() {
        let up = Unit::Huge.pages();
        let mut c = Core::with_unit(3 * up + up / 2, Unit::Huge, 4, Box::new(Fifo::default()));
        assert_eq!(c.units(), 4);
        assert_eq!(c.window_pages(), 3 * up + up / 2);
        // Regions are pages: a 3-page block fits anywhere.
        assert_eq!(c.alloc_region(3, 1), Some(0));
        for u in 0..3 {
            c.claim(u);
        }
        assert_eq!(c.resident(), 3);
        assert_eq!(c.resident_bytes(), 3 * Unit::Huge.bytes());
        c.check().expect("consistent");
        // One read-only page (a guard page) makes its unit unmovable: UFFDIO_MOVE of the unit
        // would need one protection for all of it.
        c.set_prot(up + 5, 1, prot::encode(1), false);
        // A pinned page pins its unit.
        c.pin(2 * up + 9, 1);
        c.check().expect("consistent after prot and pin");
        let mut v = Vec::new();
        c.choose_victims(4, 4, 0, &mut v).expect("a victim");
        assert_eq!(v.iter().map(|v| v.page).collect::<Vec<_>>(), [0]);
        c.set_prot(up + 5, 1, 0, false);
        c.unpin(2 * up + 9, 1);
        c.check().expect("consistent after unprot and unpin");
        let mut v2 = Vec::new();
        c.choose_victims(4, 4, 0, &mut v2).expect("victims");
        assert_eq!(v2.iter().map(|v| v.page).collect::<Vec<_>>(), [1, 2]);
        // A release of part of a unit leaves it as it is; of all of it, empties it.
        c.finish_eviction(2, 1, Evicted::Written);
        c.release(up, 10);
        assert_eq!(c.location(1), Location::Remote);
        c.release(up, up);
        assert_eq!(c.location(1), Location::Empty);
        // The short last unit is released whole by a release reaching the window's end.
        c.claim(3);
        assert_eq!(c.release(3 * up, up / 2), 1);
        assert_eq!(c.location(3), Location::Empty);
        c.check().expect("consistent at the end");
    }

    #[test]
    fn claim_evict_and_release_keep_every_count() {
        let mut c = core(16);
        for p in 0..6 {
            assert_eq!(c.claim(p), Source::Zeros);
        }
        c.record_hashes([(1, 11), (9, 99)]);
        assert_eq!(c.hash_of(1), Some(11));
        assert_eq!(c.hash_of(9), None, "not resident: not recorded");
        let mut v = Vec::new();
        let id = c.choose_victims(4, 16, 0, &mut v).expect("victims");
        assert_eq!(v.iter().map(|v| v.page).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!(v[1].hash, 11);
        assert_eq!(c.resident(), 2);
        c.check().expect("consistent while evicting");
        c.release(2, 1);
        assert!(c.is_moving_out(2), "released, but its job has not moved it out");
        c.moved_out(id);
        assert!(!c.is_moving_out(2));
        assert!(c.finish_eviction(id, 0, Evicted::Written));
        assert!(c.finish_eviction(id, 1, Evicted::Filled(5)));
        assert!(!c.finish_eviction(id, 2, Evicted::Written), "released meanwhile");
        assert!(c.finish_eviction(id, 3, Evicted::Clean));
        c.slots.put_free(v.iter().map(|v| v.slot));
        assert_eq!(c.location(0), Location::Remote);
        assert_eq!(c.location(2), Location::Empty);
        assert_eq!(c.location(3), Location::Empty, "a clean zero page");
        assert_eq!(c.claim(0), Source::Brick);
        assert_eq!(c.claim(1), Source::Fill(5));
        c.check().expect("consistent");
    }

    #[test]
    fn a_page_in_flight_is_no_victim_and_only_its_claim_installs_it() {
        let mut c = core(8);
        c.claim(0);
        let a = c.new_claim();
        assert_eq!(c.claim_for(a, 1), Source::Zeros);
        assert!(c.is_in_flight(1) && c.is_claimed_by(a, 1));
        c.check().expect("consistent with a page in flight");
        let mut v = Vec::new();
        c.choose_victims(8, 8, 0, &mut v);
        assert_eq!(
            v.iter().map(|v| v.page).collect::<Vec<_>>(),
            [0],
            "page 1 is on its way in"
        );
        // Released and claimed again by another fault: the first claim may not install it.
        c.release(1, 1);
        let b = c.new_claim();
        c.claim_for(b, 1);
        assert!(!c.installed(a, 1));
        assert!(c.installed(b, 1));
        assert!(!c.is_in_flight(1));
        c.check().expect("consistent");
    }

    #[test]
    fn a_moving_range_parks_its_write_backs_until_the_move_ends() {
        let mut c = core(16);
        c.placement_mut().assign(0..16, 0, 0);
        for p in 0..4 {
            c.claim(p);
        }
        // Page 1 goes to its brick before the move.
        let mut v = Vec::new();
        let early = c.choose_victims(2, 16, 0, &mut v).expect("victims");
        c.moved_out(early);
        let id = c.begin_move(0..4).expect("begins");
        assert!(c.is_moving(2) && !c.is_moving(4));
        assert_eq!(
            c.begin_move(3..6),
            Err(MoveError::Busy {
                first: 3,
                end: 6,
                other: id
            })
        );
        assert!(matches!(c.begin_move(15..17), Err(MoveError::Outside { .. })));
        assert!(!c.move_ready(id), "pages 0 and 1 are being written to the old home");
        // That write-back began before the move: it is not parked, and it ends.
        for x in &v {
            assert!(c.finish_eviction(early, x.page, Evicted::Written));
        }
        c.slots.put_free(v.iter().map(|x| x.slot));
        assert!(c.move_ready(id));
        assert_eq!(c.move_pages(id), [0, 1], "the brick-valid pages");
        // An eviction during the move is parked at its write-back.
        v.clear();
        let during = c.choose_victims(1, 16, 0, &mut v).expect("victims");
        c.moved_out(during);
        let mut parked = v[0];
        parked.moved = true;
        assert_eq!(parked.page, 2);
        assert!(c.park(during, &parked));
        assert!(c.move_ready(id), "a parked write-back does not hold the move");
        c.check().expect("consistent while moving");
        let back = c.finish_move(id, 1, 40);
        assert_eq!(back, [(during, vec![parked])]);
        assert_eq!(c.placement().home(2), Some((1, 42, 4)));
        assert_eq!(c.placement().home(4), Some((0, 4, 16)));
        assert!(!c.is_moving(2));
        c.check().expect("consistent after the move");
    }

    #[test]
    fn pinned_pages_are_no_victims_until_unpinned_or_released() {
        let mut c = core(8);
        for p in 0..4 {
            c.claim(p);
        }
        c.pin(0, 2);
        c.check().expect("consistent with pins");
        let mut v = Vec::new();
        c.choose_victims(8, 8, 0, &mut v);
        assert_eq!(v.iter().map(|v| v.page).collect::<Vec<_>>(), [2, 3]);
        c.unpin(1, 1);
        assert!(c.is_pinned(0) && !c.is_pinned(1));
        c.release(0, 1);
        assert!(!c.is_pinned(0), "a release ends the pin");
        c.check().expect("consistent");
        v.clear();
        c.choose_victims(8, 8, 0, &mut v);
        assert_eq!(v.iter().map(|v| v.page).collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn lent_pages_leave_the_policy_and_other_protections_stay() {
        let mut c = core(8);
        c.claim(0);
        c.claim(1);
        c.claim(2);
        c.set_prot(0, 1, prot::FOREIGN, true);
        c.set_prot(1, 1, prot::SET | 1, false); // read-only: still evictable
        c.check().expect("consistent");
        let mut v = Vec::new();
        c.choose_victims(8, 8, 0, &mut v);
        assert_eq!(v.iter().map(|v| v.page).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(v.iter().map(|v| v.prot).collect::<Vec<_>>(), [prot::SET | 1, 0]);
        c.set_prot(0, 1, 0, true);
        c.check().expect("consistent");
    }
}
