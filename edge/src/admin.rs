//! Administration of what the edge reads from Redis: the configuration (saved
//! version-checked with its audit record, the same save the dashboard makes) and
//! the API keys (stored only as SHA-256 hashes). Used by `floodgate-cli`, the
//! dashboard and the tests, over any [`Store`]: RESP, Redis Cluster or REST.
//!
//! Records: `fg:config` (the configuration JSON), `{fg:config}:audit` (the audit
//! log, newest first), `fg:apikey:<sha256>` (a key's record JSON) and
//! `fg:apikeys` (a hash: key id → sha256, to list and revoke).

use floodgate_shared::adminapi::{KEY_CAS, VerifyAnswer, VerifyReason};
use floodgate_shared::apikeys::{
    ID_LEN, KeyRecord, KeyStatus, RANDOM_LEN, check_secret, hash_secret, new_secret, record_key,
    secret_for,
};
use floodgate_shared::audit::{AUDIT_KEEP, AUDIT_KEY, AuditEntry, CONFIG_CAS, SaveOutcome};
use floodgate_shared::changes::{CHANGED, Change, LOG_KEEP, LOG_KEY, REV_KEY};
use floodgate_shared::config::{CONFIG_KEY, ConfigSpec, EdgeConfig};
use floodgate_shared::credits::{MOVED, MOVED_TTL_MS};
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
    /// The stored record of key `id` is not the version a change was based on.
    #[error("key {id} is version {current}, not {based_on}: someone changed it; read it again")]
    KeyConflict {
        id: String,
        based_on: String,
        current: String,
    },
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
/// `basis` allows; an identity override it adds must name an identity some key
/// holds ([`crate::identities::check_new_identities`]). Returns the configuration
/// as stored and its new version.
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
        let stored = before
            .as_deref()
            .and_then(|t| EdgeConfig::from_json(t).ok());
        let stored = stored.as_ref().map(EdgeConfig::spec);
        crate::identities::check_new_identities(store, stored, config.spec()).await?;
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
    edit_stored(store, "(deny edit)", move |text: String| async move {
        let mut spec = EdgeConfig::from_json(&text)?.spec().clone();
        apply_deny_edit(&mut spec, list, edit, value)?;
        let config = EdgeConfig::new(spec)?;
        let entry = AuditEntry {
            at: now_secs,
            user: who.to_string(),
            action: edit.action().into(),
            target: format!("deny.{list}"),
            before: Some(audit_item(&text)),
            after: Some(audit_item(&config.to_json())),
        };
        Ok((config, entry, ()))
    })
    .await
    .map(|(config, (), version)| (config, version))
}

/// Reads the stored configuration, applies `edit` to its text and saves the
/// configuration it made, with its audit record and version-checked — unless it
/// is the text as stored (nothing to change: nothing saved, nothing audited).
/// When another save slipped in between, reads it again and applies the edit
/// again (5 tries, then [`AdminError::Conflict`] `based_on` `what`). Returns the
/// configuration as stored, the edit's value and the stored version.
pub(crate) async fn edit_stored<S: Store, T, F>(
    store: &S,
    what: &str,
    mut edit: impl FnMut(String) -> F,
) -> Result<(EdgeConfig, T, String), AdminError>
where
    F: Future<Output = Result<(EdgeConfig, AuditEntry, T), AdminError>>,
{
    let mut last = String::new();
    for _ in 0..5 {
        let (version, text) = load_config(store).await?;
        let text = text.ok_or_else(|| {
            AdminError::NotFound("no configuration is stored (floodgate-cli config set)".into())
        })?;
        let (config, entry, value) = edit(text.clone()).await?;
        if config.to_json() == text {
            return Ok((config, value, version));
        }
        match save_config(store, &version, &config, &entry).await? {
            SaveOutcome::Saved { version } => return Ok((config, value, version)),
            SaveOutcome::Conflict { current } => last = current,
        }
    }
    Err(AdminError::Conflict {
        based_on: what.into(),
        current: last,
    })
}

