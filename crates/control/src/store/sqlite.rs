//! The default store: one SQLite file in WAL mode, one table of JSON records keyed by
//! (kind, name). A batch is one transaction.
//!
//! Checkpoints (copying the write-ahead log back into the database, with an fsync) run on a
//! thread of their own with a second connection, not inside a commit: measured with 1,000
//! bricks and 10,000 allocations, SQLite's automatic checkpoint made one commit in a hundred
//! take 1 to 40 ms; with it moved away the p99 of an allocation is about 0.1 ms.

use super::{Key, Op, Record, Snapshot, Store, StoreError};
use rusqlite::{params, Connection};
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

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`; its directory is created too.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let describe = format!("sqlite:{}", path.display());
        let err = |e: &dyn std::fmt::Display| StoreError::Backend {
            store: describe.clone(),
            message: e.to_string(),
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| err(&format!("creating {}: {e}", dir.display())))?;
        }
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
