//! Where the control plane's state lives between restarts.
//!
//! The control plane keeps its whole state in memory and writes every change through a
//! [`Store`] as one atomic batch of typed records ([`Op::Put`] / [`Op::Delete`]) before it
//! answers. At start it reads everything back with [`Store::load`]. A backend only needs a
//! key-value map with atomic multi-key writes: [`Key::path`] names each record
//! (`bricks/12`, `allocations/7`, `meta/counters`) and the record bodies are JSON
//! ([`Record::to_json`]). SQLite ([`sqlite::SqliteStore`]) is the default; etcd
//! ([`etcd::EtcdStore`], cargo feature `etcd`) lets several control planes share the state, one
//! of them the leader at a time ([`Leadership`]).
//!
//! Brick liveness is never stored: after a restart every brick counts as up until its
//! heartbeat timeout passes.

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod sqlite;

use crate::api::Port;
use serde::{Deserialize, Serialize};
use std::sync::{Mutex, MutexGuard};

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store URL is not understood.
    #[error("store {0:?} is not understood: use sqlite:PATH (or etcd:URL[,URL...] with the etcd feature)")]
    BadUrl(String),
    /// The backend failed (I/O, database, network).
    #[error("store {store}: {message}")]
    Backend {
        /// Which store (`sqlite:PATH`).
        store: String,
        /// What failed.
        message: String,
    },
    /// This control plane does not lead the replicas sharing the store (or has not yet reloaded
    /// the state since it became leader): it must not change the state.
    #[error("store {store}: this control plane is not the leader{}", leader.as_ref().map(|l| format!(" (the leader is {l})")).unwrap_or_default())]
    NotLeader {
        /// Which store.
        store: String,
        /// The leader's advertised URL, when known.
        leader: Option<String>,
    },
    /// A file or directory of the store is open to other users (it holds every brick's grant
    /// key in clear), or is not owned by this user: refused, as ssh refuses a readable key.
    #[error("store {store}: {path} {problem}; it holds every brick's grant key in clear. Fix: {fix}")]
    Exposed {
        /// Which store.
        store: String,
        /// The file or directory.
        path: String,
        /// What is wrong (its mode or owner).
        problem: String,
        /// The command that fixes it.
        fix: String,
    },
    /// A stored record cannot be read back.
    #[error("store {store}: record {key} is corrupt: {message}")]
    Corrupt {
        /// Which store.
        store: String,
        /// The record's key path.
        key: String,
        /// Why.
        message: String,
    },
}

/// A registered brick, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrickRecord {
    /// Id.
    pub id: u64,
    /// Unique name.
    pub name: String,
    /// Where nodes reach it.
    pub address: String,
    /// Size of its pool.
    pub capacity_bytes: u64,
    /// Its ports, cabled.
    pub ports: Vec<Port>,
    /// Hex of its grant key.
    pub key_hex: String,
    /// What its memory can serve (bytes/s), as registered or as an operator set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve_bps: Option<u64>,
    /// `serve_bps` was set by an operator: kept when the brick registers again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub serve_rate_by_operator: bool,
    /// An operator is draining it (`rackmem ctl drain`): no new segments are placed on it;
    /// kept when the brick registers again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
}

/// A registered node, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Id.
    pub id: u64,
    /// Unique name.
    pub name: String,
    /// Its ports, cabled.
    pub ports: Vec<Port>,
    /// The most bytes its allocations may hold, set for this node by an admin (`None`: the
    /// control plane's default, `rackmem control --node-quota`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_bytes: Option<u64>,
}

/// A switch created on demand by a registration (the topology file's switches are read anew).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchRecord {
    /// Name.
    pub name: String,
}

/// One segment of an allocation, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRecord {
    /// Brick.
    pub brick_id: u64,
    /// Segment id.
    pub segment_id: u64,
    /// Start in the brick's pool.
    pub offset: u64,
    /// Size.
    pub size_bytes: u64,
    /// Reserved bandwidth on its path (0: none).
    pub bandwidth_bps: u64,
    /// Link ids of its path.
    pub links: Vec<String>,
    /// Encoded grant, hex.
    pub grant_hex: String,
    /// Session key, hex.
    pub session_key_hex: String,
}

