//! A policy as the pages describe it (pure): its quota, how it is decided across
//! edges, its dimensions and its failure mode, in the configuration's words.

use floodgate_shared::policy::{Consistency, PolicySpec};

pub fn dimension_name(d: floodgate_shared::policy::Dimension) -> &'static str {
    use floodgate_shared::policy::Dimension::*;
    match d {
        ApiKey => "api_key",
        Endpoint => "endpoint",
        ClientIp => "client_ip",
        Identity => "identity",
    }
}

pub fn failure_mode_name(p: &PolicySpec) -> String {
    serde_json::to_value(p.failure_mode)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// "1000 / 1m" (or "1000 per 1m, burst 2000" when refill differs), with the
/// algorithm when it is not the token bucket.
pub fn describe_quota(p: &PolicySpec) -> String {
    let base = match p.quota.refill {
        Some(r) if r != p.quota.capacity => {
            format!("{r} / {}, burst {}", p.quota.period, p.quota.capacity)
        }
        _ => format!("{} / {}", p.quota.capacity, p.quota.period),
    };
    match p.algorithm {
        floodgate_shared::policy::Algorithm::TokenBucket => base,
        a => format!("{base} ({})", a.name().replace('_', " ")),
    }
}

/// How a policy is decided across edges, as the policy list shows it: `exact`, or
/// `bounded, at most 50 over` (tokens above the quota in any window).
pub fn describe_consistency(p: &PolicySpec) -> String {
    consistency_label(p.consistency, p.max_overshoot)
}

pub(crate) fn consistency_label(c: Consistency, bound: Option<u64>) -> String {
    match (c, bound) {
        (Consistency::Exact, _) => "exact".to_string(),
        (c, Some(n)) => format!("{}, at most {n} over", c.name()),
        (c, None) => c.name().to_string(),
    }
}
