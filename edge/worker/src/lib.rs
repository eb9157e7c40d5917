//! Floodgate's edge in a Cloudflare Worker: wiring only. The decision is the
//! host-free pipeline in `floodgate-edge` over the Upstash REST store; what a
//! client observes of the exchange (the edge's own answers, the headers sent
//! upstream and back) is `floodgate_edge::exchange`, shared with the native host.
//! This file is their I/O through workerd's `fetch`.
//!
//! Bindings (wrangler.toml): secrets `UPSTASH_REDIS_REST_URL`,
//! `UPSTASH_REDIS_REST_TOKEN`; var `UPSTREAM_URL`. Every other setting is one of
//! `floodgate_edge::settings::EdgeSettings` — the native host's flag variable
//! without `FLOODGATE_` (`DEADLINE_MS`, `CACHE_TTL_MS`, `MAX_BODY_BYTES`, …), with
//! the same default, bounds and meaning, parsed by the same code; an invalid one
//! makes every answer a 500 naming it. `LOG_LEVEL` (error, warn, info, debug,
//! trace; default info; `debug` adds one line per answered request): breaker
//! transitions and configuration loads go to the console log as JSON lines, each
//! with the id of the request it happened in (`span.request_id`: the client's
//! `X-Request-Id` when well-formed, else a new one; passed upstream as
//! `X-Request-Id`, like the native host).
//!
//! Regional tallies (bounded consistency): `REGIONAL_REST_URLS`, a JSON object from a
//! region name to the REST URL of that region's Upstash database, and the secret
//! `REGIONAL_REST_TOKENS`, the same keys to their tokens. An isolate's region is the
//! request's `cf.continent` (`EU`, `NA`, `AS`, `OC`, `SA`, `AF`, `AN`), or `REGION`
//! when set (or when Cloudflare gives none); a region without a URL uses instance
//! leases only.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};

use floodgate_edge::exchange::{self, Exchange, HeaderList, Incoming, Subject};
use floodgate_edge::pipeline::events::{self, Level, LogEvent};
use floodgate_edge::pipeline::{Admit, Pipeline, Reply, Task, transport_deadline};
use floodgate_edge::proxy::{ProxyRules, REQUEST_ID_HEADER, Refusal, has_body};
use floodgate_edge::settings::{EdgeSettings, LogLevel, Protocol};
use floodgate_edge::store::rest::RestStore;
use floodgate_edge::timer::{Raced, race};
use floodgate_shared::time::{Clock, Micros};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::Closure;
use worker::{
    AbortController, Context, Env, Fetch, Headers, Method, Request, RequestInit, Response,
    ResponseBuilder, Result, event,
};

/// `Date.now()`: `SystemTime::now` panics in wasm32.
struct WorkerClock;

impl Clock for WorkerClock {
    fn now(&self) -> Micros {
        (worker::Date::now().as_millis() as i64) * 1000
    }
}

type EdgePipeline = Pipeline<RestStore, WorkerClock>;

/// One per isolate, so its caches, breaker and recent 429s outlive a request.
struct Edge {
    pipeline: EdgePipeline,
    rules: ProxyRules,
}

impl Edge {
    fn exchange(&self) -> Exchange<'_, RestStore, WorkerClock> {
        Exchange {
            pipeline: &self.pipeline,
            rules: &self.rules,
            limiter: true,
        }
    }
}

thread_local! {
    static EDGE: RefCell<Option<Rc<Edge>>> = const { RefCell::new(None) };
    /// The id of the request whose future is being polled (see [`InRequest`]).
    static REQUEST_ID: RefCell<Option<Rc<str>>> = const { RefCell::new(None) };
    /// `LOG_LEVEL`: the most detailed events logged.
    static LOG_LEVEL: Cell<LogLevel> = const { Cell::new(LogLevel::Info) };
}

