//! The native host of the pipeline: an HTTP/1.1 server (hyper, through the
//! hardened loop of [`server`]) that gates every request with [`Pipeline::gate`]
//! and proxies the admitted ones to one upstream with hyper's client (pooled,
//! kept-alive connections). For local runs, as a sidecar in front of internal
//! services, and for load tests.
//!
//! What a client can observe of the proxying is [`crate::proxy`]'s rules, shared
//! with the Worker; this module is only their I/O.

pub mod body;
pub mod idle_poll;
pub mod server;
pub mod upstream;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use floodgate_shared::time::SystemClock;
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, HeaderName, HeaderValue};
use hyper::http::request::Parts;
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;

use self::body::{BodyFault, Held, ProxyBody, RequestBody};
use self::server::{Connection, ServerLimits};
use self::upstream::{Pool, UpBody};
use crate::exchange::{self, Exchange, HeaderList, Subject};
use crate::forward_auth::ForwardAuth;
use crate::metrics::{EdgeMetrics, InstanceState, UpstreamAnswer};
use crate::pipeline::{Admit, Pipeline, Reply, Task};
use crate::proxy::{METRICS_PATH, ProxyRules, Refusal, has_body};
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
    /// block lists, such as `cf-ipcountry` behind Cloudflare (lower case).
    pub country_header: Option<String>,
    /// How long the event loop polls without a store reply before it sleeps
    /// ([`idle_poll`]; zero: it sleeps at once).
    pub idle_poll: std::time::Duration,
}

