//! Signing in: the limiter answers first (Floodgate's own token-bucket script, one
//! atomic call), then the password is checked, then a session starts and the
//! client is remembered for the user.

use std::net::IpAddr;

use floodgate_edge::store::{NativeStore, Store};
use floodgate_shared::policy::Quota;
use floodgate_shared::script::Check;

use super::operators::{check_password, validate_user};
use super::session::start_session;
use super::{AuthError, random_hex, set_for, sha256_hex};

/// Sign-in attempts allowed per client address (every attempt counts), and per
/// browser that signed in before (its device cookie).
pub const LOGIN_ADDRESS_QUOTA: &str = "10/1m";
/// Sign-in attempts allowed per user name from clients that never signed in as
/// that user (new addresses without the user's device cookie).
pub const LOGIN_USER_QUOTA: &str = "10/1m";
/// How long an address or a browser stays trusted after a successful sign-in.
pub const TRUST_TTL_SECS: u64 = 30 * 86_400;

/// The sign-in limiter's Redis keys (one hash tag: one atomic call on a cluster).
mod login_keys {
    use super::sha256_hex;

    fn h(parts: &[&str]) -> String {
        sha256_hex(parts.join("\0").as_bytes())[..32].to_string()
    }
    pub fn address(ip: Option<std::net::IpAddr>) -> String {
        let ip = ip.map_or_else(|| "unknown".to_string(), |i| i.to_string());
        format!("fg:{{dash-login}}:ip:{ip}")
    }
    pub fn user(user: &str) -> String {
        format!("fg:{{dash-login}}:user:{}", h(&[user]))
    }
    pub fn trusted(user: &str, ip: Option<std::net::IpAddr>) -> String {
        let ip = ip.map_or_else(|| "unknown".to_string(), |i| i.to_string());
        format!("fg:{{dash-login}}:trusted:{}", h(&[user, &ip]))
    }
    pub fn device(token: &str) -> String {
        format!("fg:{{dash-login}}:device:{}", h(&[token]))
    }
    pub fn device_tries(token: &str) -> String {
        format!("fg:{{dash-login}}:device-tries:{}", h(&[token]))
    }
}

/// A successful sign-in: the session token, and the browser's device token (its
/// cookie makes later sign-ins from anywhere skip the per-user bucket).
#[derive(Debug)]
pub struct SignedIn {
    pub session: String,
    pub device: String,
}

/// How well the sign-in limiter knows a client for a user name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trust {
    /// The browser's device cookie names the user (it signed in from it before).
    Device,
    /// The user signed in from this address before.
    Address,
    None,
}

/// Whether this client signed in as `user` before: from this browser (its device
/// cookie names `user`) or from this address, within [`TRUST_TTL_SECS`].
async fn trust_of(
    store: &NativeStore,
    user: &str,
    client: Option<IpAddr>,
    device: Option<&str>,
) -> Result<Trust, AuthError> {
    let mut keys = vec![login_keys::trusted(user, client)];
    if let Some(d) = device {
        keys.push(login_keys::device(d));
    }
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let found = store.get_many(&keys).await?;
    Ok(
        if found
            .get(1)
            .is_some_and(|u| u.as_deref() == Some(user.as_bytes()))
        {
            Trust::Device
        } else if found[0].is_some() {
            Trust::Address
        } else {
            Trust::None
        },
    )
}

/// Takes one attempt from the buckets of how well the limiter knows the client:
/// a browser that signed in as `user` before has a bucket of its own; an address
/// `user` signed in from, its address's; any other client both its address's and
/// the user name's, which only such clients share — so nobody else's guesses can
/// lock a known client out. Refuses when a bucket is empty.
async fn take_attempt(
    store: &NativeStore,
    trust: Trust,
    user: &str,
    client: Option<IpAddr>,
    device: Option<&str>,
) -> Result<(), AuthError> {
    let address_quota = Quota::parse_short(LOGIN_ADDRESS_QUOTA).expect("a valid quota");
    let user_quota = Quota::parse_short(LOGIN_USER_QUOTA).expect("a valid quota");
    let address_key = login_keys::address(client);
    let user_key = login_keys::user(user);
    let device_key = device.map(login_keys::device_tries).unwrap_or_default();
    let checks = match trust {
        Trust::Device => vec![Check::new(&device_key, &address_quota, 1)],
        Trust::Address => vec![Check::new(&address_key, &address_quota, 1)],
        Trust::None => vec![
            Check::new(&address_key, &address_quota, 1),
            Check::new(&user_key, &user_quota, 1),
        ],
    };
    let verdict = store.check(&checks, None).await?;
    if verdict.admitted {
        return Ok(());
    }
    let wait = verdict.headline().retry_after_secs().unwrap_or(60);
    Err(AuthError::TooManyAttempts {
        wait_secs: wait.max(1) as u64,
    })
}

/// Remembers this address and this browser for `user` (a new device token unless
/// the browser's own named the user already); returns the device token.
async fn remember(
    store: &NativeStore,
    user: &str,
    client: Option<IpAddr>,
    device: Option<&str>,
    trust: Trust,
) -> Result<String, AuthError> {
    let device = device
        .filter(|_| trust == Trust::Device)
        .map_or_else(|| random_hex(32), str::to_string);
    let trusted = login_keys::trusted(user, client);
    set_for(store, &trusted, "1", TRUST_TTL_SECS).await?;
    set_for(store, &login_keys::device(&device), user, TRUST_TTL_SECS).await?;
    Ok(device)
}

/// Signs `user` in from `client` (its address as [`super::client_address`] found
/// it) with the browser's `device` cookie, if any. The limiter answers before the
/// password is checked ([`take_attempt`]). `docs/dashboard.md` has the threat
/// model.
pub async fn sign_in(
    store: &NativeStore,
    user: &str,
    password: &str,
    client: Option<IpAddr>,
    device: Option<&str>,
) -> Result<SignedIn, AuthError> {
    let known_user = validate_user(user).is_ok();
    let trust = if known_user {
        trust_of(store, user, client, device).await?
    } else {
        Trust::None
    };
    take_attempt(store, trust, user, client, device).await?;
    check_password(store, user, known_user, password).await?;
    let session = start_session(store, user).await?;
    let device = remember(store, user, client, device, trust).await?;
    Ok(SignedIn { session, device })
}
