//! The brick and the transport are built on `rackmem-sys` alone: neither may depend on
//! `rackmem-uffd`, directly or through another crate. A brick serves memory and a link carries
//! it; neither resolves page faults, and a brick host need not allow userfaultfd at all.
//!
//! Reads the resolved dependency graph from `cargo metadata` and walks the normal dependencies
//! (not dev- or build-dependencies) of each crate.

use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::process::Command;

/// The package whose presence fails the test.
const FORBIDDEN: &str = "rackmem-uffd";

/// The resolved graph: package id → (package name, ids of its normal dependencies).
fn normal_graph() -> HashMap<String, (String, Vec<String>)> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--manifest-path"])
        .arg(&manifest)
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let names: HashMap<&str, &str> = meta["packages"]
        .as_array()
        .expect("a packages array")
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p["name"].as_str()?)))
        .collect();
    meta["resolve"]["nodes"]
        .as_array()
        .expect("a resolve graph")
        .iter()
        .map(|node| {
            let id = node["id"].as_str().expect("a node id").to_string();
            let deps = node["deps"]
                .as_array()
                .expect("a deps array")
                .iter()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .is_some_and(|kinds| kinds.iter().any(|k| k["kind"].is_null()))
                })
                .filter_map(|d| d["pkg"].as_str().map(str::to_string))
                .collect();
            let name = names.get(id.as_str()).copied().unwrap_or("?").to_string();
            (id, (name, deps))
        })
        .collect()
}

/// The chain of package names from `root` to the first package named `target` among its
/// normal dependencies (breadth first: a shortest chain), if any.
fn path_to(graph: &HashMap<String, (String, Vec<String>)>, root: &str, target: &str) -> Option<Vec<String>> {
    let start = graph
        .iter()
        .find(|(_, (name, _))| name == root)
        .map(|(id, _)| id.clone())
        .unwrap_or_else(|| panic!("{root} is not in the workspace's dependency graph"));
    let mut came_from: HashMap<String, String> = HashMap::new();
    let mut queue = VecDeque::from([start.clone()]);
    while let Some(id) = queue.pop_front() {
        let (name, deps) = &graph[&id];
        if name == target {
            let mut chain = vec![name.clone()];
            let mut at = id;
            while let Some(prev) = came_from.get(&at) {
                chain.push(graph[prev].0.clone());
                at = prev.clone();
            }
            chain.reverse();
            return Some(chain);
        }
        for d in deps {
            if *d != start && !came_from.contains_key(d) {
                came_from.insert(d.clone(), id.clone());
                queue.push_back(d.clone());
            }
        }
    }
    None
}

#[test]
fn brick_and_transport_do_not_depend_on_userfaultfd() {
    let graph = normal_graph();
    for root in ["rackmem-brick", "rackmem-transport"] {
        if let Some(chain) = path_to(&graph, root, FORBIDDEN) {
            panic!(
                "{root} depends on {FORBIDDEN}: {}. Take what it needs from rackmem-sys instead.",
                chain.join(" -> ")
            );
        }
        assert!(
            path_to(&graph, root, "rackmem-sys").is_some(),
            "{root} no longer depends on rackmem-sys: is this test still looking at the right graph?"
        );
    }
}
