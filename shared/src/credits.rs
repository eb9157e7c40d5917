//! An API key's credits ("remaining uses"): a count of requests the key may still
//! make, optionally refilled every UTC day or every month on a chosen day.
//!
//! Credits are not a rate: a key out of credits is refused until its next refill,
//! or for good without one. A refill SETS the count to the refill's amount (it
//! does not add to what is left), at 00:00 UTC ([`crate::calendar`]): every day
//! for `daily`, on `day` (1-31, the month's last day when it is shorter) for
//! `monthly`.
//!
//! **Credits are always exact, never leased.** Whatever a key's policies'
//! consistency (`exact`, `bounded`, `auto`), its credits are decided by the one
//! store holding the count, in the same atomic call as the request's rate limits,
//! and never handed out ahead to an instance or a region: N credits admit exactly
//! N requests, however many instances serve the key. (A bounded policy's local
//! decision therefore cannot admit a key with credits on its own: such a request
//! takes the exact path.)
//!
//! The pure model here is what that call decides: [`CreditState`] is the count
//! and the refill instant it was last brought up to date at; [`CreditState::at`]
//! applies the refills that happened since; [`CreditState::spend`] decides a
//! request and spends only when it admits.
//!
//! **In the store.** The live count is one string, `<remaining>:<as_of>`
//! ([`CreditState::stored`]), under [`crate::keys::credits_key`] in the hash tag
//! of the key's buckets, decided by `lua/limiter.lua`'s credits entry in the
//! request's one call (a rate-limit denial spends no credit, a credit denial
//! spends no token; [`crate::script::credited_call`]). An absent (or unreadable)
//! live count is the record's: `remaining` as of the key's creation, with every
//! refill since applied. So creating a key writes nothing, and the expiry policy
//! is exact: with a refill, the live count expires at the next refill instant
//! (from then on the absent count and the stored one are the same: the refill's
//! amount); without a refill it never expires (it is the only record of what was
//! spent) and goes with the key.
//!
//! **Moving credits.** A key's live count is in its identity's hash tag, so a
//! change of identity moves it: the old key's count is taken and replaced by
//! [`MOVED`] in one command, then written under the new key, then the record
//! changes (`edge/src/admin.rs`, `change_key`). A request decided meanwhile by
//! the old record finds [`MOVED`] and is decided again on the record as read
//! anew; spent credits are never given back.
//!
//! **Changing credits later.** Setting new credits writes the live count:
//! [`CreditState::stored`] of `{remaining, as_of: now}` (Redis' clock), with
//! [`Refill::live_ttl_ms`]'s expiry (`edge/src/admin.rs`, `set_live_credits`);
//! removing them deletes it. Editing a record's credits without that would leave
//! a spent count in force.

use serde::{Deserialize, Serialize};

use crate::calendar::{day_window, monthly_window};
use crate::time::Micros;

/// What a live count's key holds once the count moved to another key (the key's
/// identity changed, and the credits' key with it: `edge/src/admin.rs`). An edge
/// still deciding by the old record finds it and decides nothing (the limiter
/// answers [`crate::script::Moved`]); it reads the record again. Kept for a day:
/// longer than any instance serves a record without reading it again, outages
/// aside.
pub const MOVED: &str = "moved";

/// How long [`MOVED`] stays (ms).
pub const MOVED_TTL_MS: u64 = 24 * 60 * 60 * 1000;

/// The most credits a key may hold or a refill set: every count stays exact in
/// a Lua script's doubles (below 2^53).
pub const MAX_CREDITS: u64 = 1_000_000_000_000;

/// How often credits are refilled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Interval {
    /// At 00:00 UTC every day.
    Daily,
    /// At 00:00 UTC on `day` of every month.
    Monthly,
}

/// A refill: the count is set to `amount` at each refill instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refill {
    pub amount: u64,
    pub interval: Interval,
    /// With `monthly`: the day of the month (1-31); the 1st when absent. Never
    /// set with `daily`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub day: Option<u8>,
}

impl Refill {
    /// The day of the month a monthly refill happens on.
    pub fn day_of_month(&self) -> u8 {
        self.day.unwrap_or(1)
    }

