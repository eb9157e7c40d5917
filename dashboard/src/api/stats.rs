//! What the edges recorded, for the traffic page (read by [`crate::stats::store`]).

use leptos::prelude::*;

#[cfg(feature = "ssr")]
use super::ctx;
use crate::error::AppError;
use crate::stats::leasing::LeasingFigures;
use crate::stats::series::Traffic;

/// The traffic page's data: `range` (`15m`, `1h`, `24h`) at `resolution` (`10s`,
/// `1m`, `10m`, `1h`; the range's default when absent or not offered).
#[server(endpoint = "traffic")]
pub async fn traffic_stats(
    #[server(default)] range: String,
    #[server(default)] resolution: String,
) -> Result<Traffic, AppError> {
    use crate::stats::range::{Range, Resolution};
    use crate::stats::store;
    ctx::session().await?;
    let core = ctx::core()?;
    let range = Range::parse(&range).unwrap_or(Range::Minutes15);
    let resolution = range.resolution(Resolution::parse(&resolution));
    let patterns = ctx::stored_config(&core)
        .await?
        .map(|c| store::route_patterns(c.spec()))
        .unwrap_or_default();
    Ok(store::read(&core.store, ctx::now_secs(), range, resolution, patterns).await?)
}

/// The bounded and `auto` limits' figures over `range` (`15m`, `1h`, `24h`): the
/// share decided locally, the global calls saved, the overshoot budget in use.
#[server(endpoint = "leasing")]
pub async fn leasing_stats(#[server(default)] range: String) -> Result<LeasingFigures, AppError> {
    use crate::stats::range::Range;
    ctx::session().await?;
    let core = ctx::core()?;
    let range = Range::parse(&range).unwrap_or(Range::Minutes15);
    let Some(config) = ctx::stored_config(&core).await? else {
        return Ok(LeasingFigures {
            policies: vec![],
            regions: 0,
        });
    };
    let now = ctx::now_secs();
    Ok(LeasingFigures {
        policies: crate::stats::store::leasing(&core.store, now, range, &config).await?,
        regions: config.regions(),
    })
}
