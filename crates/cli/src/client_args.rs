//! How `ctl`, `agent` and `brick` authenticate to the control plane: the options they share.

use anyhow::{Context, Result};
use clap::Args;
use rackmem_control::client::{Client, ClientConfig};
use std::path::PathBuf;

/// The environment variable naming the control plane's URL(s) for `ctl` and `top`.
pub const CONTROL_ENV: &str = "RACKMEM_CONTROL";
/// Where `ctl` and `top` go when neither --control nor [`CONTROL_ENV`] says.
pub const DEFAULT_CONTROL: &str = "http://127.0.0.1:7080";

/// Credentials for the control plane's REST API.
#[derive(Args, Clone, Debug)]
pub struct ControlAuthArgs {
    /// File holding the API token (`rmk_ID_SECRET`); an admin makes one with
    /// `rackmem ctl token create --role ROLE --name NAME`. Also: RACKMEM_TOKEN (the token itself).
    #[arg(long, value_name = "PATH", env = "RACKMEM_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// The API token itself (prefer --token-file: the environment of a process is readable by
    /// its user's other processes).
    #[arg(
        long = "token",
        value_name = "TOKEN",
        env = "RACKMEM_TOKEN",
        hide_env_values = true,
        hide = true
    )]
    pub token: Option<String>,
    /// CA certificate (PEM) that signed the control planes' HTTPS certificates (default: the
    /// system's roots).
    #[arg(long, value_name = "PEM", env = "RACKMEM_CONTROL_CA")]
    pub control_ca: Option<PathBuf>,
    /// Client certificate (PEM, subject CN `ROLE:NAME`) for control planes that take
    /// certificates instead of tokens (`rackmem control --tls-client-ca`); needs --client-key.
    #[arg(long, value_name = "PEM", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// Private key (PEM) of --client-cert.
    #[arg(long, value_name = "PEM", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
}

impl ControlAuthArgs {
    /// The token: --token-file, else RACKMEM_TOKEN, else `fallback` when that file exists
    /// (`rackmem ctl` on the control plane's host finds the admin token file by itself).
    pub fn token(&self, fallback: Option<PathBuf>) -> Result<Option<String>> {
        let file = self
            .token_file
            .clone()
            .or_else(|| fallback.filter(|p| self.token.is_none() && p.exists()));
        rackmem_control::auth::client_token(file.as_deref(), self.token.clone()).map_err(anyhow::Error::from)
    }

    /// A client of the comma-separated `urls` with these credentials.
    pub fn client(&self, urls: &str, fallback_token: Option<PathBuf>) -> Result<Client> {
        let config = ClientConfig {
            token: self.token(fallback_token)?,
            ca_file: self.control_ca.clone(),
            identity: self.client_cert.clone().zip(self.client_key.clone()),
            ..ClientConfig::default()
        };
        Client::with_config(&Client::parse_urls(urls), &config).with_context(|| format!("--control {urls}"))
    }
}
