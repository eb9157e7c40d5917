//! Administration of what the edge reads from Redis: the configuration (saved
//! version-checked with its audit record, the same save the dashboard makes) and
//! the API keys (stored only as SHA-256 hashes). Used by `floodgate-cli`, the
//! dashboard and the tests, over any [`Store`]: RESP, Redis Cluster or REST.
//!
//! Records: `fg:config` (the configuration JSON), `{fg:config}:audit` (the audit
//! log, newest first), `fg:apikey:<sha256>` (a key's record JSON) and
//! `fg:apikeys` (a hash: key id → sha256, to list and revoke).

use floodgate_shared::apikeys::{
    ID_LEN, KeyRecord, KeyStatus, RANDOM_LEN, hash_secret, new_secret, record_key,
};
use floodgate_shared::audit::{AUDIT_KEEP, AUDIT_KEY, AuditEntry, CONFIG_CAS, SaveOutcome};
use floodgate_shared::changes::{CHANGED, Change, LOG_KEEP, LOG_KEY, REV_KEY};
use floodgate_shared::config::{CONFIG_KEY, ConfigSpec, EdgeConfig};
use floodgate_shared::deny::DenyList;
use floodgate_shared::keychanges::KeyChanges;
use floodgate_shared::keys::credits_key;
use floodgate_shared::policy::{PolicyError, validate_name};
use rand::RngCore;

use crate::store::{SetOptions, Store, StoreError, Value};

/// The index of keys: id → sha256.
pub const KEY_INDEX: &str = "fg:apikeys";

/// The audit copy of an item is cut to this many bytes.
const AUDIT_ITEM_MAX: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(transparent)]
    Invalid(#[from] PolicyError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    NotFound(String),
    /// The stored configuration is not the version the change was based on.
    #[error(
        "the stored configuration is version {current}, not {based_on}: someone changed it; \
         read it again (config show), or pass --force to overwrite it"
    )]
    Conflict { based_on: String, current: String },
    /// A configuration is stored and the change named no version to replace.
    #[error(
        "a configuration is stored already (version {current}); pass --based-on {current} \
         to replace exactly that version, or --force to overwrite whatever is stored"
    )]
    Unversioned { current: String },
}

/// The version of a configuration text: its SHA-1 (hex), what `config_cas.lua`
/// compares; `""` for no configuration.
pub fn config_version(text: Option<&str>) -> String {
    text.map(|t| sha1_smol::Sha1::from(t.as_bytes()).digest().to_string())
        .unwrap_or_default()
}

/// Cuts an item's text for the audit log.
pub fn audit_item(text: &str) -> String {
    if text.len() <= AUDIT_ITEM_MAX {
        return text.to_string();
    }
    let mut end = AUDIT_ITEM_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The stored configuration text, if any.
pub async fn get_config<S: Store>(store: &S) -> Result<Option<String>, AdminError> {
    Ok(store.get_text(CONFIG_KEY).await?)
}

/// The stored configuration text and its version (`""` when absent).
pub async fn load_config<S: Store>(store: &S) -> Result<(String, Option<String>), AdminError> {
    let text = get_config(store).await?;
    Ok((config_version(text.as_deref()), text))
}

/// Saves `config` if the stored one is still `based_on` (a version, `""` for
/// none), with its audit record, in one atomic script (`lua/config_cas.lua`).
pub async fn save_config<S: Store>(
    store: &S,
    based_on: &str,
    config: &EdgeConfig,
    entry: &AuditEntry,
) -> Result<SaveOutcome, AdminError> {
    let args = [
        based_on.to_string(),
        config.to_json(),
        entry.to_json(),
        AUDIT_KEEP.to_string(),
        LOG_KEEP.to_string(),
    ];
    let keys = [CONFIG_KEY, AUDIT_KEY, REV_KEY, LOG_KEY];
    let reply = store.run(&CONFIG_CAS, &keys, &args).await?;
    let unexpected = |v: &Value| StoreError::protocol(format!("unexpected config_cas reply {v:?}"));
    match &reply {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(saved), version] => {
                let version = version
                    .as_str()
                    .ok_or_else(|| unexpected(&reply))?
                    .to_string();
                Ok(match saved {
                    1 => SaveOutcome::Saved { version },
                    _ => SaveOutcome::Conflict { current: version },
                })
            }
            _ => Err(unexpected(&reply).into()),
        },
        _ => Err(unexpected(&reply).into()),
    }
}

