//! The rackmem control plane (seed 004's *platform synthesizer*): it decides which node gets
//! which segment of which brick, over which links, at what rate.
//!
//! - [`graph`]: the resource graph of nodes, bricks, ports, switches and links, and paths on it;
//! - [`alloc`]: free extents per brick and the index of bricks by free space;
//! - [`plane`]: the state machine (registrations, heartbeats, allocations) over a [`store`];
//! - [`auth`]: tokens, roles and client certificates: who a REST request speaks for;
//! - [`grant`]: grants signed with a brick's key and their session keys;
//! - [`serve`]: the accept loop (connection caps, header and request timeouts, HTTPS);
//! - [`server`]: the REST API (axum) with its OpenAPI document and Prometheus metrics;
//! - [`switch`]: the drivers that configure switches for circuits (dry-run, nftables);
//! - [`client`]: a small blocking client of that API, with fail-over between control planes;
//! - [`heartbeat`]: the thread a managed brick runs to register and send heartbeats;
//! - [`agent`]: the node agent, which hands segments to the node's processes;
//! - [`etcd_server`]: a throwaway etcd server for tests and benchmarks.
//!
//! It does not move memory: bricks serve segments, agents on nodes attach them with the grants
//! issued here. The contract between the parts is `docs/control-plane.md`.

pub mod agent;
pub mod alloc;
pub mod api;
pub mod auth;
pub mod client;
pub mod etcd_server;
pub mod grant;
pub mod graph;
pub mod heartbeat;
pub mod plane;
pub mod serve;
pub mod server;
pub mod store;
pub mod switch;
