//! Deterministic simulation of the pager core (TigerBeetle's way): a seeded driver plays a
//! program's threads, the fault handler, the write-back thread, the kernel's userfaultfd queue
//! and a brick, all in memory, in an order drawn from the seed, and checks after every step that
//! every page reads back its last write and that the local buffer holds its budget.
//!
//! The handler and write-back steps below follow what `rackmem-runtime` does around each call
//! on the core (plan a run, choose victims, move them out, claim, fetch, install; write back,
//! recycle slots, finish), with the I/O replaced by maps, so that every interleaving the real
//! threads allow can be drawn: faults from several threads, releases (`MADV_DONTNEED`) racing
//! fetches and evictions, write-backs completing out of order, read-aheads going stale, forks,
//! brick errors and lost responses.
//!
//! - `cargo test -p rackmem-pager --test simulation`: a few hundred seeds (CI).
//! - `RACKMEM_SIM_SEED=N cargo test -p rackmem-pager --test simulation replay -- --ignored --nocapture`:
//!   replays one seed exactly, printing its trace.
//! - `./scripts/simulate` or `cargo test -p rackmem-pager --test simulation -- --ignored`: a long campaign
//!   (`RACKMEM_SIM_SEEDS`, default 20,000 seeds).

use rackmem_pager::policy::{Eviction, EvictionPolicy};
use rackmem_pager::{Core, Evicted, Location, Source, SpentRun, Victim};
use std::collections::{HashMap, VecDeque};

/// splitmix64: small, fast, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    /// True with probability `per_mille`/1000.
    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A page's contents are one `u64`; its checksum is a mix of it. Values below `FILLED` stand
/// for same-filled pages of that word (0 is the zero page).
const FILLED: u64 = 4;

fn checksum(v: u64) -> u64 {
    mix(v ^ 0x5EED)
}

fn same_filled(v: u64) -> Option<u64> {
    (v < FILLED).then_some(v)
}

/// The shape of one simulated run, drawn from its seed.
#[derive(Debug, Clone, Copy)]
struct Shape {
    window: u64,
    budget: u64,
    slots: u32,
    threads: usize,
    prefetch: usize,
    /// How often the write-back thread runs, against the program's 50 and the handler's 30.
    writeback_weight: u64,
    steps: usize,
    /// Per mille of brick operations that fail (an error or a lost response).
    brick_faults: u64,
    policy: Eviction,
}

fn policy(k: Eviction) -> Box<dyn EvictionPolicy> {
    k.build()
}

impl Shape {
    fn draw(rng: &mut Rng) -> Shape {
        let window = 16 + rng.below(240);
        let budget = 4 + rng.below(window / 2);
        let prefetch = [1, 4, 16][rng.below(3) as usize];
        // As in the runtime, half the slots cover one eviction batch (a run of at most a
        // quarter of the budget, plus a sixteenth of slack), and not many more: faults wait for
        // slots while write-backs are slow.
        let batch = (prefetch as u64).min(budget / 4).max(1) + (budget / 16).clamp(1, 32);
        Shape {
            window,
            budget,
            slots: (2 * batch + rng.below(8)) as u32,
            writeback_weight: 2 + rng.below(30),
            threads: 1 + rng.below(4) as usize,
            prefetch,
            steps: 2_000,
            brick_faults: if rng.chance(100) { 2 } else { 0 },
            policy: if rng.chance(500) {
                Eviction::Refault
            } else {
                Eviction::Fifo
            },
        }
    }
}

