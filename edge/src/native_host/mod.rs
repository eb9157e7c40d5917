//! The native host of the pipeline: an HTTP/1.1 server (hyper, through the
//! hardened loop of [`server`]) that gates every request with [`Pipeline::gate`]
//! and proxies the admitted ones to one upstream with hyper's client (pooled,
//! kept-alive connections). For local runs, as a sidecar in front of internal
//! services, and for load tests.
//!
//! What a client can observe of the proxying is [`crate::proxy`]'s rules, shared
//! with the Worker; this module is only their I/O.

pub mod body;
pub mod server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use floodgate_shared::Micros;
use floodgate_shared::time::SystemClock;
use hyper::body::Incoming;
use hyper::header::{CONNECTION, CONTENT_LENGTH, HeaderName, HeaderValue, USER_AGENT};
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use self::body::{BodyFault, Held, ProxyBody, RequestBody};
use self::server::{Connection, ServerLimits};
use crate::forward_auth::ForwardAuth;
use crate::metrics::{EdgeMetrics, InstanceState, UpstreamAnswer};
use crate::pipeline::{Gate, Pipeline, RequestHead, Slot, Task};
use crate::proxy::{
    HEALTH_PATH, HeadSize, METRICS_PATH, ProxyRules, REQUEST_ID_HEADER, Refusal, connection_named,
    has_body,
};
/// The store a native host talks to (in [`crate::store`], where every native
/// binary chooses its store by URL).
pub use crate::store::NativeStore;

/// How the native host runs: the proxy's rules, and the server's limits.
#[derive(Debug, Clone)]
pub struct HostConfig {
    pub rules: ProxyRules,
    pub server: ServerLimits,
    /// `false`: proxy without limiting (the benchmark's baseline; no store).
    pub limiter: bool,
    /// Forward-auth mode: no upstream; each request describes another one, which
    /// the edge decides (see [`crate::forward_auth`]).
    pub forward_auth: Option<ForwardAuth>,
    /// The request header giving the client's country (ISO 3166-1 alpha-2) to the
    /// deny lists, such as `cf-ipcountry` behind Cloudflare (lower case).
    pub country_header: Option<String>,
}

impl HostConfig {
    pub fn new(upstream: &str) -> Self {
        Self {
            rules: ProxyRules::new(upstream),
            server: ServerLimits::default(),
            limiter: true,
            forward_auth: None,
            country_header: None,
        }
    }

    /// Forward-auth mode: answers gateways' auth requests, proxies nothing.
    pub fn forward_auth(mode: ForwardAuth) -> Self {
        Self {
            forward_auth: Some(mode),
            ..Self::new("")
        }
    }
}

type Upstream = Client<hyper_rustls::HttpsConnector<HttpConnector>, RequestBody>;
type EmptyUpstream =
    Client<hyper_rustls::HttpsConnector<HttpConnector>, http_body_util::Empty<Bytes>>;

/// A running native host: the pipeline, the rules, the upstream client.
pub struct Host {
    pipeline: Pipeline<NativeStore, SystemClock>,
    config: HostConfig,
    identity: HeaderName,
    key_header: HeaderName,
    country_header: Option<HeaderName>,
    client: Upstream,
    /// For requests without a body (most GETs): no body wrapper to poll.
    empty: EmptyUpstream,
    /// Served at [`METRICS_PATH`].
    metrics: EdgeMetrics,
}

fn connector() -> hyper_rustls::HttpsConnector<HttpConnector> {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    http.set_keepalive(Some(Duration::from_secs(60)));
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .wrap_connector(http)
}

impl Host {
    pub fn new(
        pipeline: Pipeline<NativeStore, SystemClock>,
        config: HostConfig,
    ) -> Result<Arc<Self>, String> {
        let header = |name: &str| {
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("bad header name {name:?}"))
        };
        let build = || {
            Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(60))
                .pool_max_idle_per_host(1024)
                .to_owned()
        };
        let metrics = EdgeMetrics::default();
        let host = Arc::new(Self {
            identity: header(&config.rules.identity_header)?,
            key_header: header(&config.rules.key_header)?,
            country_header: config.country_header.as_deref().map(header).transpose()?,
            pipeline: pipeline.with_stats_sink(metrics.stats.clone()),
            metrics,
            client: build().build(connector()),
            empty: build().build(connector()),
            config,
        });
        // per-endpoint counters: one batched write per second, off the request path;
        // the task ends once the host is gone
        let weak = Arc::downgrade(&host);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let Some(host) = weak.upgrade() else { return };
                if host.config.limiter {
                    let _ = host.pipeline.flush_stats(STATS_FLUSH_EVERY).await;
                }
            }
        });
        Ok(host)
    }

    pub fn pipeline(&self) -> &Pipeline<NativeStore, SystemClock> {
        &self.pipeline
    }

    /// The Prometheus text served at [`METRICS_PATH`]: answered from memory, so a
    /// scrape during a store outage answers too (with the breaker open in it).
    pub fn metrics_text(&self) -> String {
        self.metrics.scrape(&InstanceState {
            health: self.pipeline.health(),
            breakers: self.pipeline.breakers(),
            key_cache: self.pipeline.key_cache(),
            limiter: self.config.limiter,
        })
    }
}

