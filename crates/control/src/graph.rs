//! The resource graph (seed 004, section V): nodes and bricks reach switches through their ports;
//! switches reach each other through the links a topology file declares. Every edge is a
//! [`LinkState`] with a capacity and what allocations reserved on it.
//!
//! A segment's path is node port link → zero or more switch-to-switch links → brick port link,
//! the shortest one (fewest links) whose every link still has the bandwidth asked for; among
//! equally short ones, the one with most bandwidth left on its tightest link.
//!
//! Without a topology file every port is cabled to the switch its registration names, or to
//! [`DEFAULT_SWITCH`]; switches named by registrations are created on demand and are not linked
//! to each other. With a topology file, only its switches exist.

use crate::api::{Endpoint, Link, Port, PortSpec, Switch, DEFAULT_SWITCH};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

/// The topology file (`--topology FILE`, JSON): switches, the cables between them, and which
/// switch each port is cabled to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// Switch names.
    #[serde(default)]
    pub switches: Vec<String>,
    /// Cables between switches.
    #[serde(default)]
    pub links: Vec<SwitchLink>,
    /// `"OWNER:PORT": "SWITCH"`, OWNER being a brick or node name: where a port whose
    /// registration names no switch is cabled.
    #[serde(default)]
    pub ports: BTreeMap<String, String>,
    /// Where ports go that neither their registration nor `ports` place (default `rack`, which
    /// is then declared implicitly).
    #[serde(default)]
    pub default_switch: Option<String>,
    /// `"BRICK": {"idle_watts": W, "busy_watts": W}`: the power each brick draws, for the
    /// `pack` placement objective and `GET /v1/graph`.
    #[serde(default)]
    pub power: BTreeMap<String, crate::api::BrickPower>,
}

/// A cable between two switches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchLink {
    /// One switch.
    pub a: String,
    /// The other switch.
    pub b: String,
    /// Capacity in bytes per second.
    pub bandwidth_bps: u64,
}

/// Why a topology or a port list is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    /// A port list or topology is malformed.
    #[error("{0}")]
    Invalid(String),
    /// A port names a switch the topology file does not declare.
    #[error("port {port} names switch {switch:?}, which the topology file does not declare")]
    UnknownSwitch {
        /// `OWNER:PORT`.
        port: String,
        /// The switch it names.
        switch: String,
    },
}

impl Topology {
    /// Parses and checks a topology file's text.
    pub fn parse(text: &str) -> Result<Topology, GraphError> {
        let t: Topology =
            serde_json::from_str(text).map_err(|e| GraphError::Invalid(format!("topology file is not valid: {e}")))?;
        let declared: HashSet<&str> = t.declared().collect();
        for s in &t.switches {
            check_name("switch", s)?;
        }
        for l in &t.links {
            for end in [&l.a, &l.b] {
                if !declared.contains(end.as_str()) {
                    return Err(GraphError::Invalid(format!(
                        "topology link {} - {} names undeclared switch {end:?}",
                        l.a, l.b
                    )));
                }
            }
            if l.a == l.b {
                return Err(GraphError::Invalid(format!(
                    "topology link {} - {} is a loop",
                    l.a, l.b
                )));
            }
        }
        for (port, sw) in &t.ports {
            if !declared.contains(sw.as_str()) {
                return Err(GraphError::UnknownSwitch {
                    port: port.clone(),
                    switch: sw.clone(),
                });
            }
        }
        Ok(t)
    }

    fn default_switch(&self) -> &str {
        self.default_switch.as_deref().unwrap_or(DEFAULT_SWITCH)
    }

    fn declared(&self) -> impl Iterator<Item = &str> {
        self.switches
            .iter()
            .map(String::as_str)
            .chain(std::iter::once(self.default_switch()))
    }
}

fn check_name(what: &str, name: &str) -> Result<(), GraphError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(GraphError::Invalid(format!(
            "{what} name {name:?} is not valid: use 1 to 64 letters, digits, '-', '_' or '.'"
        )))
    }
}