/// A request's future (or one of its `wait_until` tasks) with the request's id
/// current while it is polled: an isolate interleaves requests at every await, so
/// the id is set on each poll and restored after it, like a task-local. What the
/// pipeline logs meanwhile carries the id.
struct InRequest<F: Future> {
    id: Rc<str>,
    inner: Pin<Box<F>>,
}

impl<F: Future> InRequest<F> {
    fn new(id: Rc<str>, inner: F) -> Self {
        Self {
            id,
            inner: Box::pin(inner),
        }
    }
}

impl<F: Future> Future for InRequest<F> {
    type Output = F::Output;
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let outer = REQUEST_ID.with(|r| r.replace(Some(this.id.clone())));
        let out = this.inner.as_mut().poll(cx);
        REQUEST_ID.with(|r| *r.borrow_mut() = outer);
        out
    }
}

/// workerd's `Headers` as the exchange reads and writes them.
struct WorkerHeaders(Headers);

impl HeaderList for WorkerHeaders {
    fn each(&self, f: &mut dyn FnMut(&str, &[u8])) {
        for (k, v) in self.0.entries() {
            f(&k, v.as_bytes());
        }
    }

    fn first(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.0
            .get(name)
            .ok()
            .flatten()
            .map(|v| Cow::Owned(v.into_bytes()))
    }

    fn with_capacity(_: usize) -> Self {
        WorkerHeaders(Headers::new())
    }

    fn copy_from(&mut self, from: &Self, keep: &mut dyn FnMut(&str) -> bool) {
        for (k, v) in from.0.entries() {
            if keep(&k) {
                let _ = self.0.append(&k, &v);
            }
        }
    }

    fn retain(&mut self, keep: &mut dyn FnMut(&str) -> bool) {
        let dropped: Vec<String> = self.0.keys().filter(|k| !keep(k)).collect();
        for k in dropped {
            let _ = self.0.delete(&k);
        }
    }

    fn set(&mut self, name: &str, value: &str) {
        let _ = self.0.set(name, value);
    }
}

/// 128 bits for a new request id (`Math.random`: ids need to be unique, not secret).
fn fresh_id() -> u128 {
    let word = || (worker::js_sys::Math::random() * 4_294_967_296.0) as u128;
    (word() << 96) | (word() << 64) | (word() << 32) | word()
}

fn var(env: &Env, name: &str) -> Option<String> {
    env.var(name)
        .ok()
        .map(|v| v.to_string())
        .or_else(|| env.secret(name).ok().map(|v| v.to_string()))
}

/// The regional store of `region`, from `REGIONAL_REST_URLS` and
/// `REGIONAL_REST_TOKENS`.
fn regional_store(
    env: &Env,
    region: &str,
    deadline: std::time::Duration,
) -> std::result::Result<Option<RestStore>, String> {
    let Some(urls) = var(env, "REGIONAL_REST_URLS") else {
        return Ok(None);
    };
    let urls: std::collections::HashMap<String, String> = serde_json::from_str(&urls)
        .map_err(|e| format!("REGIONAL_REST_URLS must be a JSON object of region to URL: {e}"))?;
    let Some(url) = urls.get(region) else {
        return Ok(None);
    };
    let tokens: std::collections::HashMap<String, String> = serde_json::from_str(
        &var(env, "REGIONAL_REST_TOKENS").unwrap_or_default(),
    )
    .map_err(|e| format!("REGIONAL_REST_TOKENS must be a JSON object of region to token: {e}"))?;
    let token = tokens
        .get(region)
        .ok_or_else(|| format!("REGIONAL_REST_TOKENS has no token for region {region:?}"))?;
    RestStore::new(url, token, deadline)
        .map(Some)
        .map_err(|e| format!("the regional store of {region:?}: {e}"))
}

