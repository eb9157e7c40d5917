//! How far Redis' clock is ahead of this instance's, at least: what lets the
//! instance tell Redis, in Redis' own clock, the last instant it still waits for
//! an answer (`When::RedisUntil`), so Redis refuses a call that arrives after the
//! instance gave up on it instead of charging a request the client was refused.
//!
//! A reply carrying Redis' instant `r`, for a call sent at local `s` and answered at
//! local `a`, shows that Redis' clock read `r` at some local instant in `[s, a]`:
//! the offset (Redis − local) is at least `r − a`. The bound kept is the largest
//! such value seen recently (clocks drift and step, so old evidence expires). Using
//! a lower bound errs on the safe side: Redis may refuse a call up to one round
//! trip before the instance would have given up, never after.

use std::sync::Mutex;

use floodgate_shared::time::Micros;

use crate::sync::lock;

/// Evidence older than this is replaced by the next observation.
pub const OFFSET_MEMORY: Micros = 60 * 1_000_000;

#[derive(Default)]
pub struct OffsetBound {
    /// (bound, local instant it was observed at)
    best: Mutex<Option<(Micros, Micros)>>,
}

impl OffsetBound {
    /// Records a reply: Redis' clock read `redis_now` before local `answered`.
    pub fn observe(&self, redis_now: Micros, answered: Micros) {
        let bound = redis_now - answered;
        let mut best = lock(&self.best);
        match *best {
            Some((b, at)) if b >= bound && answered - at < OFFSET_MEMORY => {}
            _ => *best = Some((bound, answered)),
        }
    }

    /// The local instant `local` in Redis' clock, at the earliest: `None` before any
    /// reply was seen.
    pub fn to_redis(&self, local: Micros) -> Option<Micros> {
        lock(&self.best).map(|(b, _)| local + b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_tightest_recent_lower_bound() {
        let o = OffsetBound::default();
        assert_eq!(o.to_redis(100), None);
        // Redis is 1,000 µs ahead; replies take 50 to 300 µs to come back
        o.observe(10_000 + 1_000, 10_300);
        assert_eq!(o.to_redis(0), Some(700));
        o.observe(20_000 + 1_000, 20_050);
        assert_eq!(
            o.to_redis(0),
            Some(950),
            "a faster reply is better evidence"
        );
        o.observe(30_000 + 1_000, 30_400);
        assert_eq!(o.to_redis(0), Some(950), "a slower one is not");
        // a minute later the old evidence gives way (the clocks may have moved)
        o.observe(20_050 + OFFSET_MEMORY + 1_000 - 500, 20_050 + OFFSET_MEMORY);
        assert_eq!(o.to_redis(0), Some(500));
    }

    #[test]
    fn the_bound_never_exceeds_the_true_offset() {
        // whatever the reply delays, r − a ≤ offset when r was read in [s, a]
        let offset = -2_500;
        let o = OffsetBound::default();
        for (sent, delay_out, delay_back) in [(0, 10, 90), (1_000, 300, 5), (5_000, 0, 0)] {
            let read_at = sent + delay_out;
            o.observe(read_at + offset, read_at + delay_back);
            assert!(o.to_redis(0).unwrap() <= offset);
        }
    }
}
