//! Sessions: `fg:dash:session:<sha256 of the token>` holds the operator and the
//! session's CSRF token for [`SESSION_TTL_SECS`]; only the browser's cookie holds
//! the token.

use axum::http::HeaderMap;
use floodgate_edge::store::{NativeStore, Store, StoreError};

use super::cookies::session_token;
use super::{AuthError, random_hex, set_for, sha256_hex};

pub const SESSION_PREFIX: &str = "fg:dash:session:";
pub const SESSION_TTL_SECS: u64 = 12 * 3600;

/// A signed-in operator's session, put in the request's extensions by the guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub user: String,
    pub csrf: String,
    token_hash: String,
}

/// Stores a new session of `user` (with its own CSRF token); returns its token,
/// which only the browser's cookie holds (the store keeps its hash).
pub(super) async fn start_session(store: &NativeStore, user: &str) -> Result<String, StoreError> {
    let token = random_hex(32);
    let session = serde_json::json!({"user": user, "csrf": random_hex(32)}).to_string();
    let key = format!("{SESSION_PREFIX}{}", sha256_hex(token.as_bytes()));
    set_for(store, &key, &session, SESSION_TTL_SECS).await?;
    Ok(token)
}

/// The session the request's cookie names, if it is live.
pub async fn lookup_session(
    store: &NativeStore,
    headers: &HeaderMap,
) -> Result<Option<Session>, AuthError> {
    let Some(token) = session_token(headers) else {
        return Ok(None);
    };
    let token_hash = sha256_hex(token.as_bytes());
    let key = format!("{SESSION_PREFIX}{token_hash}");
    let Some(raw) = store.get_text(&key).await? else {
        return Ok(None);
    };
    let v: serde_json::Value = serde_json::from_str(&raw).unwrap_or_default();
    match (v["user"].as_str(), v["csrf"].as_str()) {
        (Some(user), Some(csrf)) => Ok(Some(Session {
            user: user.to_string(),
            csrf: csrf.to_string(),
            token_hash,
        })),
        _ => Ok(None),
    }
}

pub async fn sign_out(store: &NativeStore, session: &Session) -> Result<(), AuthError> {
    store
        .del(&[&format!("{SESSION_PREFIX}{}", session.token_hash)])
        .await?;
    Ok(())
}
