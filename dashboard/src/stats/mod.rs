//! The traffic page's data side (its view is `pages::traffic`): what the edges
//! recorded, as the dashboard sums and shows it.
//! - [`range`]: the time axis (ranges, resolutions);
//! - [`series`]: the bars per endpoint and the latency ([`series::Traffic`]);
//! - [`leasing`]: the bounded and `auto` policies' consistency figures.

pub mod leasing;
pub mod range;
pub mod series;
