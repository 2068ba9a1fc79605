//! The types of the REST API, shared by the server, the client and the OpenAPI document.
//!
//! Every body is JSON. Sizes are in bytes (`*_bytes`), bandwidths in bytes per second (`*_bps`),
//! times in milliseconds since the Unix epoch (`*_unix_ms`). Grants and keys travel as hex.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The name of the switch every port attaches to when neither its registration nor the topology
/// file names one.
pub const DEFAULT_SWITCH: &str = "rack";

/// A port as a brick or a node declares it when it registers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PortSpec {
    /// Name, unique on its brick or node (`p0`, `eth1`).
    pub name: String,
    /// What the port carries, in bytes per second.
    pub bandwidth_bps: u64,
    /// The switch the port is cabled to; when absent, the topology file decides, else `rack`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch: Option<String>,
}

/// A port once the control plane has attached it to a switch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Port {
    /// Name, unique on its brick or node.
    pub name: String,
    /// What the port carries, in bytes per second.
    pub bandwidth_bps: u64,
    /// The switch the port is cabled to.
    pub switch: String,
    /// Id of the link between this port and its switch (see `GET /v1/graph`).
    pub link: String,
}

/// Whether a brick answers its heartbeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BrickState {
    /// Heartbeats arrive: new segments may be placed on it.
    Up,
    /// No heartbeat for longer than the brick timeout: no new segments go there.
    Down,
}

/// `POST /v1/bricks`: a brick announces itself. Re-registering the same name returns the same id
/// and replaces address, capacity, ports and key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BrickRegistration {
    /// Unique name of the brick.
    pub name: String,
    /// Where nodes reach it: `tcp://HOST:PORT`, `tls://HOST:PORT` or `unix:PATH`.
    pub address: String,
    /// Size of the pool it lends.
    pub capacity_bytes: u64,
    /// Its ports (at least one).
    pub ports: Vec<PortSpec>,
    /// Hex of the exact bytes the brick signs grants with (its grant key).
    pub key_hex: String,
    /// What its memory can serve, in bytes/s (READ and WRITE together): measured by the brick
    /// at start, or declared by its operator. The control plane sets the segments' rates so
    /// that they add up to at most this; absent, only the ports bound them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve_bps: Option<u64>,
}

/// Reply to a brick registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BrickRegistered {
    /// The brick's id, stable across re-registrations of the same name.
    pub id: u64,
    /// How often the control plane expects a heartbeat.
    pub heartbeat_interval_ms: u64,
    /// After how long without a heartbeat the brick is marked down.
    pub brick_timeout_ms: u64,
}

/// A brick as the control plane sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Brick {
    /// Id.
    pub id: u64,
    /// Unique name.
    pub name: String,
    /// Where nodes reach it.
    pub address: String,
    /// Size of its pool.
    pub capacity_bytes: u64,
    /// Bytes not in any segment (whole MiB only are ever handed out).
    pub free_bytes: u64,
    /// The largest free extent: the largest segment that could still be placed here.
    pub largest_free_bytes: u64,
    /// Live segments on it.
    pub segments: u64,
    /// Its ports.
    pub ports: Vec<Port>,
    /// Up or down.
    pub state: BrickState,
    /// When the last heartbeat arrived (absent: none since this control plane started).
    pub last_heartbeat_unix_ms: Option<u64>,
    /// What the brick reported in its last heartbeat.
    pub stats: Option<HeartbeatStats>,
    /// What its memory can serve (bytes/s), as registered; absent: not bounded but by its ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve_bps: Option<u64>,
    /// True when an operator set `serve_bps` (`rackmem ctl bricks rate`): the brick's own
    /// figure at its next registration does not replace it.
    #[serde(default)]
    pub serve_rate_by_operator: bool,
    /// The rates the control plane set for its segments now, added up (bytes/s): at most
    /// `serve_bps`.
    #[serde(default)]
    pub promised_bps: u64,
    /// Its load: bytes/s it served between its last two heartbeats that reported
    /// `bytes_served` (absent: not known yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_bps: Option<u64>,
    /// The power it draws, as the topology file declares it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<BrickPower>,
    /// An operator is draining it (`PUT /v1/bricks/{id}/drain`): no new segments are placed
    /// on it.
    #[serde(default)]
    pub draining: bool,
    /// Draining and holding no segment: it can be retired.
    #[serde(default)]
    pub drained: bool,
    /// Names of the named segments on it (`rackmem_seg_open`), sorted. A drain moves them as
    /// the control plane's own moves (`docs/migration.md`, "Named segments"), not through the
    /// nodes' agents: their holders on several nodes follow by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub named_segments: Vec<String>,
    /// Those of them being moved off it now, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub named_moving: Vec<String>,
    /// Those of them whose last move failed or cannot start, each as `name: why`, sorted; a
    /// failed move is tried again after a while ([`NAMED_MOVE_RETRY_S`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub named_waiting: Vec<String>,
}

