//! How the admin API answers: a JSON body with its status, an error as the
//! status and `{"error", "field"}` it maps to, and the rate-limit headers of the
//! caller's token on every answer.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use floodgate_edge::admin::AdminError;
use floodgate_shared::adminapi::ApiError;
use floodgate_shared::contract::RateLimitHeaders;
use floodgate_shared::policy::PolicyError;
use serde::Serialize;

/// An answer: the status and the body's JSON.
pub(super) type Answer = Result<Response, Response>;

pub(super) fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
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

pub(super) fn fail(status: StatusCode, e: ApiError) -> Response {
    json(status, &e)
}

pub(super) fn bad(e: PolicyError) -> Response {
    fail(StatusCode::BAD_REQUEST, e.into())
}

/// The status and body of an admin error.
pub(super) fn admin_error(e: AdminError) -> Response {
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

pub(super) fn with_rate(res: &mut Response, rate: &RateLimitHeaders) {
    for (k, v) in rate.pairs() {
        if let Ok(v) = HeaderValue::from_str(&v) {
            res.headers_mut().insert(k, v);
        }
    }
}

/// A JSON answer with the rate-limit headers of the caller's token.
pub(super) fn rated<T: Serialize>(
    status: StatusCode,
    body: &T,
    rate: &RateLimitHeaders,
) -> Response {
    let mut res = json(status, body);
    with_rate(&mut res, rate);
    res
}

/// A key's answer, its version also as the `ETag`.
pub(super) fn key_answer<T: Serialize>(
    status: StatusCode,
    body: &T,
    version: &str,
    rate: &RateLimitHeaders,
) -> Response {
    let mut res = rated(status, body, rate);
    if let Ok(v) = HeaderValue::from_str(&format!("\"{version}\"")) {
        res.headers_mut().insert(header::ETAG, v);
    }
    res
}
