//! The limits a request must pass: the policies of the caller's plan that match
//! its route and address, each with its bucket's key ([`Limits`]), and what the
//! answers of those limits carry (the quota headers, IETF fields and a jittered
//! Retry-After).

use floodgate_shared::apikeys::KeyRecord;
use floodgate_shared::config::EdgeConfig;
use floodgate_shared::contract::{Answer, PolicyState, ietf_fields, jittered};
use floodgate_shared::policy::{FailureMode, Policy, Quota};
use floodgate_shared::routes::Route;
use floodgate_shared::script::{Check, Verdict};
use floodgate_shared::time::{Clock, Micros};

use super::{Pipeline, Reply, RequestHead};
use crate::store::{MaybeSend, MaybeSync, Store};

/// An authenticated request and the limits it must pass.
pub struct Limits<'c> {
    pub config: &'c EdgeConfig,
    pub record: KeyRecord,
    pub route: Option<&'c Route>,
    /// `(bucket key, policy)` per matching policy.
    pub policies: Vec<(String, &'c Policy)>,
    /// When the pipeline started deciding it (the instance's clock).
    pub started: Micros,
}

impl Limits<'_> {
    pub fn route_name(&self) -> Option<&str> {
        self.route.map(|r| r.name.as_str())
    }

    /// The policies that can refuse (not shadow ones).
    pub fn enforced(&self) -> impl Iterator<Item = &(String, &Policy)> {
        self.policies.iter().filter(|(_, p)| !p.shadow())
    }

    /// The failure mode applied when the store cannot decide: the strictest of
    /// the enforced policies'.
    pub fn mode(&self) -> FailureMode {
        FailureMode::strictest(self.enforced().map(|(_, p)| p.failure_mode()))
    }

    /// The bucket checks, owned: a check that misses its deadline goes on in the
    /// background with them.
    pub fn checks(&self) -> Vec<OwnedCheck> {
        self.policies
            .iter()
            .map(|(key, p)| OwnedCheck {
                key: key.clone(),
                quota: *p.quota(),
                cost: p.cost(),
                shadow: p.shadow(),
            })
            .collect()
    }

    /// The quota headers of `verdict` when it admits (with the IETF fields when
    /// the configuration asks for them), or the 429 with Retry-After (jittered,
    /// never early).
    pub fn answer(&self, verdict: &Verdict) -> Result<Vec<(&'static str, String)>, Reply> {
        match Answer::for_decision(verdict.headline()) {
            Answer::Forward { headers } => {
                let mut h = headers.pairs();
                h.extend(self.ietf(verdict));
                Ok(h)
            }
            Answer::Reject { mut headers, .. } => {
                headers.retry_after = headers.retry_after.map(|w| {
                    jittered(
                        w,
                        self.config.headers().retry_jitter_secs,
                        jitter_seed(&self.record.id, verdict.now),
                    )
                });
                Err(Reply::rate_limited(&headers).with_headers(self.ietf(verdict)))
            }
        }
    }

    /// The IETF `RateLimit-Policy` and `RateLimit` fields for every enforced policy,
    /// when the configuration asks for them.
    fn ietf(&self, verdict: &Verdict) -> Vec<(&'static str, String)> {
        if !self.config.headers().ietf {
            return vec![];
        }
        let states: Vec<PolicyState<'_>> = self
            .policies
            .iter()
            .zip(&verdict.decisions)
            .filter(|((_, p), _)| !p.shadow())
            .map(|((_, p), d)| PolicyState {
                name: p.name(),
                quota: p.quota(),
                decision: d,
            })
            .collect();
        ietf_fields(&states).map(Vec::from).unwrap_or_default()
    }
}

/// A bucket check that owns its parts.
pub struct OwnedCheck {
    key: String,
    quota: Quota,
    cost: u32,
    shadow: bool,
}

/// The checks as the store takes them.
pub fn as_checks(owned: &[OwnedCheck]) -> Vec<Check<'_>> {
    owned
        .iter()
        .map(|c| Check {
            key: &c.key,
            quota: &c.quota,
            cost: c.cost,
            shadow: c.shadow,
        })
        .collect()
}

/// The seed of a client's Retry-After jitter: its key and the instant.
pub fn jitter_seed(key_id: &str, now: Micros) -> u64 {
    key_id
        .bytes()
        .fold(now as u64, |h, b| h.rotate_left(5) ^ u64::from(b))
}

impl<S, C> Pipeline<S, C>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
    C: Clock,
{
    /// The buckets this request must pass: a plan that is not configured, or a
    /// request its policies cannot key (an IP dimension without an address), is
    /// refused.
    pub(super) fn limits<'c>(
        &self,
        config: &'c EdgeConfig,
        record: KeyRecord,
        req: &RequestHead<'_>,
    ) -> Result<Limits<'c>, Reply> {
        let route = config.routes().resolve(req.path);
        let key = (record.id.as_str(), record.identity.as_deref());
        let policies = match config.checks(key, &record.plan, route, req.client_ip) {
            None => {
                return Err(Reply::json(
                    403,
                    "The API key's plan is not configured",
                    None,
                ));
            }
            Some(Err(e)) => {
                return Err(Reply::json(
                    403,
                    "The request cannot be rate limited",
                    Some(&e.to_string()),
                ));
            }
            Some(Ok(c)) => c,
        };
        Ok(Limits {
            config,
            record,
            route,
            policies,
            started: self.clock.now(),
        })
    }
}