impl HostConfig {
    pub fn new(upstream: &str) -> Self {
        Self {
            rules: ProxyRules::new(upstream),
            server: ServerLimits::default(),
            limiter: true,
            forward_auth: None,
            country_header: None,
            idle_poll: idle_poll::DEFAULT_BUDGET,
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

/// The names the edge sets or reads on every request or response: made once, at
/// compile time, so setting or finding one neither parses nor allocates
/// ([`header_name`]).
static KNOWN_NAMES: [HeaderName; 15] = [
    HeaderName::from_static("x-ratelimit-limit"),
    HeaderName::from_static("x-ratelimit-remaining"),
    HeaderName::from_static("x-ratelimit-reset"),
    hyper::header::RETRY_AFTER,
    HeaderName::from_static("ratelimit-policy"),
    HeaderName::from_static("ratelimit"),
    HeaderName::from_static(crate::proxy::REQUEST_ID_HEADER),
    HeaderName::from_static(floodgate_shared::contract::IDENTITY_HEADER),
    HeaderName::from_static(floodgate_shared::contract::KEY_IDENTITY_HEADER),
    HeaderName::from_static("x-forwarded-for"),
    HeaderName::from_static("x-ratelimit-degraded"),
    hyper::header::CONNECTION,
    CONTENT_LENGTH,
    hyper::header::USER_AGENT,
    hyper::header::AUTHORIZATION,
];

/// One of [`KNOWN_NAMES`], in any case, without parsing: lower-cased on the
/// stack and matched (a test checks the texts here against the table).
fn known_name(name: &str) -> Option<&'static HeaderName> {
    // most names come in lower case already: matched as they are
    if let Some(i) = known_index(name.as_bytes()) {
        return Some(&KNOWN_NAMES[i]);
    }
    let mut lower = [0u8; 24];
    let bytes = name.as_bytes();
    if !bytes.iter().any(u8::is_ascii_uppercase) {
        return None;
    }
    let lower = lower.get_mut(..bytes.len())?;
    for (l, b) in lower.iter_mut().zip(bytes) {
        *l = b.to_ascii_lowercase();
    }
    known_index(lower).map(|i| &KNOWN_NAMES[i])
}

/// The place in [`KNOWN_NAMES`] of the lower-case name `lower`.
fn known_index(lower: &[u8]) -> Option<usize> {
    let i = match lower {
        b"x-ratelimit-limit" => 0,
        b"x-ratelimit-remaining" => 1,
        b"x-ratelimit-reset" => 2,
        b"retry-after" => 3,
        b"ratelimit-policy" => 4,
        b"ratelimit" => 5,
        b"x-request-id" => 6,
        b"x-floodgate-key-id" => 7,
        b"x-floodgate-identity" => 8,
        b"x-forwarded-for" => 9,
        b"x-ratelimit-degraded" => 10,
        b"connection" => 11,
        b"content-length" => 12,
        b"user-agent" => 13,
        b"authorization" => 14,
        _ => return None,
    };
    Some(i)
}

/// `name` as a header name: a known one without parsing, another by parsing
/// it; `None` when it is not a valid name.
fn header_name(name: &str) -> Option<HeaderName> {
    match known_name(name) {
        Some(known) => Some(known.clone()),
        None => HeaderName::from_bytes(name.as_bytes()).ok(),
    }
}

/// hyper's header map as the exchange reads and writes it.
impl HeaderList for HeaderMap {
    fn each(&self, f: &mut dyn FnMut(&str, &[u8])) {
        for (k, v) in self {
            f(k.as_str(), v.as_bytes());
        }
    }

    fn first(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        match known_name(name) {
            Some(known) => self.get(known),
            None => self.get(name),
        }
        .map(|v| Cow::Borrowed(v.as_bytes()))
    }

    fn with_capacity(n: usize) -> Self {
        HeaderMap::with_capacity(n)
    }

    fn copy_from(&mut self, from: &Self, keep: &mut dyn FnMut(&str) -> bool) {
        for (name, value) in from {
            if keep(name.as_str()) {
                self.append(name.clone(), value.clone());
            }
        }
    }

    fn retain(&mut self, keep: &mut dyn FnMut(&str) -> bool) {
        // the usual case, none or a few names refused (content-length, always):
        // removed by name, without allocating or rebuilding the map (which may
        // reorder different names, whose order carries no meaning)
        let mut refused: [Option<HeaderName>; 4] = Default::default();
        let mut n = 0;
        for k in self.keys() {
            if !keep(k.as_str()) {
                if n == refused.len() {
                    n += 1;
                    break;
                }
                refused[n] = Some(k.clone());
                n += 1;
            }
        }
        if n <= refused.len() {
            for name in refused.iter().flatten() {
                self.remove(name);
            }
            return;
        }
        // rebuilt in order, moving the values (a name's first value carries it)
        let all = std::mem::take(self);
        self.reserve(all.len());
        let mut current: Option<HeaderName> = None;
        for (name, value) in all {
            if let Some(name) = name {
                current = keep(name.as_str()).then_some(name);
            }
            if let Some(name) = &current {
                self.append(name.clone(), value);
            }
        }
    }

    fn set(&mut self, name: &str, value: &str) {
        // one copy either way: here, or `HeaderValue::from_str`'s
        self.set_owned(name, value.to_owned());
    }

    fn set_owned(&mut self, name: &str, value: String) {
        let value = HeaderValue::from_maybe_shared(Bytes::from(value));
        if let (Some(k), Ok(v)) = (header_name(name), value) {
            self.insert(k, v);
        }
    }

    fn texts(&self, name: &str) -> Vec<String> {
        match known_name(name) {
            Some(known) => self.get_all(known),
            None => self.get_all(name),
        }
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_string)
        .collect()
    }

    fn size(&self) -> (usize, usize) {
        let bytes = self.iter().map(|(k, v)| k.as_str().len() + v.len()).sum();
        (self.len(), bytes)
    }
}

/// A running native host: the pipeline, the rules, the upstream's connections.
pub struct Host {
    pipeline: Pipeline<NativeStore, SystemClock>,
    config: HostConfig,
    country_header: Option<HeaderName>,
    upstream: Pool,
    /// The upstream URL's path (without a trailing `/`), put before each
    /// request's path and query.
    base_path: String,
    /// Served at [`METRICS_PATH`].
    metrics: EdgeMetrics,
    /// The upstream request's `Host`, made once ([`host_header`]).
    upstream_host: Option<HeaderValue>,
    /// How the host waited for its store calls ([`idle_poll`]).
    polls: Arc<idle_poll::PollStats>,
}

/// The `Host` hyper's client gives a request to `uri` when it has none (the
/// host, and the port unless the scheme's default): made once for the upstream
/// rather than formatted on every request.
fn host_header(uri: &hyper::Uri) -> Option<HeaderValue> {
    let host = uri.host()?;
    let default = match uri.scheme_str() {
        Some("https") => 443,
        _ => 80,
    };
    match uri.port_u16().filter(|p| *p != default) {
        Some(port) => HeaderValue::from_str(&format!("{host}:{port}")).ok(),
        None => HeaderValue::from_str(host).ok(),
    }
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
        let rules = &config.rules;
        for name in [
            &rules.identity_header,
            &rules.key_header,
            &rules.key_identity_header,
            &rules.key_meta_header,
        ] {
            header(name)?;
        }
        let metrics = EdgeMetrics::default();
        let base = rules.target("/").parse::<hyper::Uri>().ok();
        let upstream_host = base.as_ref().and_then(host_header);
        let origin = base
            .as_ref()
            .and_then(|b| {
                let mut parts = hyper::http::uri::Parts::default();
                parts.scheme = b.scheme().cloned();
                parts.authority = b.authority().cloned();
                parts.path_and_query = Some(hyper::http::uri::PathAndQuery::from_static("/"));
                hyper::Uri::from_parts(parts).ok()
            })
            .unwrap_or_default();
        let base_path = base.map_or_else(String::new, |b| b.path().trim_end_matches('/').into());
        let host = Arc::new(Self {
            upstream_host,
            polls: Arc::default(),
            country_header: config.country_header.as_deref().map(header).transpose()?,
            pipeline: pipeline.with_stats_sink(metrics.stats.clone()),
            metrics,
            upstream: Pool::new(connector(), origin, 1024, Duration::from_secs(60)),
            base_path,
            config,
        });
        host.flush_stats_periodically();
        Ok(host)
    }

