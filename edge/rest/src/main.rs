//! `floodgate-rest`: a local Upstash-compatible REST endpoint in front of Redis.
//!
//! ```text
//! floodgate-rest [--listen 127.0.0.1:8079] [--redis redis://127.0.0.1:6379/]
//!                [--redis-ca-file ca.pem] [--deadline-ms 5000]
//!                [--max-body BYTES] [--max-reply BYTES] [--pool N]
//!                [--allow-command "FLUSHDB"]... [--header-timeout-ms 10000]
//!                [--body-timeout-ms 30000] [--max-connections 512]
//! ```
//! `--help` lists every flag; each can also be set by the environment variable
//! named there. The token comes from `FLOODGATE_REST_TOKEN` (never from the command line, where
//! other users could read it). `--redis` takes `rediss://user:password@host:port`
//! (TLS, ACL user) and `redis+sentinel://`; the CA file also comes from
//! `FLOODGATE_REDIS_CA_FILE`. `--allow-command` lets one administrative command
//! or subcommand through the command policy (repeatable, or comma-separated).
//! Ctrl-C or SIGTERM stops it after requests in flight.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use floodgate_edge::args::{LogArgs, socket_addr};
use floodgate_edge::store::{StoreError, StoreOptions};
use floodgate_rest::{EndpointConfig, app, endpoint, metrics_app, serve};

/// A local Upstash-compatible REST endpoint in front of Redis. Its bearer token
/// comes from FLOODGATE_REST_TOKEN (never from the command line, where other users
/// could read it).
#[derive(Debug, Parser)]
#[command(name = "floodgate-rest", version)]
struct Args {
    /// Where to listen.
    #[arg(long, env = "FLOODGATE_REST_LISTEN", default_value = "127.0.0.1:8079", value_parser = socket_addr)]
    listen: SocketAddr,
    /// Redis: redis://[user:password@]host:port[/db], rediss://user:password@host:port
    /// (TLS, ACL user), redis+sentinel://host:port[,..]/master.
    #[arg(
        long,
        env = "FLOODGATE_REDIS",
        default_value = "redis://127.0.0.1:6379/"
    )]
    redis: String,
    /// PEM CA certificates that sign the Redis servers' TLS certificates.
    #[arg(long, env = "FLOODGATE_REDIS_CA_FILE")]
    redis_ca_file: Option<PathBuf>,
    /// The longest one Redis call may take (milliseconds, at least 1).
    #[arg(long, env = "FLOODGATE_REST_DEADLINE_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..))]
    deadline_ms: u64,
    /// Largest accepted request body (bytes, at least 1).
    #[arg(long, env = "FLOODGATE_REST_MAX_BODY", default_value_t = 1024 * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    max_body: u64,
    /// Largest reply served (bytes, at least 1); a larger one fails its request with 400.
    #[arg(long, env = "FLOODGATE_REST_MAX_REPLY", default_value_t = 64 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    max_reply: u64,
    /// Redis connections (each pipelines many requests; at least 1).
    #[arg(long, env = "FLOODGATE_REST_POOL", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    pool: u64,
    /// An administrative command or subcommand ("FLUSHDB", "SCRIPT FLUSH") to let
    /// through the command policy (repeatable, or comma-separated).
    #[arg(long, env = "FLOODGATE_REST_ALLOW_COMMAND", value_delimiter = ',')]
    allow_command: Vec<String>,
    /// A client must send a request's headers within this long (milliseconds).
    #[arg(long, env = "FLOODGATE_REST_HEADER_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout_ms: u64,
    /// A client must send a request's body within this long (milliseconds).
    #[arg(long, env = "FLOODGATE_REST_BODY_TIMEOUT_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    body_timeout_ms: u64,
    /// Where to serve Prometheus metrics (GET /metrics, no token: the REST token
    /// grants every Redis command, a scraper should not hold it). Off by default.
    #[arg(long, env = "FLOODGATE_REST_METRICS_LISTEN", value_parser = socket_addr)]
    metrics_listen: Option<SocketAddr>,
    /// Open client connections at most (each takes a file descriptor: keep the
    /// descriptor limit, ulimit -n, above twice this); past it a new connection is
    /// answered 503 with Retry-After: 1 at once.
    #[arg(long, env = "FLOODGATE_REST_MAX_CONNECTIONS", default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: u64,
    #[command(flatten)]
    log: LogArgs,
}

#[derive(Debug, thiserror::Error)]
enum RestError {
    #[error("set FLOODGATE_REST_TOKEN")]
    NoToken,
    #[error("cannot listen on {listen}: {error}")]
    Bind {
        listen: SocketAddr,
        error: std::io::Error,
    },
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("runtime: {0}")]
    Runtime(std::io::Error),
    #[error("serving: {0}")]
    Serve(std::io::Error),
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

fn run(args: Args) -> Result<(), RestError> {
    let token = std::env::var("FLOODGATE_REST_TOKEN").map_err(|_| RestError::NoToken)?;
    let mut config = EndpointConfig::new(args.redis.as_str(), token);
    config.redis =
        StoreOptions::from_env(args.redis.as_str(), Duration::from_millis(args.deadline_ms));
    if args.redis_ca_file.is_some() {
        config.redis.ca_file = args.redis_ca_file.clone();
    }
    config.max_body = args.max_body as usize;
    config.max_reply = args.max_reply as usize;
    config.pool = args.pool as usize;
    config.allow = args
        .allow_command
        .iter()
        .map(|c| c.trim())
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect();
    config.header_timeout = Duration::from_millis(args.header_timeout_ms);
    config.body_timeout = Duration::from_millis(args.body_timeout_ms);
    config.max_connections = args.max_connections as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(RestError::Runtime)?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|error| RestError::Bind {
                listen: args.listen,
                error,
            })?;
        let at = listener.local_addr().map_err(RestError::Runtime)?;
        let ep = endpoint(&config).await?;
        if let Some(m) = args.metrics_listen {
            let metrics = tokio::net::TcpListener::bind(m)
                .await
                .map_err(|error| RestError::Bind { listen: m, error })?;
            tracing::info!(metrics = %m, "floodgate-rest: metrics on http://{m}/metrics");
            let (routes, settings) = (metrics_app(ep.clone()), config.clone());
            // served until the process ends
            tokio::spawn(async move {
                serve(metrics, routes, &settings, std::future::pending()).await
            });
        }
        let redis = floodgate_edge::store::resp::redact(&config.redis.url);
        tracing::info!(listen = %at, redis = %redis, "floodgate-rest: listening on http://{at} (Redis {redis})");
        serve(listener, app(ep), &config, floodgate_edge::shutdown_signal())
            .await
            .map_err(RestError::Serve)
    })
}
