//! The admin HTTP API (feature `ssr`): `/api/v1/…`, JSON in and out, for an
//! operator's own backend to create, read, change, rotate, revoke and verify API
//! keys and read their usage. Its OpenAPI 3.1 document is `dashboard/openapi.json`, served at
//! `/api/v1/openapi.json`; its types are `floodgate_shared::adminapi`.
//!
//! Outside the session guard: no cookies and no CSRF token, since browsers never
//! send an `Authorization: Bearer` token on their own. Each call:
//! 1. its token is looked up (hashed, [`floodgate_edge::tokens`]) and its scope
//!    checked: 401 for a missing, unknown or revoked token, 403 for a read token
//!    on a write call;
//! 2. the token's bucket is charged one request by Floodgate's own token-bucket
//!    script (one atomic call, as the sign-in limiter's): 429 with `Retry-After`
//!    when empty, the `RateLimit` headers on every answer;
//! 3. the change is made by `floodgate_edge::admin`, the code the dashboard's
//!    pages and `floodgate-cli` use, and audited as `api:<token name> (<id>)`.
//!
//! Bad input is a 400 `{"error", "field"}` naming the field, nothing stored.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use floodgate_edge::admin::{self, AdminError, StoredKey};
use floodgate_edge::identities;
use floodgate_edge::store::Store;
use floodgate_edge::tokens;
use floodgate_shared::adminapi::{
    ApiError, DEFAULT_PAGE, DEFAULT_USAGE_MINUTES, IdentityOverrideView, IdentityView, KeyPage,
    KeyUsage, KeyView, KeyWithSecret, MAX_PAGE, MAX_REQUEST_JSON, MAX_USAGE_MINUTES, RotateRequest,
    Scope, TokenRecord, TokenRefusal, VerifyRequest, override_field, parse_request, token_rate_key,
};
use floodgate_shared::apikeys::{KeyRecord, KeyStatus};
use floodgate_shared::audit::AuditEntry;
use floodgate_shared::config::IdentityOverride;
use floodgate_shared::contract::RateLimitHeaders;
use floodgate_shared::keychanges::KeyChanges;
use floodgate_shared::policy::PolicyError;
use floodgate_shared::script::Check;
use serde::Serialize;

use crate::state::Core;

/// The OpenAPI 3.1 document of this API.
pub const OPENAPI: &str = include_str!("../openapi.json");

/// An answer: the status and the body's JSON.
type Answer = Result<Response, Response>;

/// The API's routes over `core` (merged into the dashboard's router, outside the
/// session guard).
pub fn routes(core: Arc<Core>) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/openapi.json", get(openapi))
        .route("/api/v1/keys", post(create).get(list))
        .route("/api/v1/keys/{id}", get(show).patch(update))
        .route("/api/v1/keys/{id}/rotate", post(rotate))
        .route("/api/v1/keys/{id}/revoke", post(revoke))
        .route("/api/v1/keys/{id}/usage", get(usage))
        .route("/api/v1/identities/{identity}", get(identity))
        .route(
            "/api/v1/identities/{identity}/overrides",
            get(show_override).put(put_override).delete(delete_override),
        )
        .route("/api/v1/verify", post(verify))
        .route("/api/v1/{*rest}", any(not_found))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_REQUEST_JSON))
        .with_state(core)
}

fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    let text = serde_json::to_string(body).unwrap_or_default();
    let mut r = (status, text).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

fn fail(status: StatusCode, e: ApiError) -> Response {
    json(status, &e)
}

fn bad(e: PolicyError) -> Response {
    fail(StatusCode::BAD_REQUEST, e.into())
}

/// The status and body of an admin error.
fn admin_error(e: AdminError) -> Response {
    match e {
        AdminError::Invalid(e) => bad(e),
        AdminError::NotFound(m) => fail(StatusCode::NOT_FOUND, ApiError::new(m)),
        AdminError::Store(e) => fail(
            StatusCode::SERVICE_UNAVAILABLE,
            ApiError::new(format!("the store is unavailable: {e}")),
        ),
        e @ AdminError::KeyConflict { .. } => fail(
            StatusCode::PRECONDITION_FAILED,
            ApiError {
                error: e.to_string(),
                field: Some("If-Match".into()),
            },
        ),
        e => fail(StatusCode::CONFLICT, ApiError::new(e.to_string())),
    }
}

fn now_secs() -> i64 {
    crate::time::now_secs()
}

