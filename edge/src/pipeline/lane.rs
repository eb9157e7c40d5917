//! One store as the pipeline calls it (the global store, or the regional one):
//! its circuit breaker, its adaptive answer deadline ([`crate::deadline`]) and
//! what its deadlines did.
//!
//! Slow or down — what a missed deadline counts as:
//! - a call that missed its deadline while some reply from the same store arrived
//!   after it was sent (the connection is alive, the store answers late) is
//!   **slow**: not a breaker failure;
//! - one with nothing at all from the store since it was sent (a stopped server, a
//!   frozen connection) is **silent**: each silent deadline is a breaker failure,
//!   as is a refused or reset connection; one silent deadline per call is
//!   forgiven (the call is waited for one more: a whole-server stall shorter
//!   than a deadline costs no 503, see [`super::guarded`]);
//! - a late reply that arrives within the ceiling is proof of life: the deadline
//!   is raised to cover it and the breaker's consecutive failures start again
//!   from zero, or, if the silent expiries opened it meanwhile (a stall of the
//!   whole server shorter than the ceiling), its cool-down ends at once: the next
//!   request health-checks the store; a reply later than the ceiling changes
//!   nothing (its timeout stays counted).
//!
//! Until the store first answers, an adaptive deadline has nothing to adapt
//! from: a call may then wait the lane's first wait (the start-up wait), counted
//! from the instance's first call. A fresh instance's first calls to a far store
//! (100 ms away, past the ceiling) are answered, not failed — also when its
//! records came from the region and no start-up read taught the deadline
//! (issue 38: fresh instances during churn).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use floodgate_shared::time::Micros;

use crate::breaker::Breaker;
use crate::deadline::{DeadlineSettings, Estimator, Lateness};
use crate::sync::lock;

/// One store's breaker, deadline and counters.
#[derive(Debug)]
pub struct Lane {
    pub breaker: Breaker,
    estimator: Mutex<Estimator>,
    /// Replies received, in time or late: what tells slow from silent.
    replies: AtomicU64,
    expired: AtomicU64,
    slow: AtomicU64,
    silent: AtomicU64,
    late_replies: AtomicU64,
    too_late: AtomicU64,
    waited_on: AtomicU64,
    /// How long a call may wait until the store first answers (µs, 0: no
    /// longer than its deadline), and when the first call was sent.
    first_wait: Micros,
    first_call: Mutex<Option<Micros>>,
}

/// What one store's deadlines did since the instance started (health, metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeadlineStats {
    /// The deadline a call sent now gets (µs), and its bounds.
    pub deadline_us: Micros,
    pub floor_us: Micros,
    pub ceiling_us: Micros,
    /// `true`: pinned (`--deadline-ms`), not adaptive.
    pub fixed: bool,
    /// Calls that missed their deadline...
    pub expired: u64,
    /// ...while replies kept arriving (not breaker failures)...
    pub slow: u64,
    /// ...or with nothing from the store since they were sent (breaker failures).
    pub silent: u64,
    /// Late replies within the ceiling (the deadline was raised), and after it.
    pub late_replies: u64,
    pub too_late: u64,
    /// Calls that missed their deadline while the store kept answering others
    /// (or through one silent deadline), were waited for up to the ceiling and
    /// answered in time for their request.
    pub waited_on: u64,
}

impl DeadlineStats {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "deadline_ms": self.deadline_us as f64 / 1e3,
            "floor_ms": self.floor_us as f64 / 1e3,
            "ceiling_ms": self.ceiling_us as f64 / 1e3,
            "adaptive": !self.fixed,
            "expired": self.expired,
            "expired_slow": self.slow,
            "expired_silent": self.silent,
            "late_replies": self.late_replies,
            "too_late": self.too_late,
            "waited_on": self.waited_on,
        })
    }
}

impl Lane {
    pub fn new(breaker: Breaker, deadline: DeadlineSettings) -> Self {
        Self {
            breaker,
            estimator: Mutex::new(Estimator::new(deadline)),
            replies: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            slow: AtomicU64::new(0),
            silent: AtomicU64::new(0),
            late_replies: AtomicU64::new(0),
            too_late: AtomicU64::new(0),
            waited_on: AtomicU64::new(0),
            first_wait: 0,
            first_call: Mutex::new(None),
        }
    }

