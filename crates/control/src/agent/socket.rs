//! The agent's Unix socket: created with permissions that match who is admitted, and its accept
//! loop, which reads each peer's credentials (`SO_PEERCRED`), turns away peers not admitted and
//! connections over the cap, and serves each admitted process on a thread of its own.

use super::connection::serve;
use super::protocol::{refusal, reply};
use super::{lock, AgentConfig, AgentError, Shared};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Stack of a connection thread: JSON and an HTTP call need far less than the 2 MiB default,
/// and a thousand connections should not reserve 2 GiB of address space.
const CONNECTION_STACK_BYTES: usize = 256 << 10;

/// The socket's permission bits: only root and the agent's user unless others are admitted;
/// a single admitted group gets group access (the socket's group is set to it); any other
/// admission (a user, several groups) needs the file open to all, and the peer check is the gate.
fn socket_mode(cfg: &AgentConfig) -> u32 {
    let own = own_uid();
    let other_users = cfg.allow_uids.iter().any(|u| *u != 0 && Some(*u) != own);
    match (other_users, cfg.allow_gids.len()) {
        (false, 0) => 0o600,
        (false, 1) => 0o660,
        _ => 0o666,
    }
}

/// Creates the socket (replacing one a dead agent left) with the permissions of [`socket_mode`].
pub(super) fn bind(cfg: &AgentConfig) -> Result<UnixListener, AgentError> {
    let path = &cfg.socket;
    let err = |cause| AgentError::Listen {
        path: path.to_path_buf(),
        cause,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    // A socket left by an agent that died is in the way; anything else is not ours to remove.
    if let Ok(m) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if m.file_type().is_socket() && UnixStream::connect(path).is_err() {
            std::fs::remove_file(path).map_err(err)?;
        }
    }
    let l = UnixListener::bind(path).map_err(err)?;
    let mode = socket_mode(cfg);
    if mode == 0o660 {
        std::os::unix::fs::chown(path, None, cfg.allow_gids.first().copied()).map_err(err)?;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(err)?;
    Ok(l)
}

/// The agent's own (effective) user id, read without a system call wrapper: `/proc/self` is
/// owned by it.
fn own_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// The supplementary groups of `pid` (SO_PEERCRED carries the primary group only).
fn supplementary_groups(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Groups:"))
                .map(|g| g.split_whitespace().filter_map(|x| x.parse().ok()).collect())
        })
        .unwrap_or_default()
}

/// Why a peer is not admitted, with the options that would admit it; `None`: admitted.
fn refuse_peer(cfg: &AgentConfig, cred: &rackmem_sys::PeerCredentials) -> Option<String> {
    let own = own_uid();
    if cred.uid == 0 || Some(cred.uid) == own || cfg.allow_uids.contains(&cred.uid) {
        return None;
    }
    if cfg.allow_gids.contains(&cred.gid)
        || (!cfg.allow_gids.is_empty()
            && supplementary_groups(cred.pid)
                .iter()
                .any(|g| cfg.allow_gids.contains(g)))
    {
        return None;
    }
    Some(format!(
        "uid {} (gid {}, pid {}) may not use this agent: it admits root{}{}{}; start it with \
         --allow-uid {} or --allow-gid {} to admit this process",
        cred.uid,
        cred.gid,
        cred.pid,
        own.filter(|u| *u != 0)
            .map(|u| format!(", uid {u}"))
            .unwrap_or_default(),
        if cfg.allow_uids.is_empty() {
            String::new()
        } else {
            format!(", uids {:?}", cfg.allow_uids)
        },
        if cfg.allow_gids.is_empty() {
            String::new()
        } else {
            format!(", gids {:?}", cfg.allow_gids)
        },
        cred.uid,
        cred.gid
    ))
}

/// Writes one refusal line to a connection that is not served, and closes it.
fn turn_away(mut conn: UnixStream, code: &str, message: String) {
    let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = reply(&mut conn, &refusal(code, message));
    let _ = conn.shutdown(std::net::Shutdown::Both);
}

/// Accepts connections until the agent stops: checks each peer and the connection cap, then
/// serves the process on a thread of its own.
pub(super) fn accept_loop(shared: &Arc<Shared>, listener: UnixListener) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(conn) = conn else {
            continue;
        };
        let cred = match rackmem_sys::peer_credentials(conn.as_fd()) {
            Ok(c) => c,
            Err(e) => {
                shared.counters.connections_refused.fetch_add(1, Ordering::Relaxed);
                turn_away(
                    conn,
                    "permission_denied",
                    format!("cannot read the peer's credentials: {e}"),
                );
                continue;
            }
        };
        if let Some(why) = refuse_peer(&shared.cfg, &cred) {
            shared.counters.connections_refused.fetch_add(1, Ordering::Relaxed);
            turn_away(conn, "permission_denied", why);
            continue;
        }
        // The count goes up here, in the only thread that accepts, so the cap cannot be raced.
        let max = shared.cfg.max_connections as u64;
        if shared.counters.processes.load(Ordering::Acquire) >= max {
            shared.counters.connections_refused.fetch_add(1, Ordering::Relaxed);
            turn_away(
                conn,
                "too_many_connections",
                format!(
                    "the agent serves at most {max} processes at once (--max-connections); \
                     try again when one exits"
                ),
            );
            continue;
        }
        let per_uid = shared.cfg.max_connections_per_uid;
        {
            let mut m = lock(&shared.per_uid);
            let mine = m.entry(cred.uid).or_insert(0);
            if *mine >= per_uid {
                drop(m);
                shared.counters.connections_refused.fetch_add(1, Ordering::Relaxed);
                turn_away(
                    conn,
                    "too_many_connections",
                    format!(
                        "the agent serves at most {per_uid} processes of one user at once \
                         (--max-connections-per-uid), and uid {} has that many; try again when \
                         one exits",
                        cred.uid
                    ),
                );
                continue;
            }
            *mine += 1;
        }
        shared.counters.processes.fetch_add(1, Ordering::AcqRel);
        let s = shared.clone();
        let done = move |s: &Shared| {
            s.counters.processes.fetch_sub(1, Ordering::AcqRel);
            let mut m = lock(&s.per_uid);
            if let Some(n) = m.get_mut(&cred.uid) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&cred.uid);
                }
            }
        };
        let spawned = std::thread::Builder::new()
            .name("agent-process".into())
            .stack_size(CONNECTION_STACK_BYTES)
            .spawn(move || {
                serve(&s, conn, cred);
                done(&s);
            });
        if let Err(e) = spawned {
            done(shared);
            eprintln!("rackmem agent: cannot serve a process: {e}");
        }
    }
}
