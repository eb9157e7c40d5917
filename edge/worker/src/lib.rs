//! Floodgate's edge in a Cloudflare Worker: wiring only. Everything else is the
//! host-free pipeline in `floodgate-edge` over the Upstash REST store.
//!
//! Bindings (wrangler.toml): secrets `UPSTASH_REDIS_REST_URL`, `UPSTASH_REDIS_REST_TOKEN`;
//! vars `UPSTREAM_URL`, optional `CACHE_TTL_MS`, `DEADLINE_MS`, `FORWARD_KEY`,
//! `BREAKER_THRESHOLD` (consecutive failures that open the breaker, default 5) and
//! `BREAKER_COOL_DOWN_MS` (default 1000). Breaker transitions go to the console log.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use floodgate_edge::pipeline::{Gate, Pipeline, PipelineConfig, RequestHead};
use floodgate_edge::store::rest::RestStore;
use floodgate_shared::contract::{HOP_BY_HOP, IDENTITY_HEADER};
use floodgate_shared::time::{Clock, Micros};
use worker::{Context, Env, Headers, Method, Request, RequestInit, Response, Result, event};

/// `Date.now()`: `SystemTime::now` panics in wasm32.
struct WorkerClock;

impl Clock for WorkerClock {
    fn now(&self) -> Micros {
        (worker::Date::now().as_millis() as i64) * 1000
    }
}

type EdgePipeline = Pipeline<RestStore, WorkerClock>;

thread_local! {
    /// One pipeline per isolate, so its caches outlive a request.
    static PIPELINE: RefCell<Option<Rc<EdgePipeline>>> = const { RefCell::new(None) };
}

fn var(env: &Env, name: &str) -> Option<String> {
    env.var(name)
        .ok()
        .map(|v| v.to_string())
        .or_else(|| env.secret(name).ok().map(|v| v.to_string()))
}

fn pipeline(env: &Env) -> Result<Rc<EdgePipeline>> {
    if let Some(p) = PIPELINE.with(|p| p.borrow().clone()) {
        return Ok(p);
    }
    let url = var(env, "UPSTASH_REDIS_REST_URL").ok_or("UPSTASH_REDIS_REST_URL is not set")?;
    let token =
        var(env, "UPSTASH_REDIS_REST_TOKEN").ok_or("UPSTASH_REDIS_REST_TOKEN is not set")?;
    let ms = |name: &str, default: u64| {
        var(env, name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let store = RestStore::new(&url, &token, Duration::from_millis(ms("DEADLINE_MS", 1000)))
        .map_err(|e| worker::Error::RustError(e.to_string()))?;
    let settings = PipelineConfig {
        cache_ttl: ms("CACHE_TTL_MS", 5000) as i64 * 1000,
        breaker_threshold: ms("BREAKER_THRESHOLD", 5).clamp(1, u32::MAX as u64) as u32,
        breaker_cool_down: ms("BREAKER_COOL_DOWN_MS", 1000) as i64 * 1000,
        log: console_log,
        ..PipelineConfig::default()
    };
    let p = Rc::new(Pipeline::new(store, WorkerClock, settings));
    PIPELINE.with(|slot| *slot.borrow_mut() = Some(p.clone()));
    Ok(p)
}

fn console_log(line: &str) {
    worker::console_log!("{line}");
}

fn json(status: u16, error: &str) -> Result<Response> {
    let mut r =
        Response::ok(serde_json::json!({ "error": error }).to_string())?.with_status(status);
    r.headers_mut().set("content-type", "application/json")?;
    Ok(r)
}

#[event(fetch)]
async fn fetch(req: Request, env: Env, ctx: Context) -> Result<Response> {
    let upstream = match var(&env, "UPSTREAM_URL") {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => return json(500, "UPSTREAM_URL is not set"),
    };
    let pipeline = match pipeline(&env) {
        Ok(p) => p,
        Err(e) => return json(500, &format!("misconfigured: {e}")),
    };
    let url = req.url()?;
    if url.path() == "/__floodgate/health" {
        // this isolate's breaker and degraded totals (see docs/failure.md)
        let mut r = Response::ok(pipeline.health().to_json())?;
        r.headers_mut().set("content-type", "application/json")?;
        return Ok(r);
    }
    if url.path().len() > floodgate_shared::routes::MAX_PATH_LEN {
        return json(414, "Request URI too long");
    }
    let credentials = req.headers().get("authorization")?;
    let client_ip = req
        .headers()
        .get("cf-connecting-ip")?
        .and_then(|v| v.parse().ok());
    let head = RequestHead {
        path: url.path(),
        credentials: credentials.as_deref().map(str::as_bytes),
        client_ip,
    };
    let gate = pipeline.gate(head).await;
    // per-endpoint counters: written in one batch at most once a second, after the
    // response (waitUntil), never delaying it
    let flusher = pipeline.clone();
    ctx.wait_until(async move {
        let _ = flusher.flush_stats(1_000_000).await;
    });
    let (key_id, quota, slots) = match gate {
        Gate::Respond {
            status,
            headers,
            body,
        } => {
            let mut r = Response::ok(body)?.with_status(status);
            for (k, v) in headers {
                r.headers_mut().set(k, &v)?;
            }
            return Ok(r);
        }
        Gate::Forward {
            key_id,
            headers,
            slots,
            ..
        } => (key_id, headers, slots),
    };

    let forward_key = var(&env, "FORWARD_KEY").as_deref() == Some("true");
    let out = Headers::new();
    for (k, v) in req.headers().entries() {
        let lower = k.to_ascii_lowercase();
        if HOP_BY_HOP.contains(&lower.as_str())
            || lower == IDENTITY_HEADER
            || (!forward_key && lower == "authorization")
        {
            continue;
        }
        out.append(&k, &v)?;
    }
    out.set(IDENTITY_HEADER, &key_id)?;
    let target = format!(
        "{upstream}{}{}",
        url.path(),
        url.query().map(|q| format!("?{q}")).unwrap_or_default()
    );
    let mut init = RequestInit::new();
    init.with_method(req.method()).with_headers(out);
    if !matches!(req.method(), Method::Get | Method::Head) {
        if let Some(body) = req.inner().body() {
            init.with_body(Some(body.into()));
        }
    }
    let upstream_req = Request::new_with_init(&target, &init)?;
    let sent = worker::Fetch::Request(upstream_req).send().await;
    // in-flight slots go back once the upstream has answered (or failed); the body
    // then streams without holding one
    if !slots.is_empty() {
        let releaser = pipeline.clone();
        ctx.wait_until(async move { releaser.release(&slots).await });
    }
    let mut resp = match sent {
        Ok(r) => r,
        Err(_) => return json(502, "Upstream unavailable"),
    };
    let headers = resp.headers().clone();
    for (k, v) in quota {
        headers.set(k, &v)?;
    }
    let status = resp.status_code();
    let body = resp.stream()?;
    Ok(Response::from_stream(body)?
        .with_status(status)
        .with_headers(headers))
}
