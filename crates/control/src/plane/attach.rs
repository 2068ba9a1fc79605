//! What bricks and nodes share when they register: an id kept across re-registrations, ports
//! whose links are named after their owner, switches stored the first time a port names them,
//! and the check that a re-registration keeps the links live segments cross.

use super::{ControlPlane, PlaneError};
use crate::api::{Endpoint, Port};
use crate::graph::port_link_id;
use crate::store::{Counters, Op, Record, SwitchRecord};
use std::collections::HashSet;

/// The id a registration keeps (`existing`, the one its name has), or the next one of a counter
/// (ids start at 1), which the counter then passes.
pub(super) fn id_for(existing: Option<u64>, next: &mut u64) -> u64 {
    match existing {
        Some(id) => id,
        None => next_id(next),
    }
}

/// The next id of a counter (ids start at 1); the counter passes it.
pub(super) fn next_id(next: &mut u64) -> u64 {
    *next = (*next).max(1);
    let id = *next;
    *next += 1;
    id
}

/// Names the link of each of `owner`'s ports after the owner and the port.
pub(super) fn name_links(owner: &Endpoint, ports: &mut [Port]) {
    for p in ports {
        p.link = port_link_id(owner, &p.name);
    }
}

impl ControlPlane {
    /// Writes a registration's `record` as one batch with the switches its `ports` name for the
    /// first time and, if they moved, the `counters`; then attaches `owner`'s ports to the graph
    /// in place of its `old_ports`.
    pub(super) fn commit_registration(
        &mut self,
        owner: &Endpoint,
        record: Record,
        counters: Counters,
        old_ports: &[Port],
        ports: &mut [Port],
    ) -> Result<(), PlaneError> {
        let mut ops = self.switch_ops(ports);
        ops.push(Op::Put(record));
        if counters != self.counters {
            ops.push(Op::Put(Record::Counters(counters)));
        }
        self.store.commit(&ops)?;
        self.counters = counters;
        self.note_switches(ports);
        self.graph.attach(owner, old_ports, ports);
        Ok(())
    }

    fn switch_ops(&self, ports: &[Port]) -> Vec<Op> {
        let mut ops = Vec::new();
        let mut seen = HashSet::new();
        for p in ports {
            if !self.stored_switches.contains(&p.switch) && seen.insert(p.switch.clone()) {
                ops.push(Op::Put(Record::Switch(SwitchRecord { name: p.switch.clone() })));
            }
        }
        ops
    }

    fn note_switches(&mut self, ports: &[Port]) {
        for p in ports {
            self.graph.add_switch(&p.switch);
            self.stored_switches.insert(p.switch.clone());
        }
    }

    /// Links of `owner` that live segments cross.
    fn used_links(&self, owner: &Endpoint) -> HashSet<String> {
        let mut used = HashSet::new();
        let prefix = port_link_id(owner, "");
        for a in self.allocations.values() {
            for s in &a.segments {
                for l in &s.links {
                    if l.starts_with(&prefix) {
                        used.insert(l.clone());
                    }
                }
            }
        }
        used
    }

    /// Checks that a re-registration keeps every port that live segments use, on its switch.
    pub(super) fn check_kept_ports(&self, owner: &Endpoint, what: &str, new: &[Port]) -> Result<(), PlaneError> {
        for link in self.used_links(owner) {
            let kept = new.iter().any(|p| p.link == link);
            if !kept {
                return Err(PlaneError::Conflict(format!(
                    "{what} re-registers without link {link}, which live segments use (or moves it to another \
                     switch); delete those allocations first"
                )));
            }
        }
        // A kept link must stay on the same switch.
        for p in new {
            if let Some(l) = self.graph.link(&p.link) {
                if l.b != (Endpoint::Switch { name: p.switch.clone() })
                    && l.reserved_segments + l.unreserved_segments > 0
                {
                    return Err(PlaneError::Conflict(format!(
                        "{what} moves port {} to switch {} while live segments use it",
                        p.name, p.switch
                    )));
                }
            }
        }
        Ok(())
    }
}
