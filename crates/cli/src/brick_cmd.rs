//! `rackmem brick`: serve memory.

use anyhow::{bail, Context, Result};
use clap::Args;
use rackmem_brick::{Brick, BrickConfig, ListenAddr};
use rackmem_runtime::size::{format_size, parse_size};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Args)]
pub struct BrickArgs {
    /// Where to listen: tcp://HOST:PORT or unix:PATH.
    #[arg(long, value_name = "ADDR")]
    listen: String,
    /// Size of the pool this brick lends (lazily backed: memory is used only when written).
    #[arg(long, value_name = "SIZE", default_value = "4GiB", value_parser = parse_size_arg)]
    size: u64,
    /// Shared secret a node must present to carve a segment (standalone mode, no control plane).
    #[arg(
        long,
        value_name = "SECRET",
        env = "RACKMEM_SECRET",
        hide_env_values = true,
        conflicts_with = "secret_file"
    )]
    secret: Option<String>,
    /// File holding the shared secret (first line).
    #[arg(long, value_name = "PATH")]
    secret_file: Option<std::path::PathBuf>,
    /// File holding the key grants are signed with (created with a random key if absent).
    #[arg(long, value_name = "PATH")]
    key_file: Option<std::path::PathBuf>,
}

pub fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

pub fn read_secret(secret: Option<String>, file: Option<&std::path::Path>) -> Result<Option<Vec<u8>>> {
    if let Some(s) = secret {
        return Ok(Some(s.into_bytes()));
    }
    let Some(path) = file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the secret file {}", path.display()))?;
    let line = text.lines().next().unwrap_or("").trim().to_string();
    if line.is_empty() {
        bail!("the secret file {} is empty", path.display());
    }
    Ok(Some(line.into_bytes()))
}

pub fn random_hex(bytes: usize) -> Result<String> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("no randomness from the OS: {e}"))?;
    Ok(hex::encode(b))
}

fn load_key(path: Option<&std::path::Path>) -> Result<Vec<u8>> {
    let Some(path) = path else {
        return Ok(random_hex(32)?.into_bytes());
    };
    match std::fs::read_to_string(path) {
        Ok(k) if !k.trim().is_empty() => Ok(k.trim().as_bytes().to_vec()),
        Ok(_) => bail!("the key file {} is empty", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let k = random_hex(32)?;
            std::fs::write(path, format!("{k}\n"))
                .with_context(|| format!("creating the key file {}", path.display()))?;
            Ok(k.into_bytes())
        }
        Err(e) => Err(e).with_context(|| format!("reading the key file {}", path.display())),
    }
}

pub fn run(args: BrickArgs) -> Result<i32> {
    let listen: ListenAddr = args
        .listen
        .parse()
        .with_context(|| format!("--listen {}", args.listen))?;
    if args.size < 2 << 20 {
        bail!("--size {} is too small: a brick lends at least 2 MiB", args.size);
    }
    let secret = read_secret(args.secret, args.secret_file.as_deref())?;
    if secret.is_none() {
        eprintln!("rackmem brick: no --secret given: nodes cannot carve segments until a control plane issues grants");
    }
    let key = load_key(args.key_file.as_deref())?;
    // Handlers first: a SIGTERM that arrives as soon as the socket exists must stop the brick
    // cleanly, not kill it with the socket file left behind.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let handle = Brick::start(BrickConfig {
        listen,
        size_bytes: args.size,
        key,
        secret,
        managed: false,
    })
    .with_context(|| format!("starting the brick on {}", args.listen))?;
    eprintln!(
        "rackmem brick: serving {} on {} (SIGTERM or Ctrl-C stops it)",
        format_size(args.size),
        handle.local_addr()
    );
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    eprintln!("rackmem brick: stopping");
    handle.shutdown();
    Ok(0)
}
