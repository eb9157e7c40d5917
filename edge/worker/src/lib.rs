//! Floodgate's edge in a Cloudflare Worker: wiring only. The decision is the
//! host-free pipeline in `floodgate-edge` over the Upstash REST store; what a
//! client observes of the proxying is `floodgate_edge::proxy`'s rules, shared with
//! the native host. This file is their I/O through workerd's `fetch`.
//!
//! Bindings (wrangler.toml): secrets `UPSTASH_REDIS_REST_URL`,
//! `UPSTASH_REDIS_REST_TOKEN`; var `UPSTREAM_URL`; optional vars (defaults in
//! brackets): `DEADLINE_FLOOR_MS` (50) and `DEADLINE_CEILING_MS` (1000): the bounds
//! of the adaptive answer deadline of one Redis call, following the store's
//! observed latency (see `floodgate_edge::deadline`); `DEADLINE_MS` (unset) pins
//! it instead; `STARTUP_WAIT_MS` (2000: how long an isolate's first requests may
//! wait for its first configuration read), `UPSTREAM_TIMEOUT_MS` (30000), `CACHE_TTL_MS` (5000), `NEGATIVE_CACHE_TTL_MS`
//! (60000), `BREAKER_THRESHOLD` (5), `BREAKER_COOL_DOWN_MS` (1000), `KEY_HEADER`
//! (authorization), `FORWARD_KEY` (false), `IDENTITY_HEADER` (x-floodgate-key-id),
//! `UNKNOWN_KEYS_PER_IP_PER_MIN` (20), `UNKNOWN_KEYS_PER_MIN` (600),
//! `MAX_BODY_BYTES` (10485760), `LEASE_LIFETIME_MS` (2000), `LOG_LEVEL` (info;
//! `debug` adds one line per answered request). Breaker transitions and
//! configuration loads go to the console log as JSON lines, each with the id of the
//! request it happened in (`span.request_id`: the client's `X-Request-Id` when
//! well-formed, else a new one; passed upstream as `X-Request-Id`, like the native
//! host).
//!
//! Regional pools (bounded consistency): `REGIONAL_REST_URLS`, a JSON object from a
//! region name to the REST URL of that region's Upstash database, and the secret
//! `REGIONAL_REST_TOKENS`, the same keys to their tokens. An isolate's region is the
//! request's `cf.continent` (`EU`, `NA`, `AS`, `OC`, `SA`, `AF`, `AN`), or `REGION`
//! when set (or when Cloudflare gives none); a region without a URL uses instance
//! leases only.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use floodgate_edge::deadline::DeadlineSettings;
use floodgate_edge::pipeline::bounded::LeaseSettings;
use floodgate_edge::pipeline::events::{self, Level, LogEvent};
use floodgate_edge::pipeline::{Gate, Pipeline, PipelineConfig, RequestHead, store_deadline};
use floodgate_edge::proxy::{
    HEALTH_PATH, HeadSize, ProxyRules, REQUEST_ID_HEADER, Refusal, connection_named, has_body,
    request_id,
};
use floodgate_edge::store::rest::RestStore;
use floodgate_edge::timer::{Raced, race};
use floodgate_shared::time::{Clock, Micros};
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

/// One per isolate, so its caches, breaker and deny cache outlive a request.
struct Edge {
    pipeline: EdgePipeline,
    rules: ProxyRules,
}

