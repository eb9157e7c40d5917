//! `floodgate-edge`: the native host of the edge pipeline. `--help` lists every
//! flag; each can also be set by the environment variable named there.
//!
//! Every store call (bucket check, key and config reads, health checks) waits an
//! answer deadline at most, adaptive per store between `--deadline-floor-ms` and
//! `--deadline-ceiling-ms` (3-100 ms over RESP, 50-1000 ms over REST), or fixed
//! by `--deadline-ms`; a call that misses it keeps running in the background and
//! is refunded if it admitted a request that was refused. The first reads of the
//! configuration wait up to `--startup-wait-ms` instead.
//! `--breaker-threshold` consecutive failures open the circuit breaker for
//! `--breaker-cool-down-ms`, then one `PING` decides whether it closes. Breaker
//! transitions and configuration reloads are logged to stderr (`--log-format`
//! text or json; request-scoped events carry the request's id). Ctrl-C or SIGTERM
//! stops it gracefully: no new connections, requests on open ones answered with
//! `Connection: close` for `--drain-ms`, then leases handed back and pending
//! counts written.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use floodgate_edge::args::{LogArgs, StoreArgs, http_url};
use floodgate_edge::deadline::DeadlineSettings;
use floodgate_edge::forward_auth::ForwardAuth;
use floodgate_edge::native_host::server::HYPER_MAX_HEADERS;
use floodgate_edge::native_host::{Host, HostConfig, NativeStore, serve};
use floodgate_edge::pipeline::{Pipeline, transport_deadline};
use floodgate_edge::settings::{EdgeSettings, Protocol};
use floodgate_edge::store::StoreOptions;
use floodgate_edge::store::resp::redact;
use floodgate_edge::store::rest::RestStore;
use floodgate_shared::time::SystemClock;

/// mimalloc: the proxy allocates per request (hyper's buffers, headers, the
/// pipeline's keys); glibc's malloc was ~10 % of the host's CPU at saturation.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Floodgate's edge, natively: authenticates API keys, enforces the rate limits
/// stored in Redis, and proxies admitted requests to one upstream.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The upstream's base URL (http:// or https://); required unless --forward-auth.
    #[arg(long, env = "FLOODGATE_UPSTREAM", value_parser = http_url, required_unless_present = "forward_auth", conflicts_with = "forward_auth")]
    upstream: Option<String>,
    /// Forward-auth mode, for a gateway's auth subrequests (Caddy forward_auth,
    /// Traefik ForwardAuth, Envoy ext_authz, nginx auth_request): no upstream; each
    /// request is decided from X-Forwarded-Method/-Uri (or Envoy's path prefix) and
    /// answered 200 with the quota and identity headers, or with the full
    /// 401/403/429/503 answer. The forwarded headers are trusted: keep this port
    /// reachable by the gateway only.
    #[arg(long, env = "FLOODGATE_FORWARD_AUTH")]
    forward_auth: bool,
    /// In forward-auth mode, auth requests under this path follow Envoy ext_authz's
    /// path_prefix convention (the original path after it, the original method).
    #[arg(long, env = "FLOODGATE_ENVOY_PREFIX", default_value = floodgate_edge::forward_auth::ENVOY_PREFIX, value_parser = path_prefix)]
    envoy_prefix: String,
    /// Where to listen.
    #[arg(long, env = "FLOODGATE_LISTEN", default_value = "127.0.0.1:8080")]
    listen: String,
    #[command(flatten)]
    store: StoreArgs,
    /// Every setting the Worker has too (its variables: these without FLOODGATE_).
    #[command(flatten)]
    edge: EdgeSettings,
    /// The request header giving the client's country (ISO 3166-1 alpha-2) to the
    /// block lists, such as CF-IPCountry behind Cloudflare (default: none, and
    /// country entries never match).
    #[arg(long, env = "FLOODGATE_COUNTRY_HEADER")]
    country_header: Option<String>,
    /// A request head must be complete this long after its first byte (then 408).
    #[arg(long, env = "FLOODGATE_HEADER_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    header_timeout_ms: u32,
    /// A connection with no request in progress is closed after this (also one
    /// whose client stops reading a response).
    #[arg(long, env = "FLOODGATE_IDLE_TIMEOUT_MS", default_value_t = 60_000, value_parser = clap::value_parser!(u32).range(1..))]
    idle_timeout_ms: u32,
    /// The longest pause inside a request body (then 408).
    #[arg(long, env = "FLOODGATE_BODY_TIMEOUT_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u32).range(1..))]
    body_timeout_ms: u32,
    /// After SIGTERM or Ctrl-C: how long requests on open connections are still
    /// answered (each with Connection: close, then the connection closes) while
    /// no new connection is accepted and the health answer says draining; then
    /// idle connections are closed and the edge exits once the requests in
    /// progress are done (sooner when every connection has closed; 0: at once).
    #[arg(long, env = "FLOODGATE_DRAIN_MS", default_value_t = floodgate_edge::native_host::server::DEFAULT_DRAIN.as_millis() as u32, value_parser = clap::value_parser!(u32).range(0..=600_000))]
    drain_ms: u32,
    /// Most client connections held at once (default: from the descriptor limit).
    #[arg(long, env = "FLOODGATE_MAX_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: Option<u32>,
    /// A regional Redis holding this region's tally of bounded consistency:
    /// redis:// or rediss:// URL, or redis+cluster://.
    #[arg(
        long,
        env = "FLOODGATE_REGIONAL_REDIS",
        conflicts_with = "regional_rest_url"
    )]
    regional_redis: Option<String>,
    /// The same as an Upstash-compatible REST endpoint; its token comes from
    /// FLOODGATE_REGIONAL_REST_TOKEN.
    #[arg(long, env = "FLOODGATE_REGIONAL_REST_URL", value_parser = http_url)]
    regional_rest_url: Option<String>,
    /// Worker threads (default: the CPUs this process may run on; 1 runs everything
    /// on one thread).
    #[arg(long, env = "FLOODGATE_THREADS", value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: Option<u32>,
    /// How long the event loop keeps polling while a store call is out and no
    /// reply has come, before it lets the CPU sleep (0: at once). Polling spares a
    /// CPU the nap and wake-up per call (costly on virtual machines); a store
    /// farther away than this is waited for asleep (backing off).
    #[arg(long, env = "FLOODGATE_IDLE_POLL_US", default_value_t = floodgate_edge::native_host::idle_poll::DEFAULT_BUDGET.as_micros() as u32, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    idle_poll_us: u32,
    /// Proxy without limiting and without a store (a baseline for benchmarks).
    #[arg(long, env = "FLOODGATE_NO_LIMIT")]
    no_limit: bool,
    #[command(flatten)]
    log: LogArgs,
}