/// A token that may make a call needing `needed`, its request counted: the
/// token and the rate-limit headers of its bucket; or the refusal.
async fn authorize(
    core: &Core,
    headers: &HeaderMap,
    needed: Scope,
) -> Result<(TokenRecord, RateLimitHeaders), Response> {
    let refuse = |r: TokenRefusal| {
        let status = StatusCode::from_u16(r.status()).unwrap_or(StatusCode::UNAUTHORIZED);
        let mut res = fail(status, r.error());
        if status == StatusCode::UNAUTHORIZED {
            res.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        res
    };
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(refuse(TokenRefusal::Missing));
    };
    let secret = value
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim())
        .ok_or_else(|| refuse(TokenRefusal::Invalid))?;
    let token = tokens::token_by_secret(&core.store, secret)
        .await
        .map_err(admin_error)?;
    TokenRecord::admits(token.as_ref(), needed).map_err(refuse)?;
    let token = token.expect("admitted");
    let key = token_rate_key(&token.id);
    let verdict = core
        .store
        .check(&[Check::new(&key, &core.api_quota, 1)], None)
        .await
        .map_err(|e| admin_error(e.into()))?;
    let d = verdict.headline();
    let rate = RateLimitHeaders::from(d);
    if !verdict.admitted {
        let wait = d.retry_after_secs().unwrap_or(1);
        let mut res = fail(
            StatusCode::TOO_MANY_REQUESTS,
            ApiError::new(format!(
                "too many requests for this API token; retry in {wait} s"
            )),
        );
        with_rate(&mut res, &rate);
        res.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(wait));
        return Err(res);
    }
    Ok((token, rate))
}

fn with_rate(res: &mut Response, rate: &RateLimitHeaders) {
    for (k, v) in rate.pairs() {
        if let Ok(v) = HeaderValue::from_str(&v) {
            res.headers_mut().insert(k, v);
        }
    }
}

/// Who the audit log names for a token.
fn who(token: &TokenRecord) -> String {
    format!("api:{} ({})", token.name, token.id)
}

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

/// A key's answer, its version also as the `ETag`.
fn key_answer<T: Serialize>(
    status: StatusCode,
    body: &T,
    version: &str,
    rate: &RateLimitHeaders,
) -> Response {
    let mut res = json(status, body);
    if let Ok(v) = HeaderValue::from_str(&format!("\"{version}\"")) {
        res.headers_mut().insert(header::ETAG, v);
    }
    with_rate(&mut res, rate);
    res
}

/// A request body as UTF-8 text.
fn text(body: &Bytes) -> Result<&str, PolicyError> {
    std::str::from_utf8(body).map_err(|_| PolicyError::new("(document)", "is not UTF-8 JSON"))
}

async fn openapi() -> Response {
    let mut r = OPENAPI.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

async fn not_found() -> Response {
    fail(
        StatusCode::NOT_FOUND,
        ApiError::new("no such API call (see /api/v1/openapi.json)"),
    )
}

/// `POST /api/v1/keys`: a new key; its secret is in the answer and nowhere else.
async fn create(State(core): State<Arc<Core>>, headers: HeaderMap, body: Bytes) -> Answer {
    let (token, rate) = authorize(&core, &headers, Scope::Write).await?;
    let changes = KeyChanges::from_json(text(&body).map_err(bad)?).map_err(bad)?;
    admin::check_plan(&core.store, &changes)
        .await
        .map_err(admin_error)?;
    let (record, secret) = admin::create_key_with(&core.store, &changes, now_secs())
        .await
        .map_err(admin_error)?;
    audit_key(&core, &token, "key.create", None, &record).await?;
    let version = admin::record_version(record.to_json().as_bytes());
    let body = KeyWithSecret {
        key: KeyView::of(&record, &version),
        secret,
    };
    Ok(key_answer(StatusCode::CREATED, &body, &version, &rate))
}

/// `GET /api/v1/keys?identity=&cursor=&limit=`: a page of keys, by id.
async fn list(
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
    let mut res = json(StatusCode::OK, &page);
    with_rate(&mut res, &rate);
    Ok(res)
}

/// Refuses a query parameter not in `known`, naming it.
fn only_params(query: &HashMap<String, String>, known: &[&str]) -> Result<(), PolicyError> {
    match query.keys().find(|k| !known.contains(&k.as_str())) {
        Some(other) => Err(PolicyError::new(
            other.as_str(),
            format!("is not a parameter of this call ({})", known.join(", ")),
        )),
        None => Ok(()),
    }
}

/// The whole-number parameter `name`, 1 to `max` (`default` when absent).
fn whole_param(
    query: &HashMap<String, String>,
    name: &str,
    default: i64,
    max: i64,
) -> Result<i64, PolicyError> {
    match query.get(name) {
        None => Ok(default),
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| {
                PolicyError::new(name, format!("must be a whole number from 1 to {max}"))
            }),
    }
}

