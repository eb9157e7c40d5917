//! The server side (feature `ssr`): Redis access, operators and sessions, the
//! configuration's compare-and-set with its audit record, traffic reading, and the
//! router with its guard (session on every page and server function, same-origin
//! check on every mutation, security headers).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use argon2::Argon2;
use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use axum::extract::{ConnectInfo, FromRef, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use floodgate_edge::admin;
use floodgate_edge::store::{NativeStore, SetOptions, Store, StoreError, Value};
use floodgate_shared::config::EdgeConfig;
use floodgate_shared::policy::Quota;
use floodgate_shared::script::Check;
use floodgate_shared::stats::{
    Counted, Endpoint, KeyField, LAST_USED_KEY, Outcome, SAMPLE_KEY, SampleEntry, StatsField,
    key_minute_key, minute_key, ten_second_key,
};
use ipnet::IpNet;
use leptos::config::LeptosOptions;
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::model::{
    AppError, AuditEntry, PolicyLeasing, Range, Resolution, Series, Traffic, histogram_quantile,
};

pub const OPERATOR_PREFIX: &str = "fg:dash:operator:";
pub const SESSION_PREFIX: &str = "fg:dash:session:";
pub use floodgate_shared::audit::{AUDIT_KEEP, AUDIT_KEY};
pub const SESSION_TTL_SECS: u64 = 12 * 3600;
pub const SESSION_COOKIE: &str = "fg_session";
/// Marks a browser that signed in before (`docs/dashboard.md`, the threat model).
pub const DEVICE_COOKIE: &str = "fg_device";
/// Sign-in attempts allowed per client address (every attempt counts), and per
/// browser that signed in before (its device cookie).
pub const LOGIN_ADDRESS_QUOTA: &str = "10/1m";
/// Sign-in attempts allowed per user name from clients that never signed in as
/// that user (new addresses without the user's device cookie).
pub const LOGIN_USER_QUOTA: &str = "10/1m";
/// How long an address or a browser stays trusted after a successful sign-in.
pub const TRUST_TTL_SECS: u64 = 30 * 86_400;
/// The largest request body accepted (forms carry at most a few KB; 1 MB
/// strings are refused with a field error, larger bodies with 413).
pub const MAX_BODY: usize = 2 * 1024 * 1024;
/// What every request handler shares.
pub struct Core {
    pub store: NativeStore,
    /// Adds `Secure` to the cookies (set behind TLS).
    pub secure_cookies: bool,
    /// Proxies whose `X-Forwarded-For` names the client (none by default: the
    /// client is the connection's peer).
    pub trusted_proxies: Vec<IpNet>,
    /// The fleet's totals served at `/metrics`.
    pub fleet: Arc<crate::fleet::Fleet>,
}

#[derive(Clone)]
pub struct AppState {
    pub options: LeptosOptions,
    pub core: Arc<Core>,
}

impl FromRef<AppState> for LeptosOptions {
    fn from_ref(s: &AppState) -> Self {
        s.options.clone()
    }
}

/// A signed-in operator's session, put in the request's extensions by the guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub user: String,
    pub csrf: String,
    token_hash: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DashError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("Too many sign-in attempts; try again in {wait_secs} s")]
    TooManyAttempts { wait_secs: u64 },
    #[error("Wrong user name or password")]
    WrongCredentials,
    #[error("{0}")]
    Refused(String),
}

impl From<DashError> for AppError {
    fn from(e: DashError) -> Self {
        match e {
            DashError::Store(e) => AppError::Unavailable(e.to_string()),
            DashError::TooManyAttempts { wait_secs } => AppError::TooManyAttempts { wait_secs },
            DashError::WrongCredentials => AppError::WrongCredentials,
            DashError::Refused(m) => AppError::Internal(m),
        }
    }
}

impl From<floodgate_edge::admin::AdminError> for AppError {
    fn from(e: floodgate_edge::admin::AdminError) -> Self {
        use floodgate_edge::admin::AdminError as A;
        match e {
            A::Invalid(e) => AppError::from_policy(e, None),
            A::Store(e) => AppError::Unavailable(e.to_string()),
            A::NotFound(m) => AppError::invalid("id", m),
            e @ (A::Conflict { .. } | A::Unversioned { .. }) => AppError::Conflict(e.to_string()),
        }
    }
}

