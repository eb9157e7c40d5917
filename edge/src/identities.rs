//! Identity overrides (`identity_overrides` of the configuration, see
//! `floodgate_shared::config::IdentityOverride`): read, set and deleted by the
//! admin HTTP API, `floodgate-cli identity` and the dashboard's identities page,
//! all through [`edit_identity_override`]: one edit of the stored configuration,
//! validated as a whole, version-checked and audited like every save.
//!
//! The configuration alone cannot tell whether an identity exists (identities
//! live on key records), so the admin code checks it where records can be read:
//! an override naming an identity that no key holds is refused when it is saved
//! ([`check_new_identities`], also run by `config set` and the dashboard's
//! saves), naming its field. An override saved before its identity's last key
//! changed identity stays valid for the edge: it matches no key.

use floodgate_shared::audit::AuditEntry;
use floodgate_shared::config::{ConfigEdit, ConfigSpec, EdgeConfig, IdentityOverride};
use floodgate_shared::keyrecord::check_identity;
use floodgate_shared::policy::PolicyError;

use crate::admin::{AdminError, audit_item, edit_stored, list_keys, load_config};
use crate::store::Store;

/// The override of `identity` in the stored configuration, if any.
pub async fn identity_override<S: Store>(
    store: &S,
    identity: &str,
) -> Result<Option<IdentityOverride>, AdminError> {
    let (_, text) = load_config(store).await?;
    let Some(text) = text else { return Ok(None) };
    let config = EdgeConfig::from_json(&text)?;
    Ok(config.spec().identity_overrides.get(identity).cloned())
}

/// Refuses an override in `after` for an identity that no key holds, unless
/// `before` has an override for it already (so an unrelated save never fails on
/// an override made earlier). The error names `identity_overrides.<identity>`.
pub async fn check_new_identities<S: Store>(
    store: &S,
    before: Option<&ConfigSpec>,
    after: &ConfigSpec,
) -> Result<(), AdminError> {
    let new: Vec<&String> = after
        .identity_overrides
        .keys()
        .filter(|i| before.is_none_or(|b| !b.identity_overrides.contains_key(*i)))
        .collect();
    if new.is_empty() {
        return Ok(());
    }
    let keys = list_keys(store).await?;
    for identity in new {
        if !keys.iter().any(|k| k.identity.as_ref() == Some(identity)) {
            return Err(unknown_identity(identity));
        }
    }
    Ok(())
}

fn unknown_identity(identity: &str) -> AdminError {
    let shown: String = identity.chars().take(64).collect();
    AdminError::Invalid(PolicyError::new(
        format!("identity_overrides.{identity}"),
        format!("no API key has the identity {shown:?} (give a key this identity first)"),
    ))
}

/// What an identity override's save changed: the override before and after it,
/// and the configuration's new version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverrideSaved {
    pub before: Option<IdentityOverride>,
    pub after: Option<IdentityOverride>,
    pub version: String,
}

/// Sets (`Some`) or deletes (`None`) the override of `identity` in the stored
/// configuration as `who` at `now`: the identity checked (its shape, and a key
/// holding it, for a new override), the whole configuration validated (errors
/// name `identity_overrides.<identity>.plan`, `.policies[0]`, ...), saved over
/// the version it was read at with its audit record (`set identity override`,
/// `delete identity override`). A concurrent save is read again and the edit
/// re-applied to it, so neither change is lost. Deleting an override that does
/// not exist is [`AdminError::NotFound`].
pub async fn edit_identity_override<S: Store>(
    store: &S,
    identity: &str,
    over: Option<IdentityOverride>,
    who: &str,
    now_secs: i64,
) -> Result<OverrideSaved, AdminError> {
    check_identity(identity)
        .map_err(|e| PolicyError::new("identity", e.to_string().replace("identity: ", "")))?;
    let edit = match over {
        Some(over) => ConfigEdit::PutIdentityOverride {
            identity: identity.to_string(),
            over,
        },
        None => ConfigEdit::DeleteIdentityOverride {
            identity: identity.to_string(),
        },
    };
    let (config, before, version) = edit_stored(store, "(identity override)", |text: String| {
        let edit = edit.clone();
        async move {
            let stored = EdgeConfig::from_json(&text)?.spec().clone();
            let mut spec = stored.clone();
            let done = edit
                .clone()
                .apply(&mut spec)
                .map_err(|e| match e.field.as_str() {
                    "(form)" => AdminError::NotFound(e.message),
                    _ => AdminError::Invalid(e),
                })?;
            let config = EdgeConfig::new(spec)?;
            check_new_identities(store, Some(&stored), config.spec()).await?;
            let before = stored.identity_overrides.get(identity).cloned();
            let entry = AuditEntry {
                at: now_secs,
                user: who.to_string(),
                action: edit.action().into(),
                target: edit.target(),
                before: done.before.as_deref().map(audit_item),
                after: done.after.as_deref().map(audit_item),
            };
            Ok((config, entry, before))
        }
    })
    .await?;
    Ok(OverrideSaved {
        before,
        after: config.spec().identity_overrides.get(identity).cloned(),
        version,
    })
}