/// Checks a brick or node name.
pub fn check_owner_name(what: &str, name: &str) -> Result<(), GraphError> {
    check_name(what, name)
}

/// A link and what is reserved on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkState {
    /// The node or brick (port links) or first switch.
    pub a: Endpoint,
    /// The switch.
    pub b: Endpoint,
    /// Capacity in bytes per second.
    pub capacity_bps: u64,
    /// Sum of the reservations of the segments crossing it.
    pub reserved_bps: u64,
    /// Segments crossing it with a reservation.
    pub reserved_segments: u64,
    /// Segments crossing it without one (they share `capacity - reserved` equally).
    pub unreserved_segments: u64,
    /// The allocation whose circuit holds it alone (seed 004: the transceivers and ports of a
    /// circuit are reserved so that no other path may use them).
    pub circuit: Option<u64>,
}

impl LinkState {
    /// Unreserved bandwidth.
    pub fn free_bps(&self) -> u64 {
        self.capacity_bps.saturating_sub(self.reserved_bps)
    }

    /// True for a port's or a switch link's cable (the ones a circuit holds); false for a
    /// brick's memory link.
    fn is_cable(&self) -> bool {
        matches!(self.b, Endpoint::Switch { .. })
    }

    fn segments(&self) -> u64 {
        self.reserved_segments + self.unreserved_segments
    }

    fn admits(&self, bandwidth_bps: u64) -> bool {
        if bandwidth_bps == 0 {
            // A segment without reservation lives on the fair share: there must be one.
            self.free_bps() > 0
        } else {
            self.free_bps() >= bandwidth_bps
        }
    }
}

/// Who a path is for (see [`Graph::find_path_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathUse {
    /// A segment sharing its links with others: no circuit's link.
    Shared,
    /// A circuit: only cables no segment crosses.
    Circuit,
    /// Any link, circuits' included (to tell a refused request which circuits stand in its way).
    Any,
}

/// What [`Graph::find_path_with`] looks for.
#[derive(Debug, Clone, Copy)]
pub struct PathQuery<'a> {
    /// Bandwidth every link must have unreserved (0: a fair share must be left).
    pub bandwidth_bps: u64,
    /// The only links it may cross, when given.
    pub allowed: Option<&'a HashSet<String>>,
    /// Links it must not cross, when given.
    pub avoid: Option<&'a HashSet<String>>,
    /// Shared, circuit or any.
    pub usage: PathUse,
}

/// The resource graph.
#[derive(Debug, Clone, Default)]
pub struct Graph {
    topology: Option<Topology>,
    switches: BTreeMap<String, BTreeSet<String>>,
    links: BTreeMap<String, LinkState>,
    switch_adj: HashMap<String, Vec<(String, String)>>,
}

/// Id of the link that stands for brick `id`'s memory ([`Graph::set_memory`]); port names
/// cannot contain `:`, so it is distinct from every port link.
pub fn memory_link_id(id: u64) -> String {
    format!("brick:{id}:memory:")
}

/// Id of the link of a node's or brick's port.
pub fn port_link_id(owner: &Endpoint, port: &str) -> String {
    match owner {
        Endpoint::Node { id } => format!("node:{id}:{port}"),
        Endpoint::Brick { id } => format!("brick:{id}:{port}"),
        Endpoint::Switch { name } => format!("switch:{name}:{port}"),
    }
}

impl Graph {
    /// A graph with the switches and switch links of `topology` (or none).
    pub fn new(topology: Option<Topology>) -> Graph {
        let mut g = Graph {
            topology: None,
            ..Graph::default()
        };
        if let Some(t) = &topology {
            for s in t.declared() {
                g.switches.entry(s.to_string()).or_default();
            }
            for l in &t.links {
                let id = format!("switch:{}:{}", l.a, l.b);
                g.insert_link(
                    id,
                    Endpoint::Switch { name: l.a.clone() },
                    Endpoint::Switch { name: l.b.clone() },
                    l.bandwidth_bps,
                );
            }
        }
        g.topology = topology;
        g
    }

