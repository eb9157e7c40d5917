//! The API keys: list them with their usage, create (the secret shown once),
//! edit, revoke; each operation audited.

use leptos::prelude::*;

#[cfg(feature = "ssr")]
use super::ctx;
use crate::error::AppError;
use crate::wire::{CreatedKey, KeyRow, Saved};

/// The keys with their usage over the last hour and their last use.
#[server(endpoint = "keys")]
pub async fn list_keys() -> Result<Vec<KeyRow>, AppError> {
    ctx::session().await?;
    let core = ctx::core()?;
    let keys = floodgate_edge::admin::list_keys(&core.store).await?;
    Ok(key_rows(&core, keys)
        .await?
        .into_iter()
        .map(|(_, r)| r)
        .collect())
}

/// Each key's record and its row: usage over the last hour, last use.
#[cfg(feature = "ssr")]
pub(super) async fn key_rows(
    core: &crate::state::Core,
    keys: Vec<floodgate_shared::apikeys::KeyRecord>,
) -> Result<Vec<(floodgate_shared::apikeys::KeyRecord, KeyRow)>, AppError> {
    let now = ctx::now_secs();
    let usage = crate::stats::store::usage(&core.store, now, 60).await?;
    let last_used = crate::stats::store::last_used(&core.store).await?;
    Ok(keys
        .into_iter()
        .map(|k| {
            let u = usage.get(&k.id).copied().unwrap_or_default();
            let row = KeyRow {
                revoked: k.status == floodgate_shared::apikeys::KeyStatus::Revoked,
                last_used: last_used.get(&k.id).copied(),
                id: k.id.clone(),
                label: k.owner.clone(),
                plan: k.plan.clone(),
                created: k.created,
                allowed: u.allowed,
                throttled: u.throttled,
                degraded: u.degraded,
            };
            (k, row)
        })
        .collect())
}

/// Creates a key on a configured plan; its secret is in the answer and nowhere else.
#[server(endpoint = "create_key")]
pub async fn create_key(
    #[server(default)] csrf: String,
    label: String,
    plan: String,
) -> Result<CreatedKey, AppError> {
    let (core, session) = ctx::mutation(&csrf).await?;
    if ctx::plain_form_post() {
        // the answer would be lost in the redirect back to the page: refuse before
        // a key whose secret nobody saw exists
        return Err(AppError::BadRequest(
            "creating a key shows its secret once, on this page, which needs JavaScript: turn \
             it on, or use floodgate-cli"
                .into(),
        ));
    }
    check_key_fields(&core, &label, &plan).await?;
    let (record, secret) =
        floodgate_edge::admin::create_key(&core.store, label.trim(), plan.trim(), ctx::now_secs())
            .await?;
    ctx::audit_key(&core, &session, "create key", None, &record).await?;
    Ok(CreatedKey {
        id: record.id,
        secret,
    })
}

/// Label ≤ 128 characters without control characters; the plan must be configured.
#[cfg(feature = "ssr")]
async fn check_key_fields(
    core: &crate::state::Core,
    label: &str,
    plan: &str,
) -> Result<(), AppError> {
    let label = label.trim();
    if label.chars().count() > 128 || label.chars().any(char::is_control) {
        return Err(AppError::invalid(
            "label",
            "must be at most 128 characters, without control characters",
        ));
    }
    let plan = plan.trim();
    match ctx::stored_config(core).await? {
        Some(c) if c.has_plan(plan) => Ok(()),
        Some(c) => {
            let plans: Vec<&str> = c.spec().plans.keys().map(String::as_str).collect();
            let shown: String = plan.chars().take(40).collect();
            Err(AppError::invalid(
                "plan",
                format!(
                    "no plan is named {shown:?}; configured: {}",
                    plans.join(", ")
                ),
            ))
        }
        None => Err(AppError::invalid("plan", "no configuration is stored yet")),
    }
}

/// Changes a key's label and plan (a revoked key is read-only).
#[server(endpoint = "update_key")]
pub async fn update_key(
    #[server(default)] csrf: String,
    id: String,
    label: String,
    plan: String,
) -> Result<Saved, AppError> {
    let (core, session) = ctx::mutation(&csrf).await?;
    check_key_fields(&core, &label, &plan).await?;
    let (label, plan) = (label.trim().to_string(), plan.trim().to_string());
    let (before, after) = floodgate_edge::admin::update_key(&core.store, id.trim(), |r| {
        r.owner.clone_from(&label);
        r.plan.clone_from(&plan);
    })
    .await?;
    ctx::audit_key(&core, &session, "edit key", Some(&before), &after).await?;
    Ok(Saved::Ok(format!("Saved key {}", after.id)))
}

/// Revokes a key: permanent, so the form must carry `confirm=yes` (the page asks
/// first).
#[server(endpoint = "revoke_key")]
pub async fn revoke_key(
    #[server(default)] csrf: String,
    id: String,
    #[server(default)] confirm: String,
) -> Result<Saved, AppError> {
    let (core, session) = ctx::mutation(&csrf).await?;
    if confirm != "yes" {
        return Err(AppError::invalid(
            "confirm",
            "revoking a key cannot be undone: confirm it first",
        ));
    }
    let before = floodgate_edge::admin::key_by_id(&core.store, id.trim()).await?;
    if before.status == floodgate_shared::apikeys::KeyStatus::Revoked {
        return Err(AppError::invalid(
            "id",
            format!("key {} is revoked already", before.id),
        ));
    }
    let after = floodgate_edge::admin::revoke_key(&core.store, id.trim()).await?;
    ctx::audit_key(&core, &session, "revoke key", Some(&before), &after).await?;
    Ok(Saved::Ok(format!("Revoked key {}", after.id)))
}
