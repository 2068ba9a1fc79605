//! The default store: one SQLite file in WAL mode, one table of JSON records keyed by
//! (kind, name). A batch is one transaction.
//!
//! Checkpoints (copying the write-ahead log back into the database, with an fsync) run on a
//! thread of their own with a second connection, not inside a commit: measured with 1,000
//! bricks and 10,000 allocations, SQLite's automatic checkpoint made one commit in a hundred
//! take 1 to 40 ms; with it moved away the p99 of an allocation is about 0.1 ms.

use super::{Key, Op, Record, Snapshot, Store, StoreError};
use rusqlite::{params, Connection};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the checkpoint thread folds the log back into the database.
const CHECKPOINT_PERIOD: Duration = Duration::from_secs(1);

/// State in a SQLite database file.
#[derive(Debug)]
pub struct SqliteStore {
    path: PathBuf,
    conn: Connection,
    stop: Arc<AtomicBool>,
    checkpointer: Option<std::thread::JoinHandle<()>>,
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.checkpointer.take() {
            let _ = t.join();
        }
    }
}

/// Runs passive checkpoints (they never block the writer) until `stop`, and a last one then.
fn checkpoints(conn: Connection, stop: &AtomicBool) {
    let tick = Duration::from_millis(50);
    let mut waited = Duration::ZERO;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(tick);
        waited += tick;
        if waited >= CHECKPOINT_PERIOD {
            waited = Duration::ZERO;
            if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                tracing::warn!("SQLite checkpoint failed: {e}");
            }
        }
    }
    let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
}

/// The files SQLite keeps beside the database (write-ahead log, shared memory, rollback journal).
const SIDE_FILES: [&str; 3] = ["-wal", "-shm", "-journal"];

