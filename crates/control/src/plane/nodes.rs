//! Nodes: registration, the node views of the REST API, and the rate limit of each segment a
//! node's agent enforces.

use super::attach::{id_for, name_links};
use super::{ControlPlane, NodeEntry, NodeQuota, PlaneError};
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
        let mut quota_bytes = None;
        if let Some(n) = existing.and_then(|id| self.nodes.get(&id)) {
            self.check_kept_ports(&owner, &format!("node {}", reg.name), &ports)?;
            old_ports = n.rec.ports.clone();
            // A re-registration (an agent restarting) keeps what an admin set.
            quota_bytes = n.rec.quota_bytes;
        }
        let rec = NodeRecord {
            id,
            name: reg.name.clone(),
            ports: ports.clone(),
            quota_bytes,
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
            allocated_bytes: self.held_bytes(n),
            quota_bytes: self.quota_of(n),
            quota_set: n.rec.quota_bytes.is_some(),
            pool_bytes: self.pool_bytes(n, None),
            pool_attached_bytes: self.pool_bytes(n, Some(|r: &api::PoolReport, id| r.attached.contains(&id))),
            pool_in_use_bytes: self.pool_bytes(n, Some(|r: &api::PoolReport, id| r.in_use.contains(&id))),
        }
    }

    /// Bytes of `n`'s pool allocations (no holder); with `listed`, only those its agent's last
    /// report lists (none before its first report).
    fn pool_bytes(&self, n: &NodeEntry, listed: Option<fn(&api::PoolReport, u64) -> bool>) -> u64 {
        let report = self.pools.get(&n.rec.id);
        n.allocations
            .iter()
            .filter_map(|a| self.allocations.get(a))
            .filter(|a| a.holder.is_none() && a.named.is_none())
            .filter(|a| listed.is_none_or(|l| report.is_some_and(|r| l(r, a.id))))
            .flat_map(|a| a.segments.iter().map(|s| s.size_bytes))
            .sum()
    }

    /// `PUT /v1/nodes/{id}/pool`: the agent's report of its node's pool; the reply lists the
    /// pool allocations to release once unused.
    pub fn report_pool(&mut self, node: u64, report: api::PoolReport) -> Result<api::PoolReply, PlaneError> {
        let n = self
            .nodes
            .get(&node)
            .ok_or_else(|| PlaneError::NotFound(format!("node {node} is not registered")))?;
        let release = self
            .deferred
            .iter()
            .copied()
            .filter(|a| n.allocations.contains(a))
            .collect();
        self.pools.insert(node, report);
        self.rebalance_tick();
        let mut evacuate = self.evacuations(node);
        let listed: std::collections::HashSet<u64> = evacuate.iter().map(|e| e.allocation).collect();
        evacuate.extend(self.rebalance_evacuations(node, &listed));
        Ok(api::PoolReply { release, evacuate })
    }

    /// `DELETE /v1/allocations/{id}`: releases the allocation, unless it is in its node's pool
    /// and a process uses it (as the agent last reported): then it is marked, the agent
    /// releases it once no process does, and the reply says `deferred`.
    pub fn free_or_defer(&mut self, id: u64) -> Result<api::Released, PlaneError> {
        let a = self
            .allocations
            .get(&id)
            .ok_or_else(|| PlaneError::NotFound(format!("allocation {id} does not exist")))?;
        let in_use = a.holder.is_none() && self.pools.get(&a.node).is_some_and(|r| r.in_use.contains(&id));
        if in_use {
            self.deferred.insert(id);
            return Ok(api::Released {
                id,
                extents: Vec::new(),
                deferred: true,
            });
        }
        self.deferred.remove(&id);
        self.free(id)
    }

    /// Bytes in the segments of `n`'s allocations.
    fn held_bytes(&self, n: &NodeEntry) -> u64 {
        n.allocations
            .iter()
            .filter_map(|a| self.allocations.get(a))
            .flat_map(|a| a.segments.iter().map(|s| s.size_bytes))
            .sum()
    }

    /// The most `n` may hold: its own quota, else the default.
    fn quota_of(&self, n: &NodeEntry) -> u64 {
        if let Some(q) = n.rec.quota_bytes {
            return q;
        }
        match self.node_quota {
            NodeQuota::Bytes(b) => b,
            NodeQuota::PercentOfPool(p) => {
                let pool: u64 = self.bricks.values().map(|b| b.rec.capacity_bytes).sum();
                (u128::from(pool) * u128::from(p.min(100)) / 100) as u64
            }
        }
    }

    /// Refuses `more` bytes for `node` if they would take it past its quota.
    pub(super) fn check_quota(&self, node: u64, more: u64) -> Result<(), PlaneError> {
        let Some(n) = self.nodes.get(&node) else {
            return Ok(());
        };
        let (held, quota) = (self.held_bytes(n), self.quota_of(n));
        if held.saturating_add(more) > quota {
            let whose = if n.rec.quota_bytes.is_some() {
                "its own quota (rackmem ctl node-quota)".to_string()
            } else {
                format!("the default quota, {} (rackmem control --node-quota)", self.node_quota)
            };
            return Err(PlaneError::QuotaExceeded(format!(
                "node {} holds {held} bytes and may hold {quota} ({whose}): {more} more would exceed it; \
                 release some, or have an admin raise it with rackmem ctl node-quota {} SIZE",
                n.rec.name, n.rec.name
            )));
        }
        Ok(())
    }

    /// What one node may hold by default (see [`NodeQuota`]).
    pub fn set_node_quota(&mut self, q: NodeQuota) {
        self.node_quota = q;
    }

    /// `PUT /v1/nodes/{id}/quota`: sets node `id`'s own quota (`None`: back to the default).
    /// Allocations it holds beyond a lowered quota stay; new ones are refused until it is under.
    pub fn set_node_quota_of(&mut self, id: u64, quota_bytes: Option<u64>) -> Result<api::Node, PlaneError> {
        let n = self
            .nodes
            .get(&id)
            .ok_or_else(|| PlaneError::NotFound(format!("node {id} is not registered")))?;
        let rec = NodeRecord {
            quota_bytes,
            ..n.rec.clone()
        };
        self.store.commit(&[crate::store::Op::Put(Record::Node(rec.clone()))])?;
        if let Some(n) = self.nodes.get_mut(&id) {
            n.rec = rec;
        }
        self.node(id)
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