/// This isolate's edge, made on its first request.
fn edge(env: &Env, region: Option<String>) -> std::result::Result<Rc<Edge>, String> {
    if let Some(e) = EDGE.with(|e| e.borrow().clone()) {
        return Ok(e);
    }
    let upstream = var(env, "UPSTREAM_URL").ok_or("UPSTREAM_URL is not set")?;
    let url = var(env, "UPSTASH_REDIS_REST_URL").ok_or("UPSTASH_REDIS_REST_URL is not set")?;
    let token =
        var(env, "UPSTASH_REDIS_REST_TOKEN").ok_or("UPSTASH_REDIS_REST_TOKEN is not set")?;
    let settings = EdgeSettings::from_lookup(|name| var(env, name))?;
    let level = match var(env, "LOG_LEVEL") {
        None => LogLevel::default(),
        Some(v) => LogLevel::parse(&v).map_err(|e| format!("LOG_LEVEL: {e}"))?,
    };
    LOG_LEVEL.with(|l| l.set(level));
    let mut config = settings.pipeline(Protocol::Rest);
    config.log = console_log;
    let transport = transport_deadline(&config.deadline);
    let store = RestStore::new(&url, &token, transport).map_err(|e| e.to_string())?;
    let mut pipeline = Pipeline::new(store, WorkerClock, config);
    let region = var(env, "REGION").or(region);
    if let Some(r) = &region
        && let Some(regional) = regional_store(env, r, transport)?
    {
        pipeline = pipeline.with_regional(regional);
    }
    let e = Rc::new(Edge {
        pipeline,
        rules: settings.rules(&upstream),
    });
    EDGE.with(|slot| *slot.borrow_mut() = Some(e.clone()));
    Ok(e)
}

/// The pipeline's events as JSON lines on the console (what `wrangler tail` and
/// Workers Logs show), shaped like the native host's `--log-format json`.
fn console_log(event: &LogEvent<'_>) {
    let id = REQUEST_ID.with(|r| r.borrow().clone());
    log_line(event, id.as_deref());
}

/// `event` as a JSON line on the console, as part of request `id`, when
/// `LOG_LEVEL` logs events of its level.
fn log_line(event: &LogEvent<'_>, id: Option<&str>) {
    let level = match event.level() {
        Level::Debug => LogLevel::Debug,
        Level::Info => LogLevel::Info,
        Level::Warn => LogLevel::Warn,
    };
    if level > LOG_LEVEL.with(Cell::get) {
        return;
    }
    let now = worker::js_sys::Date::new_0().to_iso_string();
    worker::console_log!("{}", events::json_line(event, &String::from(now), id));
}

/// One of the edge's own answers.
fn answer(reply: Reply) -> Result<Response> {
    let mut r = Response::ok(reply.body)?.with_status(reply.status);
    for (k, v) in reply.headers {
        r.headers_mut().set(k, &v)?;
    }
    Ok(r)
}

/// Each request in its id's scope ([`InRequest`]); at debug, one line once its
/// answer's head is ready.
#[event(fetch)]
async fn fetch(req: Request, env: Env, ctx: Context) -> Result<Response> {
    let client = req.headers().get(REQUEST_ID_HEADER)?;
    let id: Rc<str> = floodgate_edge::proxy::request_id(client.as_deref(), fresh_id).into();
    let method = req.method();
    let started = worker::Date::now().as_millis();
    let scoped = InRequest::new(id.clone(), serve(req, env, ctx, id.clone()));
    let resp = scoped.await;
    let answered = LogEvent::Answered {
        method: method.as_ref(),
        status: resp.as_ref().map_or(500, Response::status_code),
        latency_us: (worker::Date::now().as_millis() - started) * 1_000,
    };
    log_line(&answered, Some(&id));
    resp
}

/// Hands the pipeline's background work to `wait_until`, in the request's scope.
fn later(ctx: &Context, id: &Rc<str>, tasks: impl IntoIterator<Item = Task>) {
    for task in tasks {
        ctx.wait_until(InRequest::new(id.clone(), task));
    }
}

