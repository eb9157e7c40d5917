//! The `local_fallback` failure mode: while Redis cannot decide, each edge instance
//! enforces a share of the quota on its own, with the same pure transition as the
//! script ([`decide`]) over buckets held in memory.
//!
//! Every instance admits at most its share, so N instances together admit at most
//! N × share of the quota while degraded (choose the share as 1/N or less to stay
//! within quota). The local buckets start full at each outage and are forgotten
//! once full again; memory is bounded.

use std::sync::Mutex;

use floodgate_shared::bucket::{BucketState, decide};
use floodgate_shared::policy::Quota;
use floodgate_shared::script::Verdict;
use floodgate_shared::time::Micros;

use crate::bounded_map::{BoundedMap, WhenFull};

/// Most local buckets held at once; full ones are dropped first, and beyond that
/// new buckets are decided as fresh (full) ones without being remembered.
pub const MAX_LOCAL_BUCKETS: usize = 100_000;

/// One instance's fallback buckets.
pub struct LocalBuckets {
    buckets: Mutex<BoundedMap<String, BucketState>>,
}

impl Default for LocalBuckets {
    fn default() -> Self {
        Self {
            buckets: Mutex::new(BoundedMap::new(MAX_LOCAL_BUCKETS, WhenFull::Refuse)),
        }
    }
}

impl LocalBuckets {
    /// Checks (and, when every bucket has room, consumes) `checks` — (bucket key,
    /// local quota, cost) — atomically at `now`, like the script does in Redis.
    pub fn check(&self, checks: &[(&str, &Quota, u32)], now: Micros) -> Verdict {
        let mut map = crate::sync::lock(&self.buckets);
        let transitions: Vec<_> = checks
            .iter()
            .map(|(key, quota, cost)| decide(map.get(*key).copied(), quota, now, *cost))
            .collect();
        let admitted = transitions.iter().all(|t| t.decision.allowed());
        if admitted {
            for ((key, _, _), t) in checks.iter().zip(&transitions) {
                if let Some(w) = t.write {
                    map.insert((*key).to_string(), w, |s| s.full_at > now);
                }
            }
        }
        let decisions = checks
            .iter()
            .zip(&transitions)
            .map(|((key, quota, _), t)| {
                if admitted || !t.decision.allowed() {
                    t.decision
                } else {
                    // denied elsewhere: report this bucket untouched, as the script does
                    decide(map.get(*key).copied(), quota, now, 0).decision
                }
            })
            .collect();
        Verdict {
            admitted,
            now,
            shadow: vec![false; checks.len()],
            decisions,
            revision: Default::default(),
        }
    }

    pub fn len(&self) -> usize {
        crate::sync::lock(&self.buckets).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use floodgate_shared::time::{Clock, FakeClock, MICROS_PER_SEC};

    const T0: Micros = 1_764_000_000_000_000;

    #[test]
    fn admits_the_local_share_then_refills_with_time() {
        let clock = FakeClock::at(T0);
        let q = Quota::new(10, 10, 60 * MICROS_PER_SEC).unwrap(); // one token per 6 s
        let local = LocalBuckets::default();
        let admitted = (0..25)
            .filter(|_| local.check(&[("k", &q, 1)], clock.now()).admitted)
            .count();
        assert_eq!(admitted, 10, "the burst, no more");
        let denied = local.check(&[("k", &q, 1)], clock.now());
        let wait = match denied.headline().outcome {
            floodgate_shared::Admission::Denied { retry_after } => retry_after.unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(wait, 6 * MICROS_PER_SEC);
        clock.advance(wait - 1);
        assert!(!local.check(&[("k", &q, 1)], clock.now()).admitted);
        clock.advance(1);
        assert!(local.check(&[("k", &q, 1)], clock.now()).admitted);
        // another key has its own bucket
        assert!(local.check(&[("other", &q, 1)], clock.now()).admitted);
    }

    #[test]
    fn several_buckets_are_all_or_nothing() {
        let now = T0;
        let big = Quota::new(100, 100, MICROS_PER_SEC).unwrap();
        let small = Quota::new(2, 2, 60 * MICROS_PER_SEC).unwrap();
        let local = LocalBuckets::default();
        for _ in 0..2 {
            assert!(
                local
                    .check(&[("a", &big, 1), ("b", &small, 1)], now)
                    .admitted
            );
        }
        let v = local.check(&[("a", &big, 1), ("b", &small, 1)], now);
        assert!(!v.admitted);
        assert_eq!(
            v.decisions[0].remaining, 98,
            "a was not consumed by the denial"
        );
    }

    /// Over any run the local bucket admits at most capacity + elapsed / T, the
    /// same bound as the shared bucket (property over random arrival times).
    #[test]
    fn never_admits_more_than_the_local_quota_allows() {
        use proptest::prelude::*;
        proptest!(|(gaps in proptest::collection::vec(0i64..2_000_000, 1..300),
                    cap in 1u64..50, per_sec in 1u64..20)| {
            let q = Quota::new(cap, per_sec, MICROS_PER_SEC).unwrap();
            let local = LocalBuckets::default();
            let mut now = T0;
            let mut admitted = 0u64;
            for g in &gaps {
                now += g;
                if local.check(&[("k", &q, 1)], now).admitted {
                    admitted += 1;
                }
            }
            let bound = cap + ((now - T0) / q.emission_interval()) as u64;
            prop_assert!(admitted <= bound, "{admitted} > {bound}");
        });
    }
}