    /// The traffic counters, written off the request path as often as the
    /// pipeline's flush interval allows; the task ends once the host is gone.
    fn flush_stats_periodically(self: &Arc<Self>) {
        let every = Duration::from_micros(self.pipeline.settings().stats_flush_every.max(1) as u64);
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(host) = weak.upgrade() else { return };
                if host.config.limiter {
                    let _ = host.pipeline.flush_stats().await;
                }
            }
        });
    }

    pub fn pipeline(&self) -> &Pipeline<NativeStore, SystemClock> {
        &self.pipeline
    }

    fn exchange(&self) -> Exchange<'_, NativeStore, SystemClock> {
        Exchange {
            pipeline: &self.pipeline,
            rules: &self.config.rules,
            limiter: self.config.limiter,
        }
    }

    /// The Prometheus text served at [`METRICS_PATH`]: answered from memory, so a
    /// scrape during a store outage answers too (with the breaker open in it).
    pub fn metrics_text(&self) -> String {
        self.pipeline.settle_stats();
        self.metrics.scrape(&InstanceState {
            health: self.pipeline.health(),
            breakers: self.pipeline.breakers(),
            key_cache: self.pipeline.key_cache(),
            limiter: self.config.limiter,
            idle_poll: self.polls.counts(),
        })
    }
}

