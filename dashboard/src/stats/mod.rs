//! The traffic page's data side (its view is `pages::traffic`): what the edges
//! recorded, as the dashboard sums and shows it.
//! - [`range`]: the time axis (ranges, resolutions);
//! - [`series`]: the bars per endpoint and the latency ([`series::Traffic`]);
//! - [`leasing`]: the bounded and `auto` policies' consistency figures;
//! - [`store`] (ssr): all of it read from Redis, where the edges write it.

pub mod leasing;
pub mod range;
pub mod series;
#[cfg(feature = "ssr")]
pub mod store;
