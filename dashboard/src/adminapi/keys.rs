//! The admin API's key calls (`/api/v1/keys…`, `/api/v1/verify`): create, list,
//! show, change, rotate, revoke, read a key's usage, and verify a secret; each
//! change made by `floodgate_edge::admin` and audited in the token's name.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use floodgate_edge::admin::{self, StoredKey};
use floodgate_shared::adminapi::{
    DEFAULT_PAGE, KeyPage, KeyUsage, KeyView, KeyWithSecret, MAX_PAGE, RotateRequest, Scope,
    TokenRecord, VerifyRequest, parse_request,
};
use floodgate_shared::apikeys::{KeyRecord, KeyStatus};
use floodgate_shared::audit::AuditEntry;
use floodgate_shared::keychanges::KeyChanges;
use floodgate_shared::policy::PolicyError;

use super::answer::{Answer, admin_error, bad, key_answer, rated};
use super::request::{if_match, minutes_param, only_params, text, whole_param};
use super::token::{authorize, who};
use crate::state::Core;
use crate::time::now_secs;

async fn audit_key(
    core: &Core,
    token: &TokenRecord,
    action: &str,
    before: Option<&KeyRecord>,
    after: &KeyRecord,
) -> Result<(), Response> {
    let entry = AuditEntry {
        at: now_secs(),
        user: who(token),
        action: action.to_string(),
        target: after.id.clone(),
        before: before.map(|b| admin::audit_item(&b.to_json())),
        after: Some(admin::audit_item(&after.to_json())),
    };
    admin::audit(&core.store, &entry).await.map_err(admin_error)
}

pub(super) fn view(k: &StoredKey) -> KeyView {
    KeyView::of(&k.record, &k.version)
}

/// A record just written, as answered: its view and its version (of its JSON).
fn versioned(record: &KeyRecord) -> (KeyView, String) {
    let version = admin::record_version(record.to_json().as_bytes());
    (KeyView::of(record, &version), version)
}

/// `POST /api/v1/keys`: a new key; its secret is in the answer and nowhere else.
pub(super) async fn create(
    State(core): State<Arc<Core>>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let (token, rate) = authorize(&core, &headers, Scope::Write).await?;
    let changes = KeyChanges::from_json(text(&body).map_err(bad)?).map_err(bad)?;
    admin::check_plan(&core.store, &changes)
        .await
        .map_err(admin_error)?;
    let (record, secret) = admin::create_key_with(&core.store, &changes, now_secs())
        .await
        .map_err(admin_error)?;
    audit_key(&core, &token, "key.create", None, &record).await?;
    let (key, version) = versioned(&record);
    let body = KeyWithSecret { key, secret };
    Ok(key_answer(StatusCode::CREATED, &body, &version, &rate))
}

