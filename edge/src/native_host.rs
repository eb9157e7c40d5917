//! The native host of the pipeline: an HTTP server (axum/hyper) that gates every
//! request with [`Pipeline::gate`] and proxies the admitted ones to one upstream.
//! For local runs, as a sidecar in front of internal services, and for load tests.
//!
//! Proxying: method, path, query, headers and streamed bodies pass through both
//! ways; hop-by-hop headers (and those the `Connection` header names) are dropped;
//! the client's API key is not forwarded unless configured; the identity header the
//! edge sets (the key id) replaces any value the client sent; `X-Forwarded-For`
//! gains the client address. An upstream that fails answers 502, one that times out
//! 504, both as JSON. A rejected request never reaches the upstream.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, HttpBody};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use floodgate_shared::contract::{HOP_BY_HOP, IDENTITY_HEADER};
use floodgate_shared::routes::MAX_PATH_LEN;
use floodgate_shared::time::SystemClock;

use crate::pipeline::{Gate, Pipeline, RequestHead, Slot};
/// The store a native host talks to (moved to [`crate::store`], where every
/// native binary chooses its store by URL).
pub use crate::store::NativeStore;

/// How the host proxies.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The upstream's base URL (`http://127.0.0.1:9000`); the request's path and
    /// query are appended.
    pub upstream: String,
    /// The header carrying the API key (`authorization` means `Bearer <key>`).
    pub key_header: HeaderName,
    /// Forward the client's API key upstream.
    pub forward_key: bool,
    /// The header the host sets to the caller's key id.
    pub identity_header: HeaderName,
    /// `false`: proxy without limiting (the benchmark's baseline).
    pub limiter: bool,
    pub upstream_timeout: Duration,
}

impl HostConfig {
    pub fn new(upstream: impl Into<String>) -> Self {
        Self {
            upstream: upstream.into().trim_end_matches('/').to_string(),
            key_header: header::AUTHORIZATION,
            forward_key: false,
            identity_header: HeaderName::from_static(IDENTITY_HEADER),
            limiter: true,
            upstream_timeout: Duration::from_secs(30),
        }
    }
}

struct Host {
    pipeline: Pipeline<NativeStore, SystemClock>,
    config: HostConfig,
    client: reqwest::Client,
}

/// The host's router. Serve it with `into_make_service_with_connect_info::<SocketAddr>()`.
pub fn router(pipeline: Pipeline<NativeStore, SystemClock>, config: HostConfig) -> Router {
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(1024)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("an HTTP client builds");
    let host = Arc::new(Host {
        pipeline,
        config,
        client,
    });
    // per-endpoint counters: one batched write per second, off the request path;
    // the task ends once the router (and so the host) is gone
    let weak = Arc::downgrade(&host);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let Some(host) = weak.upgrade() else { return };
            let _ = host.pipeline.flush_stats(STATS_FLUSH_EVERY).await;
        }
    });
    Router::new()
        .route(HEALTH_PATH, axum::routing::get(health))
        .fallback(handle)
        .with_state(host)
}

/// The path the host answers itself with [`Pipeline::health`] as JSON (never
/// forwarded): breaker phase and transitions, time degraded, degraded requests.
pub const HEALTH_PATH: &str = "/__floodgate/health";
const STATS_FLUSH_EVERY: floodgate_shared::Micros = 1_000_000;

async fn health(State(host): State<Arc<Host>>) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        host.pipeline.health().to_json(),
    )
        .into_response()
}

/// Holds a request's in-flight slots; dropping it releases them (in a spawned
/// task). It lives as long as the request: until the response body is streamed
/// out, or until the handler is dropped (client disconnect) or returns early
/// (upstream error or timeout).
struct SlotGuard {
    host: Arc<Host>,
    slots: Vec<Slot>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if self.slots.is_empty() {
            return;
        }
        let slots = std::mem::take(&mut self.slots);
        let host = self.host.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { host.pipeline.release(&slots).await });
        }
    }
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .collect();
    for h in HOP_BY_HOP
        .iter()
        .copied()
        .chain(named.iter().map(String::as_str))
    {
        headers.remove(h);
    }
}

fn json(status: StatusCode, error: &str) -> Response {
    let body = serde_json::json!({ "error": error }).to_string();
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

fn add_headers(headers: &mut HeaderMap, extra: &[(&'static str, String)]) {
    for (k, v) in extra {
        if let Ok(v) = HeaderValue::from_str(v) {
            headers.insert(*k, v);
        }
    }
}

async fn handle(
    State(host): State<Arc<Host>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
) -> Response {
    let path = req.uri().path();
    if path.len() > MAX_PATH_LEN || req.uri().query().is_some_and(|q| q.len() > MAX_PATH_LEN) {
        return json(StatusCode::URI_TOO_LONG, "Request URI too long");
    }
    let (key_id, quota_headers, guard) = if host.config.limiter {
        let credentials = req
            .headers()
            .get(&host.config.key_header)
            .map(HeaderValue::as_bytes);
        let head = RequestHead {
            path,
            credentials,
            client_ip: Some(peer.ip()),
        };
        match host.pipeline.gate(head).await {
            Gate::Respond {
                status,
                headers,
                body,
            } => {
                let mut resp = (
                    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                    body,
                )
                    .into_response();
                add_headers(resp.headers_mut(), &headers);
                return resp;
            }
            Gate::Forward {
                key_id,
                headers,
                slots,
                ..
            } => (
                Some(key_id),
                headers,
                SlotGuard {
                    host: host.clone(),
                    slots,
                },
            ),
        }
    } else {
        (
            None,
            vec![],
            SlotGuard {
                host: host.clone(),
                slots: vec![],
            },
        )
    };

    let (parts, body) = req.into_parts();
    let url = format!(
        "{}{}",
        host.config.upstream,
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    );
    let mut headers = parts.headers;
    strip_hop_by_hop(&mut headers);
    headers.remove(&host.config.identity_header);
    if !host.config.forward_key {
        headers.remove(&host.config.key_header);
    }
    if let Some(id) = key_id
        .as_deref()
        .and_then(|id| HeaderValue::from_str(id).ok())
    {
        headers.insert(host.config.identity_header.clone(), id);
    }
    let forwarded = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prev) => format!("{prev}, {}", peer.ip()),
        None => peer.ip().to_string(),
    };
    if let Ok(v) = HeaderValue::from_str(&forwarded) {
        headers.insert("x-forwarded-for", v);
    }
    let upstream = host
        .client
        .request(parts.method, url)
        .headers(headers)
        .body(if body.size_hint().exact() == Some(0) {
            // no body (a GET): send none, rather than an empty chunked one
            reqwest::Body::from(Vec::new())
        } else {
            reqwest::Body::wrap_stream(body.into_data_stream())
        })
        .timeout(host.config.upstream_timeout)
        .send()
        .await;
    match upstream {
        Ok(r) => {
            let status = r.status();
            let mut headers = r.headers().clone();
            strip_hop_by_hop(&mut headers);
            // the slots go back once the body is out (or the client left)
            let body = futures_util::StreamExt::map(r.bytes_stream(), move |chunk| {
                let _held = &guard;
                chunk
            });
            let mut resp = Response::new(Body::from_stream(body));
            *resp.status_mut() = status;
            *resp.headers_mut() = headers;
            add_headers(resp.headers_mut(), &quota_headers);
            resp
        }
        Err(e) if e.is_timeout() => json(StatusCode::GATEWAY_TIMEOUT, "Upstream timed out"),
        Err(_) => json(StatusCode::BAD_GATEWAY, "Upstream unavailable"),
    }
}
