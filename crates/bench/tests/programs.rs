//! The C programs of `bench apps` on toy inputs: the Kronecker generator of `bfs` is
//! deterministic and skewed as Graph500's should be, its BFS trees validate, and `kmeans`
//! converges to the centers the points were drawn around; `qsort` sorts, and `updates` leaves
//! the same array whatever its thread count, both with the checksums computed here independently.

use rackmem_bench::programs::{build, num, run};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn program(name: &str) -> PathBuf {
    let out = std::env::temp_dir().join(format!("rackmem-bench-programs-{}", std::process::id()));
    std::fs::create_dir_all(&out).expect("scratch directory");
    let bench = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench");
    build(&bench, name, &out).unwrap_or_else(|e| panic!("building bench/{name}.c (needs gcc): {e}"))
}

fn result(prog: &Path, args: &[&str]) -> BTreeMap<String, String> {
    let mut c = Command::new(prog);
    c.args(args);
    run(c).unwrap_or_else(|e| panic!("{}: {e}", prog.display()))
}

#[test]
fn kronecker_graph_is_deterministic_and_skewed() {
    let bfs = program("bfs");
    let a = result(&bfs, &["12", "16", "3", "7"]);
    let b = result(&bfs, &["12", "16", "3", "7"]);
    assert_eq!(a.get("edge_checksum"), b.get("edge_checksum"), "same seed, same graph");
    assert_eq!(a.get("checksum"), b.get("checksum"), "same graph, same BFS trees");
    let other = result(&bfs, &["12", "16", "3", "8"]);
    assert_ne!(
        a.get("edge_checksum"),
        other.get("edge_checksum"),
        "another seed, another graph"
    );
    for r in [&a, &other] {
        assert_eq!(
            r.get("valid").map(String::as_str),
            Some("1"),
            "BFS tree validates: {r:?}"
        );
        assert_eq!(num(r, "vertices"), 4096.0);
        assert_eq!(num(r, "edges"), 65536.0);
    }
    // Each edge adds two to the degree sum unless it is a self-loop (dropped): the mean degree
    // is just under twice the edge factor.
    let mean = num(&a, "mean_degree");
    assert!((30.0..=32.0).contains(&mean), "mean degree {mean}");
    // Graph500's A, B, C = 0.57, 0.19, 0.19 make a few hubs and many isolated vertices; with all
    // four quadrants equally likely (an Erdős–Rényi-like graph) degrees stay near the mean.
    let skew = num(&a, "max_degree") / mean;
    assert!(skew > 20.0, "max/mean degree {skew} with Graph500's parameters");
    assert!(num(&a, "isolated") > 0.1 * 4096.0, "isolated vertices: {a:?}");
    let flat = result(&bfs, &["12", "16", "3", "7", "0.25", "0.25", "0.25"]);
    let flat_skew = num(&flat, "max_degree") / num(&flat, "mean_degree");
    assert!(flat_skew < 3.0, "max/mean degree {flat_skew} with uniform quadrants");
    assert_eq!(num(&flat, "isolated"), 0.0, "{flat:?}");
    assert!(num(&a, "teps") > 0.0);
}

#[test]
fn kmeans_converges_on_separated_blobs() {
    let km = program("kmeans");
    let a = result(&km, &["20000", "2", "4", "20", "3"]);
    let conv = num(&a, "converged_at");
    assert!((1.0..20.0).contains(&conv), "converged within the iterations: {a:?}");
    // Points lie within ±10 of their center in each dimension: the means land well within 1.
    let err = num(&a, "center_error");
    assert!(err < 1.0, "largest distance from a true center to a found one: {err}");
    let b = result(&km, &["20000", "2", "4", "20", "3"]);
    assert_eq!(a.get("checksum"), b.get("checksum"), "deterministic");
    let c = result(&km, &["20000", "2", "4", "20", "4"]);
    assert_ne!(a.get("checksum"), c.get("checksum"), "another seed, other points");
}

/// FNV-1a over 64-bit words, as the C programs print it.
fn fnv(words: &[u64]) -> String {
    let h = words
        .iter()
        .fold(1469598103934665603u64, |h, w| (h ^ w).wrapping_mul(1099511628211));
    format!("{h:016x}")
}

#[test]
fn qsort_sorts_the_generated_keys() {
    let prog = program("qsort");
    let r = result(&prog, &["100000", "5"]);
    assert_eq!(r.get("sorted").map(String::as_str), Some("1"), "{r:?}");
    let mut s = 5u64;
    let mut keys: Vec<u64> = (0..100_000)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        })
        .collect();
    keys.sort_unstable();
    assert_eq!(r.get("checksum"), Some(&fnv(&keys)), "{r:?}");
    assert!(num(&r, "elements_per_s") > 0.0, "{r:?}");
}

#[test]
fn updates_end_the_same_for_one_two_and_all_threads() {
    let prog = program("updates");
    let splitmix = |mut x: u64| {
        x = x.wrapping_add(0x9e3779b97f4a7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d049bb133111eb);
        x ^ (x >> 31)
    };
    let words = (4u64 << 20) / 8;
    let mut t: Vec<u64> = (0..words).collect();
    for k in 0..300_000u64 {
        let x = splitmix(3 + k);
        t[(x % words) as usize] ^= x;
    }
    let expect = fnv(&t);
    for threads in ["1", "2", "0", "3"] {
        let r = result(&prog, &["4", "300000", threads, "3"]);
        assert_eq!(r.get("checksum"), Some(&expect), "{threads} threads: {r:?}");
        if threads != "0" {
            assert_eq!(r.get("threads").map(String::as_str), Some(threads), "{r:?}");
        }
    }
}
