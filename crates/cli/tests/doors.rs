//! The doors a security probe found open (issue 26), each test performing the attack against
//! real processes and checking the defence: a store other users can read, connection floods
//! spread over many addresses of one prefix, silent connections that cost a brick a thread
//! each, an agent user holding every slot, a trickled request line, a node taking all memory,
//! `/metrics` for any token, and idempotency keys reused across nodes.

mod common;
use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

/// Runs `cat PATH` as user `nobody` (65534): the attack of a local user on the store.
fn read_as_nobody(path: &std::path::Path) -> std::process::Output {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
        .arg(path);
    run_with_deadline(c, std::time::Duration::from_secs(10))
}

#[test]
fn the_store_is_private_and_an_exposed_one_is_refused() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    // The attacker can reach the directory the store is created in.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let db = dir.path().join("state/control.db");
    let (mut control, url) = start_control(&db);
    // A brick registers: its grant key is now in the store (and its log).
    let o = ctl(&url, &["token", "create", "--role", "brick", "--name", "b1"]);
    assert!(o.status.success(), "{}", show(&o));
    let mode = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.mode() & 0o777);
    assert_eq!(mode(&dir.path().join("state")).expect("dir"), 0o700);
    for f in ["control.db", "control.db-wal", "control.db-shm"] {
        let p = dir.path().join("state").join(f);
        assert_eq!(mode(&p).unwrap_or_else(|e| panic!("{f}: {e}")), 0o600, "{f}");
        let o = read_as_nobody(&p);
        assert!(
            !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("Permission denied"),
            "user nobody read {f}: {}",
            show(&o)
        );
    }
    // Even with the directory opened up, the files themselves refuse the other user.
    std::fs::set_permissions(dir.path().join("state"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let o = read_as_nobody(&db);
    assert!(!o.status.success(), "user nobody read the store: {}", show(&o));
    control.kill_group();
    let _ = control.wait_until(std::time::Duration::from_secs(10));
    // A store left readable (an old version's, a careless copy) is refused at start, naming
    // the file and the fix, as ssh refuses a readable key.
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let mut c = Command::new(rackmem());
    c.args(["control", "--listen", "127.0.0.1:0", "--store"])
        .arg(format!("sqlite:{}", db.display()))
        .arg("--admin-token-file")
        .arg(admin_token_file());
    let o = run_with_deadline(c, std::time::Duration::from_secs(30));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "started on a readable store: {}", show(&o));
    assert!(
        err.contains("control.db") && err.contains("0644") && err.contains("chmod 600"),
        "the refusal names the file, its mode and the fix: {err}"
    );
}
