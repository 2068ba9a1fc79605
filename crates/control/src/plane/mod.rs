//! The control plane's state machine: registrations, heartbeats, allocations, and the views the
//! REST API shows. No I/O but the store.
//!
//! Every change is planned on the in-memory state with an undo log, written to the store as one
//! batch, and undone if anything (placement or the store) fails, so a failed request leaves
//! nothing reserved. Callers serialize access (the server holds it in a mutex).
//!
//! This file holds the state ([`ControlPlane`]), its loading from the store and the summaries
//! over all of it; each request's part lives with its resource:
//!
//! - `bricks`: registration, heartbeats, liveness and forgetting of bricks;
//! - `nodes`: registration of nodes and their segments' rate limits;
//! - `attach`: the ports, links and switches both bricks and nodes attach to the graph with;
//! - `allocations`: allocating, resizing, releasing and showing allocations;
//! - `placement`: the one path that carves segments on bricks and reserves their links for a
//!   new or growing allocation, and gives them back;
//! - `circuits`: ports and switch links held by one allocation, and the switch rules that
//!   connect them;
//! - `leases`: how long grants are good for, and renewing them;
//! - `named`: named segments that processes on several nodes open and close by name;
//! - `moves`: moving a named segment off a draining brick through the bricks' heartbeats;
//! - `tokens`: the API tokens kept in the store.

mod allocations;
mod attach;
mod bricks;
mod circuits;
mod drain;
mod leases;
mod moves;
mod named;
mod nodes;
mod placement;
mod rebalance;
mod tokens;

pub use allocations::{Allocated, MAX_STRIPE};
pub use bricks::MAX_KEY_BYTES;
pub use leases::DEFAULT_GRANT_LIFETIME;
pub use moves::{MAX_NAMED_MOVES, MOVED_GRACE, NAMED_MOVE_DEADLINE};
pub use rebalance::{DEFAULT_MAX_IN_FLIGHT_BYTES, DEFAULT_TOLERANCE_POINTS, MOVE_TIMEOUT};

use crate::alloc::{BrickIndex, FreeExtents};
use crate::api::{self, Endpoint, HeartbeatStats};
use crate::auth::TokenTable;
use crate::graph::{Graph, GraphError, Topology};
use crate::store::{AllocationRecord, BrickRecord, Counters, Key, NodeRecord, Store, StoreError, TokenRecord};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Why a request is refused. Each maps to one HTTP status (see `server`).
#[derive(Debug, thiserror::Error)]
pub enum PlaneError {
    /// No such node, brick or allocation (404).
    #[error("{0}")]
    NotFound(String),
    /// The request contradicts the state (a name or address already taken differently, a
    /// re-registration that would orphan live segments) (409).
    #[error("{0}")]
    Conflict(String),
    /// The caller's role may not touch this object (403); the server's authorization.
    #[error("{0}")]
    Forbidden(String),
    /// The request can never succeed as asked (size 0, stripe 0, bad names or key) (422).
    #[error("{0}")]
    Invalid(String),
    /// Not enough free memory on up bricks now (409).
    #[error("{0}")]
    InsufficientCapacity(String),
    /// No path with the bandwidth asked for now (409).
    #[error("{0}")]
    InsufficientBandwidth(String),
    /// The node would hold more than its quota (409).
    #[error("{0}")]
    QuotaExceeded(String),
    /// The store failed; nothing was changed (503).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A switch could not be configured for a circuit; nothing was changed (502).
    #[error("{0}")]
    Switch(String),
}

impl From<GraphError> for PlaneError {
    fn from(e: GraphError) -> Self {
        PlaneError::Invalid(e.to_string())
    }
}

/// How much one node may hold at once unless an admin set its own quota
/// ([`ControlPlane::set_node_quota`]): a node token can otherwise take every free byte of the
/// rack, and every other node is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeQuota {
    /// This many bytes.
    Bytes(u64),
    /// This percentage (1 to 100) of the capacity of the registered bricks.
    PercentOfPool(u8),
}

impl Default for NodeQuota {
    /// Half the rack: a runaway node leaves the other half to the others.
    fn default() -> Self {
        NodeQuota::PercentOfPool(50)
    }
}

impl std::fmt::Display for NodeQuota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeQuota::Bytes(b) => write!(f, "{b} bytes"),
            NodeQuota::PercentOfPool(p) => write!(f, "{p}% of the bricks' capacity"),
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A registered brick: its record, its free extents and live segments, and its liveness.
struct BrickEntry {
    rec: BrickRecord,
    key: Vec<u8>,
    extents: FreeExtents,
    /// segment id → (offset, size).
    segments: BTreeMap<u64, (u64, u64)>,
    /// segment id → (its path's links, its reservation), for the rates heartbeats carry.
    paths: BTreeMap<u64, (Vec<String>, u64)>,
    up: bool,
    last_seen: Instant,
    last_heartbeat_unix_ms: Option<u64>,
    stats: Option<HeartbeatStats>,
    /// The last `bytes_served` a heartbeat reported, and when it arrived.
    served: Option<(u64, Instant)>,
    /// Bytes/s served between the last two heartbeats that reported `bytes_served`.
    load_bps: Option<u64>,
}

/// A registered node and its live allocations.
struct NodeEntry {
    rec: NodeRecord,
    allocations: BTreeSet<u64>,
}

/// One brick's rates for `/metrics`: (name, load bytes/s, connections, serve bytes/s, promised
/// bytes/s).
pub type BrickRates = (String, Option<u64>, Option<u64>, Option<u64>, u64);

/// Counts for `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct Gauges {
    /// Live allocations.
    pub allocations: u64,
    /// Live segments.
    pub segments: u64,
    /// Bricks up.
    pub bricks_up: u64,
    /// Bricks down.
    pub bricks_down: u64,
    /// Nodes.
    pub nodes: u64,
    /// Per brick: (name, capacity, free, allocated).
    pub bricks: Vec<(String, u64, u64, u64)>,
    /// Live circuits.
    pub circuits: u64,
    /// Per brick: (name, load bytes/s, connections, serve bytes/s, promised bytes/s), the
    /// first three when known.
    pub brick_rates: Vec<BrickRates>,
    /// Per node: (name, pool bytes, pool bytes in use).
    pub node_pools: Vec<(String, u64, u64)>,
    /// How long circuits took to set up (a handle on the live histogram).
    pub circuit_setup: Option<prometheus_client::metrics::histogram::Histogram>,
}

