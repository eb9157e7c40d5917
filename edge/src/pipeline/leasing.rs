//! Bounded consistency on the request's path: a request whose policies are all
//! leased (`bounded`, or `auto` and hot here) is decided from tokens at hand in
//! this instance's memory — its own leases of the global buckets, or what it
//! drew from its region's tally — with no store call at all; with a regional
//! store, a key it holds nothing of is decided at its region's tally in ONE
//! regional round trip ([`super::tally`]). Leases are refilled ahead, in the
//! background. What is leased, and how the bound holds, is [`super::leases`]
//! and `floodgate_shared::tally`.

use std::sync::atomic::Ordering;

use floodgate_shared::policy::{Consistency, Policy};
use floodgate_shared::script::Verdict;
use floodgate_shared::time::{Clock, Micros};

use super::leases::{GiveBack, Leases, Refill};
use super::limits::Limits;
use super::{Admit, Pipeline, Task, boxed};
use crate::breaker::Phase;
use crate::stats::{Leasing, Outcome, Stats, StatsField};
use crate::store::{MaybeSend, MaybeSync, Store};

impl<S, C> Pipeline<S, C>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
    C: Clock,
{
    /// The admission of a request decided from leased tokens, or `None`: the exact
    /// path decides (tokens not at hand, an exact, shadow or in-flight-limited
    /// policy, the regional store unreachable). Counted per bounded policy as
    /// decided locally or exactly.
    pub(super) async fn leased(&self, limits: &Limits<'_>, later: &mut Vec<Task>) -> Option<Admit> {
        let admit = self.try_leased(limits, later).await;
        for g in self.leases.take_given_back() {
            later.push(self.give_back(g));
        }
        let how = if admit.is_some() {
            Leasing::Local
        } else {
            Leasing::Exact
        };
        let bounded = limits
            .policies
            .iter()
            .filter(|(_, p)| p.consistency() != Consistency::Exact)
            .map(|(_, p)| p.name());
        self.stats.count_leasing(limits.started, bounded, how);
        admit
    }

    async fn try_leased(&self, limits: &Limits<'_>, later: &mut Vec<Task>) -> Option<Admit> {
        let now = limits.started;
        if limits.policies.iter().any(|(_, p)| {
            p.shadow() || p.max_in_flight().is_some() || p.consistency() == Consistency::Exact
        }) {
            return None;
        }
        // every policy is asked: `auto` ones record the request for their rate
        let leased = limits
            .policies
            .iter()
            .filter(|(k, p)| self.leases.leased(k, p, now))
            .count();
        if leased < limits.policies.len() {
            return None;
        }
        let buckets: Vec<(&str, &Policy)> = limits
            .policies
            .iter()
            .map(|(k, p)| (k.as_str(), *p))
            .collect();
        let regions = limits.config.regions();
        let decisions = match &self.regional {
            None => {
                self.refill_leases(&buckets, regions, now, later);
                self.leases.spend(&buckets, now)
            }
            Some(region) => {
                // (a regional store is at least one region)
                let regions = regions.max(1);
                let hot = self.leases.hot(&buckets);
                self.refill_leases(&hot, regions, now, later);
                match self.leases.spend(&buckets, now) {
                    Some(spent) => Some(spent),
                    // boxed: a regional round trip is rarer than a request, and
                    // its future would weigh on every request's
                    None => Box::pin(self.tallied(region, &buckets, regions, later)).await,
                }
            }
        };
        let Some(decisions) = decisions else {
            self.totals.lease_misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        if self.global.phase() != Phase::Closed || self.leases.global_failing() {
            self.totals
                .leased_while_down
                .fetch_add(1, Ordering::Relaxed);
        }
        let verdict = Verdict {
            admitted: true,
            now,
            shadow: vec![false; decisions.len()],
            decisions,
            revision: Default::default(),
        };
        let headers = limits.answer(&verdict).ok()?;
        self.count(limits, Outcome::Allowed, None);
        self.count_admitted(limits, None);
        Some(Admit::caller(
            &limits.record,
            limits.route_name(),
            headers,
            vec![],
        ))
    }

    /// Starts the instance-lease refills now due, in the background.
    fn refill_leases(
        &self,
        buckets: &[(&str, &Policy)],
        regions: u32,
        now: Micros,
        later: &mut Vec<Task>,
    ) {
        for r in self.leases.refills_due(buckets, regions, now) {
            if let Some((_, p)) = buckets.iter().find(|(k, _)| *k == r.key) {
                self.count_refill(&r.key, p);
                later.push(self.lease_refill(r, p, regions));
            }
        }
    }

    /// Gives a cooled `auto` key's lease back to the global bucket, in the
    /// background (Redis' clock: the lease's times are Redis').
    fn give_back(&self, g: GiveBack) -> Task {
        let store = self.global.store.clone();
        boxed(async move {
            let args = [
                String::new(),
                g.emission.to_string(),
                g.member,
                g.unused.to_string(),
            ];
            let _ = store.return_lease(&g.key, &args).await;
        })
    }

    /// As the instance stops (nothing spends its leases any more): its instance
    /// leases go back to the global buckets, their unspent tokens with them
    /// (`lua/lease_return.lua`, one call per lease), and what it drew from its
    /// region's tally and did not spend is taken off the counts (one pipeline
    /// of `HINCRBY`s, while their epochs last).
    pub(super) async fn hand_back(&self) {
        let now = self.clock.now();
        let surrendered = self.leases.surrender(now);
        let mut calls: Vec<Task> = surrendered
            .leases
            .into_iter()
            .map(|g| self.give_back(g))
            .collect();
        calls.extend(self.give_draws_back(surrendered.draws));
        futures_util::future::join_all(calls).await;
    }

    /// Counts a refill of `key` of `policy` about to be sent.
    fn count_refill(&self, key: &str, policy: &Policy) {
        count_refill(&self.stats, &self.leases, self.clock.now(), key, policy);
    }

    /// Takes a lease for this instance from the global bucket (cost 0), retiring
    /// the spent ones, in the background.
    fn lease_refill(&self, r: Refill, policy: &Policy, regions: u32) -> Task {
        let store = self.global.store.clone();
        let leases = self.leases.clone();
        let cfg = self.leases.settings().for_policy(policy, regions);
        let q = *policy.quota();
        let sent = self.clock.now();
        boxed(async move {
            let args = cfg.take_args(
                None,
                q.burst_window(),
                q.emission_interval(),
                0,
                r.want,
                &r.id,
                Some(&r.retire),
            );
            let got = store.take_lease(&r.key, &args).await.ok();
            let full_at = got.map(|t| sent + (t.full_at - t.now).max(0));
            leases.refilled(&r, got.as_ref(), sent, full_at);
        })
    }
}

/// Counts a refill of `key` of `policy` about to be sent (a lease's, or a
/// tally's top-up), with the tokens its leases had outstanding when last
/// heard of.
pub(super) fn count_refill(
    stats: &Stats,
    leases: &Leases,
    now: Micros,
    key: &str,
    policy: &Policy,
) {
    let name = policy.name().to_string();
    stats.bump(now, StatsField::Leasing(name.clone(), Leasing::Refills), 1);
    let outstanding = leases.outstanding(key);
    stats.bump(
        now,
        StatsField::Leasing(name, Leasing::Outstanding),
        outstanding,
    );
}
