//! Seeded simulation of a core of huge units (2 MiB, 512 subpages each): a program reads and
//! writes subpages at random over a window larger than its local buffer, faults fetch and
//! install whole units, evictions move units out whole into staging slots, and write-backs
//! (`rackmem_pager::writeback::write_back`, the runtime's own sequence) complete in any order,
//! with releases of whole units and of single subpages (a split THP) racing them.
//!
//! After every step: the core's tables agree (`Core::check`), the resident units charge no
//! more than the budget in bytes (a unit charges 2 MiB), and every subpage of every resident
//! unit reads its last write. At every write-back, only subpages whose contents differ from
//! what their brick holds are sent (the dirty check per subpage), and at the end every subpage
//! of the window reads its last write once more.
//!
//! `cargo test -p rackmem-pager --test units`; a planted bug (the install checks of a unit's
//! previous life kept) must be caught.

use rackmem_pager::policy::Eviction;
use rackmem_pager::unit::{changed_runs, unit_filled, HUGE_PAGES};
use rackmem_pager::writeback::{self, Examined, Writer};
use rackmem_pager::{Check, Core, Location, Source, Unit, Victim};
use std::collections::HashMap;
use std::sync::Mutex;

const SUB: usize = HUGE_PAGES as usize;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A subpage's contents are one `u64`; values below 4 stand for a subpage filled with that word
/// (0: zeros), the others for contents with that checksum.
fn check_of(v: u64) -> Check {
    if v < 4 {
        Check::Filled(v)
    } else {
        Check::Sum(v.rotate_left(17) ^ 0x5EED)
    }
}

fn checks(data: &[u64]) -> Box<[Check]> {
    data.iter().map(|&v| check_of(v)).collect()
}

struct World {
    /// Resident units mapped in the window, with their subpages.
    window: HashMap<u64, Vec<u64>>,
    /// Staging slots holding a unit moved out.
    staging: HashMap<u32, Vec<u64>>,
    /// The brick: (unit, subpage) → contents (absent: zeros).
    brick: HashMap<(u64, usize), u64>,
    /// What each subpage must read (absent: zeros).
    model: HashMap<(u64, usize), u64>,
    queued: Vec<(u64, usize, u64)>,
    /// Subpages sent of units whose brick copy was valid (compared subpage by subpage).
    sent: u64,
    /// Units examined dirty whose brick copy was valid.
    dirty_units: u64,
}

struct W<'a> {
    core: &'a Mutex<Core>,
    world: &'a mut World,
}

impl Writer for W<'_> {
    fn examine(&mut self, v: &Victim) -> Examined {
        let data = self
            .world
            .staging
            .get(&v.slot)
            .expect("examined victim is staged")
            .clone();
        let new = checks(&data);
        let old = self.core.lock().expect("core").take_staged_sums(v.page as u64);
        if let Some(w) = unit_filled(&new) {
            return Examined::Filled(w);
        }
        // A brick copy that is not valid (a first touch, or released since) may hold anything
        // the unit held before: every subpage is sent.
        let old = if v.brick_valid { old } else { None };
        let runs = changed_runs(old.as_deref(), &new);
        if runs.is_empty() {
            return Examined::Clean;
        }
        for r in runs {
            for (s, &value) in data.iter().enumerate().take(r.end as usize).skip(r.start as usize) {
                // Only what changed is sent: a subpage equal to its brick copy is never sent
                // when the brick's copy is valid.
                let on_brick = self.world.brick.get(&(v.page as u64, s)).copied().unwrap_or(0);
                assert!(
                    !(v.brick_valid && on_brick == value),
                    "unit {} subpage {s} sent unchanged",
                    v.page
                );
                self.world.queued.push((v.page as u64, s, value));
                if v.brick_valid {
                    self.world.sent += 1;
                }
            }
        }
        if v.brick_valid {
            self.world.dirty_units += 1;
        }
        Examined::Dirty
    }

    fn flush(&mut self) {
        for (u, s, v) in self.world.queued.drain(..) {
            self.world.brick.insert((u, s), v);
        }
    }

    fn discard_slots(&mut self, start: u32, count: u32) {
        for s in start..start + count {
            self.world.staging.remove(&s);
        }
    }
}

struct Sim {
    rng: Rng,
    core: Mutex<Core>,
    world: World,
    window: u64,
    budget: u64,
    jobs: Vec<(u64, Vec<Victim>)>,
}

