//! One store as the pipeline calls it — the global store or the regional one —
//! behind its circuit breaker and within its answer deadline ([`Lane`]), named by
//! its role in logs and metrics. Every store call of a request goes through
//! [`Guarded::call`].
//!
//! Open breaker: the store is not called at all. Half-open: this request
//! health-checks the store first (`PING`). A call that misses the deadline is
//! waited for on while the store keeps answering other calls (a busy store, up
//! to the ceiling: no 503 from a healthy store), and through one silent deadline
//! (a stall shorter than a deadline: no 503 either), else handed back still
//! running ([`Called::Failed`] with the call); each deadline with nothing from
//! the store since the send counts as a breaker failure, and its reply, when it
//! comes, teaches the deadline (see [`super::lane`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use floodgate_shared::time::{Clock, Micros};

use super::events::{LogEvent, StoreRole};
use super::health::Totals;
use super::lane::{DeadlineStats, Lane};
use super::{BoxFuture, Task, boxed};
use crate::breaker::{BreakerStats, Permit, Phase, PhaseChange};
use crate::stats::{Stats, StatsField};
use crate::store::{MaybeSend, MaybeSync, Store, StoreError, StoreErrorKind};
use crate::timer::{Raced, Stopwatch, race};

/// A store call's fate under the breaker and the answer deadline.
pub enum Called<T> {
    Done(T),
    /// Refused, skipped (breaker open) or late; a late call is still running.
    Failed(
        StoreError,
        Option<BoxFuture<'static, Result<T, StoreError>>>,
    ),
}

/// A store behind its breaker and deadline (cheap to clone: background tasks
/// take their own).
pub struct Guarded<S> {
    pub store: S,
    lane: Arc<Lane>,
    role: StoreRole,
    log: fn(&LogEvent<'_>),
    stats: Arc<Stats>,
    totals: Arc<Totals>,
}

impl<S: Clone> Clone for Guarded<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            lane: self.lane.clone(),
            role: self.role,
            log: self.log,
            stats: self.stats.clone(),
            totals: self.totals.clone(),
        }
    }
}

fn late_error(limit: Duration) -> StoreError {
    StoreError::new(
        StoreErrorKind::Timeout,
        format!("no reply within {limit:?}"),
    )
}

fn skipped() -> StoreError {
    StoreError::new(
        StoreErrorKind::Connect,
        "circuit breaker open: the store is not called",
    )
}

impl<T: 'static> Called<T> {
    /// The reply, or `None`: the call failed (a late one is left in `later`,
    /// drained so its reply still teaches the deadline).
    pub fn or_drain(self, later: &mut Vec<Task>) -> Option<T> {
        match self {
            Called::Done(v) => Some(v),
            Called::Failed(_, late) => {
                later.extend(late.map(drain));
                None
            }
        }
    }
}

/// Awaits a late call only to let its reply teach the deadline.
pub fn drain<T: 'static>(late: BoxFuture<'static, Result<T, StoreError>>) -> Task {
    boxed(async move {
        let _ = late.await;
    })
}

