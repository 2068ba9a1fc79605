//! Switch drivers: how the control plane's circuits (seed 004, section V: "setting up the
//! point-to-point circuits between brick transceivers via the configuration of the appropriate
//! network switches") reach real switches.
//!
//! The control plane works out, for every switch, the whole set of [`SwitchRule`]s the circuits
//! crossing it need, and hands that set to a [`SwitchDriver`] whenever it changes. A driver
//! makes the switch forward exactly by those rules, all at once: a switch never forwards by half
//! of an update.
//!
//! - [`DryRun`] configures nothing and keeps what it was given (the default: `GET /v1/circuits`
//!   and `rackmem ctl circuits` show it);
//! - [`Nft`] configures Linux hosts acting as switches (a lab, or a software switch): each rule
//!   becomes two netdev-family ingress chains that `fwd` each port's frames to the other port,
//!   so two ports of the switch form a point-to-point link and nothing else reaches them. It
//!   writes them through `nft -j -f -` (the JSON interface: one atomic transaction per
//!   switch), optionally inside a network namespace (`ip netns exec`).

use crate::api::SwitchRule;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Why a switch could not be configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SwitchError {
    /// The driver's configuration does not know the switch.
    #[error("switch {switch:?} is not in the switch driver's configuration ({config}): add it, with its ports")]
    UnknownSwitch {
        /// The switch.
        switch: String,
        /// The configuration file.
        config: String,
    },
    /// The driver's configuration does not say which interface stands for a port.
    #[error("switch {switch:?} has no interface for port {port:?} in the switch driver's configuration ({config})")]
    UnknownPort {
        /// The switch.
        switch: String,
        /// The port (`OWNER:PORT` or `switch:OTHER`).
        port: String,
        /// The configuration file.
        config: String,
    },
    /// The configuration file cannot be read or is malformed.
    #[error("switch driver configuration {path}: {message}")]
    Config {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// Applying the rules failed (the switch forwards as before: updates are atomic).
    #[error("configuring switch {switch:?}: {message}")]
    Apply {
        /// The switch.
        switch: String,
        /// What failed (the command's own message).
        message: String,
    },
}

/// What configures the switches.
///
/// [`SwitchDriver::apply`] is called with the control plane's state locked, one switch at a
/// time, with the whole set of rules that switch must forward by: a driver keeps no state of
/// its own to reconcile, and a failed call leaves the switch as it was.
pub trait SwitchDriver: Send + 'static {
    /// What to show users: `dry-run`, `nft:FILE`.
    fn describe(&self) -> String;
    /// Makes `switch` forward by exactly `rules` (each connecting two of its ports), at once.
    fn apply(&mut self, switch: &str, rules: &[SwitchRule]) -> Result<(), SwitchError>;
    /// The switches it configures whatever the circuits (given their rules again at start, so
    /// that one left forwarding for a circuit released meanwhile stops).
    fn known_switches(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Configures nothing: the rules are recorded only (see `GET /v1/circuits`).
#[derive(Debug, Default)]
pub struct DryRun {
    applied: BTreeMap<String, Vec<SwitchRule>>,
}

impl DryRun {
    /// What each switch was last given.
    pub fn applied(&self) -> &BTreeMap<String, Vec<SwitchRule>> {
        &self.applied
    }
}

impl SwitchDriver for DryRun {
    fn describe(&self) -> String {
        "dry-run".to_string()
    }

    fn apply(&mut self, switch: &str, rules: &[SwitchRule]) -> Result<(), SwitchError> {
        self.applied.insert(switch.to_string(), rules.to_vec());
        Ok(())
    }
}

/// The [`Nft`] driver's configuration file (JSON): for each switch, where its rules go and
/// which interface stands for each of its ports.
///
/// ```json
/// {"switches": {"rack": {"netns": "sw1",
///                         "ports": {"web1:eth0": "sw-web1", "mem1:p0": "sw-mem1",
///                                   "switch:spine": "sw-up"}}}}
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NftConfig {
    /// By switch name (as in the topology).
    pub switches: BTreeMap<String, NftSwitch>,
    /// The `nft` program (default: `nft` on PATH).
    #[serde(default)]
    pub nft: Option<PathBuf>,
}

/// One Linux host acting as a switch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NftSwitch {
    /// The network namespace its interfaces live in (absent: the control plane's own).
    #[serde(default)]
    pub netns: Option<String>,
    /// Interface of each port: `OWNER:PORT` (a node's or brick's name and port name) or
    /// `switch:OTHER` (the cable to switch OTHER).
    pub ports: BTreeMap<String, String>,
}

/// How long one `nft` run may take before it is killed and the update counted as failed.
const NFT_TIMEOUT: Duration = Duration::from_secs(5);

/// Configures Linux hosts acting as switches with nftables (netdev family, `fwd`).
#[derive(Debug)]
pub struct Nft {
    path: String,
    config: NftConfig,
}

/// Only what interface and chain names may hold, so that nothing read from a file can step
/// outside its JSON string or its namespace's name.
fn plain_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@'))
}

