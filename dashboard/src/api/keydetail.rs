//! One key in detail: its record's fields, the rotation's overlap, a change of
//! its expiry and credits (version-checked against the record the page showed,
//! through the admin API's `change_key`; audited as `edit key`), and a rotation
//! (the admin API's `rotate_key`: a new secret, shown once; audited as `rotate
//! key`).

use leptos::prelude::*;

#[cfg(feature = "ssr")]
use super::ctx;
use crate::error::AppError;
use crate::wire::{CreatedKey, KeyDetailView, Saved};

/// The key `id` as its page shows it.
#[server(endpoint = "key_detail")]
pub async fn key_detail(id: String) -> Result<KeyDetailView, AppError> {
    ctx::session().await?;
    let core = ctx::core()?;
    let stored = floodgate_edge::admin::stored_key(&core.store, id.trim()).await?;
    let r = stored.record.clone();
    let (_, row) = super::keys::key_rows(&core, vec![stored.record])
        .await?
        .pop()
        .ok_or_else(|| AppError::invalid("id", "no such key"))?;
    let compact = |v: serde_json::Value| v.to_string();
    let now = ctx::now_secs();
    Ok(KeyDetailView {
        row,
        identity: r.identity,
        name: r.name,
        metadata: r.metadata.map(|m| compact(serde_json::Value::Object(m))),
        expires_at: r.expires_at,
        credits: r
            .credits
            .map(|c| serde_json::to_string(&c).unwrap_or_default()),
        previous_secret_until: r.rotation.map(|o| o.overlap_ends).filter(|&end| end > now),
        version: stored.version,
    })
}

/// The key page form's fields, as text (empty: none; identity, name and
/// metadata left out: unchanged).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeyDetailForm {
    #[serde(default)]
    pub identity: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// A JSON object.
    #[serde(default)]
    pub metadata: Option<String>,
    /// RFC 3339 or Unix seconds.
    #[serde(default)]
    pub expires_at: String,
    /// JSON credits.
    #[serde(default)]
    pub credits: String,
}

/// Changes the key's identity, name, metadata (a JSON object), expiry
/// (`expires_at`: RFC 3339 or Unix seconds) and credits (JSON); an empty field
/// clears it. Only a field that differs from what the page showed is changed
/// (the admin API's checks: metadata an object of at most 1 KB, an identity's
/// form, an expiry in the future); new credits start the key's live count again,
/// so the form asks for `confirm_credits=yes` then.
#[server(endpoint = "save_key_detail")]
pub async fn save_key_detail(
    #[server(default)] csrf: String,
    id: String,
    version: String,
    #[server(flatten)] form: KeyDetailForm,
    #[server(default)] confirm_credits: String,
) -> Result<Saved, AppError> {
    let (core, session) = ctx::mutation(&csrf).await?;
    let current = floodgate_edge::admin::stored_key(&core.store, id.trim()).await?;
    let doc = changed_fields(&current.record, &form)?;
    if doc.is_empty() {
        return Ok(Saved::Ok("No change".into()));
    }
    if doc.contains_key("credits") && confirm_credits != "yes" {
        return Err(AppError::invalid(
            "confirm_credits",
            "new credits restart the key's live count: confirm it first",
        ));
    }
    let text = serde_json::Value::Object(doc).to_string();
    let changes = floodgate_shared::keychanges::KeyChanges::from_json(&text)
        .map_err(|e| AppError::from_policy(e, None))?;
    let (before, after, _) = floodgate_edge::admin::change_key(
        &core.store,
        id.trim(),
        &changes,
        Some(version.trim()),
        ctx::now_secs(),
    )
    .await?;
    ctx::audit_key(&core, &session, "edit key", Some(&before), &after).await?;
    Ok(Saved::Ok(format!("Saved key {}", after.id)))
}

