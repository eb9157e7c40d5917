//! Signing in and out, and the signed-in session.

use leptos::prelude::*;

#[cfg(feature = "ssr")]
use super::ctx;
use crate::error::AppError;
use crate::wire::SessionInfo;

#[server(endpoint = "login")]
pub async fn login(username: String, password: String) -> Result<(), AppError> {
    use axum::extract::ConnectInfo;
    use axum::http::{HeaderValue, header};

    use crate::auth;
    let core = ctx::core()?;
    let parts = use_context::<axum::http::request::Parts>()
        .ok_or_else(|| AppError::Internal("no request".into()))?;
    let peer = parts
        .extensions
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let client = auth::client_address(peer, &parts.headers, &core.trusted_proxies);
    let device = auth::device_token(&parts.headers);
    let signed = auth::sign_in(&core.store, &username, &password, client, device).await?;
    let r = expect_context::<leptos_axum::ResponseOptions>();
    for cookie in [
        auth::session_cookie(Some(&signed.session), core.secure_cookies),
        auth::device_cookie(&signed.device, core.secure_cookies),
    ] {
        r.append_header(
            header::SET_COOKIE,
            HeaderValue::from_str(&cookie).expect("a cookie is a header value"),
        );
    }
    leptos_axum::redirect("/");
    Ok(())
}

#[server(endpoint = "logout")]
pub async fn logout(#[server(default)] csrf: String) -> Result<(), AppError> {
    use axum::http::{HeaderValue, header};
    let (core, session) = ctx::mutation(&csrf).await?;
    crate::auth::sign_out(&core.store, &session).await?;
    let cleared = crate::auth::session_cookie(None, core.secure_cookies);
    let r = expect_context::<leptos_axum::ResponseOptions>();
    r.insert_header(
        header::SET_COOKIE,
        HeaderValue::from_str(&cleared).expect("a cookie is a header value"),
    );
    leptos_axum::redirect("/login");
    Ok(())
}

#[server(endpoint = "session")]
pub async fn current_session() -> Result<SessionInfo, AppError> {
    let s = ctx::session().await?;
    Ok(SessionInfo {
        user: s.user,
        csrf: s.csrf,
        edge_url: ctx::core()?.edge_url.clone(),
    })
}
