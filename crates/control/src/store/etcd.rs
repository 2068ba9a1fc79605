//! The etcd store (cargo feature `etcd`): several control planes share one state, one of them
//! the leader at a time.
//!
//! Layout: every record is one key, `/rackmem/v1/` + [`Key::path`] (`/rackmem/v1/allocations/7`),
//! its value the record's JSON; a batch is one etcd transaction. The leader key
//! `/rackmem/leader` (outside the record prefix) holds the leader's advertised URL and is
//! attached to that control plane's lease (TTL [`LEASE_TTL_S`] s, kept alive every third of it).
//!
//! Election: every replica holds a lease and, every [`CAMPAIGN_PERIOD`], reads the leader key;
//! when it is absent it runs one transaction "if the leader key does not exist, create it with
//! my URL on my lease, else read it". The one that creates it leads; the key's creation
//! revision is its *term*. When the leader dies its
//! lease expires, etcd deletes the key, and the next replica to campaign takes over.
//!
//! Fencing: a commit is a transaction guarded by "the leader key's creation revision is my term",
//! so a deposed leader (its lease expired while it was paused or cut off) cannot write even if it
//! still believes it leads; when the guard fails it steps down. A commit whose outcome is unknown
//! (timeout, connection lost) marks the in-memory state stale: the control plane reloads it from
//! etcd before it serves again, so it never builds on a batch it undid locally but etcd applied.
//!
//! etcd-client is async: the store runs it on a small runtime of its own and waits for each call
//! on a channel, so it can be called from any thread, including a tokio worker of the server.

use super::{Key, Leadership, Op, Record, Role, Snapshot, Store, StoreError};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp,
    TxnOpResponse,
};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Prefix of every record key.
pub const PREFIX: &str = "/rackmem/v1/";
/// The leader key: the leader's advertised URL, on its lease.
pub const LEADER_KEY: &str = "/rackmem/leader";
/// Lease time-to-live (seconds): how long a dead leader keeps the others waiting, at most.
pub const LEASE_TTL_S: i64 = 3;
/// How often a replica campaigns (and a leader checks it still holds the key).
pub const CAMPAIGN_PERIOD: Duration = Duration::from_millis(250);
/// Time limit of one etcd request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Records read per range request at load: gRPC replies are limited to 4 MiB.
const PAGE: i64 = 500;

/// State in etcd.
pub struct EtcdStore {
    describe: String,
    client: Client,
    runtime: Option<tokio::runtime::Runtime>,
    leadership: Option<Arc<Leadership>>,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    stopped: Option<std::sync::mpsc::Receiver<()>>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("store", &self.describe)
            .finish_non_exhaustive()
    }
}

/// The end of the range of keys starting with `prefix` (its last byte incremented).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

async fn limited<T, E: std::fmt::Display>(what: &str, fut: impl Future<Output = Result<T, E>>) -> Result<T, String> {
    match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {REQUEST_TIMEOUT:?}")),
    }
}

impl EtcdStore {
    /// Connects to `etcd:URL[,URL...]` (each `http://HOST:PORT`). The connection is made on the
    /// first request: an unreachable etcd shows at [`Store::load`].
    pub fn open(url: &str) -> Result<EtcdStore, StoreError> {
        let list = url
            .strip_prefix("etcd:")
            .ok_or_else(|| StoreError::BadUrl(url.to_string()))?;
        let endpoints: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        let valid = |e: &String| {
            e.strip_prefix("http://")
                .is_some_and(|rest| !rest.is_empty() && !rest.contains('/'))
        };
        if endpoints.is_empty() || !endpoints.iter().all(valid) {
            return Err(StoreError::BadUrl(url.to_string()));
        }
        let describe = format!("etcd:{}", endpoints.join(","));
        let backend = |message: String| StoreError::Backend {
            store: describe.clone(),
            message,
        };
        // One worker is plenty: the control plane sends one batch at a time, and the election
        // sends a request every quarter second.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("rackmem-etcd")
            .enable_all()
            .build()
            .map_err(|e| backend(format!("starting the etcd client's runtime: {e}")))?;
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(REQUEST_TIMEOUT);
        let eps = endpoints.clone();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        runtime.spawn(async move {
            let _ = tx.send(Client::connect(eps, Some(options)).await);
        });
        let client = match rx.recv() {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(backend(format!("connecting: {e}"))),
            Err(_) => return Err(backend("connecting: the etcd client's runtime stopped".to_string())),
        };
        Ok(EtcdStore {
            describe,
            client,
            runtime: Some(runtime),
            leadership: None,
            stop: None,
            stopped: None,
        })
    }

