//! Administration of what the edge reads from Redis: the configuration and the API
//! keys (stored only as SHA-256 hashes). Used by `floodgate-cli` and the tests; the
//! dashboard will write the same records.
//!
//! Records: `fg:config` (the configuration JSON), `fg:apikey:<sha256>` (a key's
//! record JSON) and `fg:apikeys` (a hash: key id → sha256, to list and revoke).

use floodgate_shared::apikeys::{
    ID_LEN, KeyRecord, KeyStatus, RANDOM_LEN, hash_secret, new_secret, record_key,
};
use floodgate_shared::config::{CONFIG_KEY, EdgeConfig};
use floodgate_shared::policy::{PolicyError, validate_name};
use rand::RngCore;

use crate::store::resp::RespStore;
use crate::store::resp::wire::Reply;
use crate::store::{StoreError, StoreErrorKind};

/// The index of keys: id → sha256.
pub const KEY_INDEX: &str = "fg:apikeys";

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(transparent)]
    Invalid(#[from] PolicyError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    NotFound(String),
}

fn expect_ok(reply: Reply) -> Result<(), StoreError> {
    match reply {
        Reply::Error(e) => Err(StoreError::new(StoreErrorKind::Redis, e)),
        _ => Ok(()),
    }
}

/// Validates and stores a configuration; returns it as stored.
pub async fn set_config(store: &RespStore, json: &str) -> Result<EdgeConfig, AdminError> {
    let config = EdgeConfig::from_json(json)?;
    expect_ok(
        store
            .command(&[b"SET", CONFIG_KEY.as_bytes(), config.to_json().as_bytes()])
            .await?,
    )?;
    Ok(config)
}

pub async fn get_config(store: &RespStore) -> Result<Option<String>, AdminError> {
    match store.command(&[b"GET", CONFIG_KEY.as_bytes()]).await? {
        Reply::Bulk(Some(b)) => Ok(Some(String::from_utf8_lossy(&b).into_owned())),
        Reply::Bulk(None) => Ok(None),
        other => Err(StoreError::new(
            StoreErrorKind::Protocol,
            format!("unexpected reply {other:?}"),
        )
        .into()),
    }
}

/// Creates a key; the secret is returned once and never stored.
pub async fn create_key(
    store: &RespStore,
    owner: &str,
    plan: &str,
    now_secs: i64,
) -> Result<(KeyRecord, String), AdminError> {
    validate_name("plan", plan)?;
    let mut random = [0u8; ID_LEN + RANDOM_LEN];
    rand::rng().fill_bytes(&mut random);
    let (id, secret) = new_secret(&random);
    let record = KeyRecord {
        id: id.clone(),
        owner: owner.to_string(),
        plan: plan.to_string(),
        status: KeyStatus::Active,
        created: now_secs,
    };
    record.validate()?;
    let hash = hash_secret(&secret);
    let replies = store
        .batch(&[
            vec![
                b"SET".to_vec(),
                record_key(&hash).into_bytes(),
                record.to_json().into_bytes(),
                b"NX".to_vec(),
            ],
            vec![
                b"HSETNX".to_vec(),
                KEY_INDEX.as_bytes().to_vec(),
                id.into_bytes(),
                hash.into_bytes(),
            ],
        ])
        .await?;
    for r in replies {
        expect_ok(r)?;
    }
    Ok((record, secret))
}

async fn record_by_id(store: &RespStore, id: &str) -> Result<(String, KeyRecord), AdminError> {
    let hash = match store
        .command(&[b"HGET", KEY_INDEX.as_bytes(), id.as_bytes()])
        .await?
    {
        Reply::Bulk(Some(h)) => String::from_utf8_lossy(&h).into_owned(),
        _ => return Err(AdminError::NotFound(format!("no key has the id {id:?}"))),
    };
    match store
        .command(&[b"GET", record_key(&hash).as_bytes()])
        .await?
    {
        Reply::Bulk(Some(raw)) => KeyRecord::from_json(&raw)
            .map(|r| (hash, r))
            .ok_or_else(|| AdminError::NotFound(format!("the record of key {id:?} is unreadable"))),
        _ => Err(AdminError::NotFound(format!(
            "the record of key {id:?} is missing"
        ))),
    }
}

/// Revokes a key: the edge refuses it once its cache entry expires.
/// The record of the key `id`.
pub async fn key_by_id(store: &RespStore, id: &str) -> Result<KeyRecord, AdminError> {
    Ok(record_by_id(store, id).await?.1)
}

pub async fn revoke_key(store: &RespStore, id: &str) -> Result<KeyRecord, AdminError> {
    let (hash, mut record) = record_by_id(store, id).await?;
    record.status = KeyStatus::Revoked;
    expect_ok(
        store
            .command(&[
                b"SET",
                record_key(&hash).as_bytes(),
                record.to_json().as_bytes(),
            ])
            .await?,
    )?;
    Ok(record)
}

/// Every key's record, by id.
pub async fn list_keys(store: &RespStore) -> Result<Vec<KeyRecord>, AdminError> {
    let ids = match store.command(&[b"HKEYS", KEY_INDEX.as_bytes()]).await? {
        Reply::Array(Some(items)) => items
            .into_iter()
            .filter_map(|i| match i {
                Reply::Bulk(Some(b)) => Some(String::from_utf8_lossy(&b).into_owned()),
                _ => None,
            })
            .collect::<Vec<_>>(),
        _ => vec![],
    };
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Ok((_, r)) = record_by_id(store, &id).await {
            out.push(r);
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// Changes a key's label (owner) and plan; its id, status and creation time stay.
/// Returns the record before and after.
pub async fn update_key(
    store: &RespStore,
    id: &str,
    change: impl FnOnce(&mut KeyRecord),
) -> Result<(KeyRecord, KeyRecord), AdminError> {
    let (hash, before) = record_by_id(store, id).await?;
    if before.status == KeyStatus::Revoked {
        return Err(AdminError::Invalid(PolicyError::new(
            "id",
            format!("key {} is revoked; a revoked key is read-only", before.id),
        )));
    }
    let mut after = before.clone();
    change(&mut after);
    after.id.clone_from(&before.id);
    after.status = before.status;
    after.created = before.created;
    validate_name("plan", &after.plan)?;
    after.validate()?;
    expect_ok(
        store
            .command(&[
                b"SET",
                record_key(&hash).as_bytes(),
                after.to_json().as_bytes(),
                b"XX",
            ])
            .await?,
    )?;
    Ok((before, after))
}