/// The control plane's state.
pub struct ControlPlane {
    store: Box<dyn Store>,
    graph: Graph,
    /// Kept to rebuild the graph on [`ControlPlane::reload`].
    topology: Option<Topology>,
    bricks: HashMap<u64, BrickEntry>,
    brick_names: HashMap<String, u64>,
    nodes: HashMap<u64, NodeEntry>,
    node_names: HashMap<String, u64>,
    allocations: BTreeMap<u64, AllocationRecord>,
    /// (node, idempotency key) → the live allocation it made (rebuilt from the records at
    /// load). Keys are scoped to the node they allocate for, which a node token can only be
    /// its own: a node reusing another node's key neither finds nor learns of its allocation.
    idempotency: HashMap<(u64, String), u64>,
    /// Name → the allocation of the named segment (rebuilt from the records at load).
    names: HashMap<String, u64>,
    counters: Counters,
    index: BrickIndex,
    stored_switches: HashSet<String>,
    brick_timeout: Duration,
    heartbeat_interval: Duration,
    /// API tokens by id (hashes only).
    tokens: BTreeMap<u64, TokenRecord>,
    /// How long a grant is good for (zero: forever).
    grant_lifetime: Duration,
    /// What one node may hold unless an admin set its own quota.
    node_quota: NodeQuota,
    /// How bricks are picked when an allocation does not say.
    placement: api::Objective,
    /// Node → its agent's last pool report (not stored: agents report every second).
    pools: HashMap<u64, api::PoolReport>,
    /// Pool allocations whose release was asked while in use (not stored: after a restart the
    /// release is asked again).
    deferred: BTreeSet<u64>,
    /// What the REST server authenticates against: refilled whenever `tokens` changes.
    token_table: Arc<TokenTable>,
    /// What configures the switches for circuits.
    switches: Box<dyn crate::switch::SwitchDriver>,
    /// What each switch was last given (not stored: every switch is given its rules at start).
    switch_states: BTreeMap<String, api::SwitchState>,
    /// Switches whose last update failed: retried by [`ControlPlane::retry_switches`].
    dirty_switches: BTreeSet<String>,
    /// How long circuits took to set up (placed, switches configured, committed).
    circuit_setup: prometheus_client::metrics::histogram::Histogram,
    /// The rebalance under way, or the last one (not stored: see `rebalance.rs`).
    rebalance: Option<rebalance::Running>,
    /// Whether a brick that joins starts a rebalance.
    rebalance_on_join: bool,
    /// Named segments moving off draining bricks (not stored: see `moves.rs`).
    moves: moves::Moves,
}

impl ControlPlane {
    /// Loads the state from `store`. Bricks count as up until `brick_timeout` passes without a
    /// heartbeat.
    pub fn open(
        mut store: Box<dyn Store>,
        topology: Option<Topology>,
        brick_timeout: Duration,
        heartbeat_interval: Duration,
    ) -> Result<ControlPlane, PlaneError> {
        let snap = store.load()?;
        let mut p = ControlPlane::from_snapshot(snap, &store.describe(), topology, brick_timeout, heartbeat_interval)?;
        p.store = store;
        Ok(p)
    }

    /// Replaces the in-memory state with the store's (a replica that became leader, or one
    /// whose last commit has an unknown outcome). Bricks known here keep their liveness; the
    /// others count as up until their heartbeat timeout. On error nothing changes.
    pub fn reload(&mut self) -> Result<(), PlaneError> {
        let snap = self.store.load()?;
        let mut fresh = ControlPlane::from_snapshot(
            snap,
            &self.store.describe(),
            self.topology.clone(),
            self.brick_timeout,
            self.heartbeat_interval,
        )?;
        for (id, b) in &mut fresh.bricks {
            if let Some(old) = self.bricks.get(id) {
                b.up = old.up;
                b.last_seen = old.last_seen;
                b.last_heartbeat_unix_ms = old.last_heartbeat_unix_ms;
                b.stats = old.stats.clone();
                b.served = old.served;
                b.load_bps = old.load_bps;
                if !b.up {
                    fresh.index.remove(*id, b.extents.largest());
                }
            }
        }
        std::mem::swap(&mut fresh.store, &mut self.store);
        fresh.token_table = self.token_table.clone();
        fresh.grant_lifetime = self.grant_lifetime;
        fresh.node_quota = self.node_quota;
        fresh.placement = self.placement;
        fresh.pools = std::mem::take(&mut self.pools);
        fresh.deferred = std::mem::take(&mut self.deferred);
        std::mem::swap(&mut fresh.switches, &mut self.switches);
        fresh.switch_states = std::mem::take(&mut self.switch_states);
        fresh.circuit_setup = self.circuit_setup.clone();
        fresh.rebalance = self.rebalance.take();
        fresh.rebalance_on_join = self.rebalance_on_join;
        *self = fresh;
        self.publish_tokens();
        // Another replica may have made or released circuits meanwhile.
        self.resync_switches();
        Ok(())
    }