    /// Fences commits with `leadership` instead of an election of the store's own (for a
    /// caller that campaigns by other means, and for tests of the fencing itself).
    pub fn fence_with(&mut self, leadership: Arc<Leadership>) {
        self.leadership = Some(leadership);
    }

    fn backend(&self, message: String) -> StoreError {
        StoreError::Backend {
            store: self.describe.clone(),
            message,
        }
    }

    /// Runs `fut` on the store's runtime and waits for it (with the request time limit).
    fn run<T, E, F>(&self, what: &str, fut: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        E: std::fmt::Display + Send + 'static,
        F: Future<Output = Result<T, E>> + Send + 'static,
    {
        let Some(runtime) = &self.runtime else {
            return Err(self.backend(format!("{what}: the store is closed")));
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let what_owned = what.to_string();
        runtime.spawn(async move {
            let _ = tx.send(limited(&what_owned, fut).await);
        });
        match rx.recv() {
            Ok(r) => r.map_err(|m| self.backend(m)),
            Err(_) => Err(self.backend(format!("{what}: the etcd client's runtime stopped"))),
        }
    }

    fn not_leader(&self) -> StoreError {
        StoreError::NotLeader {
            store: self.describe.clone(),
            leader: self.leadership.as_ref().and_then(|l| l.leader()),
        }
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
            // The election task revokes the lease so another replica takes over at once.
            if let Some(done) = self.stopped.take() {
                let _ = done.recv_timeout(Duration::from_secs(2));
            }
        }
        // Not a plain drop: the store may be dropped on a thread of another runtime, where a
        // blocking shutdown is not allowed.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Store for EtcdStore {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn load(&mut self) -> Result<Snapshot, StoreError> {
        let mut kv = self.client.kv_client();
        let pairs = self.run("reading the state", async move {
            let end = prefix_end(PREFIX.as_bytes());
            let mut from = PREFIX.as_bytes().to_vec();
            // Every page at the revision of the first one: one consistent snapshot.
            let mut revision = 0;
            let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            loop {
                let mut opts = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
                if revision != 0 {
                    opts = opts.with_revision(revision);
                }
                let resp = kv.get(from.clone(), Some(opts)).await?;
                if revision == 0 {
                    revision = resp.header().map_or(0, |h| h.revision());
                }
                for p in resp.kvs() {
                    out.push((p.key().to_vec(), p.value().to_vec()));
                }
                match out.last() {
                    Some((last, _)) if resp.more() => {
                        from = last.clone();
                        from.push(0);
                    }
                    _ => break,
                }
            }
            Ok::<_, etcd_client::Error>(out)
        })?;
        let mut snap = Snapshot::default();
        for (key, value) in pairs {
            let key = String::from_utf8_lossy(&key).into_owned();
            let corrupt = |message: String| StoreError::Corrupt {
                store: self.describe.clone(),
                key: key.clone(),
                message,
            };
            let path = key.strip_prefix(PREFIX).unwrap_or(&key);
            let (kind, _) = path
                .split_once('/')
                .ok_or_else(|| corrupt("not a KIND/NAME key".to_string()))?;
            let body = std::str::from_utf8(&value).map_err(|e| corrupt(e.to_string()))?;
            snap.add(Record::from_json(kind, body).map_err(corrupt)?);
        }
        Ok(snap)
    }

    fn commit(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        let fence = match &self.leadership {
            None => None,
            Some(l) => Some(l.fence().ok_or_else(|| self.not_leader())?),
        };
        if ops.is_empty() {
            return Ok(());
        }
        // etcd refuses a transaction that names a key twice: the last change of a key wins.
        let mut last: HashMap<String, usize> = HashMap::new();
        for (i, op) in ops.iter().enumerate() {
            let key: Key = match op {
                Op::Put(r) => r.key(),
                Op::Delete(k) => k.clone(),
            };
            last.insert(key.path(), i);
        }
        let mut txn_ops = Vec::with_capacity(last.len());
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::Put(r) if last.get(&r.key().path()) == Some(&i) => {
                    txn_ops.push(TxnOp::put(format!("{PREFIX}{}", r.key().path()), r.to_json(), None));
                }
                Op::Delete(k) if last.get(&k.path()) == Some(&i) => {
                    txn_ops.push(TxnOp::delete(format!("{PREFIX}{}", k.path()), None));
                }
                _ => {}
            }
        }
        let mut txn = Txn::new();
        if let Some(term) = fence {
            txn = txn.when([Compare::create_revision(LEADER_KEY, CompareOp::Equal, term)]);
        }
        let txn = txn.and_then(txn_ops);
        let mut kv = self.client.kv_client();
        match self.run("committing a batch", async move { kv.txn(txn).await }) {
            Ok(resp) if resp.succeeded() => Ok(()),
            Ok(_) => {
                // The guard failed: another control plane holds the leader key now.
                if let Some(l) = &self.leadership {
                    l.lost(None);
                }
                Err(self.not_leader())
            }
            Err(e) => {
                // Applied or not, nobody knows: reload from etcd before serving again.
                if let Some(l) = &self.leadership {
                    l.stale();
                }
                Err(e)
            }
        }
    }

    fn start_election(&mut self, advertise: &str) -> Result<Option<Arc<Leadership>>, StoreError> {
        if let Some(l) = &self.leadership {
            return Ok(Some(l.clone()));
        }
        let Some(runtime) = &self.runtime else {
            return Err(self.backend("starting the election: the store is closed".to_string()));
        };
        let leadership = Arc::new(Leadership::follower());
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let (done_tx, done_rx) = std::sync::mpsc::sync_channel(1);
        let election = Election {
            client: self.client.clone(),
            leadership: leadership.clone(),
            advertise: advertise.to_string(),
            describe: self.describe.clone(),
            lease: None,
        };
        runtime.spawn(async move {
            election.run(stop_rx).await;
            let _ = done_tx.send(());
        });
        self.leadership = Some(leadership.clone());
        self.stop = Some(stop_tx);
        self.stopped = Some(done_rx);
        Ok(Some(leadership))
    }
}