    /// The latest refill instant at or before `now`.
    pub fn last_at_or_before(&self, now: Micros) -> Micros {
        match self.interval {
            Interval::Daily => day_window(now).start,
            Interval::Monthly => monthly_window(now, self.day_of_month()).start,
        }
    }

    /// The expiry of a live count written at `now` (ms): until the next refill
    /// instant, from which the absent count is the refill's amount too.
    pub fn live_ttl_ms(&self, now: Micros) -> i64 {
        (self.next_after(now) - now + 999) / 1000
    }

    /// The first refill instant after `now`.
    pub fn next_after(&self, now: Micros) -> Micros {
        match self.interval {
            Interval::Daily => day_window(now).reset,
            Interval::Monthly => monthly_window(now, self.day_of_month()).reset,
        }
    }
}

/// A key's credits as its record states them: the count the operator set, and
/// the refill. The live count is a [`CreditState`] in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credits {
    pub remaining: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refill: Option<Refill>,
}

impl Credits {
    /// The live count these credits start from when set at `now`.
    pub fn start(&self, now: Micros) -> CreditState {
        CreditState {
            remaining: self.remaining,
            as_of: now,
        }
    }

    /// The count in force at `now` of a key whose live count reads `stored`:
    /// absent or unreadable, these credits as of `origin` (what the limiter
    /// decides by, `lua/limiter.lua`), with the refills due since applied.
    pub fn live(&self, stored: Option<&str>, origin: Micros, now: Micros) -> CreditState {
        stored
            .and_then(CreditState::parse_stored)
            .unwrap_or_else(|| self.start(origin))
            .at(self.refill.as_ref(), now)
    }
}

/// The live count of a key's credits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CreditState {
    pub remaining: u64,
    /// The instant the count was last brought up to date: when it was set, or the
    /// last refill instant applied to it. Refills after it are still due.
    pub as_of: Micros,
}

impl CreditState {
    /// The live count as the store holds it: `<remaining>:<as_of>`.
    pub fn stored(&self) -> String {
        format!("{}:{}", self.remaining, self.as_of)
    }

    /// Reads [`CreditState::stored`]'s form (`None`: not a live count).
    pub fn parse_stored(text: &str) -> Option<CreditState> {
        let (r, a) = text.split_once(':')?;
        let all_digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if !(all_digits(r) && all_digits(a) && r.len() <= 13 && a.len() <= 16) {
            return None;
        }
        let state = CreditState {
            remaining: r.parse().ok()?,
            as_of: a.parse().ok()?,
        };
        (state.remaining <= MAX_CREDITS && state.as_of <= crate::time::MAX_INSTANT).then_some(state)
    }
}

/// What one request's credits decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreditDecision {
    pub admitted: bool,
    /// The state to store: spent when admitted; when refused, the count in force
    /// (a due refill applied), nothing spent.
    pub state: CreditState,
    /// The next refill instant, if the credits refill.
    pub next_refill: Option<Micros>,
    /// When refused: how long until a refill would admit the request (`None`:
    /// never, with no refill or a cost above the refill's amount).
    pub retry_after: Option<Micros>,
}

impl CreditState {
    /// The count in force at `now`: the refill's amount once a refill instant
    /// passed after [`as_of`](Self::as_of), else the stored count. A clock that
    /// went back (`now < as_of`) changes nothing.
    pub fn at(self, refill: Option<&Refill>, now: Micros) -> CreditState {
        match refill {
            Some(r) if now > self.as_of => {
                let last = r.last_at_or_before(now);
                if last > self.as_of {
                    CreditState {
                        remaining: r.amount,
                        as_of: last,
                    }
                } else {
                    self
                }
            }
            _ => self,
        }
    }

