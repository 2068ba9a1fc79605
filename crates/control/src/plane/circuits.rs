//! Circuits (seed 004, section V): an allocation that asks for one holds every port and switch
//! link of its segments' paths alone, and the switches on those paths are configured to connect
//! its ports point to point. "The required resource configuration is determined during the path
//! traversal and thus, Software-Defined memory rules are generated": [`ControlPlane::rules_of`]
//! walks a path and yields, for each switch it crosses, the rule joining the cable it enters
//! by to the cable it leaves by.
//!
//! The switches' rules are never stored: they follow from the allocations, which are. Each
//! change hands every affected switch its whole new set of rules through the [`SwitchDriver`]
//! (atomic per switch). A new circuit's rules are applied before its allocation is committed,
//! and a refused or failed update leaves nothing reserved; a release is committed first and its
//! rules removed after, a switch that could not be updated being retried every second until it
//! is (see [`ControlPlane::retry_switches`]). At start every switch is given its rules again.

use super::{now_unix_ms, ControlPlane, PlaneError};
use crate::api::{self, Endpoint, RulePort, SwitchRule};
use crate::graph::{PathQuery, PathUse};
use crate::store::{Op, Record, SegmentRecord};
use crate::switch::SwitchDriver;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Instant;

/// An allocation's circuit paths to use in place of the state's while working out rules:
/// `Some(paths)` for a circuit being made or moved, `None` for one going away.
pub(super) type Overlay<'a> = Option<(u64, Option<&'a [Vec<String>]>)>;

impl ControlPlane {
    /// Replaces the switch driver (the default is [`crate::switch::DryRun`]).
    pub fn set_switch_driver(&mut self, driver: Box<dyn SwitchDriver>) {
        self.switches = driver;
    }

    /// How a switch names the cable `link` that ends on switch `at`: `OWNER:PORT` for a node's
    /// or brick's port, `switch:OTHER` for a cable to another switch.
    fn port_label(&self, link: &str, at: &str) -> String {
        let port = link.splitn(3, ':').nth(2).unwrap_or_default();
        match self.graph.ends(link) {
            Some((Endpoint::Node { id }, _)) => {
                let name = self
                    .nodes
                    .get(id)
                    .map_or_else(|| format!("node{id}"), |n| n.rec.name.clone());
                format!("{name}:{port}")
            }
            Some((Endpoint::Brick { id }, _)) => {
                let name = self
                    .bricks
                    .get(id)
                    .map_or_else(|| format!("brick{id}"), |b| b.rec.name.clone());
                format!("{name}:{port}")
            }
            Some((Endpoint::Switch { name: a }, Endpoint::Switch { name: b })) => {
                format!("switch:{}", if a == at { b } else { a })
            }
            _ => link.to_string(),
        }
    }

    /// The rules that make `path` (node port, switch links, brick port, and perhaps the brick's
    /// memory link, which no switch sees) a circuit of `allocation`: one per switch crossed.
    pub(super) fn rules_of(&self, allocation: u64, path: &[String]) -> Vec<SwitchRule> {
        let cables: Vec<&String> = path
            .iter()
            .filter(|l| matches!(self.graph.ends(l), Some((_, Endpoint::Switch { .. }))))
            .collect();
        let mut rules = Vec::new();
        let Some((first, rest)) = cables.split_first() else {
            return rules;
        };
        let Some((_, Endpoint::Switch { name })) = self.graph.ends(first) else {
            return rules;
        };
        let (mut at, mut prev) = (name.clone(), (*first).clone());
        for link in rest {
            let Some((a, b)) = self.graph.ends(link) else { break };
            rules.push(SwitchRule {
                switch: at.clone(),
                allocation,
                a: RulePort {
                    link: prev.clone(),
                    port: self.port_label(&prev, &at),
                },
                b: RulePort {
                    link: (*link).clone(),
                    port: self.port_label(link, &at),
                },
            });
            match (a, b) {
                (Endpoint::Switch { name: x }, Endpoint::Switch { name: y }) => {
                    at = if *x == at { y.clone() } else { x.clone() };
                    prev = (*link).clone();
                }
                // The brick's port: the path ends here.
                _ => break,
            }
        }
        rules
    }

    /// The paths of every live circuit, with `overlay` applied.
    fn circuit_paths(&self, overlay: Overlay<'_>) -> Vec<(u64, Vec<String>)> {
        let mut out = Vec::new();
        for a in self.allocations.values().filter(|a| a.circuit) {
            if overlay.is_some_and(|(id, _)| id == a.id) {
                continue;
            }
            out.extend(a.segments.iter().map(|s| (a.id, s.links.clone())));
        }
        if let Some((id, Some(paths))) = overlay {
            out.extend(paths.iter().map(|p| (id, p.clone())));
        }
        out
    }

