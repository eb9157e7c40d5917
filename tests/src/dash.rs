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
    start_dashboard_with(redis, vec![]).await
}

/// As [`start_dashboard`], believing `X-Forwarded-For` from `trusted_proxies`.
pub async fn start_dashboard_with(
    redis: &RedisServer,
    trusted_proxies: Vec<ipnet::IpNet>,
) -> Dashboard {
    let options = StoreOptions::new(redis.url(), Duration::from_secs(2));
    start_dashboard_over(&options, trusted_proxies).await
}

/// A dashboard over an empty store (no configuration, no key): the first run,
/// told the edge's address `edge_url` (`--edge-url`).
pub async fn start_empty_dashboard(redis: &RedisServer, edge_url: &str) -> Dashboard {
    let options = StoreOptions::new(redis.url(), Duration::from_secs(2));
    let store = NativeStore::connect(&options)
        .await
        .expect("connect to the store");
    floodgate_dashboard::auth::ensure_operator(&store, ADMIN, ADMIN_PASSWORD)
        .await
        .expect("create the operator");
    let mut core = floodgate_dashboard::state::Core::new(store);
    core.edge_url = Some(edge_url.to_string());
    let site_root = site_root();
    let router =
        floodgate_dashboard::router::router(core, site_root.to_str().expect("a UTF-8 path"));
    let (url, stop) = crate::serve(router).await;
    Dashboard { url, _stop: stop }
}

/// [`start_dashboard`] over any store (`rediss://`, Cluster, REST).
pub async fn start_dashboard_over(
    options: &StoreOptions,
    trusted_proxies: Vec<ipnet::IpNet>,
) -> Dashboard {
    start_dashboard_configured(options, |core| core.trusted_proxies = trusted_proxies).await
}

/// [`start_dashboard`] with its settings changed by `configure` (the admin API's
/// rate per token, `api_quota`, say).
pub async fn start_dashboard_configured(
    options: &StoreOptions,
    configure: impl FnOnce(&mut floodgate_dashboard::state::Core),
) -> Dashboard {
    let store = NativeStore::connect(options)
        .await
        .expect("connect to the store");
    floodgate_edge::admin::set_config(&store, crate::DEMO_CONFIG)
        .await
        .expect("seed the config");
    floodgate_dashboard::auth::ensure_operator(&store, ADMIN, ADMIN_PASSWORD)
        .await
        .expect("create the operator");
    let mut core = floodgate_dashboard::state::Core::new(store);
    configure(&mut core);
    let site_root = site_root();
    let router =
        floodgate_dashboard::router::router(core, site_root.to_str().expect("a UTF-8 path"));
    let (url, stop) = crate::serve(router).await;
    Dashboard { url, _stop: stop }
}

/// How long a test waits for one dashboard answer: a page or call that never
/// answers fails the test in a minute instead of stalling the run (one hung
/// once, at `/policies`, for as long as nobody killed it).
pub const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// An HTTP client that never follows redirects.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(ANSWER_TIMEOUT)
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
    post_login_from(url, None, user, password, None).await
}

/// An HTTP client (no redirects) whose connections come from `local`, a loopback
/// address such as 127.0.0.7: the dashboard sees a different client address.
pub fn client_from(local: std::net::IpAddr) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .local_address(local)
        .timeout(ANSWER_TIMEOUT)
        .build()
        .expect("a client")
}

/// POSTs a sign-in form from loopback address `from` (default 127.0.0.1), with a
/// device cookie when given; returns the response.
pub async fn post_login_from(
    url: &str,
    from: Option<std::net::IpAddr>,
    user: &str,
    password: &str,
    device_cookie: Option<&str>,
) -> reqwest::Response {
    let http = from.map_or_else(client, client_from);
    let mut req = http
        .post(format!("{url}/api/login"))
        .header("origin", url)
        .form(&[("username", user), ("password", password)]);
    if let Some(c) = device_cookie {
        req = req.header("cookie", c);
    }
    req.send().await.expect("post the login form")
}

/// The `name=value` of cookie `name` a response sets.
pub fn set_cookie(res: &reqwest::Response, name: &str) -> Option<String> {
    res.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with(&format!("{name}=")))
        .and_then(|c| c.split(';').next())
        .map(str::to_string)
}

impl Operator {
    pub async fn sign_in(url: &str) -> Self {
        let res = post_login(url, ADMIN, ADMIN_PASSWORD).await;
        assert!(
            res.status().is_success() || res.status().is_redirection(),
            "login answered {}",
            res.status()
        );
        let cookie = set_cookie(&res, "fg_session").expect("a session cookie");
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
        let (status, v) = self.answer(name, fields).await;
        assert!(status.is_success(), "{name} answered {status}: {v}");
        v
    }

    /// Calls a server function: its status and JSON answer (an error's too).
    pub async fn answer(
        &self,
        name: &str,
        fields: &[(&str, &str)],
    ) -> (reqwest::StatusCode, Value) {
        let res = self.call(name, fields).await;
        let status = res.status();
        let body = res.text().await.unwrap_or_default();
        let v = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{name}: {e}: {body}"));
        (status, v)
    }

    /// Calls a server function that must refuse: its JSON error (an
    /// [`floodgate_dashboard::error::AppError`]); panics on a success.
    pub async fn refused(&self, name: &str, fields: &[(&str, &str)]) -> Value {
        let (status, v) = self.answer(name, fields).await;
        assert!(
            status.is_client_error() || status.is_server_error(),
            "{name} answered {status}: {v}"
        );
        v
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

/// The statuses the edge at `edge` answers `n` searches (`GET /v1/search?q=x`) by
/// the key `secret`, in order.
pub async fn search_statuses(edge: &str, secret: &str, n: usize) -> Vec<u16> {
    let http = reqwest::Client::new();
    let mut out = vec![];
    for _ in 0..n {
        let res = http
            .get(format!("{edge}/v1/search?q=x"))
            .bearer_auth(secret)
            .send()
            .await
            .expect("the edge answers");
        out.push(res.status().as_u16());
    }
    out
}
