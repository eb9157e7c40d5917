//! Replays requests against a configuration with the pure twins of every
//! algorithm, exactly as the scripts would decide them (all or nothing per request,
//! shadow buckets never deny): the dashboard's backtest of a proposed change.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::bucket::{BucketState, Decision, decide};
use crate::config::EdgeConfig;
use crate::policy::{Algorithm, Quota};
use crate::stats::{Endpoint, SampleEntry};
use crate::time::Micros;
use crate::windows::{
    FixedWindow, SlidingCounter, SlidingLog, calendar_window, fixed_window, sliding_counter,
};

#[derive(Debug, Clone)]
enum State {
    Bucket(Option<BucketState>),
    Fixed(Option<FixedWindow>),
    Log(SlidingLog),
    Counter(Option<SlidingCounter>),
    /// A calendar quota: the start of the window counted in, and its count.
    Calendar(Option<(Micros, u64)>),
}

impl State {
    fn new(q: &Quota) -> Self {
        if q.calendar().is_some() {
            return State::Calendar(None);
        }
        match q.algorithm() {
            Algorithm::TokenBucket => State::Bucket(None),
            Algorithm::FixedWindow => State::Fixed(None),
            Algorithm::SlidingLog => State::Log(SlidingLog::default()),
            Algorithm::SlidingCounter => State::Counter(None),
        }
    }

    /// The decision for `cost` at `now`, and the state after consuming it.
    fn step(&self, q: &Quota, now: Micros, cost: u32) -> (Decision, State) {
        match self {
            State::Bucket(s) => {
                let t = decide(*s, q, now, cost);
                (t.decision, State::Bucket(t.write.or(*s)))
            }
            State::Fixed(s) => {
                let count = FixedWindow::count_at(*s, q.period(), now);
                let (d, w) = fixed_window(count, q.capacity(), q.period(), now, cost);
                (d, State::Fixed(if cost > 0 { w.or(*s) } else { *s }))
            }
            State::Log(log) => {
                let mut next = log.clone();
                let d = next.decide(q.capacity(), q.period(), now, cost);
                (d, State::Log(next))
            }
            State::Counter(s) => {
                let (c, p) = SlidingCounter::aligned(*s, q.period(), now);
                let (d, w) = sliding_counter(c, p, q.capacity(), q.period(), now, cost);
                (d, State::Counter(if cost > 0 { w.or(*s) } else { *s }))
            }
            State::Calendar(s) => {
                let period = q.calendar().expect("a calendar state has a calendar quota");
                let start = period.window(now).start;
                let count = s.filter(|(w, _)| *w == start).map_or(0, |(_, c)| c);
                let d = calendar_window(count, q.capacity(), period, now, cost);
                let next = (d.allowed() && cost > 0).then_some((start, count + u64::from(cost)));
                (d, State::Calendar(next.or(*s)))
            }
        }
    }
}

/// In-memory buckets of any algorithm.
#[derive(Debug, Clone, Default)]
pub struct Simulator {
    buckets: HashMap<String, State>,
}

/// One simulated decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Simulated {
    pub admitted: bool,
    /// Some shadow bucket would have denied.
    pub shadow_denied: bool,
    /// Per check, what the scripts report: the decision when it was consumed or
    /// denied; the untouched state (a cost-0 peek) when it fit but another denied.
    pub decisions: Vec<Decision>,
}

impl Simulator {
    /// Checks `(bucket key, quota, cost, shadow)` at `now`: admitted when every
    /// enforced bucket fits; then every bucket that fits is consumed.
    pub fn check(&mut self, checks: &[(&str, &Quota, u32, bool)], now: Micros) -> Simulated {
        let state = |key: &str, q: &Quota| {
            self.buckets
                .get(key)
                .cloned()
                .unwrap_or_else(|| State::new(q))
        };
        let steps: Vec<(Decision, State)> = checks
            .iter()
            .map(|(key, q, cost, _)| state(key, q).step(q, now, *cost))
            .collect();
        let admitted = steps
            .iter()
            .zip(checks)
            .all(|((d, _), (_, _, _, shadow))| d.allowed() || *shadow);
        let shadow_denied = steps
            .iter()
            .zip(checks)
            .any(|((d, _), (_, _, _, shadow))| !d.allowed() && *shadow);
        let decisions = if admitted {
            let mut out = Vec::with_capacity(checks.len());
            for ((d, next), (key, ..)) in steps.into_iter().zip(checks) {
                if d.allowed() {
                    self.buckets.insert((*key).to_string(), next);
                }
                out.push(d);
            }
            out
        } else {
            steps
                .into_iter()
                .zip(checks)
                .map(|((d, _), (key, q, ..))| {
                    if d.allowed() {
                        state(key, q).step(q, now, 0).0
                    } else {
                        d
                    }
                })
                .collect()
        };
        Simulated {
            admitted,
            shadow_denied,
            decisions,
        }
    }
}

