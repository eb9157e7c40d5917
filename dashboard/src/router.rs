//! The dashboard's HTTP server (feature `ssr`): the axum router of pages, server
//! functions, the hydration bundle, the favicon, `/healthz` and the fleet's
//! `/metrics`, behind the guard: a session on every page and server function, the
//! same origin on every mutation, bodies bounded, an outage told as a page, and
//! security headers; and, outside the guard, the admin HTTP API
//! ([`crate::adminapi`]). Only the binary (and the tests) use it.

use std::sync::Arc;

use axum::extract::{FromRef, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use floodgate_edge::store::StoreError;
use leptos::config::LeptosOptions;

use crate::auth::{self, AuthError};
use crate::error::AppError;
use crate::state::Core;

/// The largest request body accepted (forms carry at most a few KB; 1 MB
/// strings are refused with a field error, larger bodies with 413).
const MAX_BODY: usize = 2 * 1024 * 1024;

/// What the router's handlers share: Leptos' options and the [`Core`].
#[derive(Clone)]
struct AppState {
    options: LeptosOptions,
    core: Arc<Core>,
}

impl FromRef<AppState> for LeptosOptions {
    fn from_ref(s: &AppState) -> Self {
        s.options.clone()
    }
}

/// The dashboard's router over `core`, serving the hydration bundle from
/// `site_root` (its `pkg/` holds `floodgate_dashboard.js` and
/// `floodgate_dashboard_bg.wasm`): pages, server functions, the favicon.
pub fn router(core: Core, site_root: &str) -> axum::Router {
    use leptos_axum::{LeptosRoutes, generate_route_list};
    let options = LeptosOptions::builder()
        .output_name("floodgate_dashboard")
        .site_root(site_root)
        .site_pkg_dir("pkg")
        .build();
    let state = AppState {
        options,
        core: Arc::new(core),
    };
    let routes = generate_route_list(crate::app::App);
    let options = state.options.clone();
    let core = state.core.clone();
    let core_for_api = state.core.clone();
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
        // outside the guard too: tokens, not sessions (crate::adminapi)
        .merge(crate::adminapi::routes(core_for_api))
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

/// Paths served without a session.
fn is_public(path: &str) -> bool {
    matches!(path, "/login" | "/api/login" | "/favicon.ico" | "/healthz")
        || path.starts_with("/pkg/")
}

/// The path with `.` and `..` segments resolved and repeated slashes merged (also
/// when written `%2e` or `%2f`), or `None` when it is already plain. The guard
/// redirects to it, so `/pkg/../keys` is `/keys`, not a public `/pkg/` path.
fn normalized_path(path: &str) -> Option<String> {
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
fn same_origin(headers: &HeaderMap) -> bool {
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
fn error_response(e: &AppError) -> Response {
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
async fn guard(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
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
    let had_cookie = auth::session_token(req.headers()).is_some();
    match auth::lookup_session(&state.core.store, req.headers()).await {
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
                let clear = auth::session_cookie(None, state.core.secure_cookies);
                if let Ok(v) = HeaderValue::from_str(&clear) {
                    r.headers_mut().insert(header::SET_COOKIE, v);
                }
            }
            Some(r)
        }
        Err(AuthError::Store(e)) if !api => Some(outage_page(&e)),
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

/// Every registered server function's path and method (for tests that must
/// cover all of them).
pub fn server_fn_paths() -> Vec<(String, String)> {
    leptos::server_fn::axum::server_fn_paths()
        .map(|(p, m)| (p.to_string(), m.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_headers as headers;

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
}
