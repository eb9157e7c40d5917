//! Operator accounts: `fg:dash:operator:<name>` holds the password's Argon2 hash.

use argon2::Argon2;
use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use floodgate_edge::store::{NativeStore, SetOptions, Store};

use super::AuthError;

pub const OPERATOR_PREFIX: &str = "fg:dash:operator:";

/// Checks an operator name: 1–64 of `A-Z a-z 0-9 . _ @ -`.
pub fn validate_user(user: &str) -> Result<(), String> {
    if user.is_empty()
        || user.len() > 64
        || !user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._@-".contains(&b))
    {
        return Err("a user name is 1 to 64 of A-Z a-z 0-9 . _ @ -".into());
    }
    Ok(())
}

fn hash_password(password: &str) -> Result<String, AuthError> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| AuthError::Refused(format!("cannot hash the password: {e}")))
}

/// Creates the operator unless one of that name exists (the first start's
/// credentials from the environment). Returns whether it was created.
pub async fn ensure_operator(
    store: &NativeStore,
    user: &str,
    password: &str,
) -> Result<bool, AuthError> {
    validate_user(user).map_err(AuthError::Refused)?;
    if password.chars().count() < 12 || password.len() > 1024 {
        return Err(AuthError::Refused(
            "the operator password must be 12 to 1024 characters".into(),
        ));
    }
    let password = password.to_string();
    let phc = tokio::task::spawn_blocking(move || hash_password(&password))
        .await
        .map_err(|e| AuthError::Refused(e.to_string()))??;
    let key = format!("{OPERATOR_PREFIX}{user}");
    Ok(store.set(&key, phc.as_bytes(), SetOptions::NX).await?)
}

/// A hash to verify against when the user does not exist, so that unknown and
/// known names take the same time.
fn decoy_hash() -> &'static str {
    static DECOY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DECOY.get_or_init(|| hash_password("floodgate-decoy-password").expect("argon2 hashes"))
}

/// Whether `password` is operator `user`'s (`known_user`: the name is a valid one,
/// worth looking up). An unknown user is checked against a decoy hash, so both
/// take the same time.
pub(super) async fn check_password(
    store: &NativeStore,
    user: &str,
    known_user: bool,
    password: &str,
) -> Result<(), AuthError> {
    if password.len() > 1024 {
        return Err(AuthError::WrongCredentials);
    }
    let stored = if known_user {
        store.get_text(&format!("{OPERATOR_PREFIX}{user}")).await?
    } else {
        None
    };
    let known = stored.is_some();
    let phc = stored.unwrap_or_else(|| decoy_hash().to_string());
    let password = password.to_string();
    let ok = tokio::task::spawn_blocking(move || {
        PasswordHash::new(&phc)
            .map(|h| {
                Argon2::default()
                    .verify_password(password.as_bytes(), &h)
                    .is_ok()
            })
            .unwrap_or(false)
    })
    .await
    .unwrap_or(false);
    if ok && known {
        Ok(())
    } else {
        Err(AuthError::WrongCredentials)
    }
}