impl Sim {
    fn new(seed: u64, planted: bool) -> Sim {
        let mut rng = Rng(seed);
        let window = 8 + rng.below(40);
        let budget = 2 + rng.below(window / 2);
        let slots = (2 + rng.below(6)) as u32;
        let policy = if rng.below(2) == 0 {
            Eviction::Fifo
        } else {
            Eviction::Refault
        };
        let mut core = Core::with_unit(window * HUGE_PAGES, Unit::Huge, slots, policy.build());
        if planted {
            core.plant_stale_sums();
        }
        Sim {
            rng,
            core: Mutex::new(core),
            world: World {
                window: HashMap::new(),
                staging: HashMap::new(),
                brick: HashMap::new(),
                model: HashMap::new(),
                queued: Vec::new(),
                sent: 0,
                dirty_units: 0,
            },
            window,
            budget,
            jobs: Vec::new(),
        }
    }

    fn write_back_one(&mut self) {
        if self.jobs.is_empty() {
            return;
        }
        let i = self.rng.below(self.jobs.len() as u64) as usize;
        let (id, victims) = self.jobs.swap_remove(i);
        let mut w = W {
            core: &self.core,
            world: &mut self.world,
        };
        writeback::write_back(&self.core, &mut w, id, &victims);
    }

    /// Makes room for one unit: evicts until the resident units and the new one fit the budget.
    fn make_room(&mut self) {
        let unit_bytes = Unit::Huge.bytes();
        loop {
            let (id, mut victims) = {
                let mut c = self.core.lock().expect("core");
                if c.resident_bytes() + unit_bytes <= self.budget * unit_bytes {
                    return;
                }
                let mut victims = Vec::new();
                let want = 1 + self.rng.below(3) as usize;
                let id = c.choose_victims(want, Unit::Huge.budget_units(self.budget * unit_bytes), 0, &mut victims);
                (id, victims)
            };
            match id {
                Some(id) => {
                    for v in victims.iter_mut() {
                        // The unit leaves the window whole, into its slot (one 2 MiB move).
                        if let Some(data) = self.world.window.remove(&(v.page as u64)) {
                            self.world.staging.insert(v.slot, data);
                            v.moved = true;
                        }
                    }
                    self.core.lock().expect("core").moved_out(id);
                    self.jobs.push((id, victims));
                }
                None => {
                    // No free slot: a write-back gives some back (or spent slots are freed).
                    if self.jobs.is_empty() {
                        let mut c = self.core.lock().expect("core");
                        let run = c.take_spent_slots(1).expect("slots are free, spent or in jobs");
                        let s = run.start();
                        drop(c);
                        self.world.staging.remove(&s);
                        self.core.lock().expect("core").put_free_slots([s]);
                    } else {
                        self.write_back_one();
                    }
                }
            }
        }
    }

    /// The program touches `unit`: a fault if it is not mapped.
    fn touch(&mut self, unit: u64) {
        loop {
            if self.world.window.contains_key(&unit) {
                return;
            }
            let loc = self.core.lock().expect("core").location(unit);
            if loc == Location::Evicting {
                // Its write-back must end first, as the real fault waits.
                self.write_back_one();
                continue;
            }
            assert_ne!(loc, Location::Resident, "unit {unit} resident but not mapped");
            self.make_room();
            let src = {
                let mut c = self.core.lock().expect("core");
                let id = c.new_claim();
                let src = c.claim_for(id, unit);
                (id, src)
            };
            let data: Vec<u64> = match src.1 {
                Source::Zeros => vec![0; SUB],
                Source::Fill(w) => vec![w; SUB],
                Source::Brick => (0..SUB)
                    .map(|s| self.world.brick.get(&(unit, s)).copied().unwrap_or(0))
                    .collect(),
                Source::Held => unreachable!("claim never holds"),
            };
            let sums = checks(&data);
            self.world.window.insert(unit, data);
            let mut c = self.core.lock().expect("core");
            assert!(c.installed(src.0, unit));
            // Checks are taken of every install: compared with at eviction when the brick's
            // copy is valid, ignored otherwise.
            c.record_sums(unit, sums);
            return;
        }
    }