/// Validates and stores a configuration whatever is stored (as `--force`),
/// audited as `floodgate`; returns it as stored.
pub async fn set_config<S: Store>(store: &S, json: &str) -> Result<EdgeConfig, AdminError> {
    Ok(
        replace_config(store, json, Basis::Force, "floodgate", now_secs())
            .await?
            .0,
    )
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

/// A key's record as stored: under the hash the index names, with its version
/// (the SHA-1 of the stored JSON, what `lua/key_cas.lua` compares).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredKey {
    pub hash: String,
    pub record: KeyRecord,
    pub version: String,
}

/// The version of a stored key record's text.
pub fn record_version(text: &[u8]) -> String {
    sha1_smol::Sha1::from(text).digest().to_string()
}

/// The key `id` as stored.
pub async fn stored_key<S: Store>(store: &S, id: &str) -> Result<StoredKey, AdminError> {
    let hash = match store.hget(KEY_INDEX, id).await? {
        Some(h) => String::from_utf8_lossy(&h).into_owned(),
        None => return Err(AdminError::NotFound(format!("no key has the id {id:?}"))),
    };
    match store.get(&record_key(&hash)).await? {
        Some(raw) => KeyRecord::from_json(&raw)
            .map(|record| StoredKey {
                hash,
                record,
                version: record_version(&raw),
            })
            .ok_or_else(|| AdminError::NotFound(format!("the record of key {id:?} is unreadable"))),
        None => Err(AdminError::NotFound(format!(
            "the record of key {id:?} is missing"
        ))),
    }
}

/// The record of the key `id`.
pub async fn key_by_id<S: Store>(store: &S, id: &str) -> Result<KeyRecord, AdminError> {
    Ok(stored_key(store, id).await?.record)
}

/// Saves `after` over the stored record of `key` if it is still `key.version`
/// (`lua/key_cas.lua`); `Ok(None)` when someone changed it first. Then the copy a
/// rotation keeps under the replaced secret's hash is written too, and edge
/// instances are told.
async fn save_key<S: Store>(
    store: &S,
    key: &StoredKey,
    after: &KeyRecord,
    now: i64,
) -> Result<Option<String>, AdminError> {
    let json = after.to_json();
    let record = record_key(&key.hash);
    let change = Change::Key(key.hash.clone()).to_string();
    // one atomic call saves and announces it where the store takes the records
    // and the revision together; on Redis Cluster they are in other slots
    let together = store.one_slot();
    let reply = if together {
        let args = [key.version.clone(), json, change, LOG_KEEP.to_string()];
        store
            .run(&KEY_CAS, &[&record, REV_KEY, LOG_KEY], &args)
            .await?
    } else {
        store
            .run(&KEY_CAS, &[&record], &[key.version.clone(), json])
            .await?
    };
    let version = match &reply {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(1), version] => version.as_str().map(str::to_string),
            [Value::Int(0), _] => return Ok(None),
            _ => None,
        },
        _ => None,
    }
    .ok_or_else(|| StoreError::protocol(format!("unexpected key_cas reply {reply:?}")))?;
    write_previous(store, after, now).await?;
    if !together {
        key_changed(store, &key.hash).await?;
    }
    Ok(Some(version))
}

/// The copy of `record` under the hash of the secret its rotation replaced, for
/// the rest of the overlap (the edge finds it by that secret and refuses it from
/// the overlap's end on, [`KeyRecord::refusal`]); it expires a minute later.
async fn write_previous<S: Store>(
    store: &S,
    record: &KeyRecord,
    now: i64,
) -> Result<(), AdminError> {
    let Some(rotation) = &record.rotation else {
        return Ok(());
    };
    let left = rotation.overlap_ends - now;
    if left <= 0 {
        return Ok(());
    }
    let expire = SetOptions::default().expire(std::time::Duration::from_secs(left as u64 + 60));
    let copy = record_key(&rotation.previous_hash);
    store
        .set(&copy, record.to_json().as_bytes(), expire)
        .await?;
    key_changed(store, &rotation.previous_hash).await?;
    Ok(())
}