impl From<floodgate_edge::admin::AdminError> for DashError {
    fn from(e: floodgate_edge::admin::AdminError) -> Self {
        match e {
            floodgate_edge::admin::AdminError::Store(e) => DashError::Store(e),
            other => DashError::Refused(other.to_string()),
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

/// Compares secrets without an early exit.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

async fn get_string(store: &NativeStore, key: &str) -> Result<Option<String>, DashError> {
    Ok(store.get_text(key).await?)
}

/// The replies of `command key extra…` for each of `keys` (one batched round trip).
async fn per_key(
    store: &NativeStore,
    command: &[u8],
    keys: &[String],
    extra: &[&[u8]],
) -> Result<Vec<Value>, DashError> {
    let commands: Vec<Vec<Vec<u8>>> = keys
        .iter()
        .map(|k| {
            let mut c = vec![command.to_vec(), k.as_bytes().to_vec()];
            c.extend(extra.iter().map(|e| e.to_vec()));
            c
        })
        .collect();
    Ok(store.pipeline(&commands).await?)
}

/// The values of `keys` (one batched round trip).
async fn get_strings(
    store: &NativeStore,
    keys: &[String],
) -> Result<Vec<Option<String>>, DashError> {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    Ok(store
        .get_many(&keys)
        .await?
        .into_iter()
        .map(|v| v.map(|b| String::from_utf8_lossy(&b).into_owned()))
        .collect())
}

/// Sets `key` to `value` for `ttl_secs`.
async fn set_ex(
    store: &NativeStore,
    key: &str,
    value: &str,
    ttl_secs: u64,
) -> Result<(), DashError> {
    store
        .set(
            key,
            value.as_bytes(),
            SetOptions::default().expire(std::time::Duration::from_secs(ttl_secs)),
        )
        .await?;
    Ok(())
}

// ----- operators -------------------------------------------------------------

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

fn hash_password(password: &str) -> Result<String, DashError> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| DashError::Refused(format!("cannot hash the password: {e}")))
}

/// Creates the operator unless one of that name exists (the first start's
/// credentials from the environment). Returns whether it was created.
pub async fn ensure_operator(
    store: &NativeStore,
    user: &str,
    password: &str,
) -> Result<bool, DashError> {
    validate_user(user).map_err(DashError::Refused)?;
    if password.chars().count() < 12 || password.len() > 1024 {
        return Err(DashError::Refused(
            "the operator password must be 12 to 1024 characters".into(),
        ));
    }
    let password = password.to_string();
    let phc = tokio::task::spawn_blocking(move || hash_password(&password))
        .await
        .map_err(|e| DashError::Refused(e.to_string()))??;
    let key = format!("{OPERATOR_PREFIX}{user}");
    Ok(store.set(&key, phc.as_bytes(), SetOptions::NX).await?)
}

/// A hash to verify against when the user does not exist, so that unknown and
/// known names take the same time.
fn decoy_hash() -> &'static str {
    static DECOY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DECOY.get_or_init(|| hash_password("floodgate-decoy-password").expect("argon2 hashes"))
}

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
async fn trust(
    store: &NativeStore,
    user: &str,
    client: Option<IpAddr>,
    device: Option<&str>,
) -> Result<Trust, DashError> {
    let mut keys = vec![login_keys::trusted(user, client)];
    if let Some(d) = device {
        keys.push(login_keys::device(d));
    }
    let found = get_strings(store, &keys).await?;
    Ok(
        if found.get(1).is_some_and(|u| u.as_deref() == Some(user)) {
            Trust::Device
        } else if found[0].is_some() {
            Trust::Address
        } else {
            Trust::None
        },
    )
}

/// Signs `user` in from `client` (its address as [`client_address`] found it) with
/// the browser's `device` cookie, if any. The limiter answers before the password
/// is checked, in one atomic call (Floodgate's own token-bucket script), with the
/// buckets of how well it knows the client: a browser that signed in as `user`
/// before has a bucket of its own; an address `user` signed in from, its address's;
/// any other client both its address's and the user name's, which only such
/// clients share — so nobody else's guesses can lock a known client out.
/// `docs/dashboard.md` has the threat model.
pub async fn sign_in(
    core: &Core,
    user: &str,
    password: &str,
    client: Option<IpAddr>,
    device: Option<&str>,
) -> Result<SignedIn, DashError> {
    let address_quota = Quota::parse_short(LOGIN_ADDRESS_QUOTA).expect("a valid quota");
    let user_quota = Quota::parse_short(LOGIN_USER_QUOTA).expect("a valid quota");
    let known_user = validate_user(user).is_ok();
    let trust = if known_user {
        trust(&core.store, user, client, device).await?
    } else {
        Trust::None
    };
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
    let verdict = core.store.check(&checks, None).await?;
    if !verdict.admitted {
        let wait = verdict.headline().retry_after_secs().unwrap_or(60);
        return Err(DashError::TooManyAttempts {
            wait_secs: wait.max(1) as u64,
        });
    }
    if password.len() > 1024 {
        return Err(DashError::WrongCredentials);
    }
    let stored = if known_user {
        get_string(&core.store, &format!("{OPERATOR_PREFIX}{user}")).await?
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
    if !(ok && known) {
        return Err(DashError::WrongCredentials);
    }
    let token = random_hex(32);
    let session = serde_json::json!({"user": user, "csrf": random_hex(32)}).to_string();
    set_ex(
        &core.store,
        &format!("{SESSION_PREFIX}{}", sha256_hex(token.as_bytes())),
        &session,
        SESSION_TTL_SECS,
    )
    .await?;
    // remember this address and this browser for the user
    let device = device
        .filter(|_| trust == Trust::Device)
        .map_or_else(|| random_hex(32), str::to_string);
    set_ex(
        &core.store,
        &login_keys::trusted(user, client),
        "1",
        TRUST_TTL_SECS,
    )
    .await?;
    set_ex(
        &core.store,
        &login_keys::device(&device),
        user,
        TRUST_TTL_SECS,
    )
    .await?;
    Ok(SignedIn {
        session: token,
        device,
    })
}

/// The `Set-Cookie` value carrying a session token (or clearing it when `None`).
pub fn session_cookie(token: Option<&str>, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    match token {
        Some(t) => format!(
            "{SESSION_COOKIE}={t}; Path=/; HttpOnly; SameSite=Strict; Max-Age={SESSION_TTL_SECS}{secure}"
        ),
        None => format!("{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}"),
    }
}

/// The `Set-Cookie` value of the device cookie (sent to the sign-in call only).
pub fn device_cookie(token: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{DEVICE_COOKIE}={token}; Path=/api/login; HttpOnly; SameSite=Strict; Max-Age={TRUST_TTL_SECS}{secure}"
    )
}

/// The value of cookie `name`, if it is 64 hex digits (both cookies are).
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn cookie_token(headers: &HeaderMap) -> Option<&str> {
    cookie(headers, SESSION_COOKIE)
}

/// The browser's device cookie, if it sent one.
pub fn device_token(headers: &HeaderMap) -> Option<&str> {
    cookie(headers, DEVICE_COOKIE)
}

