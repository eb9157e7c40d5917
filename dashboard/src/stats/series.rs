//! What the traffic page draws (pure): per endpoint, the decisions of each bar
//! ([`Series`]), and the store's latency per bar from the edges' histograms
//! ([`histogram_quantile`]); [`Traffic`] holds a range of them.

use std::collections::BTreeMap;

use floodgate_shared::policy::FailureMode;
use floodgate_shared::stats::Endpoint;
use serde::{Deserialize, Serialize};

use super::range::{Range, Resolution};

/// Counts of one endpoint per bar.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Series {
    pub allowed: Vec<u64>,
    pub throttled: Vec<u64>,
    pub degraded: Vec<u64>,
    /// Admitted requests a shadow policy would have throttled.
    pub shadow: Vec<u64>,
}

impl Series {
    pub fn zeros(n: usize) -> Self {
        Series {
            allowed: vec![0; n],
            throttled: vec![0; n],
            degraded: vec![0; n],
            shadow: vec![0; n],
        }
    }
}

/// The traffic page's data: bar `i` covers `[start + i × step, start + (i+1) × step)`
/// (Unix seconds, UTC).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Traffic {
    pub range: Range,
    pub resolution: Resolution,
    pub start: i64,
    pub bars: usize,
    /// Per endpoint, in the order [`Endpoint`] sorts (routes by name, unmatched last).
    pub endpoints: Vec<(Endpoint, Series)>,
    /// Route name → its path pattern (of the stored configuration).
    pub patterns: BTreeMap<String, String>,
    /// (key id, 429s) over the last `top_minutes` minutes, most throttled first.
    pub top_throttled: Vec<(String, u64)>,
    pub top_minutes: u32,
    /// Store-call latency per bar, µs (None when no call was made).
    pub p50_us: Vec<Option<u64>>,
    pub p99_us: Vec<Option<u64>>,
    /// Decisions taken without Redis over the range: per failure mode, and per
    /// (endpoint, mode).
    pub degraded_by_mode: Vec<(FailureMode, u64)>,
    pub degraded_by_endpoint_mode: Vec<(Endpoint, FailureMode, u64)>,
    /// Circuit-breaker openings and time open (ms) over the range, all edges.
    pub breaker_opened: u64,
    pub breaker_open_ms: u64,
    /// Requests refused by each deny list over the range, all edges.
    pub denied: Vec<(floodgate_shared::deny::DenyList, u64)>,
}

impl Traffic {
    pub fn step(&self) -> i64 {
        self.resolution.secs()
    }
}

/// The upper bound (µs) of the histogram bucket holding quantile `q` of the
/// latency histogram `(upper bound µs, count)`; `None` for an empty histogram.
/// Bounds are the edge's (`lat|<µs>`, `lat|inf` as `u64::MAX`).
pub fn histogram_quantile(hist: &[(u64, u64)], q: f64) -> Option<u64> {
    let mut sorted = hist.to_vec();
    sorted.sort_unstable();
    let total: u64 = sorted.iter().map(|(_, n)| n).sum();
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (bound, n) in sorted {
        seen += n;
        if seen >= rank {
            return Some(bound);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_the_histogram_bounds() {
        let h = [(250, 90), (1000, 9), (u64::MAX, 1)];
        assert_eq!(histogram_quantile(&h, 0.5), Some(250));
        assert_eq!(histogram_quantile(&h, 0.99), Some(1000));
        assert_eq!(histogram_quantile(&h, 1.0), Some(u64::MAX));
        assert_eq!(histogram_quantile(&[], 0.5), None);
        assert_eq!(histogram_quantile(&[(250, 0)], 0.5), None);
    }
}