/// Changes the key `id` to what `change` makes of its stored record, version
/// checked: with `if_match`, only over exactly that version
/// ([`AdminError::KeyConflict`] otherwise); without, `change` is applied again
/// to whatever a concurrent writer stored first, so no change is lost. Its id
/// and creation time stay. Returns the record before, after, and its version.
pub async fn modify_key<S: Store>(
    store: &S,
    id: &str,
    if_match: Option<&str>,
    now: i64,
    change: impl Fn(&KeyRecord) -> Result<KeyRecord, AdminError>,
) -> Result<(KeyRecord, KeyRecord, String), AdminError> {
    for _ in 0..8 {
        let key = stored_key(store, id).await?;
        if is_previous(&key) {
            // a rotation is moving the index to the new secret's record
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            continue;
        }
        if let Some(v) = if_match.filter(|v| *v != key.version) {
            return Err(AdminError::KeyConflict {
                id: key.record.id,
                based_on: v.to_string(),
                current: key.version,
            });
        }
        let mut after = change(&key.record)?;
        after.id.clone_from(&key.record.id);
        after.created = key.record.created;
        after.validate()?;
        // the live credits first (moved with the identity, or restarted), so
        // no edge ever decides by the new record without them
        let credits = LiveCredits::write(store, &key.record, &after).await?;
        let saved = save_key(store, &key, &after, now).await;
        if !matches!(saved, Ok(Some(_))) {
            credits.undo(store).await?;
        }
        if let Some(version) = saved? {
            return Ok((key.record, after, version));
        }
        if let Some(v) = if_match {
            let current = stored_key(store, id).await?.version;
            return Err(AdminError::KeyConflict {
                id: id.to_string(),
                based_on: v.to_string(),
                current,
            });
        }
    }
    Err(AdminError::NotFound(format!(
        "key {id:?} kept changing while it was saved; try again"
    )))
}

fn refuse_revoked(r: &KeyRecord) -> Result<(), AdminError> {
    if r.status == KeyStatus::Revoked {
        return Err(AdminError::Invalid(PolicyError::new(
            "id",
            format!("key {} is revoked; a revoked key is read-only", r.id),
        )));
    }
    Ok(())
}

/// Revokes a key (and the copy a rotation keeps): an edge instance refuses it
/// from its next decision (or revision check) on.
pub async fn revoke_key<S: Store>(store: &S, id: &str) -> Result<KeyRecord, AdminError> {
    let now = now_secs();
    let (_, after, _) = modify_key(store, id, None, now, |r| {
        Ok(KeyRecord {
            status: KeyStatus::Revoked,
            ..r.clone()
        })
    })
    .await?;
    Ok(after)
}

/// Every key as stored, by id.
pub async fn list_stored<S: Store>(store: &S) -> Result<Vec<StoredKey>, AdminError> {
    let ids = store.hkeys(KEY_INDEX).await?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Ok(k) = stored_key(store, &String::from_utf8_lossy(&id)).await {
            out.push(k);
        }
    }
    out.sort_by(|a, b| a.record.id.cmp(&b.record.id));
    Ok(out)
}

/// Every key's record, by id.
pub async fn list_keys<S: Store>(store: &S) -> Result<Vec<KeyRecord>, AdminError> {
    Ok(list_stored(store)
        .await?
        .into_iter()
        .map(|k| k.record)
        .collect())
}

/// One page of the keys (of `identity`, if given), by id: at most `limit` keys
/// after the id `after`, and whether more follow.
pub async fn key_page<S: Store>(
    store: &S,
    identity: Option<&str>,
    after: Option<&str>,
    limit: usize,
) -> Result<(Vec<StoredKey>, bool), AdminError> {
    let mut keys: Vec<StoredKey> = list_stored(store)
        .await?
        .into_iter()
        .filter(|k| identity.is_none_or(|i| k.record.identity.as_deref() == Some(i)))
        .filter(|k| after.is_none_or(|a| k.record.id.as_str() > a))
        .collect();
    let more = keys.len() > limit;
    keys.truncate(limit);
    Ok((keys, more))
}

/// Changes a key's label (owner) and plan; its id, status and creation time stay
/// (a revoked key is read-only). Version checked ([`modify_key`]): a concurrent
/// change of another field is kept. Returns the record before and after.
pub async fn update_key<S: Store>(
    store: &S,
    id: &str,
    change: impl Fn(&mut KeyRecord),
) -> Result<(KeyRecord, KeyRecord), AdminError> {
    let (before, after, _) = modify_key(store, id, None, now_secs(), |r| {
        refuse_revoked(r)?;
        let mut after = r.clone();
        change(&mut after);
        after.status = r.status;
        validate_name("plan", &after.plan)?;
        Ok(after)
    })
    .await?;
    Ok((before, after))
}

