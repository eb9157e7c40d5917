//! The dashboard's two cookies, built and read with the `cookie` crate: the
//! session (`fg_session`, every path) and the device cookie (`fg_device`, sent to
//! the sign-in call only: a browser that signed in before). Both hold 64 hex
//! digits, are `HttpOnly` and `SameSite=Strict`, and `Secure` behind TLS.

use axum::http::{HeaderMap, header};
use cookie::time::Duration;
use cookie::{Cookie, SameSite};

use super::session::SESSION_TTL_SECS;
use super::sign_in::TRUST_TTL_SECS;

pub const SESSION_COOKIE: &str = "fg_session";
/// Marks a browser that signed in before (`docs/dashboard.md`, the threat model).
pub const DEVICE_COOKIE: &str = "fg_device";

/// A `Set-Cookie` value: `name=value` for `path`, kept `max_age_secs`.
fn set_cookie(name: &str, value: &str, path: &str, max_age_secs: u64, secure: bool) -> String {
    Cookie::build((name, value))
        .path(path)
        .http_only(true)
        .same_site(SameSite::Strict)
        .max_age(Duration::seconds(
            max_age_secs.try_into().unwrap_or(i64::MAX),
        ))
        .secure(secure)
        .build()
        .to_string()
}

/// The `Set-Cookie` value carrying a session token (or clearing it when `None`).
pub fn session_cookie(token: Option<&str>, secure: bool) -> String {
    match token {
        Some(t) => set_cookie(SESSION_COOKIE, t, "/", SESSION_TTL_SECS, secure),
        None => set_cookie(SESSION_COOKIE, "", "/", 0, secure),
    }
}

/// The `Set-Cookie` value of the device cookie (sent to the sign-in call only).
pub fn device_cookie(token: &str, secure: bool) -> String {
    set_cookie(DEVICE_COOKIE, token, "/api/login", TRUST_TTL_SECS, secure)
}

/// The value of the request's first cookie `name`, if it is 64 hex digits (both
/// cookies are).
fn cookie_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == name)
        .and_then(|c| c.value_raw())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The session token the browser sent, if any.
pub fn session_token(headers: &HeaderMap) -> Option<&str> {
    cookie_value(headers, SESSION_COOKIE)
}

/// The browser's device cookie, if it sent one.
pub fn device_token(headers: &HeaderMap) -> Option<&str> {
    cookie_value(headers, DEVICE_COOKIE)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_headers as headers;

    #[test]
    fn the_session_cookie_is_read_strictly() {
        let t = "ab".repeat(32);
        assert_eq!(
            session_token(&headers(&[("cookie", &format!("a=b; fg_session={t}"))])),
            Some(t.as_str())
        );
        assert_eq!(
            session_token(&headers(&[
                ("cookie", "a=b"),
                ("cookie", &format!("fg_session={t}"))
            ])),
            Some(t.as_str()),
            "in any Cookie header"
        );
        assert_eq!(
            session_token(&headers(&[("cookie", "fg_session=short")])),
            None
        );
        assert_eq!(
            session_token(&headers(&[(
                "cookie",
                &format!("fg_session={}", "zz".repeat(32))
            )])),
            None
        );
        let c = session_cookie(Some(&t), true);
        for part in [
            "HttpOnly",
            "SameSite=Strict",
            "Secure",
            "Path=/",
            "Max-Age=43200",
        ] {
            assert!(c.contains(part), "{c}");
        }
        assert!(c.starts_with(&format!("fg_session={t};")), "{c}");
        assert!(!session_cookie(Some(&t), false).contains("Secure"));
        let cleared = session_cookie(None, false);
        assert!(
            cleared.starts_with("fg_session=;") && cleared.contains("Max-Age=0"),
            "{cleared}"
        );
        let d = device_cookie(&t, false);
        for part in [
            "HttpOnly",
            "SameSite=Strict",
            "Path=/api/login",
            "Max-Age=2592000",
        ] {
            assert!(d.contains(part), "{d}");
        }
        assert_eq!(
            device_token(&headers(&[("cookie", &format!("fg_device={t}"))])),
            Some(t.as_str())
        );
    }
}