/// Serves `host` on `listener` until `shutdown` completes, then drains (see
/// [`server::serve`]: every answer then says `Connection: close`, and the health
/// answer says `draining`) and stops: the pipeline hands its leases back and
/// writes its pending counts ([`Pipeline::stop`], within [`STOP_LIMIT`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    host: Arc<Host>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let limits = host.config.server;
    let calls = host.pipeline.calls_out();
    let poller = tokio::spawn(idle_poll::run(
        calls,
        host.config.idle_poll,
        host.polls.clone(),
    ));
    let stopping = host.clone();
    let shutdown = async move {
        shutdown.await;
        stopping.pipeline.start_draining();
        tracing::info!(
            drain_ms = limits.drain.as_millis() as u64,
            "floodgate-edge: stopping: no new connections; requests on open ones are answered for {} ms, with Connection: close",
            limits.drain.as_millis()
        );
    };
    let serving = host.clone();
    let served = server::serve(
        listener,
        limits,
        move |peer, conn| {
            let host = serving.clone();
            hyper::service::service_fn(move |req| {
                let host = host.clone();
                let conn = conn.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(host, peer, conn, req).await) }
            })
        },
        shutdown,
    )
    .await;
    // as the server stops its connection reaper
    poller.abort();
    if host.config.limiter {
        host.pipeline.stop(STOP_LIMIT).await;
    }
    served
}

/// The longest a stopping host waits for its last store calls (its leases handed
/// back, its pending counts written).
pub const STOP_LIMIT: Duration = Duration::from_secs(2);

/// Holds the release of a request's in-flight slots; dropping it runs the release
/// (in a spawned task). It lives as long as the response: until its body is
/// streamed out, or the client goes away, or the request ends early.
pub struct SlotGuard(Option<Task>);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let Some(release) = self.0.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(release);
        }
    }
}

fn spawn_all(tasks: Vec<Task>) {
    for t in tasks {
        tokio::spawn(t);
    }
}

/// The host's own answer, holding `held` until written.
fn answer(reply: Reply, held: Held) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::full(reply.body, held));
    *resp.status_mut() =
        StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    add_headers(resp.headers_mut(), &reply.headers);
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

/// The request as the exchange sees it: in forward-auth mode, the limits apply to
/// the original request the gateway describes.
fn incoming<'r>(
    host: &Host,
    parts: &'r Parts,
    peer: SocketAddr,
) -> exchange::Incoming<'r, HeaderMap> {
    let country = host
        .country_header
        .as_ref()
        .and_then(|h| parts.headers.get(h))
        .and_then(|v| v.to_str().ok());
    let path = parts.uri.path();
    let subject = match &host.config.forward_auth {
        None => Subject::of(path, Some(peer.ip())),
        Some(mode) => {
            let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            mode.original(parts.method.as_str(), target, |name| {
                parts.headers.get(name).map(HeaderValue::as_bytes)
            })
            .map(|o| Subject {
                path: o.path,
                client_ip: o.client_ip,
            })
            .map_err(|e| e.answer())
        }
    };
    exchange::Incoming {
        own_path: path,
        query_len: parts.uri.query().map_or(0, str::len),
        headers: &parts.headers,
        client_ip: Some(peer.ip()),
        country,
        subject,
    }
}

/// Most bytes of an unread request body read out (and dropped) after an early
/// answer; a client sending more gets its connection closed.
const LINGER_MAX: u64 = 64 * 1024 * 1024;

/// Reads out a request body nobody will use, in the background, bounded in bytes
/// and by `pause` between its parts (nginx's lingering close): closing a
/// connection with unread data resets it, and the client may lose the answer.
/// (floodgate-rest's answers behind an early 413 too.)
pub fn linger<B>(body: B, pause: Duration)
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Send,
{
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
                Ok(Some(Ok(f))) => {
                    read += f.data_ref().map_or(0, |d| bytes::Buf::remaining(d) as u64)
                }
                _ => return,
            }
        }
    });
}

/// One request, in its scope (`request_id`: every event logged while deciding
/// and proxying it is in its `request` span); at `debug`, one event when its
/// answer's head is out.
async fn handle(
    host: Arc<Host>,
    peer: SocketAddr,
    conn: Connection,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    use crate::pipeline::events::{LogEvent, scope, trace};
    let id = exchange::client_request_id(req.headers(), rand::random);
    let scoped = id.clone();
    scope::InRequest::new(scoped, async move {
        let method = req.method().clone();
        let started = std::time::Instant::now();
        let resp = proxied(host, peer, conn, req, &id).await;
        trace(&LogEvent::Answered {
            method: method.as_str(),
            status: resp.status().as_u16(),
            latency_us: started.elapsed().as_micros() as u64,
        });
        resp
    })
    .await
}