    /// Decides a request costing `cost` credits at `now`: admitted when that many
    /// are left (after any refill due), and then spent; refused otherwise,
    /// spending none.
    pub fn spend(self, refill: Option<&Refill>, now: Micros, cost: u64) -> CreditDecision {
        let current = self.at(refill, now);
        let next_refill = refill.map(|r| r.next_after(now));
        if cost <= current.remaining {
            return CreditDecision {
                admitted: true,
                state: CreditState {
                    remaining: current.remaining - cost,
                    ..current
                },
                next_refill,
                retry_after: None,
            };
        }
        let refillable = refill.is_some_and(|r| cost <= r.amount);
        CreditDecision {
            admitted: false,
            state: current,
            next_refill,
            retry_after: next_refill.filter(|_| refillable).map(|t| t - now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calendar::{DAY, days_from_civil};
    use proptest::prelude::*;

    fn at(y: i64, m: u32, d: u32) -> Micros {
        days_from_civil(y, m, d) * DAY
    }

    fn monthly(amount: u64, day: u8) -> Refill {
        Refill {
            amount,
            interval: Interval::Monthly,
            day: Some(day),
        }
    }

    const HOUR: Micros = 3_600_000_000;

    #[test]
    fn credits_are_spent_one_by_one_then_refused_until_the_refill() {
        let refill = monthly(100, 1);
        let now = at(2026, 3, 31) + HOUR;
        let mut state = Credits {
            remaining: 3,
            refill: Some(refill),
        }
        .start(at(2026, 3, 2));
        let mut admitted = 0;
        for _ in 0..5 {
            let d = state.spend(Some(&refill), now, 1);
            state = d.state;
            admitted += u32::from(d.admitted);
            assert_eq!(d.next_refill, Some(at(2026, 4, 1)));
            if !d.admitted {
                assert_eq!(d.retry_after, Some(at(2026, 4, 1) - now));
            }
        }
        assert_eq!((admitted, state.remaining), (3, 0));
        // the refill instant sets the count to the amount
        assert_eq!(state.at(Some(&refill), at(2026, 4, 1) - 1).remaining, 0);
        let april = state.at(Some(&refill), at(2026, 4, 1));
        assert_eq!(
            april,
            CreditState {
                remaining: 100,
                as_of: at(2026, 4, 1)
            }
        );
        // credits spent after a refill stay spent until the next one
        let mut s = april;
        for hour in 1..=3 {
            s = s
                .spend(Some(&refill), at(2026, 4, 1) + hour * HOUR, 10)
                .state;
        }
        assert_eq!(s.at(Some(&refill), at(2026, 5, 1) - 1).remaining, 70);
        // a refill sets, it does not add: 100 left stays 100 at the next one
        assert_eq!(april.at(Some(&refill), at(2026, 5, 1)).remaining, 100);
    }

    #[test]
    fn a_daily_refill_happens_at_midnight_utc() {
        let r = Refill {
            amount: 10,
            interval: Interval::Daily,
            day: None,
        };
        let s = CreditState {
            remaining: 0,
            as_of: at(2026, 6, 1) + 5 * HOUR,
        };
        assert_eq!(s.at(Some(&r), at(2026, 6, 2) - 1).remaining, 0);
        assert_eq!(s.at(Some(&r), at(2026, 6, 2)).remaining, 10);
        assert_eq!(r.next_after(at(2026, 6, 1) + 5 * HOUR), at(2026, 6, 2));
        assert_eq!(r.next_after(at(2026, 6, 2)), at(2026, 6, 3));
    }

    #[test]
    fn without_a_refill_a_spent_key_is_refused_for_good() {
        let s = CreditState {
            remaining: 1,
            as_of: 0,
        };
        let first = s.spend(None, 5, 1);
        assert!(first.admitted);
        let second = first.state.spend(None, 10 * 365 * DAY, 1);
        assert!(!second.admitted);
        assert_eq!((second.retry_after, second.next_refill), (None, None));
        assert_eq!(second.state, first.state, "a refusal spends nothing");
    }

    #[test]
    fn a_cost_above_the_refill_amount_never_gets_a_retry_after() {
        let r = monthly(5, 15);
        let d = CreditState {
            remaining: 5,
            as_of: 0,
        }
        .spend(Some(&r), at(2026, 1, 20), 6);
        assert!(!d.admitted);
        assert_eq!(d.state.remaining, 5);
        assert_eq!(
            (d.retry_after, d.next_refill),
            (None, Some(at(2026, 2, 15)))
        );
    }

    #[test]
    fn a_clock_that_goes_back_changes_nothing() {
        let r = monthly(50, 1);
        let s = CreditState {
            remaining: 7,
            as_of: at(2026, 5, 1),
        };
        assert_eq!(s.at(Some(&r), at(2026, 4, 20)), s);
    }

    #[test]
    fn the_live_count_reads_back_and_refuses_what_the_script_refuses() {
        let s = CreditState {
            remaining: MAX_CREDITS,
            as_of: 1 << 52,
        };
        assert_eq!(CreditState::parse_stored(&s.stored()), Some(s));
        for bad in [
            "",
            "1",
            "1:",
            ":1",
            "-1:0",
            "1:2:3",
            "1000000000001:0",
            "1: 2",
            "1:4503599627370497",
        ] {
            assert_eq!(CreditState::parse_stored(bad), None, "{bad:?}");
        }
        let r = monthly(5, 1);
        assert_eq!(r.live_ttl_ms(at(2026, 4, 30)), DAY / 1000);
        assert_eq!(r.live_ttl_ms(at(2026, 5, 1) - 1), 1);
    }

    #[test]
    fn credits_round_trip_as_json() {
        let c = Credits {
            remaining: 10,
            refill: Some(monthly(1000, 31)),
        };
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(
            json,
            r#"{"remaining":10,"refill":{"amount":1000,"interval":"monthly","day":31}}"#
        );
        assert_eq!(serde_json::from_str::<Credits>(&json).unwrap(), c);
        let plain = r#"{"remaining":3}"#;
        let c: Credits = serde_json::from_str(plain).unwrap();
        assert_eq!((c.remaining, c.refill), (3, None));
        assert_eq!(serde_json::to_string(&c).unwrap(), plain);
    }

    fn refills() -> impl Strategy<Value = Refill> {
        (
            1u64..1_000,
            prop_oneof![Just(None), (1u8..=31).prop_map(Some)],
        )
            .prop_map(|(amount, day)| Refill {
                amount,
                interval: if day.is_some() {
                    Interval::Monthly
                } else {
                    Interval::Daily
                },
                day,
            })
    }

    const RANGE: std::ops::Range<Micros> = 0..(1 << 52);

    proptest! {
        #[test]
        fn refill_instants_bracket_now(r in refills(), now in RANGE) {
            let last = r.last_at_or_before(now);
            let next = r.next_after(now);
            prop_assert!(last <= now && now < next);
            // no refill instant between them
            prop_assert_eq!(r.last_at_or_before(next - 1), last);
            prop_assert_eq!(r.last_at_or_before(next), next);
            prop_assert_eq!(r.next_after(last), next);
        }

        #[test]
        fn the_count_in_force_composes_over_time(
            r in refills(), remaining in 0u64..2_000, as_of in RANGE, a in 0i64..(90 * DAY), b in 0i64..(90 * DAY),
        ) {
            let s = CreditState { remaining, as_of };
            let (t1, t2) = (as_of + a.min(b), as_of + a.max(b));
            prop_assert_eq!(s.at(Some(&r), t1).at(Some(&r), t2), s.at(Some(&r), t2));
            let now = s.at(Some(&r), t2);
            let refilled = r.last_at_or_before(t2) > as_of;
            prop_assert_eq!(now.remaining, if refilled { r.amount } else { remaining });
            prop_assert!(now.as_of <= t2.max(as_of));
        }

        #[test]
        fn n_credits_admit_exactly_n_requests_until_the_refill(
            r in refills(), n in 0u64..200, tries in 0u64..400, start in RANGE,
        ) {
            let mut s = CreditState { remaining: n, as_of: start };
            let next = r.next_after(start);
            let mut admitted = 0;
            for i in 0..tries {
                // spread over the refill window, never reaching the refill
                let now = start + (next - 1 - start) * i as i64 / tries.max(1) as i64;
                let d = s.spend(Some(&r), now, 1);
                prop_assert!(d.admitted || d.state == s.at(Some(&r), now));
                prop_assert_eq!(d.next_refill, Some(next));
                admitted += u64::from(d.admitted);
                s = d.state;
            }
            prop_assert_eq!(admitted, n.min(tries));
            prop_assert_eq!(s.at(Some(&r), next).remaining, r.amount);
        }

        #[test]
        fn a_refusal_names_the_wait_until_the_next_refill(
            r in refills(), now in RANGE, cost in 1u64..2_000,
        ) {
            let d = CreditState { remaining: 0, as_of: now }.spend(Some(&r), now, cost);
            prop_assert!(!d.admitted);
            let wait = r.next_after(now) - now;
            prop_assert_eq!(d.retry_after, (cost <= r.amount).then_some(wait));
            prop_assert!(wait > 0);
        }
    }
}
