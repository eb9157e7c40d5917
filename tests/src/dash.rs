//! The dashboard in-process for tests: a real server on a loopback port over a
//! test's own Redis, and an operator's HTTP session (cookie, CSRF token, Origin).

use std::path::PathBuf;
use std::time::Duration;

use floodgate_edge::store::{NativeStore, StoreOptions};
use serde_json::Value;

use crate::RedisServer;

pub const ADMIN: &str = "admin";
pub const ADMIN_PASSWORD: &str = "correct horse battery staple";

/// Where the hydration bundle is built (`scripts/dashboard build`).
pub fn site_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/site")
}

pub struct Dashboard {
    pub url: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Seeds the demo configuration and the first operator, then serves the dashboard.
pub async fn start_dashboard(redis: &RedisServer) -> Dashboard {
    start_dashboard_with(&StoreOptions::new(redis.url(), Duration::from_secs(2))).await
}

/// [`start_dashboard`] over any store (`rediss://`, Cluster, REST).
pub async fn start_dashboard_with(options: &StoreOptions) -> Dashboard {
    let store = NativeStore::connect(options)
        .await
        .expect("connect to the store");
    floodgate_edge::admin::set_config(&store, crate::DEMO_CONFIG)
        .await
        .expect("seed the config");
    floodgate_dashboard::server::ensure_operator(&store, ADMIN, ADMIN_PASSWORD)
        .await
        .expect("create the operator");
    let state = floodgate_dashboard::server::app_state(
        store,
        site_root().to_str().expect("a UTF-8 path"),
        false,
    );
    let (url, stop) = crate::serve(floodgate_dashboard::server::router(state)).await;
    Dashboard { url, _stop: stop }
}

/// An HTTP client that never follows redirects.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client")
}

/// A signed-in operator.
pub struct Operator {
    pub url: String,
    pub http: reqwest::Client,
    pub cookie: String,
    pub csrf: String,
}

/// POSTs a sign-in form; returns the response.
pub async fn post_login(url: &str, user: &str, password: &str) -> reqwest::Response {
    client()
        .post(format!("{url}/api/login"))
        .header("origin", url)
        .form(&[("username", user), ("password", password)])
        .send()
        .await
        .expect("post the login form")
}

impl Operator {
    pub async fn sign_in(url: &str) -> Self {
        let res = post_login(url, ADMIN, ADMIN_PASSWORD).await;
        assert!(
            res.status().is_success() || res.status().is_redirection(),
            "login answered {}",
            res.status()
        );
        let cookie = res
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|c| c.starts_with("fg_session="))
            .expect("a session cookie")
            .split(';')
            .next()
            .unwrap()
            .to_string();
        let http = client();
        let info: Value = http
            .post(format!("{url}/api/session"))
            .header("origin", url)
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .expect("session JSON");
        Operator {
            url: url.to_string(),
            http,
            cookie,
            csrf: info["csrf"].as_str().expect("a csrf token").to_string(),
        }
    }

    /// POSTs form `fields` to server function `name` (csrf added unless given).
    pub async fn call(&self, name: &str, fields: &[(&str, &str)]) -> reqwest::Response {
        let mut form: Vec<(&str, &str)> = fields.to_vec();
        if !fields.iter().any(|(k, _)| *k == "csrf") {
            form.push(("csrf", &self.csrf));
        }
        self.http
            .post(format!("{}/api/{name}", self.url))
            .header("origin", &self.url)
            .header("cookie", &self.cookie)
            .header("accept", "application/json")
            .form(&form)
            .send()
            .await
            .expect("call a server function")
    }

    /// Calls a server function and parses its JSON answer (panics on an error status).
    pub async fn json(&self, name: &str, fields: &[(&str, &str)]) -> Value {
        let res = self.call(name, fields).await;
        let status = res.status();
        let body = res.text().await.unwrap_or_default();
        assert!(status.is_success(), "{name} answered {status}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{name}: {e}: {body}"))
    }

    /// The current configuration version.
    pub async fn version(&self) -> String {
        self.json("config", &[]).await["version"]
            .as_str()
            .expect("a version")
            .to_string()
    }

    /// GETs a page with the session.
    pub async fn page(&self, path: &str) -> (reqwest::StatusCode, String) {
        let res = self
            .http
            .get(format!("{}{path}", self.url))
            .header("cookie", &self.cookie)
            .send()
            .await
            .expect("get a page");
        (res.status(), res.text().await.unwrap_or_default())
    }
}