/// Seconds after which the control plane tries again a named segment's move that failed.
pub const NAMED_MOVE_RETRY_S: u64 = 10;

/// A segment a brick was asked to freeze and cannot, and why (a heartbeat's report).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Unmovable {
    /// The segment.
    pub segment_id: u64,
    /// Why (a process on the brick's host maps it).
    pub why: String,
}

/// A pull the control plane ordered that ended on its target brick (a heartbeat's report).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PullEnded {
    /// The target segment.
    pub segment_id: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Why it failed; absent: the target holds the whole source segment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A heartbeat reply's order to a target brick: pull source segment into target segment
/// `segment_id`, whole (`docs/migration.md`, "Named segments").
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MovePull {
    /// The target segment (created here from `grant_hex` if the brick has not seen it).
    pub segment_id: u64,
    /// The target segment's grant, signed with this brick's key.
    pub grant_hex: String,
    /// The source brick's address.
    pub source: String,
    /// The pull grant (the source segment's grant and its whole range, signed with its
    /// session key), as `PullGrant::encode` writes it.
    pub pull_grant_hex: String,
    /// The pull key the target proves to the source.
    pub pull_key_hex: String,
}

// Hand-written so the pull key never lands in a log.
impl std::fmt::Debug for MovePull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MovePull")
            .field("segment_id", &self.segment_id)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// Body of `PUT /v1/bricks/{id}/heartbeat` (may be empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HeartbeatStats {
    /// Bytes of the pool the brick has backed with memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident_bytes: Option<u64>,
    /// Segments the brick holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments: Option<u64>,
    /// Bytes read and written since the brick started (its load is this counter's rate between
    /// two heartbeats).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_served: Option<u64>,
    /// Connections open now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<u64>,
    /// Requests the brick held back to keep a segment or itself within its rate, since it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_delayed: Option<u64>,
    /// The total rate the brick enforces now (bytes/s; 0: unpaced): its own `--serve-rate`
    /// until a heartbeat reply carries the control plane's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforced_serve_bps: Option<u64>,
    /// Segments frozen now for a move (their node requests answered `Moving` or `Moved`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frozen: Vec<u64>,
    /// Segments a reply asked to freeze that the brick cannot freeze.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmovable: Vec<Unmovable>,
    /// Pulls ordered by replies that ended (reported until the replies stop listing them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pulls_ended: Vec<PullEnded>,
}

/// One segment the control plane believes lives on a brick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LiveSegment {
    /// Segment id (as in its grant).
    pub id: u64,
    /// Where it starts in the brick's pool.
    pub offset: u64,
    /// Its size.
    pub size_bytes: u64,
    /// The rate the brick is to serve it at, bytes/s (absent or 0: unpaced but for the brick's
    /// total); it changes as segments come and go on the same links and bricks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_bps: Option<u64>,
}

/// Reply to a heartbeat: every segment that must stay; the brick releases the others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HeartbeatReply {
    /// Live segments on this brick, by id.
    pub segments: Vec<LiveSegment>,
    /// The total rate the brick is to enforce (bytes/s; 0: unpaced): what it registered, or
    /// what an operator set since (`PUT /v1/bricks/{id}/serve-rate`), which outlives the
    /// brick's restarts. Absent from an older control plane's replies: the brick keeps its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve_bps: Option<u64>,
    /// Segments to freeze for a move: node requests on them are answered `Moving`, not
    /// executed (every segment not listed here nor in `moved` is served as usual).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frozen: Vec<u64>,
    /// Segments that have moved to another brick: node requests are answered `Moved`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moved: Vec<u64>,
    /// Pulls to run on this brick (listed until their outcome is reported).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pulls: Vec<MovePull>,
}

/// `POST /v1/nodes`: an agent announces its node. Re-registering a name returns the same id and
/// replaces the ports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeRegistration {
    /// Unique name of the node.
    pub name: String,
    /// Its ports (at least one).
    pub ports: Vec<PortSpec>,
}