/// The client's address: the connection's peer, or, when the peer is a trusted
/// proxy, the nearest address in `X-Forwarded-For` that is not one (each proxy
/// appends the address it saw, so only the right end can be believed).
pub fn client_address(
    peer: Option<IpAddr>,
    headers: &HeaderMap,
    trusted: &[IpNet],
) -> Option<IpAddr> {
    let peer = peer?;
    let is_proxy = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_proxy(&peer) {
        return Some(peer);
    }
    let hops: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    let mut nearest = peer;
    for hop in hops.iter().rev() {
        match hop.parse::<IpAddr>() {
            Ok(ip) if is_proxy(&ip) => nearest = ip,
            Ok(ip) => return Some(ip),
            // not an address: whatever sent it is beyond the trusted proxies
            Err(_) => return Some(nearest),
        }
    }
    Some(nearest)
}

/// The session the request's cookie names, if it is live.
pub async fn lookup_session(
    core: &Core,
    headers: &HeaderMap,
) -> Result<Option<Session>, DashError> {
    let Some(token) = cookie_token(headers) else {
        return Ok(None);
    };
    let token_hash = sha256_hex(token.as_bytes());
    let Some(raw) = get_string(&core.store, &format!("{SESSION_PREFIX}{token_hash}")).await? else {
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

pub async fn sign_out(core: &Core, session: &Session) -> Result<(), DashError> {
    core.store
        .del(&[&format!("{SESSION_PREFIX}{}", session.token_hash)])
        .await?;
    Ok(())
}

// ----- configuration and audit ---------------------------------------------------

/// The stored configuration text and its version (SHA-1 hex; "" when absent).
pub async fn load_config(store: &NativeStore) -> Result<(String, Option<String>), DashError> {
    Ok(admin::load_config(store).await?)
}

/// Cuts an item's text for the audit log.
pub use floodgate_edge::admin::audit_item;

/// What a version-checked save did.
pub use floodgate_shared::audit::SaveOutcome;

/// Saves `config` if the stored one is still `based_on`, with its audit record, in
/// one atomic script (the save `floodgate-cli config set` makes too).
pub async fn save_config(
    store: &NativeStore,
    based_on: &str,
    config: &EdgeConfig,
    entry: &AuditEntry,
) -> Result<SaveOutcome, DashError> {
    Ok(admin::save_config(store, based_on, config, entry).await?)
}

/// Appends an audit record (key operations; configuration changes record theirs
/// inside the compare-and-set).
pub async fn audit(store: &NativeStore, entry: &AuditEntry) -> Result<(), DashError> {
    Ok(admin::audit(store, entry).await?)
}

pub async fn audit_log(store: &NativeStore, count: usize) -> Result<Vec<AuditEntry>, DashError> {
    Ok(admin::audit_log(store, count).await?)
}

/// The edge's sample of recent decisions, oldest first (entries that do not
/// parse are skipped).
pub async fn sample(store: &NativeStore) -> Result<Vec<SampleEntry>, DashError> {
    let items = store.lrange(SAMPLE_KEY, 0, -1).await?;
    let mut entries: Vec<SampleEntry> = items
        .iter()
        .filter_map(|b| std::str::from_utf8(b).ok()?.parse().ok())
        .collect();
    entries.reverse(); // the list is newest first
    entries.sort_by_key(|e| e.at_ms); // edges flush independently
    Ok(entries)
}

// ----- traffic -----------------------------------------------------------------

/// A hash's fields and their counts (non-numbers skipped).
fn fields(pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(String, u64)> {
    pairs
        .into_iter()
        .filter_map(|(k, v)| {
            let n = String::from_utf8_lossy(&v).parse::<u64>().ok()?;
            Some((String::from_utf8_lossy(&k).into_owned(), n))
        })
        .collect()
}

/// The fields of the hashes `keys`, in that order (one batched round trip).
pub async fn hashes(
    store: &NativeStore,
    keys: &[String],
) -> Result<Vec<Vec<(String, u64)>>, DashError> {
    Ok(store
        .hgetall_many(keys)
        .await?
        .into_iter()
        .map(fields)
        .collect())
}

/// Field `field` of each hash `keys`, summed (0 when absent; one batched round trip).
async fn hash_field(store: &NativeStore, keys: &[String], field: &str) -> Result<u64, DashError> {
    let mut total = 0;
    for r in per_key(store, b"HGET", keys, &[field.as_bytes()]).await? {
        total += r
            .into_bytes()?
            .and_then(|v| String::from_utf8_lossy(&v).parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(total)
}

/// Each API key's latest decision (Unix seconds).
pub async fn last_used(store: &NativeStore) -> Result<BTreeMap<String, i64>, DashError> {
    let hashes = store.hgetall_many(&[LAST_USED_KEY.to_string()]).await?;
    Ok(fields(hashes.into_iter().next().unwrap_or_default())
        .into_iter()
        .map(|(id, secs)| (id, secs as i64))
        .collect())
}

/// Route name → path pattern, as the pages name endpoints.
pub fn patterns(spec: &floodgate_shared::config::ConfigSpec) -> BTreeMap<String, String> {
    spec.routes
        .iter()
        .map(|r| (r.name.clone(), r.pattern.clone()))
        .collect()
}

/// The bars of `range` at `resolution` ending with the one holding `now` (Unix
/// seconds): the first bar's start and how many.
pub fn bars(now: i64, range: Range, resolution: Resolution) -> (i64, usize) {
    let step = resolution.secs();
    let n = (range.secs() / step) as usize;
    (now.div_euclid(step) * step - (n as i64 - 1) * step, n)
}

/// The bounded and `auto` policies of `config`, with their bounds and what the
/// global store leases of each (the edge's own `LeaseSettings::for_policy`, so the
/// dashboard cannot drift from it), their counts still zero.
pub fn leasing_policies(config: &EdgeConfig) -> Vec<PolicyLeasing> {
    use floodgate_edge::pipeline::leases::LeaseSettings;
    use floodgate_shared::policy::Consistency;
    let mut rows: Vec<PolicyLeasing> = config
        .spec()
        .policies
        .iter()
        .filter_map(|spec| {
            let p = config.policy(&spec.name)?;
            let bound = p
                .max_overshoot()
                .filter(|_| p.consistency() != Consistency::Exact)?;
            Some(PolicyLeasing {
                policy: spec.name.clone(),
                consistency: p.consistency(),
                bound,
                leasable: LeaseSettings::default()
                    .for_policy(p, config.regions())
                    .max_overshoot,
                local: 0,
                exact: 0,
                refills: 0,
                outstanding: 0,
            })
        })
        .collect();
    rows.sort_by(|a, b| a.policy.cmp(&b.policy));
    rows
}

/// Adds the edges' per-policy consistency counters of `hashes` (per-minute hashes'
/// fields, read through [`StatsField`]) to `rows` (pure).
pub fn count_leasing(rows: &mut [PolicyLeasing], hashes: &[Vec<(String, u64)>]) {
    use floodgate_shared::stats::Leasing;
    for (field, n) in hashes.iter().flatten() {
        let Ok(StatsField::Leasing(policy, what)) = field.parse::<StatsField>() else {
            continue;
        };
        let Some(row) = rows.iter_mut().find(|r| r.policy == policy) else {
            continue; // a policy no longer bounded, or gone
        };
        let counter = match what {
            Leasing::Local => &mut row.local,
            Leasing::Exact => &mut row.exact,
            Leasing::Refills => &mut row.refills,
            Leasing::Outstanding => &mut row.outstanding,
        };
        *counter = counter.saturating_add(*n);
    }
}

/// The figures of the bounded and `auto` policies of `config` over `range` ending
/// with the minute of `now`: the range's per-minute hashes (none read when no
/// policy is bounded).
pub async fn leasing(
    store: &NativeStore,
    now: i64,
    range: Range,
    config: &EdgeConfig,
) -> Result<Vec<PolicyLeasing>, DashError> {
    let mut rows = leasing_policies(config);
    if !rows.is_empty() {
        let (start, n) = bars(now, range, Resolution::Minute1);
        let minutes: Vec<String> = (0..n as i64)
            .map(|i| minute_key(start.div_euclid(60) + i))
            .collect();
        count_leasing(&mut rows, &hashes(store, &minutes).await?);
    }
    Ok(rows)
}

/// Reads what the traffic page draws: the per-10-second hashes at 10 s, else the
/// per-minute hashes summed into bars, and the most throttled keys of the last
/// hour at most (their per-minute hashes).
pub async fn traffic(
    store: &NativeStore,
    now: i64,
    range: Range,
    resolution: Resolution,
    patterns: BTreeMap<String, String>,
) -> Result<Traffic, DashError> {
    let (start, n) = bars(now, range, resolution);
    let end = start + n as i64 * resolution.secs();
    let (keys, starts): (Vec<String>, Vec<i64>) = if resolution == Resolution::Seconds10 {
        (start / 10..end / 10)
            .map(|s| (ten_second_key(s), s * 10))
            .unzip()
    } else {
        (start / 60..end / 60)
            .map(|m| (minute_key(m), m * 60))
            .unzip()
    };
    let read = hashes(store, &keys).await?;
    let timed: Vec<(i64, Vec<(String, u64)>)> = starts.into_iter().zip(read).collect();
    let top_minutes = (range.secs() / 60).min(60) as u32;
    let minute = now.div_euclid(60);
    let key_hashes: Vec<String> = (0..top_minutes as i64)
        .map(|i| key_minute_key(minute - i))
        .collect();
    let keys_read = hashes(store, &key_hashes).await?;
    let mut t = summarize(start, resolution, n, &timed);
    t.range = range;
    t.patterns = patterns;
    t.top_minutes = top_minutes;
    t.top_throttled = top_throttled(&keys_read);
    Ok(t)
}

/// Turns hashes `(their start, fields)` into the bars the charts draw (pure).
pub fn summarize(
    start: i64,
    resolution: Resolution,
    n: usize,
    hashes: &[(i64, Vec<(String, u64)>)],
) -> Traffic {
    let step = resolution.secs();
    let mut endpoints: BTreeMap<Endpoint, Series> = BTreeMap::new();
    let mut hist: Vec<Vec<(u64, u64)>> = vec![vec![]; n];
    let mut by_mode: BTreeMap<_, u64> = BTreeMap::new();
    let mut by_endpoint_mode: BTreeMap<(Endpoint, _), u64> = BTreeMap::new();
    let (mut opened, mut open_ms) = (0, 0);
    let mut denied: BTreeMap<floodgate_shared::deny::DenyList, u64> = BTreeMap::new();
    for (at, fields) in hashes {
        let Ok(i) = usize::try_from((at - start).div_euclid(step)) else {
            continue;
        };
        if i >= n {
            continue;
        }
        for (field, count) in fields {
            let Ok(field) = field.parse::<StatsField>() else {
                continue; // another version's field: not ours to guess
            };
            match field {
                StatsField::Endpoint(e, counted) => {
                    let s = endpoints.entry(e).or_insert_with(|| Series::zeros(n));
                    let v = match counted {
                        Counted::Outcome(Outcome::Allowed) => &mut s.allowed,
                        Counted::Outcome(Outcome::Throttled) => &mut s.throttled,
                        Counted::Outcome(Outcome::Degraded) => &mut s.degraded,
                        Counted::ShadowThrottled => &mut s.shadow,
                    };
                    v[i] += count;
                }
                StatsField::EndpointMode(e, m) => {
                    *by_endpoint_mode.entry((e, m)).or_default() += count
                }
                StatsField::Mode(m) => *by_mode.entry(m).or_default() += count,
                StatsField::Latency(b) => hist[i].push((b, *count)),
                StatsField::BreakerOpened => opened += count,
                StatsField::BreakerOpenMs => open_ms += count,
                StatsField::Denied(list) => *denied.entry(list).or_default() += count,
                // per-policy consistency figures: per minute, by `leasing`; decisions
                // per policy: the fleet's /metrics
                StatsField::SampleDropped
                | StatsField::LatencySumUs
                | StatsField::Leasing(..)
                | StatsField::PolicyDecision(..) => {}
            }
        }
    }
    Traffic {
        range: Range::Minutes15,
        resolution,
        start,
        bars: n,
        endpoints: endpoints.into_iter().collect(),
        patterns: BTreeMap::new(),
        top_throttled: vec![],
        top_minutes: 0,
        p50_us: hist.iter().map(|h| histogram_quantile(h, 0.5)).collect(),
        p99_us: hist.iter().map(|h| histogram_quantile(h, 0.99)).collect(),
        degraded_by_mode: by_mode.into_iter().collect(),
        degraded_by_endpoint_mode: by_endpoint_mode
            .into_iter()
            .map(|((e, m), n)| (e, m, n))
            .collect(),
        breaker_opened: opened,
        breaker_open_ms: open_ms,
        denied: denied.into_iter().collect(),
    }
}

/// Per key: (allowed, throttled, degraded) summed over per-key hashes.
pub fn key_usage(hashes: &[Vec<(String, u64)>]) -> BTreeMap<String, (u64, u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for (field, n) in hashes.iter().flatten() {
        let Ok(KeyField { key_id, counted }) = field.parse::<KeyField>() else {
            continue;
        };
        let e = out.entry(key_id).or_default();
        match counted {
            Counted::Outcome(Outcome::Allowed) => e.0 += n,
            Counted::Outcome(Outcome::Throttled) => e.1 += n,
            Counted::Outcome(Outcome::Degraded) => e.2 += n,
            Counted::ShadowThrottled => {}
        }
    }
    out
}

/// The ten keys with the most 429s in the per-key hashes, most first.
fn top_throttled(hashes: &[Vec<(String, u64)>]) -> Vec<(String, u64)> {
    let mut top: Vec<(String, u64)> = key_usage(hashes)
        .into_iter()
        .filter(|(_, u)| u.1 > 0)
        .map(|(id, u)| (id, u.1))
        .collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    top.truncate(10);
    top
}

/// Per key: (allowed, throttled, degraded) over the last `minutes` minutes.
pub async fn usage(
    store: &NativeStore,
    now: i64,
    minutes: i64,
) -> Result<BTreeMap<String, (u64, u64, u64)>, DashError> {
    let minute = now.div_euclid(60);
    let keys: Vec<String> = (0..minutes).map(|i| key_minute_key(minute - i)).collect();
    Ok(key_usage(&hashes(store, &keys).await?))
}

/// Decisions the edges could not add to the sample between `from_ms` and `to_ms`.
pub async fn sample_dropped(
    store: &NativeStore,
    from_ms: i64,
    to_ms: i64,
) -> Result<u64, DashError> {
    let keys: Vec<String> = (from_ms.div_euclid(60_000)..=to_ms.div_euclid(60_000))
        .map(minute_key)
        .collect();
    hash_field(store, &keys, &StatsField::SampleDropped.to_string()).await
}

// ----- the guard -----------------------------------------------------------------

/// Paths served without a session.
fn is_public(path: &str) -> bool {
    matches!(path, "/login" | "/api/login" | "/favicon.ico" | "/healthz")
        || path.starts_with("/pkg/")
}

/// The path with `.` and `..` segments resolved and repeated slashes merged (also
/// when written `%2e` or `%2f`), or `None` when it is already plain. The guard
/// redirects to it, so `/pkg/../keys` is `/keys`, not a public `/pkg/` path.
pub fn normalized_path(path: &str) -> Option<String> {
    let lower = path.to_ascii_lowercase();
    let suspicious = path.contains("//")
        || path.contains('\\')
        || lower.contains("%2e")
        || lower.contains("%2f")
        || lower.contains("%5c")
        || path.split('/').any(|s| s == "." || s == "..");
    if !suspicious {
        return None;
    }
    let decoded = path
        .replace("%2e", ".")
        .replace("%2E", ".")
        .replace("%2f", "/")
        .replace("%2F", "/")
        .replace("%5c", "/")
        .replace("%5C", "/")
        .replace('\\', "/");
    let mut out: Vec<&str> = vec![];
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    let mut clean = format!("/{}", out.join("/"));
    if decoded.ends_with('/') && clean.len() > 1 {
        clean.push('/');
    }
    (clean != path).then_some(clean)
}

/// Whether a state-changing request comes from this dashboard's own pages: its
/// `Origin` (or, without one, `Sec-Fetch-Site`) must match the `Host` it was sent to.
pub fn same_origin(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    match (
        headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()),
        host,
    ) {
        (Some(origin), Some(host)) => {
            let rest = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"));
            rest == Some(host)
        }
        (Some(_), None) => false,
        (None, _) => headers
            .get("sec-fetch-site")
            .is_some_and(|v| v.as_bytes() == b"same-origin"),
    }
}

/// An error answer in the server functions' own encoding (the JSON of
/// [`AppError`], marked like theirs), so the pages' code can read it.
pub fn error_response(e: &AppError) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (
                header::HeaderName::from_static("serverfnerror"),
                "floodgate",
            ),
        ],
        serde_json::to_string(e).unwrap_or_default(),
    )
        .into_response()
}

/// A server function's error answer gets the status its [`AppError`] names (they
/// all leave the server-function layer as 500).
async fn with_error_status(res: Response) -> Response {
    if res.status() != StatusCode::INTERNAL_SERVER_ERROR
        || !res.headers().contains_key("serverfnerror")
    {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .unwrap_or_default();
    if let Ok(e) = serde_json::from_slice::<AppError>(&bytes) {
        parts.status = StatusCode::from_u16(e.status()).unwrap_or(parts.status);
    }
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

/// A plain HTML form post (no JavaScript): it expects a page, not JSON.
fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/html"))
}

fn see_other(to: &str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to.to_string())]).into_response()
}

