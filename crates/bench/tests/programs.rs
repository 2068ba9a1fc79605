//! The C programs of `bench apps` on toy inputs: the Kronecker generator of `bfs` is
//! deterministic and skewed as Graph500's should be, its BFS trees validate, and `kmeans`
//! converges to the centers the points were drawn around.

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