/// Reply to a node registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeRegistered {
    /// The node's id; it appears in every grant issued for the node.
    pub id: u64,
}

/// A node as the control plane sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Node {
    /// Id.
    pub id: u64,
    /// Unique name.
    pub name: String,
    /// Its ports.
    pub ports: Vec<Port>,
    /// Its live allocations.
    pub allocations: u64,
    /// Bytes in its segments.
    pub allocated_bytes: u64,
    /// The most its allocations may hold at once (its own quota, or the default).
    #[serde(default)]
    pub quota_bytes: u64,
    /// Whether an admin set this node's own quota (else the default applies).
    #[serde(default)]
    pub quota_set: bool,
    /// Bytes of the allocations pushed to the node (no holder): its pool.
    #[serde(default)]
    pub pool_bytes: u64,
    /// Of those, bytes the node's agent attached, as it last reported.
    #[serde(default)]
    pub pool_attached_bytes: u64,
    /// Of those, bytes a process uses, as the agent last reported.
    #[serde(default)]
    pub pool_in_use_bytes: u64,
}

/// `PUT /v1/nodes/{id}/quota`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeQuotaRequest {
    /// The most bytes the node's allocations may hold at once; `null`: the control plane's
    /// default (`rackmem control --node-quota`).
    pub quota_bytes: Option<u64>,
}

/// How the control plane picks bricks for segments that name none (seed 004, section V: graph
/// vertices annotated with load and power, used by the allocation algorithms).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// The least loaded brick (bytes/s served, from its heartbeats), then the one with fewest
    /// segments, then the most free space: traffic spreads over the rack.
    #[default]
    Spread,
    /// A brick that already holds segments, the fullest that fits; an idle brick only when none
    /// fits, the one that draws least power busy (as the topology declares) first: whole bricks
    /// stay idle and may be powered down.
    Pack,
}

impl std::fmt::Display for Objective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Objective::Spread => "spread",
            Objective::Pack => "pack",
        })
    }
}

impl std::str::FromStr for Objective {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "spread" => Ok(Objective::Spread),
            "pack" => Ok(Objective::Pack),
            _ => Err(format!("unknown placement objective {s:?}: use spread or pack")),
        }
    }
}

/// Power a brick draws, as an operator declares it in the topology file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BrickPower {
    /// Watts when it serves no segment.
    pub idle_watts: u32,
    /// Watts when it serves segments.
    pub busy_watts: u32,
}

/// `POST /v1/allocations`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AllocationRequest {
    /// Id of the node the memory is for.
    pub node: u64,
    /// How much memory; each of the `stripe` segments gets `size_bytes / stripe` rounded up to
    /// whole MiB.
    pub size_bytes: u64,
    /// Over how many bricks to spread it (default 1, or the number of `bricks` given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripe: Option<u32>,
    /// Bandwidth reserved on every link of each segment's path (default: none, fair share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_bps: Option<u64>,
    /// The bricks to use (default: the control plane picks the bricks with most free space).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bricks: Option<Vec<u64>>,
    /// Ids of the only links paths may use (default: any link).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub links: Option<Vec<String>>,
    /// Makes the request safe to retry: while the allocation it made lives, a request with the
    /// same key and the same body gets that allocation back (200) instead of a second one (201
    /// for the first); the same key with a different body is refused (409 `conflict`). 1 to
    /// [`MAX_IDEMPOTENCY_KEY_LEN`] characters of `A-Z a-z 0-9 - _ . :`. The client of this crate
    /// picks a random key when none is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Which process holds the memory on its node: node agents set it so that they can reclaim
    /// allocations whose holder is gone; absent for allocations made by hand, which no agent
    /// ever reclaims. The control plane stores and shows it without interpreting it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    /// How to pick the bricks `bricks` does not name (default: the control plane's
    /// `--placement`, itself `spread` by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Objective>,
    /// Ask for a circuit (seed 004, section V): every port and switch link of each segment's
    /// path is reserved for this allocation alone, and the control plane configures the
    /// switches on it to connect its ports (see `GET /v1/circuits`). Other allocations route
    /// around it, or are refused saying which circuit holds the links they would need.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit: Option<bool>,
}

/// Longest [`AllocationRequest::idempotency_key`] and [`Holder::agent`].
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 128;