/// A message in the window's userfaultfd queue.
#[derive(Debug, Clone, Copy)]
enum Event {
    Fault { page: u64 },
    Remove { first: u64, count: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Thread {
    Running,
    /// Waiting for its fault on this page to be served.
    Blocked(u64),
}

/// A read of the next run of a stream, sent after an install and used by a later fault.
struct Ahead {
    page: u64,
    epoch: u64,
    /// The brick's contents when it answered.
    data: Vec<u64>,
}

/// The fault the handler is serving, and how far it got.
enum Serving {
    /// Planning: waits while the page is evicting.
    Plan { fault: u64 },
    /// Run planned; making room: waits while staging slots are short.
    MakeRoom { fault: u64, start: u64, n: u64, down: bool },
    /// Victims chosen; next: move them out of the window.
    Stage {
        fault: u64,
        start: u64,
        n: u64,
        down: bool,
        job: Option<(u64, Vec<Victim>)>,
    },
    /// Victims queued; next: re-check and claim the run.
    Claim { fault: u64, start: u64, n: u64, down: bool },
    /// Claimed; next: read the brick pages.
    Fetch {
        page: u64,
        kinds: Vec<Source>,
        ahead: Option<Ahead>,
        spent: Option<SpentRun>,
    },
    /// Fetched; next: install.
    Install {
        page: u64,
        kinds: Vec<Source>,
        data: Vec<u64>,
        spent: Option<SpentRun>,
    },
}

/// Why a run ended early.
#[derive(Debug, PartialEq)]
enum End {
    /// The brick failed: the runtime stops the program rather than go on with missing data.
    BrickLost,
}

struct Sim {
    rng: Rng,
    shape: Shape,
    core: Core,
    /// Pages present in the window (what the kernel maps), with their contents.
    window: HashMap<u64, u64>,
    /// Staging slots holding a page (victims in flight, and spent slots).
    staging: HashMap<u32, u64>,
    /// The brick's copy of each page (absent: zeros).
    brick: HashMap<u64, u64>,
    /// What each page must read: the program's last write (absent: zeros).
    model: HashMap<u64, u64>,
    uffd: VecDeque<Event>,
    threads: Vec<Thread>,
    /// Per thread, the next page of its sequential stream.
    cursor: Vec<u64>,
    jobs: Vec<(u64, Vec<Victim>)>,
    serving: Option<Serving>,
    aheads: Vec<Ahead>,
    trace: VecDeque<String>,
    step: usize,
    forks: u32,
    /// How often each interesting thing happened, to show what a campaign covered.
    seen: std::collections::BTreeMap<&'static str, u64>,
}

const ZERO: u64 = 0;

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = Rng(seed);
        let shape = Shape::draw(&mut rng);
        let mut core = Core::new(shape.window, shape.slots, policy(shape.policy));
        // One region covers the window, as one large allocation would.
        assert_eq!(core.alloc.alloc(shape.window, 1), Some(0));
        Sim {
            rng,
            shape,
            core,
            window: HashMap::new(),
            staging: HashMap::new(),
            brick: HashMap::new(),
            model: HashMap::new(),
            uffd: VecDeque::new(),
            threads: vec![Thread::Running; shape.threads],
            cursor: (0..shape.threads as u64).map(|t| t * shape.window / 4).collect(),
            jobs: Vec::new(),
            serving: None,
            aheads: Vec::new(),
            trace: VecDeque::new(),
            step: 0,
            forks: 0,
            seen: Default::default(),
        }
    }

    fn count(&mut self, what: &'static str) {
        *self.seen.entry(what).or_default() += 1;
    }

    fn log(&mut self, what: String) {
        if self.trace.len() == 64 {
            self.trace.pop_front();
        }
        self.trace.push_back(format!("{:5} {what}", self.step));
    }

    fn expect(&self, page: u64) -> u64 {
        self.model.get(&page).copied().unwrap_or(ZERO)
    }

    fn zero_hash() -> u64 {
        checksum(ZERO)
    }

    /// A brick operation: fails now and then when the shape says so.
    fn brick_ok(&mut self) -> Result<(), End> {
        if self.shape.brick_faults > 0 && self.rng.chance(self.shape.brick_faults) {
            Err(End::BrickLost)
        } else {
            Ok(())
        }
    }

    fn run(&mut self) -> Result<Option<End>, String> {
        for step in 0..self.shape.steps {
            self.step = step;
            match self.one_step() {
                Ok(()) => {}
                Err(End::BrickLost) => {
                    self.log("brick lost: the program stops".into());
                    return Ok(Some(End::BrickLost));
                }
            }
            self.check()?;
        }
        Ok(None)
    }

