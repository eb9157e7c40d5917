//! Recent 429s: the buckets the store throttled a moment ago, answered here until
//! they can admit again. When the store denies a bucket with an exact wait `w`, the
//! bucket cannot admit the same request before `now + w` (a denial changes no
//! state, and only time refills), so until then the instance answers that bucket
//! with a 429 itself. It only ever refuses, and only while the store would too: it
//! never admits a request the store would have denied, and it stops no later than
//! the instant the store would admit again (anchored at the call's start on this
//! instance's clock, so at most one round trip early, never late).
//!
//! A denial holds only for the policy that made it: each is remembered with the
//! quota and cost it was decided by, and a request whose policy reads otherwise
//! now (the operator raised the quota, changed the algorithm or the route's
//! cost) is decided by the store again. Bucket keys name the policy, not its
//! quota, so the key alone would answer from the old decision until its
//! Retry-After ran out (a daily quota: for hours).

use std::sync::Mutex;

use floodgate_shared::bucket::{Admission, Decision};
use floodgate_shared::contract::{PolicyState, RateLimitHeaders, ietf_fields, jittered};
use floodgate_shared::policy::{Policy, Quota};
use floodgate_shared::script::Verdict;
use floodgate_shared::stats::PolicyOutcome;
use floodgate_shared::time::{Clock, Micros, ceil_secs};

use super::limits::{Limits, jitter_seed};
use super::{Pipeline, Reply};
use crate::bounded_map::{BoundedMap, WhenFull};
use crate::stats::Outcome;
use crate::store::{MaybeSend, MaybeSync, Store};
use crate::sync::lock;

/// One bucket the store throttled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    /// Local instant at which the bucket admits the request again.
    pub until: Micros,
    /// Local instant at which the bucket is full again (`X-RateLimit-Reset`).
    pub full_at: Micros,
    pub limit: u64,
    /// The quota and cost the store decided by: the memory holds only for them.
    pub quota: Quota,
    pub cost: u32,
}

impl Throttled {
    /// Whether this denial was decided by `policy` as it reads now.
    fn holds_for(&self, policy: &Policy) -> bool {
        self.quota == *policy.quota() && self.cost == policy.cost()
    }
}

/// The buckets throttled recently, until they admit again.
pub struct ThrottleMemory {
    until: Mutex<BoundedMap<String, Throttled>>,
}

/// Bound on remembered buckets; expired ones are dropped first, and past it a
/// new 429 is not remembered.
const MAX_REMEMBERED: usize = 100_000;

impl Default for ThrottleMemory {
    fn default() -> Self {
        Self {
            until: Mutex::new(BoundedMap::new(MAX_REMEMBERED, WhenFull::Refuse)),
        }
    }
}

impl ThrottleMemory {
    /// The buckets still throttled at `now` among `buckets` (key, policy as it
    /// reads now), with each one's index: only denials its policy made.
    pub fn lookup<'a>(
        &self,
        buckets: impl IntoIterator<Item = (&'a str, &'a Policy)>,
        now: Micros,
    ) -> Vec<(usize, Throttled)> {
        let map = lock(&self.until);
        if map.is_empty() {
            return vec![];
        }
        buckets
            .into_iter()
            .enumerate()
            .filter_map(|(i, (k, p))| {
                map.get(k)
                    .filter(|d| d.until > now && d.holds_for(p))
                    .map(|d| (i, *d))
            })
            .collect()
    }

    pub fn remember(&self, key: &str, throttled: Throttled, now: Micros) {
        lock(&self.until).insert(key.to_string(), throttled, |d| d.until > now);
    }
}

impl<S, C> Pipeline<S, C>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
    C: Clock,
{
    /// A bucket the store throttled a moment ago is answered here, with the quota
    /// headers (and IETF fields) of the throttling policies, until it can admit
    /// the request again.
    pub(super) fn recently_throttled(&self, limits: &Limits<'_>) -> Result<(), Reply> {
        if !self.settings.throttle_memory {
            return Ok(());
        }
        let now = limits.started;
        let hits = self
            .throttled
            .lookup(limits.enforced().map(|(k, p)| (k.as_str(), *p)), now);
        let Some((_, worst)) = hits.iter().max_by_key(|(_, d)| d.until) else {
            return Ok(());
        };
        self.count(limits, Outcome::Throttled, None);
        let names: Vec<&str> = hits
            .iter()
            .filter_map(|(i, _)| limits.enforced().nth(*i).map(|(_, p)| p.name()))
            .collect();
        self.count_policies(limits, |_, p| {
            (!p.shadow() && names.contains(&p.name())).then_some(PolicyOutcome::Throttled)
        });
        let wait = ceil_secs(worst.until - now).max(1);
        let headers = RateLimitHeaders {
            limit: worst.limit,
            remaining: 0,
            reset: ceil_secs(worst.full_at.max(now)),
            retry_after: Some(jittered(
                wait,
                limits.config.headers().retry_jitter_secs,
                jitter_seed(&limits.record.id, now),
            )),
        };
        let reply = Reply::rate_limited(&headers);
        if !limits.config.headers().ietf {
            return Err(reply);
        }
        Err(reply.with_headers(remembered_ietf(limits, &hits, now)))
    }

    /// Remembers the throttling buckets of `verdict` until they admit again.
    pub(super) fn remember_throttled(
        &self,
        limits: &Limits<'_>,
        verdict: &Verdict,
        sent: Micros,
        finished: Micros,
    ) {
        for ((key, policy), d) in limits
            .policies
            .iter()
            .zip(&verdict.decisions)
            .filter(|((_, p), _)| !p.shadow())
        {
            if let Admission::Denied {
                retry_after: Some(wait),
            } = d.outcome
            {
                // Redis decided somewhere between `sent` and `finished` on our
                // clock; anchoring at `sent` can only end the local answer early
                // (the store then decides), never late.
                let throttled = Throttled {
                    until: sent + wait,
                    full_at: sent + (d.full_at - d.now),
                    limit: d.limit,
                    quota: *policy.quota(),
                    cost: policy.cost(),
                };
                self.throttled.remember(key, throttled, finished);
            }
        }
    }
}

/// The IETF fields of the remembered buckets `hits`, as their denials said.
fn remembered_ietf(
    limits: &Limits<'_>,
    hits: &[(usize, Throttled)],
    now: Micros,
) -> Vec<(&'static str, String)> {
    let enforced: Vec<&(String, &Policy)> = limits.enforced().collect();
    let decisions: Vec<(&Policy, Decision)> = hits
        .iter()
        .map(|(i, d)| {
            let decision = Decision {
                outcome: Admission::Denied {
                    retry_after: Some(d.until - now),
                },
                limit: d.limit,
                remaining: 0,
                now,
                full_at: d.full_at.max(now),
            };
            (enforced[*i].1, decision)
        })
        .collect();
    let states: Vec<PolicyState<'_>> = decisions
        .iter()
        .map(|(p, d)| PolicyState {
            name: p.name(),
            quota: p.quota(),
            decision: d,
        })
        .collect();
    ietf_fields(&states).map(Vec::from).unwrap_or_default()
}
