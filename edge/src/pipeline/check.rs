//! The exact check: ONE call to the global store decides every bucket of the
//! request, all or nothing (a denial consumes nothing). A store that cannot
//! answer in time gets the request's failure mode — fail-open, fail-closed or a
//! local share (local fallback) — marked and counted; a late reply that admitted
//! a request the client was refused is refunded, so a refused request costs no
//! quota.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use floodgate_shared::changes::{REV_KEY, Revision};
use floodgate_shared::contract::Answer;
use floodgate_shared::credits::CreditDecision;
use floodgate_shared::policy::{Consistency, FailureMode, Quota};
use floodgate_shared::script::{Call, CallReply, Credited, Verdict, When};
use floodgate_shared::time::{Clock, Micros};

use super::coalesce::{Role, Share};
use super::guarded::{Called, drain};
use super::limits::{Limits, OwnedCheck, OwnedCredit, as_checks};
use super::{Admit, BoxFuture, DEGRADED_HEADER, Pipeline, Reply, Task, boxed};
use crate::stats::Outcome;
use crate::store::{MaybeSend, MaybeSync, Store, StoreError, StoreErrorKind};

/// What the exact check found.
pub struct Checked {
    pub verdict: Verdict,
    /// The key's credits' decision, when it has credits (decided in the same call).
    pub credits: Option<CreditDecision>,
    /// The call's latency (µs).
    pub latency: Option<u64>,
    /// The checks, for a refund if the request is refused after all.
    pub owned: Arc<Vec<OwnedCheck>>,
    /// The key's credits, for a refund too.
    pub credit: Option<Arc<OwnedCredit>>,
}

/// Why the exact check did not decide.
pub(super) enum Undecided {
    /// The store could not decide: the failure mode answered.
    Answered(Result<Admit, Reply>),
    /// The key's credits moved to another identity's key since its record was
    /// read (`floodgate_shared::credits::MOVED`): nothing was decided; the
    /// record is stale.
    Moved,
}

impl From<Result<Admit, Reply>> for Undecided {
    fn from(answer: Result<Admit, Reply>) -> Self {
        Undecided::Answered(answer)
    }
}

/// The most turns of the event loop a group's leader waits for riders.
const GATHER_TURNS: usize = 4;