    fn one_step(&mut self) -> Result<(), End> {
        let running: Vec<usize> = (0..self.threads.len())
            .filter(|&t| self.threads[t] == Thread::Running)
            .collect();
        let handler_busy = self.serving.is_some() || !self.uffd.is_empty();
        let mut choices: Vec<(u64, u8)> = Vec::new();
        if !running.is_empty() {
            choices.push((50, 0));
        }
        if handler_busy {
            choices.push((30, 1));
        }
        if !self.jobs.is_empty() {
            choices.push((self.shape.writeback_weight, 2));
        }
        if self.serving.is_none() && self.uffd.is_empty() && self.jobs.is_empty() {
            choices.push((1, 3));
        }
        let total: u64 = choices.iter().map(|c| c.0).sum();
        assert!(total > 0, "nothing can run: the simulation deadlocked");
        let mut pick = self.rng.below(total);
        let mut what = 0;
        for (w, c) in choices {
            if pick < w {
                what = c;
                break;
            }
            pick -= w;
        }
        match what {
            0 => {
                let t = running[self.rng.below(running.len() as u64) as usize];
                self.program(t);
                Ok(())
            }
            1 => self.handler_step(),
            2 => {
                let i = self.rng.below(self.jobs.len() as u64) as usize;
                let (id, victims) = self.jobs.swap_remove(i);
                self.write_back(id, victims)
            }
            _ => self.fork(),
        }
    }

    // --- The program -------------------------------------------------------------------

    fn pick_page(&mut self, t: usize) -> u64 {
        let w = self.shape.window;
        match self.rng.below(10) {
            // A hot fifth of the pages.
            0..=4 => self.rng.below((w / 5).max(1)),
            // The thread's sequential stream.
            5..=7 => {
                let p = self.cursor[t] % w;
                self.cursor[t] = (p + 1) % w;
                p
            }
            _ => self.rng.below(w),
        }
    }

    fn program(&mut self, t: usize) {
        if self.rng.chance(30) {
            // MADV_DONTNEED of a few pages: the kernel zaps what is mapped and queues REMOVE;
            // then the runtime's own call releases the pages in the core.
            let first = self.rng.below(self.shape.window);
            let count = (1 + self.rng.below(8)).min(self.shape.window - first);
            for p in first..first + count {
                self.window.remove(&p);
                self.model.remove(&p);
            }
            self.uffd.push_back(Event::Remove { first, count });
            self.core.release(first, count);
            self.log(format!("thread {t} releases {first}+{count}"));
            return;
        }
        let page = self.pick_page(t);
        let write = self.rng.chance(500);
        match self.window.get(&page).copied() {
            Some(v) if write => {
                let nv = if self.rng.chance(100) {
                    self.rng.below(FILLED)
                } else {
                    self.rng.next() | FILLED
                };
                self.window.insert(page, nv);
                self.model.insert(page, nv);
                self.log(format!("thread {t} writes {page} = {nv:#x} (was {v:#x})"));
            }
            Some(v) => {
                let e = self.expect(page);
                assert_eq!(v, e, "thread {t} read page {page}: {v:#x}, last write {e:#x}");
            }
            None => {
                self.uffd.push_back(Event::Fault { page });
                self.threads[t] = Thread::Blocked(page);
                self.log(format!("thread {t} faults on {page}"));
            }
        }
    }

    /// Wakes the threads whose page is now mapped.
    fn wake(&mut self) {
        for t in 0..self.threads.len() {
            if let Thread::Blocked(p) = self.threads[t] {
                if self.window.contains_key(&p) {
                    self.threads[t] = Thread::Running;
                }
            }
        }
    }

    // --- The fault handler -------------------------------------------------------------

    fn handler_step(&mut self) -> Result<(), End> {
        let Some(s) = self.serving.take() else {
            match self.uffd.pop_front() {
                Some(Event::Remove { first, count }) => {
                    self.core.release(first, count);
                    self.log(format!("handler: REMOVE {first}+{count}"));
                }
                Some(Event::Fault { page }) => self.serving = Some(Serving::Plan { fault: page }),
                None => {}
            }
            return Ok(());
        };
        self.serving = match s {
            Serving::Plan { fault } => self.plan(fault),
            Serving::MakeRoom { fault, start, n, down } => self.make_room(fault, start, n, down),
            Serving::Stage {
                fault,
                start,
                n,
                down,
                job,
            } => {
                if let Some((id, mut victims)) = job {
                    for v in victims.iter_mut() {
                        if let Some(c) = self.window.remove(&(v.page as u64)) {
                            self.staging.insert(v.slot, c);
                            v.moved = true;
                        }
                    }
                    self.log(format!("handler: staged job {id}: {} victims", victims.len()));
                    self.jobs.push((id, victims));
                }
                Some(Serving::Claim { fault, start, n, down })
            }
            Serving::Claim { fault, start, n, down } => self.claim(fault, start, n, down),
            Serving::Fetch {
                page,
                kinds,
                ahead,
                spent,
            } => {
                let mut data = Vec::with_capacity(kinds.len());
                for (i, k) in kinds.iter().enumerate() {
                    let p = page + i as u64;
                    data.push(match *k {
                        Source::Zeros | Source::Held => ZERO,
                        Source::Fill(w) => w,
                        Source::Brick => match &ahead {
                            Some(a) => a.data[i],
                            None => self.brick.get(&p).copied().unwrap_or(ZERO),
                        },
                    });
                }
                if ahead.is_none() && kinds.contains(&Source::Brick) {
                    self.brick_ok()?;
                }
                Some(Serving::Install {
                    page,
                    kinds,
                    data,
                    spent,
                })
            }
            Serving::Install {
                page,
                kinds,
                data,
                spent,
            } => {
                self.install(page, &kinds, &data, spent)?;
                None
            }
        };
        Ok(())
    }