/// An allocation, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationRecord {
    /// Id.
    pub id: u64,
    /// Node.
    pub node: u64,
    /// Size asked for.
    pub size_bytes: u64,
    /// Stripe width.
    pub stripe: u32,
    /// Bandwidth reserved per segment.
    pub bandwidth_bps: u64,
    /// Links paths may use (none: any).
    pub links: Option<Vec<String>>,
    /// Segments in window order.
    pub segments: Vec<SegmentRecord>,
    /// Creation time.
    pub created_unix_ms: u64,
    /// The request's idempotency key (absent in records written before keys existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// SHA-256 (hex) of the request without its key: a retry must send the same body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_sha256: Option<String>,
    /// Who holds it on its node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<crate::api::Holder>,
    /// True when its paths are a circuit (their ports and switch links are its alone).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub circuit: bool,
    /// Set when it is a named segment's memory (`/v1/segments`): its name, owner and holders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub named: Option<Box<NamedRecord>>,
}

/// What makes an allocation a named segment: stored with it, so a restarted control plane (or
/// another replica) knows the name and who holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedRecord {
    /// The name (global; see `api::SegmentOpen`).
    pub name: String,
    /// The user it belongs to.
    pub uid: u32,
    /// Who holds it now.
    pub holders: Vec<crate::api::NamedHolder>,
}

/// An API token, as stored: only the SHA-256 of its secret, never the secret itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Id (the number in `rmk_ID_SECRET`).
    pub id: u64,
    /// What it may do: `admin`, `node` or `brick`.
    pub role: crate::api::Role,
    /// The node or brick it speaks for (for admins: a label).
    pub name: String,
    /// Hex of SHA-256 of the secret part.
    pub hash_hex: String,
    /// Creation time.
    pub created_unix_ms: u64,
}

/// The id counters; ids are never reused, segment ids above all (a brick must never mistake a
/// new grant for a segment it still holds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Next brick id.
    pub next_brick: u64,
    /// Next node id.
    pub next_node: u64,
    /// Next allocation id.
    pub next_allocation: u64,
    /// Next segment id.
    pub next_segment: u64,
    /// Next token id (absent in stores written before tokens existed).
    #[serde(default)]
    pub next_token: u64,
}

/// A typed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A brick.
    Brick(BrickRecord),
    /// A node.
    Node(NodeRecord),
    /// A switch.
    Switch(SwitchRecord),
    /// An allocation.
    Allocation(AllocationRecord),
    /// The id counters (one record).
    Counters(Counters),
    /// An API token.
    Token(TokenRecord),
}

/// The key of a record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    /// A brick by id.
    Brick(u64),
    /// A node by id.
    Node(u64),
    /// A switch by name.
    Switch(String),
    /// An allocation by id.
    Allocation(u64),
    /// The id counters.
    Counters,
    /// A token by id.
    Token(u64),
}

impl Key {
    /// The record kind: `bricks`, `nodes`, `switches`, `allocations`, `meta`.
    pub fn kind(&self) -> &'static str {
        match self {
            Key::Brick(_) => "bricks",
            Key::Node(_) => "nodes",
            Key::Switch(_) => "switches",
            Key::Allocation(_) => "allocations",
            Key::Counters => "meta",
            Key::Token(_) => "tokens",
        }
    }

    /// The name within the kind (an id, a switch name, `counters`).
    pub fn name(&self) -> String {
        match self {
            Key::Brick(i) | Key::Node(i) | Key::Allocation(i) | Key::Token(i) => i.to_string(),
            Key::Switch(s) => s.clone(),
            Key::Counters => "counters".to_string(),
        }
    }

    /// `KIND/NAME`, e.g. `allocations/7`: a key for key-value backends.
    pub fn path(&self) -> String {
        format!("{}/{}", self.kind(), self.name())
    }
}

impl Record {
    /// The record's key.
    pub fn key(&self) -> Key {
        match self {
            Record::Brick(b) => Key::Brick(b.id),
            Record::Node(n) => Key::Node(n.id),
            Record::Switch(s) => Key::Switch(s.name.clone()),
            Record::Allocation(a) => Key::Allocation(a.id),
            Record::Counters(_) => Key::Counters,
            Record::Token(t) => Key::Token(t.id),
        }
    }

    /// The body, JSON.
    pub fn to_json(&self) -> String {
        let r = match self {
            Record::Brick(b) => serde_json::to_string(b),
            Record::Node(n) => serde_json::to_string(n),
            Record::Switch(s) => serde_json::to_string(s),
            Record::Allocation(a) => serde_json::to_string(a),
            Record::Counters(c) => serde_json::to_string(c),
            Record::Token(t) => serde_json::to_string(t),
        };
        // These types serialize plain fields only: serde_json cannot fail on them.
        r.unwrap_or_else(|e| unreachable!("record serialization failed: {e}"))
    }