/// Which stored configuration a change may replace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Basis {
    /// Exactly this version (`""`: only when none is stored).
    Version(String),
    /// None stored, or the same text stored already; anything else is refused
    /// ([`AdminError::Unversioned`]).
    Unversioned,
    /// Whatever is stored (`--force`); still audited, with what it replaced.
    Force,
}

/// Validates `json` and saves it as `who` at `now_secs` (audited), replacing what
/// `basis` allows. Returns the configuration as stored and its new version.
pub async fn replace_config<S: Store>(
    store: &S,
    json: &str,
    basis: Basis,
    who: &str,
    now_secs: i64,
) -> Result<(EdgeConfig, String), AdminError> {
    let config = EdgeConfig::from_json(json)?;
    let after = config.to_json();
    // a forced save retries when another writer slips in between read and write
    for _ in 0..5 {
        let (current, before) = load_config(store).await?;
        let based_on = match &basis {
            Basis::Version(v) => v.clone(),
            Basis::Force => current.clone(),
            Basis::Unversioned => match &before {
                None => String::new(),
                Some(text) if *text == after => current.clone(),
                Some(_) => return Err(AdminError::Unversioned { current }),
            },
        };
        let entry = AuditEntry {
            at: now_secs,
            user: who.to_string(),
            action: if basis == Basis::Force {
                "config.force".into()
            } else {
                "config.set".into()
            },
            target: "configuration".into(),
            before: before.as_deref().map(audit_item),
            after: Some(audit_item(&after)),
        };
        match save_config(store, &based_on, &config, &entry).await? {
            SaveOutcome::Saved { version } => return Ok((config, version)),
            SaveOutcome::Conflict { current } if basis != Basis::Force => {
                return Err(AdminError::Conflict { based_on, current });
            }
            SaveOutcome::Conflict { .. } => continue,
        }
    }
    Err(AdminError::Conflict {
        based_on: "(forced)".into(),
        current: load_config(store).await?.0,
    })
}

/// A change to one deny list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyEdit {
    Add,
    Remove,
}

impl DenyEdit {
    /// The audit action: `deny.add`, `deny.remove`.
    pub fn action(self) -> &'static str {
        match self {
            DenyEdit::Add => "deny.add",
            DenyEdit::Remove => "deny.remove",
        }
    }
}

/// Applies `edit` of `value` to the deny `list` of `spec`: adding an entry already
/// there changes nothing, removing one that is not there is [`AdminError::NotFound`].
pub fn apply_deny_edit(
    spec: &mut ConfigSpec,
    list: DenyList,
    edit: DenyEdit,
    value: &str,
) -> Result<(), AdminError> {
    let entries = spec.deny.list_mut(list);
    match edit {
        DenyEdit::Add if entries.iter().any(|e| e == value) => {}
        DenyEdit::Add => entries.push(value.to_string()),
        DenyEdit::Remove => {
            let before = entries.len();
            entries.retain(|e| e != value);
            if entries.len() == before {
                return Err(AdminError::NotFound(format!(
                    "{value:?} is not on the {list} deny list"
                )));
            }
        }
    }
    Ok(())
}