    /// Adds a switch a store remembers (created on demand by an earlier registration).
    pub fn add_switch(&mut self, name: &str) {
        self.switches.entry(name.to_string()).or_default();
    }

    /// True when the switch exists.
    pub fn has_switch(&self, name: &str) -> bool {
        self.switches.contains_key(name)
    }

    fn insert_link(&mut self, id: String, a: Endpoint, b: Endpoint, capacity_bps: u64) {
        for end in [&a, &b] {
            if let Endpoint::Switch { name } = end {
                self.switches.entry(name.clone()).or_default().insert(id.clone());
            }
        }
        if let (Endpoint::Switch { name: sa }, Endpoint::Switch { name: sb }) = (&a, &b) {
            self.switch_adj
                .entry(sa.clone())
                .or_default()
                .push((id.clone(), sb.clone()));
            self.switch_adj
                .entry(sb.clone())
                .or_default()
                .push((id.clone(), sa.clone()));
        }
        self.links.insert(
            id,
            LinkState {
                a,
                b,
                capacity_bps,
                reserved_bps: 0,
                reserved_segments: 0,
                unreserved_segments: 0,
                circuit: None,
            },
        );
    }

    /// Decides which switch each port is cabled to and checks the list: at least one port,
    /// unique valid names, a positive bandwidth, a switch that exists in the topology.
    pub fn resolve_ports(&self, owner_name: &str, specs: &[PortSpec]) -> Result<Vec<Port>, GraphError> {
        if specs.is_empty() {
            return Err(GraphError::Invalid(format!("{owner_name} declares no port")));
        }
        if specs.len() > 64 {
            return Err(GraphError::Invalid(format!("{owner_name} declares more than 64 ports")));
        }
        let mut seen = HashSet::new();
        let mut out = Vec::with_capacity(specs.len());
        for p in specs {
            check_name("port", &p.name)?;
            if !seen.insert(p.name.as_str()) {
                return Err(GraphError::Invalid(format!(
                    "{owner_name} declares port {} twice",
                    p.name
                )));
            }
            if p.bandwidth_bps == 0 {
                return Err(GraphError::Invalid(format!(
                    "port {owner_name}:{} has no bandwidth (bandwidth_bps must be positive)",
                    p.name
                )));
            }
            let key = format!("{owner_name}:{}", p.name);
            let switch = match (&p.switch, &self.topology) {
                (Some(s), _) => s.clone(),
                (None, Some(t)) => t
                    .ports
                    .get(&key)
                    .cloned()
                    .unwrap_or_else(|| t.default_switch().to_string()),
                (None, None) => DEFAULT_SWITCH.to_string(),
            };
            check_name("switch", &switch)?;
            if self.topology.is_some() && !self.switches.contains_key(&switch) {
                return Err(GraphError::UnknownSwitch { port: key, switch });
            }
            out.push(Port {
                name: p.name.clone(),
                bandwidth_bps: p.bandwidth_bps,
                switch,
                link: String::new(),
            });
        }
        Ok(out)
    }

    /// Cables `ports` of `owner` (fills in their link ids). Links kept from an earlier
    /// registration keep what is reserved on them; links of ports that disappeared are removed
    /// (the caller checked no segment crosses them).
    pub fn attach(&mut self, owner: &Endpoint, old: &[Port], ports: &mut [Port]) {
        for p in ports.iter_mut() {
            p.link = port_link_id(owner, &p.name);
        }
        for o in old {
            let kept = ports.iter().any(|p| p.name == o.name && p.switch == o.switch);
            if !kept {
                self.links.remove(&o.link);
                if let Some(s) = self.switches.get_mut(&o.switch) {
                    s.remove(&o.link);
                }
            }
        }
        for p in ports.iter() {
            match self.links.get_mut(&p.link) {
                Some(l) => l.capacity_bps = p.bandwidth_bps,
                None => self.insert_link(
                    p.link.clone(),
                    owner.clone(),
                    Endpoint::Switch { name: p.switch.clone() },
                    p.bandwidth_bps,
                ),
            }
        }
    }

