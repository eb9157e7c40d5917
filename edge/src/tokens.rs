//! The admin API's tokens (their format: `floodgate_shared::adminapi`): created,
//! listed and revoked by `floodgate-cli token`, looked up by the dashboard on
//! every `/api/v1/…` request. Only SHA-256 hashes are stored; every change is
//! audited like the keys' (`token.create`, `token.revoke`).

use floodgate_shared::adminapi::{
    Scope, TOKEN_ID_LEN, TOKEN_INDEX, TOKEN_RANDOM_LEN, TokenRecord, check_token_name, new_token,
    token_id, token_record_key,
};
use floodgate_shared::apikeys::{KeyStatus, hash_secret};
use floodgate_shared::audit::AuditEntry;
use rand::RngCore;

use crate::admin::{AdminError, audit};
use crate::store::{SetOptions, Store, StoreError};

async fn audit_token<S: Store>(
    store: &S,
    who: &str,
    action: &str,
    now: i64,
    before: Option<&TokenRecord>,
    after: &TokenRecord,
) -> Result<(), AdminError> {
    let entry = AuditEntry {
        at: now,
        user: who.to_string(),
        action: action.to_string(),
        target: format!("token {}", after.id),
        before: before.map(TokenRecord::to_json),
        after: Some(after.to_json()),
    };
    audit(store, &entry).await
}

/// Creates a token named `name` of `scope`, as `who` at `now` (audited); the
/// secret is returned once and never stored.
pub async fn create_token<S: Store>(
    store: &S,
    name: &str,
    scope: Scope,
    who: &str,
    now: i64,
) -> Result<(TokenRecord, String), AdminError> {
    check_token_name(name)?;
    let mut random = [0u8; TOKEN_ID_LEN + TOKEN_RANDOM_LEN];
    rand::rng().fill_bytes(&mut random);
    let (id, secret) = new_token(&random);
    let record = TokenRecord {
        id: id.clone(),
        name: name.to_string(),
        scope,
        status: KeyStatus::Active,
        created: now,
        created_by: who.to_string(),
    };
    let hash = hash_secret(&secret);
    let json = record.to_json();
    if !store
        .set(&token_record_key(&hash), json.as_bytes(), SetOptions::NX)
        .await?
        || !store.hsetnx(TOKEN_INDEX, &id, hash.as_bytes()).await?
    {
        return Err(StoreError::protocol("a fresh token's id or hash is taken").into());
    }
    audit_token(store, who, "token.create", now, None, &record).await?;
    Ok((record, secret))
}

async fn stored_token<S: Store>(store: &S, id: &str) -> Result<(String, TokenRecord), AdminError> {
    let missing = || AdminError::NotFound(format!("no API token has the id {id:?}"));
    let hash = store.hget(TOKEN_INDEX, id).await?.ok_or_else(missing)?;
    let hash = String::from_utf8_lossy(&hash).into_owned();
    let raw = store
        .get(&token_record_key(&hash))
        .await?
        .ok_or_else(missing)?;
    let record = TokenRecord::from_json(&raw).ok_or_else(missing)?;
    Ok((hash, record))
}

/// Every token's record, by id.
pub async fn list_tokens<S: Store>(store: &S) -> Result<Vec<TokenRecord>, AdminError> {
    let mut out = vec![];
    for id in store.hkeys(TOKEN_INDEX).await? {
        if let Ok((_, r)) = stored_token(store, &String::from_utf8_lossy(&id)).await {
            out.push(r);
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// Revokes the token `id` as `who` at `now` (audited): refused from its next
/// request on (tokens are looked up on every request, never cached).
pub async fn revoke_token<S: Store>(
    store: &S,
    id: &str,
    who: &str,
    now: i64,
) -> Result<TokenRecord, AdminError> {
    let (hash, before) = stored_token(store, id).await?;
    let after = TokenRecord {
        status: KeyStatus::Revoked,
        ..before.clone()
    };
    store
        .set(
            &token_record_key(&hash),
            after.to_json().as_bytes(),
            SetOptions::XX,
        )
        .await?;
    audit_token(store, who, "token.revoke", now, Some(&before), &after).await?;
    Ok(after)
}

/// The record of the token `secret`, if it has a token's shape and exists (one
/// lookup; none for a string of the wrong shape).
pub async fn token_by_secret<S: Store>(
    store: &S,
    secret: &str,
) -> Result<Option<TokenRecord>, AdminError> {
    let Some(id) = token_id(secret) else {
        return Ok(None);
    };
    let raw = store.get(&token_record_key(&hash_secret(secret))).await?;
    Ok(raw
        .and_then(|raw| TokenRecord::from_json(&raw))
        .filter(|r| r.id == id))
}