/// What a replay found for one endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointReplay {
    pub requests: u64,
    /// Requests that would have been answered 429.
    pub throttled: u64,
    /// The keys that would have received at least one 429.
    pub keys_throttled: BTreeSet<String>,
    /// Requests a shadow policy would have throttled.
    pub shadow_throttled: u64,
}

/// Replays `requests` (oldest first) against `config`, per endpoint. Requests whose
/// plan is not configured count as throttled (the edge would answer 403); a request
/// to a route `config` does not have counts as unmatched.
pub fn replay(config: &EdgeConfig, requests: &[SampleEntry]) -> BTreeMap<Endpoint, EndpointReplay> {
    let mut sim = Simulator::default();
    let mut out: BTreeMap<Endpoint, EndpointReplay> = BTreeMap::new();
    for r in requests {
        let route = r
            .endpoint
            .route()
            .and_then(|name| config.routes().routes().iter().find(|x| x.name == name));
        let entry = out
            .entry(Endpoint::of(route.map(|x| x.name.as_str())))
            .or_default();
        entry.requests += 1;
        let checks = match config.checks((&r.key_id, None), &r.plan, route, None) {
            Some(Ok(c)) => c,
            _ => {
                entry.throttled += 1;
                entry.keys_throttled.insert(r.key_id.clone());
                continue;
            }
        };
        if checks.is_empty() {
            continue;
        }
        let calls: Vec<(&str, &Quota, u32, bool)> = checks
            .iter()
            .map(|(k, p)| (k.as_str(), p.quota(), p.cost(), p.shadow()))
            .collect();
        let s = sim.check(&calls, r.at_ms * 1000);
        if !s.admitted {
            entry.throttled += 1;
            entry.keys_throttled.insert(r.key_id.clone());
        }
        entry.shadow_throttled += u64::from(s.admitted && s.shadow_denied);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"{"policies":[
        {"name":"default","dimensions":["api_key"],"quota":{"capacity":1000,"period":"1m"},"failure_mode":"fail_closed"},
        {"name":"search","dimensions":["api_key","endpoint"],"quota":{"capacity":3,"period":"1m"},"failure_mode":"fail_closed","algorithm":"fixed_window"},
        {"name":"watch","dimensions":["api_key","endpoint"],"quota":{"capacity":1,"period":"1m"},"failure_mode":"fail_open","shadow":true}],
      "plans":{"free":["default"]},
      "routes":[{"name":"search","pattern":"/v1/search","policies":["search","watch"]}]}"#;

    fn sample(n: usize, key: &str, route: Option<&str>) -> Vec<SampleEntry> {
        (0..n)
            .map(|i| SampleEntry {
                at_ms: 1_764_000_000_000 + i as i64,
                key_id: key.into(),
                plan: "free".into(),
                endpoint: Endpoint::of(route),
                outcome: crate::stats::Outcome::Allowed,
            })
            .collect()
    }

    #[test]
    fn a_replay_counts_the_429s_per_endpoint_and_key_and_what_shadows_would_do() {
        let config = EdgeConfig::from_json(CONFIG).unwrap();
        let mut requests = sample(5, "Ab3dE5gH1j", Some("search"));
        requests.extend(sample(2, "Zz3dE5gH1j", Some("search")));
        requests.extend(sample(4, "Ab3dE5gH1j", None));
        requests.extend(sample(1, "Ab3dE5gH1j", Some("gone")));
        requests.sort_by_key(|r| r.at_ms);
        let r = replay(&config, &requests);
        let search = &r[&Endpoint::Route("search".into())];
        assert_eq!(search.requests, 7);
        assert_eq!(search.throttled, 2, "5 from one key against 3 per minute");
        assert_eq!(search.keys_throttled.len(), 1);
        // the shadow (1 per minute) would have throttled every admitted request after
        // each key's first, but never did
        assert_eq!(search.shadow_throttled, 2 + 1);
        assert_eq!(r[&Endpoint::Unmatched].throttled, 0);
        assert_eq!(
            r[&Endpoint::Unmatched].requests,
            5,
            "a route the configuration no longer has is unmatched"
        );
    }
}

/// Fan-out at internet scale on the pure twins (`scripts/bench fanout`).
#[cfg(any(test, feature = "twins"))]
#[path = "fanout_model.rs"]
pub mod fanout;
