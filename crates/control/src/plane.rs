//! The control plane's state machine: registrations, heartbeats, allocations, and the views the
//! REST API shows. No I/O but the store.
//!
//! Every change is planned on the in-memory state with an undo log, written to the store as one
//! batch, and undone if anything (placement or the store) fails, so a failed request leaves
//! nothing reserved. Callers serialize access (the server holds it in a mutex).

use crate::alloc::{align_up, BrickIndex, FreeExtents, EXTENT_ALIGN};
use crate::api::{self, BrickState, Endpoint, HeartbeatStats, LiveSegment, Port};
use crate::auth::TokenTable;
use crate::grant;
use crate::graph::{check_owner_name, Graph, GraphError, Topology};
use crate::store::{
    AllocationRecord, BrickRecord, Counters, Key, NodeRecord, Op, Record, SegmentRecord, Store, StoreError,
    SwitchRecord, TokenRecord,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Most bricks one allocation may be striped over.
pub const MAX_STRIPE: u32 = 1024;
/// Most bytes a grant key may have.
pub const MAX_KEY_BYTES: usize = 1024;

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
    /// The store failed; nothing was changed (503).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<GraphError> for PlaneError {
    fn from(e: GraphError) -> Self {
        PlaneError::Invalid(e.to_string())
    }
}

/// Whether [`ControlPlane::allocate_once`] made the allocation or found it by its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocated {
    /// A new allocation (201).
    Created,
    /// The live allocation an earlier request with the same idempotency key made (200).
    Replayed,
}

/// SHA-256 (hex) of an allocation request without its idempotency key: what a retry must
/// repeat exactly.
fn request_digest(req: &api::AllocationRequest) -> String {
    use sha2::Digest;
    let bare = api::AllocationRequest {
        idempotency_key: None,
        ..req.clone()
    };
    // Plain fields only: serialization cannot fail, and its field order is fixed.
    let body = serde_json::to_vec(&bare).unwrap_or_default();
    hex::encode(sha2::Sha256::digest(&body))
}

/// Milliseconds since the Unix epoch.
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

struct BrickEntry {
    rec: BrickRecord,
    key: Vec<u8>,
    extents: FreeExtents,
    /// segment id → (offset, size).
    segments: BTreeMap<u64, (u64, u64)>,
    up: bool,
    last_seen: Instant,
    last_heartbeat_unix_ms: Option<u64>,
    stats: Option<HeartbeatStats>,
}

struct NodeEntry {
    rec: NodeRecord,
    allocations: BTreeSet<u64>,
}

enum Undo {
    Carved { brick: u64, offset: u64, size: u64 },
    Reserved { links: Vec<String>, bandwidth_bps: u64 },
}

/// What a placement needs to know.
struct Placement<'a> {
    node: u64,
    per_segment: u64,
    stripe: u32,
    bandwidth_bps: u64,
    bricks: Option<&'a [u64]>,
    allowed: Option<HashSet<String>>,
}

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
    /// Idempotency key → the live allocation it made (rebuilt from the records at load).
    idempotency: HashMap<String, u64>,
    counters: Counters,
    index: BrickIndex,
    stored_switches: HashSet<String>,
    brick_timeout: Duration,
    heartbeat_interval: Duration,
    /// API tokens by id (hashes only).
    tokens: BTreeMap<u64, TokenRecord>,
    /// How long a grant is good for (zero: forever).
    grant_lifetime: Duration,
    /// What the REST server authenticates against: refilled whenever `tokens` changes.
    token_table: Arc<TokenTable>,
}

/// How long grants are good for unless configured: long enough that clocks a little apart do
/// not matter, short enough that a stolen grant is soon worth nothing.
pub const DEFAULT_GRANT_LIFETIME: Duration = Duration::from_secs(600);

/// The expiry inside an encoded grant (0 when it does not decode: shown, never trusted).
fn grant_expiry_of(grant_hex: &str) -> u64 {
    hex::decode(grant_hex)
        .ok()
        .and_then(|b| rackmem_proto::Grant::decode(&b).ok())
        .map_or(0, |g| g.expiry_unix_s)
}

fn token_info(t: &TokenRecord) -> api::TokenInfo {
    api::TokenInfo {
        id: t.id,
        role: t.role,
        name: t.name.clone(),
        created_unix_ms: t.created_unix_ms,
    }
}

fn decode_key(key_hex: &str) -> Result<Vec<u8>, String> {
    let key = hex::decode(key_hex.trim()).map_err(|e| format!("key_hex is not hex: {e}"))?;
    if key.len() < 16 || key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "a grant key has 16 to {MAX_KEY_BYTES} bytes; this one has {}",
            key.len()
        ));
    }
    Ok(key)
}

