//! `floodgate-edge`: the native host of the edge pipeline.
//!
//! ```text
//! floodgate-edge --upstream http://127.0.0.1:9000 [--listen 127.0.0.1:8080]
//!                [--redis redis://127.0.0.1:6379/ | --rest-url http://127.0.0.1:8079]
//!                [--redis-ca-file ca.pem]
//!                (--redis takes rediss://user:password@host:port for TLS and ACL users,
//!                redis+sentinel://host:port/master, redis+cluster://host:port[,host:port])
//!                [--key-header authorization] [--forward-key] [--identity-header x-floodgate-key-id]
//!                [--cache-ttl-ms 5000] [--deadline-ms 3] [--no-limit]
//!                [--breaker-threshold 5] [--breaker-cool-down-ms 1000]
//! ```
//! `--deadline-ms` bounds every store call (bucket check, key and config reads,
//! health checks; default 3 ms over RESP, 1000 ms over REST); `--breaker-threshold` consecutive failures open the circuit
//! breaker for `--breaker-cool-down-ms`, then one `PING` decides whether it closes.
//! Breaker transitions are logged to stderr.
//! With `--rest-url`, the token comes from `FLOODGATE_REST_TOKEN` (or
//! `UPSTASH_REDIS_REST_TOKEN`). `--redis-ca-file` (or `FLOODGATE_REDIS_CA_FILE`)
//! names the PEM CA certificates that sign the Redis servers' TLS certificates,
//! trusted instead of the system roots. `--no-limit` proxies without limiting (a baseline
//! for benchmarks). Ctrl-C or SIGTERM stops it after requests in flight.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use floodgate_edge::native_host::{HostConfig, NativeStore, router};
use floodgate_edge::pipeline::{Pipeline, PipelineConfig};
use floodgate_edge::store::StoreOptions;
use floodgate_shared::time::SystemClock;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floodgate-edge: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    let mut listen = "127.0.0.1:8080".to_string();
    let mut upstream = None;
    let mut redis = "redis://127.0.0.1:6379/".to_string();
    let mut rest_url = None;
    let mut ca_file = None;
    let mut host = HostConfig::new("");
    let mut settings = PipelineConfig::default();
    let mut deadline = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => listen = value()?,
            "--upstream" => upstream = Some(value()?),
            "--redis" => redis = value()?,
            "--rest-url" => rest_url = Some(value()?),
            "--redis-ca-file" => ca_file = Some(std::path::PathBuf::from(value()?)),
            "--key-header" => {
                let v = value()?;
                host.key_header = v.parse().map_err(|_| format!("bad header name {v:?}"))?;
                settings.bearer = host.key_header == "authorization";
            }
            "--identity-header" => {
                let v = value()?;
                host.identity_header = v.parse().map_err(|_| format!("bad header name {v:?}"))?;
            }
            "--forward-key" => host.forward_key = true,
            "--no-limit" => host.limiter = false,
            "--cache-ttl-ms" => {
                settings.cache_ttl = value()?
                    .parse::<i64>()
                    .map_err(|_| "--cache-ttl-ms takes milliseconds")?
                    * 1000
            }
            "--deadline-ms" => {
                deadline = Some(Duration::from_millis(
                    value()?
                        .parse::<u64>()
                        .ok()
                        .filter(|ms| *ms >= 1)
                        .ok_or("--deadline-ms takes milliseconds, at least 1")?,
                ))
            }
            "--breaker-threshold" => {
                settings.breaker_threshold = value()?
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or("--breaker-threshold takes a whole number of failures, at least 1")?
            }
            "--breaker-cool-down-ms" => {
                settings.breaker_cool_down = value()?
                    .parse::<u32>()
                    .map_err(|_| "--breaker-cool-down-ms takes milliseconds")?
                    as i64
                    * 1000
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let upstream = upstream.ok_or("--upstream is required")?;
    if !upstream.starts_with("http://") && !upstream.starts_with("https://") {
        return Err(format!(
            "--upstream must be an http(s) URL, got {upstream:?}"
        ));
    }
    host.upstream = upstream.trim_end_matches('/').to_string();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        // a REST endpoint is an HTTP hop, usually remote: a wider default deadline
        let deadline = deadline.unwrap_or(if rest_url.is_some() {
            Duration::from_millis(1000)
        } else {
            floodgate_edge::store::resp::DEFAULT_DEADLINE
        });
        let mut options = StoreOptions::from_env(rest_url.as_deref().unwrap_or(&redis), deadline);
        if ca_file.is_some() {
            options.ca_file = ca_file;
        }
        let store = NativeStore::connect(&options)
            .await
            .map_err(|e| e.to_string())?;
        let pipeline = Pipeline::new(store, SystemClock, settings);
        let app = router(pipeline, host.clone());
        let listener = tokio::net::TcpListener::bind(&listen)
            .await
            .map_err(|e| format!("bind {listen}: {e}"))?;
        eprintln!(
            "floodgate-edge: listening on http://{} → {} (limiter {}, store {})",
            listener.local_addr().map_err(|e| e.to_string())?,
            host.upstream,
            if host.limiter { "on" } else { "OFF" },
            floodgate_edge::store::resp::redact(rest_url.as_deref().unwrap_or(&redis))
        );
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(floodgate_edge::shutdown_signal())
        .await
        .map_err(|e| e.to_string())
    })
}
