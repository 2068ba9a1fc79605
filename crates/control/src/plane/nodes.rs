//! Nodes: registration, the node views of the REST API, and the rate limit of each segment a
//! node's agent enforces.

use super::attach::{id_for, name_links};
use super::{ControlPlane, NodeEntry, PlaneError};
use crate::api::{self, Endpoint};
use crate::graph::check_owner_name;
use crate::store::{NodeRecord, Record};

impl ControlPlane {
    /// `POST /v1/nodes`.
    pub fn register_node(&mut self, reg: api::NodeRegistration) -> Result<api::NodeRegistered, PlaneError> {
        check_owner_name("node", &reg.name)?;
        let mut ports = self.graph.resolve_ports(&reg.name, &reg.ports)?;
        let existing = self.node_names.get(&reg.name).copied();
        let mut counters = self.counters;
        let id = id_for(existing, &mut counters.next_node);
        let owner = Endpoint::Node { id };
        name_links(&owner, &mut ports);
        let mut old_ports = Vec::new();
        if let Some(n) = existing.and_then(|id| self.nodes.get(&id)) {
            self.check_kept_ports(&owner, &format!("node {}", reg.name), &ports)?;
            old_ports = n.rec.ports.clone();
        }
        let rec = NodeRecord {
            id,
            name: reg.name.clone(),
            ports: ports.clone(),
        };
        self.commit_registration(&owner, Record::Node(rec.clone()), counters, &old_ports, &mut ports)?;
        self.node_names.insert(rec.name.clone(), id);
        let allocations = self.nodes.remove(&id).map(|n| n.allocations).unwrap_or_default();
        self.nodes.insert(id, NodeEntry { rec, allocations });
        Ok(api::NodeRegistered { id })
    }

    fn node_view(&self, n: &NodeEntry) -> api::Node {
        api::Node {
            id: n.rec.id,
            name: n.rec.name.clone(),
            ports: n.rec.ports.clone(),
            allocations: n.allocations.len() as u64,
            allocated_bytes: n
                .allocations
                .iter()
                .filter_map(|a| self.allocations.get(a))
                .flat_map(|a| a.segments.iter().map(|s| s.size_bytes))
                .sum(),
        }
    }

    /// `GET /v1/nodes/{id}`.
    pub fn node(&self, id: u64) -> Result<api::Node, PlaneError> {
        self.nodes
            .get(&id)
            .map(|n| self.node_view(n))
            .ok_or_else(|| PlaneError::NotFound(format!("node {id} is not registered")))
    }

    /// `GET /v1/nodes`, by id.
    pub fn nodes(&self) -> Vec<api::Node> {
        let mut v: Vec<_> = self.nodes.values().map(|n| self.node_view(n)).collect();
        v.sort_by_key(|n| n.id);
        v
    }

    /// `GET /v1/nodes/{id}/rates`.
    pub fn rates(&self, node: u64) -> Result<api::NodeRates, PlaneError> {
        let n = self
            .nodes
            .get(&node)
            .ok_or_else(|| PlaneError::NotFound(format!("node {node} is not registered")))?;
        let mut segments = Vec::new();
        for a in n.allocations.iter().filter_map(|a| self.allocations.get(a)) {
            for s in &a.segments {
                segments.push(api::SegmentRate {
                    allocation: a.id,
                    segment_id: s.segment_id,
                    brick_id: s.brick_id,
                    link: s.links.first().cloned().unwrap_or_default(),
                    rate_limit_bps: self.graph.rate_limit(&s.links, s.bandwidth_bps),
                });
            }
        }
        Ok(api::NodeRates { node, segments })
    }

    /// The id of the node named `name`.
    pub fn node_id(&self, name: &str) -> Option<u64> {
        self.node_names.get(name).copied()
    }
}