impl Nft {
    /// Reads the configuration file at `path`.
    pub fn open(path: &Path) -> Result<Nft, SwitchError> {
        let shown = path.display().to_string();
        let bad = |message: String| SwitchError::Config {
            path: shown.clone(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let config: NftConfig = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        for (name, sw) in &config.switches {
            if let Some(ns) = &sw.netns {
                if !plain_name(ns) {
                    return Err(bad(format!("switch {name:?}: netns {ns:?} is not a plain name")));
                }
            }
            for (port, dev) in &sw.ports {
                if !plain_name(dev) || dev.len() > 15 {
                    return Err(bad(format!(
                        "switch {name:?}, port {port:?}: {dev:?} is not an interface name (1 to 15 of A-Z a-z 0-9 - _ . @)"
                    )));
                }
            }
        }
        Ok(Nft { path: shown, config })
    }

    /// The table a switch's chains live in (one per switch, so that several switches may share
    /// a host).
    fn table(switch: &str) -> String {
        let clean: String = switch
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        format!("rackmem_{clean}")
    }

    /// The nft JSON transaction that makes `switch` forward by `rules` only: the switch's table
    /// created if absent, deleted, and created again with one ingress chain per port of a
    /// rule, each forwarding to the rule's other port. One transaction: all or nothing.
    pub fn script(&self, switch: &str, rules: &[SwitchRule]) -> Result<serde_json::Value, SwitchError> {
        let sw = self
            .config
            .switches
            .get(switch)
            .ok_or_else(|| SwitchError::UnknownSwitch {
                switch: switch.to_string(),
                config: self.path.clone(),
            })?;
        let dev = |port: &str| {
            sw.ports.get(port).cloned().ok_or_else(|| SwitchError::UnknownPort {
                switch: switch.to_string(),
                port: port.to_string(),
                config: self.path.clone(),
            })
        };
        let table = Self::table(switch);
        let t = serde_json::json!({"family": "netdev", "name": table});
        let mut cmds = vec![
            serde_json::json!({"add": {"table": t}}),
            serde_json::json!({"delete": {"table": t}}),
            serde_json::json!({"add": {"table": t}}),
        ];
        for (i, r) in rules.iter().enumerate() {
            let (a, b) = (dev(&r.a.port)?, dev(&r.b.port)?);
            for (side, from, to) in [("a", &a, &b), ("b", &b, &a)] {
                let chain = format!("c{}_{i}_{side}", r.allocation);
                cmds.push(serde_json::json!({"add": {"chain": {
                    "family": "netdev", "table": table, "name": chain,
                    "type": "filter", "hook": "ingress", "dev": from, "prio": 0, "policy": "accept"}}}));
                cmds.push(serde_json::json!({"add": {"rule": {
                    "family": "netdev", "table": table, "chain": chain,
                    "expr": [{"fwd": {"dev": to}}]}}}));
            }
        }
        Ok(serde_json::json!({ "nftables": cmds }))
    }
}

impl SwitchDriver for Nft {
    fn describe(&self) -> String {
        format!("nft:{}", self.path)
    }

    fn known_switches(&self) -> Vec<String> {
        self.config.switches.keys().cloned().collect()
    }

    fn apply(&mut self, switch: &str, rules: &[SwitchRule]) -> Result<(), SwitchError> {
        let script = self.script(switch, rules)?;
        let fail = |message: String| SwitchError::Apply {
            switch: switch.to_string(),
            message,
        };
        let nft = self.config.nft.clone().unwrap_or_else(|| PathBuf::from("nft"));
        let mut cmd = match &self.config.switches.get(switch).and_then(|s| s.netns.clone()) {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&nft);
                c
            }
            None => Command::new(&nft),
        };
        cmd.args(["-j", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| {
            fail(format!(
                "cannot run {cmd:?}: {e} (the nft driver needs nftables and iproute2: apt-get install nftables iproute2)"
            ))
        })?;
        let body = script.to_string();
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(body.as_bytes())
                .map_err(|e| fail(format!("writing to nft: {e}")))?;
        }
        let mut stderr = child.stderr.take();
        let reader = std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(e) = stderr.as_mut() {
                // At most 64 KiB of nft's complaints are kept.
                let _ = e.take(64 << 10).read_to_string(&mut s);
            }
            s
        });
        let deadline = Instant::now() + NFT_TIMEOUT;
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_micros(500)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(fail(format!("nft did not finish within {NFT_TIMEOUT:?}; killed")));
                }
                Err(e) => return Err(fail(format!("waiting for nft: {e}"))),
            }
        };
        let err = reader.join().unwrap_or_default();
        if status.success() {
            Ok(())
        } else {
            Err(fail(format!("nft exited with {status}: {}", err.trim())))
        }
    }
}

