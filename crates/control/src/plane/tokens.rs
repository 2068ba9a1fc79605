//! API tokens: created and revoked through the REST API, kept in the store (hashes only), and
//! published to the table the REST server authenticates against.

use super::attach::next_id;
use super::{now_unix_ms, ControlPlane, PlaneError};
use crate::api;
use crate::auth::TokenTable;
use crate::store::{Key, Op, Record, StoreError, TokenRecord};
use std::sync::Arc;

/// What `GET /v1/tokens` shows of a token: everything but its hash.
fn token_info(t: &TokenRecord) -> api::TokenInfo {
    api::TokenInfo {
        id: t.id,
        role: t.role,
        name: t.name.clone(),
        created_unix_ms: t.created_unix_ms,
    }
}

impl ControlPlane {
    /// Makes `table` the one the REST server authenticates against, filled with the stored
    /// tokens now and after every change or reload.
    pub fn share_tokens(&mut self, table: Arc<TokenTable>) {
        self.token_table = table;
        self.publish_tokens();
    }

    /// Refills the shared table from the stored tokens.
    pub(super) fn publish_tokens(&self) {
        let v: Vec<TokenRecord> = self.tokens.values().cloned().collect();
        self.token_table.replace(&v);
    }

    /// `POST /v1/tokens`: a new token for `role` and `name`; the secret is in the reply only.
    pub fn create_token(&mut self, req: api::TokenRequest) -> Result<api::TokenCreated, PlaneError> {
        crate::auth::check_name(&req.name).map_err(PlaneError::Invalid)?;
        let mut counters = self.counters;
        // Id 0 is the admin token file's.
        let id = next_id(&mut counters.next_token);
        let t = crate::auth::issue(id, req.role, &req.name, now_unix_ms()).map_err(|e| {
            PlaneError::Store(StoreError::Backend {
                store: self.store.describe(),
                message: e.to_string(),
            })
        })?;
        self.store.commit(&[
            Op::Put(Record::Token(t.record.clone())),
            Op::Put(Record::Counters(counters)),
        ])?;
        self.counters = counters;
        self.tokens.insert(id, t.record.clone());
        self.publish_tokens();
        Ok(api::TokenCreated {
            id,
            role: req.role,
            name: req.name,
            token: t.token,
        })
    }

    /// `GET /v1/tokens`: every token, without secrets.
    pub fn tokens(&self) -> Vec<api::TokenInfo> {
        self.tokens.values().map(token_info).collect()
    }

    /// `DELETE /v1/tokens/{id}`: the token stops working at once.
    pub fn revoke_token(&mut self, id: u64) -> Result<api::TokenInfo, PlaneError> {
        let t = self
            .tokens
            .get(&id)
            .map(token_info)
            .ok_or_else(|| PlaneError::NotFound(format!("token {id}")))?;
        self.store.commit(&[Op::Delete(Key::Token(id))])?;
        self.tokens.remove(&id);
        self.publish_tokens();
        Ok(t)
    }
}