    fn plan(&mut self, fault: u64) -> Option<Serving> {
        match self.core.location(fault) {
            Location::Resident => {
                // Another thread's fault installed it (or it is claimed and on its way: that
                // fault's install wakes everyone).
                self.wake();
                return None;
            }
            // Being written back: wait for the write-back thread.
            Location::Evicting => {
                self.count("fault waits for its page's write-back");
                return Some(Serving::Plan { fault });
            }
            _ => {}
        }
        let plan = self.core.streams.plan(fault, self.shape.prefetch);
        let (region_start, region_end) = (0, self.shape.window);
        let budget = self.shape.budget;
        let cap = (plan.run as u64).min((budget / 4).max(1));
        // A run passes over resident pages, as the runtime's does.
        let fits = |c: &Core, p: u64| c.state(p).installable() || c.location(p) == Location::Resident;
        let mut n = 1u64;
        let mut start = fault;
        if plan.down {
            while n < cap.min(fault - region_start + 1) && fits(&self.core, fault - n) {
                n += 1;
            }
            start = fault + 1 - n;
        } else {
            while n < cap.min(region_end - fault) && fits(&self.core, fault + n) {
                n += 1;
            }
        }
        self.drop_stale_aheads(fault);
        if !plan.down {
            if let Some(a) = self.aheads.iter().find(|a| a.page == fault) {
                n = a.data.len() as u64;
            }
        }
        self.core.streams.advance(plan.slot, start, start + n);
        Some(Serving::MakeRoom {
            fault,
            start,
            n,
            down: plan.down,
        })
    }

    fn make_room(&mut self, fault: u64, start: u64, n: u64, down: bool) -> Option<Serving> {
        let budget = self.shape.budget;
        let resident = self.core.resident();
        if resident + n <= budget {
            return Some(Serving::Stage {
                fault,
                start,
                n,
                down,
                job: None,
            });
        }
        let slack = (budget / 16).clamp(1, 32);
        let want = ((resident + n - budget + slack) as usize)
            .min(self.shape.slots as usize / 2)
            .min(resident as usize);
        while self.core.slots.free_count() < want {
            if self.core.slots.spent_is_empty() {
                // Wait for the write-back thread to give slots back.
                self.count("fault waits for staging slots");
                return Some(Serving::MakeRoom { fault, start, n, down });
            }
            self.count("spent slots freed for victims");
            for (s, l) in self.core.slots.take_all_spent() {
                for slot in s..s + l {
                    self.staging.remove(&slot);
                }
                self.core.slots.put_free((s..s + l).rev());
            }
        }
        let mut victims = Vec::new();
        let job = self
            .core
            .choose_victims(want, budget, Self::zero_hash(), &mut victims)
            .map(|id| (id, victims));
        Some(Serving::Stage {
            fault,
            start,
            n,
            down,
            job,
        })
    }