    /// Reads a body back, given the kind of its key (`bricks`, ...).
    pub fn from_json(kind: &str, body: &str) -> Result<Record, String> {
        let e = |e: serde_json::Error| e.to_string();
        Ok(match kind {
            "bricks" => Record::Brick(serde_json::from_str(body).map_err(e)?),
            "nodes" => Record::Node(serde_json::from_str(body).map_err(e)?),
            "switches" => Record::Switch(serde_json::from_str(body).map_err(e)?),
            "allocations" => Record::Allocation(serde_json::from_str(body).map_err(e)?),
            "meta" => Record::Counters(serde_json::from_str(body).map_err(e)?),
            "tokens" => Record::Token(serde_json::from_str(body).map_err(e)?),
            other => return Err(format!("unknown record kind {other:?}")),
        })
    }
}

/// One change of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Insert or replace a record.
    Put(Record),
    /// Remove a record (absent: no error).
    Delete(Key),
}

/// Everything a store holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Bricks.
    pub bricks: Vec<BrickRecord>,
    /// Nodes.
    pub nodes: Vec<NodeRecord>,
    /// Switches created on demand.
    pub switches: Vec<SwitchRecord>,
    /// Allocations.
    pub allocations: Vec<AllocationRecord>,
    /// Id counters (zero on a new store).
    pub counters: Counters,
    /// API tokens.
    pub tokens: Vec<TokenRecord>,
}

impl Snapshot {
    /// Files a record into the snapshot (for backends that read records one by one).
    pub fn add(&mut self, r: Record) {
        match r {
            Record::Brick(b) => self.bricks.push(b),
            Record::Node(n) => self.nodes.push(n),
            Record::Switch(s) => self.switches.push(s),
            Record::Allocation(a) => self.allocations.push(a),
            Record::Counters(c) => self.counters = c,
            Record::Token(t) => self.tokens.push(t),
        }
    }
}

/// Durable state of the control plane.
///
/// The control plane calls the store from one thread at a time, with its state locked: a
/// backend needs no locking of its own. `commit` must apply all of `ops` or none, and must
/// return only once the batch is durable (the control plane answers the request right after).
pub trait Store: Send + 'static {
    /// What to show users: `sqlite:PATH`, `etcd:URL,...`.
    fn describe(&self) -> String;
    /// Reads the whole state.
    fn load(&mut self) -> Result<Snapshot, StoreError>;
    /// Applies a batch atomically.
    fn commit(&mut self, ops: &[Op]) -> Result<(), StoreError>;
    /// Joins the election among the control planes sharing this store, advertising
    /// `advertise` (the URL clients reach this control plane at). From then on `commit` writes
    /// only while the returned [`Leadership`] says this control plane leads and has reloaded
    /// the state. `None`: the store is not shared (SQLite, memory); this control plane always
    /// leads.
    fn start_election(&mut self, advertise: &str) -> Result<Option<std::sync::Arc<Leadership>>, StoreError> {
        let _ = advertise;
        Ok(None)
    }
}

/// The role of a control plane among those sharing a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// It serves every request.
    Leader,
    /// It refuses the API (clients move on to the leader).
    Follower,
}

/// What a control plane knows about the election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderState {
    /// Its role.
    pub role: Role,
    /// The leader's advertised URL, when known (its own when it leads).
    pub leader: Option<String>,
    /// The fencing token of the leadership it holds (etcd: the creation revision of the leader
    /// key); 0 when it does not lead.
    pub term: i64,
    /// The term whose state the control plane has loaded; it serves only when equal to `term`.
    pub synced_term: i64,
}

/// The election state shared by a store (which fences its commits with it), the task that
/// campaigns and the server (which reloads the state when this control plane becomes leader and
/// refuses requests while it does not lead).
#[derive(Debug)]
pub struct Leadership {
    state: Mutex<LeaderState>,
}

impl Leadership {
    /// A control plane alone on its store: always the leader, always in sync.
    pub fn single() -> Leadership {
        Leadership {
            state: Mutex::new(LeaderState {
                role: Role::Leader,
                leader: None,
                term: 1,
                synced_term: 1,
            }),
        }
    }

