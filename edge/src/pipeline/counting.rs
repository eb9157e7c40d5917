//! How the pipeline counts what it decided, for the dashboard and the metrics:
//! per endpoint and per key ([`Pipeline::count`]), per policy
//! ([`Pipeline::count_policies`]), and the answers given without the store, per
//! failure mode ([`Pipeline::degraded`]).

use std::sync::atomic::Ordering;

use floodgate_shared::policy::{FailureMode, Policy};
use floodgate_shared::script::Verdict;
use floodgate_shared::stats::PolicyOutcome;
use floodgate_shared::time::{Clock, Micros};

use super::limits::Limits;
use super::{DEGRADED_HEADER, Pipeline, Reply};
use crate::stats::Outcome;
use crate::store::{MaybeSend, MaybeSync, Store};

impl<S, C> Pipeline<S, C>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
    C: Clock,
{
    /// Counts one decision per endpoint and per key (with the store call's
    /// latency, µs, when there was one), at the request's start.
    pub(super) fn count(&self, limits: &Limits<'_>, outcome: Outcome, latency: Option<u64>) {
        self.stats.record(
            limits.started,
            limits.route_name(),
            &limits.record,
            outcome,
            latency,
        );
    }

    /// Counts one decision about a caller the edge did not identify (an address
    /// that spent its unknown-key budget, a key it could not verify): per
    /// endpoint only, at `now`.
    pub(super) fn count_unkeyed(&self, now: Micros, route: Option<&str>, outcome: Outcome) {
        self.stats.record_unkeyed(now, route, outcome);
    }

    /// Counts the request under each of its policies `outcome_of` (given the
    /// policy's index in `limits.policies`) names an outcome for
    /// ([`PolicyOutcome`]: who allowed, who throttled, on which route).
    pub(super) fn count_policies(
        &self,
        limits: &Limits<'_>,
        outcome_of: impl Fn(usize, &Policy) -> Option<PolicyOutcome>,
    ) {
        let outcomes = limits
            .policies
            .iter()
            .enumerate()
            .filter_map(|(i, (_, p))| Some((p.name(), outcome_of(i, p)?)));
        self.stats
            .count_policies(limits.started, limits.route_name(), outcomes);
    }

    /// Counts an admitted request under its policies: `allowed`, or
    /// `shadow_throttled` for a shadow policy the verdict denied.
    pub(super) fn count_admitted(&self, limits: &Limits<'_>, verdict: Option<&Verdict>) {
        self.count_policies(limits, |i, p| {
            let denied = verdict
                .and_then(|v| v.decisions.get(i))
                .is_some_and(|d| !d.allowed());
            Some(if p.shadow() && denied {
                PolicyOutcome::ShadowThrottled
            } else {
                PolicyOutcome::Allowed
            })
        });
    }

    /// Counts a throttled request under the policies whose decision denied it.
    pub(super) fn count_throttled(&self, limits: &Limits<'_>, verdict: &Verdict) {
        self.count_policies(limits, |i, p| {
            let denied = verdict.decisions.get(i).is_some_and(|d| !d.allowed());
            (!p.shadow() && denied).then_some(PolicyOutcome::Throttled)
        });
    }

    /// Counts a degraded answer under `mode` (per route too; per key and in the
    /// sample when the caller is known).
    pub(super) fn degraded(
        &self,
        limits: Option<&Limits<'_>>,
        mode: FailureMode,
        route: Option<&str>,
    ) {
        let now = self.clock.now();
        match limits {
            Some(l) => {
                self.stats
                    .record(now, route, &l.record, Outcome::Degraded, None);
                self.count_policies(l, |_, p| {
                    (!p.shadow()).then_some(PolicyOutcome::Degraded(mode))
                });
            }
            None => self.count_unkeyed(now, route, Outcome::Degraded),
        }
        self.stats.record_degraded_mode(now, route, mode);
        match mode {
            FailureMode::FailOpen => &self.totals.fail_open,
            FailureMode::FailClosed => &self.totals.fail_closed,
            FailureMode::LocalFallback => &self.totals.local_fallback,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// 503, marked fail-closed and counted: the limiter could not decide.
    pub(super) fn degraded_refusal(
        &self,
        limits: Option<&Limits<'_>>,
        route: Option<&str>,
        why: &str,
    ) -> Reply {
        self.degraded(limits, FailureMode::FailClosed, route);
        Reply::unavailable(why).with_header(DEGRADED_HEADER, "fail-closed")
    }
}
