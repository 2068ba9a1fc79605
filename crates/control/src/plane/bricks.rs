//! Bricks: registration (bound to the brick's grant key), heartbeats and liveness, forgetting a
//! brick, and the brick views of the REST API.

use super::attach::{id_for, name_links};
use super::{now_unix_ms, BrickEntry, ControlPlane, PlaneError};
use crate::alloc::{FreeExtents, EXTENT_ALIGN};
use crate::api::{self, BrickState, Endpoint, HeartbeatStats, LiveSegment};
use crate::graph::check_owner_name;
use crate::store::{BrickRecord, Key, Op, Record};
use std::collections::BTreeMap;
use std::time::Instant;

/// Most bytes a grant key may have.
pub const MAX_KEY_BYTES: usize = 1024;

/// The grant key of a registration or a stored brick record.
pub(super) fn decode_key(key_hex: &str) -> Result<Vec<u8>, String> {
    let key = hex::decode(key_hex.trim()).map_err(|e| format!("key_hex is not hex: {e}"))?;
    if key.len() < 16 || key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "a grant key has 16 to {MAX_KEY_BYTES} bytes; this one has {}",
            key.len()
        ));
    }
    Ok(key)
}

/// Checks that a brick's address names a transport the runtime speaks.
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
        let id = id_for(existing, &mut counters.next_brick);
        let owner = Endpoint::Brick { id };
        name_links(&owner, &mut ports);
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
        if reg.serve_bps == Some(0) {
            return Err(PlaneError::Invalid(format!(
                "brick {} serves 0 bytes/s: give its rate, or leave serve_bps out",
                reg.name
            )));
        }
        // An operator's rate outlives the brick's restarts: the brick learns it from its next
        // heartbeat reply, whatever its own `--serve-rate` says.
        let operator = existing
            .and_then(|id| self.bricks.get(&id))
            .filter(|b| b.rec.serve_rate_by_operator)
            .map(|b| b.rec.serve_bps);
        let rec = BrickRecord {
            id,
            name: reg.name.clone(),
            address: reg.address,
            capacity_bytes: reg.capacity_bytes,
            ports: ports.clone(),
            key_hex: hex::encode(&key),
            serve_bps: operator.unwrap_or(reg.serve_bps),
            serve_rate_by_operator: operator.is_some(),
            // A drain outlives the brick's restarts: only an operator ends it.
            draining: existing
                .and_then(|id| self.bricks.get(&id))
                .is_some_and(|b| b.rec.draining),
        };
        self.commit_registration(&owner, Record::Brick(rec.clone()), counters, &old_ports, &mut ports)?;
        self.graph.set_memory(id, rec.serve_bps);
        let now = Instant::now();
        let (segments, paths, stats, hb, served, load_bps) = match self.bricks.remove(&id) {
            Some(old) => {
                if old.up {
                    self.index.remove(id, old.extents.largest());
                }
                (
                    old.segments,
                    old.paths,
                    old.stats,
                    old.last_heartbeat_unix_ms,
                    old.served,
                    old.load_bps,
                )
            }
            None => (BTreeMap::new(), BTreeMap::new(), None, None, None, None),
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
                paths,
                up: true,
                last_seen: now,
                last_heartbeat_unix_ms: hb,
                stats,
                served,
                load_bps,
            },
        );
        self.brick_joined(id);
        Ok(api::BrickRegistered {
            id,
            heartbeat_interval_ms: u64::try_from(self.heartbeat_interval.as_millis()).unwrap_or(u64::MAX),
            brick_timeout_ms: u64::try_from(self.brick_timeout.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// `PUT /v1/bricks/{id}/heartbeat`: the brick is alive; here are the segments it must keep.
    pub fn heartbeat(&mut self, id: u64, stats: Option<HeartbeatStats>) -> Result<api::HeartbeatReply, PlaneError> {
        if !self.bricks.contains_key(&id) {
            return Err(PlaneError::NotFound(format!(
                "brick {id} is not registered (register it first)"
            )));
        }
        // First, so that the segment list below has a move's target in it from its start.
        let (frozen, moved, pulls) = self.named_moves_for(id, stats.as_ref());
        let b = self
            .bricks
            .get_mut(&id)
            .ok_or_else(|| PlaneError::NotFound(format!("brick {id} is not registered (register it first)")))?;
        let now = Instant::now();
        b.last_seen = now;
        b.last_heartbeat_unix_ms = Some(now_unix_ms());
        if let Some(served) = stats.as_ref().and_then(|s| s.bytes_served) {
            // A brick that restarted counts from 0 again: its load is known from the next one.
            if let Some((before, at)) = b.served {
                let dt = now.saturating_duration_since(at).as_secs_f64();
                if served >= before && dt > 0.0 {
                    b.load_bps = Some(((served - before) as f64 / dt) as u64);
                }
            }
            b.served = Some((served, now));
        }
        if stats.is_some() {
            b.stats = stats;
        }
        let graph = &self.graph;
        let segments = b
            .segments
            .iter()
            .map(|(&id, &(offset, size_bytes))| LiveSegment {
                id,
                offset,
                size_bytes,
                rate_bps: b.paths.get(&id).map(|(links, bw)| graph.rate_limit(links, *bw)),
            })
            .collect();
        let serve_bps = Some(b.rec.serve_bps.unwrap_or(0));
        if !b.up {
            b.up = true;
            let largest = b.extents.largest();
            self.index.update(id, None, largest);
            tracing::info!(brick = id, "brick is up again");
            self.brick_joined(id);
        }
        Ok(api::HeartbeatReply {
            segments,
            serve_bps,
            frozen,
            moved,
            pulls,
        })
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
        // A move whose brick went down ends here, without waiting for another heartbeat.
        self.end_overdue_moves(now);
        down
    }

    /// `PUT /v1/bricks/{id}/serve-rate` (`rackmem ctl bricks rate BRICK RATE|none`): what the
    /// brick's memory serves, as an operator says. Its segments' rates are divided anew at
    /// once (they are computed when read, and the brick's next heartbeat reply carries them). A
    /// brick holding segments keeps a rate or keeps none: their paths end with its memory link
    /// exactly when it had one when they were placed.
    pub fn set_serve_rate(&mut self, id: u64, serve_bps: Option<u64>) -> Result<api::Brick, PlaneError> {
        let b = self
            .bricks
            .get(&id)
            .ok_or_else(|| PlaneError::NotFound(format!("brick {id} is not registered")))?;
        if serve_bps == Some(0) {
            return Err(PlaneError::Invalid(format!(
                "brick {} cannot serve 0 bytes/s: give a rate, or none",
                b.rec.name
            )));
        }
        if b.rec.serve_bps.is_some() != serve_bps.is_some() && !b.segments.is_empty() {
            return Err(PlaneError::Conflict(format!(
                "brick {} holds {} segments: its rate can be changed but not given or removed until it holds none",
                b.rec.name,
                b.segments.len()
            )));
        }
        if let (Some(new), Some(link)) = (serve_bps, self.graph.link(&crate::graph::memory_link_id(id))) {
            if link.reserved_bps > new {
                return Err(PlaneError::Conflict(format!(
                    "brick {}'s segments have {} bytes/s reserved: it cannot serve less",
                    b.rec.name, link.reserved_bps
                )));
            }
        }
        let rec = BrickRecord {
            serve_bps,
            serve_rate_by_operator: true,
            ..b.rec.clone()
        };
        self.store.commit(&[Op::Put(Record::Brick(rec.clone()))])?;
        self.graph.set_memory(id, serve_bps);
        if let Some(b) = self.bricks.get_mut(&id) {
            b.rec = rec;
        }
        self.brick(id)
    }

    /// `PUT /v1/bricks/{id}/drain` (`rackmem ctl drain BRICK`): while `draining`, no new
    /// segment is placed on the brick (allocations, grows, migrations' targets); it is drained
    /// when it holds none. The agents of the nodes holding segments there move them off (see
    /// `drain.rs`). Refused, changing nothing, when its largest segment fits on no other brick.
    pub fn set_draining(&mut self, id: u64, draining: bool) -> Result<api::Brick, PlaneError> {
        let b = self
            .bricks
            .get(&id)
            .ok_or_else(|| PlaneError::NotFound(format!("brick {id} is not registered")))?;
        if b.rec.draining != draining {
            if draining {
                self.check_drain_possible(id)?;
            }
            let rec = BrickRecord {
                draining,
                ..b.rec.clone()
            };
            self.store.commit(&[Op::Put(Record::Brick(rec.clone()))])?;
            if let Some(b) = self.bricks.get_mut(&id) {
                b.rec = rec;
            }
        }
        self.brick(id)
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

    fn brick_view(&self, b: &BrickEntry) -> api::Brick {
        let (named_moving, named_waiting) = self.named_moves_on(b.rec.id);
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
            serve_bps: b.rec.serve_bps,
            serve_rate_by_operator: b.rec.serve_rate_by_operator,
            promised_bps: b
                .paths
                .values()
                .map(|(links, bw)| self.graph.rate_limit(links, *bw))
                .fold(0u64, u64::saturating_add),
            load_bps: b.load_bps,
            power: self.graph.power_of(&b.rec.name),
            draining: b.rec.draining,
            drained: b.rec.draining && b.segments.is_empty(),
            named_segments: self.named_segments_on(b.rec.id),
            named_moving,
            named_waiting,
        }
    }

    /// The names of the named segments with a segment on brick `id`, sorted.
    fn named_segments_on(&self, id: u64) -> Vec<String> {
        let mut v: Vec<String> = self
            .names
            .iter()
            .filter(|(_, a)| {
                self.allocations
                    .get(a)
                    .is_some_and(|a| a.segments.iter().any(|s| s.brick_id == id))
            })
            .map(|(n, _)| n.clone())
            .collect();
        v.sort();
        v
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

    /// The name of brick `id`.
    pub fn brick_name(&self, id: u64) -> Option<&str> {
        self.bricks.get(&id).map(|b| b.rec.name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brick_addresses_of_every_transport_are_accepted() {
        for ok in ["tcp://mem1:7070", "tls://mem1.example:7070", "unix:/run/b.sock"] {
            assert!(check_address(ok).is_ok(), "{ok}");
        }
        for bad in ["tls://", "tcp://", "unix:", "http://mem1:7070", "mem1:7070"] {
            assert!(check_address(bad).is_err(), "{bad}");
        }
    }
}