/// Whether `key` is a valid idempotency key or agent instance name: 1 to
/// [`MAX_IDEMPOTENCY_KEY_LEN`] characters of `A-Z a-z 0-9 - _ . :`.
pub fn valid_token(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_IDEMPOTENCY_KEY_LEN
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// The process an agent made an allocation for (see [`AllocationRequest::holder`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Holder {
    /// The agent run that made it (random per agent start, same charset as idempotency keys):
    /// an agent knows every allocation of its own run that a connection holds.
    pub agent: String,
    /// The agent's number for the process's connection.
    pub connection: u64,
    /// The process id, from the socket's peer credentials.
    pub pid: u32,
    /// The process's user id, from the socket's peer credentials.
    pub uid: u32,
    /// The process's start time (field 22 of `/proc/PID/stat`, clock ticks since boot): a
    /// later process with the same pid has another start time.
    pub start_ticks: u64,
}

/// `PATCH /v1/allocations/{id}`: grow (adds segments) or shrink (drops whole segments from the
/// end while the rest still covers the new size).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResizeRequest {
    /// The new size.
    pub size_bytes: u64,
}

/// `POST /v1/allocations/{id}/clone`: a copy-on-write clone of an allocation's segments, for a
/// forked child of the process that holds them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CloneRequest {
    /// The segments to clone, in the order the clone's segments take (default: every segment of
    /// the allocation, in its order). At most [`MAX_CLONE_SEGMENTS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments: Option<Vec<u64>>,
    /// As for [`AllocationRequest::idempotency_key`]: a retry with the same key and body gets the
    /// same clone back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// As for [`AllocationRequest::holder`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
}

/// Most segments one clone request names.
pub const MAX_CLONE_SEGMENTS: usize = 1024;

/// Most holders one named segment has at once (each costs the control plane a stored entry).
pub const MAX_NAMED_HOLDERS: usize = 1024;

/// `POST /v1/segments`: create-or-open the named segment `name` for process `holder` of node
/// `node` (issue 24: one-sided segments shared by processes on several nodes).
///
/// Names are global, and each belongs to the user (`holder.uid`) who created it: another user's
/// open is refused (403 `forbidden`; deny by default). The first open with `size_bytes > 0`
/// creates it: one segment, placed like an allocation of `node` and counted against that node's
/// quota while it lives. Later opens return the same segment, with a grant for the opener's
/// node; one asking for more bytes than it has is refused (409 `conflict`), and an open with
/// `size_bytes == 0` of a name that does not exist is 404 `not_found`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SegmentOpen {
    /// The node whose process opens it (a node token names only its own).
    pub node: u64,
    /// The segment's name: 1 to [`MAX_IDEMPOTENCY_KEY_LEN`] characters of `A-Z a-z 0-9 - _ . :`.
    pub name: String,
    /// Bytes to create it with (0: open an existing segment only).
    pub size_bytes: u64,
    /// The process that holds it from now on, until it closes it (or its agent finds it gone).
    pub holder: Holder,
}

/// `POST /v1/segments/{name}/close`: process `holder` of node `node` holds the segment no more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SegmentClose {
    /// The node whose process held it.
    pub node: u64,
    /// The holder, as it opened the segment (`agent` and `connection` identify it).
    pub holder: Holder,
}

/// One holder of a named segment: a process of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NamedHolder {
    /// The node.
    pub node: u64,
    /// The process, as its agent named it.
    pub holder: Holder,
}

/// A named segment (`GET /v1/segments`), and for its opener the grant to attach it with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NamedSegment {
    /// Its name.
    pub name: String,
    /// The user it belongs to (only this user's processes may open it).
    pub uid: u32,
    /// The allocation that holds its memory (of the node that created it).
    pub allocation: u64,
    /// The node that created it, whose quota it counts against.
    pub node: u64,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// When it was created.
    pub created_unix_ms: u64,
    /// Who holds it now; it is released when the last one closes it.
    pub holders: Vec<NamedHolder>,
    /// In an open's reply: the segment with a grant and session key for the opener's node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<Segment>,
}

/// The reply to `POST /v1/segments/{name}/close`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NamedClosed {
    /// The segment's name.
    pub name: String,
    /// Holders left.
    pub holders: u64,
    /// True when this close was the last and the segment was released.
    pub released: bool,
}