fn check_address(address: &str) -> Result<(), PlaneError> {
    let ok = ["tcp://", "tls://", "unix:"]
        .iter()
        .any(|scheme| address.len() > scheme.len() && address.starts_with(scheme))
        && address.len() <= 512;
    if ok {
        Ok(())
    } else {
        Err(PlaneError::Invalid(format!(
            "brick address {address:?} is not valid: use tcp://HOST:PORT, tls://HOST:PORT or unix:PATH"
        )))
    }
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
                if !b.up {
                    fresh.index.remove(*id, b.extents.largest());
                }
            }
        }
        std::mem::swap(&mut fresh.store, &mut self.store);
        fresh.token_table = self.token_table.clone();
        fresh.grant_lifetime = self.grant_lifetime;
        *self = fresh;
        self.publish_tokens();
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
            counters: snap.counters,
            index: BrickIndex::default(),
            stored_switches: HashSet::new(),
            brick_timeout,
            heartbeat_interval,
            tokens: snap.tokens.into_iter().map(|t| (t.id, t)).collect(),
            grant_lifetime: DEFAULT_GRANT_LIFETIME,
            token_table: Arc::new(TokenTable::default()),
        };
        for s in snap.switches {
            p.graph.add_switch(&s.name);
            p.stored_switches.insert(s.name);
        }
        let now = Instant::now();
        for b in snap.bricks {
            let key = decode_key(&b.key_hex).map_err(|m| corrupt(Key::Brick(b.id).path(), m))?;
            let mut ports = b.ports.clone();
            p.graph.attach(&Endpoint::Brick { id: b.id }, &[], &mut ports);
            p.brick_names.insert(b.name.clone(), b.id);
            p.bricks.insert(
                b.id,
                BrickEntry {
                    extents: FreeExtents::new(b.capacity_bytes),
                    rec: BrickRecord { ports, ..b },
                    key,
                    segments: BTreeMap::new(),
                    up: true,
                    last_seen: now,
                    last_heartbeat_unix_ms: None,
                    stats: None,
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
                p.graph.reserve(&s.links, s.bandwidth_bps);
            }
            if let Some(k) = &a.idempotency_key {
                p.idempotency.insert(k.clone(), a.id);
            }
            p.allocations.insert(a.id, a);
        }
        for (id, b) in &p.bricks {
            p.index.update(*id, None, b.extents.largest());
        }
        Ok(p)
    }

    /// Makes `table` the one the REST server authenticates against, filled with the stored
    /// tokens now and after every change or reload.
    pub fn share_tokens(&mut self, table: Arc<TokenTable>) {
        self.token_table = table;
        self.publish_tokens();
    }

    fn publish_tokens(&self) {
        let v: Vec<TokenRecord> = self.tokens.values().cloned().collect();
        self.token_table.replace(&v);
    }

    /// `POST /v1/tokens`: a new token for `role` and `name`; the secret is in the reply only.
    pub fn create_token(&mut self, req: api::TokenRequest) -> Result<api::TokenCreated, PlaneError> {
        crate::auth::check_name(&req.name).map_err(PlaneError::Invalid)?;
        let mut counters = self.counters;
        // Id 0 is the admin token file's.
        let id = counters.next_token.max(1);
        counters.next_token = id + 1;
        let t = crate::auth::issue(id, req.role, &req.name, now_unix_ms()).map_err(|e| {
            PlaneError::Store(StoreError::Backend {
                store: self.store.describe(),
                message: e.to_string(),
            })
        })?;
        self.store.commit(&[
            Op::Put(Record::Token(t.record.clone())),
            Op::Put(Record::Counters(counters)),
        ])?;
        self.counters = counters;
        self.tokens.insert(id, t.record.clone());
        self.publish_tokens();
        Ok(api::TokenCreated {
            id,
            role: req.role,
            name: req.name,
            token: t.token,
        })
    }

    /// `GET /v1/tokens`: every token, without secrets.
    pub fn tokens(&self) -> Vec<api::TokenInfo> {
        self.tokens.values().map(token_info).collect()
    }

    /// `DELETE /v1/tokens/{id}`: the token stops working at once.
    pub fn revoke_token(&mut self, id: u64) -> Result<api::TokenInfo, PlaneError> {
        let t = self
            .tokens
            .get(&id)
            .map(token_info)
            .ok_or_else(|| PlaneError::NotFound(format!("token {id}")))?;
        self.store.commit(&[Op::Delete(Key::Token(id))])?;
        self.tokens.remove(&id);
        self.publish_tokens();
        Ok(t)
    }

    /// `DELETE /v1/bricks/{id}`: forgets a brick that holds no segment (its name and key are
    /// free again, e.g. to replace a machine).
    pub fn forget_brick(&mut self, id: u64) -> Result<api::Brick, PlaneError> {
        let b = self
            .bricks
            .get(&id)
            .ok_or_else(|| PlaneError::NotFound(format!("brick {id}")))?;
        if !b.segments.is_empty() {
            return Err(PlaneError::Conflict(format!(
                "brick {} still holds {} segments: release their allocations first",
                b.rec.name,
                b.segments.len()
            )));
        }
        let shown = self.brick(id)?;
        self.store.commit(&[Op::Delete(Key::Brick(id))])?;
        if let Some(b) = self.bricks.remove(&id) {
            if b.up {
                self.index.remove(id, b.extents.largest());
            }
            self.graph.attach(&Endpoint::Brick { id }, &b.rec.ports, &mut []);
            self.brick_names.remove(&b.rec.name);
        }
        Ok(shown)
    }

    /// Sets how long grants issued from now on are good for (zero: forever).
    pub fn set_grant_lifetime(&mut self, lifetime: Duration) {
        self.grant_lifetime = lifetime;
    }

    /// The expiry to sign into a grant issued now.
    fn grant_expiry(&self) -> u64 {
        if self.grant_lifetime.is_zero() {
            return 0;
        }
        now_unix_ms() / 1000 + self.grant_lifetime.as_secs().max(1)
    }

    /// `POST /v1/allocations/{id}/renew`: signs every segment's grant again with a fresh
    /// expiry (same segment, range and node: a new session key), so its holder can attach
    /// again. The old grants stay valid until their own expiry.
    pub fn renew(&mut self, id: u64) -> Result<api::Allocation, PlaneError> {
        let mut rec = self
            .allocations
            .get(&id)
            .cloned()
            .ok_or_else(|| PlaneError::NotFound(format!("allocation {id}")))?;
        let expiry = self.grant_expiry();
        for s in &mut rec.segments {
            let b = self
                .bricks
                .get(&s.brick_id)
                .ok_or_else(|| PlaneError::NotFound(format!("brick {} of allocation {id}", s.brick_id)))?;
            let issued = grant::issue(&b.key, s.segment_id, s.offset, s.size_bytes, rec.node, expiry);
            s.grant_hex = issued.grant_hex;
            s.session_key_hex = issued.session_key_hex;
        }
        self.store.commit(&[Op::Put(Record::Allocation(rec.clone()))])?;
        self.allocations.insert(id, rec);
        self.allocation(id)
    }

    /// The id of the node named `name`.
    pub fn node_id(&self, name: &str) -> Option<u64> {
        self.node_names.get(name).copied()
    }

    /// The name of brick `id`.
    pub fn brick_name(&self, id: u64) -> Option<&str> {
        self.bricks.get(&id).map(|b| b.rec.name.as_str())
    }

    /// The node allocation `id` belongs to.
    pub fn allocation_node(&self, id: u64) -> Option<u64> {
        self.allocations.get(&id).map(|a| a.node)
    }

    /// Which store holds the state.
    pub fn store_description(&self) -> String {
        self.store.describe()
    }

    /// The brick timeout.
    pub fn brick_timeout(&self) -> Duration {
        self.brick_timeout
    }

    fn set_largest(&mut self, brick: u64, old_largest: u64) {
        if let Some(b) = self.bricks.get(&brick) {
            if b.up {
                self.index.update(brick, Some(old_largest), b.extents.largest());
            }
        }
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
        let prefix = crate::graph::port_link_id(owner, "");
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
    fn check_kept_ports(&self, owner: &Endpoint, what: &str, new: &[Port]) -> Result<(), PlaneError> {
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

    /// `POST /v1/bricks`.
    pub fn register_brick(&mut self, reg: api::BrickRegistration) -> Result<api::BrickRegistered, PlaneError> {
        check_owner_name("brick", &reg.name)?;
        check_address(&reg.address)?;
        let key = decode_key(&reg.key_hex).map_err(|m| PlaneError::Invalid(format!("brick {}: {m}", reg.name)))?;
        if reg.capacity_bytes < EXTENT_ALIGN {
            return Err(PlaneError::Invalid(format!(
                "brick {} lends {} bytes: a brick lends at least 1 MiB",
                reg.name, reg.capacity_bytes
            )));
        }
        let mut ports = self.graph.resolve_ports(&reg.name, &reg.ports)?;
        if let Some((other, _)) = self
            .bricks
            .values()
            .map(|b| (&b.rec.name, &b.rec.address))
            .find(|(n, a)| **a == reg.address && **n != reg.name)
        {
            return Err(PlaneError::Conflict(format!(
                "address {} is already registered by brick {other}",
                reg.address
            )));
        }
        let existing = self.brick_names.get(&reg.name).copied();
        let mut counters = self.counters;
        let id = match existing {
            Some(id) => id,
            None => {
                counters.next_brick = counters.next_brick.max(1);
                let id = counters.next_brick;
                counters.next_brick += 1;
                id
            }
        };
        let owner = Endpoint::Brick { id };
        for p in &mut ports {
            p.link = crate::graph::port_link_id(&owner, &p.name);
        }
        let mut extents = FreeExtents::new(reg.capacity_bytes);
        let mut old_ports = Vec::new();
        if let Some(b) = existing.and_then(|id| self.bricks.get(&id)) {
            // The name is bound to the key: whoever else registers it cannot take over the
            // brick's segments, nor sign grants the real brick would honour.
            if b.key != key {
                return Err(PlaneError::Conflict(format!(
                    "brick {} is registered with another grant key: a brick keeps its key across restarts \
                     (rackmem brick --key-file PATH); to replace the brick, release its allocations and \
                     `rackmem ctl forget-brick {}` first",
                    reg.name, reg.name
                )));
            }
            for (sid, &(off, size)) in &b.segments {
                if !extents.carve_at(off, size) {
                    return Err(PlaneError::Conflict(format!(
                        "brick {} re-registers with {} bytes, which no longer hold its live segment {sid} at \
                         [{off}, +{size})",
                        reg.name, reg.capacity_bytes
                    )));
                }
            }
            self.check_kept_ports(&owner, &format!("brick {}", reg.name), &ports)?;
            old_ports = b.rec.ports.clone();
        }
        let rec = BrickRecord {
            id,
            name: reg.name.clone(),
            address: reg.address,
            capacity_bytes: reg.capacity_bytes,
            ports: ports.clone(),
            key_hex: hex::encode(&key),
        };
        let mut ops = self.switch_ops(&ports);
        ops.push(Op::Put(Record::Brick(rec.clone())));
        if counters != self.counters {
            ops.push(Op::Put(Record::Counters(counters)));
        }
        self.store.commit(&ops)?;
        self.counters = counters;
        self.note_switches(&ports);
        self.graph.attach(&owner, &old_ports, &mut ports);
        let now = Instant::now();
        let (segments, stats, hb) = match self.bricks.remove(&id) {
            Some(old) => {
                if old.up {
                    self.index.remove(id, old.extents.largest());
                }
                (old.segments, old.stats, old.last_heartbeat_unix_ms)
            }
            None => (BTreeMap::new(), None, None),
        };
        self.index.update(id, None, extents.largest());
        self.brick_names.insert(rec.name.clone(), id);
        self.bricks.insert(
            id,
            BrickEntry {
                rec,
                key,
                extents,
                segments,
                up: true,
                last_seen: now,
                last_heartbeat_unix_ms: hb,
                stats,
            },
        );
        Ok(api::BrickRegistered {
            id,
            heartbeat_interval_ms: u64::try_from(self.heartbeat_interval.as_millis()).unwrap_or(u64::MAX),
            brick_timeout_ms: u64::try_from(self.brick_timeout.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// `POST /v1/nodes`.
    pub fn register_node(&mut self, reg: api::NodeRegistration) -> Result<api::NodeRegistered, PlaneError> {
        check_owner_name("node", &reg.name)?;
        let mut ports = self.graph.resolve_ports(&reg.name, &reg.ports)?;
        let existing = self.node_names.get(&reg.name).copied();
        let mut counters = self.counters;
        let id = match existing {
            Some(id) => id,
            None => {
                counters.next_node = counters.next_node.max(1);
                let id = counters.next_node;
                counters.next_node += 1;
                id
            }
        };
        let owner = Endpoint::Node { id };
        for p in &mut ports {
            p.link = crate::graph::port_link_id(&owner, &p.name);
        }
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
        let mut ops = self.switch_ops(&ports);
        ops.push(Op::Put(Record::Node(rec.clone())));
        if counters != self.counters {
            ops.push(Op::Put(Record::Counters(counters)));
        }
        self.store.commit(&ops)?;
        self.counters = counters;
        self.note_switches(&ports);
        self.graph.attach(&owner, &old_ports, &mut ports);
        self.node_names.insert(rec.name.clone(), id);
        let allocations = self.nodes.remove(&id).map(|n| n.allocations).unwrap_or_default();
        self.nodes.insert(id, NodeEntry { rec, allocations });
        Ok(api::NodeRegistered { id })
    }

    /// `PUT /v1/bricks/{id}/heartbeat`: the brick is alive; here are the segments it must keep.
    pub fn heartbeat(&mut self, id: u64, stats: Option<HeartbeatStats>) -> Result<api::HeartbeatReply, PlaneError> {
        let b = self
            .bricks
            .get_mut(&id)
            .ok_or_else(|| PlaneError::NotFound(format!("brick {id} is not registered (register it first)")))?;
        b.last_seen = Instant::now();
        b.last_heartbeat_unix_ms = Some(now_unix_ms());
        if stats.is_some() {
            b.stats = stats;
        }
        let segments = b
            .segments
            .iter()
            .map(|(&id, &(offset, size_bytes))| LiveSegment { id, offset, size_bytes })
            .collect();
        if !b.up {
            b.up = true;
            let largest = b.extents.largest();
            self.index.update(id, None, largest);
            tracing::info!(brick = id, "brick is up again");
        }
        Ok(api::HeartbeatReply { segments })
    }

    /// Marks down the bricks whose last heartbeat is older than the brick timeout; returns
    /// their names.
    pub fn expire_bricks(&mut self, now: Instant) -> Vec<String> {
        let mut down = Vec::new();
        for (id, b) in &mut self.bricks {
            if b.up && now.saturating_duration_since(b.last_seen) > self.brick_timeout {
                b.up = false;
                self.index.remove(*id, b.extents.largest());
                down.push(b.rec.name.clone());
            }
        }
        down
    }

    fn undo(&mut self, log: Vec<Undo>) {
        for u in log.into_iter().rev() {
            match u {
                Undo::Carved { brick, offset, size } => {
                    let old = self.bricks.get(&brick).map(|b| b.extents.largest());
                    if let Some(b) = self.bricks.get_mut(&brick) {
                        b.extents.release(offset, size);
                    }
                    if let Some(old) = old {
                        self.set_largest(brick, old);
                    }
                }
                Undo::Reserved { links, bandwidth_bps } => self.graph.release(&links, bandwidth_bps),
            }
        }
    }

    /// Carves `stripe` segments on distinct bricks and reserves their paths; on failure,
    /// everything done is undone by the caller through `log`.
    fn place(
        &mut self,
        pl: &Placement<'_>,
        counters: &mut Counters,
        log: &mut Vec<Undo>,
    ) -> Result<Vec<SegmentRecord>, PlaneError> {
        let node_ports = self
            .nodes
            .get(&pl.node)
            .map(|n| n.rec.ports.clone())
            .ok_or_else(|| PlaneError::NotFound(format!("node {} is not registered", pl.node)))?;
        let mut used: HashSet<u64> = HashSet::new();
        let mut out = Vec::with_capacity(pl.stripe as usize);
        for i in 0..pl.stripe as usize {
            let (brick, path) = match pl.bricks {
                Some(list) => {
                    let id = list[i];
                    let b = self
                        .bricks
                        .get(&id)
                        .ok_or_else(|| PlaneError::NotFound(format!("brick {id} is not registered")))?;
                    if !b.up {
                        return Err(PlaneError::InsufficientCapacity(format!(
                            "brick {} ({id}) is down (no heartbeat for {:?})",
                            b.rec.name, self.brick_timeout
                        )));
                    }
                    if b.extents.largest() < pl.per_segment {
                        return Err(PlaneError::InsufficientCapacity(format!(
                            "brick {} ({id}) has no free extent of {} bytes (largest free: {}, free: {})",
                            b.rec.name,
                            pl.per_segment,
                            b.extents.largest(),
                            b.extents.free_bytes()
                        )));
                    }
                    let path = self
                        .graph
                        .find_path(&node_ports, &b.rec.ports, pl.bandwidth_bps, pl.allowed.as_ref())
                        .ok_or_else(|| {
                            PlaneError::InsufficientBandwidth(format!(
                                "no path from node {} to brick {} ({id}) with {} bytes/s unreserved on every link",
                                pl.node, b.rec.name, pl.bandwidth_bps
                            ))
                        })?;
                    (id, path)
                }
                None => {
                    let mut with_space = 0usize;
                    let mut found = None;
                    for id in self.index.candidates(pl.per_segment) {
                        if used.contains(&id) {
                            continue;
                        }
                        with_space += 1;
                        let Some(b) = self.bricks.get(&id) else { continue };
                        if let Some(path) =
                            self.graph
                                .find_path(&node_ports, &b.rec.ports, pl.bandwidth_bps, pl.allowed.as_ref())
                        {
                            found = Some((id, path));
                            break;
                        }
                    }
                    match found {
                        Some(f) => f,
                        None if with_space == 0 => {
                            return Err(PlaneError::InsufficientCapacity(format!(
                                "{} of {} up bricks have a free extent of {} bytes; the stripe needs {}",
                                i,
                                self.index.len(),
                                pl.per_segment,
                                pl.stripe
                            )))
                        }
                        None => {
                            return Err(PlaneError::InsufficientBandwidth(format!(
                                "{with_space} more up bricks have room for {} bytes but none has a path from node {} \
                                 with {} bytes/s unreserved on every link",
                                pl.per_segment, pl.node, pl.bandwidth_bps
                            )))
                        }
                    }
                }
            };
            if !used.insert(brick) {
                return Err(PlaneError::Invalid(format!(
                    "brick {brick} is named twice in the stripe"
                )));
            }
            let Some(b) = self.bricks.get_mut(&brick) else {
                return Err(PlaneError::NotFound(format!("brick {brick} is not registered")));
            };
            let old_largest = b.extents.largest();
            let offset = b.extents.carve(pl.per_segment).ok_or_else(|| {
                PlaneError::InsufficientCapacity(format!(
                    "brick {brick} has no free extent of {} bytes",
                    pl.per_segment
                ))
            })?;
            let key = b.key.clone();
            log.push(Undo::Carved {
                brick,
                offset,
                size: pl.per_segment,
            });
            self.set_largest(brick, old_largest);
            self.graph.reserve(&path, pl.bandwidth_bps);
            log.push(Undo::Reserved {
                links: path.clone(),
                bandwidth_bps: pl.bandwidth_bps,
            });
            counters.next_segment = counters.next_segment.max(1);
            let segment_id = counters.next_segment;
            counters.next_segment += 1;
            let issued = grant::issue(&key, segment_id, offset, pl.per_segment, pl.node, self.grant_expiry());
            out.push(SegmentRecord {
                brick_id: brick,
                segment_id,
                offset,
                size_bytes: pl.per_segment,
                bandwidth_bps: pl.bandwidth_bps,
                links: path,
                grant_hex: issued.grant_hex,
                session_key_hex: issued.session_key_hex,
            });
        }
        Ok(out)
    }

    fn per_segment(size_bytes: u64, stripe: u32) -> Result<u64, PlaneError> {
        align_up(size_bytes.div_ceil(u64::from(stripe))).ok_or_else(|| {
            PlaneError::Invalid(format!(
                "size {size_bytes} bytes cannot be represented in whole MiB segments"
            ))
        })
    }

    /// Places, commits (with `build` making the allocation record from the new segments) and
    /// undoes everything on failure.
    fn place_and_commit(
        &mut self,
        pl: &Placement<'_>,
        build: impl FnOnce(Vec<SegmentRecord>) -> AllocationRecord,
    ) -> Result<AllocationRecord, PlaneError> {
        let mut counters = self.counters;
        let mut log = Vec::new();
        let segments = match self.place(pl, &mut counters, &mut log) {
            Ok(s) => s,
            Err(e) => {
                self.undo(log);
                return Err(e);
            }
        };
        let rec = build(segments);
        let ops = [
            Op::Put(Record::Allocation(rec.clone())),
            Op::Put(Record::Counters(counters)),
        ];
        if let Err(e) = self.store.commit(&ops) {
            self.undo(log);
            return Err(e.into());
        }
        self.counters = counters;
        Ok(rec)
    }

    fn index_segments(&mut self, rec: &AllocationRecord) {
        for s in &rec.segments {
            if let Some(b) = self.bricks.get_mut(&s.brick_id) {
                b.segments.insert(s.segment_id, (s.offset, s.size_bytes));
            }
        }
    }

    /// `POST /v1/allocations`: [`ControlPlane::allocate_once`] without saying whether the
    /// allocation is new.
    pub fn allocate(&mut self, req: api::AllocationRequest) -> Result<api::Allocation, PlaneError> {
        self.allocate_once(req).map(|(a, _)| a)
    }

    /// `POST /v1/allocations`: a new allocation ([`Allocated::Created`]), or, for a request whose
    /// idempotency key already made a live allocation, that one ([`Allocated::Replayed`]).
    pub fn allocate_once(&mut self, req: api::AllocationRequest) -> Result<(api::Allocation, Allocated), PlaneError> {
        let request_sha256 = match &req.idempotency_key {
            None => None,
            Some(key) => {
                if !api::valid_token(key) {
                    return Err(PlaneError::Invalid(format!(
                        "idempotency_key must be 1 to {} characters of A-Z a-z 0-9 - _ . : (got {} bytes)",
                        api::MAX_IDEMPOTENCY_KEY_LEN,
                        key.len()
                    )));
                }
                let sha = request_digest(&req);
                if let Some(rec) = self.idempotency.get(key).and_then(|id| self.allocations.get(id)) {
                    if rec.request_sha256.as_deref() != Some(sha.as_str()) {
                        return Err(PlaneError::Conflict(format!(
                            "idempotency key {key:?} already made allocation {} from a different request; \
                             use a fresh key for a new request",
                            rec.id
                        )));
                    }
                    return Ok((self.allocation_view(rec), Allocated::Replayed));
                }
                Some(sha)
            }
        };
        if let Some(h) = &req.holder {
            if !api::valid_token(&h.agent) {
                return Err(PlaneError::Invalid(format!(
                    "holder.agent must be 1 to {} characters of A-Z a-z 0-9 - _ . :",
                    api::MAX_IDEMPOTENCY_KEY_LEN
                )));
            }
        }
        if !self.nodes.contains_key(&req.node) {
            return Err(PlaneError::NotFound(format!("node {} is not registered", req.node)));
        }
        if req.size_bytes == 0 {
            return Err(PlaneError::Invalid("size_bytes must be positive".to_string()));
        }
        let stripe = match (&req.bricks, req.stripe) {
            (Some(b), Some(s)) if b.len() != s as usize => {
                return Err(PlaneError::Invalid(format!(
                    "stripe {s} but {} bricks named: give one or make them agree",
                    b.len()
                )))
            }
            (Some(b), _) => u32::try_from(b.len()).unwrap_or(u32::MAX),
            (None, s) => s.unwrap_or(1),
        };
        if stripe == 0 || stripe > MAX_STRIPE {
            return Err(PlaneError::Invalid(format!(
                "stripe must be 1 to {MAX_STRIPE}, not {stripe}"
            )));
        }
        if let Some(list) = &req.bricks {
            let distinct: HashSet<&u64> = list.iter().collect();
            if distinct.len() != list.len() {
                return Err(PlaneError::Invalid("a brick is named twice in `bricks`".to_string()));
            }
            for id in list {
                if !self.bricks.contains_key(id) {
                    return Err(PlaneError::NotFound(format!("brick {id} is not registered")));
                }
            }
        }
        let per_segment = Self::per_segment(req.size_bytes, stripe)?;
        let usable: u64 = self
            .bricks
            .values()
            .map(|b| b.extents.usable_bytes())
            .max()
            .unwrap_or(0);
        if per_segment > usable {
            return Err(PlaneError::InsufficientCapacity(format!(
                "each of the {stripe} segments would need {per_segment} bytes; the largest brick lends {usable}"
            )));
        }
        let bandwidth_bps = req.bandwidth_bps.unwrap_or(0);
        let id = self.counters.next_allocation.max(1);
        let pl = Placement {
            node: req.node,
            per_segment,
            stripe,
            bandwidth_bps,
            bricks: req.bricks.as_deref(),
            allowed: req.links.as_ref().map(|l| l.iter().cloned().collect()),
        };
        let links = req.links.clone();
        let mut counters_after = self.counters;
        counters_after.next_allocation = id + 1;
        let rec = {
            // The allocation counter moves with the same batch as the segments.
            let saved = self.counters;
            self.counters = counters_after;
            let r = self.place_and_commit(&pl, |segments| AllocationRecord {
                id,
                node: req.node,
                size_bytes: req.size_bytes,
                stripe,
                bandwidth_bps,
                links,
                segments,
                created_unix_ms: now_unix_ms(),
                idempotency_key: req.idempotency_key.clone(),
                request_sha256,
                holder: req.holder.clone(),
            });
            if r.is_err() {
                self.counters = saved;
            }
            r?
        };
        self.index_segments(&rec);
        if let Some(n) = self.nodes.get_mut(&rec.node) {
            n.allocations.insert(id);
        }
        if let Some(k) = &rec.idempotency_key {
            self.idempotency.insert(k.clone(), id);
        }
        let view = self.allocation_view(&rec);
        self.allocations.insert(id, rec);
        Ok((view, Allocated::Created))
    }

    /// `PATCH /v1/allocations/{id}`.
    pub fn resize(&mut self, id: u64, size_bytes: u64) -> Result<api::Allocation, PlaneError> {
        let cur = self
            .allocations
            .get(&id)
            .cloned()
            .ok_or_else(|| PlaneError::NotFound(format!("allocation {id} does not exist")))?;
        if size_bytes == 0 {
            return Err(PlaneError::Invalid(
                "size_bytes must be positive (DELETE the allocation to release it)".to_string(),
            ));
        }
        let covered: u64 = cur.segments.iter().map(|s| s.size_bytes).sum();
        if size_bytes > covered {
            let per_segment = Self::per_segment(size_bytes - covered, cur.stripe)?;
            let pl = Placement {
                node: cur.node,
                per_segment,
                stripe: cur.stripe,
                bandwidth_bps: cur.bandwidth_bps,
                bricks: None,
                allowed: cur.links.as_ref().map(|l| l.iter().cloned().collect()),
            };
            let base = cur.clone();
            let rec = self.place_and_commit(&pl, move |segments| {
                let mut r = base;
                r.size_bytes = size_bytes;
                r.segments.extend(segments);
                r
            })?;
            self.index_segments(&rec);
            let view = self.allocation_view(&rec);
            self.allocations.insert(id, rec);
            return Ok(view);
        }
        let mut rec = cur;
        let mut dropped = Vec::new();
        let mut left = covered;
        while rec.segments.len() > 1 {
            let Some(last) = rec.segments.last() else { break };
            if left - last.size_bytes < size_bytes {
                break;
            }
            left -= last.size_bytes;
            if let Some(s) = rec.segments.pop() {
                dropped.push(s);
            }
        }
        rec.size_bytes = size_bytes;
        self.store.commit(&[Op::Put(Record::Allocation(rec.clone()))])?;
        for s in &dropped {
            self.release_segment(s);
        }
        let view = self.allocation_view(&rec);
        self.allocations.insert(id, rec);
        Ok(view)
    }

    fn release_segment(&mut self, s: &SegmentRecord) {
        self.graph.release(&s.links, s.bandwidth_bps);
        let Some(b) = self.bricks.get_mut(&s.brick_id) else {
            return;
        };
        let old = b.extents.largest();
        b.segments.remove(&s.segment_id);
        if !b.extents.release(s.offset, s.size_bytes) {
            tracing::error!(
                brick = s.brick_id,
                segment = s.segment_id,
                "released segment was already free: the extent map is inconsistent"
            );
        }
        self.set_largest(s.brick_id, old);
    }

    /// `DELETE /v1/allocations/{id}`.
    pub fn free(&mut self, id: u64) -> Result<api::Released, PlaneError> {
        if !self.allocations.contains_key(&id) {
            return Err(PlaneError::NotFound(format!("allocation {id} does not exist")));
        }
        self.store.commit(&[Op::Delete(Key::Allocation(id))])?;
        let Some(rec) = self.allocations.remove(&id) else {
            return Err(PlaneError::NotFound(format!("allocation {id} does not exist")));
        };
        for s in &rec.segments {
            self.release_segment(s);
        }
        if let Some(n) = self.nodes.get_mut(&rec.node) {
            n.allocations.remove(&id);
        }
        if let Some(k) = &rec.idempotency_key {
            self.idempotency.remove(k);
        }
        Ok(api::Released {
            id,
            extents: rec
                .segments
                .iter()
                .map(|s| api::ReleasedExtent {
                    brick_id: s.brick_id,
                    segment_id: s.segment_id,
                    offset: s.offset,
                    size_bytes: s.size_bytes,
                })
                .collect(),
        })
    }

    fn allocation_view(&self, a: &AllocationRecord) -> api::Allocation {
        api::Allocation {
            id: a.id,
            node: a.node,
            size_bytes: a.size_bytes,
            stripe: a.stripe,
            bandwidth_bps: a.bandwidth_bps,
            created_unix_ms: a.created_unix_ms,
            idempotency_key: a.idempotency_key.clone(),
            holder: a.holder.clone(),
            segments: a
                .segments
                .iter()
                .map(|s| api::Segment {
                    brick_id: s.brick_id,
                    brick_address: self
                        .bricks
                        .get(&s.brick_id)
                        .map(|b| b.rec.address.clone())
                        .unwrap_or_default(),
                    segment_id: s.segment_id,
                    offset: s.offset,
                    size_bytes: s.size_bytes,
                    grant_hex: s.grant_hex.clone(),
                    session_key_hex: s.session_key_hex.clone(),
                    grant_expires_unix_s: grant_expiry_of(&s.grant_hex),
                    bandwidth_bps: s.bandwidth_bps,
                    rate_limit_bps: self.graph.rate_limit(&s.links, s.bandwidth_bps),
                    links: s.links.clone(),
                })
                .collect(),
        }
    }

    /// `GET /v1/allocations/{id}`.
    pub fn allocation(&self, id: u64) -> Result<api::Allocation, PlaneError> {
        self.allocations
            .get(&id)
            .map(|a| self.allocation_view(a))
            .ok_or_else(|| PlaneError::NotFound(format!("allocation {id} does not exist")))
    }

    /// `GET /v1/allocations` (optionally of one node).
    pub fn allocations(&self, node: Option<u64>) -> Vec<api::Allocation> {
        self.allocations
            .values()
            .filter(|a| node.is_none_or(|n| a.node == n))
            .map(|a| self.allocation_view(a))
            .collect()
    }

    fn brick_view(&self, b: &BrickEntry) -> api::Brick {
        api::Brick {
            id: b.rec.id,
            name: b.rec.name.clone(),
            address: b.rec.address.clone(),
            capacity_bytes: b.rec.capacity_bytes,
            free_bytes: b.extents.free_bytes(),
            largest_free_bytes: b.extents.largest(),
            segments: b.segments.len() as u64,
            ports: b.rec.ports.clone(),
            state: if b.up { BrickState::Up } else { BrickState::Down },
            last_heartbeat_unix_ms: b.last_heartbeat_unix_ms,
            stats: b.stats.clone(),
        }
    }

    /// `GET /v1/bricks/{id}`.
    pub fn brick(&self, id: u64) -> Result<api::Brick, PlaneError> {
        self.bricks
            .get(&id)
            .map(|b| self.brick_view(b))
            .ok_or_else(|| PlaneError::NotFound(format!("brick {id} is not registered")))
    }

    /// `GET /v1/bricks`, by id.
    pub fn bricks(&self) -> Vec<api::Brick> {
        let mut v: Vec<_> = self.bricks.values().map(|b| self.brick_view(b)).collect();
        v.sort_by_key(|b| b.id);
        v
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

    /// `GET /v1/graph`.
    pub fn graph(&self) -> api::Graph {
        api::Graph {
            nodes: self.nodes(),
            bricks: self.bricks(),
            switches: self.graph.switches(),
            links: self.graph.links(),
        }
    }

    /// Counts for `/metrics`.
    pub fn gauges(&self) -> Gauges {
        let mut g = Gauges {
            allocations: self.allocations.len() as u64,
            nodes: self.nodes.len() as u64,
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
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AllocationRequest, BrickRegistration, NodeRegistration, PortSpec};
    use crate::store::MemoryStore;

    const M: u64 = EXTENT_ALIGN;

    #[test]
    fn brick_addresses_of_every_transport_are_accepted() {
        for ok in ["tcp://mem1:7070", "tls://mem1.example:7070", "unix:/run/b.sock"] {
            assert!(check_address(ok).is_ok(), "{ok}");
        }
        for bad in ["tls://", "tcp://", "unix:", "http://mem1:7070", "mem1:7070"] {
            assert!(check_address(bad).is_err(), "{bad}");
        }
    }

    fn plane() -> ControlPlane {
        ControlPlane::open(
            Box::new(MemoryStore::default()),
            None,
            Duration::from_secs(10),
            Duration::from_secs(1),
        )
        .unwrap()
    }

    fn port(bw: u64) -> Vec<PortSpec> {
        vec![PortSpec {
            name: "p0".into(),
            bandwidth_bps: bw,
            switch: None,
        }]
    }

    fn brick(p: &mut ControlPlane, name: &str, cap: u64) -> u64 {
        p.register_brick(BrickRegistration {
            name: name.into(),
            address: format!("tcp://{name}:7070"),
            capacity_bytes: cap,
            ports: port(1000),
            key_hex: hex::encode([7u8; 32]),
        })
        .unwrap()
        .id
    }

    #[test]
    fn failed_stripe_leaves_nothing_reserved() {
        let mut p = plane();
        let b1 = brick(&mut p, "b1", 8 * M);
        brick(&mut p, "b2", 2 * M);
        let n = p
            .register_node(NodeRegistration {
                name: "n".into(),
                ports: port(1000),
            })
            .unwrap()
            .id;
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
        brick(&mut p, "b1", 8 * M);
        brick(&mut p, "b2", 8 * M);
        let n = p
            .register_node(NodeRegistration {
                name: "n".into(),
                ports: port(1000),
            })
            .unwrap()
            .id;
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
}