/// Opens a driver by its command-line name: `dry-run`, or `nft:FILE`.
pub fn open(spec: &str) -> Result<Box<dyn SwitchDriver>, SwitchError> {
    match spec {
        "dry-run" => Ok(Box::new(DryRun::default())),
        s => match s.strip_prefix("nft:") {
            Some(path) if !path.is_empty() => Ok(Box::new(Nft::open(Path::new(path))?)),
            _ => Err(SwitchError::Config {
                path: spec.to_string(),
                message: "unknown switch driver: use dry-run or nft:FILE".to_string(),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::RulePort;

    fn rule(a: &str, b: &str) -> SwitchRule {
        SwitchRule {
            switch: "rack".into(),
            allocation: 7,
            a: RulePort {
                link: "node:1:eth0".into(),
                port: a.into(),
            },
            b: RulePort {
                link: "brick:1:p0".into(),
                port: b.into(),
            },
        }
    }

    #[test]
    fn nft_script_forwards_each_port_to_the_other_in_one_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("switches.json");
        std::fs::write(
            &f,
            r#"{"switches": {"rack": {"netns": "sw", "ports": {"web1:eth0": "sw-n0", "mem1:p0": "sw-b0"}}}}"#,
        )
        .unwrap();
        let d = Nft::open(&f).unwrap();
        let s = d.script("rack", &[rule("web1:eth0", "mem1:p0")]).unwrap();
        let cmds = s["nftables"].as_array().unwrap();
        assert_eq!(cmds.len(), 3 + 4);
        assert!(cmds[1]["delete"]["table"]["name"] == "rackmem_rack");
        assert_eq!(cmds[3]["add"]["chain"]["dev"], "sw-n0");
        assert_eq!(cmds[4]["add"]["rule"]["expr"][0]["fwd"]["dev"], "sw-b0");
        assert_eq!(cmds[5]["add"]["chain"]["dev"], "sw-b0");
        assert_eq!(cmds[6]["add"]["rule"]["expr"][0]["fwd"]["dev"], "sw-n0");
        assert!(matches!(
            d.script("rack", &[rule("web1:eth0", "mem2:p0")]),
            Err(SwitchError::UnknownPort { .. })
        ));
        assert!(matches!(d.script("spine", &[]), Err(SwitchError::UnknownSwitch { .. })));
        std::fs::write(&f, r#"{"switches": {"rack": {"ports": {"a:b": "x\"; drop"}}}}"#).unwrap();
        assert!(matches!(Nft::open(&f), Err(SwitchError::Config { .. })));
    }
}