/// The page shown instead of any other while the store cannot be reached.
fn outage_page(e: &StoreError) -> Response {
    let message = AppError::Unavailable(e.to_string()).to_string();
    let html = format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" \
         content=\"width=device-width, initial-scale=1\"><meta name=\"color-scheme\" content=\"light dark\">\
         <title>Floodgate — store unavailable</title><style>{}</style></head><body><main>\
         <h1>Floodgate</h1><div class=\"banner\" role=\"alert\" id=\"outage\"><strong>Store \
         unavailable.</strong> {}</div><p><a href=\"\">Reload this page</a> to try again.</p></main>\
         </body></html>",
        crate::app::STYLE,
        html_escape(&message)
    );
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::RETRY_AFTER, "5"),
        ],
        html,
    )
        .into_response()
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Refuses cross-origin mutations, requires a session everywhere but the sign-in
/// page, sends a session that ended (or never was) to sign-in, shows an outage as
/// a page or a typed error, and adds security headers.
pub async fn guard(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let mut res = match normalized_path(&path) {
        Some(clean) => {
            let query = req
                .uri()
                .query()
                .map(|q| format!("?{q}"))
                .unwrap_or_default();
            (
                StatusCode::PERMANENT_REDIRECT,
                [(header::LOCATION, format!("{clean}{query}"))],
            )
                .into_response()
        }
        None => match refusal(&state, &path, &mut req).await {
            Some(r) => r,
            // with its session in the request's extensions, or a public path
            None => with_error_status(next.run(req).await).await,
        },
    };
    let h = res.headers_mut();
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    h.insert(
        "content-security-policy",
        HeaderValue::from_static("frame-ancestors 'none'; object-src 'none'; base-uri 'self'"),
    );
    if !path.starts_with("/pkg/") && path != "/favicon.ico" {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    res
}

/// The guard's own answer, or `None` to let the request through (with its
/// session, when it has one).
async fn refusal(state: &AppState, path: &str, req: &mut Request) -> Option<Response> {
    let mutation = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let api = path.starts_with("/api/");
    let too_large = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > MAX_BODY as u64);
    if too_large {
        let mut r = error_response(&AppError::BadRequest(format!(
            "a request body may hold at most {MAX_BODY} bytes"
        )));
        *r.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
        return Some(r);
    }
    if mutation && !same_origin(req.headers()) {
        return Some(error_response(&AppError::Forbidden(
            "cross-origin request refused".into(),
        )));
    }
    let had_cookie = cookie_token(req.headers()).is_some();
    match lookup_session(&state.core, req.headers()).await {
        Ok(Some(session)) => {
            req.extensions_mut().insert(session);
            None
        }
        Ok(None) if is_public(path) => None,
        Ok(None) if (api || mutation) && !wants_html(req.headers()) => {
            Some(error_response(&AppError::SignedOut))
        }
        Ok(None) => {
            let mut r = see_other(if had_cookie || api {
                "/login?session=ended"
            } else {
                "/login"
            });
            if had_cookie {
                let clear = session_cookie(None, state.core.secure_cookies);
                if let Ok(v) = HeaderValue::from_str(&clear) {
                    r.headers_mut().insert(header::SET_COOKIE, v);
                }
            }
            Some(r)
        }
        Err(DashError::Store(e)) if !api => Some(outage_page(&e)),
        Err(e) => Some(error_response(&AppError::from(e))),
    }
}

