//! Floodgate's operator dashboard: Leptos pages rendered on the server
//! (`ssr`, served by leptos_axum) and hydrated in the browser (`hydrate`). It shares
//! the edge's policy types and validation (`floodgate-shared`), and writes what the
//! edge reads.

pub mod api;
pub mod app;
pub mod chart;
pub mod describe;
#[cfg(feature = "ssr")]
pub mod fleet;
pub mod model;
#[cfg(feature = "ssr")]
pub mod server;
pub mod time;

pub use floodgate_shared::policy;

/// The browser entry point: readies the reactive system; Leptos' script then
/// hydrates each island of the page (`#[island]` in [`app`]). Marks the page
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