    fn claim(&mut self, fault: u64, start: u64, n: u64, down: bool) -> Option<Serving> {
        let c = &self.core;
        let ok = |p: u64| c.state(p).installable();
        let held = |p: u64| c.location(p) == Location::Resident;
        if !ok(fault) {
            // Installed or being evicted meanwhile: plan again.
            return Some(Serving::Plan { fault });
        }
        let (page, n) = if down {
            let (mut first, mut p) = (fault, fault);
            while p > start && (ok(p - 1) || held(p - 1)) {
                p -= 1;
                if ok(p) {
                    first = p;
                }
            }
            (first, fault + 1 - first)
        } else {
            let (mut k, mut end) = (1, 1);
            while k < n && (ok(start + k) || held(start + k)) {
                if ok(start + k) {
                    end = k + 1;
                }
                k += 1;
            }
            (start, end)
        };
        let kinds: Vec<Source> = (page..page + n)
            .map(|p| {
                if self.core.state(p).installable() {
                    self.core.claim(p)
                } else {
                    Source::Held
                }
            })
            .collect();
        if kinds.contains(&Source::Held) {
            self.count("runs passing over resident pages");
        }
        let epoch = self.core.epoch();
        let ahead = match self.aheads.iter().position(|a| a.page == page) {
            Some(i) => {
                let a = self.aheads.swap_remove(i);
                let usable =
                    a.data.len() == kinds.len() && a.epoch == epoch && kinds.iter().all(|&k| k == Source::Brick);
                usable.then_some(a)
            }
            None => None,
        };
        // A read-ahead of any page claimed now would go stale.
        self.aheads
            .retain(|a| !(a.page < page + n && page < a.page + a.data.len() as u64));
        let spent = if ahead.is_none() && n >= 4 {
            self.core.slots.take_spent(n as usize)
        } else {
            None
        };
        if ahead.is_some() {
            self.count("runs served by a read-ahead");
        }
        if spent.is_some() {
            self.count("runs received into spent slots");
        }
        self.log(format!(
            "handler: claimed {page}+{n} for fault {fault}{}{}",
            if ahead.is_some() { " (read-ahead)" } else { "" },
            if spent.is_some() { " (into spent slots)" } else { "" }
        ));
        Some(Serving::Fetch {
            page,
            kinds,
            ahead,
            spent,
        })
    }

    fn install(&mut self, page: u64, kinds: &[Source], data: &[u64], spent: Option<SpentRun>) -> Result<(), End> {
        // A non-fault event queued makes the install ioctl fail with EAGAIN: the handler applies
        // the queued events, then installs what is still claimed.
        let mut faults = VecDeque::new();
        while let Some(e) = self.uffd.pop_front() {
            match e {
                Event::Remove { first, count } => {
                    self.core.release(first, count);
                    self.count("install EAGAIN on a queued REMOVE");
                    self.log(format!("handler: REMOVE {first}+{count} (install EAGAIN)"));
                }
                f @ Event::Fault { .. } => faults.push_back(f),
            }
        }
        self.uffd = faults;
        let mut hashes = Vec::new();
        for (i, &v) in data.iter().enumerate() {
            let p = page + i as u64;
            if kinds[i] == Source::Held {
                continue;
            }
            if self.core.location(p) != Location::Resident {
                self.count("claimed pages released before their install");
            }
            if self.core.location(p) == Location::Resident && !self.window.contains_key(&p) {
                self.window.insert(p, v);
                self.count(match kinds[i] {
                    Source::Zeros | Source::Held => "pages installed as zeros",
                    Source::Brick => "pages installed from the brick",
                    Source::Fill(_) => "pages installed as fills",
                });
                if kinds[i] == Source::Brick {
                    hashes.push((p as u32, checksum(v)));
                }
            }
        }
        self.core.record_hashes(hashes);
        if let Some(run) = spent {
            // Every slot's page moved into the window: free again.
            for s in run.start()..run.start() + run.count() {
                self.staging.remove(&s);
            }
            self.core.slots.put_free((run.start()..run.start() + run.count()).rev());
        }
        self.log(format!("handler: installed {page}+{}", data.len()));
        assert!(
            self.core.resident() <= self.shape.budget,
            "{} pages resident over a budget of {}",
            self.core.resident(),
            self.shape.budget
        );
        self.wake();
        // Keep the stream's next run on its way: a read of pages that are all on the brick.
        if data.len() > 1 && kinds.iter().all(|&k| k != Source::Zeros) && self.aheads.len() < 4 {
            let next = page + data.len() as u64;
            let mut m = 0;
            while m < data.len() as u64
                && next + m < self.shape.window
                && self.core.location(next + m) == Location::Remote
                && !self.core.is_filled(next + m)
            {
                m += 1;
            }
            if m >= 2 && !self.aheads.iter().any(|a| a.page == next) {
                self.brick_ok()?;
                let data = (next..next + m)
                    .map(|p| self.brick.get(&p).copied().unwrap_or(ZERO))
                    .collect();
                self.aheads.push(Ahead {
                    page: next,
                    epoch: self.core.epoch(),
                    data,
                });
                self.count("read-aheads sent");
                self.log(format!("handler: read ahead {next}+{m}"));
            }
        }
        Ok(())
    }