    /// The power brick `name` draws, if the topology file declares it.
    pub fn power_of(&self, name: &str) -> Option<crate::api::BrickPower> {
        self.topology.as_ref().and_then(|t| t.power.get(name).copied())
    }

    /// A link's state.
    pub fn link(&self, id: &str) -> Option<&LinkState> {
        self.links.get(id)
    }

    /// Sets what brick `id`'s memory can serve (bytes/s; `None`: unbounded but by its ports).
    /// The memory is a link of its own ([`memory_link_id`]) that every path to the brick ends
    /// with, so the rates of the brick's segments add up to at most this, as a port's do.
    pub fn set_memory(&mut self, id: u64, serve_bps: Option<u64>) {
        let link = memory_link_id(id);
        match (serve_bps, self.links.get_mut(&link)) {
            (Some(bps), Some(l)) => l.capacity_bps = bps,
            (Some(bps), None) => {
                let brick = Endpoint::Brick { id };
                self.insert_link(link, brick.clone(), brick, bps);
            }
            (None, _) => {
                self.links.remove(&link);
            }
        }
    }

    /// The memory link of brick `id`, if its memory's rate is known.
    pub fn memory_link(&self, id: u64) -> Option<String> {
        let link = memory_link_id(id);
        self.links.contains_key(&link).then_some(link)
    }

    /// True when link `id` exists and admits `bandwidth_bps` more.
    pub fn admits(&self, id: &str, bandwidth_bps: u64) -> bool {
        self.links.get(id).is_some_and(|l| l.admits(bandwidth_bps))
    }

    /// The shortest path from one of `node_ports` to one of `brick_ports` on which every link
    /// admits `bandwidth_bps` (and is in `allowed`, when given), crossing no circuit's link.
    pub fn find_path(
        &self,
        node_ports: &[Port],
        brick_ports: &[Port],
        bandwidth_bps: u64,
        allowed: Option<&HashSet<String>>,
    ) -> Option<Vec<String>> {
        self.find_path_with(
            node_ports,
            brick_ports,
            &PathQuery {
                bandwidth_bps,
                allowed,
                avoid: None,
                usage: PathUse::Shared,
            },
        )
    }

    /// [`Graph::find_path`] as `q` asks: shared with others, for a circuit, or regardless of
    /// circuits; avoiding some links.
    pub fn find_path_with(&self, node_ports: &[Port], brick_ports: &[Port], q: &PathQuery<'_>) -> Option<Vec<String>> {
        let usable = |id: &str| {
            q.allowed.is_none_or(|a| a.contains(id))
                && q.avoid.is_none_or(|a| !a.contains(id))
                && self.links.get(id).is_some_and(|l| {
                    l.admits(q.bandwidth_bps)
                        && match q.usage {
                            PathUse::Shared => l.circuit.is_none(),
                            PathUse::Circuit => l.circuit.is_none() && (l.segments() == 0 || !l.is_cable()),
                            PathUse::Any => true,
                        }
                })
        };
        let mut best: Option<(usize, u64, Vec<String>)> = None;
        let mut routes: HashMap<&str, HashMap<String, Vec<String>>> = HashMap::new();
        for np in node_ports.iter().filter(|p| usable(&p.link)) {
            let from_here = routes
                .entry(np.switch.as_str())
                .or_insert_with(|| self.switch_routes(&np.switch, &usable));
            for bp in brick_ports.iter().filter(|p| usable(&p.link)) {
                let Some(middle) = from_here.get(&bp.switch) else {
                    continue;
                };
                let mut path = Vec::with_capacity(middle.len() + 2);
                path.push(np.link.clone());
                path.extend(middle.iter().cloned());
                path.push(bp.link.clone());
                let tightest = path
                    .iter()
                    .filter_map(|id| self.links.get(id))
                    .map(LinkState::free_bps)
                    .min()
                    .unwrap_or(0);
                let better = match &best {
                    None => true,
                    Some((len, free, _)) => path.len() < *len || (path.len() == *len && tightest > *free),
                };
                if better {
                    best = Some((path.len(), tightest, path));
                }
            }
        }
        best.map(|(_, _, p)| p)
    }