async fn serve(req: Request, env: Env, ctx: Context, id: Rc<str>) -> Result<Response> {
    let continent = req.cf().and_then(|cf| cf.continent());
    let edge = match edge(&env, continent) {
        Ok(e) => e,
        Err(e) => return answer(Reply::json(500, "Floodgate is misconfigured", Some(&e))),
    };
    let url = req.url()?;
    // the same JS object (the client's headers are only read)
    let headers = WorkerHeaders(Headers(req.headers().0.clone()));
    let client_ip = req
        .headers()
        .get("cf-connecting-ip")?
        .and_then(|v| v.parse().ok());
    let country = req.cf().and_then(|cf| cf.country());
    let incoming = Incoming {
        own_path: url.path(),
        query_len: url.query().map_or(0, str::len),
        headers: &headers,
        client_ip,
        country: country.as_deref(),
        subject: Subject::of(url.path(), client_ip),
    };
    let mut tasks = vec![];
    let decided = edge.exchange().decide(&incoming, &mut tasks).await;
    later(&ctx, &id, tasks);
    // the traffic counters: written in one batch at most as often as the flush
    // interval, after the response (waitUntil), never delaying it
    let flusher = edge.clone();
    ctx.wait_until(async move {
        let _ = flusher.pipeline.flush_stats().await;
    });
    let mut admit = match decided {
        Ok(admit) => admit,
        Err(reply) => return answer(reply),
    };
    let release = edge.exchange().release(&mut admit);
    let forwarded = forward(&edge, &ctx, &req, &url, &incoming, &admit, &id).await;
    let resp = match forwarded {
        Ok(r) => r,
        Err(refusal) => {
            later(&ctx, &id, release);
            return answer(refusal.answer());
        }
    };
    respond(&edge, &ctx, &id, resp, &req.method(), &mut admit, release)
}

/// A request body bounded in bytes as it streams (the native host's 413 for a
/// body past `MAX_BODY_BYTES` without a `Content-Length` saying so): piped through
/// a transform that counts each chunk and, once past `max`, aborts the upstream
/// request and errors the stream.
struct BoundedBody {
    readable: web_sys::ReadableStream,
    /// Set when the body went past the limit.
    exceeded: Rc<Cell<bool>>,
}

impl BoundedBody {
    /// The bounded body, and the work that keeps its counter alive until the
    /// client's body has been piped through (or failed): for `wait_until`.
    fn new(
        body: web_sys::ReadableStream,
        max: u64,
        abort: Rc<RefCell<Option<AbortController>>>,
    ) -> Result<(Self, impl Future<Output = ()>)> {
        let js = |e: wasm_bindgen::JsValue| worker::Error::JsError(format!("{e:?}"));
        let exceeded = Rc::new(Cell::new(false));
        let (flag, seen) = (exceeded.clone(), Cell::new(0u64));
        let count = Closure::<dyn FnMut(_, _)>::new(
            move |chunk: wasm_bindgen::JsValue, c: web_sys::TransformStreamDefaultController| {
                let len = chunk
                    .dyn_ref::<worker::js_sys::Uint8Array>()
                    .map_or(0, |a| u64::from(a.length()));
                seen.set(seen.get() + len);
                if seen.get() > max {
                    flag.set(true);
                    if let Some(upstream) = abort.borrow_mut().take() {
                        upstream.abort();
                    }
                    c.error_with_reason(&Refusal::BodyTooLarge.message().into());
                } else {
                    let _ = c.enqueue_with_chunk(&chunk);
                }
            },
        );
        let transformer = worker::js_sys::Object::new();
        worker::js_sys::Reflect::set(&transformer, &"transform".into(), count.as_ref())
            .map_err(js)?;
        let stream = web_sys::TransformStream::new_with_transformer(&transformer).map_err(js)?;
        let piped = wasm_bindgen_futures::JsFuture::from(body.pipe_to(&stream.writable()));
        let done = async move {
            let _ = piped.await;
            drop(count);
        };
        let readable = stream.readable();
        Ok((Self { readable, exceeded }, done))
    }
}