fn path_prefix(v: &str) -> Result<String, String> {
    if v.len() > 1
        && v.starts_with('/')
        && !v.ends_with('/')
        && v.bytes().all(|b| b.is_ascii_graphic())
    {
        Ok(v.to_string())
    } else {
        Err(format!(
            "expected a path such as /ext-authz (no trailing /), got {v:?}"
        ))
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    args.log.init();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(2)
        }
    }
}

fn host_config(a: &Args) -> Result<HostConfig, String> {
    let mut host = match &a.upstream {
        Some(upstream) => HostConfig::new(upstream),
        None => HostConfig::forward_auth(ForwardAuth {
            envoy_prefix: a.envoy_prefix.clone(),
        }),
    };
    host.rules = a.edge.rules(&host.rules.upstream);
    host.country_header = a
        .country_header
        .as_deref()
        .map(|v| {
            axum::http::HeaderName::from_bytes(v.as_bytes())
                .map(|h| h.as_str().to_string())
                .map_err(|_| format!("--country-header: {v:?} is not a header name"))
        })
        .transpose()?;
    let ms = |v: u32| Duration::from_millis(u64::from(v));
    host.rules.timeouts.header = ms(a.header_timeout_ms);
    host.rules.timeouts.idle = ms(a.idle_timeout_ms);
    host.rules.timeouts.body = ms(a.body_timeout_ms);
    host.idle_poll = Duration::from_micros(u64::from(a.idle_poll_us));
    host.server.header_timeout = host.rules.timeouts.header;
    host.server.idle_timeout = host.rules.timeouts.idle;
    host.server.drain = ms(a.drain_ms);
    // hyper's bound: its default (allocation-free) unless more lines are allowed,
    // then room above them for the proxy's JSON 431 (see ServerLimits)
    host.server.max_headers = match a.edge.max_headers {
        n if n <= HYPER_MAX_HEADERS => HYPER_MAX_HEADERS,
        n => n + 28,
    };
    host.server.max_buf = a.edge.max_header_bytes + 32 * 1024;
    if let Some(n) = a.max_connections {
        host.server.max_connections = n as usize;
    }
    host.rules.limits.max_connections = host.server.max_connections;
    host.limiter = !a.no_limit;
    Ok(host)
}