    /// The state of `snap`, over a placeholder store.
    fn from_snapshot(
        snap: crate::store::Snapshot,
        describe: &str,
        topology: Option<Topology>,
        brick_timeout: Duration,
        heartbeat_interval: Duration,
    ) -> Result<ControlPlane, PlaneError> {
        let corrupt = |key: String, message: String| {
            PlaneError::Store(StoreError::Corrupt {
                store: describe.to_string(),
                key,
                message,
            })
        };
        let mut p = ControlPlane {
            store: Box::new(crate::store::MemoryStore::default()),
            graph: Graph::new(topology.clone()),
            topology,
            bricks: HashMap::new(),
            brick_names: HashMap::new(),
            nodes: HashMap::new(),
            node_names: HashMap::new(),
            allocations: BTreeMap::new(),
            idempotency: HashMap::new(),
            names: HashMap::new(),
            counters: snap.counters,
            index: BrickIndex::default(),
            stored_switches: HashSet::new(),
            brick_timeout,
            heartbeat_interval,
            tokens: snap.tokens.into_iter().map(|t| (t.id, t)).collect(),
            grant_lifetime: DEFAULT_GRANT_LIFETIME,
            node_quota: NodeQuota::default(),
            placement: api::Objective::default(),
            pools: HashMap::new(),
            deferred: BTreeSet::new(),
            token_table: Arc::new(TokenTable::default()),
            switches: Box::new(crate::switch::DryRun::default()),
            switch_states: BTreeMap::new(),
            dirty_switches: BTreeSet::new(),
            circuit_setup: prometheus_client::metrics::histogram::Histogram::new(rackmem_metrics::LATENCY_BUCKETS_S),
            rebalance: None,
            rebalance_on_join: false,
            moves: moves::Moves::default(),
        };
        for s in snap.switches {
            p.graph.add_switch(&s.name);
            p.stored_switches.insert(s.name);
        }
        let now = Instant::now();
        for b in snap.bricks {
            let key = bricks::decode_key(&b.key_hex).map_err(|m| corrupt(Key::Brick(b.id).path(), m))?;
            let mut ports = b.ports.clone();
            p.graph.attach(&Endpoint::Brick { id: b.id }, &[], &mut ports);
            p.graph.set_memory(b.id, b.serve_bps);
            p.brick_names.insert(b.name.clone(), b.id);
            p.bricks.insert(
                b.id,
                BrickEntry {
                    extents: FreeExtents::new(b.capacity_bytes),
                    rec: BrickRecord { ports, ..b },
                    key,
                    segments: BTreeMap::new(),
                    paths: BTreeMap::new(),
                    up: true,
                    last_seen: now,
                    last_heartbeat_unix_ms: None,
                    stats: None,
                    served: None,
                    load_bps: None,
                },
            );
        }
        for n in snap.nodes {
            let mut ports = n.ports.clone();
            p.graph.attach(&Endpoint::Node { id: n.id }, &[], &mut ports);
            p.node_names.insert(n.name.clone(), n.id);
            p.nodes.insert(
                n.id,
                NodeEntry {
                    rec: NodeRecord { ports, ..n },
                    allocations: BTreeSet::new(),
                },
            );
        }
        for a in snap.allocations {
            let path = Key::Allocation(a.id).path();
            let node = p
                .nodes
                .get_mut(&a.node)
                .ok_or_else(|| corrupt(path.clone(), format!("node {} does not exist", a.node)))?;
            node.allocations.insert(a.id);
            for s in &a.segments {
                let b = p
                    .bricks
                    .get_mut(&s.brick_id)
                    .ok_or_else(|| corrupt(path.clone(), format!("brick {} does not exist", s.brick_id)))?;
                if !b.extents.carve_at(s.offset, s.size_bytes) {
                    return Err(corrupt(
                        path,
                        format!(
                            "segment {} [{}, +{}) overlaps another or lies outside brick {}",
                            s.segment_id, s.offset, s.size_bytes, b.rec.name
                        ),
                    ));
                }
                b.segments.insert(s.segment_id, (s.offset, s.size_bytes));
                b.paths.insert(s.segment_id, (s.links.clone(), s.bandwidth_bps));
                p.graph.reserve(&s.links, s.bandwidth_bps);
                if a.circuit {
                    p.graph.claim(&s.links, a.id);
                }
            }
            if let Some(k) = &a.idempotency_key {
                p.idempotency.insert((a.node, k.clone()), a.id);
            }
            if let Some(n) = &a.named {
                p.names.insert(n.name.clone(), a.id);
            }
            p.allocations.insert(a.id, a);
        }
        for (id, b) in &p.bricks {
            p.index.update(*id, None, b.extents.largest());
        }
        Ok(p)
    }

    /// Which store holds the state.
    pub fn store_description(&self) -> String {
        self.store.describe()
    }

    /// The brick timeout.
    pub fn brick_timeout(&self) -> Duration {
        self.brick_timeout
    }

    /// `GET /v1/graph`.
    pub fn graph(&self) -> api::Graph {
        api::Graph {
            nodes: self.nodes(),
            bricks: self.bricks(),
            switches: self.graph.switches(),
            links: self.graph.links(),
            placement: self.placement,
        }
    }

    /// Sets how bricks are picked when an allocation does not say (`--placement`).
    pub fn set_placement(&mut self, objective: api::Objective) {
        self.placement = objective;
    }

