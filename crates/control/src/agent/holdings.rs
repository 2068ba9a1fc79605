//! What this agent run's connections hold and are asking for, and the quotas on it: a grow is
//! checked against the per-process and per-user quotas and reserved before the control plane
//! is asked, so concurrent grows cannot together pass a quota.

use super::AgentConfig;
use std::collections::{HashMap, HashSet};

/// What this agent run's connections hold and are asking for, under one lock so that
/// reconciliation sees a grow either in flight or held, never neither.
#[derive(Default)]
pub(super) struct Holdings {
    /// Allocation → (connection, uid, pid, bytes).
    held: HashMap<u64, (u64, u32, u32, u64)>,
    /// Connection → grows asked of the control plane and not answered yet.
    in_flight: HashMap<u64, u32>,
    /// Bytes held or being asked for, per user and per process.
    per_uid: HashMap<u32, u64>,
    per_pid: HashMap<u32, u64>,
    /// Named segments held: (name, connection).
    named: HashSet<(String, u64)>,
}

impl Holdings {
    /// Reserves `bytes` for a grow of `connection` (process `pid` of user `uid`) if the quotas
    /// of `cfg` allow it; otherwise says which quota it would pass.
    pub(super) fn reserve(
        &mut self,
        cfg: &AgentConfig,
        connection: u64,
        uid: u32,
        pid: u32,
        bytes: u64,
    ) -> Result<(), String> {
        self.fits(cfg, uid, pid, bytes)?;
        self.add(uid, pid, bytes);
        *self.in_flight.entry(connection).or_default() += 1;
        Ok(())
    }

    /// Whether process `pid` of user `uid` may hold `bytes` more under the quotas of `cfg`;
    /// otherwise says which quota it would pass.
    pub(super) fn fits(&self, cfg: &AgentConfig, uid: u32, pid: u32, bytes: u64) -> Result<(), String> {
        let by_pid = self.per_pid.get(&pid).copied().unwrap_or(0);
        let by_uid = self.per_uid.get(&uid).copied().unwrap_or(0);
        if by_pid.saturating_add(bytes) > cfg.quota_per_process_bytes {
            return Err(format!(
                "pid {pid} holds {by_pid} bytes; {bytes} more would pass its quota of {} bytes \
                 (--quota-per-process)",
                cfg.quota_per_process_bytes
            ));
        }
        if by_uid.saturating_add(bytes) > cfg.quota_per_uid_bytes {
            return Err(format!(
                "uid {uid} holds {by_uid} bytes; {bytes} more would pass its quota of {} bytes \
                 (--quota-per-uid)",
                cfg.quota_per_uid_bytes
            ));
        }
        Ok(())
    }

    /// Reserves `bytes` of clones that connection `connection` (of user `uid`) asks for its
    /// forked child, if the user's quota allows it. The child's process quota is its parent's
    /// holding again, which the parent was allowed; the clones count to process 0 (nobody's)
    /// until the child adopts them.
    pub(super) fn reserve_for_child(
        &mut self,
        cfg: &AgentConfig,
        connection: u64,
        uid: u32,
        bytes: u64,
    ) -> Result<(), String> {
        let by_uid = self.per_uid.get(&uid).copied().unwrap_or(0);
        if by_uid.saturating_add(bytes) > cfg.quota_per_uid_bytes {
            return Err(format!(
                "uid {uid} holds {by_uid} bytes; a clone of {bytes} bytes for a forked child would pass its \
                 quota of {} bytes (--quota-per-uid)",
                cfg.quota_per_uid_bytes
            ));
        }
        self.add(uid, 0, bytes);
        *self.in_flight.entry(connection).or_default() += 1;
        Ok(())
    }

    /// The control plane answered a grow [`Holdings::reserve`] reserved: the reservation ends.
    pub(super) fn answered(&mut self, connection: u64, uid: u32, pid: u32, bytes: u64) {
        self.sub(uid, pid, bytes);
        if let Some(n) = self.in_flight.get_mut(&connection) {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(&connection);
            }
        }
    }

    /// `connection` holds `allocation` of `bytes` now.
    pub(super) fn hold(&mut self, allocation: u64, connection: u64, uid: u32, pid: u32, bytes: u64) {
        self.add(uid, pid, bytes);
        self.held.insert(allocation, (connection, uid, pid, bytes));
    }

    /// `allocation` (of `bytes`, held by process `pid` of user `uid`) is held no more.
    pub(super) fn release(&mut self, allocation: u64, uid: u32, pid: u32, bytes: u64) {
        self.held.remove(&allocation);
        self.sub(uid, pid, bytes);
    }

    /// `connection` (process `pid` of user `uid`) holds named segment `name` of `bytes` now.
    pub(super) fn hold_named(&mut self, name: &str, connection: u64, uid: u32, pid: u32, bytes: u64) {
        self.add(uid, pid, bytes);
        self.named.insert((name.to_string(), connection));
    }

    /// `connection` holds named segment `name` no more.
    pub(super) fn release_named(&mut self, name: &str, connection: u64, uid: u32, pid: u32, bytes: u64) {
        self.named.remove(&(name.to_string(), connection));
        self.sub(uid, pid, bytes);
    }

    /// The named segments held, as (name, connection), and the connections with a request in
    /// flight.
    pub(super) fn named_and_in_flight(&self) -> (HashSet<(String, u64)>, HashSet<u64>) {
        (self.named.clone(), self.in_flight.keys().copied().collect())
    }

    /// The process holding `allocation`, if a connection of this run does.
    pub(super) fn holder_pid(&self, allocation: u64) -> Option<u32> {
        self.held.get(&allocation).map(|&(_, _, pid, _)| pid)
    }

    /// The allocations held, and the connections with a grow in flight.
    pub(super) fn held_and_in_flight(&self) -> (HashSet<u64>, HashSet<u64>) {
        let held: HashSet<u64> = self.held.keys().copied().collect();
        let flying: HashSet<u64> = self.in_flight.keys().copied().collect();
        (held, flying)
    }

    fn add(&mut self, uid: u32, pid: u32, bytes: u64) {
        *self.per_uid.entry(uid).or_default() += bytes;
        *self.per_pid.entry(pid).or_default() += bytes;
    }

    fn sub(&mut self, uid: u32, pid: u32, bytes: u64) {
        for (m, k) in [(&mut self.per_uid, uid), (&mut self.per_pid, pid)] {
            if let Some(v) = m.get_mut(&k) {
                *v = v.saturating_sub(bytes);
                if *v == 0 {
                    m.remove(&k);
                }
            }
        }
    }
}
