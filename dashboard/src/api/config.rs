//! The configuration: read it, change one item of it (version-checked, audited),
//! and the limits a key meets on an endpoint.

use leptos::prelude::*;

#[cfg(feature = "ssr")]
use super::ctx;
#[cfg(feature = "ssr")]
use floodgate_shared::config::ConfigEdit;

use crate::error::AppError;
use crate::forms::{
    DenyForm, HeadersForm, OverrideForm, PlanForm, PolicyForm, RouteForm, StartForm,
};
use crate::wire::{ConfigView, EffectiveRow, Saved};

#[server(endpoint = "config")]
pub async fn get_config() -> Result<ConfigView, AppError> {
    ctx::session().await?;
    let core = ctx::core()?;
    let (version, text) = floodgate_edge::admin::load_config(&core.store).await?;
    let spec = text
        .as_deref()
        .and_then(|t| floodgate_shared::config::EdgeConfig::from_json(t).ok())
        .map(|c| c.spec().clone());
    Ok(ConfigView { version, spec })
}

/// Creates a limit (`original` empty) or replaces the one named `original`; with
/// `preview=1`, backtests the change on the edges' recent decisions instead.
#[server(endpoint = "save_policy")]
pub async fn save_policy(
    #[server(default)] csrf: String,
    version: String,
    original: String,
    #[server(flatten)] form: PolicyForm,
    #[server(default)] preview: String,
) -> Result<Saved, AppError> {
    let edit = form.edit(&original)?;
    if preview == "1" {
        return super::backtest::backtest(&csrf, edit).await;
    }
    ctx::change_config(&csrf, &version, edit).await
}

/// Stores a first configuration (only while none is): one limit on one plan.
#[server(endpoint = "start_config")]
pub async fn start_config(
    #[server(default)] csrf: String,
    version: String,
    #[server(flatten)] form: StartForm,
) -> Result<Saved, AppError> {
    ctx::change_config(&csrf, &version, form.edit()?).await
}

#[server(endpoint = "delete_policy")]
pub async fn delete_policy(
    #[server(default)] csrf: String,
    version: String,
    name: String,
) -> Result<Saved, AppError> {
    ctx::change_config(&csrf, &version, ConfigEdit::DeletePolicy { name }).await
}

#[server(endpoint = "save_plan")]
pub async fn save_plan(
    #[server(default)] csrf: String,
    version: String,
    #[server(flatten)] form: PlanForm,
) -> Result<Saved, AppError> {
    ctx::change_config(&csrf, &version, form.edit()?).await
}

#[server(endpoint = "delete_plan")]
pub async fn delete_plan(
    #[server(default)] csrf: String,
    version: String,
    name: String,
) -> Result<Saved, AppError> {
    ctx::change_config(&csrf, &version, ConfigEdit::DeletePlan { name }).await
}

#[server(endpoint = "save_route")]
pub async fn save_route(
    #[server(default)] csrf: String,
    version: String,
    #[server(flatten)] form: RouteForm,
) -> Result<Saved, AppError> {
    ctx::change_config(&csrf, &version, form.edit()?).await
}

#[server(endpoint = "delete_route")]
pub async fn delete_route(
    #[server(default)] csrf: String,
    version: String,
    name: String,
) -> Result<Saved, AppError> {
    ctx::change_config(&csrf, &version, ConfigEdit::DeleteRoute { name }).await
}

#[server(endpoint = "save_override")]
pub async fn save_override(
    #[server(default)] csrf: String,
    version: String,
    #[server(flatten)] form: OverrideForm,
) -> Result<Saved, AppError> {
    ctx::change_config(&csrf, &version, form.edit()?).await
}

#[server(endpoint = "delete_override")]
pub async fn delete_override(
    #[server(default)] csrf: String,
    version: String,
    key_id: String,
) -> Result<Saved, AppError> {
    ctx::change_config(&csrf, &version, ConfigEdit::DeleteKeyOverride { key_id }).await
}

#[server(endpoint = "save_ip_policies")]
pub async fn save_ip_policies(
    #[server(default)] csrf: String,
    version: String,
    policies: String,
) -> Result<Saved, AppError> {
    let list = crate::forms::name_list("policies", &policies)
        .map_err(|e| AppError::from_policy(e, None))?;
    ctx::change_config(&csrf, &version, ConfigEdit::SetIpPolicies(list)).await
}

/// The response header options: the IETF fields on or off, and the Retry-After
/// jitter (whole seconds, 0-60).
#[server(endpoint = "save_headers")]
pub async fn save_headers(
    #[server(default)] csrf: String,
    version: String,
    #[server(flatten)] form: HeadersForm,
) -> Result<Saved, AppError> {
    ctx::change_config(&csrf, &version, form.edit()?).await
}

/// The deny lists, one entry per line each, saved together. An invalid entry is
/// refused on its list's field (`deny.ips`), naming the entry; nothing is saved.
#[server(endpoint = "save_deny")]
pub async fn save_deny(
    #[server(default)] csrf: String,
    version: String,
    #[server(flatten)] form: DenyForm,
) -> Result<Saved, AppError> {
    ctx::change_config(&csrf, &version, form.edit()?).await
}

/// The policies a request by `key_id` to `path` is checked against.
#[server(endpoint = "effective")]
pub async fn effective_limits(key_id: String, path: String) -> Result<Vec<EffectiveRow>, AppError> {
    use floodgate_shared::config::EdgeConfig;
    ctx::session().await?;
    let core = ctx::core()?;
    let invalid = |e| AppError::from_policy(e, None);
    let key_id = crate::forms::bounded("key_id", &key_id).map_err(invalid)?;
    let path = crate::forms::bounded("path", &path).map_err(invalid)?;
    let keys = floodgate_edge::admin::list_keys(&core.store).await?;
    let record = keys
        .iter()
        .find(|k| k.id == key_id)
        .ok_or_else(|| AppError::invalid("key_id", format!("no key has the id {key_id:?}")))?;
    let (_, text) = floodgate_edge::admin::load_config(&core.store).await?;
    let config = text
        .as_deref()
        .map(EdgeConfig::from_json)
        .ok_or_else(|| AppError::invalid("(form)", "no configuration is stored"))?
        .map_err(|e| AppError::invalid("(stored configuration)", e.to_string()))?;
    let route = config
        .routes()
        .resolve(if path.is_empty() { "/" } else { path })
        .cloned();
    let rows = config
        .applicable(
            (&record.id, record.identity.as_deref()),
            &record.plan,
            route.as_ref(),
            true,
        )
        .ok_or_else(|| {
            AppError::invalid(
                "key_id",
                format!("the key's plan {:?} is not configured", record.plan),
            )
        })?
        .into_iter()
        .map(|(p, source)| {
            let spec = floodgate_shared::policy::PolicySpec::from(p);
            EffectiveRow {
                policy: p.name().to_string(),
                source,
                limit: crate::describe::describe_quota(&spec),
                cost: p.cost(),
                failure_mode: crate::describe::failure_mode_name(&spec),
            }
        })
        .collect();
    Ok(rows)
}
