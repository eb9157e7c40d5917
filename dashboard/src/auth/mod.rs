//! Operators and their sessions (feature `ssr`): the operator accounts, the
//! sign-in with its limiter, the session a signed-in browser's cookie names, and
//! the client address the limiter counts. `docs/dashboard.md` has the threat model.

mod client;
mod cookies;
mod operators;
mod session;
mod sign_in;

pub use client::client_address;
pub use cookies::{
    DEVICE_COOKIE, SESSION_COOKIE, device_cookie, device_token, session_cookie, session_token,
};
pub use operators::{OPERATOR_PREFIX, ensure_operator, validate_user};
pub use session::{SESSION_PREFIX, SESSION_TTL_SECS, Session, lookup_session, sign_out};
pub use sign_in::{LOGIN_ADDRESS_QUOTA, LOGIN_USER_QUOTA, SignedIn, TRUST_TTL_SECS, sign_in};

use floodgate_edge::store::{NativeStore, SetOptions, Store, StoreError};
use floodgate_shared::hex::sha256_hex;
use rand::RngCore;
use subtle::ConstantTimeEq;

use crate::error::AppError;

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

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    floodgate_shared::hex::hex(&buf)
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
