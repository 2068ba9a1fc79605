//! Who may call the control plane's REST API: tokens, roles and the principal a request speaks
//! for.
//!
//! Every request but `GET /healthz` and `GET /v1/leader` (and, when opened by option,
//! `/openapi.json` and `/metrics`) must prove a principal, with a bearer token
//! (`Authorization: Bearer rmk_ID_SECRET`) or, over HTTPS, a client certificate whose subject
//! common name is `ROLE:NAME`. A principal has one [`Role`]:
//!
//! | role | may |
//! |---|---|
//! | `admin` | everything, including creating and revoking tokens |
//! | `node` | register the node of its name, read it and its rates, create, read, resize and release that node's allocations (and so read their grants) |
//! | `brick` | register the brick of its name and send that brick's heartbeats |
//!
//! Tokens are 32 random bytes; the control plane stores only the SHA-256 of the secret
//! (a token record in the store, so every replica sees it) and compares in constant time. The
//! first admin token comes from a file (`rackmem control --admin-token-file`), created with a
//! fresh token (mode 0600) when absent; it is never stored, only its hash kept in memory, so
//! each replica reads its own copy of the file.
//!
//! This module decides *who* a request is; the handlers in [`crate::server`] decide what that
//! principal may touch (its own node's allocations, its own brick).

// Role is a type of the REST API (a token request names one): it lives with the API's types, and
// is re-exported here where it is used.
pub use crate::api::Role;
use crate::store::TokenRecord;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;
use std::sync::RwLock;

/// Prefix of every token this control plane issues.
pub const TOKEN_PREFIX: &str = "rmk_";

/// Id of the admin token read from the file (never stored, never revocable through the API:
/// delete the file's token by replacing the file and restarting).
pub const FILE_TOKEN_ID: u64 = 0;

/// Longest name a token may carry (names of nodes and bricks are shorter still).
pub const MAX_NAME_BYTES: usize = 128;

/// Who a request speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Its role.
    pub role: Role,
    /// The node or brick it is (for admins, a label).
    pub name: String,
    /// The token it proved (`None`: a client certificate).
    pub token_id: Option<u64>,
}

impl Principal {
    /// `role NAME`, for messages.
    pub fn describe(&self) -> String {
        format!("{} {:?}", self.role, self.name)
    }
}

/// Why a request is not authenticated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credential at all.
    #[error(
        "this request needs a token: send `Authorization: Bearer TOKEN` (rackmem clients take --token-file PATH \
         or RACKMEM_TOKEN; an admin creates tokens with `rackmem ctl token create`)"
    )]
    Missing,
    /// A credential that matches no live token.
    #[error("the token is not valid (unknown, revoked, or mistyped)")]
    Invalid,
    /// A client certificate whose subject does not name a role.
    #[error("the client certificate's common name {0:?} is not ROLE:NAME with ROLE admin, node or brick")]
    Certificate(String),
}

/// A new token: the secret string is shown once, the record keeps its hash.
#[derive(Debug, Clone)]
pub struct NewToken {
    /// The whole token, `rmk_ID_SECRET`.
    pub token: String,
    /// What to store.
    pub record: TokenRecord,
}

fn sha256(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

/// Equality that takes the same time wherever the first difference is.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 32 random bytes, hex.
fn random_secret() -> Result<String, std::io::Error> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| std::io::Error::other(format!("no OS randomness for a token: {e}")))?;
    Ok(hex::encode(b))
}

/// Checks a token's name: printable, no spaces, bounded.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "token name {name:?} must be 1 to {MAX_NAME_BYTES} printable characters without spaces"
        ));
    }
    Ok(())
}

/// Makes a token with id `id` for `role` and `name`.
pub fn issue(id: u64, role: Role, name: &str, created_unix_ms: u64) -> Result<NewToken, std::io::Error> {
    let secret = random_secret()?;
    Ok(NewToken {
        token: format!("{TOKEN_PREFIX}{id}_{secret}"),
        record: TokenRecord {
            id,
            role,
            name: name.to_string(),
            hash_hex: hex::encode(sha256(secret.as_bytes())),
            created_unix_ms,
        },
    })
}

/// Splits `rmk_ID_SECRET`.
fn split(token: &str) -> Option<(u64, &str)> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    Some((id.parse().ok()?, secret))
}

struct Entry {
    role: Role,
    name: String,
    hash: [u8; 32],
}

/// The tokens a control plane accepts: the stored ones (replaced whenever the state is
/// loaded or a token is created or revoked) and the admin file's.
#[derive(Default)]
pub struct TokenTable {
    stored: RwLock<HashMap<u64, Entry>>,
    file_admin: Option<[u8; 32]>,
}

impl TokenTable {
    /// A table that also accepts `file_admin_token` (the admin token file's content) as admin.
    pub fn new(file_admin_token: Option<&str>) -> TokenTable {
        TokenTable {
            stored: RwLock::default(),
            file_admin: file_admin_token.map(|t| sha256(t.as_bytes())),
        }
    }

    /// Replaces the stored tokens (after a load).
    pub fn replace(&self, tokens: &[TokenRecord]) {
        let mut m = HashMap::new();
        for t in tokens {
            let mut hash = [0u8; 32];
            // A record whose hash does not decode can match nothing: leave it out.
            if hex::decode_to_slice(&t.hash_hex, &mut hash).is_ok() {
                m.insert(
                    t.id,
                    Entry {
                        role: t.role,
                        name: t.name.clone(),
                        hash,
                    },
                );
            }
        }
        *self.stored.write().unwrap_or_else(std::sync::PoisonError::into_inner) = m;
    }

