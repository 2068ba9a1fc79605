//! How far each eviction policy is from the best possible, on page traces shaped like the
//! benchmark programs: the faults of FIFO and refault (the policies behind
//! `rackmem run --eviction`), of a second chance that sees every hit (what tracking accesses to
//! resident pages would add), of a policy told the hot set (it never evicts a hot page while the
//! hot set fits), and of Belady's optimum (it evicts the page used furthest in the future), each
//! in front of the same local buffer.
//!
//! ```sh
//! cargo run --release -p rackmem-pager --example eviction_bounds
//! ```
//!
//! Why: userfaultfd shows the runtime misses, never hits, so a policy learns that a page is hot
//! only when it comes back after its eviction. The oracle rows say what that costs, and what is
//! out of reach of any policy that has to learn. Faults are counted one per missing page (the
//! runtime's read-ahead merges some of them into one fault on sequential traces).

use rackmem_pager::policy::{Eviction, EvictionPolicy};
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

/// A trace: the pages touched in order, the local buffer in pages, how many leading accesses
/// are set-up (their faults are not counted), and the hot pages if the trace has a hot set.
struct Trace {
    name: String,
    pages: Vec<u32>,
    budget: usize,
    setup: usize,
    hot: Option<HashSet<u32>>,
    /// Accesses to cold pages after the set-up (the skewed program's `cold_updates`).
    cold: u64,
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// `bench/skewed.c` with its defaults but `updates`: 1 GiB written once, then updates, four in
/// five to every fifth page, the rest spread over the other pages; a quarter local.
fn skewed(updates: u64) -> Trace {
    let pages = 262_144u64;
    let (hot, cold_pages) = (pages / 5, pages - pages / 5);
    let mut t: Vec<u32> = (0..pages as u32).collect();
    let mut s = 1u64;
    let mut cold = 0;
    for _ in 0..updates {
        let r = xorshift(&mut s);
        let page = if r % 100 < 80 {
            5 * (xorshift(&mut s) % hot)
        } else {
            cold += 1;
            let c = xorshift(&mut s) % cold_pages;
            let p = 5 * (c / 4) + 1 + c % 4;
            if p >= pages {
                pages - 1 - (p - pages) % 4
            } else {
                p
            }
        };
        t.push(page as u32);
    }
    Trace {
        name: format!("skewed, {} k updates", updates / 1000),
        pages: t,
        budget: pages as usize / 4,
        setup: pages as usize,
        hot: Some((0..hot as u32).map(|h| 5 * h).collect()),
        cold,
    }
}

fn others() -> Vec<Trace> {
    let (n, budget) = (65_536u32, 16_384usize);
    let plain = |name: &str, pages: Vec<u32>| Trace {
        name: name.into(),
        pages,
        budget,
        setup: 0,
        hot: None,
        cold: 0,
    };
    let mut s = 7u64;
    let uniform = (0..400_000).map(|_| (xorshift(&mut s) % u64::from(n)) as u32).collect();
    let loop_len = budget as u32 * 6 / 5;
    // Random reads over slightly more than the buffer holds, half of them to a hot twentieth:
    // what no online order improves on much, as which cold page comes next is random.
    let (w, b) = (20_000u64, 18_700usize);
    let mut s2 = 11u64;
    let bfs = (0..2_000_000)
        .map(|_| {
            let r = xorshift(&mut s2);
            (if r % 2 == 0 {
                (r >> 8) % (w / 20)
            } else {
                w / 20 + (r >> 8) % (w - w / 20)
            }) as u32
        })
        .collect();
    vec![
        Trace {
            name: "random over 1.07 × the buffer, half to a hot twentieth".into(),
            pages: bfs,
            budget: b,
            setup: 0,
            hot: None,
            cold: 0,
        },
        plain("scan of 4 × the buffer, 3 passes", (0..3).flat_map(|_| 0..n).collect()),
        plain(
            "loop over 1.2 × the buffer, 5 passes",
            (0..5).flat_map(|_| 0..loop_len).collect(),
        ),
        plain("uniform over 4 × the buffer", uniform),
    ]
}

/// Faults after the set-up with `policy`, evicting in batches as the runtime does.
fn with_policy(t: &Trace, mut policy: Box<dyn EvictionPolicy>) -> u64 {
    let mut resident = HashSet::new();
    policy.set_capacity(t.budget);
    let batch = (t.budget / 16).clamp(1, 32);
    let mut faults = 0;
    let mut out = Vec::new();
    for (i, &p) in t.pages.iter().enumerate() {
        if resident.contains(&p) {
            continue;
        }
        faults += u64::from(i >= t.setup);
        if resident.len() >= t.budget {
            out.clear();
            policy.victims(batch, &mut out);
            for v in &out {
                resident.remove(v);
            }
        }
        resident.insert(p);
        policy.inserted(p);
    }
    faults
}

/// Faults of a policy told the hot set: hot pages faulted from access `from` on stay (they
/// fit), the others share what is left first in, first out. From 0, it knew before the set-up;
/// from the set-up's end, it tells a hot page at its first update, as a policy that could see
/// hits would at the second.
fn hot_set_oracle(t: &Trace, hot: &HashSet<u32>, from: usize) -> u64 {
    let mut resident = HashSet::new();
    let mut fifo = VecDeque::new();
    let mut faults = 0;
    for (i, &p) in t.pages.iter().enumerate() {
        if !resident.insert(p) {
            continue;
        }
        faults += u64::from(i >= t.setup);
        if i < from || !hot.contains(&p) {
            fifo.push_back(p);
        }
        if resident.len() > t.budget {
            // Skip pages that were pinned since they were queued (hot, faulted again).
            while let Some(v) = fifo.pop_front() {
                if resident.remove(&v) {
                    break;
                }
            }
        }
    }
    faults
}

/// Faults of a second chance that sees every hit (what tracking accesses to resident pages,
/// e.g. writes through userfaultfd's asynchronous write protection, would give): new pages enter
/// probation; a probation victim that was used since it came in moves to protected instead (as
/// refault's protected, all but an eighth of the budget), whose oldest unused page makes room.
fn second_chance_with_hits(t: &Trace) -> u64 {
    // Per resident page: (in protected, used since its last check).
    let mut state: HashMap<u32, (bool, bool)> = HashMap::new();
    let (mut probation, mut protected) = (VecDeque::new(), VecDeque::new());
    let target = t.budget - t.budget.div_ceil(8);
    let batch = (t.budget / 16).clamp(1, 32);
    let mut faults = 0;
    for (i, &p) in t.pages.iter().enumerate() {
        if let Some(e) = state.get_mut(&p) {
            e.1 = true;
            continue;
        }
        faults += u64::from(i >= t.setup);
        let mut evicted = 0;
        while state.len() >= t.budget && evicted < batch {
            let Some((from_protected, v)) = probation
                .pop_front()
                .map(|v| (false, v))
                .or_else(|| protected.pop_front().map(|v| (true, v)))
            else {
                break;
            };
            let Some(e) = state.get_mut(&v) else { continue };
            if !e.1 {
                state.remove(&v);
                evicted += 1;
                continue;
            }
            // Used: a second chance, in protected.
            *e = (true, false);
            protected.push_back(v);
            if !from_protected && protected.len() > target {
                // Protected's oldest unused page goes back to probation (used ones go round).
                for _ in 0..protected.len() {
                    let Some(h) = protected.pop_front() else { break };
                    match state.get_mut(&h) {
                        Some(he) if he.1 => {
                            he.1 = false;
                            protected.push_back(h);
                        }
                        Some(he) => {
                            he.0 = false;
                            probation.push_back(h);
                            break;
                        }
                        None => {}
                    }
                }
            }
        }
        state.insert(p, (false, false));
        probation.push_back(p);
    }
    faults
}

/// Belady's optimum: on a miss with a full buffer, evict the page next used furthest ahead.
fn optimum(t: &Trace) -> u64 {
    let n = t.pages.len();
    let mut next_use = vec![usize::MAX; n];
    let mut seen: HashMap<u32, usize> = HashMap::new();
    for i in (0..n).rev() {
        next_use[i] = seen.insert(t.pages[i], i).unwrap_or(usize::MAX);
    }
    let mut resident: HashMap<u32, usize> = HashMap::new();
    let mut by_next: BTreeSet<(usize, u32)> = BTreeSet::new();
    let mut faults = 0;
    for (i, &p) in t.pages.iter().enumerate() {
        if let Some(old) = resident.remove(&p) {
            by_next.remove(&(old, p));
        } else {
            faults += u64::from(i >= t.setup);
            if by_next.len() >= t.budget {
                if let Some((far, v)) = by_next.pop_last() {
                    resident.remove(&v);
                    debug_assert!(far >= i);
                }
            }
        }
        resident.insert(p, next_use[i]);
        by_next.insert((next_use[i], p));
    }
    faults
}

fn main() {
    println!(
        "| trace | FIFO | refault | seeing every hit | told each hot page at its first update | told the hot set before the set-up | optimum |"
    );
    println!("|---|---|---|---|---|---|---|");
    for t in [skewed(400_000), skewed(1_600_000)].into_iter().chain(others()) {
        let fifo = with_policy(&t, Eviction::Fifo.build());
        let refault = with_policy(&t, Eviction::Refault.build());
        let hits = second_chance_with_hits(&t);
        let told_late = t.hot.as_ref().map(|h| hot_set_oracle(&t, h, t.setup));
        let told = t.hot.as_ref().map(|h| hot_set_oracle(&t, h, 0));
        let best = optimum(&t);
        // The skewed rows say faults per cold update, as `docs/benchmarks.md` does; the others
        // faults, and × the optimum.
        let cell = |f: u64| {
            if t.cold > 0 {
                format!("{:.2}", f as f64 / t.cold as f64)
            } else {
                format!("{f} ({:.2} ×)", f as f64 / best as f64)
            }
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            t.name,
            cell(fifo),
            cell(refault),
            cell(hits),
            told_late.map_or("".into(), cell),
            told.map_or("".into(), cell),
            cell(best)
        );
    }
}
