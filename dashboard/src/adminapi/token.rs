//! Who calls the admin API, and how often: the `Authorization: Bearer` token
//! looked up (hashed, [`floodgate_edge::tokens`]) and its scope checked, then its
//! bucket charged one request by Floodgate's own token-bucket script; and the name
//! the audit log gives the token.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use floodgate_edge::store::Store;
use floodgate_edge::tokens;
use floodgate_shared::adminapi::{ApiError, Scope, TokenRecord, TokenRefusal, token_rate_key};
use floodgate_shared::contract::RateLimitHeaders;
use floodgate_shared::script::Check;

use super::answer::{admin_error, fail, with_rate};
use crate::state::Core;

/// A token that may make a call needing `needed`, its request counted: the
/// token and the rate-limit headers of its bucket; or the refusal.
pub(super) async fn authorize(
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

/// Who the audit log names for a token.
pub(super) fn who(token: &TokenRecord) -> String {
    format!("api:{} ({})", token.name, token.id)
}
