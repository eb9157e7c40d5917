//! The backtest of a limit's form (feature `ssr`): the edges' sample of recent
//! decisions replayed against the current configuration and against it with the
//! change applied; nothing is saved.

use std::collections::{BTreeMap, BTreeSet};

use floodgate_shared::config::{ConfigEdit, ConfigSpec, EdgeConfig};
use floodgate_shared::policy::Dimension;
use floodgate_shared::simulate::replay;
use floodgate_shared::stats::{Endpoint, Outcome, SampleEntry};

use super::ctx;
use crate::error::AppError;
use crate::stats::store;
use crate::wire::{Backtest, BacktestRow, Saved};

/// Replays the sample against the stored configuration with and without `edit`.
/// Beside the replays it reports what the edge answered those requests, and what
/// the replay cannot see: decisions missing from the sample, degraded ones,
/// policies keyed by address.
pub(super) async fn backtest(csrf: &str, edit: ConfigEdit) -> Result<Saved, AppError> {
    let (core, _) = ctx::mutation(csrf).await?;
    let Some(current) = ctx::stored_config(&core).await? else {
        return Err(AppError::Conflict(
            "no valid configuration is stored to compare with".into(),
        ));
    };
    let mut proposal = current.spec().clone();
    let at = edit
        .apply(&mut proposal)
        .map_err(|e| AppError::from_policy(e, Some(current.spec())))?
        .at;
    let proposed =
        EdgeConfig::new(proposal.clone()).map_err(|e| ctx::on_form(e, at.as_deref(), &proposal))?;
    let sample = store::sample(&core.store).await?;
    let (from_ms, to_ms) = match (sample.first(), sample.last()) {
        (Some(f), Some(l)) => (f.at_ms, l.at_ms),
        _ => (0, 0),
    };
    let dropped = if sample.is_empty() {
        0
    } else {
        store::sample_dropped(&core.store, from_ms, to_ms).await?
    };
    let mut b = compare(&current, &proposed, &sample);
    b.ip_policies = ip_policies(current.spec(), &proposal);
    (b.from_ms, b.to_ms, b.dropped) = (from_ms, to_ms, dropped);
    Ok(Saved::Preview(b))
}

/// Per endpoint: the 429s the edge answered in `sample`, and the keys seen,
/// grouped as the replay groups (a route that is gone counts as unmatched).
fn observed<'a>(
    current: &EdgeConfig,
    sample: &'a [SampleEntry],
) -> (
    BTreeMap<Endpoint, u64>,
    BTreeMap<Endpoint, BTreeSet<&'a str>>,
) {
    let grouped = |e: &Endpoint| match e.route() {
        Some(r) if current.routes().routes().iter().any(|x| x.name == r) => e.clone(),
        _ => Endpoint::Unmatched,
    };
    let mut throttled: BTreeMap<Endpoint, u64> = BTreeMap::new();
    let mut seen: BTreeMap<Endpoint, BTreeSet<&str>> = BTreeMap::new();
    for r in sample {
        let e = grouped(&r.endpoint);
        *throttled.entry(e.clone()).or_default() += u64::from(r.outcome == Outcome::Throttled);
        seen.entry(e).or_default().insert(&r.key_id);
    }
    (throttled, seen)
}

/// The replays of `sample` at `current` and at `proposed`, side by side with what
/// the edge answered (the span, the sample's gaps and address-keyed policies are
/// the caller's to fill in).
fn compare(current: &EdgeConfig, proposed: &EdgeConfig, sample: &[SampleEntry]) -> Backtest {
    let now = replay(current, sample);
    let then = replay(proposed, sample);
    let (observed, seen) = observed(current, sample);
    let rows = then
        .iter()
        .map(|(endpoint, p)| {
            let c = now.get(endpoint).cloned().unwrap_or_default();
            BacktestRow {
                endpoint: endpoint.clone(),
                requests: p.requests,
                observed: observed.get(endpoint).copied().unwrap_or(0),
                throttled_now: c.throttled,
                throttled: p.throttled,
                keys: p.keys_throttled.len() as u64,
                keys_seen: seen.get(endpoint).map_or(0, |s| s.len() as u64),
                shadow: p.shadow_throttled,
            }
        })
        .collect();
    Backtest {
        sampled: sample.len() as u64,
        degraded: sample
            .iter()
            .filter(|r| r.outcome == Outcome::Degraded)
            .count() as u64,
        rows,
        patterns: store::route_patterns(current.spec()),
        ..Backtest::default()
    }
}

/// The policies keyed by client address in either configuration (the sample
/// keeps no addresses, so the replay cannot decide them).
fn ip_policies(current: &ConfigSpec, proposal: &ConfigSpec) -> Vec<String> {
    current
        .policies
        .iter()
        .chain(&proposal.policies)
        .filter(|p| p.dimensions.contains(&Dimension::ClientIp))
        .map(|p| p.name.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}
