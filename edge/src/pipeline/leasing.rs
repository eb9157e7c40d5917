//! Bounded consistency on the request's path: a request whose policies are all
//! leased (`bounded`, or `auto` and hot here) is decided from tokens at hand in
//! this instance's memory — its own leases of the global buckets, or the
//! sub-leases it drew from its region's pools — with no store call at all; a key
//! it holds nothing of yet is decided at its region's pool in ONE regional call,
//! which hands it a sub-lease too. Leases, sub-leases and pools are refilled
//! ahead, in the background. What is leased, and how the bound holds, is
//! [`super::leases`].

use std::sync::Arc;
use std::sync::atomic::Ordering;

use floodgate_shared::bucket::Decision;
use floodgate_shared::lease::{
    LeaseConfig, POOL_ADD, POOL_TAKE, PoolAsk, PoolTaken, pool_key, pool_take_args_ahead,
};
use floodgate_shared::policy::{Consistency, Policy};
use floodgate_shared::script::Verdict;
use floodgate_shared::time::{Clock, Micros};

use super::guarded::Guarded;
use super::leases::{DoneWith, GiveBack, LeaseSettings, Leases, MAX_DRAW, Refill};
use super::limits::Limits;
use super::{Admit, Pipeline, Task, boxed};
use crate::breaker::Phase;
use crate::stats::{Leasing, Outcome, Stats, StatsField};
use crate::store::{MaybeSend, MaybeSync, Store};
use crate::timer::Stopwatch;

/// A pool chunk dies this long before its global lease, and a sub-lease this long
/// before its chunk: for clocks that read in whole milliseconds (the Worker) and
/// the hop to the regional store.
const POOL_MARGIN: Micros = 50_000;

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
            Some(region) => match self.leases.spend(&buckets, now) {
                Some(spent) => {
                    self.refill_sub_leases(region, &buckets, regions, now, later);
                    Some(spent)
                }
                // boxed: a regional round trip is rare on this path, and its future
                // would weigh on every request's
                None => Box::pin(self.cold(region, &buckets, regions, later)).await,
            },
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

    /// A request whose tokens this instance does not hold: decided at the
    /// region's ledger (one command) when its key is cold here, else at its
    /// pool (which hands this instance a sub-lease too).
    async fn cold(
        &self,
        region: &Guarded<S>,
        buckets: &[(&str, &Policy)],
        regions: u32,
        later: &mut Vec<Task>,
    ) -> Option<Vec<Decision>> {
        if let Some(decided) = self.ledgered(region, buckets, regions, later).await {
            return Some(decided);
        }
        self.pool_take(region, buckets, regions, later).await
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
    /// (`lua/lease_return.lua`, one call per lease), or its sub-leases are
    /// reported done to their pools (one pool call for up to [`MAX_DRAW`]
    /// buckets), so that their chunks can be retired at the global store once
    /// spent instead of holding their share of the bound until they die. A pool
    /// that hands this call its refill lock is refilled as by any instance.
    pub(super) async fn hand_back(&self) {
        let now = self.clock.now();
        let surrendered = self.leases.surrender(now);
        let mut calls: Vec<Task> = surrendered
            .leases
            .into_iter()
            .map(|g| self.give_back(g))
            .collect();
        if let Some(region) = &self.regional {
            let config = self.records.config(now).any();
            let regions = config.map_or(1, |c| c.regions());
            let per_call = if region.store.one_slot() { MAX_DRAW } else { 1 };
            for part in surrendered.sub_leases.chunks(per_call) {
                let pools = self.pools(region, regions);
                calls.push(pools.report_done(part.to_vec(), now));
            }
        }
        futures_util::future::join_all(calls).await;
    }

    /// Counts a refill of `key` of `policy` about to be sent.
    fn count_refill(&self, key: &str, policy: &Policy) {
        count_refill(&self.stats, &self.leases, self.clock.now(), key, policy);
    }

    fn pools(&self, region: &Guarded<S>, regions: u32) -> Pools<S> {
        Pools {
            region: region.clone(),
            global: self.global.store.clone(),
            leases: self.leases.clone(),
            stats: self.stats.clone(),
            settings: *self.leases.settings(),
            regions,
        }
    }

    /// Decides a request at its region's pools in one call (the instance held too
    /// few sub-leased tokens): the decisions, or `None` (a pool lacked tokens, or
    /// the regional store did not answer in time). The call also hands out this
    /// instance's sub-leases, and pools that ran low are refilled by this caller
    /// when it got their lock.
    async fn pool_take(
        &self,
        region: &Guarded<S>,
        buckets: &[(&str, &Policy)],
        regions: u32,
        later: &mut Vec<Task>,
    ) -> Option<Vec<Decision>> {
        let now = self.clock.now();
        let pools = self.pools(region, regions);
        let (keys, args, done) = pools.ask(buckets, true, now);
        let store = region.store.clone();
        let fut = boxed(async move {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            store.run_ints(&POOL_TAKE, &refs, &args).await
        });
        let reply = region.call_now(&self.clock, fut).await.or_drain(later);
        let (taken, refills) = pools.settle(buckets, reply.as_deref(), done, now);
        later.extend(refills);
        let taken = taken?;
        taken
            .admitted
            .then(|| self.leases.pool_decisions(buckets, &taken.left, now))
    }

    /// Draws more sub-leases, in the background, for the buckets whose sub-leased
    /// tokens run low — and, where the regional store takes any keys in one call,
    /// for the other buckets this instance decided lately that run low soon (see
    /// [`Leases::sub_refills_due`]): one pool call of cost 0, which may ask this
    /// instance to refill the pools from the global store too.
    fn refill_sub_leases(
        &self,
        region: &Guarded<S>,
        buckets: &[(&str, &Policy)],
        regions: u32,
        now: Micros,
        later: &mut Vec<Task>,
    ) {
        let together = region.store.one_slot();
        let owned = self.leases.sub_refills_due(buckets, regions, now, together);
        if owned.is_empty() {
            return;
        }
        let pools = self.pools(region, regions);
        later.push(boxed(async move {
            let buckets: Vec<(&str, &Policy)> =
                owned.iter().map(|(k, p)| (k.as_str(), p)).collect();
            let (keys, args, done) = pools.ask(&buckets, false, now);
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let reply = pools
                .region
                .store
                .run_ints(&POOL_TAKE, &refs, &args)
                .await
                .ok();
            let (_, refills) = pools.settle(&buckets, reply.as_deref(), done, now);
            for r in refills {
                r.await;
            }
        }));
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
            leases.refilled(&r, got.as_ref(), sent, full_at, true);
        })
    }
}