/// The favicon: a small gate, also named by every page's `<link rel="icon">`.
pub const FAVICON: &[u8] = include_bytes!("../assets/favicon.ico");

async fn favicon() -> Response {
    (
        [
            (header::CONTENT_TYPE, "image/x-icon"),
            (header::CACHE_CONTROL, "public, max-age=86400"),
        ],
        FAVICON,
    )
        .into_response()
}

/// The state of a dashboard serving the hydration bundle from `site_root` (its
/// `pkg/` holds `floodgate_dashboard.js` and `floodgate_dashboard_bg.wasm`).
pub fn app_state(store: NativeStore, site_root: &str, secure_cookies: bool) -> AppState {
    let options = LeptosOptions::builder()
        .output_name("floodgate_dashboard")
        .site_root(site_root)
        .site_pkg_dir("pkg")
        .build();
    AppState {
        options,
        core: Arc::new(Core {
            store,
            secure_cookies,
            trusted_proxies: vec![],
            fleet: Arc::default(),
        }),
    }
}

impl AppState {
    /// Believes `X-Forwarded-For` from these proxies (`--trusted-proxy`).
    pub fn trusting(self, proxies: Vec<IpNet>) -> Self {
        let core = Arc::try_unwrap(self.core)
            .unwrap_or_else(|_| panic!("set the trusted proxies before the state is shared"));
        AppState {
            options: self.options,
            core: Arc::new(Core {
                trusted_proxies: proxies,
                ..core
            }),
        }
    }
}