fn protocol(rest: bool) -> Protocol {
    if rest { Protocol::Rest } else { Protocol::Resp }
}

/// The regional store, if one is configured: a Redis URL of any kind the global
/// store takes (`--regional-redis`), or a REST endpoint (`--regional-rest-url`,
/// its token from FLOODGATE_REGIONAL_REST_TOKEN); TLS trusts the same CA file.
async fn regional_store(a: &Args) -> Result<Option<(NativeStore, DeadlineSettings)>, String> {
    let (url, flag) = match (&a.regional_rest_url, &a.regional_redis) {
        (Some(url), _) => (url, "--regional-rest-url"),
        (None, Some(url)) => (url, "--regional-redis"),
        (None, None) => return Ok(None),
    };
    let deadline = a.edge.deadline(protocol(a.regional_rest_url.is_some()));
    let mut options = StoreOptions::new(url.as_str(), transport_deadline(&deadline));
    options.start_unreachable = true;
    options.ca_file = a.store.redis_ca_file.clone();
    if a.regional_rest_url.is_some() {
        options.rest_token = Some(
            std::env::var("FLOODGATE_REGIONAL_REST_TOKEN")
                .map_err(|_| "--regional-rest-url needs FLOODGATE_REGIONAL_REST_TOKEN")?,
        );
    }
    NativeStore::connect(&options)
        .await
        .map(|s| Some((s, deadline)))
        .map_err(|e| format!("{flag} {}: {e}", redact(url)))
}

/// The runtime: one thread means no cross-thread wake-ups (measured: +15-25 %
/// requests/s on one core against the multi-threaded scheduler with one worker).
fn runtime(threads: Option<u32>) -> Result<tokio::runtime::Runtime, String> {
    let threads = threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
    if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads as usize)
            .enable_all()
            .build()
    }
    .map_err(|e| e.to_string())
}

/// The pipeline over the global store (and the regional one, if any).
async fn pipeline(a: &Args) -> Result<Pipeline<NativeStore, SystemClock>, String> {
    // a REST endpoint is an HTTP hop, usually remote: wider bounds
    let protocol = protocol(a.store.rest_url.is_some());
    let transport = transport_deadline(&a.edge.deadline(protocol));
    let store = if a.no_limit {
        // never called: the limiter is off
        NativeStore::Rest(
            RestStore::new("http://127.0.0.1:9", "unused", transport).map_err(|e| e.to_string())?,
        )
    } else {
        // the message names the URL, its password redacted
        // an edge started during an outage serves by failure mode meanwhile
        let mut options = a.store.options(transport);
        options.start_unreachable = true;
        NativeStore::connect(&options)
            .await
            .map_err(|e| e.to_string())?
    };
    let mut pipeline = Pipeline::new(store, SystemClock, a.edge.pipeline(protocol));
    if let Some((regional, deadline)) = regional_store(a).await? {
        pipeline = pipeline.with_regional_within(regional, deadline);
    }
    Ok(pipeline)
}

fn run(a: Args) -> Result<(), String> {
    let host = host_config(&a)?;
    runtime(a.threads)?.block_on(async {
        let pipeline = pipeline(&a).await?;
        let listener = tokio::net::TcpListener::bind(&a.listen)
            .await
            .map_err(|e| format!("--listen {}: {e}", a.listen))?;
        let at = listener.local_addr().map_err(|e| e.to_string())?;
        let store = if a.no_limit {
            "none".to_string()
        } else {
            redact(a.store.url())
        };
        let upstream = a.upstream.as_deref().unwrap_or("forward-auth answers");
        tracing::info!(
            listen = %at,
            upstream = %upstream,
            limiter = host.limiter,
            store = %store,
            max_connections = host.server.max_connections,
            "floodgate-edge: listening on http://{at} → {upstream} (limiter {}, store {store}, at most {} connections)",
            if host.limiter { "on" } else { "OFF" },
            host.server.max_connections,
        );
        let host = Host::new(pipeline, host)?;
        serve(listener, host, floodgate_edge::shutdown_signal())
            .await
            .map_err(|e| e.to_string())
    })
}