/// Counts a refill of `key` of `policy` about to be sent, with the tokens its
/// leases had outstanding when last heard of.
fn count_refill(stats: &Stats, leases: &Leases, now: Micros, key: &str, policy: &Policy) {
    let name = policy.name().to_string();
    stats.bump(now, StatsField::Leasing(name.clone(), Leasing::Refills), 1);
    let outstanding = leases.outstanding(key);
    stats.bump(
        now,
        StatsField::Leasing(name, Leasing::Outstanding),
        outstanding,
    );
}

/// The longest a pool's refill lock outlives a refiller that never answered
/// (ms): a few global round trips, whatever the chunks' lifetime.
const REFILL_LOCK_MAX_MS: i64 = 5_000;

/// What a call to a region's pools needs, owned: a request's own call and the
/// background sub-lease refills share it.
struct Pools<S> {
    region: Guarded<S>,
    global: S,
    leases: Arc<Leases>,
    stats: Arc<Stats>,
    settings: LeaseSettings,
    regions: u32,
}

/// The sub-leases a pool call reports done, per bucket.
type Done = Vec<Vec<(String, u64)>>;

impl<S> Pools<S>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
{
    /// The keys and arguments of a pool take for `buckets` (`charge`: the
    /// request's cost is spent, else only sub-leases are drawn), with the done
    /// sub-leases it carries.
    fn ask(
        &self,
        buckets: &[(&str, &Policy)],
        charge: bool,
        now: Micros,
    ) -> (Vec<String>, Vec<String>, Done) {
        let mut asks = Vec::with_capacity(buckets.len());
        let mut done = Vec::with_capacity(buckets.len());
        for (k, p) in buckets {
            let (want, reported) = self.leases.sub_ask(k, p, self.regions, now);
            done.push(reported.clone());
            asks.push(PoolAsk {
                cost: if charge { u64::from(p.cost()) } else { 0 },
                low: LeaseSettings::pool_target(p, self.regions) / 2 + 1,
                credit: LeaseSettings::credit(p, self.regions),
                want,
                done: reported,
            });
        }
        let keys = buckets.iter().map(|(k, _)| pool_key(k)).collect();
        (keys, self.take_args(&asks), done)
    }

    /// The arguments of a pool take of `asks`.
    fn take_args(&self, asks: &[PoolAsk]) -> Vec<String> {
        // the refill's answer releases the lock; its lifetime only matters when
        // the refilling instance died first (an evicted isolate): then the pool
        // waits at most half a lifetime, and never more than REFILL_LOCK_MAX_MS
        let lock_ms = (self.settings.lifetime / 2_000).clamp(1, REFILL_LOCK_MAX_MS) as u64;
        // the regional store's own clock: a pool take it runs late spends tokens of
        // a request the exact path then decided (a shortfall, never an overshoot)
        // chunks that die before the edges' sub-leases would be drawn again count
        // for nothing: the pool is refilled ahead of their death, not after it
        let ahead = self.settings.lifetime / 4 + POOL_MARGIN;
        pool_take_args_ahead(String::new(), asks, lock_ms, POOL_MARGIN, ahead)
    }