/// Applies `changes` (the admin API's update) to the key `id` at `now`, version
/// checked ([`modify_key`]); every field checked before anything is stored. A
/// revoked key is read-only; changed credits start again from the new count.
pub async fn change_key<S: Store>(
    store: &S,
    id: &str,
    changes: &KeyChanges,
    if_match: Option<&str>,
    now: i64,
) -> Result<(KeyRecord, KeyRecord, String), AdminError> {
    modify_key(store, id, if_match, now, |r| {
        refuse_revoked(r)?;
        Ok(changes.apply(r, now).map_err(PolicyError::from)?)
    })
    .await
}

/// What a key change did to its live credits (`shared/src/credits.rs`), written
/// before the record is saved and undone if the save does not happen:
///
/// - its credits changed: the live count starts again from the new record;
/// - its identity changed (and with it the key the live count is under): the
///   old key's count is taken and replaced by [`MOVED`] in ONE command (an edge
///   still deciding by the old record spends no more there, and reads the record
///   again), then written under the new key — spent credits are never given back.
#[derive(Default)]
struct LiveCredits {
    /// What the old and the new key held before (`None`: absent), to put back.
    undo: Vec<(String, Option<Vec<u8>>)>,
}

impl LiveCredits {
    async fn write<S: Store>(
        store: &S,
        before: &KeyRecord,
        after: &KeyRecord,
    ) -> Result<Self, AdminError> {
        let (old, new) = (credits_key_of(before), credits_key_of(after));
        let moved = old != new && before.credits.is_some();
        if !moved && before.credits == after.credits {
            return Ok(Self::default());
        }
        let now_us = redis_now(store).await?;
        let mut written = Self::default();
        let mut count = after.credits.map(|c| c.start(now_us));
        if moved {
            let held = swap(store, &old, Some(MOVED.as_bytes()), Some(MOVED_TTL_MS)).await?;
            if held.as_deref() == Some(MOVED.as_bytes()) {
                // another change is moving them: nothing of ours to put back
                return Err(AdminError::KeyConflict {
                    id: before.id.clone(),
                    based_on: "its credits".into(),
                    current: "moving them already".into(),
                });
            }
            written.undo.push((old, held.clone()));
            if before.credits == after.credits
                && let Some(c) = before.credits
            {
                let text = held.as_deref().and_then(|h| std::str::from_utf8(h).ok());
                count = Some(c.live(text, before.credits_origin(), now_us));
            }
        }
        let refill = after.credits.and_then(|c| c.refill);
        let ttl = refill.map(|r| r.live_ttl_ms(now_us).max(1) as u64);
        let text = count.map(|c| c.stored());
        let held = swap(store, &new, text.as_deref().map(str::as_bytes), ttl).await?;
        written.undo.insert(0, (new, held));
        Ok(written)
    }

    /// Puts back what [`LiveCredits::write`] replaced (the record was not saved).
    async fn undo<S: Store>(self, store: &S) -> Result<(), AdminError> {
        for (key, held) in self.undo {
            swap(store, &key, held.as_deref(), None).await?;
        }
        Ok(())
    }
}

/// The key a record's live credits are under.
fn credits_key_of(record: &KeyRecord) -> String {
    credits_key(&record.id, record.identity.as_deref())
}

/// Sets `key` to `value` (`None`: deletes it), expiring after `ttl_ms`, in one
/// command: what it held before.
async fn swap<S: Store>(
    store: &S,
    key: &str,
    value: Option<&[u8]>,
    ttl_ms: Option<u64>,
) -> Result<Option<Vec<u8>>, AdminError> {
    let Some(value) = value else {
        let held = store.command(&[b"GETDEL", key.as_bytes()]).await?;
        return Ok(held.into_bytes()?);
    };
    let ttl = ttl_ms.map(|t| t.to_string());
    let mut args: Vec<&[u8]> = vec![b"SET", key.as_bytes(), value];
    if let Some(t) = &ttl {
        args.extend([b"PX".as_slice(), t.as_bytes()]);
    }
    args.push(b"GET");
    Ok(store.command(&args).await?.into_bytes()?)
}