const STATS_FLUSH_EVERY: Micros = 1_000_000;

/// Serves `host` on `listener` until `shutdown` completes (then lets requests in
/// progress finish).
pub async fn serve(
    listener: tokio::net::TcpListener,
    host: Arc<Host>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let limits = host.config.server;
    server::serve(
        listener,
        limits,
        move |peer, conn| {
            let host = host.clone();
            hyper::service::service_fn(move |req| {
                let host = host.clone();
                let conn = conn.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(host, peer, conn, req).await) }
            })
        },
        shutdown,
    )
    .await
}

/// Holds a request's in-flight slots; dropping it releases them (in a spawned
/// task). It lives as long as the response: until its body is streamed out, or
/// the client goes away, or the request ends early.
pub struct SlotGuard {
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

fn spawn_all(tasks: Vec<Task>) {
    for t in tasks {
        tokio::spawn(t);
    }
}

/// The host's own answer (JSON or the pipeline's), holding `held` until written.
fn answer(gate: Gate, held: Held) -> Response<ProxyBody> {
    let Gate::Respond {
        status,
        headers,
        body,
    } = gate
    else {
        unreachable!("only answers are written by the host")
    };
    let mut resp = Response::new(ProxyBody::full(body, held));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    add_headers(resp.headers_mut(), &headers);
    resp
}

fn refusal(r: Refusal, held: Held) -> Response<ProxyBody> {
    answer(r.answer(), held)
}

fn add_headers(headers: &mut HeaderMap, extra: &[(&'static str, String)]) {
    for (k, v) in extra {
        if let Ok(v) = HeaderValue::from_str(v) {
            headers.insert(*k, v);
        }
    }
}

fn head_size(req: &hyper::http::request::Parts) -> HeadSize {
    let headers = &req.headers;
    HeadSize {
        path: req.uri.path().len(),
        query: req.uri.query().map_or(0, str::len),
        header_count: headers.len(),
        header_bytes: headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len())
            .sum(),
        content_length: headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok()),
    }
}

/// What the host decides before the upstream sees anything: its own answer
/// (health, a limit, the pipeline's refusal), or the caller to forward with the
/// quota headers and in-flight slots.
async fn decide(
    host: &Host,
    peer: SocketAddr,
    parts: &hyper::http::request::Parts,
) -> Result<(Option<String>, Vec<(&'static str, String)>, Vec<Slot>), Gate> {
    if parts.uri.path() == HEALTH_PATH {
        return Err(Gate::Respond {
            status: 200,
            headers: vec![("Content-Type", "application/json".into())],
            body: host.pipeline.health().to_json(),
        });
    }
    if parts.uri.path() == METRICS_PATH {
        return Err(Gate::Respond {
            status: 200,
            headers: vec![("Content-Type", crate::metrics::CONTENT_TYPE.into())],
            body: host.metrics_text(),
        });
    }
    host.config
        .rules
        .check_head(&head_size(parts))
        .map_err(Refusal::answer)?;
    if !host.config.limiter {
        return Ok((None, vec![], vec![]));
    }
    let credentials = parts
        .headers
        .get(&host.key_header)
        .map(HeaderValue::as_bytes);
    let country = host
        .country_header
        .as_ref()
        .and_then(|h| parts.headers.get(h))
        .and_then(|v| v.to_str().ok());
    let user_agent = parts.headers.get(USER_AGENT).map(HeaderValue::as_bytes);
    let head = match &host.config.forward_auth {
        None => RequestHead {
            path: parts.uri.path(),
            credentials,
            client_ip: Some(peer.ip()),
            country,
            user_agent,
        },
        Some(mode) => {
            let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            let original = mode
                .original(parts.method.as_str(), target, |name| {
                    parts.headers.get(name).map(HeaderValue::as_bytes)
                })
                .map_err(|e| e.answer())?;
            RequestHead {
                path: original.path,
                credentials,
                client_ip: original.client_ip,
                country,
                user_agent,
            }
        }
    };
    let decided = host.pipeline.gate(head).await;
    spawn_all(decided.background);
    match decided.gate {
        g @ Gate::Respond { .. } => Err(g),
        Gate::Forward {
            key_id,
            headers,
            slots,
            ..
        } => Ok((key_id, headers, slots)),
    }
}

/// Most bytes of an unread request body read out (and dropped) after an early
/// answer; a client sending more gets its connection closed.
const LINGER_MAX: u64 = 64 * 1024 * 1024;

/// Reads out a request body nobody will use, in the background, bounded in bytes
/// and by `pause` between its parts (nginx's lingering close): closing a
/// connection with unread data resets it, and the client may lose the answer.
pub(crate) fn linger(body: Incoming, pause: Duration) {
    if hyper::body::Body::is_end_stream(&body) {
        return;
    }
    tokio::spawn(async move {
        let mut body = body;
        let mut read = 0u64;
        while read <= LINGER_MAX {
            match tokio::time::timeout(
                pause.min(Duration::from_secs(5)),
                http_body_util::BodyExt::frame(&mut body),
            )
            .await
            {
                Ok(Some(Ok(f))) => read += f.data_ref().map_or(0, |d| d.len() as u64),
                _ => return,
            }
        }
    });
}

/// The upstream request's headers: the client's, filtered by the rules, with the
/// identity, the request id and `X-Forwarded-For` the edge sets.
fn upstream_headers(
    host: &Host,
    from: &HeaderMap,
    key_id: Option<&str>,
    peer: SocketAddr,
    request_id: &HeaderValue,
) -> HeaderMap {
    let rules = &host.config.rules;
    let named = connection_named(
        from.get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok()),
    );
    let mut out = HeaderMap::with_capacity(from.len() + 2);
    for (name, value) in from {
        if rules.forwards_request_header(name.as_str(), &named) {
            out.append(name.clone(), value.clone());
        }
    }
    if let Some(id) = key_id.and_then(|id| HeaderValue::from_str(id).ok()) {
        out.insert(host.identity.clone(), id);
    }
    out.insert(REQUEST_ID_HEADER, request_id.clone());
    let existing = from.get("x-forwarded-for").and_then(|v| v.to_str().ok());
    if let Some(v) = rules
        .forwarded_for(existing, Some(peer.ip()))
        .and_then(|v| HeaderValue::from_str(&v).ok())
    {
        out.insert("x-forwarded-for", v);
    }
    out
}

/// The request's id ([`crate::proxy::request_id`]).
fn request_id(headers: &HeaderMap) -> HeaderValue {
    let client = headers.get(REQUEST_ID_HEADER).and_then(|v| v.to_str().ok());
    HeaderValue::from_str(&crate::proxy::request_id(client, rand::random))
        .expect("a well-formed id is a header value")
}

/// One request, in its span (`request_id`): every event logged while deciding and
/// proxying it carries the id; at `debug`, one event when its answer's head is out.
async fn handle(
    host: Arc<Host>,
    peer: SocketAddr,
    conn: Connection,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    use tracing::Instrument;
    let id = request_id(req.headers());
    let span = tracing::info_span!(
        target: "floodgate::request",
        "request",
        request_id = id.to_str().unwrap_or_default()
    );
    let method = req.method().clone();
    let started = std::time::Instant::now();
    let resp = proxied(host, peer, conn, req, id)
        .instrument(span.clone())
        .await;
    span.in_scope(|| {
        crate::pipeline::events::trace(&crate::pipeline::events::LogEvent::Answered {
            method: method.as_str(),
            status: resp.status().as_u16(),
            latency_us: started.elapsed().as_micros() as u64,
        })
    });
    resp
}

async fn proxied(
    host: Arc<Host>,
    peer: SocketAddr,
    conn: Connection,
    req: Request<Incoming>,
    request_id: HeaderValue,
) -> Response<ProxyBody> {
    let held = Held {
        in_flight: Some(conn.in_flight()),
        slots: None,
    };
    let (parts, body) = req.into_parts();
    let (key_id, quota_headers, slots) = match decide(&host, peer, &parts).await {
        Ok(f) => f,
        Err(gate) => {
            // answered without reading the body: read it out behind the answer, so
            // the client sees the answer rather than a reset
            linger(body, host.config.rules.timeouts.body);
            let mut r = answer(gate, held);
            if matches!(parts.uri.path(), HEALTH_PATH | METRICS_PATH) {
                r.headers_mut()
                    .insert("cache-control", HeaderValue::from_static("no-store"));
            }
            return r;
        }
    };
    let held = Held {
        slots: Some(SlotGuard {
            host: host.clone(),
            slots,
        }),
        ..held
    };
    if host.config.forward_auth.is_some() {
        // the gateway proxies: admitted, with the identity to copy upstream (the
        // slots, if any, are given back once this answer is written)
        linger(body, host.config.rules.timeouts.body);
        let mut r = Response::new(ProxyBody::full(Bytes::new(), held));
        add_headers(r.headers_mut(), &quota_headers);
        // always sent, empty for a caller forwarded without an identity (fail-open
        // while keys cannot be verified): a gateway copying it then replaces any
        // client-sent value (Caddy 2.6 keeps the client's when it is absent)
        let id = key_id
            .and_then(|id| HeaderValue::from_str(&id).ok())
            .unwrap_or_else(|| HeaderValue::from_static(""));
        r.headers_mut().insert(host.identity.clone(), id);
        return r;
    }
    let rules = &host.config.rules;
    let target = rules.target(parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    let Ok(uri) = target.parse::<hyper::Uri>() else {
        return refusal(Refusal::UpstreamUnavailable, held);
    };
    let headers = upstream_headers(&host, &parts.headers, key_id.as_deref(), peer, &request_id);
    let method = parts.method.clone();
    let fault = Arc::new(BodyFault::default());
    let sent_at = std::time::Instant::now();
    let sent = if hyper::body::Body::is_end_stream(&body) {
        let mut up = Request::new(http_body_util::Empty::new());
        *up.method_mut() = parts.method;
        *up.uri_mut() = uri;
        *up.headers_mut() = headers;
        tokio::time::timeout(rules.timeouts.upstream, host.empty.request(up)).await
    } else {
        let body = RequestBody::new(
            body,
            rules.limits.max_body,
            rules.timeouts.body,
            fault.clone(),
        );
        let mut up = Request::new(body);
        *up.method_mut() = parts.method;
        *up.uri_mut() = uri;
        *up.headers_mut() = headers;
        tokio::time::timeout(rules.timeouts.upstream, host.client.request(up)).await
    };
    let took = sent_at.elapsed().as_secs_f64();
    let upstream = match sent {
        Ok(Ok(r)) => {
            host.metrics
                .upstream(UpstreamAnswer::Status(r.status().as_u16()), took);
            r
        }
        // the client's body failed it, not the upstream
        Ok(Err(_)) | Err(_) if fault.get().is_some() => {
            return refusal(fault.get().expect("set"), held);
        }
        Ok(Err(e)) => {
            host.metrics.upstream(UpstreamAnswer::Error, took);
            tracing::warn!(target: "floodgate::request", error = %e, "upstream unavailable: {e}");
            return refusal(Refusal::UpstreamUnavailable, held);
        }
        Err(_) => {
            host.metrics.upstream(UpstreamAnswer::Timeout, took);
            tracing::warn!(
                target: "floodgate::request",
                timeout_ms = rules.timeouts.upstream.as_millis() as u64,
                "upstream timeout"
            );
            return refusal(Refusal::UpstreamTimeout, held);
        }
    };
    let (mut parts, body) = upstream.into_parts();
    let length = parts.headers.get(CONTENT_LENGTH).cloned();
    let named = connection_named(
        parts
            .headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok()),
    );
    let keep: Vec<bool> = parts
        .headers
        .iter()
        .map(|(k, _)| rules.forwards_response_header(k.as_str(), &named))
        .collect();
    if keep.iter().any(|k| !k) {
        let all = std::mem::take(&mut parts.headers);
        for ((name, value), keep) in all.iter().zip(keep) {
            if keep {
                parts.headers.append(name.clone(), value.clone());
            }
        }
    }
    add_headers(&mut parts.headers, &quota_headers);
    let body = if has_body(method.as_str(), parts.status.as_u16()) {
        ProxyBody::upstream(body, held)
    } else {
        // no body to frame: the length a HEAD or 304 describes is the upstream's
        if let Some(len) = length {
            parts.headers.insert(CONTENT_LENGTH, len);
        }
        ProxyBody::full(Bytes::new(), held)
    };
    Response::from_parts(parts, body)
}
