//! A throwaway etcd server for tests and `rackmem bench control`: Debian's `etcd` binary (package
//! `etcd-server`) on free loopback ports, with a data directory of its own, in a process group
//! of its own that is killed when the [`EtcdServer`] is dropped (a failing test leaves no etcd
//! behind).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a new etcd may take to answer its health check.
const START_LIMIT: Duration = Duration::from_secs(30);

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum EtcdServerError {
    /// No `etcd` binary.
    #[error("no etcd binary on PATH (Debian: apt-get install etcd-server)")]
    Missing,
    /// Starting or waiting failed.
    #[error("etcd server: {0}")]
    Start(String),
}

/// A running etcd; killed on drop.
#[derive(Debug)]
pub struct EtcdServer {
    binary: PathBuf,
    data_dir: PathBuf,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// Finds `etcd` on `PATH`.
pub fn binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
}

/// Two distinct free loopback ports (both held while the second is chosen).
fn free_ports() -> Result<(u16, u16), EtcdServerError> {
    let err = |e: std::io::Error| EtcdServerError::Start(format!("finding a free port: {e}"));
    let a = std::net::TcpListener::bind("127.0.0.1:0").map_err(err)?;
    let b = std::net::TcpListener::bind("127.0.0.1:0").map_err(err)?;
    Ok((a.local_addr().map_err(err)?.port(), b.local_addr().map_err(err)?.port()))
}

impl EtcdServer {
    /// Starts etcd with its data in `data_dir` (created if needed) and waits until it is healthy.
    pub fn start(data_dir: &Path) -> Result<EtcdServer, EtcdServerError> {
        let binary = binary().ok_or(EtcdServerError::Missing)?;
        let mut attempt = 0;
        loop {
            let (client_port, peer_port) = free_ports()?;
            let mut s = EtcdServer {
                binary: binary.clone(),
                data_dir: data_dir.to_path_buf(),
                client_port,
                peer_port,
                child: None,
            };
            match s.launch() {
                Ok(()) => return Ok(s),
                // Another process may have taken a port between its choice and etcd's bind:
                // start over, on new ports and a clean data directory.
                Err(e) if attempt < 2 => {
                    attempt += 1;
                    tracing::warn!("{e}; trying other ports");
                    let _ = std::fs::remove_dir_all(data_dir.join("data"));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `http://127.0.0.1:PORT`, its client URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// `etcd:` and its client URL: a store URL.
    pub fn store_url(&self) -> String {
        format!("etcd:{}", self.url())
    }

    fn launch(&mut self) -> Result<(), EtcdServerError> {
        let err = |m: String| EtcdServerError::Start(m);
        std::fs::create_dir_all(&self.data_dir)
            .map_err(|e| err(format!("creating {}: {e}", self.data_dir.display())))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data_dir.join("etcd.log"))
            .map_err(|e| err(format!("creating the log: {e}")))?;
        let client = self.url();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--name")
            .arg("rackmem")
            .arg("--data-dir")
            .arg(self.data_dir.join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("rackmem={peer}")])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0);
        let child = cmd
            .spawn()
            .map_err(|e| err(format!("starting {}: {e}", self.binary.display())))?;
        self.child = Some(child);
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(2)))
            .build()
            .into();
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    self.child = None;
                    return Err(err(format!(
                        "exited with {status} at start (log: {})",
                        self.data_dir.join("etcd.log").display()
                    )));
                }
            }
            if let Ok(mut r) = agent.get(format!("{client}/health")).call() {
                if r.status().as_u16() == 200 && r.body_mut().read_to_string().is_ok_and(|b| b.contains("true")) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(err(format!("not healthy within {START_LIMIT:?} at {client}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills it (SIGKILL to its process group) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", c.id())])
                .stderr(Stdio::null())
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same ports and data (after [`EtcdServer::kill`]).
    pub fn restart(&mut self) -> Result<(), EtcdServerError> {
        self.kill();
        self.launch()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}
