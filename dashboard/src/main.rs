//! `floodgate-dashboard`: serves the dashboard.
//!
//! ```text
//! floodgate-dashboard [--listen 127.0.0.1:3000] [--redis redis://127.0.0.1:6379]
//!                     [--redis-ca-file ca.pem] [--site-root target/site] [--secure-cookies]
//!                     [--trusted-proxy CIDR]...
//! ```
//! `--redis` takes any store URL: `rediss://user:password@host:port` (TLS, ACL
//! user; the CA file also from `FLOODGATE_REDIS_CA_FILE`), `redis+sentinel://`,
//! `redis+cluster://`, or the deployment's `https://` REST URL (its token in
//! `FLOODGATE_REST_TOKEN` or `UPSTASH_REDIS_REST_TOKEN`).
//! The client address (for the sign-in limiter) is the connection's peer; with
//! `--trusted-proxy` (an address or CIDR, repeatable), a request from such a proxy
//! is attributed to the nearest address in its `X-Forwarded-For` that is not one.
//! The first operator comes from `FLOODGATE_ADMIN_USER` and
//! `FLOODGATE_ADMIN_PASSWORD` (or `FLOODGATE_ADMIN_PASSWORD_FILE`); it is created
//! at start unless an operator of that name exists (the password is never
//! overwritten).

use std::net::SocketAddr;
use std::time::Duration;

use floodgate_dashboard::server::{app_state, ensure_operator};
use floodgate_edge::store::{NativeStore, StoreOptions};

fn usage(message: &str) -> ! {
    eprintln!("floodgate-dashboard: {message}");
    eprintln!(
        "usage: floodgate-dashboard [--listen ADDR] [--redis URL] [--redis-ca-file PEM] [--site-root DIR] [--secure-cookies] [--trusted-proxy CIDR]..."
    );
    std::process::exit(2)
}

#[tokio::main]
async fn main() {
    let mut listen: SocketAddr = "127.0.0.1:3000".parse().expect("an address");
    let mut redis = "redis://127.0.0.1:6379".to_string();
    let mut site_root = "target/site".to_string();
    let mut secure_cookies = false;
    let mut trusted_proxies: Vec<ipnet::IpNet> = vec![];
    let mut ca_file = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--listen" => {
                listen = value()
                    .parse()
                    .unwrap_or_else(|e| usage(&format!("--listen: {e}")))
            }
            "--redis" => redis = value(),
            "--redis-ca-file" => ca_file = Some(std::path::PathBuf::from(value())),
            "--site-root" => site_root = value(),
            "--secure-cookies" => secure_cookies = true,
            "--trusted-proxy" => {
                let v = value();
                let net = v
                    .parse::<ipnet::IpNet>()
                    .or_else(|_| v.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                    .unwrap_or_else(|e| usage(&format!("--trusted-proxy {v:?}: {e}")));
                trusted_proxies.push(net);
            }
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    let mut options = StoreOptions::from_env(&redis, Duration::from_secs(2));
    if ca_file.is_some() {
        options.ca_file = ca_file;
    }
    // the message names the URL, its password redacted
    let store = NativeStore::connect(&options)
        .await
        .unwrap_or_else(|e| usage(&format!("cannot reach the store: {e}")));
    let user = std::env::var("FLOODGATE_ADMIN_USER").ok();
    let password = std::env::var("FLOODGATE_ADMIN_PASSWORD").ok().or_else(|| {
        std::env::var("FLOODGATE_ADMIN_PASSWORD_FILE")
            .ok()
            .map(|f| {
                std::fs::read_to_string(&f)
                    .unwrap_or_else(|e| usage(&format!("FLOODGATE_ADMIN_PASSWORD_FILE {f}: {e}")))
                    .trim_end_matches(['\r', '\n'])
                    .to_string()
            })
    });
    match (user, password) {
        (Some(u), Some(p)) => match ensure_operator(&store, &u, &p).await {
            Ok(true) => eprintln!("floodgate-dashboard: created operator {u:?}"),
            Ok(false) => {
                eprintln!("floodgate-dashboard: operator {u:?} exists; its password is kept")
            }
            Err(e) => usage(&format!("cannot create operator {u:?}: {e}")),
        },
        (Some(_), None) | (None, Some(_)) => usage(
            "set both FLOODGATE_ADMIN_USER and FLOODGATE_ADMIN_PASSWORD (or _FILE), or neither",
        ),
        (None, None) => {}
    }
    let state = app_state(store, &site_root, secure_cookies).trusting(trusted_proxies);
    let app = floodgate_dashboard::server::router(state);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .unwrap_or_else(|e| usage(&format!("cannot listen on {listen}: {e}")));
    eprintln!("floodgate-dashboard: listening on http://{listen}");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(floodgate_edge::shutdown_signal())
    .await
    .expect("the server runs");
}