    /// Counts for `/metrics`.
    pub fn gauges(&self) -> Gauges {
        let mut g = Gauges {
            allocations: self.allocations.len() as u64,
            nodes: self.nodes.len() as u64,
            circuits: self.allocations.values().filter(|a| a.circuit).count() as u64,
            circuit_setup: Some(self.circuit_setup.clone()),
            ..Gauges::default()
        };
        for b in self.bricks.values() {
            if b.up {
                g.bricks_up += 1;
            } else {
                g.bricks_down += 1;
            }
            g.segments += b.segments.len() as u64;
            let free = b.extents.free_bytes();
            g.bricks.push((
                b.rec.name.clone(),
                b.rec.capacity_bytes,
                free,
                b.extents.usable_bytes() - free,
            ));
        }
        g.bricks.sort();
        g.brick_rates = self
            .bricks()
            .into_iter()
            .map(|b| {
                let conns = b.stats.as_ref().and_then(|s| s.connections);
                (b.name, b.load_bps, conns, b.serve_bps, b.promised_bps)
            })
            .collect();
        g.brick_rates.sort();
        g.node_pools = self
            .nodes()
            .into_iter()
            .map(|n| (n.name, n.pool_bytes, n.pool_in_use_bytes))
            .collect();
        g.node_pools.sort();
        g
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::alloc::EXTENT_ALIGN;
    use crate::api::{AllocationRequest, BrickRegistration, NodeRegistration, PortSpec};
    use crate::store::{MemoryStore, Op};

    pub(super) const M: u64 = EXTENT_ALIGN;

    /// A control plane whose nodes may take the whole rack (these tests fill bricks with one
    /// node; the quota has its own test).
    pub(super) fn plane() -> ControlPlane {
        let mut p = ControlPlane::open(
            Box::new(MemoryStore::default()),
            None,
            Duration::from_secs(10),
            Duration::from_secs(1),
        )
        .unwrap();
        p.set_node_quota(NodeQuota::PercentOfPool(100));
        p
    }

    fn port(bw: u64) -> Vec<PortSpec> {
        vec![PortSpec {
            name: "p0".into(),
            bandwidth_bps: bw,
            switch: None,
        }]
    }

    /// Registers node `name` with one 1000 B/s port; its id.
    /// A brick of 64 MiB named `name`, with a key of bytes `key`.
    fn reg(name: &str, key: u8) -> BrickRegistration {
        BrickRegistration {
            name: name.into(),
            address: format!("tcp://{name}:7070"),
            capacity_bytes: 64 * M,
            ports: port(1000),
            key_hex: hex::encode([key; 32]),
            serve_bps: None,
        }
    }

    pub(super) fn node(p: &mut ControlPlane, name: &str) -> u64 {
        p.register_node(NodeRegistration {
            name: name.into(),
            ports: port(1000),
        })
        .unwrap()
        .id
    }

    pub(super) fn brick(p: &mut ControlPlane, name: &str, cap: u64) -> u64 {
        p.register_brick(BrickRegistration {
            name: name.into(),
            address: format!("tcp://{name}:7070"),
            capacity_bytes: cap,
            ports: port(1000),
            key_hex: hex::encode([7u8; 32]),
            serve_bps: None,
        })
        .unwrap()
        .id
    }

    #[test]
    fn failed_stripe_leaves_nothing_reserved() {
        let mut p = plane();
        let b1 = brick(&mut p, "b1", 8 * M);
        brick(&mut p, "b2", 2 * M);
        let n = node(&mut p, "n");
        let before = p.graph();
        let e = p
            .allocate(AllocationRequest {
                node: n,
                size_bytes: 8 * M,
                stripe: Some(2),
                bandwidth_bps: Some(10),
                ..AllocationRequest::default()
            })
            .unwrap_err();
        assert!(matches!(e, PlaneError::InsufficientCapacity(_)), "{e}");
        assert_eq!(p.graph(), before);
        let a = p
            .allocate(AllocationRequest {
                node: n,
                size_bytes: 3 * M,
                stripe: Some(2),
                ..AllocationRequest::default()
            })
            .unwrap();
        assert_eq!(a.segments.len(), 2);
        assert_eq!(a.segments[0].brick_id, b1, "emptiest brick first");
        assert!(a.segments.iter().all(|s| s.size_bytes == 2 * M));
        assert_eq!(a.segments[0].rate_limit_bps, 500, "two segments share the node port");
    }

    /// Reports `bytes` served by brick `id` in two heartbeats, so its load is known.
    fn load(p: &mut ControlPlane, id: u64, bytes: u64) {
        let stats = |b| HeartbeatStats {
            bytes_served: Some(b),
            ..HeartbeatStats::default()
        };
        p.heartbeat(id, Some(stats(0))).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        p.heartbeat(id, Some(stats(bytes))).unwrap();
    }

    #[test]
    fn rates_add_up_to_what_a_brick_serves_and_a_full_brick_is_passed_over() {
        let mut p = plane();
        let served = |p: &mut ControlPlane, name: &str, bps: u64| {
            p.register_brick(BrickRegistration {
                name: name.into(),
                address: format!("tcp://{name}:7070"),
                capacity_bytes: 64 * M,
                ports: port(1000),
                key_hex: hex::encode([7u8; 32]),
                serve_bps: Some(bps),
            })
            .unwrap()
            .id
        };
        let b1 = served(&mut p, "b1", 100);
        let b2 = served(&mut p, "b2", 60);
        let n = node(&mut p, "n");
        let req = |bw: Option<u64>, bricks: Option<Vec<u64>>| AllocationRequest {
            node: n,
            size_bytes: M,
            bandwidth_bps: bw,
            bricks,
            ..AllocationRequest::default()
        };
        // Two unreserved segments on b1 share what its memory serves, not its port's 1000.
        let a = p.allocate(req(None, Some(vec![b1]))).unwrap();
        p.allocate(req(None, Some(vec![b1]))).unwrap();
        assert_eq!(p.allocation(a.id).unwrap().segments[0].rate_limit_bps, 50);
        assert_eq!(p.brick(b1).unwrap().promised_bps, 100);
        // b2's memory taken whole by a reservation: the next reservation goes elsewhere.
        p.allocate(req(Some(60), Some(vec![b2]))).unwrap();
        let e = p.allocate(req(Some(10), Some(vec![b2]))).unwrap_err();
        assert!(matches!(e, PlaneError::InsufficientBandwidth(_)), "{e}");
        let c = p.allocate(req(Some(10), None)).unwrap();
        assert_eq!(c.segments[0].brick_id, b1, "b2 serves no more: passed over");
        let e = p.allocate(req(Some(200), None)).unwrap_err();
        assert!(matches!(e, PlaneError::InsufficientBandwidth(_)), "{e}");
    }

    #[test]
    fn placement_follows_its_objective_by_load_and_power() {
        let topology = Topology::parse(
            r#"{"power": {"b1": {"idle_watts": 90, "busy_watts": 300},
                          "b2": {"idle_watts": 60, "busy_watts": 200},
                          "b3": {"idle_watts": 30, "busy_watts": 100}}}"#,
        )
        .unwrap();
        let mut p = ControlPlane::open(
            Box::new(MemoryStore::default()),
            Some(topology),
            Duration::from_secs(10),
            Duration::from_secs(1),
        )
        .unwrap();
        p.set_node_quota(NodeQuota::PercentOfPool(100));
        let ids: Vec<u64> = ["b1", "b2", "b3"].iter().map(|n| brick(&mut p, n, 8 * M)).collect();
        let n = node(&mut p, "n");
        let alloc = |p: &mut ControlPlane, objective| {
            p.allocate(AllocationRequest {
                node: n,
                size_bytes: 2 * M,
                placement: objective,
                ..AllocationRequest::default()
            })
            .unwrap()
            .segments[0]
                .brick_id
        };