/// Refuses a store whose database, side files or directory other users could read or change
/// (see [`SqliteStore::open`]); files not there yet pass.
fn check_private(store: &str, db: &Path) -> Result<(), StoreError> {
    let me = rackmem_sys::process::effective_ids().0;
    let exposed = |path: &Path, problem: String, fix: String| StoreError::Exposed {
        store: store.to_string(),
        path: path.display().to_string(),
        problem,
        fix,
    };
    let dir = match db.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => d.to_path_buf(),
        None => PathBuf::from("."),
    };
    if let Ok(m) = std::fs::metadata(&dir) {
        // Others who may write the directory may replace the files (a sticky directory such as
        // /tmp lets them only add names, which the file checks below then meet).
        if m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0 {
            return Err(exposed(
                &dir,
                format!("is writable by group or others (mode {:04o})", m.mode() & 0o7777),
                format!(
                    "chmod go-w {}, or keep the store in a directory of its own",
                    dir.display()
                ),
            ));
        }
    }
    let mut files = vec![db.to_path_buf()];
    for side in SIDE_FILES {
        let mut name = db.as_os_str().to_os_string();
        name.push(side);
        files.push(PathBuf::from(name));
    }
    for f in files {
        // symlink_metadata: a link planted where a side file will be is refused too.
        let Ok(m) = std::fs::symlink_metadata(&f) else {
            continue;
        };
        if !m.file_type().is_file() {
            return Err(exposed(
                &f,
                "is not a regular file".to_string(),
                format!("remove {} (the store creates its own files)", f.display()),
            ));
        }
        if m.uid() != me {
            return Err(exposed(
                &f,
                format!("is owned by uid {}, not by this user (uid {me})", m.uid()),
                format!("chown {me} {}, or run the control plane as its owner", f.display()),
            ));
        }
        if m.mode() & 0o077 != 0 {
            return Err(exposed(
                &f,
                format!("is open to group or others (mode {:04o})", m.mode() & 0o7777),
                format!("chmod 600 {}*", db.display()),
            ));
        }
    }
    Ok(())
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`; its directory is created too (0700),
    /// the database 0600 (SQLite gives its log and shared-memory files the database's mode).
    /// The store holds every brick's grant key in clear, so an existing file open to group or
    /// world, or owned by another user, or a directory others may write (without the sticky
    /// bit), is refused with the command that fixes it ([`StoreError::Exposed`]).
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let describe = format!("sqlite:{}", path.display());
        let err = |e: &dyn std::fmt::Display| StoreError::Backend {
            store: describe.clone(),
            message: e.to_string(),
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| err(&format!("creating {}: {e}", dir.display())))?;
        }
        check_private(&describe, path)?;
        // Created here, not by SQLite, so that it is private from its first byte (SQLite would
        // create it 0644 under the usual umask, and its log files after it).
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| err(&format!("creating {}: {e}", path.display())))?;
        let conn = Connection::open(path).map_err(|e| err(&e))?;
        // WAL with synchronous=NORMAL: a commit appends to the log without an fsync of the
        // database (durable against process crashes; the last commits may be lost on power
        // loss), which keeps an allocation well under a millisecond of store time.
        conn.pragma_update(None, "journal_mode", "WAL").map_err(|e| err(&e))?;
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(|e| err(&e))?;
        // Checkpoints run on their own thread (see the module comment).
        conn.pragma_update(None, "wal_autocheckpoint", 0).map_err(|e| err(&e))?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(|e| err(&e))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS records (
                 kind TEXT NOT NULL,
                 name TEXT NOT NULL,
                 body TEXT NOT NULL,
                 PRIMARY KEY (kind, name)
             ) WITHOUT ROWID;",
        )
        .map_err(|e| err(&e))?;
        // The log and shared-memory files exist now: check them too.
        check_private(&describe, path)?;
        let second = Connection::open(path).map_err(|e| err(&e))?;
        second.busy_timeout(Duration::from_secs(5)).map_err(|e| err(&e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let checkpointer = std::thread::Builder::new()
            .name("rackmem-sqlite-checkpoint".to_string())
            .spawn(move || checkpoints(second, &s))
            .map_err(|e| err(&format!("starting the checkpoint thread: {e}")))?;
        Ok(SqliteStore {
            path: path.to_path_buf(),
            conn,
            stop,
            checkpointer: Some(checkpointer),
        })
    }

    fn backend(&self, e: rusqlite::Error) -> StoreError {
        StoreError::Backend {
            store: self.describe(),
            message: e.to_string(),
        }
    }
}

impl Store for SqliteStore {
    fn describe(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }

    fn load(&mut self) -> Result<Snapshot, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT kind, name, body FROM records")
            .map_err(|e| self.backend(e))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
            })
            .map_err(|e| self.backend(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.backend(e))?;
        drop(stmt);
        let mut s = Snapshot::default();
        for (kind, name, body) in rows {
            let r = Record::from_json(&kind, &body).map_err(|message| StoreError::Corrupt {
                store: self.describe(),
                key: format!("{kind}/{name}"),
                message,
            })?;
            s.add(r);
        }
        Ok(s)
    }

    fn commit(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        let describe = self.describe();
        let be = |e: rusqlite::Error| StoreError::Backend {
            store: describe.clone(),
            message: e.to_string(),
        };
        let tx = self.conn.transaction().map_err(be)?;
        {
            let mut put = tx
                .prepare_cached("INSERT OR REPLACE INTO records (kind, name, body) VALUES (?1, ?2, ?3)")
                .map_err(be)?;
            let mut del = tx
                .prepare_cached("DELETE FROM records WHERE kind = ?1 AND name = ?2")
                .map_err(be)?;
            for op in ops {
                match op {
                    Op::Put(r) => {
                        let k: Key = r.key();
                        put.execute(params![k.kind(), k.name(), r.to_json()]).map_err(be)?;
                    }
                    Op::Delete(k) => {
                        del.execute(params![k.kind(), k.name()]).map_err(be)?;
                    }
                }
            }
        }
        // Dropping an uncommitted transaction rolls it back: an error above leaves nothing.
        tx.commit().map_err(be)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Counters, NodeRecord};

    #[test]
    fn files_are_private_and_exposed_ones_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/control.db");
        drop(SqliteStore::open(&path).unwrap());
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&dir.path().join("state")), 0o700);
        assert_eq!(mode(&path), 0o600);
        // A file made readable by others (an old store, a careless copy) is refused, naming the fix.
        let wal = dir.path().join("state/control.db-wal");
        std::fs::write(&wal, b"").unwrap();
        std::fs::set_permissions(&wal, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = SqliteStore::open(&path).unwrap_err().to_string();
        assert!(
            e.contains("control.db-wal") && e.contains("0644") && e.contains("chmod 600"),
            "{e}"
        );
        std::fs::set_permissions(&wal, std::fs::Permissions::from_mode(0o600)).unwrap();
        drop(SqliteStore::open(&path).unwrap());
        // A directory others may write is refused too.
        std::fs::set_permissions(dir.path().join("state"), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = SqliteStore::open(&path).unwrap_err().to_string();
        assert!(
            e.contains("writable by group or others") && e.contains("chmod go-w"),
            "{e}"
        );
    }

    #[test]
    fn batches_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/control.db");
        {
            let mut s = SqliteStore::open(&path).unwrap();
            s.commit(&[
                Op::Put(Record::Node(NodeRecord {
                    id: 1,
                    name: "n1".into(),
                    ports: vec![],
                    quota_bytes: None,
                })),
                Op::Put(Record::Counters(Counters {
                    next_node: 2,
                    ..Counters::default()
                })),
            ])
            .unwrap();
            s.commit(&[Op::Delete(Key::Node(9))]).unwrap();
        }
        let mut s = SqliteStore::open(&path).unwrap();
        let snap = s.load().unwrap();
        assert_eq!(snap.nodes.len(), 1);
        assert_eq!(snap.counters.next_node, 2);
        s.commit(&[Op::Delete(Key::Node(1))]).unwrap();
        assert!(s.load().unwrap().nodes.is_empty());
    }
}
