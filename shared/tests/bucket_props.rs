//! Property tests of the token bucket's invariants.

use floodgate_shared::bucket::{Admission, BucketState, decide};
use floodgate_shared::contract::RateLimitHeaders;
use floodgate_shared::policy::Quota;
use floodgate_shared::time::{MICROS_PER_MS, MICROS_PER_SEC, Micros};
use proptest::prelude::*;

const T0: Micros = 1_764_000_000_000_000;

fn quota() -> impl Strategy<Value = Quota> {
    (
        1u64..=50,
        1u64..=20,
        prop::sample::select(vec![1, 7, 100, 1_000, 60_000, 3_600_000]),
    )
        .prop_map(|(cap, refill, period_ms)| {
            Quota::new(cap, refill, period_ms * MICROS_PER_MS).unwrap()
        })
}

/// Steps of (time advance in µs, cost).
fn steps(max_dt: Micros) -> impl Strategy<Value = Vec<(Micros, u32)>> {
    prop::collection::vec((0..max_dt, 0u32..=4), 1..200)
}

/// The design document's token bucket (`tokens`, `last_refill`, refill capped at
/// capacity, consume when enough), in exact integer "token-microseconds": a level of
/// `tokens × T`. Written independently of `decide` to check they are the same bucket.
struct Reference {
    level: i128,
    last_refill: Micros,
}

impl Reference {
    fn hit(&mut self, q: &Quota, now: Micros, cost: u32) -> bool {
        let t = i128::from(q.emission_interval());
        let full = i128::from(q.capacity()) * t;
        let elapsed = i128::from(now - self.last_refill);
        self.level = (self.level + elapsed).min(full);
        self.last_refill = now;
        let need = i128::from(cost) * t;
        if self.level >= need {
            self.level -= need;
            true
        } else {
            false
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// `decide` admits exactly what the reference token bucket admits, and reports
    /// its whole tokens as remaining.
    #[test]
    fn decide_is_the_reference_token_bucket(q in quota(), steps in steps(2 * MICROS_PER_SEC)) {
        let mut state = None;
        let t = q.emission_interval();
        let mut reference = Reference { level: i128::from(q.capacity()) * i128::from(t), last_refill: T0 };
        let mut now = T0;
        for (dt, cost) in steps {
            now += dt;
            let tr = decide(state, &q, now, cost);
            let ref_allowed = reference.hit(&q, now, cost);
            prop_assert_eq!(tr.decision.allowed(), ref_allowed);
            prop_assert_eq!(i128::from(tr.decision.remaining), reference.level / i128::from(t));
            if let Some(s) = tr.write { state = Some(s); }
        }
    }

    /// Over any interval, admitted cost ≤ capacity + rate × elapsed.
    #[test]
    fn admitted_never_exceeds_capacity_plus_refill(q in quota(), steps in steps(MICROS_PER_SEC)) {
        let mut state = None;
        let mut now = T0;
        let mut admitted: Vec<(Micros, u64)> = vec![];
        for (dt, cost) in steps {
            now += dt;
            let tr = decide(state, &q, now, cost);
            if tr.decision.allowed() { admitted.push((now, u64::from(cost))); }
            if let Some(s) = tr.write { state = Some(s); }
        }
        // every window [admitted[i].0, admitted[j].0]
        for i in 0..admitted.len() {
            let mut sum = 0u64;
            for j in i..admitted.len() {
                sum += admitted[j].1;
                let elapsed = admitted[j].0 - admitted[i].0;
                let refilled = elapsed / q.emission_interval();
                prop_assert!(sum <= q.capacity() + refilled as u64,
                    "{} admitted within {} µs: capacity {} + {} refilled", sum, elapsed, q.capacity(), refilled);
            }
        }
    }

    /// A denied request is admitted exactly at its retry-after, not a microsecond
    /// earlier; and the rounded header never asks for less than that.
    #[test]
    fn allowed_again_exactly_at_retry_after(q in quota(), steps in steps(MICROS_PER_SEC), extra in 1u32..=3) {
        let mut state = None;
        let mut now = T0;
        for (dt, cost) in steps {
            now += dt;
            let cost = cost.max(1);
            let tr = decide(state, &q, now, cost);
            if let Admission::Denied { retry_after } = tr.decision.outcome {
                let Some(wait) = retry_after else {
                    prop_assert!(u64::from(cost) > q.capacity());
                    continue;
                };
                prop_assert!(wait > 0);
                prop_assert!(!decide(state, &q, now + wait - 1, cost).decision.allowed());
                prop_assert!(decide(state, &q, now + wait, cost).decision.allowed());
                let secs = tr.decision.retry_after_secs().unwrap();
                prop_assert!(secs >= 1 && secs * MICROS_PER_SEC >= wait);
                // the header's consistency with Reset (Unix seconds)
                let h = RateLimitHeaders::from(&tr.decision);
                prop_assert!(h.retry_after.unwrap() <= h.reset - now.div_euclid(MICROS_PER_SEC));
            }
            if let Some(s) = tr.write { state = Some(s); }
            let _ = extra;
        }
    }

    /// A clock that steps backwards: decisions at the earlier instant are never
    /// looser than at the latest instant seen, `full_at` never moves backwards, and
    /// over the run the admitted cost ≤ capacity + (latest − earliest) / T.
    #[test]
    fn backward_clock_steps_never_mint_tokens(
        q in quota(),
        steps in prop::collection::vec((-(2 * MICROS_PER_SEC)..2 * MICROS_PER_SEC, 1u32..=3), 1..200),
    ) {
        let mut state: Option<BucketState> = None;
        let (mut now, mut latest, mut earliest) = (T0, T0, T0);
        let mut admitted = 0u64;
        for (dt, cost) in steps {
            now += dt;
            latest = latest.max(now);
            earliest = earliest.min(now);
            let tr = decide(state, &q, now, cost);
            if tr.decision.allowed() {
                admitted += u64::from(cost);
                prop_assert!(decide(state, &q, latest, cost).decision.allowed(), "looser in the past");
            }
            if let Some(s) = tr.write {
                prop_assert!(state.is_none_or(|p| s.full_at > p.full_at), "full_at moved backwards");
                state = Some(s);
            }
        }
        let bound = q.capacity() + ((latest - earliest) / q.emission_interval()) as u64;
        prop_assert!(admitted <= bound, "admitted {} > {}", admitted, bound);
    }

    /// Remaining never exceeds the limit and reset is never before now.
    #[test]
    fn headers_stay_in_range(q in quota(), steps in steps(MICROS_PER_SEC)) {
        let mut state = None;
        let mut now = T0;
        for (dt, cost) in steps {
            now += dt;
            let tr = decide(state, &q, now, cost);
            let h = RateLimitHeaders::from(&tr.decision);
            prop_assert!(h.remaining <= h.limit);
            prop_assert!(h.reset * MICROS_PER_SEC >= now);
            prop_assert!(h.reset * MICROS_PER_SEC <= now + q.burst_window() + MICROS_PER_SEC);
            if let Some(s) = tr.write { state = Some(s); }
        }
    }
}