    /// Breadth-first search over switch links from `start`: for every reachable switch, the
    /// switch links of a shortest route.
    fn switch_routes(&self, start: &str, usable: &dyn Fn(&str) -> bool) -> HashMap<String, Vec<String>> {
        let mut routes: HashMap<String, Vec<String>> = HashMap::new();
        routes.insert(start.to_string(), Vec::new());
        let mut queue = VecDeque::from([start.to_string()]);
        while let Some(s) = queue.pop_front() {
            let here = routes.get(&s).cloned().unwrap_or_default();
            for (link, other) in self.switch_adj.get(&s).into_iter().flatten() {
                if routes.contains_key(other) || !usable(link) {
                    continue;
                }
                let mut r = here.clone();
                r.push(link.clone());
                routes.insert(other.clone(), r);
                queue.push_back(other.clone());
            }
        }
        routes
    }

    /// Accounts a segment with `bandwidth_bps` reserved (0: none) on every link of `path`.
    pub fn reserve(&mut self, path: &[String], bandwidth_bps: u64) {
        for id in path {
            if let Some(l) = self.links.get_mut(id) {
                if bandwidth_bps > 0 {
                    l.reserved_bps = l.reserved_bps.saturating_add(bandwidth_bps);
                    l.reserved_segments += 1;
                } else {
                    l.unreserved_segments += 1;
                }
            }
        }
    }

    /// Undoes [`Graph::reserve`]; a circuit's link whose last segment left is free again.
    pub fn release(&mut self, path: &[String], bandwidth_bps: u64) {
        for id in path {
            if let Some(l) = self.links.get_mut(id) {
                if bandwidth_bps > 0 {
                    l.reserved_bps = l.reserved_bps.saturating_sub(bandwidth_bps);
                    l.reserved_segments = l.reserved_segments.saturating_sub(1);
                } else {
                    l.unreserved_segments = l.unreserved_segments.saturating_sub(1);
                }
                if l.segments() == 0 {
                    l.circuit = None;
                }
            }
        }
    }

    /// Marks the cables of `path` (reserved with [`Graph::reserve`]) as held by allocation
    /// `owner`'s circuit: from now on only its segments may cross them.
    pub fn claim(&mut self, path: &[String], owner: u64) {
        for id in path {
            if let Some(l) = self.links.get_mut(id) {
                if l.is_cable() {
                    l.circuit = Some(owner);
                }
            }
        }
    }

    /// The circuits holding links of `path`: (link, allocation).
    pub fn held(&self, path: &[String]) -> Vec<(String, u64)> {
        path.iter()
            .filter_map(|id| self.links.get(id).and_then(|l| l.circuit.map(|c| (id.clone(), c))))
            .collect()
    }

    /// The switch a link's cable ends on, and at its other end the switch or the port's owner.
    pub fn ends(&self, id: &str) -> Option<(&Endpoint, &Endpoint)> {
        self.links.get(id).map(|l| (&l.a, &l.b))
    }

    /// The rate limit of a segment on `path`: its reservation, or its equal share of what is
    /// unreserved on the tightest link, shared with the other unreserved segments there. The
    /// limits on a link thus add up to at most its capacity.
    pub fn rate_limit(&self, path: &[String], bandwidth_bps: u64) -> u64 {
        if bandwidth_bps > 0 {
            return bandwidth_bps;
        }
        path.iter()
            .filter_map(|id| self.links.get(id))
            .map(|l| l.free_bps() / l.unreserved_segments.max(1))
            .min()
            .unwrap_or(0)
    }

    /// The switches, for `GET /v1/graph`.
    pub fn switches(&self) -> Vec<Switch> {
        self.switches
            .iter()
            .map(|(name, links)| Switch {
                name: name.clone(),
                links: links.iter().cloned().collect(),
            })
            .collect()
    }