    fn step(&mut self) {
        match self.rng.below(100) {
            0..=44 => {
                let u = self.rng.below(self.window);
                let s = self.rng.below(SUB as u64) as usize;
                self.touch(u);
                let got = self.world.window[&u][s];
                let want = self.world.model.get(&(u, s)).copied().unwrap_or(0);
                assert_eq!(got, want, "unit {u} subpage {s}");
            }
            45..=79 => {
                // A small write: one subpage (sometimes a fill word, sometimes back to zeros).
                let u = self.rng.below(self.window);
                let s = self.rng.below(SUB as u64) as usize;
                let v = match self.rng.below(4) {
                    0 => self.rng.below(4),
                    _ => 4 + self.rng.below(8),
                };
                self.touch(u);
                self.world.window.get_mut(&u).expect("mapped")[s] = v;
                self.world.model.insert((u, s), v);
            }
            80..=91 => self.write_back_one(),
            92..=95 => {
                // MADV_DONTNEED of one subpage of a mapped unit: the THP splits, the subpage
                // reads zeros; the core is not told (its unit stays resident).
                let u = self.rng.below(self.window);
                if let Some(d) = self.world.window.get_mut(&u) {
                    let s = self.rng.below(SUB as u64) as usize;
                    d[s] = 0;
                    self.world.model.remove(&(u, s));
                }
            }
            _ => {
                // MADV_DONTNEED of whole units.
                let u = self.rng.below(self.window);
                let n = 1 + self.rng.below(3).min(self.window - u - 1);
                self.core.lock().expect("core").release(u * HUGE_PAGES, n * HUGE_PAGES);
                for x in u..u + n {
                    self.world.window.remove(&x);
                    self.world.model.retain(|k, _| k.0 != x);
                }
            }
        }
        let c = self.core.lock().expect("core");
        if let Err(e) = c.check() {
            panic!("core: {e}");
        }
        assert!(
            c.resident_bytes() <= self.budget * Unit::Huge.bytes(),
            "{} bytes resident over a budget of {} units",
            c.resident_bytes(),
            self.budget
        );
        drop(c);
        for (u, d) in &self.world.window {
            for (s, &v) in d.iter().enumerate() {
                let want = self.world.model.get(&(*u, s)).copied().unwrap_or(0);
                assert_eq!(v, want, "resident unit {u} subpage {s}");
            }
        }
    }

    /// Runs `steps` steps, then reads every subpage of the window.
    fn run(&mut self, steps: usize) {
        for _ in 0..steps {
            self.step();
        }
        while !self.jobs.is_empty() {
            self.write_back_one();
        }
        for u in 0..self.window {
            self.touch(u);
            for s in 0..SUB {
                let want = self.world.model.get(&(u, s)).copied().unwrap_or(0);
                assert_eq!(self.world.window[&u][s], want, "end: unit {u} subpage {s}");
            }
        }
    }
}

fn run_seed(seed: u64, planted: bool) -> Result<(u64, u64), String> {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut sim = Sim::new(seed, planted);
        sim.run(600);
        (sim.world.sent, sim.world.dirty_units)
    }));
    r.map_err(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

#[test]
fn huge_units_keep_every_subpage_and_send_only_changed_ones() {
    let (mut sent, mut dirty) = (0, 0);
    for seed in 0..60 {
        match run_seed(seed, false) {
            Ok((s, d)) => {
                sent += s;
                dirty += d;
            }
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
    eprintln!("{sent} subpages sent for {dirty} dirty units the brick held");
    assert!(dirty > 0, "no brick-valid unit was ever written back");
    // Writes touch one subpage at a time: a dirty unit the brick held sends the few subpages
    // written since its install, not 512.
    assert!(
        sent < dirty * SUB as u64 / 8,
        "{sent} subpages sent for {dirty} dirty units: the dirty check is not per subpage"
    );
}

#[test]
fn the_planted_stale_checks_are_caught() {
    let errors: Vec<String> = (0..60).filter_map(|seed| run_seed(seed, true).err()).collect();
    assert!(
        !errors.is_empty(),
        "the planted bug (stale install checks) went unnoticed in 60 seeds"
    );
    // Caught at a subpage: one sent though its brick holds it already, or one reading an
    // older value.
    assert!(
        errors.iter().any(|e| e.contains("subpage")),
        "the planted bug was caught, but not as a wrong read: {errors:?}"
    );
    eprintln!(
        "planted bug caught in {} of 60 seeds, first: {}",
        errors.len(),
        errors[0]
    );
}
