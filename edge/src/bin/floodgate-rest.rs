//! `floodgate-rest`: a local Upstash-compatible REST endpoint in front of Redis.
//!
//! ```text
//! floodgate-rest [--listen 127.0.0.1:8079] [--redis redis://127.0.0.1:6379/]
//!                [--redis-ca-file ca.pem] [--deadline-ms 5000]
//!                [--max-body BYTES] [--max-reply BYTES] [--pool N]
//!                [--allow-command "FLUSHDB"]... [--header-timeout-ms 10000]
//!                [--body-timeout-ms 30000] [--max-connections 512]
//! ```
//! The token comes from `FLOODGATE_REST_TOKEN` (never from the command line, where
//! other users could read it). `--redis` takes `rediss://user:password@host:port`
//! (TLS, ACL user) and `redis+sentinel://`; the CA file also comes from
//! `FLOODGATE_REDIS_CA_FILE`. `--allow-command` lets one administrative command
//! or subcommand through the command policy (repeatable, or comma-separated).
//! Ctrl-C or SIGTERM stops it after requests in flight.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use floodgate_edge::rest_endpoint::{EndpointConfig, serve};
use floodgate_edge::store::{StoreError, StoreOptions};

#[derive(Debug, thiserror::Error)]
enum RestError {
    #[error("set FLOODGATE_REST_TOKEN")]
    NoToken,
    #[error("{flag} {why}")]
    Flag { flag: String, why: &'static str },
    #[error("unknown argument {0:?}")]
    Unknown(String),
    #[error("bind {listen}: {error}")]
    Bind {
        listen: String,
        error: std::io::Error,
    },
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("runtime: {0}")]
    Runtime(std::io::Error),
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floodgate-rest: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), RestError> {
    let token = std::env::var("FLOODGATE_REST_TOKEN").map_err(|_| RestError::NoToken)?;
    let mut config = EndpointConfig::new("redis://127.0.0.1:6379/", token);
    config.redis = StoreOptions::from_env("redis://127.0.0.1:6379/", config.redis.deadline);
    let mut listen = "127.0.0.1:8079".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next().ok_or_else(|| RestError::Flag {
                flag: flag.clone(),
                why: "needs a value",
            })
        };
        let number = |v: String, why: &'static str| {
            v.parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or(RestError::Flag {
                    flag: flag.clone(),
                    why,
                })
        };
        match flag.as_str() {
            "--listen" => listen = value()?,
            "--redis" => config.redis.url = value()?,
            "--redis-ca-file" => config.redis.ca_file = Some(PathBuf::from(value()?)),
            "--deadline-ms" => {
                config.redis.deadline =
                    Duration::from_millis(number(value()?, "takes milliseconds, at least 1")?)
            }
            "--max-body" => config.max_body = number(value()?, "takes bytes")? as usize,
            "--max-reply" => config.max_reply = number(value()?, "takes bytes")? as usize,
            "--pool" => config.pool = number(value()?, "takes a number, at least 1")? as usize,
            "--allow-command" => config.allow.extend(
                value()?
                    .split(',')
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .map(str::to_string),
            ),
            "--header-timeout-ms" => {
                config.header_timeout =
                    Duration::from_millis(number(value()?, "takes milliseconds")?)
            }
            "--body-timeout-ms" => {
                config.body_timeout = Duration::from_millis(number(value()?, "takes milliseconds")?)
            }
            "--max-connections" => {
                config.max_connections = number(value()?, "takes a number, at least 1")? as usize
            }
            other => return Err(RestError::Unknown(other.to_string())),
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(RestError::Runtime)?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&listen)
            .await
            .map_err(|error| RestError::Bind {
                listen: listen.clone(),
                error,
            })?;
        eprintln!(
            "floodgate-rest: listening on http://{} (Redis {})",
            listener.local_addr().map_err(RestError::Runtime)?,
            floodgate_edge::store::resp::redact(&config.redis.url)
        );
        Ok(serve(listener, &config, floodgate_edge::shutdown_signal()).await?)
    })
}