    /// A replica that has not won an election yet.
    pub fn follower() -> Leadership {
        Leadership {
            state: Mutex::new(LeaderState {
                role: Role::Follower,
                leader: None,
                term: 0,
                synced_term: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LeaderState> {
        // Every update below leaves the state whole: a panic elsewhere cannot corrupt it.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A copy of the state.
    pub fn status(&self) -> LeaderState {
        self.lock().clone()
    }

    /// True when this control plane leads and has loaded the state of its term: it may serve.
    pub fn serving(&self) -> bool {
        let s = self.lock();
        s.role == Role::Leader && s.term != 0 && s.synced_term == s.term
    }

    /// The term to fence a commit with, when this control plane may write.
    pub fn fence(&self) -> Option<i64> {
        let s = self.lock();
        (s.role == Role::Leader && s.term != 0 && s.synced_term == s.term).then_some(s.term)
    }

    /// The leader's URL, when known.
    pub fn leader(&self) -> Option<String> {
        self.lock().leader.clone()
    }

    /// This control plane won term `term` (a new term needs a reload before serving).
    pub fn won(&self, term: i64, advertise: &str) {
        let mut s = self.lock();
        if s.role != Role::Leader || s.term != term {
            tracing::info!(term, "this control plane is now the leader; reloading the state");
        }
        s.role = Role::Leader;
        s.term = term;
        s.leader = Some(advertise.to_string());
    }

    /// Another control plane leads (`leader`, when known), or nobody does.
    pub fn lost(&self, leader: Option<String>) {
        let mut s = self.lock();
        if s.role == Role::Leader {
            tracing::warn!(leader = ?leader, "this control plane is no longer the leader");
        }
        s.role = Role::Follower;
        s.term = 0;
        s.synced_term = 0;
        s.leader = leader;
    }

    /// This control plane stops and gives up its leadership (its lease is revoked).
    pub fn resign(&self) {
        let mut s = self.lock();
        if s.role == Role::Leader {
            tracing::info!(term = s.term, "stopping: leadership given up");
        }
        s.role = Role::Follower;
        s.term = 0;
        s.synced_term = 0;
        s.leader = None;
    }

    /// The state of term `term` is loaded (ignored if the term changed meanwhile).
    pub fn synced(&self, term: i64) {
        let mut s = self.lock();
        if s.term == term {
            s.synced_term = term;
        }
    }

    /// The store may hold changes the in-memory state lacks (a commit whose outcome is unknown):
    /// reload before serving again.
    pub fn stale(&self) {
        self.lock().synced_term = 0;
    }
}

/// Opens a store by URL: `sqlite:PATH` (created if absent) or, with the cargo feature `etcd`,
/// `etcd:URL[,URL...]`.
pub fn open(url: &str) -> Result<Box<dyn Store>, StoreError> {
    if let Some(path) = url.strip_prefix("sqlite:") {
        if path.is_empty() {
            return Err(StoreError::BadUrl(url.to_string()));
        }
        return Ok(Box::new(sqlite::SqliteStore::open(std::path::Path::new(path))?));
    }
    #[cfg(feature = "etcd")]
    if url.starts_with("etcd:") {
        return Ok(Box::new(etcd::EtcdStore::open(url)?));
    }
    #[cfg(not(feature = "etcd"))]
    if url.starts_with("etcd:") {
        return Err(StoreError::Backend {
            store: url.to_string(),
            message: "the etcd store is not built into this binary (cargo feature `etcd`)".to_string(),
        });
    }
    Err(StoreError::BadUrl(url.to_string()))
}

/// A store in memory only, for tests and for trying the control plane out.
#[derive(Debug, Default)]
pub struct MemoryStore {
    records: std::collections::BTreeMap<String, (String, String)>,
}

impl Store for MemoryStore {
    fn describe(&self) -> String {
        "memory".to_string()
    }

    fn load(&mut self) -> Result<Snapshot, StoreError> {
        let mut s = Snapshot::default();
        for (path, (kind, body)) in &self.records {
            s.add(Record::from_json(kind, body).map_err(|message| StoreError::Corrupt {
                store: self.describe(),
                key: path.clone(),
                message,
            })?);
        }
        Ok(s)
    }

    fn commit(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        for op in ops {
            match op {
                Op::Put(r) => {
                    let k = r.key();
                    self.records.insert(k.path(), (k.kind().to_string(), r.to_json()));
                }
                Op::Delete(k) => {
                    self.records.remove(&k.path());
                }
            }
        }
        Ok(())
    }
}
