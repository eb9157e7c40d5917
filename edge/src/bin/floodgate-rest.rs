//! `floodgate-rest`: a local Upstash-compatible REST endpoint in front of Redis.
//!
//! ```text
//! floodgate-rest [--listen 127.0.0.1:8079] [--redis redis://127.0.0.1:6379/]
//!                [--max-body BYTES] [--pool N]
//! ```
//! The token comes from `FLOODGATE_REST_TOKEN` (never from the command line, where
//! other users could read it). Ctrl-C or SIGTERM stops it after requests in flight.

use std::process::ExitCode;

use floodgate_edge::rest_endpoint::{EndpointConfig, serve};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floodgate-rest: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    let token = std::env::var("FLOODGATE_REST_TOKEN")
        .map_err(|_| "set FLOODGATE_REST_TOKEN".to_string())?;
    let mut config = EndpointConfig::new("redis://127.0.0.1:6379/", token);
    let mut listen = "127.0.0.1:8079".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => listen = value()?,
            "--redis" => config.redis_url = value()?,
            "--max-body" => {
                config.max_body = value()?.parse().map_err(|_| "--max-body takes bytes")?
            }
            "--pool" => config.pool = value()?.parse().map_err(|_| "--pool takes a number")?,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&listen)
            .await
            .map_err(|e| format!("bind {listen}: {e}"))?;
        eprintln!(
            "floodgate-rest: listening on http://{} (Redis {})",
            listener.local_addr().map_err(|e| e.to_string())?,
            config.redis_url
        );
        serve(listener, &config, floodgate_edge::shutdown_signal())
            .await
            .map_err(|e| e.to_string())
    })
}
