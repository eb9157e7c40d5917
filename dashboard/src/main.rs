//! `floodgate-dashboard`: serves the dashboard.
//!
//! ```text
//! floodgate-dashboard [--listen 127.0.0.1:3000] [--redis redis://127.0.0.1:6379]
//!                     [--redis-ca-file ca.pem] [--site-root target/site] [--secure-cookies]
//!                     [--trusted-proxy CIDR]... [--edge-url URL] [--log-format text|json]
//!                     [--api-rate 600/1m]
//! ```
//! `--help` lists every flag; each can also be set by the environment variable
//! named there.
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
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use floodgate_dashboard::auth::ensure_operator;
use floodgate_dashboard::router::router;
use floodgate_dashboard::state::Core;
use floodgate_edge::args::{LogArgs, StoreArgs, socket_addr};
use floodgate_edge::store::NativeStore;
use floodgate_shared::policy::Quota;

/// Floodgate's operator dashboard: limits, API keys, traffic. The first operator
/// comes from FLOODGATE_ADMIN_USER and FLOODGATE_ADMIN_PASSWORD (or
/// FLOODGATE_ADMIN_PASSWORD_FILE).
#[derive(Debug, Parser)]
#[command(name = "floodgate-dashboard", version)]
struct Args {
    /// Where to listen.
    #[arg(long, env = "FLOODGATE_DASHBOARD_LISTEN", default_value = "127.0.0.1:3000", value_parser = socket_addr)]
    listen: SocketAddr,
    #[command(flatten)]
    store: StoreArgs,
    /// The directory holding the browser bundle (scripts/dashboard build).
    #[arg(long, env = "FLOODGATE_SITE_ROOT", default_value = "target/site")]
    site_root: String,
    /// The edge's address (http:// or https://), shown in the pages' example
    /// requests (a placeholder without it).
    #[arg(long, env = "FLOODGATE_EDGE_URL", value_parser = floodgate_edge::args::http_url)]
    edge_url: Option<String>,
    /// Mark the session cookie Secure (serve over HTTPS).
    #[arg(long, env = "FLOODGATE_SECURE_COOKIES")]
    secure_cookies: bool,
    /// A proxy (address or CIDR) whose X-Forwarded-For is believed; repeatable, or
    /// comma-separated.
    #[arg(long, env = "FLOODGATE_TRUSTED_PROXY", value_delimiter = ',', value_parser = ip_net)]
    trusted_proxy: Vec<ipnet::IpNet>,
    /// Requests each admin API token (/api/v1/…) may make, like 600/1m.
    #[arg(long, env = "FLOODGATE_API_RATE", default_value = floodgate_dashboard::state::API_RATE, value_parser = quota)]
    api_rate: Quota,
    #[command(flatten)]
    log: LogArgs,
}

fn quota(v: &str) -> Result<Quota, String> {
    Quota::parse_short(v).map_err(|e| format!("{e} (expected LIMIT/PERIOD, like 600/1m)"))
}

fn ip_net(v: &str) -> Result<ipnet::IpNet, String> {
    v.parse::<ipnet::IpNet>()
        .or_else(|_| v.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("expected an IP address or a CIDR range like 10.0.0.0/8, got {v:?}"))
}

/// Why the dashboard could not start.
fn fail(message: String) -> ExitCode {
    tracing::error!("{message}");
    ExitCode::from(2)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    args.log.init();
    let options = args.store.options(Duration::from_secs(2));
    // the message names the URL, its password redacted
    let store = match NativeStore::connect(&options).await {
        Ok(s) => s,
        Err(e) => return fail(format!("cannot reach the store: {e}")),
    };
    let user = std::env::var("FLOODGATE_ADMIN_USER").ok();
    let password = match std::env::var("FLOODGATE_ADMIN_PASSWORD") {
        Ok(p) => Some(p),
        Err(_) => match std::env::var("FLOODGATE_ADMIN_PASSWORD_FILE") {
            Ok(f) => match std::fs::read_to_string(&f) {
                Ok(p) => Some(p.trim_end_matches(['\r', '\n']).to_string()),
                Err(e) => return fail(format!("FLOODGATE_ADMIN_PASSWORD_FILE {f}: {e}")),
            },
            Err(_) => None,
        },
    };
    match (user, password) {
        (Some(u), Some(p)) => match ensure_operator(&store, &u, &p).await {
            Ok(true) => tracing::info!(operator = %u, "created operator {u:?}"),
            Ok(false) => {
                tracing::info!(operator = %u, "operator {u:?} exists; its password is kept")
            }
            Err(e) => return fail(format!("cannot create operator {u:?}: {e}")),
        },
        (Some(_), None) | (None, Some(_)) => {
            return fail(
                "set both FLOODGATE_ADMIN_USER and FLOODGATE_ADMIN_PASSWORD (or _FILE), or neither"
                    .into(),
            );
        }
        (None, None) => {}
    }
    let mut core = Core::new(store);
    core.secure_cookies = args.secure_cookies;
    core.trusted_proxies = args.trusted_proxy;
    core.edge_url = args.edge_url;
    core.api_quota = args.api_rate;
    let app = router(core, &args.site_root);
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => return fail(format!("--listen {}: {e}", args.listen)),
    };
    tracing::info!(listen = %args.listen, "floodgate-dashboard: listening on http://{}", args.listen);
    match axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(floodgate_edge::shutdown_signal())
    .await
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(format!("serving: {e}")),
    }
}
