//! The admin API's identity calls (`/api/v1/identities/{identity}…`): an
//! identity's keys and their usage together, and its override of their plans
//! (read, set, removed).

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use floodgate_edge::admin::{self, AdminError};
use floodgate_edge::identities;
use floodgate_shared::adminapi::{
    ApiError, IdentityOverrideView, IdentityView, Scope, override_field, parse_request,
};
use floodgate_shared::config::IdentityOverride;
use floodgate_shared::contract::RateLimitHeaders;

use super::answer::{Answer, admin_error, bad, fail, rated};
use super::keys::view;
use super::request::{minutes_param, text};
use super::token::{authorize, who};
use crate::state::Core;
use crate::time::now_secs;

/// `GET /api/v1/identities/{identity}?minutes=`: the identity's keys and their
/// decisions together over the last minutes.
pub(super) async fn identity(
    State(core): State<Arc<Core>>,
    headers: HeaderMap,
    Path(identity): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Answer {
    let (_, rate) = authorize(&core, &headers, Scope::Read).await?;
    let minutes = minutes_param(&query).map_err(bad)?;
    let (keys, _) = admin::key_page(&core.store, Some(&identity), None, usize::MAX)
        .await
        .map_err(admin_error)?;
    if keys.is_empty() {
        return Err(fail(
            StatusCode::NOT_FOUND,
            ApiError::new(format!("no key has the identity {:?}", quoted(&identity))),
        ));
    }
    let counts = crate::stats::store::usage(&core.store, now_secs(), minutes)
        .await
        .map_err(|e| admin_error(e.into()))?;
    let mut body = IdentityView {
        identity,
        keys: keys.iter().map(view).collect(),
        minutes,
        allowed: 0,
        throttled: 0,
        degraded: 0,
    };
    for k in &keys {
        let u = counts.get(&k.record.id).copied().unwrap_or_default();
        body.allowed += u.allowed;
        body.throttled += u.throttled;
        body.degraded += u.degraded;
    }
    Ok(rated(StatusCode::OK, &body, &rate))
}

/// The answer of an identity override's call (`shown` picks the override to
/// answer), or its error on the body's field.
fn override_answer(
    identity: &str,
    saved: Result<identities::OverrideSaved, AdminError>,
    shown: impl Fn(&identities::OverrideSaved) -> Option<&IdentityOverride>,
    rate: &RateLimitHeaders,
) -> Response {
    let saved = match saved {
        Ok(s) => s,
        Err(AdminError::Invalid(e)) => return bad(override_field(identity, e)),
        Err(e) => return admin_error(e),
    };
    let over = shown(&saved).cloned().unwrap_or_default();
    let body = IdentityOverrideView::of(identity, &over, &saved.version);
    rated(StatusCode::OK, &body, rate)
}

/// `GET /api/v1/identities/{identity}/overrides`: 404 when it has none.
pub(super) async fn show_override(
    State(core): State<Arc<Core>>,
    headers: HeaderMap,
    Path(identity): Path<String>,
) -> Answer {
    let (_, rate) = authorize(&core, &headers, Scope::Read).await?;
    let (version, _) = admin::load_config(&core.store).await.map_err(admin_error)?;
    let over = identities::identity_override(&core.store, &identity)
        .await
        .map_err(admin_error)?
        .ok_or_else(|| no_override(&identity))?;
    let body = IdentityOverrideView::of(&identity, &over, &version);
    Ok(rated(StatusCode::OK, &body, &rate))
}

fn no_override(identity: &str) -> Response {
    fail(
        StatusCode::NOT_FOUND,
        ApiError::new(format!("no override for identity {:?}", quoted(identity))),
    )
}

/// An identity as an error quotes it: its first 64 characters.
fn quoted(identity: &str) -> String {
    identity.chars().take(64).collect()
}

/// `PUT /api/v1/identities/{identity}/overrides`: sets (or replaces) what
/// replaces the plans of the identity's keys; the identity must be some key's.
pub(super) async fn put_override(
    State(core): State<Arc<Core>>,
    headers: HeaderMap,
    Path(identity): Path<String>,
    body: Bytes,
) -> Answer {
    let (token, rate) = authorize(&core, &headers, Scope::Write).await?;
    let over: IdentityOverride = parse_request(text(&body).map_err(bad)?).map_err(bad)?;
    let saved = identities::edit_identity_override(
        &core.store,
        &identity,
        Some(over),
        &who(&token),
        now_secs(),
    )
    .await;
    Ok(override_answer(
        &identity,
        saved,
        |s| s.after.as_ref(),
        &rate,
    ))
}

/// `DELETE /api/v1/identities/{identity}/overrides`: the identity's keys are
/// back on their own plans; answers the override removed.
pub(super) async fn delete_override(
    State(core): State<Arc<Core>>,
    headers: HeaderMap,
    Path(identity): Path<String>,
) -> Answer {
    let (token, rate) = authorize(&core, &headers, Scope::Write).await?;
    let saved =
        identities::edit_identity_override(&core.store, &identity, None, &who(&token), now_secs())
            .await;
    if matches!(&saved, Err(AdminError::NotFound(_))) {
        return Err(no_override(&identity));
    }
    Ok(override_answer(
        &identity,
        saved,
        |s| s.before.as_ref(),
        &rate,
    ))
}