/// One segment of an allocation: everything a node needs to attach it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Segment {
    /// Brick that holds it.
    pub brick_id: u64,
    /// Where the node reaches that brick.
    pub brick_address: String,
    /// Segment id, unique across the control plane and never reused.
    pub segment_id: u64,
    /// Where it starts in the brick's pool.
    pub offset: u64,
    /// Its size (whole MiB).
    pub size_bytes: u64,
    /// The grant (73 bytes of `rackmem_proto::Grant::encode`), hex.
    pub grant_hex: String,
    /// The grant's session key, hex: `HMAC-SHA256(brick_key, "rackmem-session-v1" || grant.mac)`.
    pub session_key_hex: String,
    /// When the grant expires, seconds since the Unix epoch (0: never); renew with
    /// `POST /v1/allocations/{id}/renew` before then to attach again.
    #[serde(default)]
    pub grant_expires_unix_s: u64,
    /// Bandwidth reserved for it on every link of its path (0: none).
    pub bandwidth_bps: u64,
    /// What the node may send to it, in bytes per second, now.
    pub rate_limit_bps: u64,
    /// Link ids of its path, node port first, brick port last.
    pub links: Vec<String>,
}

/// An allocation: memory of one node spread over segments of one or more bricks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Allocation {
    /// Id.
    pub id: u64,
    /// The node it is for.
    pub node: u64,
    /// The size asked for (the segments cover at least this much).
    pub size_bytes: u64,
    /// Over how many bricks each growth step is spread.
    pub stripe: u32,
    /// Bandwidth reserved on each segment's path.
    pub bandwidth_bps: u64,
    /// Its segments, in window order.
    pub segments: Vec<Segment>,
    /// When it was created.
    pub created_unix_ms: u64,
    /// The idempotency key it was made with, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Who holds it on its node (absent: made by hand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    /// True when its segments' paths are a circuit: their ports and switch links are its alone.
    #[serde(default)]
    pub circuit: bool,
}

/// Brief of the allocation that `DELETE /v1/allocations/{id}` released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Released {
    /// Id of the deleted allocation.
    pub id: u64,
    /// The extents given back to their bricks.
    pub extents: Vec<ReleasedExtent>,
    /// True when nothing was released yet: the allocation is in its node's pool and a process
    /// uses it; the node's agent releases it as soon as none does (`extents` is then empty).
    #[serde(default)]
    pub deferred: bool,
}

/// `PUT /v1/nodes/{id}/pool`: what the node's agent did with the allocations pushed to the
/// node (those without a holder: `rackmem ctl alloc --node`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolReport {
    /// Pushed allocations whose segments the agent attached (checked and created on their
    /// bricks): in the node's pool.
    #[serde(default)]
    pub attached: Vec<u64>,
    /// Pool allocations a process uses now.
    #[serde(default)]
    pub in_use: Vec<u64>,
}

/// Reply to a [`PoolReport`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PoolReply {
    /// Pool allocations whose release was asked while a process used them: the agent releases
    /// each once no process uses it, and hands none of them out again.
    pub release: Vec<u64>,
    /// Segments of the node's allocations on draining bricks (`rackmem ctl drain`) or that a
    /// rebalance moves now (`rackmem ctl rebalance`), each with the brick the control plane
    /// picked for its pages: the agent has the process using it move them there and return the
    /// allocation, or releases it if it is an unused pool allocation.
    #[serde(default)]
    pub evacuate: Vec<Evacuation>,
}

/// A segment to move off a draining brick, or that a rebalance moves, in a [`PoolReply`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Evacuation {
    /// The allocation it belongs to.
    pub allocation: u64,
    /// The segment.
    pub segment_id: u64,
    /// The brick that holds it (draining, or one a rebalance moves load from).
    pub brick_id: u64,
    /// Its size.
    pub size_bytes: u64,
    /// The brick its pages go to (none when no other brick can take it now: `why` says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_brick_id: Option<u64>,
    /// That brick's address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_address: Option<String>,
    /// Why no brick was picked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// An extent given back to a brick.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReleasedExtent {
    /// The brick.
    pub brick_id: u64,
    /// The segment that held it.
    pub segment_id: u64,
    /// Start in the brick's pool.
    pub offset: u64,
    /// Size.
    pub size_bytes: u64,
}

/// The rate limit of one segment of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SegmentRate {
    /// Allocation the segment belongs to.
    pub allocation: u64,
    /// Segment id.
    pub segment_id: u64,
    /// Brick.
    pub brick_id: u64,
    /// Node port link the segment's traffic leaves by.
    pub link: String,
    /// What the node may send to it, in bytes per second.
    pub rate_limit_bps: u64,
}

/// `GET /v1/nodes/{id}/rates`: what the agent sets its token buckets to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeRates {
    /// The node.
    pub node: u64,
    /// One entry per live segment of the node.
    pub segments: Vec<SegmentRate>,
}

