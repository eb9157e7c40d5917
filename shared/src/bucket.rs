//! The token bucket, as one pure transition.
//!
//! # Model
//! A bucket of `capacity` tokens refills continuously, one token every `T` µs
//! (the quota's emission interval). Its whole state is ONE instant, `full_at`: the
//! time at which the bucket is (or was) full again. This is the token bucket in its
//! GCRA form; the reference layout (`tokens`, `last_refill`) maps onto it exactly:
//!
//! ```text
//! tokens(now) = capacity − max(0, full_at − now) / T      (fractional)
//! full_at     = last_refill + (capacity − tokens) × T
//! ```
//!
//! A request of cost `c` needs `c` tokens, i.e. `max(full_at, now) + c·T − now ≤ B`
//! where `B = capacity × T`. Admitting it sets `full_at ← max(full_at, now) + c·T`;
//! denying it changes nothing at all (nothing is written). A missing bucket is a
//! full one, so the stored key may expire once `full_at` has passed (see `lua/`).
//!
//! All quantities are integer microseconds below 2^53, so the Lua script computes
//! the same integers with doubles and the two agree bit for bit.
//!
//! # Clocks that go backwards
//! `full_at` is never moved backwards by a step of the clock, and an admission at an
//! earlier instant records the same consumption as at the later one whenever the
//! bucket is not full. Decisions taken while the clock is behind are stricter, never
//! looser, than at the latest instant seen; over any run the admitted cost is at most
//! `capacity + (latest − earliest instant seen) / T`, whatever order the instants
//! came in (property-tested in `tests/bucket_props.rs`).

use crate::policy::Quota;
use crate::time::{MAX_INSTANT, Micros, ceil_secs};

/// The stored state of one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BucketState {
    /// When the bucket is full again (µs since the Unix epoch).
    pub full_at: Micros,
}

/// A bucket's state shown in the reference layout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketView {
    pub tokens: f64,
    pub last_refill: Micros,
}

impl BucketState {
    /// Decodes a stored value, with exactly the script's rules: ASCII digits only, at
    /// most 16 of them, not beyond `now + MAX_WINDOW`. Anything else (garbage, a
    /// value from another program, a far-future instant) is `None`: a fresh bucket.
    pub fn decode(raw: &[u8], now: Micros) -> Option<Self> {
        if raw.is_empty() || raw.len() > 16 || !raw.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let full_at = raw
            .iter()
            .fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0'));
        (full_at <= now.saturating_add(crate::policy::MAX_WINDOW)).then_some(Self { full_at })
    }

    /// The stored form: decimal digits, which Redis keeps as an integer object.
    pub fn encode(&self) -> String {
        self.full_at.to_string()
    }

    /// The state in the reference layout (`tokens`, `last_refill = now`).
    pub fn view(&self, quota: &Quota, now: Micros) -> BucketView {
        let debt = (self.full_at - now).max(0) as f64;
        BucketView {
            tokens: quota.capacity() as f64 - debt / quota.emission_interval() as f64,
            last_refill: now,
        }
    }
}

/// The outcome of one decision. A denial is a value, not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Allowed,
    /// Denied; `retry_after` is the exact wait (µs) after which the same request is
    /// admitted, or `None` when its cost exceeds the capacity and it never will be.
    Denied {
        retry_after: Option<Micros>,
    },
}

/// What one policy decided for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub outcome: Admission,
    /// The bucket's capacity (`X-RateLimit-Limit`).
    pub limit: u64,
    /// Whole tokens left after this decision (`X-RateLimit-Remaining`).
    pub remaining: u64,
    /// The instant the decision was taken at.
    pub now: Micros,
    /// When the bucket is full again after this decision.
    pub full_at: Micros,
}

impl Decision {
    pub fn allowed(&self) -> bool {
        self.outcome == Admission::Allowed
    }

    /// `X-RateLimit-Reset`: Unix seconds, rounded up, at which the bucket is full.
    pub fn reset_unix_secs(&self) -> i64 {
        ceil_secs(self.full_at.max(self.now))
    }

    /// `Retry-After`: whole seconds, rounded up, never 0; `None` when allowed or
    /// when the request can never be admitted.
    pub fn retry_after_secs(&self) -> Option<i64> {
        match self.outcome {
            Admission::Denied {
                retry_after: Some(us),
            } => Some(ceil_secs(us).max(1)),
            _ => None,
        }
    }
}