/// Decides the request, then answers it, proxies it, or (forward-auth) admits it.
async fn proxied(
    host: Arc<Host>,
    peer: SocketAddr,
    conn: Connection,
    req: Request<Incoming>,
    request_id: &str,
) -> Response<ProxyBody> {
    let held = Held {
        in_flight: Some(conn.in_flight()),
        slots: None,
    };
    let (mut parts, body) = req.into_parts();
    let pause = host.config.rules.timeouts.body;
    if parts.uri.path() == METRICS_PATH {
        linger(body, pause);
        let text = host.metrics_text();
        return answer(Reply::uncached(crate::metrics::CONTENT_TYPE, text), held);
    }
    let req = incoming(&host, &parts, peer);
    let mut later = vec![];
    let decided = host.exchange().decide(&req, &mut later).await;
    spawn_all(later);
    let mut admit = match decided {
        Ok(admit) => admit,
        Err(reply) => {
            // answered without reading the body: read it out behind the answer, so
            // the client sees the answer rather than a reset
            linger(body, pause);
            return answer(reply, held);
        }
    };
    let held = Held {
        slots: Some(SlotGuard(host.exchange().release(&mut admit))),
        ..held
    };
    if host.config.forward_auth.is_some() {
        linger(body, pause);
        return admitted_auth(&host, &admit, held);
    }
    let client_ip = req.client_ip;
    forward(
        &host, &mut parts, body, client_ip, &mut admit, held, request_id,
    )
    .await
}

/// Forward-auth's admission: the gateway proxies, with the quota headers and the
/// caller's key id, identity and metadata to copy upstream (the slots, if any, are given back once this answer
/// is written).
fn admitted_auth(host: &Host, admit: &Admit, held: Held) -> Response<ProxyBody> {
    let mut r = Response::new(ProxyBody::full(Bytes::new(), held));
    add_headers(r.headers_mut(), &admit.headers);
    // always sent, empty for a caller forwarded without an identity (fail-open
    // while keys cannot be verified): a gateway copying it then replaces any
    // client-sent value (Caddy 2.6 keeps the client's when it is absent)
    let id = admit.key_id.as_deref().unwrap_or_default();
    r.headers_mut().set(&host.config.rules.identity_header, id);
    // the key's identity and metadata likewise: empty when the key has none
    let identity = admit.identity.as_deref().unwrap_or_default();
    r.headers_mut()
        .set(&host.config.rules.key_identity_header, identity);
    let meta = admit.key_meta.as_deref().unwrap_or_default();
    r.headers_mut()
        .set(&host.config.rules.key_meta_header, meta);
    r
}

/// Sends the admitted request upstream and streams its answer back with the
/// quota headers.
async fn forward(
    host: &Host,
    parts: &mut Parts,
    body: Incoming,
    client_ip: Option<std::net::IpAddr>,
    admit: &mut Admit,
    held: Held,
    request_id: &str,
) -> Response<ProxyBody> {
    let Some(uri) = origin_form(&host.base_path, &parts.uri) else {
        return refusal(Refusal::UpstreamUnavailable, held);
    };
    let mut headers = std::mem::take(&mut parts.headers);
    host.exchange()
        .upstream_headers_in_place(&mut headers, client_ip, admit, request_id);
    let fault = Arc::new(BodyFault::default());
    // a client that leaves while the upstream has not answered cancels the
    // upstream request, and its slots are given back (`held` is dropped)
    let watched = held
        .in_flight
        .as_ref()
        .filter(|_| hyper::body::Body::is_end_stream(&body));
    let answered = upstream_request(host, parts, uri, headers, body, &fault, watched).await;
    let (upstream, lease) = match answered {
        Some(Ok(r)) => r,
        Some(Err(r)) => return refusal(r, held),
        None => {
            crate::pipeline::events::scope::logged(|| {
                tracing::info!(
                    target: "floodgate::request",
                    "the client left before the upstream answered: the upstream request is cancelled"
                )
            });
            return refusal(Refusal::ClientGone, held);
        }
    };
    let (mut out, body) = upstream.into_parts();
    let length = out.headers.get(CONTENT_LENGTH).cloned();
    host.exchange().response_headers(&mut out.headers, admit);
    let body = if has_body(parts.method.as_str(), out.status.as_u16()) {
        ProxyBody::upstream(body, lease, held)
    } else {
        // no body to frame: the length a HEAD or 304 describes is the upstream's
        if let Some(len) = length {
            out.headers.insert(CONTENT_LENGTH, len);
        }
        let mut lease = lease;
        lease.finished_if_ended(&body);
        ProxyBody::full(Bytes::new(), held)
    };
    Response::from_parts(out, body)
}