    /// Every switch's rules, with `overlay` applied (each rule once, in a stable order).
    fn rules_by_switch(&self, overlay: Overlay<'_>) -> BTreeMap<String, Vec<SwitchRule>> {
        let mut by: BTreeMap<String, BTreeSet<SwitchRule>> = BTreeMap::new();
        for (id, path) in self.circuit_paths(overlay) {
            for r in self.rules_of(id, &path) {
                by.entry(r.switch.clone()).or_default().insert(r);
            }
        }
        by.into_iter().map(|(k, v)| (k, v.into_iter().collect())).collect()
    }

    /// The switches `paths` cross.
    pub(super) fn switches_of<'a>(
        &self,
        id: u64,
        paths: impl IntoIterator<Item = &'a Vec<String>>,
    ) -> BTreeSet<String> {
        paths
            .into_iter()
            .flat_map(|p| self.rules_of(id, p))
            .map(|r| r.switch)
            .collect()
    }

    /// Hands each of `switches` its rules (with `overlay` applied); stops at the first that
    /// fails. Records what each got, when, how long it took, or why it failed.
    pub(super) fn apply_switches(
        &mut self,
        switches: &BTreeSet<String>,
        overlay: Overlay<'_>,
    ) -> Result<(), PlaneError> {
        let mut rules = self.rules_by_switch(overlay);
        for sw in switches {
            let want = rules.remove(sw).unwrap_or_default();
            let start = Instant::now();
            let r = self.switches.apply(sw, &want);
            let took = start.elapsed();
            let state = self
                .switch_states
                .entry(sw.clone())
                .or_insert_with(|| api::SwitchState {
                    switch: sw.clone(),
                    rules: Vec::new(),
                    applied_unix_ms: None,
                    apply_us: None,
                    error: None,
                });
            match r {
                Ok(()) => {
                    state.rules = want;
                    state.applied_unix_ms = Some(now_unix_ms());
                    state.apply_us = Some(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
                    state.error = None;
                    self.dirty_switches.remove(sw);
                }
                Err(e) => {
                    state.error = Some(e.to_string());
                    return Err(PlaneError::Switch(e.to_string()));
                }
            }
        }
        Ok(())
    }

    /// Hands each of `switches` the rules of the state as it is, and marks those that fail
    /// for [`ControlPlane::retry_switches`]: after a release (committed already), or to put
    /// switches back after a refused change.
    pub(super) fn sync_switches(&mut self, switches: &BTreeSet<String>) {
        for sw in switches {
            let one = BTreeSet::from([sw.clone()]);
            if let Err(e) = self.apply_switches(&one, None) {
                tracing::warn!(switch = %sw, "{e}; retrying every second");
                self.dirty_switches.insert(sw.clone());
            }
        }
    }

    /// Gives every switch its rules again: those circuits cross, those the driver knows, those
    /// configured before (at start, and after a reload of the state).
    pub fn resync_switches(&mut self) {
        let mut all: BTreeSet<String> = self.rules_by_switch(None).into_keys().collect();
        all.extend(self.switches.known_switches());
        all.extend(self.switch_states.keys().cloned());
        self.sync_switches(&all);
    }

    /// Retries the switches an update failed on; returns how many still fail.
    pub fn retry_switches(&mut self) -> usize {
        if self.dirty_switches.is_empty() {
            return 0;
        }
        let dirty = std::mem::take(&mut self.dirty_switches);
        self.sync_switches(&dirty);
        self.dirty_switches.len()
    }

    /// `GET /v1/circuits`.
    pub fn circuits(&self) -> api::Circuits {
        let circuits = self
            .allocations
            .values()
            .filter(|a| a.circuit)
            .map(|a| {
                let mut links = BTreeSet::new();
                let mut rules = BTreeSet::new();
                for s in &a.segments {
                    links.extend(self.graph.held(&s.links).into_iter().map(|(l, _)| l));
                    rules.extend(self.rules_of(a.id, &s.links));
                }
                api::Circuit {
                    allocation: a.id,
                    node: a.node,
                    links: links.into_iter().collect(),
                    rules: rules.into_iter().collect(),
                }
            })
            .collect();
        api::Circuits {
            driver: self.switches.describe(),
            circuits,
            switches: self.switch_states.values().cloned().collect(),
        }
    }

    /// Why no path reached a brick, when circuits stand in the way: the links of a path that
    /// exists if circuits are ignored, and the allocations holding them.
    pub(super) fn held_by_circuits(
        &self,
        node_ports: &[api::Port],
        brick_ports: &[api::Port],
        bandwidth_bps: u64,
        allowed: Option<&HashSet<String>>,
    ) -> String {
        let q = PathQuery {
            bandwidth_bps,
            allowed,
            avoid: None,
            usage: PathUse::Any,
        };
        let held = self
            .graph
            .find_path_with(node_ports, brick_ports, &q)
            .map(|p| self.graph.held(&p))
            .unwrap_or_default();
        if held.is_empty() {
            return String::new();
        }
        let list: Vec<String> = held
            .iter()
            .map(|(l, a)| format!("{l} (circuit of allocation {a})"))
            .collect();
        format!("; links held by circuits stand in the way: {}", list.join(", "))
    }

    /// `POST /v1/circuits/{id}/move`: new paths for every segment of circuit `id` (same brick,
    /// same segment, same grant), on links no other segment uses and none of `avoid`; the
    /// switches are given their new rules in one update each, then the allocation is stored.
    pub fn move_circuit(&mut self, id: u64, avoid: &[String]) -> Result<api::Circuit, PlaneError> {
        let rec = self
            .allocations
            .get(&id)
            .cloned()
            .ok_or_else(|| PlaneError::NotFound(format!("allocation {id} does not exist")))?;
        if !rec.circuit {
            return Err(PlaneError::Invalid(format!(
                "allocation {id} is not a circuit (allocate with circuit: true)"
            )));
        }
        let node_ports = self
            .nodes
            .get(&rec.node)
            .map(|n| n.rec.ports.clone())
            .ok_or_else(|| PlaneError::NotFound(format!("node {} is not registered", rec.node)))?;
        let avoid: HashSet<String> = avoid.iter().cloned().collect();
        for s in &rec.segments {
            self.graph.release(&s.links, s.bandwidth_bps);
        }
        let allowed: Option<HashSet<String>> = rec.links.as_ref().map(|l| l.iter().cloned().collect());
        let mut moved: Vec<SegmentRecord> = Vec::with_capacity(rec.segments.len());
        let mut failure = None;
        for s in &rec.segments {
            // Segments on one brick share its path, as when they were placed.
            if let Some(same) = moved.iter().find(|m| m.brick_id == s.brick_id) {
                let links = same.links.clone();
                self.graph.reserve(&links, s.bandwidth_bps);
                moved.push(SegmentRecord { links, ..s.clone() });
                continue;
            }
            let brick_ports = self
                .bricks
                .get(&s.brick_id)
                .map(|b| b.rec.ports.clone())
                .unwrap_or_default();
            let q = PathQuery {
                bandwidth_bps: s.bandwidth_bps,
                allowed: allowed.as_ref(),
                avoid: Some(&avoid),
                usage: PathUse::Circuit,
            };
            let Some(mut path) = self.graph.find_path_with(&node_ports, &brick_ports, &q) else {
                failure = Some(PlaneError::InsufficientBandwidth(format!(
                    "no other path from node {} to brick {} whose ports and switch links no other segment uses{}",
                    rec.node,
                    s.brick_id,
                    if avoid.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " and that avoids {}",
                            avoid.iter().cloned().collect::<Vec<_>>().join(", ")
                        )
                    }
                )));
                break;
            };
            if let Some(m) = self.graph.memory_link(s.brick_id) {
                path.push(m);
            }
            self.graph.reserve(&path, s.bandwidth_bps);
            self.graph.claim(&path, id);
            moved.push(SegmentRecord {
                links: path,
                ..s.clone()
            });
        }
        let restore = |p: &mut ControlPlane, moved: &[SegmentRecord]| {
            for m in moved {
                p.graph.release(&m.links, m.bandwidth_bps);
            }
            for s in &rec.segments {
                p.graph.reserve(&s.links, s.bandwidth_bps);
                p.graph.claim(&s.links, id);
            }
        };
        if let Some(e) = failure {
            restore(self, &moved);
            return Err(e);
        }
        let paths: Vec<Vec<String>> = moved.iter().map(|m| m.links.clone()).collect();
        let mut touched = self.switches_of(id, rec.segments.iter().map(|s| &s.links));
        touched.extend(self.switches_of(id, &paths));
        let start = Instant::now();
        if let Err(e) = self.apply_switches(&touched, Some((id, Some(&paths)))) {
            restore(self, &moved);
            self.sync_switches(&touched);
            return Err(e);
        }
        let mut new = rec.clone();
        new.segments = moved;
        if let Err(e) = self.store.commit(&[Op::Put(Record::Allocation(new.clone()))]) {
            restore(self, &new.segments);
            self.sync_switches(&touched);
            return Err(e.into());
        }
        self.circuit_setup.observe(start.elapsed().as_secs_f64());
        self.keep(new);
        self.circuits()
            .circuits
            .into_iter()
            .find(|c| c.allocation == id)
            .ok_or_else(|| PlaneError::NotFound(format!("allocation {id} does not exist")))
    }
}