/// A decision and the state to store (`None`: store nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub decision: Decision,
    pub write: Option<BucketState>,
}

/// The pure transition: previous state, quota, current instant, cost in tokens →
/// decision and the state to store. A denial stores nothing. `cost = 0` is a peek:
/// it reports the bucket and stores nothing.
pub fn decide(prev: Option<BucketState>, quota: &Quota, now: Micros, cost: u32) -> Transition {
    debug_assert!(
        (0..=MAX_INSTANT).contains(&now),
        "instant out of range: {now}"
    );
    let t = quota.emission_interval();
    let burst = quota.burst_window();
    let cost_us = quota.cost_window(cost);
    let base = prev.map_or(now, |s| s.full_at.max(now));
    let next = base + cost_us;
    let tokens_after =
        |full_at: Micros| u64::try_from((burst - (full_at - now)).max(0) / t).unwrap_or(0);
    if next - now <= burst {
        Transition {
            decision: Decision {
                outcome: Admission::Allowed,
                limit: quota.capacity(),
                remaining: tokens_after(next),
                now,
                full_at: next,
            },
            write: (cost > 0).then_some(BucketState { full_at: next }),
        }
    } else {
        let retry_after = (cost_us <= burst).then_some(next - burst - now);
        Transition {
            decision: Decision {
                outcome: Admission::Denied { retry_after },
                limit: quota.capacity(),
                remaining: tokens_after(base),
                now,
                full_at: base,
            },
            write: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{Clock, FakeClock, MICROS_PER_SEC};

    const T0: Micros = 1_764_000_000_000_000;

    /// A bucket driven by a fake clock, as a host would drive it.
    struct Sim {
        clock: FakeClock,
        quota: Quota,
        state: Option<BucketState>,
    }

    impl Sim {
        fn new(quota: Quota) -> Self {
            Self {
                clock: FakeClock::at(T0),
                quota,
                state: None,
            }
        }
        fn hit(&mut self, cost: u32) -> Decision {
            let tr = decide(self.state, &self.quota, self.clock.now(), cost);
            if let Some(s) = tr.write {
                self.state = Some(s);
            }
            tr.decision
        }
    }

    fn q(capacity: u64, refill: u64, period_s: i64) -> Quota {
        Quota::new(capacity, refill, period_s * MICROS_PER_SEC).unwrap()
    }

    /// Table: each row advances the fake clock, sends a request and states the exact
    /// expected decision (allowed, remaining, reset, retry-after).
    #[test]
    fn table_of_decisions() {
        struct Row {
            advance_us: Micros,
            cost: u32,
            allowed: bool,
            remaining: u64,
            reset_in_us: Micros,
            retry_after_us: Option<Micros>,
        }
        let row = |advance_us, cost, allowed, remaining, reset_in_us, retry_after_us| Row {
            advance_us,
            cost,
            allowed,
            remaining,
            reset_in_us,
            retry_after_us,
        };
        // capacity 3, one token per second.
        let mut sim = Sim::new(q(3, 1, 1));
        let s = MICROS_PER_SEC;
        let rows = [
            row(0, 1, true, 2, s, None),                     // burst: a full bucket
            row(0, 1, true, 1, 2 * s, None),                 // burst
            row(0, 1, true, 0, 3 * s, None),                 // burst drains the bucket
            row(0, 1, false, 0, 3 * s, Some(s)),             // empty: wait exactly one token
            row(s / 2, 1, false, 0, 5 * s / 2, Some(s / 2)), // partial token: half a second more
            row(s / 2 - 1, 1, false, 0, 2 * s + 1, Some(1)), // one µs before the boundary
            row(1, 1, true, 0, 3 * s, None),                 // exactly at the boundary
            row(10 * s, 2, true, 1, 2 * s, None),            // refill capped at capacity; cost 2
            row(0, 2, false, 1, 2 * s, Some(s)),             // cost 2 needs one more token
            row(0, 1, true, 0, 3 * s, None),                 // but cost 1 fits
            row(0, 4, false, 0, 3 * s, None),                // cost above capacity: never
            row(0, 0, true, 0, 3 * s, None),                 // cost 0 peeks
        ];
        for (i, r) in rows.iter().enumerate() {
            sim.clock.advance(r.advance_us);
            let now = sim.clock.now();
            let d = sim.hit(r.cost);
            assert_eq!(d.allowed(), r.allowed, "row {i}");
            assert_eq!(d.remaining, r.remaining, "row {i}");
            assert_eq!(d.full_at - now, r.reset_in_us, "row {i}");
            match d.outcome {
                Admission::Allowed => assert_eq!(r.retry_after_us, None, "row {i}"),
                Admission::Denied { retry_after } => {
                    assert_eq!(retry_after, r.retry_after_us, "row {i}")
                }
            }
        }
    }

    #[test]
    fn the_1001st_request_in_a_minute_is_denied_with_a_whole_second_retry_after() {
        let mut sim = Sim::new(Quota::per_minute(1000).unwrap());
        for i in 0..1000 {
            let d = sim.hit(1);
            assert!(d.allowed(), "request {i}");
            assert_eq!(d.remaining, 999 - i);
        }
        let d = sim.hit(1);
        assert!(!d.allowed());
        assert_eq!(d.remaining, 0);
        // one token refills every 60 ms: Retry-After rounds 60 ms up to 1 s, never 0.
        assert_eq!(
            d.outcome,
            Admission::Denied {
                retry_after: Some(60_000)
            }
        );
        assert_eq!(d.retry_after_secs(), Some(1));
        // Reset: the bucket is full a minute after the burst began.
        assert_eq!(d.reset_unix_secs(), ceil_secs(T0 + 60 * MICROS_PER_SEC));
    }

    #[test]
    fn a_denial_writes_nothing_and_a_cost_above_capacity_never_touches_state() {
        let quota = q(2, 1, 1);
        let prev = Some(BucketState {
            full_at: T0 + 2 * MICROS_PER_SEC,
        });
        let tr = decide(prev, &quota, T0, 1);
        assert!(!tr.decision.allowed());
        assert_eq!(tr.write, None);
        let tr = decide(None, &quota, T0, 3);
        assert_eq!(tr.decision.outcome, Admission::Denied { retry_after: None });
        assert_eq!(tr.decision.retry_after_secs(), None);
        assert_eq!(tr.write, None);
    }

    #[test]
    fn retry_after_is_rounded_up_and_never_zero() {
        let quota = q(1, 1, 1);
        let full = Some(BucketState { full_at: T0 + 1 });
        let d = decide(full, &quota, T0, 1).decision;
        assert_eq!(
            d.outcome,
            Admission::Denied {
                retry_after: Some(1)
            }
        );
        assert_eq!(d.retry_after_secs(), Some(1));
        for (full_in, secs) in [(500_000, 1), (1_000_000, 1), (1_000_001, 2), (2_500_000, 3)] {
            let d = decide(
                Some(BucketState {
                    full_at: T0 + full_in,
                }),
                &quota,
                T0,
                1,
            )
            .decision;
            assert_eq!(
                d.retry_after_secs(),
                Some(secs),
                "bucket full in {full_in} µs"
            );
        }
    }

    #[test]
    fn decode_accepts_exactly_canonical_digits() {
        assert_eq!(
            BucketState::decode(b"1764000000000000", T0),
            Some(BucketState { full_at: T0 })
        );
        assert_eq!(
            BucketState::decode(b"0", T0),
            Some(BucketState { full_at: 0 })
        );
        for bad in [
            &b""[..],
            b"-1",
            b"1e5",
            b"0x10",
            b" 12",
            b"12 ",
            b"1.5",
            b"abc",
            b"17640000000000000",
            b"\xff",
        ] {
            assert_eq!(BucketState::decode(bad, T0), None, "{bad:?}");
        }
        // a far-future instant cannot have been written by any valid quota
        let far = (T0 + crate::policy::MAX_WINDOW + 1).to_string();
        assert_eq!(BucketState::decode(far.as_bytes(), T0), None);
        let s = BucketState {
            full_at: 1_764_000_000_123_456,
        };
        assert_eq!(BucketState::decode(s.encode().as_bytes(), T0), Some(s));
    }

    #[test]
    fn view_shows_tokens_and_last_refill() {
        let quota = q(10, 10, 10); // one token per second
        let v = BucketState {
            full_at: T0 + 2_500_000,
        }
        .view(&quota, T0);
        assert_eq!(v.tokens, 7.5);
        assert_eq!(v.last_refill, T0);
        assert_eq!(BucketState { full_at: 0 }.view(&quota, T0).tokens, 10.0);
    }
}