/// `GET /api/v1/keys/{id}/usage?minutes=`: the key's decisions over the last
/// minutes, as the edges count them (`crate::stats::store`, the keys page's source).
async fn usage(
    State(core): State<Arc<Core>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Answer {
    let (_, rate) = authorize(&core, &headers, Scope::Read).await?;
    only_params(&query, &["minutes"]).map_err(bad)?;
    let minutes =
        whole_param(&query, "minutes", DEFAULT_USAGE_MINUTES, MAX_USAGE_MINUTES).map_err(bad)?;
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
    let mut res = json(StatusCode::OK, &body);
    with_rate(&mut res, &rate);
    Ok(res)
}

/// `GET /api/v1/identities/{identity}?minutes=`: the identity's keys and their
/// decisions together over the last minutes.
async fn identity(
    State(core): State<Arc<Core>>,
    headers: HeaderMap,
    Path(identity): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Answer {
    let (_, rate) = authorize(&core, &headers, Scope::Read).await?;
    only_params(&query, &["minutes"]).map_err(bad)?;
    let minutes =
        whole_param(&query, "minutes", DEFAULT_USAGE_MINUTES, MAX_USAGE_MINUTES).map_err(bad)?;
    let (keys, _) = admin::key_page(&core.store, Some(&identity), None, usize::MAX)
        .await
        .map_err(admin_error)?;
    if keys.is_empty() {
        let shown: String = identity.chars().take(64).collect();
        return Err(fail(
            StatusCode::NOT_FOUND,
            ApiError::new(format!("no key has the identity {shown:?}")),
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
    let mut res = json(StatusCode::OK, &body);
    with_rate(&mut res, &rate);
    Ok(res)
}

fn view(k: &StoredKey) -> KeyView {
    KeyView::of(&k.record, &k.version)
}

/// `GET /api/v1/keys/{id}`.
async fn show(State(core): State<Arc<Core>>, headers: HeaderMap, Path(id): Path<String>) -> Answer {
    let (_, rate) = authorize(&core, &headers, Scope::Read).await?;
    let key = admin::stored_key(&core.store, &id)
        .await
        .map_err(admin_error)?;
    Ok(key_answer(StatusCode::OK, &view(&key), &key.version, &rate))
}

/// The version an `If-Match` names (`"v"`, `W/"v"` or `v`), if any.
fn if_match(headers: &HeaderMap) -> Result<Option<String>, PolicyError> {
    let Some(v) = headers.get(header::IF_MATCH) else {
        return Ok(None);
    };
    let v = v
        .to_str()
        .map_err(|_| PolicyError::new("If-Match", "must be a key's version"))?;
    let v = v.trim().trim_start_matches("W/").trim_matches('"');
    Ok(Some(v.to_string()))
}

/// `PATCH /api/v1/keys/{id}`: the fields named change (`null` clears one),
/// version checked.
async fn update(
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
async fn rotate(
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
    let version = admin::record_version(after.to_json().as_bytes());
    let body = KeyWithSecret {
        key: KeyView::of(&after, &version),
        secret,
    };
    Ok(key_answer(StatusCode::OK, &body, &version, &rate))
}

/// `POST /api/v1/keys/{id}/revoke`: permanent.
async fn revoke(
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
    let version = admin::record_version(after.to_json().as_bytes());
    Ok(key_answer(
        StatusCode::OK,
        &KeyView::of(&after, &version),
        &version,
        &rate,
    ))
}

/// `POST /api/v1/verify`: the edge's checks of a secret, for backends not behind
/// it (nothing spent).
async fn verify(State(core): State<Arc<Core>>, headers: HeaderMap, body: Bytes) -> Answer {
    let (_, rate) = authorize(&core, &headers, Scope::Read).await?;
    let req: VerifyRequest = parse_request(text(&body).map_err(bad)?).map_err(bad)?;
    let answer = admin::verify_key(&core.store, &req.key, now_secs())
        .await
        .map_err(admin_error)?;
    let mut res = json(StatusCode::OK, &answer);
    with_rate(&mut res, &rate);
    Ok(res)
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
    let mut res = json(StatusCode::OK, &body);
    with_rate(&mut res, rate);
    res
}

/// `GET /api/v1/identities/{identity}/overrides`: 404 when it has none.
async fn show_override(
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
    let mut res = json(
        StatusCode::OK,
        &IdentityOverrideView::of(&identity, &over, &version),
    );
    with_rate(&mut res, &rate);
    Ok(res)
}

fn no_override(identity: &str) -> Response {
    let shown: String = identity.chars().take(64).collect();
    fail(
        StatusCode::NOT_FOUND,
        ApiError::new(format!("no override for identity {shown:?}")),
    )
}

/// `PUT /api/v1/identities/{identity}/overrides`: sets (or replaces) what
/// replaces the plans of the identity's keys; the identity must be some key's.
async fn put_override(
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
async fn delete_override(
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