/// This replica's lease and its keep-alive stream.
struct Lease {
    id: i64,
    /// How often to send a keep-alive (a third of the granted TTL).
    period: Duration,
    ttl: Duration,
    stream: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    last_ok: Instant,
    next: Instant,
}

struct Election {
    client: Client,
    leadership: Arc<Leadership>,
    advertise: String,
    describe: String,
    lease: Option<Lease>,
}

impl Election {
    async fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(CAMPAIGN_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => break,
            }
            match self.step().await {
                Ok(()) => {
                    if failing {
                        tracing::info!(store = %self.describe, "etcd reachable again");
                        failing = false;
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(store = %self.describe, "election: {e}");
                        failing = true;
                    }
                    // Without a keep-alive acknowledged within the TTL the lease may have
                    // expired and another replica may lead: stop serving (commits are fenced
                    // anyway; this keeps reads and routing honest).
                    let expired = self.lease.as_ref().is_none_or(|l| l.last_ok.elapsed() >= l.ttl);
                    if expired && self.leadership.status().role == Role::Leader {
                        self.leadership.lost(None);
                    }
                }
            }
        }
        if let Some(l) = self.lease.take() {
            let mut lease = self.client.lease_client();
            let _ = limited("revoking the lease", lease.revoke(l.id)).await;
        }
        self.leadership.resign();
    }

    /// Keeps the lease alive and campaigns once.
    async fn step(&mut self) -> Result<(), String> {
        let mut lease_client = self.client.lease_client();
        if self.lease.is_none() {
            let g = limited("granting a lease", lease_client.grant(LEASE_TTL_S, None)).await?;
            let ttl = Duration::from_secs(u64::try_from(g.ttl().max(1)).unwrap_or(1));
            self.lease = Some(Lease {
                id: g.id(),
                period: ttl / 3,
                ttl,
                stream: None,
                last_ok: Instant::now(),
                next: Instant::now(),
            });
        }
        let Some(lease) = self.lease.as_mut() else {
            return Ok(());
        };
        if Instant::now() >= lease.next {
            if lease.stream.is_none() {
                lease.stream = Some(limited("keeping the lease alive", lease_client.keep_alive(lease.id)).await?);
            }
            let Some((keeper, stream)) = lease.stream.as_mut() else {
                return Ok(());
            };
            let answer = match limited("keeping the lease alive", keeper.keep_alive()).await {
                Ok(()) => limited("keeping the lease alive", stream.message()).await,
                Err(e) => Err(e),
            };
            match answer {
                Ok(Some(r)) if r.ttl() > 0 => {
                    lease.last_ok = Instant::now();
                    lease.next = lease.last_ok + lease.period;
                }
                Ok(Some(_)) => {
                    // Expired (etcd was out of reach too long): the leader key went with it.
                    self.lease = None;
                    self.leadership.lost(None);
                    return Err("the lease expired; campaigning with a new one".to_string());
                }
                Ok(None) => {
                    lease.stream = None;
                    return Err("keeping the lease alive: the stream closed".to_string());
                }
                Err(e) => {
                    lease.stream = None;
                    return Err(e);
                }
            }
        }
        let id = lease.id;
        // A plain read first: while a leader holds the key (nearly always) this costs etcd no
        // write, where the campaign transaction below goes through its log.
        let mut kv = self.client.kv_client();
        let current = limited("reading the leader key", kv.get(LEADER_KEY, None)).await?;
        let holder = match current.kvs().first() {
            Some(k) => Some(k.clone()),
            None => {
                let txn = Txn::new()
                    .when([Compare::create_revision(LEADER_KEY, CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        LEADER_KEY,
                        self.advertise.clone(),
                        Some(PutOptions::new().with_lease(id)),
                    )])
                    .or_else([TxnOp::get(LEADER_KEY, None)]);
                let resp = limited("campaigning", kv.txn(txn)).await?;
                if resp.succeeded() {
                    let term = resp.header().map_or(0, |h| h.revision());
                    self.leadership.won(term, &self.advertise);
                    return Ok(());
                }
                resp.op_responses().into_iter().find_map(|r| match r {
                    TxnOpResponse::Get(g) => g.kvs().first().cloned(),
                    _ => None,
                })
            }
        };
        match holder {
            Some(kv) if kv.lease() == id => self.leadership.won(kv.create_revision(), &self.advertise),
            Some(kv) => {
                let url = String::from_utf8_lossy(kv.value()).into_owned();
                let s = self.leadership.status();
                if s.role == Role::Leader || s.leader.as_deref() != Some(url.as_str()) {
                    self.leadership.lost(Some(url));
                }
            }
            // Deleted between the compare and the read: campaign again next time.
            None => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }

    #[test]
    fn urls() {
        assert!(EtcdStore::open("etcd:").is_err());
        assert!(EtcdStore::open("etcd:127.0.0.1:2379").is_err());
        assert!(EtcdStore::open("etcd:http://a:1/x").is_err());
        let s = EtcdStore::open("etcd:http://127.0.0.1:1, http://127.0.0.1:2").unwrap();
        assert_eq!(s.describe(), "etcd:http://127.0.0.1:1,http://127.0.0.1:2");
    }
}