    fn drop_stale_aheads(&mut self, fault: u64) {
        let epoch = self.core.epoch();
        self.aheads.retain(|a| {
            let inside = fault > a.page && fault < a.page + a.data.len() as u64;
            a.epoch == epoch && !inside
        });
    }

    // --- The write-back thread ---------------------------------------------------------

    fn write_back(&mut self, id: u64, victims: Vec<Victim>) -> Result<(), End> {
        let mut outcomes = Vec::with_capacity(victims.len());
        for v in &victims {
            // A page released since it was staged is not written: its staged copy is stale, and
            // a later eviction of the page may already have written newer contents.
            let how = if !v.moved || !self.core.is_evicting_for(id, v.page) {
                Evicted::Gone
            } else {
                let c = self.staging.get(&v.slot).copied().unwrap_or(ZERO);
                if let Some(w) = same_filled(c) {
                    Evicted::Filled(w)
                } else if checksum(c) == v.hash {
                    Evicted::Clean
                } else {
                    self.brick_ok()?;
                    self.brick.insert(v.page as u64, c);
                    Evicted::Written
                }
            };
            self.count(match how {
                Evicted::Gone => "evictions of released pages",
                Evicted::Clean => "clean evictions",
                Evicted::Written => "evictions written back",
                Evicted::Filled(_) => "same-filled evictions",
            });
            outcomes.push(how);
        }
        // Moved slots are kept as spent when there is room, else freed; the others are free.
        for v in &victims {
            if !(v.moved && self.core.slots.give_spent(v.slot, 1)) {
                self.staging.remove(&v.slot);
                self.core.slots.put_free([v.slot]);
            }
        }
        for (v, how) in victims.iter().zip(outcomes) {
            self.core.finish_eviction(id, v.page, how);
        }
        self.log(format!("write-back: job {id} done ({} pages)", victims.len()));
        Ok(())
    }

    // --- fork --------------------------------------------------------------------------

    /// The parent writes back its dirty resident pages; the child starts from the parent's
    /// core and a copy of its brick memory, with nothing mapped. Half the time the simulation
    /// goes on as the child.
    fn fork(&mut self) -> Result<(), End> {
        let resident: Vec<u64> = (0..self.shape.window)
            .filter(|&p| self.core.location(p) == Location::Resident)
            .collect();
        for p in resident {
            let Some(&v) = self.window.get(&p) else {
                continue;
            };
            let hash = self.core.hash_of(p).unwrap_or(Self::zero_hash());
            if checksum(v) != hash {
                self.brick_ok()?;
                self.brick.insert(p, v);
                self.core.mark_written(p, Some(checksum(v)));
            }
        }
        self.forks += 1;
        if self.rng.chance(500) {
            self.core = self.core.forked(policy(self.shape.policy));
            self.window.clear();
            self.staging.clear();
            self.aheads.clear();
            self.count("forks going on as the child");
            self.log("fork: going on as the child".into());
        } else {
            self.log("fork: going on as the parent".into());
        }
        Ok(())
    }

    // --- Checks ------------------------------------------------------------------------