impl<S> Guarded<S>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
{
    pub fn new(
        store: S,
        lane: Lane,
        role: StoreRole,
        log: fn(&LogEvent<'_>),
        stats: Arc<Stats>,
        totals: Arc<Totals>,
    ) -> Self {
        Self {
            store,
            lane: Arc::new(lane),
            role,
            log,
            stats,
            totals,
        }
    }

    /// The answer deadline of a call sent at `now` (µs).
    pub fn deadline(&self, now: Micros) -> Micros {
        self.lane.deadline(now)
    }

    /// The longest a call is waited for now (µs).
    pub fn ceiling(&self) -> Micros {
        self.lane.ceiling()
    }

    pub fn phase(&self) -> Phase {
        self.lane.breaker.phase()
    }

    pub fn breaker_stats(&self, now: Micros) -> BreakerStats {
        self.lane.breaker.stats(now)
    }

    pub fn deadline_stats(&self, now: Micros) -> DeadlineStats {
        self.lane.stats(now)
    }

    pub fn role(&self) -> StoreRole {
        self.role
    }

    /// Logs a breaker phase change, if there was one, and counts new outages.
    fn logged(&self, moved: Option<PhaseChange>) {
        if let Some(t) = moved {
            (self.log)(&LogEvent::Breaker {
                store: self.role,
                change: &t,
            });
            if (t.from, t.to) == (Phase::Closed, Phase::Open) {
                self.stats.bump(t.at, StatsField::BreakerOpened, 1);
            }
        }
    }

    /// [`Guarded::call`] within the deadline of a call sent now.
    pub async fn call_now<T: 'static>(
        &self,
        clock: &impl Clock,
        fut: BoxFuture<'static, Result<T, StoreError>>,
    ) -> Called<T> {
        let deadline = self.deadline(clock.now());
        self.call(clock, deadline, fut).await
    }