    /// Reports the sub-leases of `done` to their pools in one pool call that
    /// draws nothing, then runs the refills it was handed.
    fn report_done(self, done: Vec<DoneWith>, now: Micros) -> Task {
        boxed(async move {
            let buckets: Vec<(&str, &Policy)> =
                done.iter().map(|d| (d.key.as_str(), &d.policy)).collect();
            let asks: Vec<PoolAsk> = done
                .iter()
                .map(|d| PoolAsk {
                    cost: 0,
                    low: LeaseSettings::pool_target(&d.policy, self.regions) / 2 + 1,
                    credit: LeaseSettings::credit(&d.policy, self.regions),
                    want: 0,
                    done: d.done.clone(),
                })
                .collect();
            let args = self.take_args(&asks);
            let keys: Vec<String> = buckets.iter().map(|(k, _)| pool_key(k)).collect();
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let reply = self.region.store.run_ints(&POOL_TAKE, &refs, &args).await;
            let reported = asks.into_iter().map(|a| a.done).collect();
            let (_, refills) = self.settle(&buckets, reply.ok().as_deref(), reported, now);
            for r in refills {
                r.await;
            }
        })
    }

    /// A pool take sent at `sent` answered `reply` (`None`: it failed): the
    /// sub-leases it handed out are held, the done reports of a failed call go
    /// with the next one, and the pool refills it asked for are returned to run.
    fn settle(
        &self,
        buckets: &[(&str, &Policy)],
        reply: Option<&[i64]>,
        done: Done,
        sent: Micros,
    ) -> (Option<PoolTaken>, Vec<Task>) {
        let taken = reply.and_then(|r| PoolTaken::from_reply(r, buckets.len()).ok().flatten());
        let Some(taken) = taken else {
            for ((k, _), d) in buckets.iter().zip(done) {
                self.leases.restore_done(k, d, sent);
                self.leases.sub_leased(k, &[], sent);
            }
            return (None, vec![]);
        };
        let mut refills = vec![];
        for (i, (k, p)) in buckets.iter().enumerate() {
            self.leases.sub_leased(k, &taken.leases[i], sent);
            if taken.refill[i] {
                count_refill(&self.stats, &self.leases, sent, k, p);
                let r = self.leases.pool_refill(
                    k,
                    p,
                    self.regions,
                    &taken.retire[i],
                    taken.unconfirmed[i],
                );
                refills.push(self.pool_refill(r, p, sent));
            }
        }
        (Some(taken), refills)
    }

    /// Refills a regional pool from the global bucket, in the background: ONE global
    /// call charges what the region admitted on credit (into debt if need be),
    /// retires the pool's spent chunks and leases more; then the chunk is added to
    /// the pool, spendable until the global lease expires as reckoned from the send,
    /// and the charged credit taken off.
    fn pool_refill(&self, r: Refill, policy: &Policy, sent: Micros) -> Task {
        let (global, regional) = (self.global.clone(), self.region.store.clone());
        let leases = self.leases.clone();
        let cfg = LeaseConfig {
            max_lease: r.want,
            ..self.settings.for_policy(policy, self.regions)
        };
        let q = *policy.quota();
        boxed(async move {
            let watch = Stopwatch::start();
            let args = cfg.charge_args(
                q.burst_window(),
                q.emission_interval(),
                r.charge,
                r.want,
                &r.id,
                Some(&r.retire),
            );
            let got = global.take_lease(&r.key, &args).await.ok();
            let life = cfg.lifetime - watch.elapsed().as_micros() as i64 - POOL_MARGIN;
            let (member, tokens) = match &got {
                Some(t) if t.leased > 0 && life > 0 => (r.member(t), t.leased),
                _ => (String::new(), 0),
            };
            // charged when the global store answered; all the region's charged credit
            // is released once the bucket is out of debt (else it stays used)
            let charged = if got.is_some() { r.charge } else { 0 };
            let clear = got.is_some_and(|t| t.full_at - t.now <= q.burst_window());
            let args = [
                member,
                tokens.to_string(),
                life.max(0).to_string(),
                charged.to_string(),
                if clear { "1" } else { "0" }.to_string(),
            ];
            let pool = pool_key(&r.key);
            let _ = regional.run_ints(&POOL_ADD, &[&pool], &args).await;
            let full_at = got.map(|t| sent + (t.full_at - t.now).max(0));
            leases.refilled(&r, got.as_ref(), sent, full_at, false);
        })
    }
}