    /// The switch names created on demand (not in the topology file), to persist.
    pub fn switch_names(&self) -> impl Iterator<Item = &str> {
        self.switches.keys().map(String::as_str)
    }

    /// The links, for `GET /v1/graph`.
    pub fn links(&self) -> Vec<Link> {
        self.links
            .iter()
            // Memory links show on their bricks (`serve_bps`, `promised_bps`).
            .filter(|(_, l)| !matches!((&l.a, &l.b), (Endpoint::Brick { .. }, Endpoint::Brick { .. })))
            .map(|(id, l)| Link {
                id: id.clone(),
                a: l.a.clone(),
                b: l.b.clone(),
                capacity_bps: l.capacity_bps,
                reserved_bps: l.reserved_bps,
                free_bps: l.free_bps(),
                segments: l.reserved_segments + l.unreserved_segments,
                circuit: l.circuit,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, bw: u64, switch: Option<&str>) -> PortSpec {
        PortSpec {
            name: name.into(),
            bandwidth_bps: bw,
            switch: switch.map(str::to_string),
        }
    }

    fn attach(g: &mut Graph, owner: Endpoint, name: &str, specs: &[PortSpec]) -> Vec<Port> {
        let mut p = g.resolve_ports(name, specs).unwrap();
        g.attach(&owner, &[], &mut p);
        p
    }

    #[test]
    fn paths_cross_switch_links_and_respect_bandwidth() {
        let t = Topology::parse(
            r#"{"switches": ["a", "b", "spine"],
                "links": [{"a": "a", "b": "spine", "bandwidth_bps": 100},
                          {"a": "b", "b": "spine", "bandwidth_bps": 50}],
                "ports": {"n:eth0": "a", "m:p0": "b"}}"#,
        )
        .unwrap();
        let mut g = Graph::new(Some(t));
        let n = attach(&mut g, Endpoint::Node { id: 1 }, "n", &[spec("eth0", 1000, None)]);
        let m = attach(&mut g, Endpoint::Brick { id: 2 }, "m", &[spec("p0", 1000, None)]);
        let p = g.find_path(&n, &m, 40, None).unwrap();
        assert_eq!(p, vec!["node:1:eth0", "switch:a:spine", "switch:b:spine", "brick:2:p0"]);
        g.reserve(&p, 40);
        assert_eq!(g.find_path(&n, &m, 40, None), None, "the b-spine link has 10 left");
        assert_eq!(g.rate_limit(&p, 0), 10, "fair share of the tightest link");
        g.release(&p, 40);
        assert!(g.find_path(&n, &m, 40, None).is_some());
        assert!(matches!(
            g.resolve_ports("x", &[spec("p", 1, Some("nowhere"))]),
            Err(GraphError::UnknownSwitch { .. })
        ));
    }

    #[test]
    fn without_topology_everything_is_on_rack() {
        let mut g = Graph::new(None);
        let n = attach(&mut g, Endpoint::Node { id: 1 }, "n", &[spec("eth0", 100, None)]);
        let m = attach(
            &mut g,
            Endpoint::Brick { id: 1 },
            "m",
            &[spec("p0", 80, None), spec("p1", 60, None)],
        );
        let p = g.find_path(&n, &m, 0, None).unwrap();
        assert_eq!(p, vec!["node:1:eth0", "brick:1:p0"], "the port with most left");
        g.reserve(&p, 0);
        g.reserve(&p, 0);
        assert_eq!(g.rate_limit(&p, 0), 40);
        let isolated = attach(&mut g, Endpoint::Brick { id: 2 }, "o", &[spec("p0", 80, Some("other"))]);
        assert_eq!(g.find_path(&n, &isolated, 0, None), None);
        assert!(g.resolve_ports("x", &[]).is_err());
        assert!(g.resolve_ports("x", &[spec("a", 1, None), spec("a", 1, None)]).is_err());
        assert!(g.resolve_ports("x", &[spec("a:b", 1, None)]).is_err());
        assert!(g.resolve_ports("x", &[spec("a", 0, None)]).is_err());
    }
}