/// Adds `value` to, or removes it from, the deny `list` of the stored
/// configuration: validated (the entry's field named), version-checked and
/// audited like any save. A concurrent change to the configuration is read again
/// and the edit re-applied to it. Returns the configuration as stored and its
/// version.
pub async fn edit_deny<S: Store>(
    store: &S,
    list: DenyList,
    edit: DenyEdit,
    value: &str,
    who: &str,
    now_secs: i64,
) -> Result<(EdgeConfig, String), AdminError> {
    let mut last = String::new();
    for _ in 0..5 {
        let (version, text) = load_config(store).await?;
        let text = text.ok_or_else(|| {
            AdminError::NotFound("no configuration is stored (floodgate-cli config set)".into())
        })?;
        let mut spec = EdgeConfig::from_json(&text)?.spec().clone();
        apply_deny_edit(&mut spec, list, edit, value)?;
        let config = EdgeConfig::new(spec)?;
        if config.to_json() == text {
            // nothing to change (the entry is there already): nothing to audit
            return Ok((config, version));
        }
        let entry = AuditEntry {
            at: now_secs,
            user: who.to_string(),
            action: edit.action().into(),
            target: format!("deny.{list}"),
            before: Some(audit_item(&text)),
            after: Some(audit_item(&config.to_json())),
        };
        match save_config(store, &version, &config, &entry).await? {
            SaveOutcome::Saved { version } => return Ok((config, version)),
            SaveOutcome::Conflict { current } => last = current,
        }
    }
    Err(AdminError::Conflict {
        based_on: "(deny edit)".into(),
        current: last,
    })
}

/// Validates and stores a configuration whatever is stored (as `--force`),
/// audited as `floodgate`; returns it as stored.
pub async fn set_config<S: Store>(store: &S, json: &str) -> Result<EdgeConfig, AdminError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    Ok(replace_config(store, json, Basis::Force, "floodgate", now)
        .await?
        .0)
}

/// Appends an audit record (key operations; configuration changes record theirs
/// inside the compare-and-set).
pub async fn audit<S: Store>(store: &S, entry: &AuditEntry) -> Result<(), AdminError> {
    Ok(store
        .push_capped(AUDIT_KEY, entry.to_json().as_bytes(), AUDIT_KEEP)
        .await?)
}

/// The newest `count` audit records.
pub async fn audit_log<S: Store>(store: &S, count: usize) -> Result<Vec<AuditEntry>, AdminError> {
    let items = store.lrange(AUDIT_KEY, 0, count.max(1) as i64 - 1).await?;
    Ok(items
        .iter()
        .filter_map(|b| serde_json::from_slice(b).ok())
        .collect())
}

/// Creates a key; the secret is returned once and never stored.
pub async fn create_key<S: Store>(
    store: &S,
    owner: &str,
    plan: &str,
    now_secs: i64,
) -> Result<(KeyRecord, String), AdminError> {
    let new = KeyChanges {
        owner: Some(owner.to_string()),
        plan: Some(plan.to_string()),
        ..KeyChanges::default()
    };
    create_key_with(store, &new, now_secs).await
}

/// Creates a key with the fields of `new` (a plan, and optionally an owner,
/// identity, name, metadata and an expiry after `now_secs`), every one checked
/// before anything is stored; the secret is returned once and never stored.
/// Credits start from the record's count (no live count is written: an absent
/// one is the record's, see `shared/src/credits.rs`).
pub async fn create_key_with<S: Store>(
    store: &S,
    new: &KeyChanges,
    now_secs: i64,
) -> Result<(KeyRecord, String), AdminError> {
    let mut random = [0u8; ID_LEN + RANDOM_LEN];
    rand::rng().fill_bytes(&mut random);
    let (id, secret) = new_secret(&random);
    let record = new.create(&id, now_secs).map_err(PolicyError::from)?;
    let hash = hash_secret(&secret);
    let replies = store
        .pipeline(&[
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
                hash.clone().into_bytes(),
            ],
        ])
        .await?;
    for r in replies {
        r.ok()?;
    }
    key_changed(store, &hash).await?;
    Ok((record, secret))
}

/// Tells edge instances that the record of the key hashed to `hash` changed
/// (the revision and the change log, `lua/changed.lua`): they read it again on
/// their next decision or revision check.
pub async fn key_changed<S: Store>(store: &S, hash: &str) -> Result<u64, AdminError> {
    let change = Change::Key(hash.to_string()).to_string();
    let reply = store
        .run(
            &CHANGED,
            &[REV_KEY, LOG_KEY],
            &[change, LOG_KEEP.to_string()],
        )
        .await?;
    match reply {
        Value::Int(rev) if rev >= 0 => Ok(rev as u64),
        other => Err(StoreError::protocol(format!("unexpected changed reply {other:?}")).into()),
    }
}