/// The upstream request's target in origin form: the upstream URL's path, then
/// the request's path and query (`None`: not a valid target).
fn origin_form(base_path: &str, uri: &hyper::Uri) -> Option<hyper::Uri> {
    let pq = uri.path_and_query().map_or("/", |p| p.as_str());
    if base_path.is_empty() {
        return match uri.path_and_query() {
            Some(p) if p.as_str().starts_with('/') => Some(hyper::Uri::from(p.clone())),
            Some(_) => None,
            None => Some(hyper::Uri::from_static("/")),
        };
    }
    format!("{base_path}{pq}").parse().ok()
}

/// The upstream's response head, or what to answer instead (the client's body
/// failed the request, the upstream failed or did not answer in time); counted
/// in the metrics. `None`: the client of a request without a body (`watched`)
/// left while the upstream had not answered.
async fn upstream_request(
    host: &Host,
    parts: &Parts,
    uri: hyper::Uri,
    headers: HeaderMap,
    body: Incoming,
    fault: &Arc<BodyFault>,
    watched: Option<&server::InFlight>,
) -> Option<Result<(Response<Incoming>, upstream::Lease), Refusal>> {
    let up = upstream_message(host, parts, uri, headers, body, fault);
    let sent_at = tokio::time::Instant::now();
    let sent = awaited(host, host.upstream.send(up), sent_at, watched).await?;
    Some(upstream_outcome(host, sent, fault, sent_at.elapsed()))
}

/// The request the upstream is sent: the client's method, the target, the
/// headers made for it (with the upstream's `Host`), and the client's body read
/// within the limits (or none).
fn upstream_message(
    host: &Host,
    parts: &Parts,
    uri: hyper::Uri,
    mut headers: HeaderMap,
    body: Incoming,
    fault: &Arc<BodyFault>,
) -> Request<UpBody> {
    let rules = &host.config.rules;
    if let Some(h) = &host.upstream_host {
        headers.insert(hyper::header::HOST, h.clone());
    }
    let body = if hyper::body::Body::is_end_stream(&body) {
        UpBody::Empty(http_body_util::Empty::new())
    } else {
        UpBody::Client(RequestBody::new(
            body,
            rules.limits.max_body,
            rules.timeouts.body,
            fault.clone(),
        ))
    };
    let mut up = Request::new(body);
    *up.method_mut() = parts.method.clone();
    *up.uri_mut() = uri;
    *up.headers_mut() = headers;
    up
}