/// `GET /api/v1/keys?identity=&cursor=&limit=`: a page of keys, by id.
pub(super) async fn list(
    State(core): State<Arc<Core>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Answer {
    let (_, rate) = authorize(&core, &headers, Scope::Read).await?;
    only_params(&query, &["identity", "cursor", "limit"]).map_err(bad)?;
    let limit =
        whole_param(&query, "limit", DEFAULT_PAGE as i64, MAX_PAGE as i64).map_err(bad)? as usize;
    let identity = query.get("identity").map(String::as_str);
    let cursor = query.get("cursor").map(String::as_str);
    let (keys, more) = admin::key_page(&core.store, identity, cursor, limit)
        .await
        .map_err(admin_error)?;
    let next_cursor = more
        .then(|| keys.last().map(|k| k.record.id.clone()))
        .flatten();
    let page = KeyPage {
        keys: keys.iter().map(view).collect(),
        next_cursor,
    };
    Ok(rated(StatusCode::OK, &page, &rate))
}

/// `GET /api/v1/keys/{id}`.
pub(super) async fn show(
    State(core): State<Arc<Core>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Answer {
    let (_, rate) = authorize(&core, &headers, Scope::Read).await?;
    let key = admin::stored_key(&core.store, &id)
        .await
        .map_err(admin_error)?;
    Ok(key_answer(StatusCode::OK, &view(&key), &key.version, &rate))
}

/// `PATCH /api/v1/keys/{id}`: the fields named change (`null` clears one),
/// version checked.
pub(super) async fn update(
    State(core): State<Arc<Core>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let (token, rate) = authorize(&core, &headers, Scope::Write).await?;
    let changes = KeyChanges::from_json(text(&body).map_err(bad)?).map_err(bad)?;
    let expected = if_match(&headers).map_err(bad)?;
    admin::check_plan(&core.store, &changes)
        .await
        .map_err(admin_error)?;
    let (before, after, version) =
        admin::change_key(&core.store, &id, &changes, expected.as_deref(), now_secs())
            .await
            .map_err(admin_error)?;
    audit_key(&core, &token, "key.update", Some(&before), &after).await?;
    Ok(key_answer(
        StatusCode::OK,
        &KeyView::of(&after, &version),
        &version,
        &rate,
    ))
}

/// `POST /api/v1/keys/{id}/rotate`: a new secret; the replaced one works for the
/// overlap asked.
pub(super) async fn rotate(
    State(core): State<Arc<Core>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let (token, rate) = authorize(&core, &headers, Scope::Write).await?;
    let req: RotateRequest = parse_request(text(&body).map_err(bad)?).map_err(bad)?;
    let (before, after, secret) =
        admin::rotate_key(&core.store, &id, req.overlap_seconds, now_secs())
            .await
            .map_err(admin_error)?;
    audit_key(&core, &token, "key.rotate", Some(&before), &after).await?;
    let (key, version) = versioned(&after);
    let body = KeyWithSecret { key, secret };
    Ok(key_answer(StatusCode::OK, &body, &version, &rate))
}

/// `POST /api/v1/keys/{id}/revoke`: permanent.
pub(super) async fn revoke(
    State(core): State<Arc<Core>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Answer {
    let (token, rate) = authorize(&core, &headers, Scope::Write).await?;
    let before = admin::key_by_id(&core.store, &id)
        .await
        .map_err(admin_error)?;
    if before.status == KeyStatus::Revoked {
        return Err(bad(PolicyError::new(
            "id",
            format!("key {} is revoked already", before.id),
        )));
    }
    let after = admin::revoke_key(&core.store, &id)
        .await
        .map_err(admin_error)?;
    audit_key(&core, &token, "key.revoke", Some(&before), &after).await?;
    let (key, version) = versioned(&after);
    Ok(key_answer(StatusCode::OK, &key, &version, &rate))
}

/// `GET /api/v1/keys/{id}/usage?minutes=`: the key's decisions over the last
/// minutes, as the edges count them (`crate::stats::store`, the keys page's source).
pub(super) async fn usage(
    State(core): State<Arc<Core>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Answer {
    let (_, rate) = authorize(&core, &headers, Scope::Read).await?;
    let minutes = minutes_param(&query).map_err(bad)?;
    let key = admin::key_by_id(&core.store, &id)
        .await
        .map_err(admin_error)?;
    let unavailable = |e: floodgate_edge::store::StoreError| admin_error(e.into());
    let counts = crate::stats::store::usage(&core.store, now_secs(), minutes)
        .await
        .map_err(unavailable)?;
    let last = crate::stats::store::last_used(&core.store)
        .await
        .map_err(unavailable)?;
    let u = counts.get(&key.id).copied().unwrap_or_default();
    let body = KeyUsage {
        minutes,
        allowed: u.allowed,
        throttled: u.throttled,
        degraded: u.degraded,
        last_used: last.get(&key.id).copied(),
        id: key.id,
    };
    Ok(rated(StatusCode::OK, &body, &rate))
}

/// `POST /api/v1/verify`: the edge's checks of a secret, for backends not behind
/// it (nothing spent).
pub(super) async fn verify(
    State(core): State<Arc<Core>>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let (_, rate) = authorize(&core, &headers, Scope::Read).await?;
    let req: VerifyRequest = parse_request(text(&body).map_err(bad)?).map_err(bad)?;
    let answer = admin::verify_key(&core.store, &req.key, now_secs())
        .await
        .map_err(admin_error)?;
    Ok(rated(StatusCode::OK, &answer, &rate))
}