    /// Until the store first answers, calls may wait `wait` (µs) from the first
    /// one, when the deadline is adaptive.
    pub fn with_first_wait(mut self, wait: Micros) -> Self {
        if !lock(&self.estimator).settings().is_fixed() {
            self.first_wait = wait.max(0);
        }
        self
    }

    /// The deadline of a call sent at `now` (µs, at least 1).
    pub fn deadline(&self, now: Micros) -> Micros {
        let learned = lock(&self.estimator).deadline(now).max(1);
        if self.first_wait == 0 || self.replies.load(Ordering::Relaxed) > 0 {
            return learned;
        }
        let first = *lock(&self.first_call).get_or_insert(now);
        learned.max(first + self.first_wait - now)
    }

    /// A mark to take when sending a call, for [`Lane::expired`].
    pub fn mark(&self) -> u64 {
        self.replies.load(Ordering::Relaxed)
    }

    /// Whether replies arrived since `mark`: the store is alive (busy, maybe),
    /// not silent.
    pub fn replied_since(&self, mark: u64) -> bool {
        self.replies.load(Ordering::Relaxed) > mark
    }

    /// The longest a call may be waited for now (the deadline's ceiling, µs).
    pub fn ceiling(&self) -> Micros {
        lock(&self.estimator).settings().ceiling
    }

    /// A call that missed its deadline while the store kept answering was
    /// waited for and answered after `latency`: a late reply (it raises the
    /// deadline), and one its request could still use. (`n`: the requests the
    /// call decided, here and below: a call deciding a group of identical
    /// requests counts as their calls would have, see [`super::coalesce`].)
    pub fn waited_on(&self, latency: Micros, now: Micros, n: u64) -> Lateness {
        self.waited_on.fetch_add(n, Ordering::Relaxed);
        self.late_reply(latency, now, n)
    }

    /// A call answered in time, after `latency` (one round trip: the deadline
    /// learns it once, whatever `n`).
    pub fn answered(&self, latency: Micros, now: Micros, n: u64) {
        self.replies.fetch_add(n, Ordering::Relaxed);
        lock(&self.estimator).observe(latency, now);
    }

    /// A call sent at `mark` was given up on: `true` when it is slow (replies
    /// arrived since), `false` when the store is silent (breaker failures: the
    /// caller counted them as its deadlines passed).
    pub fn expired(&self, mark: u64, n: u64) -> bool {
        self.expired.fetch_add(n, Ordering::Relaxed);
        let slow = self.replies.load(Ordering::Relaxed) > mark;
        if slow { &self.slow } else { &self.silent }.fetch_add(n, Ordering::Relaxed);
        slow
    }

    /// The store answered in time that it ran the call after the deadline (the
    /// stale-call guard): a missed deadline, slow, and a reply. The deadline is
    /// raised as by a late reply of at least `deadline`.
    pub fn stale(&self, latency: Micros, deadline: Micros, now: Micros, n: u64) {
        self.expired.fetch_add(n, Ordering::Relaxed);
        self.slow.fetch_add(n, Ordering::Relaxed);
        self.late_reply(latency.max(deadline), now, n);
    }

    /// The reply of a call that missed its deadline arrived, `latency` after the
    /// send. Within the ceiling: the deadline is raised and the breaker's
    /// consecutive failures reset.
    pub fn late_reply(&self, latency: Micros, now: Micros, n: u64) -> Lateness {
        self.replies.fetch_add(n, Ordering::Relaxed);
        let lateness = lock(&self.estimator).late(latency, now);
        match lateness {
            Lateness::Slow => {
                self.late_replies.fetch_add(n, Ordering::Relaxed);
                self.breaker.answered_late(now);
            }
            Lateness::TooLate => {
                self.too_late.fetch_add(n, Ordering::Relaxed);
            }
        }
        lateness
    }

