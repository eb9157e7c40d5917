//! The limits a request must pass: the policies of the caller's plan that match
//! its route and address, each with its bucket's key ([`Limits`]), and what the
//! answers of those limits carry (the quota headers, IETF fields and a jittered
//! Retry-After).

use std::sync::Arc;

use floodgate_shared::apikeys::KeyRecord;
use floodgate_shared::config::EdgeConfig;
use floodgate_shared::contract::{
    Answer, JSON_CONTENT_TYPE, PolicyState, USAGE_LIMITED_BODY, credit_headers, ietf_fields,
    jittered,
};
use floodgate_shared::credits::{CreditDecision, Credits};
use floodgate_shared::keys::credits_key;
use floodgate_shared::policy::{FailureMode, Policy, Quota};
use floodgate_shared::routes::Route;
use floodgate_shared::script::{Check, CreditCheck, Verdict, needs_limiter_for};
use floodgate_shared::time::{Clock, Micros};

use super::{Pipeline, Reply, RequestHead};
use crate::store::{MaybeSend, MaybeSync, Store};

/// An authenticated request and the limits it must pass.
pub struct Limits<'c> {
    pub config: &'c EdgeConfig,
    pub record: Arc<KeyRecord>,
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
    /// the enforced policies'; `fail_closed` for a key with credits, whose count
    /// only the store holds (an admission it cannot prove could exceed them).
    pub fn mode(&self) -> FailureMode {
        if self.record.credits.is_some() {
            return FailureMode::FailClosed;
        }
        FailureMode::strictest(self.enforced().map(|(_, p)| p.failure_mode()))
    }

    /// The key's credits, when it has some: one spent per request, decided in the
    /// same call as the buckets. Their count stands as of the key's creation.
    pub fn credit(&self) -> Option<OwnedCredit> {
        let credits = self.record.credits?;
        Some(OwnedCredit {
            key: credits_key(&self.record.id, self.record.identity.as_deref()),
            credits,
            origin: self.record.credits_origin(),
            cost: 1,
        })
    }

    /// [`Limits::answer`] for a call that decided the key's credits too: a
    /// refusal for the credits alone is the usage-limit 429 (credit headers and
    /// a Retry-After to the refill, no quota headers: every bucket had room and
    /// none was consumed); otherwise the buckets' answer, with the credit headers.
    pub fn answer_credited(
        &self,
        verdict: &Verdict,
        credits: Option<&CreditDecision>,
    ) -> Result<Vec<(&'static str, String)>, Reply> {
        let Some(c) = credits else {
            return self.answer(verdict);
        };
        let buckets_fit = verdict
            .decisions
            .iter()
            .zip(&verdict.shadow)
            .all(|(d, shadow)| *shadow || d.allowed());
        if !c.admitted && buckets_fit {
            return Err(Reply {
                status: 429,
                headers: vec![("Content-Type", JSON_CONTENT_TYPE.into())],
                body: USAGE_LIMITED_BODY.into(),
            }
            .with_headers(credit_headers(c)));
        }
        let extra = credit_headers(&CreditDecision {
            retry_after: None,
            ..*c
        });
        if verdict.decisions.is_empty() {
            return Ok(extra);
        }
        match self.answer(verdict) {
            Ok(mut h) => {
                h.extend(extra);
                Ok(h)
            }
            Err(reply) => Err(reply.with_headers(extra)),
        }
    }

    /// Whether identical requests' checks can share one call: the token bucket
    /// script decides several at one instant in one call
    /// ([`floodgate_shared::script::merge`]); no other script can.
    pub fn mergeable(&self) -> bool {
        self.policies
            .iter()
            .all(|(_, p)| !needs_limiter_for(p.quota(), p.shadow()))
    }

    /// Whether `owned` are this request's bucket checks (without making them).
    pub fn checks_are(&self, owned: &[OwnedCheck]) -> bool {
        owned.len() == self.policies.len()
            && self.policies.iter().zip(owned).all(|((key, p), o)| {
                o.key == *key
                    && o.quota == *p.quota()
                    && o.cost == p.cost()
                    && o.shadow == p.shadow()
            })
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
    /// never early). Shadow policies alone enforce nothing: no headers (their
    /// denial must not answer the request).
    pub fn answer(&self, verdict: &Verdict) -> Result<Vec<(&'static str, String)>, Reply> {
        if verdict.admitted && self.enforced().next().is_none() {
            return Ok(vec![]);
        }
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
#[derive(Debug, PartialEq, Eq)]
pub struct OwnedCheck {
    key: String,
    quota: Quota,
    cost: u32,
    shadow: bool,
}

impl OwnedCheck {
    pub fn new(key: &str, quota: Quota, cost: u32, shadow: bool) -> Self {
        Self {
            key: key.to_string(),
            quota,
            cost,
            shadow,
        }
    }
}

/// A key's credits to decide, owned (see [`Limits::credit`]).
pub struct OwnedCredit {
    key: String,
    credits: Credits,
    origin: Micros,
    cost: u64,
}

impl OwnedCredit {
    /// As the store takes it.
    pub fn as_check(&self) -> CreditCheck<'_> {
        CreditCheck {
            key: &self.key,
            credits: &self.credits,
            origin: self.origin,
            cost: self.cost,
        }
    }
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
        record: Arc<KeyRecord>,
        req: &RequestHead<'_>,
        started: Micros,
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
            started,
        })
    }
}
