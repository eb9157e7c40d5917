//! The server side (feature `ssr`): Redis access, operators and sessions, the
//! configuration's compare-and-set with its audit record, traffic reading, and the
//! router with its guard (session on every page and server function, same-origin
//! check on every mutation, security headers).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use argon2::Argon2;
use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use axum::extract::{FromRef, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use floodgate_edge::admin::{self, AdminError};
use floodgate_edge::store::{NativeStore, SetOptions, Store, StoreError};
use floodgate_shared::audit::SaveOutcome;
use floodgate_shared::config::EdgeConfig;
use floodgate_shared::policy::Quota;
use floodgate_shared::script::Check;
use leptos::config::LeptosOptions;
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::model::{AuditEntry, Series, Traffic, histogram_quantile};

pub const OPERATOR_PREFIX: &str = "fg:dash:operator:";
pub const SESSION_PREFIX: &str = "fg:dash:session:";
pub use floodgate_shared::audit::{AUDIT_KEEP, AUDIT_KEY};
pub const SESSION_TTL_SECS: u64 = 12 * 3600;
pub const SESSION_COOKIE: &str = "fg_session";
/// Sign-in attempts allowed per client address and per user name.
pub const LOGIN_QUOTA: &str = "10/1m";
/// The largest request body accepted (forms carry at most a few KB; 1 MB
/// strings are refused with a field error, larger bodies with 413).
pub const MAX_BODY: usize = 2 * 1024 * 1024;
/// What every request handler shares.
pub struct Core {
    pub store: NativeStore,
    /// Adds `Secure` to the session cookie (set behind TLS).
    pub secure_cookies: bool,
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
    #[error("{0}")]
    Refused(String),
}

impl From<AdminError> for DashError {
    fn from(e: AdminError) -> Self {
        match e {
            AdminError::Store(e) => DashError::Store(e),
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

/// Checks the login limiter (Floodgate's own bucket, one atomic call for the
/// client address and the user name), then the password.
pub async fn sign_in(
    core: &Core,
    user: &str,
    password: &str,
    client: Option<SocketAddr>,
) -> Result<String, DashError> {
    let quota = Quota::parse_short(LOGIN_QUOTA).expect("a valid quota");
    let ip_key = format!(
        "fg:{{dash-login}}:ip:{}",
        client
            .map(|c| c.ip().to_string())
            .unwrap_or_else(|| "unknown".into())
    );
    let user_key = format!(
        "fg:{{dash-login}}:user:{}",
        &sha256_hex(user.as_bytes())[..32]
    );
    let verdict = core
        .store
        .check(
            &[
                Check {
                    key: &ip_key,
                    quota: &quota,
                    cost: 1,
                    shadow: false,
                },
                Check {
                    key: &user_key,
                    quota: &quota,
                    cost: 1,
                    shadow: false,
                },
            ],
            None,
        )
        .await?;
    if !verdict.admitted {
        let wait = verdict.headline().retry_after_secs().unwrap_or(60);
        return Err(DashError::Refused(format!(
            "Too many sign-in attempts; try again in {wait} s"
        )));
    }
    let bad = || DashError::Refused("Wrong user name or password".into());
    if password.len() > 1024 {
        return Err(bad());
    }
    let stored = if validate_user(user).is_ok() {
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
        return Err(bad());
    }
    let token = random_hex(32);
    let session = serde_json::json!({"user": user, "csrf": random_hex(32)}).to_string();
    core.store
        .set(
            &format!("{SESSION_PREFIX}{}", sha256_hex(token.as_bytes())),
            session.as_bytes(),
            SetOptions::default().expire(std::time::Duration::from_secs(SESSION_TTL_SECS)),
        )
        .await?;
    Ok(token)
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

fn cookie_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == SESSION_COOKIE)
        .map(|(_, v)| v)
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
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

/// Saves `config` if the stored one is still `based_on`, with its audit record, in
/// one atomic script. `Ok(Err(current))` when someone else saved first.
pub async fn save_config(
    store: &NativeStore,
    based_on: &str,
    config: &EdgeConfig,
    entry: &AuditEntry,
) -> Result<Result<String, String>, DashError> {
    Ok(
        match admin::save_config(store, based_on, config, entry).await? {
            SaveOutcome::Saved { version } => Ok(version),
            SaveOutcome::Conflict { current } => Err(current),
        },
    )
}

/// Appends an audit record (key operations; configuration changes record theirs
/// inside the compare-and-set).
pub async fn audit(store: &NativeStore, entry: &AuditEntry) -> Result<(), DashError> {
    Ok(admin::audit(store, entry).await?)
}

pub async fn audit_log(store: &NativeStore, count: usize) -> Result<Vec<AuditEntry>, DashError> {
    Ok(admin::audit_log(store, count).await?)
}

/// The edge's sample of recent decisions (newest first).
pub async fn sample(store: &NativeStore) -> Result<Vec<String>, DashError> {
    let items = store
        .lrange(floodgate_edge::stats::SAMPLE_KEY, 0, -1)
        .await?;
    Ok(items
        .into_iter()
        .filter_map(|b| String::from_utf8(b).ok())
        .collect())
}

// ----- traffic -----------------------------------------------------------------

/// Reads the edge's per-minute counters for the `window` minutes ending at
/// `now_minute` (one batched round trip).
pub async fn traffic(
    store: &NativeStore,
    now_minute: i64,
    window: usize,
) -> Result<Traffic, DashError> {
    let minutes: Vec<i64> = (0..window as i64).rev().map(|i| now_minute - i).collect();
    let hashes = stats_hashes(store, &minutes).await?;
    Ok(summarize(&minutes, &hashes))
}

/// Turns per-minute hashes into the series the charts draw (pure).
pub fn summarize(minutes: &[i64], hashes: &[Vec<(String, u64)>]) -> Traffic {
    let n = minutes.len();
    let mut t = Traffic {
        minutes: minutes.to_vec(),
        ..Traffic::default()
    };
    let mut per_key: BTreeMap<String, u64> = BTreeMap::new();
    for (i, fields) in hashes.iter().enumerate() {
        let mut hist = vec![];
        for (field, count) in fields {
            let parts: Vec<&str> = field.split('|').collect();
            match parts.as_slice() {
                ["lat", bound] => {
                    let b = if *bound == "inf" {
                        Some(u64::MAX)
                    } else {
                        bound.parse().ok()
                    };
                    if let Some(b) = b {
                        hist.push((b, *count));
                    }
                }
                ["key", id, "throttled"] => *per_key.entry((*id).to_string()).or_default() += count,
                ["key", ..] => {}
                ["mode", mode] => {
                    *t.degraded_by_mode.entry((*mode).to_string()).or_default() += count
                }
                ["breaker", "opened"] => t.breaker_opened += count,
                ["breaker", "open_ms"] => t.breaker_open_ms += count,
                [route, "degraded", mode] => {
                    *t.degraded_by_route_mode
                        .entry(((*route).to_string(), (*mode).to_string()))
                        .or_default() += count
                }
                [
                    route,
                    outcome @ ("allowed" | "throttled" | "degraded" | "shadow_throttled"),
                ] => {
                    let s = t
                        .routes
                        .entry((*route).to_string())
                        .or_insert_with(|| Series {
                            allowed: vec![0; n],
                            throttled: vec![0; n],
                            degraded: vec![0; n],
                            shadow: vec![0; n],
                        });
                    let v = match *outcome {
                        "allowed" => &mut s.allowed,
                        "throttled" => &mut s.throttled,
                        "shadow_throttled" => &mut s.shadow,
                        _ => &mut s.degraded,
                    };
                    v[i] += count;
                }
                _ => {}
            }
        }
        t.p50_us.push(histogram_quantile(&hist, 0.5));
        t.p99_us.push(histogram_quantile(&hist, 0.99));
    }
    let mut top: Vec<(String, u64)> = per_key.into_iter().filter(|(_, n)| *n > 0).collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    top.truncate(10);
    t.top_throttled = top;
    t
}

/// Per key: (allowed, throttled, degraded) summed over the hashes.
pub fn key_usage(hashes: &[Vec<(String, u64)>]) -> BTreeMap<String, (u64, u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for fields in hashes {
        for (field, n) in fields {
            let parts: Vec<&str> = field.split('|').collect();
            if let ["key", id, outcome] = parts.as_slice() {
                let e = out.entry((*id).to_string()).or_default();
                match *outcome {
                    "allowed" => e.0 += n,
                    "throttled" => e.1 += n,
                    "degraded" => e.2 += n,
                    _ => {}
                }
            }
        }
    }
    out
}

/// The edge's per-minute counter hashes of `minutes`, in that order (one batched
/// round trip).
pub async fn stats_hashes(
    store: &NativeStore,
    minutes: &[i64],
) -> Result<Vec<Vec<(String, u64)>>, DashError> {
    let keys: Vec<String> = minutes
        .iter()
        .map(|m| floodgate_edge::stats::stats_key(*m))
        .collect();
    Ok(store
        .hgetall_many(&keys)
        .await?
        .into_iter()
        .map(|pairs| {
            pairs
                .into_iter()
                .filter_map(|(k, v)| {
                    let n = String::from_utf8_lossy(&v).parse::<u64>().ok()?;
                    Some((String::from_utf8_lossy(&k).into_owned(), n))
                })
                .collect()
        })
        .collect())
}

// ----- the guard -----------------------------------------------------------------

/// Paths served without a session.
fn is_public(path: &str) -> bool {
    matches!(path, "/login" | "/api/login" | "/favicon.ico" | "/healthz")
        || path.starts_with("/pkg/")
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

fn json_error(status: StatusCode, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "error": message }).to_string(),
    )
        .into_response()
}

/// Refuses cross-origin mutations, requires a session everywhere but the sign-in
/// page, and adds security headers.
pub async fn guard(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let mutation = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let too_large = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > MAX_BODY as u64);
    let mut res = if too_large {
        json_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("a request body may hold at most {MAX_BODY} bytes"),
        )
    } else if mutation && !same_origin(req.headers()) {
        json_error(StatusCode::FORBIDDEN, "cross-origin request refused")
    } else {
        match lookup_session(&state.core, req.headers()).await {
            Ok(Some(session)) => {
                req.extensions_mut().insert(session);
                next.run(req).await
            }
            Ok(None) if is_public(&path) => next.run(req).await,
            Ok(None) if path.starts_with("/api/") || mutation => {
                json_error(StatusCode::UNAUTHORIZED, "sign in first")
            }
            Ok(None) => (StatusCode::SEE_OTHER, [(header::LOCATION, "/login")]).into_response(),
            Err(e) => json_error(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("the session store is unavailable: {e}"),
            ),
        }
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
    if !path.starts_with("/pkg/") {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    res
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
        }),
    }
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
        .with_state(state)
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
    }

    #[test]
    fn traffic_is_summarized_per_route_and_key() {
        let hashes = vec![
            vec![
                ("search|allowed".to_string(), 5),
                ("search|throttled".to_string(), 2),
                ("search|degraded|fail_open".to_string(), 9),
                ("search|shadow_throttled".to_string(), 4),
                ("key|K1|throttled".to_string(), 2),
                ("lat|250".to_string(), 7),
                ("mode|fail_open".to_string(), 9),
                ("breaker|opened".to_string(), 1),
                ("breaker|open_ms".to_string(), 1500),
            ],
            vec![
                ("_|allowed".to_string(), 1),
                ("key|K2|throttled".to_string(), 3),
                ("key|K2|allowed".to_string(), 4),
            ],
        ];
        let t = summarize(&[10, 11], &hashes);
        assert_eq!(t.routes["search"].allowed, [5, 0]);
        assert_eq!(t.routes["search"].throttled, [2, 0]);
        assert_eq!(t.routes["search"].shadow, [4, 0]);
        assert_eq!(
            t.routes["search"].degraded,
            [0, 0],
            "per-mode fields are not totals"
        );
        assert_eq!(t.routes["_"].allowed, [0, 1]);
        assert_eq!(
            t.top_throttled,
            [("K2".to_string(), 3), ("K1".to_string(), 2)]
        );
        assert_eq!(t.p50_us, [Some(250), None]);
        assert_eq!(key_usage(&hashes)["K2"], (4, 3, 0));
        assert_eq!(t.degraded_by_mode["fail_open"], 9);
        assert_eq!(
            t.degraded_by_route_mode[&("search".to_string(), "fail_open".to_string())],
            9
        );
        assert_eq!((t.breaker_opened, t.breaker_open_ms), (1, 1500));
        assert!(!t.routes.contains_key("mode") && !t.routes.contains_key("breaker"));
    }

    #[test]
    fn secrets_compare_in_full() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
    }
}