/// Waits for the upstream's answer `send`, sent at `sent_at`, until the upstream
/// deadline (`Some(None)`: it passed). `None`: the client of a request without a
/// body (`watched`) left first — watched for from [`server::WATCH_AFTER`] into
/// the wait on, by the same timer that bounds the wait (one timer per request).
async fn awaited<T>(
    host: &Host,
    send: impl Future<Output = T>,
    sent_at: tokio::time::Instant,
    watched: Option<&server::InFlight>,
) -> Option<Option<T>> {
    let deadline = sent_at + host.config.rules.timeouts.upstream;
    let watch_at = sent_at + server::WATCH_AFTER;
    let timer = tokio::time::sleep_until(match watched {
        Some(_) => watch_at.min(deadline),
        None => deadline,
    });
    tokio::pin!(timer);
    tokio::pin!(send);
    let mut gone = None;
    loop {
        tokio::select! {
            r = &mut send => return Some(Some(r)),
            () = &mut timer => match watched {
                Some(f) if gone.is_none() && tokio::time::Instant::now() < deadline => {
                    gone = Some(Box::pin(f.gone()));
                    timer.as_mut().reset(deadline);
                }
                _ => return Some(None),
            },
            () = async { gone.as_mut().expect("watching").await }, if gone.is_some() => return None,
        }
    }
}