    /// Runs one call under the breaker, waiting `deadline` µs at most.
    pub async fn call<T: 'static>(
        &self,
        clock: &impl Clock,
        deadline: Micros,
        fut: BoxFuture<'static, Result<T, StoreError>>,
    ) -> Called<T> {
        self.call_for(clock, deadline, fut, 1).await
    }

    /// [`Guarded::call`] of a call deciding `n` identical requests
    /// ([`super::coalesce`]): the deadline and the breaker count it as their `n`
    /// calls (`n` failures in a row open the breaker as `n` failed calls would).
    pub async fn call_for<T: 'static>(
        &self,
        clock: &impl Clock,
        deadline: Micros,
        fut: BoxFuture<'static, Result<T, StoreError>>,
        n: u64,
    ) -> Called<T> {
        let limit = Duration::from_micros(deadline.max(1) as u64);
        let (permit, moved) = self.lane.breaker.permit(clock.now());
        self.logged(moved);
        match permit {
            Permit::Skip => return Called::Failed(skipped(), None),
            Permit::Probe => {
                if let Err(e) = self.probe(clock, limit).await {
                    return Called::Failed(e, None);
                }
            }
            Permit::Call => {}
        }
        let mark = self.lane.mark();
        let sent = clock.now();
        let watch = Stopwatch::start();
        let out = self.totals.calls_out.send();
        let (raced, waited) = match race(fut, limit).await {
            Raced::Late(still) => {
                let waited = self.wait_on(still, mark, limit, &watch, clock, n).await;
                (waited, true)
            }
            done => (done, false),
        };
        drop(out);
        match raced {
            Raced::Done(Ok(v)) => {
                let (now, latency) = (clock.now(), watch.elapsed().as_micros() as Micros);
                if waited {
                    self.lane.waited_on(latency, now, n);
                } else {
                    self.lane.answered(latency, now, n);
                }
                self.logged(self.lane.breaker.success(now));
                Called::Done(v)
            }
            Raced::Done(Err(e)) if e.kind == StoreErrorKind::Stale => {
                // the store answered: slow, not down (no breaker failure)
                let latency = watch.elapsed().as_micros() as Micros;
                self.lane.stale(latency, deadline, clock.now(), n);
                Called::Failed(e, None)
            }
            Raced::Done(Err(e)) => {
                if e.is_retryable() {
                    self.failures(clock.now(), &e, n);
                }
                Called::Failed(e, None)
            }
            Raced::Late(still) => {
                // (its breaker failures, if silent, were counted as they happened)
                self.totals.late_calls.fetch_add(n, Ordering::Relaxed);
                self.lane.expired(mark, n);
                Called::Failed(
                    late_error(limit),
                    Some(self.observed(still, watch, sent, n)),
                )
            }
        }
    }

    /// `n` breaker failures (the calls of `n` requests), logged.
    fn failures(&self, now: Micros, e: &StoreError, n: u64) {
        for _ in 0..n {
            self.logged(self.lane.breaker.failure(now, e));
        }
    }

    /// A call past its deadline while the store kept answering others is a busy
    /// store's, not a dead one's: it is waited for one more deadline at a time,
    /// as long as replies keep arriving, up to the ceiling, rather than turned
    /// into a failure mode (a 503 from a healthy store).
    ///
    /// A silent deadline — nothing at all from the store meanwhile — is forgiven
    /// once per call: a healthy store's whole-server stall (a scheduler's turn on
    /// a loaded machine, another client's long script) or this process's own
    /// (its timer fired with the reply already waiting) shorter than a deadline
    /// costs no 503 (issue 41). A stopped store is still found out as fast as
    /// before: each silent deadline since the send counts as a breaker failure
    /// the moment it passes, and no call waits on once the breaker opened. A
    /// store that stops answering costs a request at most two more deadlines.
    /// `Late`: the store stayed silent, the breaker opened, or the ceiling passed:
    /// the call, still running.
    async fn wait_on<T: 'static>(
        &self,
        mut still: BoxFuture<'static, Result<T, StoreError>>,
        sent_mark: u64,
        step: Duration,
        watch: &Stopwatch,
        clock: &impl Clock,
        n: u64,
    ) -> Raced<Result<T, StoreError>, BoxFuture<'static, Result<T, StoreError>>> {
        // one silent round trip counts as its requests' calls would have, but
        // alone never opens the breaker (below the threshold), however many
        // requests rode it or however many deadlines it was silent for
        let mut failures_left = u64::from(self.lane.breaker.threshold().saturating_sub(1)).max(1);
        let mut forgiven = false;
        let mut mark = sent_mark;
        loop {
            // (counted before the ceiling is looked at: a deadline at the ceiling
            // — a fixed one, or one still learning — is a failure all the same)
            if !self.lane.replied_since(mark) {
                if !self.lane.replied_since(sent_mark) {
                    let k = n.min(failures_left);
                    failures_left -= k;
                    self.failures(clock.now(), &late_error(step), k);
                }
                if forgiven || self.lane.breaker.phase() == Phase::Open {
                    return Raced::Late(still);
                }
                forgiven = true;
            }
            let left = self.lane.ceiling() - watch.elapsed().as_micros() as Micros;
            if left <= 0 {
                return Raced::Late(still);
            }
            mark = self.lane.mark();
            let limit = step.min(Duration::from_micros(left as u64));
            match race(still, limit).await {
                Raced::Late(s) => still = s,
                done => return done,
            }
        }
    }

    /// The health check of a half-open breaker: any failure reopens it.
    async fn probe(&self, clock: &impl Clock, limit: Duration) -> Result<(), StoreError> {
        let store = self.store.clone();
        let ping = race(boxed(async move { store.ping().await }), limit).await;
        let failed = match ping {
            Raced::Done(Ok(())) => None,
            Raced::Done(Err(e)) => Some(e),
            Raced::Late(_) => Some(late_error(limit)),
        };
        let now = clock.now();
        match failed {
            Some(e) => {
                self.logged(self.lane.breaker.probe_failed(now, &e));
                Err(e)
            }
            None => {
                self.logged(self.lane.breaker.probe_succeeded(now));
                Ok(())
            }
        }
    }

    /// A late call whose reply, when it comes, teaches the deadline (anything but
    /// a lost connection is the store answering).
    fn observed<T: 'static>(
        &self,
        still: BoxFuture<'static, Result<T, StoreError>>,
        watch: Stopwatch,
        sent: Micros,
        n: u64,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let lane = self.lane.clone();
        boxed(async move {
            let reply = still.await;
            let latency = watch.elapsed().as_micros() as Micros;
            if !matches!(&reply, Err(e) if e.kind == StoreErrorKind::Connect) {
                lane.late_reply(latency, sent + latency, n);
            }
            reply
        })
    }
}
