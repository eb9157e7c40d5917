//! Floodgate's operator dashboard: Leptos pages rendered on the server
//! (`ssr`, served by leptos_axum) and hydrated in the browser (`hydrate`). It shares
//! the edge's policy types and validation (`floodgate-shared`), and writes what the
//! edge reads.
//!
//! The modules, top to bottom (each uses only those below it):
//! - [`router`] (ssr): the HTTP server and its guard; used by the binary only.
//!   [`adminapi`] (ssr): the admin HTTP API (`/api/v1/…`, tokens, not sessions).
//! - [`app`]: the shell and the routes of the pages; `pages`: one module per page.
//! - [`api`]: the server functions, the dashboard's only API; [`forms`]: what
//!   their forms post and the edit each makes.
//! - [`auth`] (ssr): operators, sign-in, sessions, cookies; [`stats::store`]
//!   (ssr): the edges' statistics read from Redis; [`fleet`] (ssr): their
//!   `/metrics` totals; [`state`] (ssr): what every handler shares.
//! - Pure, for both builds: [`wire`] (what the pages and the server functions
//!   exchange), [`error`] (their one error, [`error::AppError`]), [`stats`] (the
//!   traffic page's data), [`describe`] (words for operators), [`chart_geometry`]
//!   (the charts' plot geometry), [`time`] (times as shown).

#[cfg(feature = "ssr")]
pub mod adminapi;
pub mod api;
pub mod app;
#[cfg(feature = "ssr")]
pub mod auth;
pub mod chart_geometry;
pub mod describe;
pub mod error;
#[cfg(feature = "ssr")]
pub mod fleet;
pub mod forms;
mod pages;
#[cfg(feature = "ssr")]
pub mod router;
#[cfg(feature = "ssr")]
pub mod state;
pub mod stats;
pub mod time;
pub mod wire;

/// Request headers from `(name, value)` pairs, for the server side's unit tests.
#[cfg(all(test, feature = "ssr"))]
pub(crate) fn test_headers(pairs: &[(&'static str, &str)]) -> axum::http::HeaderMap {
    let mut h = axum::http::HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, v.parse().unwrap());
    }
    h
}

pub use floodgate_shared::policy;

/// The browser entry point: readies the reactive system; Leptos' script then
/// hydrates each island of the page (`#[island]` in `pages`). Marks the page
/// (`<body data-hydrated>`; the browser tests wait for it).
#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_islands();
    if let Some(body) = leptos::prelude::document().body() {
        let _ = body.set_attribute("data-hydrated", "1");
    }
}