/// The client address of the request being served (inside a server function).
pub fn request_client(core: &Core, parts: &axum::http::request::Parts) -> Option<IpAddr> {
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    client_address(peer, &parts.headers, &core.trusted_proxies)
}

/// Every registered server function's path and method (for tests that must
/// cover all of them).
pub fn server_fn_paths() -> Vec<(String, String)> {
    leptos::server_fn::axum::server_fn_paths()
        .map(|(p, m)| (p.to_string(), m.to_string()))
        .collect()
}

/// The dashboard's router: pages, server functions, the hydration bundle.
pub fn router(state: AppState) -> axum::Router {
    use leptos_axum::{LeptosRoutes, generate_route_list};
    let routes = generate_route_list(crate::app::App);
    let options = state.options.clone();
    let core = state.core.clone();
    axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route("/favicon.ico", axum::routing::get(favicon))
        .leptos_routes_with_context(
            &state,
            routes,
            move || leptos::prelude::provide_context(core.clone()),
            move || crate::app::shell(options.clone()),
        )
        .fallback(leptos_axum::file_and_error_handler::<AppState, _>(
            crate::app::shell,
        ))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        // after the guard: a scraper has no session, and a scrape during an outage
        // must answer (the guard reads sessions from Redis)
        .route("/metrics", axum::routing::get(metrics))
        .with_state(state)
}