/// A switch of the resource graph.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Switch {
    /// Name.
    pub name: String,
    /// Ids of the links that end on it.
    pub links: Vec<String>,
}

/// One end of a link.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Endpoint {
    /// A node (through one of its ports).
    Node {
        /// Node id.
        id: u64,
    },
    /// A brick (through one of its ports).
    Brick {
        /// Brick id.
        id: u64,
    },
    /// A switch.
    Switch {
        /// Switch name.
        name: String,
    },
}

/// A link of the resource graph: a port's cable to its switch, or a cable between two switches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Link {
    /// Id (`node:ID:PORT`, `brick:ID:PORT`, `switch:A:B`).
    pub id: String,
    /// One end (the node or brick for a port link).
    pub a: Endpoint,
    /// The other end (a switch).
    pub b: Endpoint,
    /// What it carries, bytes per second.
    pub capacity_bps: u64,
    /// Reserved by allocations with a bandwidth.
    pub reserved_bps: u64,
    /// `capacity_bps - reserved_bps`: shared fairly by the segments without a reservation.
    pub free_bps: u64,
    /// Segments whose path crosses it.
    pub segments: u64,
    /// The allocation whose circuit holds it alone (absent: shared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit: Option<u64>,
}

/// `GET /v1/graph`: the whole resource graph with what is reserved on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Graph {
    /// Nodes.
    pub nodes: Vec<Node>,
    /// Bricks.
    pub bricks: Vec<Brick>,
    /// Switches.
    pub switches: Vec<Switch>,
    /// Links.
    pub links: Vec<Link>,
    /// How bricks are picked for allocations that do not say (`--placement`).
    #[serde(default)]
    pub placement: Objective,
}

/// Every error reply: `{"error": {"code": "...", "message": "..."}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The content of an error reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code (`bad_request`, `not_found`, `conflict`, `invalid`,
    /// `insufficient_capacity`, `insufficient_bandwidth`, `payload_too_large`, `store`,
    /// `not_leader`).
    pub code: String,
    /// What a human should know, naming the object involved.
    pub message: String,
    /// With `not_leader`: the advertised URL of the leader, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
}

/// `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always `ok` when the control plane answers.
    pub status: String,
    /// Which store holds the state (`sqlite:PATH`).
    pub store: String,
    /// `leader` or `follower` (a control plane alone on its store always leads).
    #[serde(default)]
    pub role: String,
    /// The leader's advertised URL, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
}

/// `GET /v1/leader`: the election as this control plane sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LeaderInfo {
    /// `leader` or `follower`.
    pub role: String,
    /// True when this control plane serves the API: it leads and has loaded the state of its
    /// term.
    pub serving: bool,
    /// The leader's advertised URL, when known.
    pub leader: Option<String>,
    /// This control plane's advertised URL.
    pub advertise: String,
    /// The fencing token of its leadership (etcd: the creation revision of the leader key); 0
    /// when it does not lead.
    pub term: i64,
    /// Which store holds the state.
    pub store: String,
}

/// What a principal may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Operators and `rackmem ctl`: everything.
    Admin,
    /// A node's agent: its own node only.
    Node,
    /// A managed brick: its own registration and heartbeats only.
    Brick,
    /// A metrics scraper: `GET /metrics` only.
    Metrics,
}

impl Role {
    /// `admin`, `node`, `brick`, `metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Node => "node",
            Role::Brick => "brick",
            Role::Metrics => "metrics",
        }
    }

    /// Parses `admin`, `node`, `brick` or `metrics`.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "admin" => Some(Role::Admin),
            "node" => Some(Role::Node),
            "brick" => Some(Role::Brick),
            "metrics" => Some(Role::Metrics),
            _ => None,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `POST /v1/tokens` (admin only): a token for a principal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// `admin`, `node` (an agent: that node's allocations only) or `brick` (that brick's
    /// registration and heartbeats only).
    pub role: Role,
    /// The node or brick the token speaks for (for admins, a label).
    pub name: String,
}

/// A new token. The secret is shown here once; the control plane keeps only its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TokenCreated {
    /// Id (to revoke it).
    pub id: u64,
    /// Role.
    pub role: Role,
    /// Name.
    pub name: String,
    /// The token: send it as `Authorization: Bearer TOKEN`.
    pub token: String,
}

/// A token, without its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TokenInfo {
    /// Id.
    pub id: u64,
    /// Role.
    pub role: Role,
    /// Name.
    pub name: String,
    /// Creation time.
    pub created_unix_ms: u64,
}