/// Refuses a plan (of a new key or a change) that the stored configuration does
/// not define, naming the configured ones.
pub async fn check_plan<S: Store>(store: &S, changes: &KeyChanges) -> Result<(), AdminError> {
    let Some(plan) = changes.plan.as_deref() else {
        return Ok(());
    };
    let stored = get_config(store).await?;
    let config = stored
        .as_deref()
        .and_then(|t| EdgeConfig::from_json(t).ok());
    match config {
        Some(c) if c.has_plan(plan) => Ok(()),
        Some(c) => {
            let plans: Vec<&str> = c.spec().plans.keys().map(String::as_str).collect();
            let shown: String = plan.chars().take(40).collect();
            Err(PolicyError::new(
                "plan",
                format!(
                    "no plan is named {shown:?}; configured: {}",
                    plans.join(", ")
                ),
            )
            .into())
        }
        None => Err(PolicyError::new("plan", "no configuration is stored yet").into()),
    }
}

/// Whether `key` was read under the hash of a secret a rotation replaced: the
/// index still names it while a rotation moves it to the new secret's.
fn is_previous(key: &StoredKey) -> bool {
    key.record
        .rotation
        .as_ref()
        .is_some_and(|r| r.previous_hash == key.hash)
}

/// Rotates the key `id` at `now`: a new secret (returned once, never stored),
/// the same key (id, identity, buckets); the replaced secret keeps working for
/// `overlap_secs` (0 to 30 days, [`KeyRecord::rotate`]), a secret an earlier
/// rotation replaced stops now. Returns the record before, after and the secret.
pub async fn rotate_key<S: Store>(
    store: &S,
    id: &str,
    overlap_secs: i64,
    now: i64,
) -> Result<(KeyRecord, KeyRecord, String), AdminError> {
    let mut random = [0u8; RANDOM_LEN];
    rand::rng().fill_bytes(&mut random);
    for _ in 0..8 {
        let key = stored_key(store, id).await?;
        if is_previous(&key) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            continue;
        }
        let secret = secret_for(&key.record.id, &random);
        let hash = hash_secret(&secret);
        let rotated = key
            .record
            .rotate(&key.hash, now, overlap_secs)
            .map_err(PolicyError::from)?;
        let record = rotated.record;
        // the replaced secret's record becomes the rotated one, version checked
        // (a concurrent change is read again); then the new secret's record is
        // written and the index moves to it
        if save_key(store, &key, &record, now).await?.is_none() {
            continue;
        }
        let json = record.to_json();
        if !store
            .set(&record_key(&hash), json.as_bytes(), SetOptions::NX)
            .await?
        {
            return Err(StoreError::protocol("a fresh secret's hash is taken").into());
        }
        store
            .command(&[
                b"HSET",
                KEY_INDEX.as_bytes(),
                id.as_bytes(),
                hash.as_bytes(),
            ])
            .await?;
        let mut gone: Vec<&str> = rotated.retired_hash.iter().map(String::as_str).collect();
        if overlap_secs == 0 {
            gone.push(&key.hash);
        }
        for old in gone {
            store.del(&[&record_key(old)]).await?;
            key_changed(store, old).await?;
        }
        key_changed(store, &hash).await?;
        return Ok((key.record, record, secret));
    }
    Err(AdminError::NotFound(format!(
        "key {id:?} kept changing while it was rotated; try again"
    )))
}

/// What the edge would decide on `secret` at `now` (Unix seconds), for
/// backends not behind it: its shape and checksum (no lookup when they fail),
/// then the record it names ([`VerifyAnswer::of`]). Spends nothing.
pub async fn verify_key<S: Store>(
    store: &S,
    secret: &str,
    now: i64,
) -> Result<VerifyAnswer, AdminError> {
    if check_secret(secret).is_err() {
        return Ok(VerifyAnswer::refused(VerifyReason::Malformed));
    }
    let hash = hash_secret(secret);
    let raw = store.get(&record_key(&hash)).await?;
    let found = raw
        .as_deref()
        .and_then(|raw| KeyRecord::from_json(raw).map(|r| (r, record_version(raw))));
    Ok(VerifyAnswer::of(
        found.as_ref().map(|(r, v)| (r, v.as_str())),
        &hash,
        now,
    ))
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
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
