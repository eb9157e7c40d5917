//! Operators and their sessions (feature `ssr`): the operator accounts, the
//! sign-in with its limiter, the session a signed-in browser's cookie names, and
//! the client address the limiter counts. `docs/dashboard.md` has the threat model.

mod client;
mod cookies;
mod operators;
mod sign_in;

pub use client::client_address;
pub use cookies::{
    DEVICE_COOKIE, SESSION_COOKIE, device_cookie, device_token, session_cookie, session_token,
};
pub use operators::{OPERATOR_PREFIX, ensure_operator, validate_user};
pub use sign_in::{LOGIN_ADDRESS_QUOTA, LOGIN_USER_QUOTA, SignedIn, TRUST_TTL_SECS, sign_in};

use axum::http::HeaderMap;
use floodgate_edge::store::{NativeStore, SetOptions, Store, StoreError};
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::model::AppError;

pub const SESSION_PREFIX: &str = "fg:dash:session:";
pub const SESSION_TTL_SECS: u64 = 12 * 3600;

/// A signed-in operator's session, put in the request's extensions by the guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub user: String,
    pub csrf: String,
    token_hash: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("Too many sign-in attempts; try again in {wait_secs} s")]
    TooManyAttempts { wait_secs: u64 },
    #[error("Wrong user name or password")]
    WrongCredentials,
    #[error("{0}")]
    Refused(String),
}

impl From<AuthError> for AppError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Store(e) => AppError::Unavailable(e.to_string()),
            AuthError::TooManyAttempts { wait_secs } => AppError::TooManyAttempts { wait_secs },
            AuthError::WrongCredentials => AppError::WrongCredentials,
            AuthError::Refused(m) => AppError::Internal(m),
        }
    }
}

fn sha256_hex(data: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(data);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares secrets in time that does not depend on where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// Sets `key` to `value` for `ttl_secs`.
async fn set_for(
    store: &NativeStore,
    key: &str,
    value: &str,
    ttl_secs: u64,
) -> Result<(), StoreError> {
    let expire = SetOptions::default().expire(std::time::Duration::from_secs(ttl_secs));
    store.set(key, value.as_bytes(), expire).await?;
    Ok(())
}

/// Stores a new session of `user` (with its own CSRF token); returns its token,
/// which only the browser's cookie holds (the store keeps its hash).
async fn start_session(store: &NativeStore, user: &str) -> Result<String, StoreError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_in_full() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
        assert!(!same_secret("", "a"));
    }
}
