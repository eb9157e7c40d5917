//! Floodgate's operator dashboard. It shares `floodgate-shared`'s policy types and
//! validation with the edge; the Leptos application lands with the dashboard issue.

pub use floodgate_shared::policy::{Policy, PolicyError, PolicySpec};