    /// The principal `token` proves.
    pub fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        let token = token.trim();
        if token.is_empty() {
            return Err(AuthError::Missing);
        }
        if let Some(h) = &self.file_admin {
            if constant_time_eq(h, &sha256(token.as_bytes())) {
                return Ok(Principal {
                    role: Role::Admin,
                    name: "admin".to_string(),
                    token_id: Some(FILE_TOKEN_ID),
                });
            }
        }
        let (id, secret) = split(token).ok_or(AuthError::Invalid)?;
        let stored = self.stored.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let e = stored.get(&id).ok_or(AuthError::Invalid)?;
        if !constant_time_eq(&e.hash, &sha256(secret.as_bytes())) {
            return Err(AuthError::Invalid);
        }
        Ok(Principal {
            role: e.role,
            name: e.name.clone(),
            token_id: Some(id),
        })
    }
}

/// The principal a client certificate's subject common name (`ROLE:NAME`) names.
pub fn certificate_principal(common_name: &str) -> Result<Principal, AuthError> {
    let bad = || AuthError::Certificate(common_name.to_string());
    let (role, name) = common_name.split_once(':').ok_or_else(bad)?;
    let role = Role::parse(role).ok_or_else(bad)?;
    check_name(name).map_err(|_| bad())?;
    Ok(Principal {
        role,
        name: name.to_string(),
        token_id: None,
    })
}

/// A fresh token of the admin-file kind (id 0), for `--admin-token-file` and for programs
/// that start a control plane in-process (benchmarks).
pub fn new_admin_token() -> Result<String, std::io::Error> {
    Ok(format!("{TOKEN_PREFIX}{FILE_TOKEN_ID}_{}", random_secret()?))
}

/// Reads the admin token file, or creates it (mode 0600, with a fresh token) when absent.
/// Returns the token and whether it was created.
pub fn admin_token_file(path: &Path) -> Result<(String, bool), std::io::Error> {
    match std::fs::read_to_string(path) {
        Ok(t) => {
            let t = t.trim().to_string();
            if t.len() < 32 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "the admin token file {} holds {} characters: a token has at least 32 (delete the \
                         file to have a new one made)",
                        path.display(),
                        t.len()
                    ),
                ));
            }
            Ok((t, false))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let token = new_admin_token()?;
            let mut f = {
                use std::os::unix::fs::OpenOptionsExt as _;
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)?
            };
            writeln!(f, "{token}")?;
            f.sync_all()?;
            Ok((token, true))
        }
        Err(e) => Err(e),
    }
}

/// Reads a client's token: `--token-file` first, then the `RACKMEM_TOKEN` value given.
pub fn client_token(file: Option<&Path>, env: Option<String>) -> Result<Option<String>, std::io::Error> {
    if let Some(p) = file {
        let t = std::fs::read_to_string(p)
            .map_err(|e| std::io::Error::new(e.kind(), format!("reading the token file {}: {e}", p.display())))?;
        let t = t.trim().to_string();
        if t.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the token file {} is empty", p.display()),
            ));
        }
        return Ok(Some(t));
    }
    Ok(env.map(|t| t.trim().to_string()).filter(|t| !t.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_token_authenticates_and_nothing_else_does() {
        let t = issue(5, Role::Node, "web1", 0).unwrap();
        assert!(t.token.starts_with("rmk_5_"));
        assert!(!t.record.hash_hex.contains(&t.token[6..]), "the secret is not stored");
        let table = TokenTable::new(None);
        assert_eq!(table.authenticate(&t.token), Err(AuthError::Invalid), "not loaded yet");
        table.replace(std::slice::from_ref(&t.record));
        let p = table.authenticate(&t.token).unwrap();
        assert_eq!((p.role, p.name.as_str(), p.token_id), (Role::Node, "web1", Some(5)));
        let mut wrong = t.token.clone();
        let last = wrong.pop().unwrap();
        wrong.push(if last == '0' { '1' } else { '0' });
        assert_eq!(table.authenticate(&wrong), Err(AuthError::Invalid));
        assert_eq!(table.authenticate("rmk_6_abc"), Err(AuthError::Invalid));
        assert_eq!(table.authenticate(""), Err(AuthError::Missing));
        table.replace(&[]);
        assert_eq!(table.authenticate(&t.token), Err(AuthError::Invalid), "revoked");
    }

    #[test]
    fn admin_file_is_created_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.token");
        let (t, created) = admin_token_file(&path).unwrap();
        assert!(created);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let (t2, created2) = admin_token_file(&path).unwrap();
        assert_eq!((t2.as_str(), created2), (t.as_str(), false));
        let table = TokenTable::new(Some(&t));
        assert_eq!(table.authenticate(&t).unwrap().role, Role::Admin);
        std::fs::write(&path, "short\n").unwrap();
        assert!(admin_token_file(&path).is_err());
    }

    #[test]
    fn certificate_names_map_to_roles() {
        let p = certificate_principal("node:web1").unwrap();
        assert_eq!((p.role, p.name.as_str(), p.token_id), (Role::Node, "web1", None));
        assert!(certificate_principal("web1").is_err());
        assert!(certificate_principal("root:web1").is_err());
        assert!(certificate_principal("brick:").is_err());
    }
}