/// Sends the admitted request upstream: its response, or the refusal to answer
/// instead (the body past the limit, the upstream failed or timed out).
async fn forward(
    edge: &Edge,
    ctx: &Context,
    req: &Request,
    url: &worker::Url,
    incoming: &Incoming<'_, WorkerHeaders>,
    admit: &Admit,
    id: &str,
) -> std::result::Result<Response, Refusal> {
    let rules = &edge.rules;
    let out = exchange::upstream_headers(rules, incoming, admit, id);
    let target = rules.target(&format!(
        "{}{}",
        url.path(),
        url.query().map(|q| format!("?{q}")).unwrap_or_default()
    ));
    let method = req.method();
    let mut init = RequestInit::new();
    init.with_method(method.clone()).with_headers(out.0);
    let mut bounded = None;
    // shared with the body's counter: a body past the limit aborts the upstream
    // request mid-body (workerd would otherwise end an errored body as if it were
    // complete: the upstream would take a truncated upload for the whole)
    let controller = Rc::new(RefCell::new(Some(AbortController::default())));
    let signal = controller
        .borrow()
        .as_ref()
        .map(AbortController::signal)
        .expect("set above");
    if !matches!(method, Method::Get | Method::Head)
        && let Some(body) = req.inner().body()
    {
        // a declared length was checked from the head (and the platform holds the
        // body to it): passed on as is, its framing kept; a streamed one is
        // bounded as it flows
        let declared = req.headers().has("content-length").unwrap_or(false);
        let stream = match rules.limits.max_body {
            Some(max) if !declared => {
                let (b, done) = BoundedBody::new(body, max, controller.clone())
                    .map_err(|_| Refusal::UpstreamUnavailable)?;
                ctx.wait_until(done);
                let readable = b.readable.clone();
                bounded = Some(b);
                readable
            }
            _ => body,
        };
        init.with_body(Some(stream.into()));
    }
    let upstream_req =
        Request::new_with_init(&target, &init).map_err(|_| Refusal::UpstreamUnavailable)?;
    let sent = race(
        Box::pin(async move { Fetch::Request(upstream_req).send_with_signal(&signal).await }),
        rules.timeouts.upstream,
    )
    .await;
    let too_large = || bounded.as_ref().is_some_and(|b| b.exceeded.get());
    match sent {
        Raced::Done(Ok(r)) => Ok(r),
        Raced::Done(Err(_)) if too_large() => Err(Refusal::BodyTooLarge),
        Raced::Done(Err(_)) => Err(Refusal::UpstreamUnavailable),
        Raced::Late(_) => {
            if let Some(c) = controller.borrow_mut().take() {
                c.abort();
            }
            Err(Refusal::UpstreamTimeout)
        }
    }
}

/// The upstream's answer with the client's headers, its body streamed through;
/// the slots are released once the body is out.
fn respond(
    edge: &Rc<Edge>,
    ctx: &Context,
    id: &Rc<str>,
    resp: Response,
    method: &Method,
    admit: &mut Admit,
    release: Option<Task>,
) -> Result<Response> {
    let status = resp.status_code();
    let from: web_sys::Response = resp.into();
    let mut headers = WorkerHeaders(Headers(from.headers()));
    edge.exchange().response_headers(&mut headers, admit);
    let builder = ResponseBuilder::new()
        .with_status(status)
        .with_headers(headers.0);
    let body = from.body().filter(|_| has_body(method.as_ref(), status));
    let Some(body) = body else {
        later(ctx, id, release);
        return Ok(builder.empty());
    };
    let Some(release) = release else {
        // the upstream's own stream: its length and its failures reach the client
        return Ok(builder.stream(body));
    };
    // slots go back once the body is out: pipe it through, release when done
    let pass =
        web_sys::TransformStream::new().map_err(|e| worker::Error::JsError(format!("{e:?}")))?;
    let piped = wasm_bindgen_futures::JsFuture::from(body.pipe_to(&pass.writable()));
    ctx.wait_until(InRequest::new(id.clone(), async move {
        let _ = piped.await;
        release.await;
    }));
    Ok(builder.stream(pass.readable()))
}