impl<S, C> Pipeline<S, C>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
    C: Clock,
{
    /// The last instant (Redis' clock) at which a call sent at `sent` with
    /// `deadline` may still be awaited: the stale-call guard.
    pub(super) fn until(&self, sent: Micros, deadline: Micros) -> When {
        self.offset
            .to_redis(sent + deadline)
            .map_or(When::Redis, When::RedisUntil)
    }

    /// The verdict of every bucket in ONE global call; a throttled verdict is
    /// counted here, an admitted one once its slots are settled. `Err`: the store
    /// could not decide, and the failure mode answered (an admission by
    /// fail-open or a local share, or a refusal). Identical concurrent checks
    /// share one call ([`super::coalesce`]).
    pub(super) async fn check(
        &self,
        limits: &Limits<'_>,
        later: &mut Vec<Task>,
    ) -> Result<Checked, Undecided> {
        let credit = limits.credit().map(Arc::new);
        let mode = limits.mode();
        // a key with credits is decided alone (its credits are its own), a local
        // share is each request's own, and only the token bucket script decides
        // several requests in one call
        if self.settings.coalesce
            && credit.is_none()
            && mode != FailureMode::LocalFallback
            && limits.mergeable()
        {
            let owned = || Arc::new(limits.checks());
            match self.coalescer.join(|g| limits.checks_are(g), owned, mode) {
                Role::Leader(ticket) => {
                    // the group stays open while each turn of the event loop brings
                    // riders (a wave of a busy key's requests), a few turns at most
                    let mut joined = 0;
                    for _ in 0..GATHER_TURNS {
                        crate::timer::next_turn().await;
                        let now = ticket.riders();
                        if now == joined {
                            break;
                        }
                        joined = now;
                    }
                    let owned = ticket.checks.clone();
                    let riders = ticket.close();
                    if !riders.is_empty() {
                        // boxed: once per group, and its future (the guarded call)
                        // would weigh on every rider's
                        return Box::pin(self.lead(limits, owned, riders, later)).await;
                    }
                    return self.check_alone(limits, owned, credit, later).await;
                }
                Role::Rider(share, owned) => {
                    let sent = self.clock.now();
                    match share.await {
                        Ok(Share::Verdict(verdict)) => {
                            // the group's leader has observed the revision the
                            // call read (one observation per call)
                            let verdict = Verdict {
                                revision: Revision::NotAsked,
                                ..verdict
                            };
                            let credited = Credited {
                                verdict,
                                credits: None,
                            };
                            return Ok(self.checked(limits, credited, sent, owned, credit, later));
                        }
                        // the leader settles a late reply for the group
                        Ok(Share::Failed(e)) => {
                            return Err(self.group_failed(limits, vec![], &e).into());
                        }
                        // the leader went away before calling: decide alone
                        Err(_) => return self.check_alone(limits, owned, credit, later).await,
                    }
                }
                Role::Alone => {}
            }
        }
        let owned = Arc::new(limits.checks());
        self.check_alone(limits, owned, credit, later).await
    }

    /// One call for this request alone.
    async fn check_alone(
        &self,
        limits: &Limits<'_>,
        owned: Arc<Vec<OwnedCheck>>,
        credit: Option<Arc<OwnedCredit>>,
        later: &mut Vec<Task>,
    ) -> Result<Checked, Undecided> {
        let sent = self.clock.now();
        let deadline = self.global.deadline(sent);
        // a busy store's call is waited for up to the ceiling (Guarded::call): the
        // guard is there; one the edge gave up on earlier is refunded if it admits
        let when = self.until(sent, self.global.ceiling().max(deadline));
        let store = self.global.store.clone();
        let (calls, credit_call) = (owned.clone(), credit.clone());
        let fut = boxed(async move {
            let checks = as_checks(&calls);
            let credit = credit_call.as_deref().map(OwnedCredit::as_check);
            let call = Call {
                credits: credit.as_ref(),
                watch: Some(REV_KEY),
                ..Call::new(&checks, when)
            };
            store
                .decide(call)
                .await?
                .one()
                .ok_or_else(|| StoreError::protocol("a check decided nothing"))
        });
        match self.global.call(&self.clock, deadline, fut).await {
            Called::Done(credited) => {
                Ok(self.checked(limits, credited, sent, owned, credit, later))
            }
            // nothing decided, the store fine: the request is decided again on
            // its key's record as read anew
            Called::Failed(e, _) if e.kind == StoreErrorKind::Moved => Err(Undecided::Moved),
            Called::Failed(e, late) => {
                self.leases.global_answered(false);
                let answer = self.failure_mode(limits, &e);
                match late {
                    // the call may still admit in Redis: give that back
                    Some(late) if answer.is_err() => {
                        later.push(self.refund_late(late, owned, credit))
                    }
                    late => later.extend(late.map(drain)),
                }
                Err(answer.into())
            }
        }
    }

    /// The leader's call for its group: `riders` joined it, in order, after it.
    /// Each gets its own verdict, or the call's failure (then every request of
    /// the group answers by their one failure mode, and a late reply that
    /// admits after all is given back for all of them).
    async fn lead(
        &self,
        limits: &Limits<'_>,
        owned: Arc<Vec<OwnedCheck>>,
        riders: Vec<futures_channel::oneshot::Sender<Share>>,
        later: &mut Vec<Task>,
    ) -> Result<Checked, Undecided> {
        let n = riders.len() + 1;
        let sent = self.clock.now();
        let deadline = self.global.deadline(sent);
        let when = self.until(sent, self.global.ceiling().max(deadline));
        let store = self.global.store.clone();
        let calls = owned.clone();
        let fut = boxed(async move {
            let checks = as_checks(&calls);
            let call = Call {
                watch: Some(REV_KEY),
                count: n,
                ..Call::new(&checks, when)
            };
            Ok(match store.decide(call).await? {
                CallReply::Done { each, .. } => each.into_iter().map(|c| c.verdict).collect(),
                CallReply::NoRecord => vec![],
            })
        });
        let called = self
            .global
            .call_for(&self.clock, deadline, fut, n as u64)
            .await;
        let credit = None;
        match called {
            Called::Done(verdicts) if verdicts.len() == n => {
                let mut verdicts = verdicts.into_iter();
                let own = verdicts.next().expect("n >= 1");
                for (rider, verdict) in riders.into_iter().zip(verdicts) {
                    let _ = rider.send(Share::Verdict(verdict));
                }
                let credited = Credited {
                    verdict: own,
                    credits: None,
                };
                Ok(self.checked(limits, credited, sent, owned, credit, later))
            }
            Called::Done(verdicts) => {
                let e =
                    StoreError::protocol(format!("{} verdicts for {n} requests", verdicts.len()));
                Err(self.group_failed(limits, riders, &e).into())
            }
            Called::Failed(e, late) => {
                let answer = self.group_failed(limits, riders, &e);
                match late {
                    // every request of the group was refused (one failure mode):
                    // what the call admits after all is given back for each
                    Some(late) if answer.is_err() => later.push(self.refund_late_many(late, owned)),
                    late => later.extend(late.map(drain)),
                }
                Err(answer.into())
            }
        }
    }

    /// A group's call could not decide: every rider in `riders` is told (the
    /// leader's; none for a rider itself), and the request answers by the
    /// group's failure mode.
    fn group_failed(
        &self,
        limits: &Limits<'_>,
        riders: Vec<futures_channel::oneshot::Sender<Share>>,
        e: &StoreError,
    ) -> Result<Admit, Reply> {
        for rider in riders {
            let _ = rider.send(Share::Failed(e.clone()));
        }
        self.leases.global_answered(false);
        self.failure_mode(limits, e)
    }

    /// What a check that decided tells, and the request's [`Checked`].
    pub(super) fn checked(
        &self,
        limits: &Limits<'_>,
        Credited { verdict, credits }: Credited,
        sent: Micros,
        owned: Arc<Vec<OwnedCheck>>,
        credit: Option<Arc<OwnedCredit>>,
        later: &mut Vec<Task>,
    ) -> Checked {
        let finished = self.clock.now();
        let latency = u64::try_from(finished - sent).ok();
        self.learn(limits, &verdict, sent, finished);
        if let Revision::Seen(seen) = verdict.revision {
            self.revision_seen(seen, later);
        }
        if !verdict.admitted {
            self.count(limits, Outcome::Throttled, latency);
            self.count_throttled(limits, &verdict);
        }
        Checked {
            verdict,
            credits,
            latency,
            owned,
            credit,
        }
    }

    /// What a verdict teaches: Redis' clock, the buckets' state for leased
    /// answers, the buckets to answer locally until they admit again, and the
    /// shadow policies that would have throttled.
    fn learn(&self, limits: &Limits<'_>, verdict: &Verdict, sent: Micros, finished: Micros) {
        self.leases.global_answered(true);
        self.offset.observe(verdict.now, finished);
        for ((k, p), d) in limits.policies.iter().zip(&verdict.decisions) {
            if p.consistency() != Consistency::Exact {
                self.leases.observe(k, d, finished);
            }
        }
        if self.settings.throttle_memory && !verdict.admitted {
            self.remember_throttled(limits, verdict, sent, finished);
        }
        if verdict.shadow_denied() && verdict.admitted {
            self.stats
                .record_shadow(finished, limits.route_name(), &limits.record.id);
        }
    }

    /// The answer to a store that could not decide: the strictest failure mode of
    /// the request's policies, marked and counted. `Err`: the client is refused
    /// (so a late admission must be refunded).
    fn failure_mode(&self, limits: &Limits<'_>, e: &StoreError) -> Result<Admit, Reply> {
        let mode = limits.mode();
        let route = limits.route_name();
        match mode {
            FailureMode::FailClosed => Err(self.degraded_refusal(
                Some(limits),
                route,
                &format!("rate limit state unavailable: {e}"),
            )),
            FailureMode::FailOpen => {
                self.degraded(Some(limits), mode, route);
                Ok(Admit::caller(&limits.record, route, vec![], vec![])
                    .with_header(DEGRADED_HEADER, "fail-open"))
            }
            FailureMode::LocalFallback => {
                self.degraded(Some(limits), mode, route);
                self.local_share(limits)
            }
        }
    }

    /// Local fallback: each enforced policy's local share of its quota, decided in
    /// this instance's memory.
    fn local_share(&self, limits: &Limits<'_>) -> Result<Admit, Reply> {
        let local: Vec<(&str, &Quota, u32)> = limits
            .enforced()
            .filter_map(|(k, p)| p.local_quota().map(|q| (k.as_str(), q, p.cost())))
            .collect();
        let verdict = self.local.check(&local, self.clock.now());
        match Answer::for_decision(verdict.headline()) {
            Answer::Forward { headers } => {
                Ok(
                    Admit::caller(&limits.record, limits.route_name(), headers.pairs(), vec![])
                        .with_header(DEGRADED_HEADER, "local-fallback"),
                )
            }
            Answer::Reject { headers, .. } => {
                Err(Reply::rate_limited(&headers).with_header(DEGRADED_HEADER, "local-fallback"))
            }
        }
    }

    /// Settles a check that missed its deadline after its request was refused:
    /// if Redis admitted it after all, its tokens are given back.
    pub(super) fn refund_late(
        &self,
        late: BoxFuture<'static, Result<Credited, StoreError>>,
        owned: Arc<Vec<OwnedCheck>>,
        credit: Option<Arc<OwnedCredit>>,
    ) -> Task {
        let store = self.global.store.clone();
        let totals = self.totals.clone();
        boxed(async move {
            if let Ok(v) = late.await
                && v.verdict.admitted
            {
                let checks = as_checks(&owned);
                let credit = credit.as_deref().map(OwnedCredit::as_check);
                if store.refund(&checks, credit.as_ref(), &v).await.is_ok() {
                    totals.refunds.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    }

    /// [`Pipeline::refund_late`] for a group's call: each admission it made
    /// after all is given back.
    fn refund_late_many(
        &self,
        late: BoxFuture<'static, Result<Vec<Verdict>, StoreError>>,
        owned: Arc<Vec<OwnedCheck>>,
    ) -> Task {
        let store = self.global.store.clone();
        let totals = self.totals.clone();
        boxed(async move {
            let Ok(verdicts) = late.await else { return };
            let checks = as_checks(&owned);
            for v in verdicts.iter().filter(|v| v.admitted) {
                if store
                    .refund(&checks, None, &Credited::from(v.clone()))
                    .await
                    .is_ok()
                {
                    totals.refunds.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    }

    /// Gives back an admitted verdict's tokens (its request was refused after all).
    pub(super) fn refund(&self, checked: Checked) -> Task {
        let store = self.global.store.clone();
        let totals = self.totals.clone();
        boxed(async move {
            let checks = as_checks(&checked.owned);
            let credit = checked.credit.as_deref().map(OwnedCredit::as_check);
            let credited = Credited {
                verdict: checked.verdict,
                credits: checked.credits,
            };
            if store
                .refund(&checks, credit.as_ref(), &credited)
                .await
                .is_ok()
            {
                totals.refunds.fetch_add(1, Ordering::Relaxed);
            }
        })
    }
}