/// Rotates the key: a new secret (in the answer and nowhere else), the replaced
/// one working `overlap_seconds` more (0 to 30 days), once the operator confirmed it
/// (`confirm_rotate=yes`). Like a key's creation it needs JavaScript: a plain form
/// post would lose the secret in the redirect, so it is refused before anything
/// changes.
#[server(endpoint = "rotate_key_secret")]
pub async fn rotate_key_secret(
    #[server(default)] csrf: String,
    id: String,
    #[server(default)] overlap_seconds: String,
    #[server(default)] confirm_rotate: String,
) -> Result<CreatedKey, AppError> {
    let (core, session) = ctx::mutation(&csrf).await?;
    if ctx::plain_form_post() {
        return Err(AppError::BadRequest(
            "rotating a key shows its new secret once, on this page, which needs JavaScript: \
             turn it on, or use floodgate-cli key rotate"
                .into(),
        ));
    }
    let overlap = overlap_seconds.trim().parse::<i64>().map_err(|_| {
        AppError::invalid(
            "overlap_seconds",
            "must be a whole number of seconds (0 to 2592000)",
        )
    })?;
    if confirm_rotate != "yes" {
        return Err(AppError::invalid(
            "confirm_rotate",
            "the key's clients need the new secret before the overlap ends: confirm it first",
        ));
    }
    let (before, after, secret) =
        floodgate_edge::admin::rotate_key(&core.store, id.trim(), overlap, ctx::now_secs()).await?;
    ctx::audit_key(&core, &session, "rotate key", Some(&before), &after).await?;
    Ok(CreatedKey {
        id: after.id,
        secret,
    })
}

/// The fields of the form that differ from `r`, as a key change's JSON.
#[cfg(feature = "ssr")]
fn changed_fields(
    r: &floodgate_shared::apikeys::KeyRecord,
    form: &KeyDetailForm,
) -> Result<serde_json::Map<String, serde_json::Value>, AppError> {
    use serde_json::Value;
    let mut doc = serde_json::Map::new();
    let text = |field: &str,
                shown: &Option<String>,
                given: &Option<String>,
                doc: &mut serde_json::Map<_, _>| {
        let Some(given) = given.as_deref().map(str::trim) else {
            return;
        };
        if given != shown.as_deref().unwrap_or("") {
            let value = if given.is_empty() {
                Value::Null
            } else {
                Value::from(given)
            };
            doc.insert(field.to_string(), value);
        }
    };
    text("identity", &r.identity, &form.identity, &mut doc);
    text("name", &r.name, &form.name, &mut doc);
    if let Some(given) = form.metadata.as_deref().map(str::trim) {
        let metadata = match given {
            "" => None,
            t => Some(
                serde_json::from_str::<Value>(t)
                    .map_err(|e| AppError::invalid("metadata", format!("is not JSON ({e})")))?,
            ),
        };
        if metadata != r.metadata.clone().map(Value::Object) {
            doc.insert("metadata".into(), metadata.unwrap_or(Value::Null));
        }
    }
    let (expires_at, credits) = (form.expires_at.trim(), form.credits.trim());
    let shown = r.expires_at.map(crate::time::rfc3339).unwrap_or_default();
    if expires_at != shown {
        let value = match expires_at {
            "" => Value::Null,
            t => Value::from(instant(t)?),
        };
        doc.insert("expires_at".into(), value);
    }
    let stored = r
        .credits
        .as_ref()
        .map(|c| serde_json::to_value(c).unwrap_or_default());
    let given = match credits {
        "" => None,
        t => Some(
            serde_json::from_str::<Value>(t)
                .map_err(|e| AppError::invalid("credits", format!("is not JSON ({e})")))?,
        ),
    };
    if given != stored {
        doc.insert("credits".into(), given.unwrap_or(Value::Null));
    }
    Ok(doc)
}

/// RFC 3339 or Unix seconds.
#[cfg(feature = "ssr")]
fn instant(text: &str) -> Result<i64, AppError> {
    text.parse::<i64>()
        .ok()
        .or_else(|| {
            chrono::DateTime::parse_from_rfc3339(text)
                .ok()
                .map(|t| t.timestamp())
        })
        .ok_or_else(|| {
            AppError::invalid(
                "expires_at",
                "must be RFC 3339 (2027-01-01T00:00:00Z) or Unix seconds",
            )
        })
}
