//! Seed 002's equations agree with each other on any trace: Eq. 1 (active time over accesses),
//! Eq. 2 (the five parameters), Eq. 9 (hits plus pure miss time) and Eq. 4 (the recursive form,
//! with the next level's C-AMAT measured as miss time over misses).

use proptest::prelude::*;
use rackmem_model::camat::{recursive, Access, Trace};

fn accesses() -> impl Strategy<Value = Vec<Access>> {
    // Times on a coarse grid so that intervals touch and coincide often (the edge cases).
    prop::collection::vec((0u32..200, 1u32..8, prop_oneof![Just(0u32), 1u32..60]), 1..120).prop_map(|v| {
        v.into_iter()
            .map(|(s, h, m)| Access {
                start: f64::from(s),
                hit: f64::from(h),
                miss: f64::from(m),
            })
            .collect()
    })
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

proptest! {
    #[test]
    fn every_form_of_camat_agrees(trace in accesses()) {
        let t = Trace::measure(&trace).unwrap();
        let eq1 = t.camat_eq1();
        prop_assert!(close(eq1, t.camat().value()), "eq1 {} eq2 {}", eq1, t.camat().value());
        prop_assert!(close(eq1, t.camat_eq9()), "eq1 {} eq9 {}", eq1, t.camat_eq9());
        let eq4 = recursive(&[t.level()], t.next_level_camat());
        prop_assert!(close(eq1, eq4), "eq1 {} eq4 {}", eq1, eq4);
    }

    #[test]
    fn parameters_stay_in_their_ranges(trace in accesses()) {
        let t = Trace::measure(&trace).unwrap();
        let c = t.camat();
        prop_assert!(c.hit_concurrency >= 1.0 - 1e-12);
        prop_assert!(t.pure_misses <= t.misses && t.misses <= t.accesses);
        prop_assert!((0.0..=1.0).contains(&t.kappa()));
        prop_assert!(t.pure_miss_time <= t.miss_time + 1e-9);
        prop_assert!(t.active_time <= t.hit_active_time + t.miss_time + 1e-9);
        if t.pure_misses > 0 {
            prop_assert!(c.pure_miss_concurrency >= 1.0 - 1e-12);
        }
        // Overlap only helps: C-AMAT is at most the sequential average access time.
        let sequential: f64 = trace.iter().map(|a| a.hit + a.miss).sum::<f64>() / trace.len() as f64;
        prop_assert!(t.camat_eq1() <= sequential + 1e-9);
    }
}