/// Most processes one node's agent reports at once (`PUT /v1/nodes/{id}/processes`): the ones
/// with the most faults, so that a report fits the API's 64 KiB body limit (a process's figures
/// take about 600 bytes of JSON). The agent's own metrics carry every process.
pub const MAX_REPORTED_PROCESSES: usize = 48;

/// What a node's agent reports of the processes it serves, replacing what it reported before.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ProcessReports {
    /// Each process's latest figures (at most [`MAX_REPORTED_PROCESSES`]).
    pub processes: Vec<rackmem_proto::ProcessReport>,
}

/// A process as the control plane last heard of it from its node's agent.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProcessView {
    /// The node it runs on.
    pub node: u64,
    /// That node's name.
    pub node_name: String,
    /// Milliseconds since its agent's report arrived.
    pub age_ms: u64,
    /// Its figures.
    pub report: rackmem_proto::ProcessReport,
    /// C-AMAT of the bricks' level (seed 002): time any fault is outstanding per fault, the mean
    /// fault time over the miss concurrency, in nanoseconds.
    pub bricks_camat_ns: f64,
    /// Share of its run so far during which a fault was outstanding (faults × C-AMAT₂ over its
    /// uptime): how much of its time remote memory took.
    pub stall_share: f64,
    /// The bricks' level brick by brick, derived from the report's counts (empty for a runtime
    /// that does not report them).
    #[serde(default)]
    pub bricks: Vec<BrickLevelView>,
}

/// One brick's level of C-AMAT for a process (seed 002, section 2.2): which brick a program
/// waits on, and how much of that waiting overlaps.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BrickLevelView {
    /// The brick's address, as the program's runtime names it.
    pub brick: String,
    /// Faults whose page it served.
    pub faults: u64,
    /// Of those, faults no other outstanding fault overlapped.
    pub pure_misses: u64,
    /// Its faults outstanding at once, time-weighted over the time any was.
    pub miss_concurrency: f64,
    /// Mean time of its pure misses, nanoseconds.
    pub pure_miss_penalty_ns: f64,
    /// Its C-AMAT: time any fault it serves is outstanding, per fault, nanoseconds.
    pub camat_ns: f64,
}

/// A reported brick level's counts, for the model's C-AMAT terms.
pub fn level_counts(b: &rackmem_proto::BrickLevelReport) -> rackmem_model::LevelCounts {
    rackmem_model::LevelCounts {
        faults: b.faults,
        pure_misses: b.pure_misses,
        pure_miss_ns: b.pure_miss_ns,
        busy_ns: b.busy_ns,
        accum_ns: b.accum_ns,
        max_outstanding: b.max_outstanding,
    }
}

impl From<&rackmem_proto::BrickLevelReport> for BrickLevelView {
    fn from(b: &rackmem_proto::BrickLevelReport) -> Self {
        let c = level_counts(b);
        BrickLevelView {
            brick: b.brick.clone(),
            faults: b.faults,
            pure_misses: b.pure_misses,
            miss_concurrency: c.miss_concurrency(),
            pure_miss_penalty_ns: c.pure_avg_miss_penalty_ns(),
            camat_ns: c.camat_ns(),
        }
    }
}

/// One port of a switch rule: a cable ending on that switch.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
pub struct RulePort {
    /// The link id (`node:ID:PORT`, `brick:ID:PORT`, `switch:A:B`).
    pub link: String,
    /// How a switch driver names it: `OWNER:PORT` (node or brick name, port name) for a node's
    /// or a brick's port, `switch:OTHER` for the cable to another switch.
    pub port: String,
}

/// A software-defined memory rule (seed 004, section V): on `switch`, frames entering by `a`
/// leave by `b` and those entering by `b` leave by `a`, and nothing else enters or leaves by
/// either: a point-to-point circuit through that switch.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
pub struct SwitchRule {
    /// The switch.
    pub switch: String,
    /// The allocation whose circuit it serves.
    pub allocation: u64,
    /// One port (the node's side).
    pub a: RulePort,
    /// The other port (the brick's side).
    pub b: RulePort,
}

/// A circuit: an allocation whose paths are reserved for it alone, and the rules that
/// connect them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Circuit {
    /// The allocation.
    pub allocation: u64,
    /// Its node.
    pub node: u64,
    /// The links it holds alone (ports and switch links of its segments' paths).
    pub links: Vec<String>,
    /// The switch rules that connect them.
    pub rules: Vec<SwitchRule>,
}