        // pack: the cheapest brick to run wakes first, then it fills before another wakes.
        assert_eq!(alloc(&mut p, Some(api::Objective::Pack)), ids[2], "lowest busy_watts");
        for _ in 0..3 {
            assert_eq!(alloc(&mut p, Some(api::Objective::Pack)), ids[2], "fill the busy brick");
        }
        assert_eq!(
            alloc(&mut p, Some(api::Objective::Pack)),
            ids[1],
            "b3 is full: the next cheapest wakes"
        );

        // spread (the default): least loaded first, whatever it holds.
        load(&mut p, ids[1], 1 << 30);
        load(&mut p, ids[0], 1 << 20);
        load(&mut p, ids[2], 0);
        assert_eq!(alloc(&mut p, None), ids[0], "b1 serves least (b3 is full)");
        load(&mut p, ids[0], 1 << 31);
        assert_eq!(alloc(&mut p, None), ids[1], "now b2 serves least");
        let g = p.graph();
        assert_eq!(g.placement, api::Objective::Spread);
        let b1 = g.bricks.iter().find(|b| b.id == ids[0]).unwrap();
        assert!(b1.load_bps.is_some_and(|l| l > 1 << 31), "{b1:?}");
        assert_eq!(b1.power.map(|w| w.busy_watts), Some(300));