    /// Every page reads back its last write, wherever it is; the core is consistent.
    fn check(&self) -> Result<(), String> {
        self.core.check()?;
        let in_flight: HashMap<u64, u32> = self
            .jobs
            .iter()
            .flat_map(|(_, vs)| vs.iter())
            .filter(|v| v.moved)
            .map(|v| (v.page as u64, v.slot))
            .collect();
        for p in 0..self.shape.window {
            let want = self.expect(p);
            let s = self.core.state(p);
            let mapped = self.window.get(&p).copied();
            let staging_now = match &self.serving {
                Some(Serving::Stage { job: Some((_, vs)), .. }) => vs.iter().any(|v| v.page as u64 == p),
                _ => false,
            };
            // A victim stays mapped from its choice until the handler moves it out.
            let may_map = s.location() == Location::Resident || (s.location() == Location::Evicting && staging_now);
            if mapped.is_some() && !may_map {
                return Err(format!("page {p} is mapped but {s:?}"));
            }
            let have = match s.location() {
                Location::Resident => match mapped {
                    Some(v) => v,
                    None => continue, // claimed, on its way
                },
                Location::Evicting => match (mapped, in_flight.get(&p)) {
                    (Some(v), _) => v,
                    (None, Some(slot)) => self.staging.get(slot).copied().unwrap_or(ZERO),
                    (None, None) => continue, // chosen, not there to move (released meanwhile)
                },
                Location::Remote => match self.core.fill_of(p) {
                    Some(w) => w,
                    None => self.brick.get(&p).copied().unwrap_or(ZERO),
                },
                Location::Empty => ZERO,
            };
            if have != want {
                return Err(format!(
                    "page {p} ({s:?}) reads {have:#x}, its last write was {want:#x}"
                ));
            }
        }
        Ok(())
    }

    fn report(&self, seed: u64, why: &str) -> String {
        let trace: Vec<&str> = self.trace.iter().map(String::as_str).collect();
        format!(
            "simulation seed {seed} failed at step {}: {why}\nshape: {:?}\nlast steps:\n{}\n\
             replay: RACKMEM_SIM_SEED={seed} cargo test -p rackmem-pager --test simulation replay -- --ignored --nocapture",
            self.step,
            self.shape,
            trace.join("\n")
        )
    }
}

/// Runs one seed; Err(report) if a check failed or something panicked.
fn run_seed(seed: u64) -> Result<Sim, String> {
    let mut sim = Sim::new(seed);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.run()));
    match outcome {
        Ok(Ok(_)) => Ok(sim),
        Ok(Err(why)) => Err(sim.report(seed, &why)),
        Err(panic) => {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            Err(sim.report(seed, &why))
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn campaign(first: u64, seeds: u64) {
    let mut forks = 0;
    let mut lost = 0;
    let mut seen: std::collections::BTreeMap<&'static str, u64> = Default::default();
    for seed in first..first + seeds {
        match run_seed(seed) {
            Ok(sim) => {
                forks += sim.forks;
                lost += u32::from(sim.trace.back().is_some_and(|l| l.contains("brick lost")));
                for (k, v) in sim.seen {
                    *seen.entry(k).or_default() += v;
                }
            }
            Err(report) => panic!("{report}"),
        }
    }
    println!("{seeds} seeds from {first}: every page read back its last write ({forks} forks, {lost} runs ended by a lost brick)");
    for (k, v) in &seen {
        println!("{v:>10}  {k}");
    }
    // A campaign that never reached the interleavings it exists for proves nothing.
    for must in [
        "fault waits for its page's write-back",
        "fault waits for staging slots",
        "claimed pages released before their install",
        "evictions written back",
        "same-filled evictions",
        "runs served by a read-ahead",
        "runs received into spent slots",
        "runs passing over resident pages",
        "forks going on as the child",
    ] {
        assert!(
            seen.get(must).copied().unwrap_or(0) > 0,
            "the campaign never saw: {must}"
        );
    }
}

#[test]
fn a_few_hundred_seeds_lose_no_write() {
    campaign(0, 300);
}

#[test]
#[ignore = "replays one seed: RACKMEM_SIM_SEED=N cargo test -p rackmem-pager --test simulation replay -- --ignored --nocapture"]
fn replay() {
    let Some(seed) = env_u64("RACKMEM_SIM_SEED") else {
        panic!("set RACKMEM_SIM_SEED=N to replay seed N");
    };
    match run_seed(seed) {
        Ok(sim) => {
            println!("seed {seed} passed; shape {:?}; last steps:", sim.shape);
            for l in &sim.trace {
                println!("{l}");
            }
        }
        Err(report) => panic!("{report}"),
    }
}

#[test]
#[ignore = "long campaign: cargo test -p rackmem-pager --test simulation -- --ignored"]
fn long_campaign() {
    let first = env_u64("RACKMEM_SIM_FIRST").unwrap_or(1_000_000);
    campaign(first, env_u64("RACKMEM_SIM_SEEDS").unwrap_or(20_000));
}
