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
//!
//! One file a job: `token` (who calls, and the rate limit), `request` (reading a
//! call), `answer` (JSON, statuses, headers), `keys` and `identities` (the calls).

mod answer;
mod identities;
mod keys;
mod request;
mod token;

use std::sync::Arc;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use floodgate_shared::adminapi::{ApiError, MAX_REQUEST_JSON};

use crate::state::Core;
use answer::fail;
use identities::{delete_override, identity, put_override, show_override};
use keys::{create, list, revoke, rotate, show, update, usage, verify};

/// The OpenAPI 3.1 document of this API.
pub const OPENAPI: &str = include_str!("../../openapi.json");

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
