//! Floodgate's edge: the stores that run the token-bucket script against Redis,
//! the request pipeline, the settings and proxy rules its two hosts share, and the
//! native host (the Worker is `edge/worker/`).

pub mod bounded_map;
pub mod breaker;
pub mod deadline;
pub mod exchange;
pub mod fallback;
pub mod pipeline;
pub mod proxy;
pub mod settings;
pub mod stats;
pub mod store;
pub mod sync;
pub mod timer;

#[cfg(feature = "native")]
pub mod admin;
#[cfg(feature = "native")]
pub mod args;
#[cfg(feature = "native")]
pub mod cli;
#[cfg(feature = "native")]
pub mod demo_upstream;
#[cfg(feature = "native")]
pub mod forward_auth;
#[cfg(feature = "native")]
pub mod identities;
#[cfg(feature = "native")]
pub mod metrics;
#[cfg(feature = "native")]
pub mod native_host;
#[cfg(feature = "native")]
pub mod tokens;

/// Completes on Ctrl-C or SIGTERM: the native servers stop gracefully on either.
#[cfg(feature = "native")]
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