thread_local! {
    static EDGE: RefCell<Option<Rc<Edge>>> = const { RefCell::new(None) };
    /// The id of the request whose future is being polled (see [`InRequest`]).
    static REQUEST_ID: RefCell<Option<Rc<str>>> = const { RefCell::new(None) };
    /// `LOG_LEVEL=debug`: answered requests are logged too.
    static DEBUG: Cell<bool> = const { Cell::new(false) };
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
    deadline: Duration,
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

fn edge(env: &Env, region: Option<String>) -> std::result::Result<Rc<Edge>, String> {
    if let Some(e) = EDGE.with(|e| e.borrow().clone()) {
        return Ok(e);
    }
    let upstream = var(env, "UPSTREAM_URL").ok_or("UPSTREAM_URL is not set")?;
    let url = var(env, "UPSTASH_REDIS_REST_URL").ok_or("UPSTASH_REDIS_REST_URL is not set")?;
    let token =
        var(env, "UPSTASH_REDIS_REST_TOKEN").ok_or("UPSTASH_REDIS_REST_TOKEN is not set")?;
    let num = |name: &str, default: u64| -> std::result::Result<u64, String> {
        match var(env, name) {
            None => Ok(default),
            Some(v) => v
                .trim()
                .parse()
                .map_err(|_| format!("{name} must be a whole number, got {v:?}")),
        }
    };
    let ms = |name: &str, default: u64| num(name, default).map(|v| v as i64 * 1000);
    let opt_ms = |name: &str| -> std::result::Result<Option<i64>, String> {
        var(env, name).map(|_| ms(name, 0)).transpose()
    };
    let deadline = match opt_ms("DEADLINE_MS")? {
        Some(d) => DeadlineSettings::fixed(d),
        None => DeadlineSettings::REST
            .bounded(opt_ms("DEADLINE_FLOOR_MS")?, opt_ms("DEADLINE_CEILING_MS")?),
    };
    // a late call runs on at least to the ceiling, to teach the deadline
    let transport = store_deadline(Duration::from_micros(deadline.ceiling as u64));
    let store = RestStore::new(&url, &token, transport).map_err(|e| e.to_string())?;
    let mut rules = ProxyRules::new(&upstream);
    if let Some(h) = var(env, "KEY_HEADER") {
        rules.key_header = h.trim().to_ascii_lowercase();
    }
    if let Some(h) = var(env, "IDENTITY_HEADER") {
        rules.identity_header = h.trim().to_ascii_lowercase();
    }
    rules.forward_key = var(env, "FORWARD_KEY").as_deref() == Some("true");
    rules.timeouts.upstream = Duration::from_millis(num("UPSTREAM_TIMEOUT_MS", 30_000)?);
    rules.limits.max_body = Some(num("MAX_BODY_BYTES", 10 * 1024 * 1024)?);
    let settings = PipelineConfig {
        bearer: rules.bearer(),
        deadline,
        startup_wait: ms("STARTUP_WAIT_MS", 2_000)?,
        cache_ttl: ms("CACHE_TTL_MS", 5_000)?,
        negative_cache_ttl: ms("NEGATIVE_CACHE_TTL_MS", 60_000)?,
        breaker_threshold: num("BREAKER_THRESHOLD", 5)?.clamp(1, u32::MAX as u64) as u32,
        breaker_cool_down: ms("BREAKER_COOL_DOWN_MS", 1_000)?,
        unknown_keys_per_ip_per_min: num("UNKNOWN_KEYS_PER_IP_PER_MIN", 20)?.min(u32::MAX as u64)
            as u32,
        unknown_keys_per_min: num("UNKNOWN_KEYS_PER_MIN", 600)?.min(u32::MAX as u64) as u32,
        leases: LeaseSettings {
            lifetime: ms("LEASE_LIFETIME_MS", 2_000)?.max(1_000),
            ..LeaseSettings::default()
        },
        log: console_log,
        ..PipelineConfig::default()
    };
    match var(env, "LOG_LEVEL").as_deref().map(str::trim) {
        None | Some("info") => {}
        Some("debug") => DEBUG.with(|d| d.set(true)),
        Some(other) => return Err(format!("LOG_LEVEL must be info or debug, got {other:?}")),
    }
    let mut pipeline = Pipeline::new(store, WorkerClock, settings);
    let region = var(env, "REGION").or(region);
    if let Some(r) = &region
        && let Some(regional) = regional_store(env, r, transport)?
    {
        pipeline = pipeline.with_regional(regional);
    }
    let e = Rc::new(Edge { pipeline, rules });
    EDGE.with(|slot| *slot.borrow_mut() = Some(e.clone()));
    Ok(e)
}

/// The pipeline's events as JSON lines on the console (what `wrangler tail` and
/// Workers Logs show), shaped like the native host's `--log-format json`.
/// Debug events only with `LOG_LEVEL=debug`.
fn console_log(event: &LogEvent<'_>) {
    let id = REQUEST_ID.with(|r| r.borrow().clone());
    log_line(event, id.as_deref());
}

/// `event` as a JSON line on the console, as part of request `id`.
fn log_line(event: &LogEvent<'_>, id: Option<&str>) {
    if event.level() == Level::Debug && !DEBUG.with(Cell::get) {
        return;
    }
    let now = worker::js_sys::Date::new_0().to_iso_string();
    worker::console_log!("{}", events::json_line(event, &String::from(now), id));
}

/// One of the pipeline's or the rules' answers.
fn answer(gate: Gate) -> Result<Response> {
    let Gate::Respond {
        status,
        headers,
        body,
    } = gate
    else {
        return Err("only answers are written here".into());
    };
    let mut r = Response::ok(body)?.with_status(status);
    for (k, v) in headers {
        r.headers_mut().set(k, &v)?;
    }
    Ok(r)
}

fn head_size(req: &Request, url: &worker::Url) -> HeadSize {
    let (mut header_count, mut header_bytes) = (0, 0);
    for (k, v) in req.headers().entries() {
        header_count += 1;
        header_bytes += k.len() + v.len();
    }
    HeadSize {
        path: url.path().len(),
        query: url.query().map_or(0, str::len),
        header_count,
        header_bytes,
        content_length: req
            .headers()
            .get("content-length")
            .ok()
            .flatten()
            .and_then(|v| v.parse().ok()),
    }
}

/// Each request in its id's scope ([`InRequest`]); at debug, one line once its
/// answer's head is ready.
#[event(fetch)]
async fn fetch(req: Request, env: Env, ctx: Context) -> Result<Response> {
    let client = req.headers().get(REQUEST_ID_HEADER)?;
    let id: Rc<str> = request_id(client.as_deref(), fresh_id).into();
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

async fn serve(req: Request, env: Env, ctx: Context, id: Rc<str>) -> Result<Response> {
    let continent = req.cf().and_then(|cf| cf.continent());
    let edge = match edge(&env, continent) {
        Ok(e) => e,
        Err(e) => return answer(Gate::json(500, "Floodgate is misconfigured", Some(&e))),
    };
    let url = req.url()?;
    if url.path() == HEALTH_PATH {
        // this isolate's breaker and degraded totals (see docs/failure.md)
        let mut r = Response::ok(edge.pipeline.health().to_json())?;
        r.headers_mut().set("content-type", "application/json")?;
        r.headers_mut().set("cache-control", "no-store")?;
        return Ok(r);
    }
    if let Err(r) = edge.rules.check_head(&head_size(&req, &url)) {
        return answer(r.answer());
    }
    let credentials = req.headers().get(&edge.rules.key_header)?;
    let client_ip = req
        .headers()
        .get("cf-connecting-ip")?
        .and_then(|v| v.parse().ok());
    let country = req.cf().and_then(|cf| cf.country());
    let user_agent = req.headers().get("user-agent")?;
    let head = RequestHead {
        path: url.path(),
        credentials: credentials.as_deref().map(str::as_bytes),
        client_ip,
        country: country.as_deref(),
        user_agent: user_agent.as_deref().map(str::as_bytes),
    };
    let decided = edge.pipeline.gate(head).await;
    for task in decided.background {
        ctx.wait_until(InRequest::new(id.clone(), task));
    }
    // per-endpoint counters: written in one batch at most once a second, after the
    // response (waitUntil), never delaying it
    let flusher = edge.clone();
    ctx.wait_until(async move {
        let _ = flusher.pipeline.flush_stats(1_000_000).await;
    });
    let (key_id, quota, slots) = match decided.gate {
        g @ Gate::Respond { .. } => return answer(g),
        Gate::Forward {
            key_id,
            headers,
            slots,
            ..
        } => (key_id, headers, slots),
    };

    let rules = &edge.rules;
    let named = connection_named(req.headers().get("connection")?.as_deref());
    let out = Headers::new();
    for (k, v) in req.headers().entries() {
        if rules.forwards_request_header(&k, &named) {
            out.append(&k, &v)?;
        }
    }
    if let Some(id) = &key_id {
        out.set(&rules.identity_header, id)?;
    }
    out.set(REQUEST_ID_HEADER, &id)?;
    if let Some(xff) =
        rules.forwarded_for(req.headers().get("x-forwarded-for")?.as_deref(), client_ip)
    {
        out.set("x-forwarded-for", &xff)?;
    }
    let target = rules.target(&format!(
        "{}{}",
        url.path(),
        url.query().map(|q| format!("?{q}")).unwrap_or_default()
    ));
    let method = req.method();
    let controller = AbortController::default();
    let mut init = RequestInit::new();
    init.with_method(method.clone()).with_headers(out);
    if !matches!(method, Method::Get | Method::Head)
        && let Some(body) = req.inner().body()
    {
        init.with_body(Some(body.into()));
    }
    let upstream_req = Request::new_with_init(&target, &init)?;
    let signal = controller.signal();
    let sent = race(
        Box::pin(async move { Fetch::Request(upstream_req).send_with_signal(&signal).await }),
        rules.timeouts.upstream,
    )
    .await;
    let release = |edge: &Rc<Edge>, slots: Vec<floodgate_edge::pipeline::Slot>| {
        let edge = edge.clone();
        async move { edge.pipeline.release(&slots).await }
    };
    let resp = match sent {
        Raced::Done(Ok(r)) => r,
        Raced::Done(Err(_)) => {
            ctx.wait_until(release(&edge, slots));
            return answer(Refusal::UpstreamUnavailable.answer());
        }
        Raced::Late(_) => {
            controller.abort();
            ctx.wait_until(release(&edge, slots));
            return answer(Refusal::UpstreamTimeout.answer());
        }
    };
    let status = resp.status_code();
    let from: web_sys::Response = resp.into();
    let named = connection_named(from.headers().get("connection").ok().flatten().as_deref());
    let headers = Headers::new();
    for (k, v) in Headers(from.headers()).entries() {
        if rules.forwards_response_header(&k, &named) {
            headers.append(&k, &v)?;
        }
    }
    for (k, v) in quota {
        headers.set(k, &v)?;
    }
    let builder = ResponseBuilder::new()
        .with_status(status)
        .with_headers(headers);
    let body = from.body().filter(|_| has_body(method.as_ref(), status));
    let Some(body) = body else {
        ctx.wait_until(release(&edge, slots));
        return Ok(builder.empty());
    };
    if slots.is_empty() {
        // the upstream's own stream: its length and its failures reach the client
        return Ok(builder.stream(body));
    }
    // slots go back once the body is out: pipe it through, release when done
    let pass =
        web_sys::TransformStream::new().map_err(|e| worker::Error::JsError(format!("{e:?}")))?;
    let piped = wasm_bindgen_futures::JsFuture::from(body.pipe_to(&pass.writable()));
    let edge2 = edge.clone();
    ctx.wait_until(async move {
        let _ = piped.await;
        edge2.pipeline.release(&slots).await;
    });
    Ok(builder.stream(pass.readable()))
}