/// What the control plane last applied to one switch (every circuit crossing it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SwitchState {
    /// The switch.
    pub switch: String,
    /// The rules it forwards by, as last applied (all circuits crossing it).
    pub rules: Vec<SwitchRule>,
    /// When they were applied (absent: never since this control plane started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_unix_ms: Option<u64>,
    /// How long applying them took, in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply_us: Option<u64>,
    /// Why the last attempt failed, if it did (retried every second until it succeeds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /v1/circuits`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Circuits {
    /// The switch driver: `dry-run` (rules recorded, nothing configured) or what configures
    /// the switches (`nft:FILE`).
    pub driver: String,
    /// Every live circuit.
    pub circuits: Vec<Circuit>,
    /// Every switch the control plane configured, with what it applied last.
    pub switches: Vec<SwitchState>,
}

/// `POST /v1/circuits/{id}/move`: re-route a circuit (same bricks, same segments and grants)
/// over other links.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CircuitMove {
    /// Link ids the new paths must not cross (a port or a switch link to free, say for
    /// maintenance).
    #[serde(default)]
    pub avoid: Vec<String>,
}

/// `PUT /v1/bricks/{id}/drain` (admins): start (or end) draining a brick.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// True: no new segments go to the brick; false: it takes segments again.
    pub draining: bool,
}

/// `PUT /v1/bricks/{id}/serve-rate` (admins): what a brick's memory serves, as an operator says.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServeRateRequest {
    /// Bytes/s (READ and WRITE together); `null`: none (only the ports bound the rates).
    pub serve_bps: Option<u64>,
}

/// `POST /v1/rebalance` (admins): plan moves of segments from the fullest bricks onto bricks
/// with room, and start them unless `dry_run`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RebalanceRequest {
    /// Only plan: nothing moves.
    #[serde(default)]
    pub dry_run: bool,
    /// How far (in percentage points of used capacity) a brick may stay from the mean share
    /// (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance_points: Option<f64>,
    /// Most bytes of allocations moving at once (default 256 MiB; one allocation always
    /// moves, however large).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight_bytes: Option<u64>,
}

/// Where a planned move stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum MoveState {
    /// Waiting for room in the bytes in flight.
    Pending,
    /// Listed to its node's agent: its process is moving the pages.
    Moving,
    /// The allocation is gone (its pages left for a new allocation on the target).
    Done,
    /// Given up (`why` says why); the allocation stays where it was.
    Abandoned,
}

/// One segment of a planned move: from its brick to another (or a copy on its own brick: an
/// allocation goes back whole, so its segments that are not the point of the move are carried
/// too).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SegmentMove {
    /// The segment.
    pub segment_id: u64,
    /// Its brick now.
    pub from_brick_id: u64,
    /// The brick its pages go to.
    pub to_brick_id: u64,
    /// Its size.
    pub size_bytes: u64,
}

/// One allocation a rebalance moves (all of its segments together: an allocation goes back
/// whole).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RebalanceMove {
    /// The allocation.
    pub allocation: u64,
    /// Its node.
    pub node: u64,
    /// Its segments and where each goes.
    pub segments: Vec<SegmentMove>,
    /// Where the move stands.
    pub state: MoveState,
    /// Why it was abandoned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// A brick's share of used capacity, before a rebalance and as planned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BrickShare {
    /// The brick.
    pub brick_id: u64,
    /// Its name.
    pub name: String,
    /// Its capacity.
    pub capacity_bytes: u64,
    /// Bytes in segments when the plan was made.
    pub used_bytes: u64,
    /// Bytes in segments once every planned move is done.
    pub planned_bytes: u64,
}

/// A rebalance: its plan and how far it got (`GET /v1/rebalance`, and the reply to a `POST`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Rebalance {
    /// Only planned: nothing moves.
    pub dry_run: bool,
    /// The tolerance the plan was made with (percentage points around the mean share).
    pub tolerance_points: f64,
    /// The mean share of used capacity over the bricks that take segments (percent).
    pub mean_percent: f64,
    /// Most bytes of allocations moving at once.
    pub max_in_flight_bytes: u64,
    /// What started it: `operator` or `brick_joined`.
    pub reason: String,
    /// When it was planned (ms since the Unix epoch).
    pub planned_unix_ms: u64,
    /// The moves, in the order they start.
    pub moves: Vec<RebalanceMove>,
    /// The bricks that take segments: used before, and as planned.
    pub bricks: Vec<BrickShare>,
    /// Every move is done or abandoned (or there were none).
    pub finished: bool,
}