    pub fn stats(&self, now: Micros) -> DeadlineStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut e = lock(&self.estimator);
        let s = *e.settings();
        DeadlineStats {
            deadline_us: e.deadline(now).max(1),
            floor_us: s.floor,
            ceiling_us: s.ceiling,
            fixed: s.is_fixed(),
            expired: load(&self.expired),
            slow: load(&self.slow),
            silent: load(&self.silent),
            late_replies: load(&self.late_replies),
            too_late: load(&self.too_late),
            waited_on: load(&self.waited_on),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::Phase;

    fn lane() -> Lane {
        Lane::new(Breaker::new(3, 1_000_000), DeadlineSettings::RESP)
    }

    #[test]
    fn until_the_store_first_answers_a_call_may_wait_the_first_wait() {
        let ms = 1_000;
        let l = lane().with_first_wait(2_000 * ms);
        assert_eq!(
            l.deadline(0),
            2_000 * ms,
            "never heard from: the first wait"
        );
        assert_eq!(
            l.deadline(500 * ms),
            1_500 * ms,
            "counted from the first call"
        );
        assert_eq!(l.deadline(3_000 * ms), 3 * ms, "then the floor, as before");
        l.answered(105 * ms, 3_100 * ms, 1);
        assert_eq!(
            l.deadline(3_200 * ms),
            315 * ms,
            "learned from the first reply"
        );
        let fresh = lane().with_first_wait(2_000 * ms);
        let mark = fresh.mark();
        assert_eq!(fresh.deadline(0), 2_000 * ms);
        fresh.late_reply(2_500 * ms, 2_500 * ms, 1);
        assert!(fresh.replied_since(mark));
        assert!(
            fresh.deadline(2_600 * ms) < 2_000 * ms,
            "a reply, even late, ends it"
        );
        let pinned = Lane::new(Breaker::new(3, 1_000_000), DeadlineSettings::fixed(50 * ms))
            .with_first_wait(2_000 * ms);
        assert_eq!(
            pinned.deadline(0),
            50 * ms,
            "a pinned deadline stays pinned"
        );
        assert_eq!(lane().deadline(0), 3 * ms, "no first wait: the floor");
    }

    #[test]
    fn silent_expiries_open_the_breaker_slow_ones_do_not() {
        let l = lane();
        // replies keep arriving after each call was sent: slow, never a failure
        for _ in 0..10 {
            let mark = l.mark();
            l.answered(500, 0, 1);
            assert!(l.expired(mark, 1), "slow");
        }
        // nothing since the send: silent
        let mark = l.mark();
        assert!(!l.expired(mark, 1));
        let s = l.stats(0);
        assert_eq!((s.expired, s.slow, s.silent), (11, 10, 1));
    }

    #[test]
    fn a_call_refused_as_stale_is_slow_and_raises_the_deadline() {
        let l = lane();
        for i in 0..20 {
            l.answered(300, i, 1);
        }
        // answered within 1 ms, but Redis ran it after the 3 ms deadline
        l.stale(1_000, 3_000, 30, 1);
        assert_eq!(l.deadline(30), 9_000, "as a late reply of the deadline");
        let s = l.stats(30);
        assert_eq!((s.expired, s.slow, s.silent, s.late_replies), (1, 1, 0, 1));
    }

    #[test]
    fn a_late_reply_within_the_ceiling_raises_the_deadline_and_resets_the_failures() {
        let l = lane();
        for i in 0..20 {
            l.answered(300, i, 1);
        }
        assert_eq!(l.deadline(20), 3_000);
        l.breaker.failure(21, &"timeout");
        l.breaker.failure(22, &"timeout");
        assert_eq!(l.late_reply(12_000, 30, 1), Lateness::Slow);
        assert_eq!(l.deadline(30), 36_000, "raised to 3 × the late reply");
        // two more failures would have opened it without the reset
        l.breaker.failure(31, &"timeout");
        l.breaker.failure(32, &"timeout");
        assert_eq!(l.breaker.phase(), Phase::Closed);
        assert_eq!(l.late_reply(150_000, 40, 1), Lateness::TooLate);
        let s = l.stats(40);
        assert_eq!((s.late_replies, s.too_late), (1, 1));
    }
}
