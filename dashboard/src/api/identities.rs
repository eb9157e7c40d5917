//! The identities: every identity some key holds, with its keys, their usage
//! together and its override (`identity_overrides`), which the page sets and
//! removes through `floodgate_edge::identities` (the admin API's and the CLI's
//! code: validated, version-checked, audited as the operator).

use leptos::prelude::*;

#[cfg(feature = "ssr")]
use super::ctx;
use crate::error::AppError;
use crate::wire::{IdentitiesView, Saved};

/// Every identity held by a key, by name, with its keys and override.
#[server(endpoint = "identities")]
pub async fn list_identities() -> Result<IdentitiesView, AppError> {
    use std::collections::BTreeMap;

    use crate::wire::IdentityRow;
    ctx::session().await?;
    let core = ctx::core()?;
    let records = floodgate_edge::admin::list_keys(&core.store).await?;
    let keys = super::keys::key_rows(&core, records).await?;
    let config = ctx::stored_config(&core).await?;
    let spec = config.as_ref().map(|c| c.spec());
    let mut rows: BTreeMap<String, IdentityRow> = BTreeMap::new();
    for (record, key) in keys {
        let Some(identity) = record.identity.clone() else {
            continue;
        };
        let over = spec.and_then(|s| s.identity_overrides.get(&identity));
        let row = rows.entry(identity.clone()).or_insert_with(|| IdentityRow {
            identity,
            keys: vec![],
            allowed: 0,
            throttled: 0,
            degraded: 0,
            plan: over.and_then(|o| o.plan.clone()),
            policies: over.and_then(|o| o.policies.clone()),
        });
        row.allowed += key.allowed;
        row.throttled += key.throttled;
        row.degraded += key.degraded;
        row.keys.push(key);
    }
    let plans = spec
        .map(|s| s.plans.keys().cloned().collect())
        .unwrap_or_default();
    Ok(IdentitiesView {
        identities: rows.into_values().collect(),
        plans,
    })
}

/// Sets (or replaces) an identity's override: `plan` (empty: each key's own)
/// and/or `policies` (comma-separated; empty: the plan's).
#[server(endpoint = "save_identity_override")]
pub async fn save_identity_override(
    #[server(default)] csrf: String,
    identity: String,
    #[server(default)] plan: String,
    #[server(default)] policies: String,
) -> Result<Saved, AppError> {
    use floodgate_shared::config::IdentityOverride;
    let invalid = |e| AppError::from_policy(e, None);
    let plan = crate::forms::bounded("plan", &plan)
        .map_err(invalid)?
        .trim();
    let policies = crate::forms::name_list("policies", &policies).map_err(invalid)?;
    let over = IdentityOverride {
        plan: (!plan.is_empty()).then(|| plan.to_string()),
        policies: (!policies.is_empty()).then_some(policies),
    };
    edit(&csrf, &identity, Some(over)).await
}

/// Removes an identity's override: its keys are back on their own plans.
#[server(endpoint = "delete_identity_override")]
pub async fn delete_identity_override(
    #[server(default)] csrf: String,
    identity: String,
) -> Result<Saved, AppError> {
    edit(&csrf, &identity, None).await
}

/// The edit as the signed-in operator, its errors on the form's fields
/// (`plan`, `policies`, `identity`).
#[cfg(feature = "ssr")]
async fn edit(
    csrf: &str,
    identity: &str,
    over: Option<floodgate_shared::config::IdentityOverride>,
) -> Result<Saved, AppError> {
    use floodgate_edge::admin::AdminError;
    let (core, session) = ctx::mutation(csrf).await?;
    let identity =
        crate::forms::bounded("identity", identity).map_err(|e| AppError::from_policy(e, None))?;
    let removing = over.is_none();
    floodgate_edge::identities::edit_identity_override(
        &core.store,
        identity,
        over,
        &session.user,
        ctx::now_secs(),
    )
    .await
    .map_err(|e| match e {
        AdminError::Invalid(e) => AppError::from_policy(
            floodgate_shared::adminapi::override_field(identity, e),
            None,
        ),
        e => e.into(),
    })?;
    let done = if removing { "removed" } else { "saved" };
    Ok(Saved::Ok(format!(
        "Override for identity {identity} {done}"
    )))
}