/// The fleet's totals (`crate::fleet`), without a session.
async fn metrics(State(state): State<AppState>) -> Response {
    let now = chrono::Utc::now().timestamp();
    let text = state.core.fleet.scrape(&state.core.store, now).await;
    (
        [
            (header::CONTENT_TYPE, floodgate_edge::metrics::CONTENT_TYPE),
            (header::CACHE_CONTROL, "no-store"),
        ],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn only_same_origin_mutations_pass() {
        assert!(same_origin(&headers(&[
            ("host", "127.0.0.1:3000"),
            ("origin", "http://127.0.0.1:3000")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "127.0.0.1:3000"),
            ("origin", "http://evil.example")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "127.0.0.1:3000"),
            ("origin", "null")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "127.0.0.1:3000"),
            ("origin", "http://127.0.0.1:3000.evil")
        ])));
        assert!(!same_origin(&headers(&[("host", "127.0.0.1:3000")])));
        assert!(same_origin(&headers(&[
            ("host", "x"),
            ("sec-fetch-site", "same-origin")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "x"),
            ("sec-fetch-site", "cross-site")
        ])));
    }

    #[test]
    fn the_session_cookie_is_read_strictly() {
        let t = "ab".repeat(32);
        assert_eq!(
            cookie_token(&headers(&[("cookie", &format!("a=b; fg_session={t}"))])),
            Some(t.as_str())
        );
        assert_eq!(
            cookie_token(&headers(&[("cookie", "fg_session=short")])),
            None
        );
        assert_eq!(
            cookie_token(&headers(&[(
                "cookie",
                &format!("fg_session={}", "zz".repeat(32))
            )])),
            None
        );
        let c = session_cookie(Some(&t), true);
        for part in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/"] {
            assert!(c.contains(part), "{c}");
        }
        assert!(!session_cookie(Some(&t), false).contains("Secure"));
        let d = device_cookie(&t, false);
        for part in ["HttpOnly", "SameSite=Strict", "Path=/api/login"] {
            assert!(d.contains(part), "{d}");
        }
        assert_eq!(
            device_token(&headers(&[("cookie", &format!("fg_device={t}"))])),
            Some(t.as_str())
        );
    }

    #[test]
    fn traffic_is_summarized_per_endpoint_into_bars() {
        let hashes = vec![
            (
                600,
                vec![
                    ("route:search|allowed".to_string(), 5),
                    ("route:search|throttled".to_string(), 2),
                    ("route:search|degraded:fail_open".to_string(), 9),
                    ("route:search|shadow_throttled".to_string(), 4),
                    ("route:mode|allowed".to_string(), 3),
                    ("route:_|allowed".to_string(), 6),
                    ("lat:250".to_string(), 7),
                    ("mode:fail_open".to_string(), 9),
                    ("breaker:opened".to_string(), 1),
                    ("breaker:open_ms".to_string(), 1500),
                    ("denied:ip".to_string(), 4),
                    ("search|allowed".to_string(), 1000),
                ],
            ),
            (
                660,
                vec![
                    ("unmatched|allowed".to_string(), 1),
                    ("route:search|allowed".to_string(), 2),
                ],
            ),
            (720, vec![("route:search|allowed".to_string(), 100)]),
        ];
        // two 1-minute bars from 600: the third hash is outside
        let t = summarize(600, Resolution::Minute1, 2, &hashes);
        let series = |e: &Endpoint| &t.endpoints.iter().find(|(x, _)| x == e).unwrap().1;
        let search = series(&Endpoint::Route("search".into()));
        assert_eq!(
            search.allowed,
            [5, 2],
            "the old-format field is not counted"
        );
        assert_eq!(search.throttled, [2, 0]);
        assert_eq!(search.shadow, [4, 0]);
        assert_eq!(search.degraded, [0, 0], "per-mode fields are not totals");
        assert_eq!(series(&Endpoint::Route("mode".into())).allowed, [3, 0]);
        assert_eq!(series(&Endpoint::Route("_".into())).allowed, [6, 0]);
        assert_eq!(series(&Endpoint::Unmatched).allowed, [0, 1]);
        assert_eq!(t.endpoints.last().unwrap().0, Endpoint::Unmatched);
        assert_eq!(t.p50_us, [Some(250), None]);
        assert_eq!(
            t.degraded_by_mode,
            [(floodgate_shared::policy::FailureMode::FailOpen, 9)]
        );
        assert_eq!(t.degraded_by_endpoint_mode[0].2, 9);
        assert_eq!((t.breaker_opened, t.breaker_open_ms), (1, 1500));
        assert_eq!(t.denied, [(floodgate_shared::deny::DenyList::Ip, 4)]);
        // six 10-second hashes summed into one 1-minute bar
        let tens: Vec<(i64, Vec<(String, u64)>)> = (0..6)
            .map(|i| (600 + 10 * i, vec![("unmatched|throttled".to_string(), 1)]))
            .collect();
        let t = summarize(600, Resolution::Minute1, 1, &tens);
        assert_eq!(t.endpoints[0].1.throttled, [6]);
    }

    #[test]
    fn bounded_policies_are_counted_through_the_stats_contract_with_the_edges_bound() {
        let config = |regions: u32| {
            EdgeConfig::from_json(&format!(
                r#"{{"regions":{regions},"policies":[
                {{"name":"search","dimensions":["api_key"],"quota":{{"capacity":100,"period":"1m"}},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":50}},
                {{"name":"burst","dimensions":["api_key"],"quota":{{"capacity":100,"period":"1m"}},"failure_mode":"fail_closed","consistency":"auto","max_overshoot":10}},
                {{"name":"default","dimensions":["api_key"],"quota":{{"capacity":100,"period":"1m"}},"failure_mode":"fail_closed"}}],
                "plans":{{"free":["default"]}}}}"#
            ))
            .unwrap()
        };
        // without regions the whole bound is leased; with 2, each region holds
        // max_overshoot / 4 on credit (the edge's LeaseSettings::for_policy)
        let rows = leasing_policies(&config(0));
        let shown: Vec<(&str, u64, u64)> = rows
            .iter()
            .map(|r| (r.policy.as_str(), r.bound, r.leasable))
            .collect();
        assert_eq!(shown, [("burst", 10, 10), ("search", 50, 50)]);
        let mut rows = leasing_policies(&config(2));
        let shown: Vec<(&str, u64)> = rows
            .iter()
            .map(|r| (r.policy.as_str(), r.leasable))
            .collect();
        assert_eq!(shown, [("burst", 6), ("search", 26)]);
        let hashes = vec![
            vec![
                ("policy:search|local".to_string(), 90),
                ("policy:search|exact".to_string(), 10),
                ("policy:search|refills".to_string(), 4),
                ("policy:search|outstanding".to_string(), 40),
                ("policy:default|local".to_string(), 1000),
                ("route:search|allowed".to_string(), 100),
                ("policy:search|leased".to_string(), 7),
                ("search|local".to_string(), 7),
            ],
            vec![("policy:search|local".to_string(), 10)],
        ];
        count_leasing(&mut rows, &hashes);
        let s = &rows[1];
        assert_eq!(
            (s.local, s.exact, s.refills, s.outstanding),
            (100, 10, 4, 40)
        );
        assert_eq!((rows[0].local, rows[0].refills), (0, 0), "{rows:?}");
        assert!(leasing_policies(&EdgeConfig::from_json(crate_demo()).unwrap()).is_empty());
    }

    fn crate_demo() -> &'static str {
        r#"{"policies":[{"name":"default","dimensions":["api_key"],"quota":{"capacity":10,"period":"1m"},"failure_mode":"fail_closed"}],"plans":{"free":["default"]}}"#
    }

    #[test]
    fn keys_usage_and_the_most_throttled_come_from_the_key_hashes() {
        let hashes = vec![
            vec![
                ("K1|throttled".to_string(), 2),
                ("K2|throttled".to_string(), 3),
                ("K2|allowed".to_string(), 4),
            ],
            vec![
                ("K2|degraded".to_string(), 1),
                ("bad id|allowed".to_string(), 9),
            ],
        ];
        assert_eq!(key_usage(&hashes)["K2"], (4, 3, 1));
        assert_eq!(
            top_throttled(&hashes),
            [("K2".to_string(), 3), ("K1".to_string(), 2)]
        );
    }

    #[test]
    fn the_bars_end_with_the_current_one() {
        assert_eq!(
            bars(1_000, Range::Minutes15, Resolution::Seconds10),
            (1_000 - 890, 90)
        );
        assert_eq!(
            bars(1_019, Range::Hour1, Resolution::Minute1),
            (960 - 59 * 60, 60)
        );
        assert_eq!(
            bars(86_400 * 3 + 5, Range::Hours24, Resolution::Minutes10).1,
            144
        );
    }

    #[test]
    fn dot_segments_and_doubled_slashes_are_resolved() {
        for (raw, clean) in [
            ("/pkg/../keys", Some("/keys")),
            ("/pkg/%2e%2e/keys", Some("/keys")),
            ("/pkg/%2E%2E%2Fkeys", Some("/keys")),
            ("//keys", Some("/keys")),
            ("/./audit", Some("/audit")),
            ("/pkg/..", Some("/")),
            ("/../../etc/passwd", Some("/etc/passwd")),
            ("/pkg\\..\\keys", Some("/keys")),
            ("/keys", None),
            ("/pkg/floodgate_dashboard.js", None),
            ("/", None),
        ] {
            assert_eq!(normalized_path(raw).as_deref(), clean, "{raw}");
        }
    }

    #[test]
    fn the_client_is_the_peer_unless_a_trusted_proxy_says_otherwise() {
        let peer: IpAddr = "10.0.0.5".parse().unwrap();
        let proxies: Vec<IpNet> = vec!["10.0.0.0/24".parse().unwrap()];
        let xff = headers(&[("x-forwarded-for", "203.0.113.9, 198.51.100.7, 10.0.0.4")]);
        assert_eq!(
            client_address(Some(peer), &xff, &[]),
            Some(peer),
            "no trusted proxy: the header is ignored"
        );
        assert_eq!(
            client_address(Some(peer), &xff, &proxies),
            Some("198.51.100.7".parse().unwrap()),
            "the nearest untrusted hop, never the client-supplied left end"
        );
        let stranger: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(
            client_address(Some(stranger), &xff, &proxies),
            Some(stranger)
        );
        let garbage = headers(&[("x-forwarded-for", "not-an-ip, 10.0.0.4")]);
        assert_eq!(
            client_address(Some(peer), &garbage, &proxies),
            Some("10.0.0.4".parse().unwrap())
        );
        assert_eq!(
            client_address(Some(peer), &HeaderMap::new(), &proxies),
            Some(peer)
        );
    }

    #[test]
    fn every_error_answer_carries_its_status() {
        for (e, status) in [
            (AppError::SignedOut, 401),
            (AppError::Forbidden("x".into()), 403),
            (AppError::TooManyAttempts { wait_secs: 3 }, 429),
            (AppError::invalid("name", "bad"), 422),
            (AppError::Unavailable("down".into()), 503),
        ] {
            let r = error_response(&e);
            assert_eq!(r.status().as_u16(), status);
            assert!(r.headers().contains_key("serverfnerror"));
        }
    }

    #[test]
    fn secrets_compare_in_full() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
    }
}
