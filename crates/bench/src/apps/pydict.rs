//! The `pydict` application: `bench/pydict.py`, a Python program built on one large dict of
//! small objects (3 million at `--scale 1`), then probed at random as many times, half the probes
//! hitting and updating the object found; inserts plus probes per second, a hash over every hit
//! the result.

use super::app::{python, script, Prepared, Sizes};
use super::AppsConfig;
use crate::BenchError;
use std::path::PathBuf;

/// `python3 bench/pydict.py ENTRIES ENTRIES`.
pub(super) fn prepare(cfg: &AppsConfig, sizes: Sizes, dir: PathBuf) -> Result<Prepared, BenchError> {
    Ok(Prepared {
        name: "pydict",
        metric: "ops_per_s",
        // The same interpreter as the NumPy applications, though this one imports nothing.
        prog: python(false)?,
        args: vec![
            script(cfg, "pydict.py")?.to_string_lossy().into_owned(),
            sizes.dict_entries.to_string(),
            sizes.dict_entries.to_string(),
            "1".into(),
        ],
        input: None,
        stdin: None,
        sizes,
        dir,
        env: Vec::new(),
    })
}
