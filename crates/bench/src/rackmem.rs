//! The `rackmem` executables the bench runs programs under: the build being measured, and
//! optionally a baseline build (another `rackmem`, e.g. from an older commit) compared with it
//! in the same run.
//!
//! `rackmem run` preloads the `librackmem.so` named by `RACKMEM_PRELOAD`, else the one next to
//! its executable (`./`, `../lib/`, `../`). A baseline must use its own library, never the one
//! the current build would pick: its runs get `RACKMEM_PRELOAD` set to the library found next to
//! it, or removed (so a baseline that carries its library inside finds it by itself).

use crate::BenchError;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Which build a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Build {
    /// The build being measured.
    Current,
    /// The baseline it is compared with.
    Baseline,
}

impl Build {
    /// What a setup's name gets for this build: nothing, or `@baseline`.
    pub fn suffix(self) -> &'static str {
        match self {
            Build::Current => "",
            Build::Baseline => "@baseline",
        }
    }
}

/// A `rackmem` executable and how its runs find their `librackmem.so`.
#[derive(Debug, Clone)]
pub struct Rackmem {
    /// The executable.
    pub exe: PathBuf,
    /// Which build it is.
    pub build: Build,
    /// The library its runs preload; `None`: whatever `rackmem run` finds by itself.
    pub preload: Option<PathBuf>,
}

/// Where `rackmem run` looks for `librackmem.so`, relative to its executable's directory.
const PRELOAD_NEXT_TO_EXE: [&str; 3] = ["librackmem.so", "../lib/librackmem.so", "../librackmem.so"];

impl Rackmem {
    /// The build being measured, at `exe` (the running `rackmem`): its runs find their library
    /// as `rackmem run` always does.
    pub fn current(exe: PathBuf) -> Rackmem {
        Rackmem {
            exe,
            build: Build::Current,
            preload: None,
        }
    }

    /// A baseline build at `exe`: checked to be a `rackmem` that runs, its `librackmem.so`
    /// found next to it.
    pub fn baseline(exe: &Path) -> Result<Rackmem, BenchError> {
        let bad = |why: String| BenchError::Config(format!("--baseline {}: {why}", exe.display()));
        if !exe.is_file() {
            return Err(bad(
                "no such file (give the path of another rackmem executable, e.g. one built from an older commit)"
                    .into(),
            ));
        }
        let exe = exe.canonicalize().unwrap_or_else(|_| exe.to_path_buf());
        let o = Command::new(&exe)
            .arg("--version")
            .output()
            .map_err(|e| bad(format!("cannot run it: {e}")))?;
        let version = String::from_utf8_lossy(&o.stdout);
        if !o.status.success() || !version.starts_with("rackmem") {
            return Err(bad(format!(
                "not a rackmem executable (`--version` printed {:?})",
                version.trim()
            )));
        }
        let dir = exe.parent().unwrap_or(Path::new("."));
        let preload = PRELOAD_NEXT_TO_EXE
            .iter()
            .map(|c| dir.join(c))
            .find(|p| p.is_file())
            .map(|p| p.canonicalize().unwrap_or(p));
        Ok(Rackmem {
            exe,
            build: Build::Baseline,
            preload,
        })
    }

    /// `rackmem run --local LOCAL EXTRA… -- PROG ARGS…` with this build.
    pub fn run<S: AsRef<std::ffi::OsStr>>(&self, local: &str, extra: &[S], prog: &Path, args: &[String]) -> Command {
        let mut c = Command::new(&self.exe);
        c.args(["run", "--local", local])
            .args(extra)
            .arg("--")
            .arg(prog)
            .args(args);
        if self.build == Build::Baseline {
            match &self.preload {
                Some(p) => c.env(rackmem_runtime::config::env::PRELOAD, p),
                None => c.env_remove(rackmem_runtime::config::env::PRELOAD),
            };
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_foreign_baseline_is_refused_with_its_path() {
        let e = Rackmem::baseline(Path::new("/nonexistent/rackmem"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/rackmem") && e.contains("no such file"), "{e}");
        let e = Rackmem::baseline(Path::new("/bin/true")).unwrap_err().to_string();
        assert!(e.contains("not a rackmem executable"), "{e}");
    }

    #[test]
    fn a_baseline_preloads_its_own_library() {
        let dir = std::env::temp_dir().join(format!("rackmem-bench-baseline-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("bin")).expect("dir");
        let exe = dir.join("bin/rackmem");
        std::fs::write(&exe, "#!/bin/sh\necho rackmem 0.0.0\n").expect("script");
        std::fs::write(dir.join("bin/librackmem.so"), "").expect("lib");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let b = Rackmem::baseline(&exe).expect("baseline");
        let c = b.run("25%", &["--stats"], Path::new("/bin/true"), &[]);
        let env: Vec<_> = c.get_envs().collect();
        let lib = dir.join("bin/librackmem.so").canonicalize().expect("lib");
        assert_eq!(
            env,
            vec![(
                std::ffi::OsStr::new(rackmem_runtime::config::env::PRELOAD),
                Some(lib.as_os_str())
            )]
        );
        let args: Vec<_> = c.get_args().collect();
        assert_eq!(args, ["run", "--local", "25%", "--stats", "--", "/bin/true"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