async fn record_by_id<S: Store>(store: &S, id: &str) -> Result<(String, KeyRecord), AdminError> {
    let hash = match store.hget(KEY_INDEX, id).await? {
        Some(h) => String::from_utf8_lossy(&h).into_owned(),
        None => return Err(AdminError::NotFound(format!("no key has the id {id:?}"))),
    };
    match store.get(&record_key(&hash)).await? {
        Some(raw) => KeyRecord::from_json(&raw)
            .map(|r| (hash, r))
            .ok_or_else(|| AdminError::NotFound(format!("the record of key {id:?} is unreadable"))),
        None => Err(AdminError::NotFound(format!(
            "the record of key {id:?} is missing"
        ))),
    }
}

/// The record of the key `id`.
pub async fn key_by_id<S: Store>(store: &S, id: &str) -> Result<KeyRecord, AdminError> {
    Ok(record_by_id(store, id).await?.1)
}

/// Revokes a key: an edge instance refuses it from its next decision (or
/// revision check) on.
pub async fn revoke_key<S: Store>(store: &S, id: &str) -> Result<KeyRecord, AdminError> {
    let (hash, mut record) = record_by_id(store, id).await?;
    record.status = KeyStatus::Revoked;
    store
        .set(
            &record_key(&hash),
            record.to_json().as_bytes(),
            SetOptions::default(),
        )
        .await?;
    key_changed(store, &hash).await?;
    Ok(record)
}

/// Every key's record, by id.
pub async fn list_keys<S: Store>(store: &S) -> Result<Vec<KeyRecord>, AdminError> {
    let ids = store.hkeys(KEY_INDEX).await?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Ok((_, r)) = record_by_id(store, &String::from_utf8_lossy(&id)).await {
            out.push(r);
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// Changes a key's label (owner) and plan; its id, status and creation time stay.
/// Returns the record before and after.
pub async fn update_key<S: Store>(
    store: &S,
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
    store
        .set(
            &record_key(&hash),
            after.to_json().as_bytes(),
            SetOptions::XX,
        )
        .await?;
    if before.credits != after.credits {
        set_live_credits(store, &after, redis_now(store).await?).await?;
    }
    key_changed(store, &hash).await?;
    Ok((before, after))
}

/// Starts a key's live credits again from its record (its credits just
/// changed): the count is `credits.remaining` as of `now_us` (Redis' clock),
/// expiring at the next refill; without credits the live count goes.
/// See `shared/src/credits.rs`.
pub async fn set_live_credits<S: Store>(
    store: &S,
    record: &KeyRecord,
    now_us: i64,
) -> Result<(), AdminError> {
    let key = credits_key(&record.id, record.identity.as_deref());
    let Some(credits) = record.credits else {
        store.del(&[&key]).await?;
        return Ok(());
    };
    let live = credits.start(now_us);
    let expire = credits
        .refill
        .map(|r| std::time::Duration::from_millis(r.live_ttl_ms(now_us).max(1) as u64));
    let options = SetOptions {
        condition: None,
        expire,
    };
    store.set(&key, live.stored().as_bytes(), options).await?;
    Ok(())
}

/// Redis' clock (`TIME`, µs): the one the edge decides credits by.
async fn redis_now<S: Store>(store: &S) -> Result<i64, AdminError> {
    let parts = store.command(&[b"TIME"]).await?.into_byte_list()?;
    let num = |i: usize| {
        parts
            .get(i)
            .and_then(|p| std::str::from_utf8(p).ok())
            .and_then(|t| t.parse::<i64>().ok())
            .ok_or_else(|| StoreError::protocol(format!("TIME replied {parts:?}")))
    };
    Ok(num(0)? * 1_000_000 + num(1)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_the_sha1_redis_computes() {
        assert_eq!(config_version(None), "");
        // redis-cli EVAL "return redis.sha1hex('abc')" 0
        assert_eq!(
            config_version(Some("abc")),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
    }

    #[test]
    fn audit_items_are_cut_on_a_char_boundary() {
        let long = "é".repeat(AUDIT_ITEM_MAX);
        let cut = audit_item(&long);
        assert!(cut.len() <= AUDIT_ITEM_MAX + "…".len());
        assert!(cut.ends_with('…'));
        assert_eq!(audit_item("short"), "short");
    }
}