/// What the upstream's answer (`None`: none within the deadline) means for the
/// client, counted in the metrics and logged when the upstream failed.
fn upstream_outcome(
    host: &Host,
    sent: Option<Result<(Response<Incoming>, upstream::Lease), upstream::UpstreamError>>,
    fault: &BodyFault,
    took: Duration,
) -> Result<(Response<Incoming>, upstream::Lease), Refusal> {
    let took = took.as_secs_f64();
    match sent {
        Some(Ok(r)) => {
            host.metrics
                .upstream(UpstreamAnswer::Status(r.0.status().as_u16()), took);
            Ok(r)
        }
        // the client's body failed it, not the upstream
        Some(Err(_)) | None if fault.get().is_some() => Err(fault.get().expect("set")),
        Some(Err(e)) => {
            host.metrics.upstream(UpstreamAnswer::Error, took);
            crate::pipeline::events::scope::logged(
                || tracing::warn!(target: "floodgate::request", error = %e, "upstream unavailable: {e}"),
            );
            Err(Refusal::UpstreamUnavailable)
        }
        None => {
            host.metrics.upstream(UpstreamAnswer::Timeout, took);
            crate::pipeline::events::scope::logged(|| {
                tracing::warn!(
                    target: "floodgate::request",
                    timeout_ms = host.config.rules.timeouts.upstream.as_millis() as u64,
                    "upstream timeout"
                )
            });
            Err(Refusal::UpstreamTimeout)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use floodgate_shared::contract;

    #[test]
    fn the_upstream_target_is_the_base_path_then_the_requests() {
        let uri = |s: &str| s.parse::<hyper::Uri>().unwrap();
        let cases = [
            ("", "/v1/items?q=1", Some("/v1/items?q=1")),
            ("", "http://edge.example/v1?x", Some("/v1?x")),
            ("", "http://edge.example", Some("/")),
            ("", "*", None),
            ("/api", "/v1/items?q=1", Some("/api/v1/items?q=1")),
            ("/api", "/", Some("/api/")),
        ];
        for (base, request, target) in cases {
            let got = origin_form(base, &uri(request)).map(|u| u.to_string());
            assert_eq!(got.as_deref(), target, "{base} + {request}");
        }
    }

    #[test]
    fn the_names_set_on_every_answer_are_known_and_equal_to_parsed_ones() {
        for name in [
            contract::LIMIT,
            contract::REMAINING,
            contract::RESET,
            contract::RETRY_AFTER,
            contract::IETF_POLICY,
            contract::IETF_RATELIMIT,
            crate::pipeline::DEGRADED_HEADER,
            crate::proxy::REQUEST_ID_HEADER,
            contract::IDENTITY_HEADER,
            contract::KEY_IDENTITY_HEADER,
            "X-Forwarded-For",
            "Connection",
            "Content-Length",
            "User-Agent",
            "Authorization",
        ] {
            let lower = name.to_ascii_lowercase();
            assert!(
                KNOWN_NAMES.iter().any(|n| n.as_str() == lower),
                "{name} is not in KNOWN_NAMES"
            );
            assert_eq!(
                header_name(name),
                Some(HeaderName::from_bytes(name.as_bytes()).unwrap())
            );
        }
        assert_eq!(
            header_name("X-Custom-Identity"),
            Some(HeaderName::from_static("x-custom-identity"))
        );
        assert_eq!(header_name("bad name"), None);
        for (i, known) in KNOWN_NAMES.iter().enumerate() {
            let upper = known.as_str().to_ascii_uppercase();
            assert_eq!(known_name(known.as_str()), Some(known), "entry {i}");
            assert_eq!(known_name(&upper), Some(known), "entry {i}");
        }
        assert_eq!(known_name("x-ratelimit-limits"), None);
        assert_eq!(known_name(&"x".repeat(100)), None);
    }

    #[test]
    fn the_upstream_host_is_what_hypers_client_would_set() {
        for (url, want) in [
            ("http://127.0.0.1:9000/", "127.0.0.1:9000"),
            ("http://api.example.com:80/", "api.example.com"),
            ("https://api.example.com:443/", "api.example.com"),
            ("https://api.example.com:80/", "api.example.com:80"),
            ("http://[::1]:8080/", "[::1]:8080"),
            ("http://api.example.com/base/", "api.example.com"),
        ] {
            let got = host_header(&url.parse().unwrap());
            assert_eq!(
                got.as_ref().map(|v| v.to_str().unwrap()),
                Some(want),
                "{url}"
            );
        }
    }

    #[test]
    fn an_owned_value_is_set_like_a_borrowed_one() {
        let (mut owned, mut borrowed) = (HeaderMap::new(), HeaderMap::new());
        for h in [&mut owned, &mut borrowed] {
            h.append("x-ratelimit-limit", HeaderValue::from_static("forged"));
            h.append("x-ratelimit-limit", HeaderValue::from_static("twice"));
        }
        for (name, value) in [
            ("X-RateLimit-Limit", "100"),
            ("X-Custom", "a b"),
            ("X-Bad-Value", "line\nbreak"),
            ("bad name", "1"),
        ] {
            owned.set_owned(name, value.to_string());
            borrowed.set(name, value);
        }
        assert_eq!(owned, borrowed);
        assert_eq!(
            owned
                .get_all("x-ratelimit-limit")
                .iter()
                .collect::<Vec<_>>(),
            ["100"],
            "replaces every value it had"
        );
        assert_eq!(owned.get("x-custom").unwrap(), "a b");
        assert!(owned.get("x-bad-value").is_none(), "not a header value");
        assert_eq!(owned.len(), 2);
    }

    #[test]
    fn retain_keeps_order_and_values_and_drops_what_it_refuses() {
        let mut h = HeaderMap::new();
        for (k, v) in [("a", "1"), ("b", "2"), ("a", "3"), ("c", "4")] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let all = h.clone();
        h.retain(&mut |_| true);
        assert_eq!(h, all);
        h.retain(&mut |k| k != "b");
        let sorted = |h: &HeaderMap| {
            let mut kept: Vec<(String, String)> = h
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
                .collect();
            kept.sort();
            kept
        };
        let want = [("a", "1"), ("a", "3"), ("c", "4")].map(|(k, v)| (k.into(), v.into()));
        assert_eq!(sorted(&h), want);
        assert_eq!(
            h.get_all("a").iter().collect::<Vec<_>>(),
            ["1", "3"],
            "a name's values in order"
        );
        // more refused names than the fast path holds: the same result
        let mut many = HeaderMap::new();
        for i in 0..12 {
            let v = HeaderValue::from_str(&i.to_string()).unwrap();
            many.append(
                HeaderName::from_bytes(format!("h{}", i % 6).as_bytes()).unwrap(),
                v,
            );
        }
        let mut few = many.clone();
        many.retain(&mut |k| k == "h0");
        few.retain(&mut |k| k != "h1");
        assert_eq!(many.get_all("h0").iter().collect::<Vec<_>>(), ["0", "6"]);
        assert_eq!(many.len(), 2);
        assert_eq!(few.len(), 10);
        assert!(few.get("h1").is_none());
    }
}
