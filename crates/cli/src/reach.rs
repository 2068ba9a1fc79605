//! What the runtime can reach in a program, told before `rackmem run` starts it: the runtime is
//! a shared library the dynamic loader preloads, and it sees the memory calls that go through the
//! C library. A program it cannot enter, or whose heap bypasses the C library, runs with its
//! memory local whatever `--local` says; the user hears so once, at start, with the reason, and
//! at exit with how much memory that was.
//!
//! Only the program's own file is read (its ELF headers, through a read cache: a 30 MiB Go
//! binary is not read whole); a script's interpreter is followed through its `#!` line.

use object::read::elf::{ElfFile64, ProgramHeader};
use object::read::ReadCache;
use object::{Endianness, FileKind, Object};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why the runtime cannot manage a program's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreachable {
    /// No dynamic loader: `LD_PRELOAD` is never read.
    Static,
    /// The Go runtime maps its heap with its own system calls, not the C library's.
    Go,
    /// Set-user-ID or set-group-ID for another user: the loader ignores `LD_PRELOAD`.
    SetId,
}

/// A program the runtime cannot manage, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The executable examined (the script's interpreter for a script).
    pub executable: PathBuf,
    /// Why.
    pub why: Unreachable,
}

impl Verdict {
    /// The notice given at start.
    pub fn at_start(&self) -> String {
        let exe = self.executable.display();
        match self.why {
            Unreachable::Static => format!(
                "rackmem: notice: {exe} is statically linked: the runtime is loaded by the dynamic loader \
                 (LD_PRELOAD), which a static program does not have, so all of its memory stays local \
                 whatever --local says. A dynamically linked build of it can use remote memory."
            ),
            Unreachable::Go => format!(
                "rackmem: notice: {exe} is a Go program: the Go runtime maps its heap with system calls of its \
                 own, which the runtime never sees, so its memory stays local whatever --local says (only \
                 memory its C code allocates through the C library can go remote)."
            ),
            Unreachable::SetId => format!(
                "rackmem: notice: {exe} is set-user-ID or set-group-ID for another user: the dynamic loader \
                 ignores LD_PRELOAD for it, so all of its memory stays local whatever --local says."
            ),
        }
    }

    /// The figure given at exit: the program's peak resident memory, all of it local.
    pub fn at_exit(&self, peak_rss_bytes: u64) -> String {
        let why = match self.why {
            Unreachable::Static => "it is statically linked",
            Unreachable::Go => "it is a Go program",
            Unreachable::SetId => "it is set-user-ID or set-group-ID",
        };
        format!(
            "rackmem: notice: {} held up to {} resident, all of it local ({why}).",
            self.executable.display(),
            rackmem_runtime::size::format_size(peak_rss_bytes)
        )
    }
}

/// Examines the program `command` names (searched in `PATH` as `execvp` does); `None` if the
/// runtime can reach it, or if it cannot be read (the start itself then reports the error).
pub fn examine(command: &Path) -> Option<Verdict> {
    let path = resolve(command)?;
    examine_file(&path, 0)
}

fn examine_file(path: &Path, depth: u32) -> Option<Verdict> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut head = [0u8; 256];
    let n = read_up_to(&mut file, &mut head)?;
    if head[..n].starts_with(b"#!") {
        // A script: what runs is its interpreter (a script may name another script, at most a
        // few deep, as the kernel allows).
        if depth >= 4 {
            return None;
        }
        let interp = interpreter(&head[..n])?;
        return examine_file(&interp, depth + 1);
    }
    let meta = file.metadata().ok()?;
    let verdict = |why| {
        Some(Verdict {
            executable: path.to_path_buf(),
            why,
        })
    };
    if set_id_for_another(&meta) {
        return verdict(Unreachable::SetId);
    }
    let cache = ReadCache::new(file);
    if FileKind::parse(&cache).ok()? != FileKind::Elf64 {
        return None;
    }
    let elf = ElfFile64::<Endianness, _>::parse(&cache).ok()?;
    let endian = elf.endian();
    let interp = elf
        .elf_program_headers()
        .iter()
        .any(|h| h.p_type(endian) == object::elf::PT_INTERP);
    if !interp {
        // Static, static-pie included: nothing reads LD_PRELOAD.
        return verdict(Unreachable::Static);
    }
    if elf.section_by_name(".go.buildinfo").is_some() || elf.section_by_name(".note.go.buildid").is_some() {
        return verdict(Unreachable::Go);
    }
    None
}

fn read_up_to(file: &mut std::fs::File, buf: &mut [u8]) -> Option<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(n)
}

/// The interpreter a `#!` line names; `/usr/bin/env NAME` is followed to NAME in `PATH`.
fn interpreter(head: &[u8]) -> Option<PathBuf> {
    let line = head.get(2..)?.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_whitespace();
    let interp = PathBuf::from(words.next()?);
    if interp.file_name().is_some_and(|n| n == "env") {
        // `env -S ...` and options: the first word that is not an option is the program.
        let prog = words.find(|w| !w.starts_with('-') && !w.contains('='))?;
        return resolve(Path::new(prog));
    }
    Some(interp)
}

/// `command` as `execvp` finds it: as given if it names a directory, else the first executable
/// file of that name in `PATH`.
fn resolve(command: &Path) -> Option<PathBuf> {
    if command.as_os_str().as_encoded_bytes().contains(&b'/') {
        return Some(command.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(command))
        .find(|p| p.metadata().is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
}

/// True if running the file changes the user or group to one the caller is not: the loader
/// then runs in secure-execution mode and ignores `LD_PRELOAD`.
fn set_id_for_another(meta: &std::fs::Metadata) -> bool {
    let (euid, egid) = rackmem_sys::process::effective_ids();
    (meta.mode() & 0o4000 != 0 && meta.uid() != euid) || (meta.mode() & 0o2000 != 0 && meta.gid() != egid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_program_is_reachable() {
        // This test binary is dynamically linked, written in Rust, neither Go nor set-ID.
        let me = std::env::current_exe().expect("the test binary's path");
        assert_eq!(examine(&me), None);
    }

    #[test]
    fn scripts_are_judged_by_their_interpreter() {
        assert_eq!(interpreter(b"#!/bin/sh -e\necho hi\n"), Some(PathBuf::from("/bin/sh")));
        let sh = resolve(Path::new("sh")).expect("sh in PATH");
        assert_eq!(interpreter(b"#!/usr/bin/env -S sh -e\n"), Some(sh));
        assert_eq!(interpreter(b"#!\n"), None);
        let dir = std::env::temp_dir().join(format!("rackmem-reach-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let script = dir.join("s");
        std::fs::write(
            &script,
            format!("#!{}\n", std::env::current_exe().expect("exe").display()),
        )
        .expect("write script");
        assert_eq!(examine(&script), None, "a script run by a dynamic program is reachable");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unreadable_or_missing_programs_are_left_to_the_start() {
        assert_eq!(examine(Path::new("/nonexistent/program")), None);
        assert_eq!(examine(Path::new("no-such-program-in-path-anywhere")), None);
    }

    #[test]
    fn notices_name_the_program_and_the_memory() {
        let v = Verdict {
            executable: PathBuf::from("/bin/busybox"),
            why: Unreachable::Static,
        };
        assert!(v.at_start().contains("/bin/busybox is statically linked"));
        let end = v.at_exit(64 << 20);
        assert!(end.contains("64.0 MiB") && end.contains("statically linked"), "{end}");
    }
}
