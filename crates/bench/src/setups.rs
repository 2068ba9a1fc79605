//! The rackmem setups a bench compares: a name and the options `rackmem run` gets.
//!
//! The built-in ones ([`BUILT_IN`]) are what `--transports` names; `--setup NAME=ARGS` adds
//! others ([`Setup::from_str`]), so two configurations of one build run side by side. Each setup
//! runs with the current build and, when a baseline is given, with the baseline too
//! ([`crate::rackmem::Build`]); its rows are then named `NAME` and `NAME@baseline`.

use crate::loopback::LoopbackBrick;
use crate::BenchError;
use std::str::FromStr;

/// The built-in setups: defaults (`rackmem run` with no option), previous-defaults (what it did
/// before shared memory), unix (Unix-socket link), tcp (a brick on TCP loopback), shm (shared
/// memory asked for), huge (`--huge-pages`: 2 MiB units on the defaults).
pub const BUILT_IN: [&str; 6] = ["defaults", "previous-defaults", "unix", "tcp", "shm", "huge"];

/// What `rackmem run` did by default before shared memory and the runtime-placed handler: the
/// embedded brick over its socket, a handler spinning 200 µs after each fault.
pub const PREVIOUS_DEFAULTS: [&str; 3] = ["--no-shared-memory", "--handler", "hybrid:200"];

/// One rackmem setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setup {
    /// Its name in tables and JSON (`rackmem NAME`).
    pub name: String,
    /// The options `rackmem run` gets, before `--`.
    pub args: Vec<String>,
}

impl Setup {
    /// Built-in setup `name`; `tcp_brick` is the bench's brick on TCP loopback (needed by `tcp`
    /// only).
    pub fn built_in(name: &str, tcp_brick: Option<&LoopbackBrick>) -> Result<Setup, BenchError> {
        let args: Vec<String> = match name {
            "defaults" => Vec::new(),
            "previous-defaults" => PREVIOUS_DEFAULTS.iter().map(|s| s.to_string()).collect(),
            "unix" => vec!["--no-shared-memory".into()],
            "shm" => vec!["--shared-memory".into()],
            "huge" => vec!["--huge-pages".into()],
            "tcp" => tcp_brick
                .ok_or_else(|| BenchError::Brick("the tcp setup needs the bench's TCP brick".into()))?
                .run_args(),
            other => return Err(unknown(other)),
        };
        Ok(Setup {
            name: name.to_string(),
            args,
        })
    }

    /// Checks the names of built-in setups (`--transports`) and extra ones (`--setup`): every
    /// built-in name known, no extra one named like a built-in or another.
    pub fn check(built_in: &[String], extra: &[Setup]) -> Result<(), BenchError> {
        if let Some(t) = built_in.iter().find(|t| !BUILT_IN.contains(&t.as_str())) {
            return Err(unknown(t));
        }
        for (i, s) in extra.iter().enumerate() {
            if BUILT_IN.contains(&s.name.as_str()) || extra[..i].iter().any(|o| o.name == s.name) {
                return Err(BenchError::Config(format!(
                    "--setup {}: the name is taken (built-in setups: {}; names must differ)",
                    s.name,
                    BUILT_IN.join(", ")
                )));
            }
        }
        Ok(())
    }
}

fn unknown(name: &str) -> BenchError {
    BenchError::Config(format!(
        "unknown setup {name}: use {} (or add one with --setup NAME=ARGS)",
        BUILT_IN.join(", ")
    ))
}

/// `NAME=ARGS`: a setup named NAME running `rackmem run ARGS…` (ARGS split on whitespace; may
/// be empty, for a second copy of the defaults).
impl FromStr for Setup {
    type Err = String;

    fn from_str(s: &str) -> Result<Setup, String> {
        let Some((name, args)) = s.split_once('=') else {
            return Err(format!(
                "`{s}` is not NAME=ARGS: name the setup and give its `rackmem run` options, e.g. 'no-prefetch=--prefetch 0'"
            ));
        };
        let name = name.trim();
        let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+');
        if name.is_empty() || !name.chars().all(ok) {
            return Err(format!(
                "`{s}`: the setup name `{name}` must be letters, digits, `-`, `_`, `.` or `+` (it names rows: `rackmem {name}`)"
            ));
        }
        Ok(Setup {
            name: name.to_string(),
            args: args.split_whitespace().map(str::to_string).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_setups_parse_and_are_checked() {
        let s: Setup = "fifo=--eviction  fifo".parse().expect("setup");
        assert_eq!(
            (s.name.as_str(), s.args.as_slice()),
            ("fifo", &["--eviction".to_string(), "fifo".into()][..])
        );
        let same: Setup = "same=".parse().expect("empty args");
        assert!(same.args.is_empty());
        assert!("fifo".parse::<Setup>().unwrap_err().contains("NAME=ARGS"));
        assert!("=--eviction fifo".parse::<Setup>().is_err());
        assert!("a@b=x".parse::<Setup>().is_err());
        let t = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(Setup::check(&t(&["defaults", "tcp"]), std::slice::from_ref(&s)).is_ok());
        assert!(Setup::check(&t(&["udp"]), &[])
            .unwrap_err()
            .to_string()
            .contains("unknown setup udp"));
        let clash: Setup = "defaults=--stats".parse().expect("setup");
        assert!(Setup::check(&[], &[clash]).is_err());
        assert!(Setup::check(&[], &[s.clone(), s]).is_err());
    }

    #[test]
    fn built_in_setups_give_their_options() {
        assert!(Setup::built_in("defaults", None).expect("defaults").args.is_empty());
        assert_eq!(
            Setup::built_in("previous-defaults", None).expect("prev").args,
            PREVIOUS_DEFAULTS
        );
        assert!(Setup::built_in("tcp", None).is_err());
        let dir = tempfile::tempdir().expect("tempdir");
        let b = LoopbackBrick::start(crate::loopback::LinkKind::Tcp, 64 << 20, dir.path()).expect("brick");
        assert_eq!(
            Setup::built_in("tcp", Some(&b)).expect("tcp").args,
            ["--brick", b.addr.as_str(), "--secret", "bench"]
        );
    }
}