        // The plane's default objective applies to requests that name none.
        p.set_placement(api::Objective::Pack);
        assert_eq!(
            alloc(&mut p, None),
            ids[1],
            "pack: the fuller of the busy bricks with room"
        );
    }

    /// A store whose commits fail while `fail` is set.
    struct FlakyStore {
        inner: MemoryStore,
        fail: std::sync::Arc<std::sync::atomic::AtomicBool>,
    }

    impl Store for FlakyStore {
        fn describe(&self) -> String {
            "flaky".into()
        }
        fn load(&mut self) -> Result<crate::store::Snapshot, StoreError> {
            self.inner.load()
        }
        fn commit(&mut self, ops: &[Op]) -> Result<(), StoreError> {
            if self.fail.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(StoreError::Backend {
                    store: "flaky".into(),
                    message: "disk on fire".into(),
                });
            }
            self.inner.commit(ops)
        }
    }

    #[test]
    fn a_failed_commit_leaves_nothing_reserved() {
        let fail = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let store = FlakyStore {
            inner: MemoryStore::default(),
            fail: fail.clone(),
        };
        let mut p = ControlPlane::open(Box::new(store), None, Duration::from_secs(10), Duration::from_secs(1)).unwrap();
        p.set_node_quota(NodeQuota::PercentOfPool(100));
        brick(&mut p, "b1", 8 * M);
        brick(&mut p, "b2", 8 * M);
        let n = node(&mut p, "n");
        let req = AllocationRequest {
            node: n,
            size_bytes: 4 * M,
            stripe: Some(2),
            bandwidth_bps: Some(100),
            ..AllocationRequest::default()
        };
        let a = p.allocate(req.clone()).unwrap();
        let before = p.graph();
        fail.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(matches!(p.allocate(req.clone()), Err(PlaneError::Store(_))));
        assert!(matches!(p.resize(a.id, 12 * M), Err(PlaneError::Store(_))));
        assert!(matches!(p.resize(a.id, M), Err(PlaneError::Store(_))));
        assert!(matches!(p.free(a.id), Err(PlaneError::Store(_))));
        assert_eq!(p.graph(), before, "nothing changed");
        assert_eq!(p.allocation(a.id).unwrap(), a);
        fail.store(false, std::sync::atomic::Ordering::Relaxed);
        let b = p.allocate(req).unwrap();
        assert_eq!(b.id, a.id + 1, "ids of failed attempts are not burnt");
        assert_eq!(b.segments[0].segment_id, a.segments[1].segment_id + 1);
    }

    #[test]
    fn a_node_is_held_to_its_quota_and_keys_are_scoped_to_their_node() {
        let mut p = plane();
        p.set_node_quota(NodeQuota::PercentOfPool(50));
        brick(&mut p, "b", 64 * M);
        let reg = node;
        let (a, b) = (reg(&mut p, "a"), reg(&mut p, "b"));
        let req = |node, size, key: &str| AllocationRequest {
            node,
            size_bytes: size,
            idempotency_key: Some(key.into()),
            ..Default::default()
        };
        let first = p.allocate(req(a, 24 * M, "k1")).unwrap();
        // Half the rack is 32 MiB: 16 more would pass it.
        match p.allocate(req(a, 16 * M, "k2")) {
            Err(PlaneError::QuotaExceeded(m)) => assert!(m.contains("node-quota"), "{m}"),
            other => panic!("expected quota_exceeded, got {other:?}"),
        }
        assert!(matches!(p.resize(first.id, 40 * M), Err(PlaneError::QuotaExceeded(_))));
        // The other node is not held to what the first holds; an admin's override lifts it.
        p.allocate(req(b, 16 * M, "kb")).unwrap();
        p.set_node_quota_of(a, Some(40 * M)).unwrap();
        p.allocate(req(a, 16 * M, "k2")).unwrap();
        // Node b reusing node a's key makes its own allocation and learns nothing of a's.
        let (mine, how) = p.allocate_once(req(b, 2 * M, "k1")).unwrap();
        assert_eq!(how, Allocated::Created);
        assert_ne!(mine.id, first.id);
        let (again, how) = p.allocate_once(req(a, 24 * M, "k1")).unwrap();
        assert_eq!((again.id, how), (first.id, Allocated::Replayed));
    }

    #[test]
    fn a_clone_lies_on_its_sources_bricks_counts_to_the_quota_and_replays_by_key() {
        let mut p = plane();
        p.set_node_quota(NodeQuota::PercentOfPool(40));
        let (b1, b2) = (brick(&mut p, "b1", 32 * M), brick(&mut p, "b2", 32 * M));
        let n = node(&mut p, "n");
        let src = p
            .allocate(AllocationRequest {
                node: n,
                size_bytes: 8 * M,
                stripe: Some(2),
                ..Default::default()
            })
            .unwrap();
        let ids: Vec<u64> = src.segments.iter().map(|s| s.segment_id).collect();
        // The second segment first: the clone's segments follow the order asked.
        let req = api::CloneRequest {
            segments: Some(vec![ids[1], ids[0]]),
            idempotency_key: Some("fork-1".into()),
            holder: None,
        };
        let (clone, how) = p.clone_allocation(src.id, req.clone()).unwrap();
        assert_eq!(how, Allocated::Created);
        assert_eq!(clone.node, n);
        let placed: Vec<(u64, u64)> = clone.segments.iter().map(|s| (s.brick_id, s.size_bytes)).collect();
        let want: Vec<(u64, u64)> = [1, 0]
            .iter()
            .map(|&i| (src.segments[i].brick_id, src.segments[i].size_bytes))
            .collect();
        assert_eq!(placed, want);
        assert!([b1, b2].iter().all(|b| placed.iter().any(|(p, _)| p == b)));
        let (again, how) = p.clone_allocation(src.id, req).unwrap();
        assert_eq!((again.id, how), (clone.id, Allocated::Replayed));
        // 40% of the rack is 25.6 MiB; the node holds 16: a clone of 8 fits, the next does not.
        p.clone_allocation(src.id, api::CloneRequest::default()).unwrap();
        match p.clone_allocation(src.id, api::CloneRequest::default()) {
            Err(PlaneError::QuotaExceeded(m)) => assert!(m.contains("node-quota"), "{m}"),
            other => panic!("expected quota_exceeded, got {other:?}"),
        }
        // A segment that is not the allocation's, or named twice, is refused.
        let bad = |segments| api::CloneRequest {
            segments: Some(segments),
            ..Default::default()
        };
        assert!(matches!(
            p.clone_allocation(src.id, bad(vec![424242])),
            Err(PlaneError::NotFound(_))
        ));
        assert!(matches!(
            p.clone_allocation(src.id, bad(vec![ids[0], ids[0]])),
            Err(PlaneError::Invalid(_))
        ));
        // Released like any allocation.
        p.free(clone.id).unwrap();
        assert!(p.allocation(clone.id).is_err());
    }

    /// A switch driver that records what it was given into `seen` and fails while `fail` is set.
    struct Recorder {
        seen: std::sync::Arc<std::sync::Mutex<BTreeMap<String, Vec<api::SwitchRule>>>>,
        fail: std::sync::Arc<std::sync::atomic::AtomicBool>,
    }

    impl crate::switch::SwitchDriver for Recorder {
        fn describe(&self) -> String {
            "recorder".into()
        }
        fn apply(&mut self, switch: &str, rules: &[api::SwitchRule]) -> Result<(), crate::switch::SwitchError> {
            if self.fail.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(crate::switch::SwitchError::Apply {
                    switch: switch.into(),
                    message: "cable unplugged".into(),
                });
            }
            self.seen.lock().unwrap().insert(switch.to_string(), rules.to_vec());
            Ok(())
        }
    }

    #[test]
    fn a_circuit_holds_its_links_alone_configures_its_switches_and_survives_a_reload() {
        let topology = Topology::parse(
            r#"{"switches": ["a", "b", "spine"],
                "links": [{"a": "a", "b": "spine", "bandwidth_bps": 1000},
                          {"a": "b", "b": "spine", "bandwidth_bps": 1000},
                          {"a": "a", "b": "b", "bandwidth_bps": 1000}],
                "ports": {"n:e0": "a", "n:e1": "a", "m:p0": "b", "m:p1": "b"}}"#,
        )
        .unwrap();
        let mut p = ControlPlane::open(
            Box::new(MemoryStore::default()),
            Some(topology),
            Duration::from_secs(10),
            Duration::from_secs(1),
        )
        .unwrap();
        p.set_node_quota(NodeQuota::PercentOfPool(100));
        let seen = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::new()));
        let fail = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        p.set_switch_driver(Box::new(Recorder {
            seen: seen.clone(),
            fail: fail.clone(),
        }));
        let two = |a: &str, b: &str| {
            vec![
                PortSpec {
                    name: a.into(),
                    bandwidth_bps: 1000,
                    switch: None,
                },
                PortSpec {
                    name: b.into(),
                    bandwidth_bps: 1000,
                    switch: None,
                },
            ]
        };
        let m = p
            .register_brick(BrickRegistration {
                name: "m".into(),
                address: "tcp://m:7070".into(),
                capacity_bytes: 64 * M,
                ports: two("p0", "p1"),
                key_hex: hex::encode([7u8; 32]),
                serve_bps: None,
            })
            .unwrap()
            .id;
        let n = p
            .register_node(NodeRegistration {
                name: "n".into(),
                ports: two("e0", "e1"),
            })
            .unwrap()
            .id;
        let req = |circuit: bool| AllocationRequest {
            node: n,
            size_bytes: M,
            circuit: circuit.then_some(true),
            ..AllocationRequest::default()
        };
        let c = p.allocate(req(true)).unwrap();
        assert!(c.circuit);
        let path = c.segments[0].links.clone();
        assert_eq!(
            path,
            vec![
                format!("node:{n}:e0"),
                "switch:a:b".to_string(),
                format!("brick:{m}:p0")
            ]
        );
        // The rules: one per switch crossed, each joining the cable in to the cable out.
        let rules = seen.lock().unwrap().clone();
        assert_eq!(rules.len(), 2, "{rules:?}");
        assert_eq!(
            (rules["a"][0].a.port.as_str(), rules["a"][0].b.port.as_str()),
            ("n:e0", "switch:b")
        );
        assert_eq!(
            (rules["b"][0].a.port.as_str(), rules["b"][0].b.port.as_str()),
            ("switch:a", "m:p0")
        );
        // Another allocation routes around the circuit's links.
        let other = p.allocate(req(false)).unwrap();
        let around = &other.segments[0].links;
        assert!(around.iter().all(|l| !path.contains(l)), "{around:?} crosses {path:?}");
        // A second circuit cannot share the links the shared allocation uses, but the rest make
        // one; a third finds none, and is told why.
        let c2 = p.allocate(req(true)).unwrap_err();
        assert!(matches!(c2, PlaneError::InsufficientBandwidth(_)), "{c2}");
        p.free(other.id).unwrap();
        let c2 = p.allocate(req(true)).unwrap();
        assert_eq!(c2.segments[0].links[0], format!("node:{n}:e1"));
        match p.allocate(req(false)) {
            Err(PlaneError::InsufficientBandwidth(m)) => assert!(m.contains("circuit of allocation"), "{m}"),
            other => panic!("expected a refusal naming the circuits, got {other:?}"),
        }
        // A switch that cannot be configured: refused, nothing reserved.
        p.free(c2.id).unwrap();
        fail.store(true, std::sync::atomic::Ordering::Relaxed);
        let before = p.graph();
        assert!(matches!(p.allocate(req(true)), Err(PlaneError::Switch(_))));
        assert_eq!(p.graph(), before);
        fail.store(false, std::sync::atomic::Ordering::Relaxed);
        // Moved off e0: new paths, the old rules gone, the new ones in.
        let moved = p.move_circuit(c.id, &[format!("node:{n}:e0")]).unwrap();
        assert!(moved.links.contains(&format!("node:{n}:e1")), "{moved:?}");
        assert!(!moved.links.contains(&format!("node:{n}:e0")));
        let rules = seen.lock().unwrap().clone();
        assert!(rules.values().flatten().all(|r| r.a.port != "n:e0"), "{rules:?}");
        // Reloaded from the store (a restart): still a circuit holding the same links.
        p.reload().unwrap();
        let g = p.graph();
        let held: Vec<&str> = g
            .links
            .iter()
            .filter(|l| l.circuit == Some(c.id))
            .map(|l| l.id.as_str())
            .collect();
        let mut want = moved.links.clone();
        want.sort();
        assert_eq!(held, want);
        assert_eq!(p.circuits().circuits.len(), 1);
        // Released: its links are free and no switch forwards for it.
        p.free(c.id).unwrap();
        assert!(p.graph().links.iter().all(|l| l.circuit.is_none()));
        assert!(seen.lock().unwrap().values().all(Vec::is_empty));
    }

    #[test]
    fn an_operator_sets_what_a_brick_serves_and_its_segments_rates_follow() {
        let mut p = plane();
        let b = p
            .register_brick(BrickRegistration {
                name: "b".into(),
                address: "tcp://b:7070".into(),
                capacity_bytes: 64 * M,
                ports: port(1000),
                key_hex: hex::encode([7u8; 32]),
                serve_bps: Some(100),
            })
            .unwrap()
            .id;
        let n = node(&mut p, "n");
        let req = |bw: Option<u64>| AllocationRequest {
            node: n,
            size_bytes: M,
            bandwidth_bps: bw,
            ..AllocationRequest::default()
        };
        let a = p.allocate(req(None)).unwrap();
        p.allocate(req(Some(20))).unwrap();
        assert_eq!(p.allocation(a.id).unwrap().segments[0].rate_limit_bps, 80);
        assert_eq!(p.set_serve_rate(b, Some(60)).unwrap().serve_bps, Some(60));
        assert_eq!(
            p.allocation(a.id).unwrap().segments[0].rate_limit_bps,
            40,
            "divided anew"
        );
        let hb = p.heartbeat(b, None).unwrap();
        assert!(hb.segments.iter().any(|s| s.rate_bps == Some(40)), "{hb:?}");
        assert!(
            matches!(p.set_serve_rate(b, Some(10)), Err(PlaneError::Conflict(_))),
            "below the reservation"
        );
        assert!(
            matches!(p.set_serve_rate(b, None), Err(PlaneError::Conflict(_))),
            "segments hold"
        );
        assert!(matches!(p.set_serve_rate(b, Some(0)), Err(PlaneError::Invalid(_))));
        p.reload().unwrap();
        assert_eq!(p.brick(b).unwrap().serve_bps, Some(60), "stored");
        assert_eq!(p.allocation(a.id).unwrap().segments[0].rate_limit_bps, 40);
    }

    #[test]
    fn a_draining_brick_takes_no_new_segments_and_is_drained_when_it_holds_none() {
        let mut p = plane();
        let a = p.register_brick(reg("a", 7)).unwrap().id;
        let b = p.register_brick(reg("b", 8)).unwrap().id;
        let n = node(&mut p, "n");
        let req = |bricks: Option<Vec<u64>>| AllocationRequest {
            node: n,
            size_bytes: M,
            bricks,
            ..AllocationRequest::default()
        };
        let on_a = p.allocate(req(Some(vec![a]))).unwrap();
        let d = p.set_draining(a, true).unwrap();
        assert!(d.draining && !d.drained, "{d:?}");
        for _ in 0..4 {
            let x = p.allocate(req(None)).unwrap();
            assert!(
                x.segments.iter().all(|s| s.brick_id == b),
                "placed on the draining brick: {x:?}"
            );
        }
        assert!(
            matches!(p.allocate(req(Some(vec![a]))), Err(PlaneError::InsufficientCapacity(_))),
            "asked for by name"
        );
        // It registers again (restarts): still draining.
        p.register_brick(reg("a", 7)).unwrap();
        p.reload().unwrap();
        assert!(p.brick(a).unwrap().draining, "stored and kept");
        p.free(on_a.id).unwrap();
        let d = p.brick(a).unwrap();
        assert!(d.drained && d.segments == 0, "{d:?}");
        let d = p.set_draining(a, false).unwrap();
        assert!(!d.draining && !d.drained);
        p.allocate(req(Some(vec![a]))).unwrap();
    }

    #[test]
    fn a_nodes_pool_report_lists_its_segments_on_a_draining_brick_with_a_target() {
        let mut p = plane();
        let a = p.register_brick(reg("a", 7)).unwrap().id;
        let n = node(&mut p, "n");
        let other = node(&mut p, "m");
        let req = |node, bricks: Option<Vec<u64>>| AllocationRequest {
            node,
            size_bytes: 8 * M,
            bricks,
            ..AllocationRequest::default()
        };
        let mine = p.allocate(req(n, Some(vec![a]))).unwrap();
        p.allocate(req(other, Some(vec![a]))).unwrap();
        // No other brick: refused, and nothing changed.
        let e = p.set_draining(a, true).unwrap_err();
        assert!(matches!(e, PlaneError::InsufficientCapacity(_)), "{e}");
        assert!(e.to_string().contains("no other brick"), "{e}");
        assert!(!p.brick(a).unwrap().draining);
        assert!(p
            .report_pool(n, api::PoolReport::default())
            .unwrap()
            .evacuate
            .is_empty());
        let b = p.register_brick(reg("b", 8)).unwrap().id;
        // A striped allocation over both: it goes back whole, so both segments move.
        let striped = p
            .allocate(AllocationRequest {
                stripe: Some(2),
                ..req(n, Some(vec![a, b]))
            })
            .unwrap();
        p.set_draining(a, true).unwrap();
        let r = p.report_pool(n, api::PoolReport::default()).unwrap();
        assert_eq!(r.evacuate.len(), 3, "only this node's segments: {r:?}");
        assert!(r.evacuate[1..].iter().all(|e| e.allocation == striped.id), "{r:?}");
        assert_eq!(r.evacuate[2].brick_id, b, "{r:?}");
        let e = &r.evacuate[0];
        assert_eq!(
            (e.allocation, e.segment_id, e.brick_id),
            (mine.id, mine.segments[0].segment_id, a)
        );
        assert_eq!(
            (e.to_brick_id, e.to_address.as_deref()),
            (Some(b), Some("tcp://b:7070"))
        );
        // No room left anywhere else: listed without a target, saying why.
        p.allocate(AllocationRequest {
            size_bytes: 60 * M,
            ..req(other, Some(vec![b]))
        })
        .unwrap();
        let r = p.report_pool(n, api::PoolReport::default()).unwrap();
        assert!(
            r.evacuate[0].to_brick_id.is_none() && r.evacuate[0].why.is_some(),
            "{r:?}"
        );
    }

    #[test]
    fn a_rebalance_lists_its_moves_to_their_node_bounded_and_ends_when_they_are_gone() {
        let mut p = plane();
        let a = p.register_brick(reg("a", 7)).unwrap().id;
        let n = node(&mut p, "n");
        let holder = |pid| {
            Some(api::Holder {
                agent: "run".into(),
                connection: 1,
                pid,
                uid: 0,
                start_ticks: 1,
            })
        };
        let mut held = Vec::new();
        for pid in 0..4 {
            held.push(
                p.allocate(AllocationRequest {
                    node: n,
                    size_bytes: 8 * M,
                    holder: holder(pid),
                    ..AllocationRequest::default()
                })
                .unwrap(),
            );
        }
        // Made by hand: no agent can move it, so it is not planned.
        p.allocate(AllocationRequest {
            node: n,
            size_bytes: 8 * M,
            ..AllocationRequest::default()
        })
        .unwrap();
        assert!(matches!(p.rebalance_status(), Err(PlaneError::NotFound(_))));
        // A brick joins: a has 40 of 64 MiB (62.5%), b none; the mean is 31.25%.
        let b = p.register_brick(reg("b", 8)).unwrap().id;
        let dry = p
            .rebalance(
                api::RebalanceRequest {
                    dry_run: true,
                    tolerance_points: Some(10.0),
                    max_in_flight_bytes: Some(8 * M),
                },
                "operator",
            )
            .unwrap();
        assert_eq!(dry.moves.len(), 2, "{dry:?}");
        assert!(dry.moves.iter().all(|m| m.segments[0].to_brick_id == b));
        let planned: Vec<u64> = dry.bricks.iter().map(|x| x.planned_bytes).collect();
        assert_eq!(planned, vec![24 * M, 16 * M], "{dry:?}");
        assert!(
            p.report_pool(n, api::PoolReport::default())
                .unwrap()
                .evacuate
                .is_empty(),
            "a dry run moves nothing"
        );

        let r = p
            .rebalance(
                api::RebalanceRequest {
                    max_in_flight_bytes: Some(8 * M),
                    ..Default::default()
                },
                "operator",
            )
            .unwrap();
        let states: Vec<api::MoveState> = r.moves.iter().map(|m| m.state).collect();
        assert_eq!(
            states,
            vec![api::MoveState::Moving, api::MoveState::Pending],
            "one 8 MiB move in flight"
        );
        let e = p.report_pool(n, api::PoolReport::default()).unwrap().evacuate;
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(
            (e[0].brick_id, e[0].to_brick_id, e[0].allocation),
            (a, Some(b), r.moves[0].allocation)
        );
        assert!(matches!(
            p.rebalance(api::RebalanceRequest::default(), "operator"),
            Err(PlaneError::Conflict(_))
        ));
        // Its process moved the pages to a new allocation on b and returned this one.
        p.allocate(AllocationRequest {
            node: n,
            size_bytes: 8 * M,
            bricks: Some(vec![b]),
            holder: holder(9),
            ..AllocationRequest::default()
        })
        .unwrap();
        p.free(r.moves[0].allocation).unwrap();
        let e = p.report_pool(n, api::PoolReport::default()).unwrap().evacuate;
        assert_eq!(e.len(), 1, "the next one starts: {e:?}");
        assert_eq!(e[0].allocation, r.moves[1].allocation);
        p.free(r.moves[1].allocation).unwrap();
        let s = p.rebalance_status().unwrap();
        assert!(s.finished, "{s:?}");
        assert!(s.moves.iter().all(|m| m.state == api::MoveState::Done), "{s:?}");
        assert!(held.iter().any(|h| h.id == s.moves[0].allocation));
    }

    #[test]
    fn a_brick_that_joins_starts_a_rebalance_when_the_policy_is_on() {
        let mut p = plane();
        p.set_rebalance_on_join(true);
        p.register_brick(reg("a", 7)).unwrap();
        let n = node(&mut p, "n");
        for pid in 0..4 {
            p.allocate(AllocationRequest {
                node: n,
                size_bytes: 8 * M,
                holder: Some(api::Holder {
                    agent: "run".into(),
                    connection: 1,
                    pid,
                    uid: 0,
                    start_ticks: 1,
                }),
                ..AllocationRequest::default()
            })
            .unwrap();
        }
        let b = p.register_brick(reg("b", 8)).unwrap().id;
        let r = p.rebalance_status().unwrap();
        assert_eq!(r.reason, "brick_joined");
        assert!(
            !r.moves.is_empty() && r.moves.iter().all(|m| m.segments[0].to_brick_id == b),
            "{r:?}"
        );
    }
}
