//! `lua/limiter.lua`'s credits entry and calendar quotas ↔ their pure twins
//! (`shared/src/credits.rs`, `shared/src/calendar.rs`, `shared/src/simulate.rs`),
//! on a real redis-server with explicit instants (the script's clock argument:
//! how every parity test fakes Redis' `TIME`): generated sequences over a key's
//! credits (no refill, daily, monthly on any day) beside 0-2 buckets (token
//! bucket, calendar day, calendar month, some shadow), with clock steps that
//! cross midnights and months. Admission, every decision, the credits' decision
//! and the live count in Redis must be the twins' step by step; and the refund
//! script gives back exactly what a call spent.

use floodgate_edge::store::Store;
use floodgate_edge::store::StoreError;
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::calendar::{CalendarPeriod, DAY, days_from_civil, month_window};
use floodgate_shared::credits::{CreditDecision, CreditState, Credits, Interval, Refill};
use floodgate_shared::policy::Quota;
use floodgate_shared::script::{Call, Check, CreditCheck, Credited, LIMITER, When};
use floodgate_shared::simulate::Simulator;
use floodgate_shared::time::{MICROS_PER_SEC, Micros};
use floodgate_tests::{RedisServer, unique_key};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// One call deciding `checks` and the key's `credit`, reading the revision too.
async fn credited<S: Store>(
    store: &S,
    checks: &[Check<'_>],
    credit: &CreditCheck<'_>,
    when: When,
) -> Result<Credited, StoreError> {
    let call = Call {
        credits: Some(credit),
        watch: Some("fg:rev"),
        ..Call::new(checks, when)
    };
    Ok(store
        .decide(call)
        .await?
        .one()
        .expect("a call of one decides"))
}

/// 2026-01-30T12:00:00Z: steps of up to a few days cross a month end soon.
const T0: Micros = 1_769_774_400_000_000;
const HOUR: Micros = 3_600 * MICROS_PER_SEC;

fn at(y: i64, m: u32, d: u32) -> Micros {
    days_from_civil(y, m, d) * DAY
}

fn quota() -> impl Strategy<Value = Quota> {
    (0u8..3, 1u64..=6).prop_map(|(kind, cap)| match kind {
        0 => Quota::new(cap, cap, 60 * MICROS_PER_SEC).unwrap(),
        1 => Quota::calendar_quota(cap, CalendarPeriod::Day).unwrap(),
        _ => Quota::calendar_quota(cap, CalendarPeriod::Month).unwrap(),
    })
}

fn credits() -> impl Strategy<Value = Credits> {
    (
        0u64..6,
        prop_oneof![
            Just(None),
            (1u64..5).prop_map(|amount| Some(Refill {
                amount,
                interval: Interval::Daily,
                day: None
            })),
            (1u64..5, 1u8..=31).prop_map(|(amount, day)| Some(Refill {
                amount,
                interval: Interval::Monthly,
                day: Some(day)
            })),
        ],
    )
        .prop_map(|(remaining, refill)| Credits { remaining, refill })
}

#[derive(Debug, Clone)]
struct Case {
    credits: Credits,
    /// How long before T0 the key was created (its credits' origin).
    age: Micros,
    buckets: Vec<(Quota, bool)>,
    /// (forward clock step µs, cost per bucket, credit cost)
    steps: Vec<(Micros, Vec<u32>, u64)>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        credits(),
        0i64..(40 * DAY),
        prop::collection::vec((quota(), prop::bool::weighted(0.2)), 0..=2),
    )
        .prop_flat_map(|(credits, age, buckets)| {
            let n = buckets.len();
            let step = (
                prop_oneof![0i64..2_000, 0i64..(6 * HOUR), 0i64..(3 * DAY), Just(0)],
                prop::collection::vec(0u32..=2, n),
                prop_oneof![4 => Just(1u64), 1 => Just(0u64), 1 => Just(2u64)],
            );
            (
                Just(credits),
                Just(age),
                Just(buckets),
                prop::collection::vec(step, 1..30),
            )
                .prop_map(|(credits, age, buckets, steps)| Case {
                    credits,
                    age,
                    buckets,
                    steps,
                })
        })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// What the twins expect of one call: the buckets' simulator decides the
/// buckets, the credit model the credits, all or nothing over both.
struct Twins {
    buckets: Simulator,
    /// The live count in the store (`None`: absent, the record's).
    stored: Option<CreditState>,
}

struct Expected {
    admitted: bool,
    decisions: Vec<floodgate_shared::bucket::Decision>,
    credits: CreditDecision,
}

impl Twins {
    fn step(
        &mut self,
        calls: &[(&str, &Quota, u32, bool)],
        credit: &CreditCheck<'_>,
        now: Micros,
    ) -> Expected {
        let read = self.stored.unwrap_or(CreditState {
            remaining: credit.credits.remaining,
            as_of: credit.origin,
        });
        let spend = credit.decide(read, now);
        let mut trial = self.buckets.clone();
        let t = trial.check(calls, now);
        if t.admitted && spend.admitted {
            self.buckets = trial;
            if credit.cost > 0 {
                self.stored = Some(spend.state);
            }
            return Expected {
                admitted: true,
                decisions: t.decisions,
                credits: spend,
            };
        }
        // nothing is consumed: a bucket that fit reports its untouched state
        let peek: Vec<_> = calls.iter().map(|(k, q, _, s)| (*k, *q, 0, *s)).collect();
        let untouched = self.buckets.clone().check(&peek, now).decisions;
        let decisions = t
            .decisions
            .into_iter()
            .zip(untouched)
            .map(|(d, u)| if d.allowed() { u } else { d })
            .collect();
        let credits = if spend.admitted {
            CreditCheck { cost: 0, ..*credit }.decide(read, now)
        } else {
            spend
        };
        Expected {
            admitted: false,
            decisions,
            credits,
        }
    }
}

#[test]
fn credits_and_calendar_quotas_agree_with_their_twins_step_by_step() {
    let redis = RedisServer::start();
    let rt = runtime();
    let store = rt
        .block_on(RespStore::connect(
            &redis.url(),
            std::time::Duration::from_secs(2),
        ))
        .unwrap();
    let conn = std::cell::RefCell::new(redis.connection());
    let mut runner = TestRunner::new(Config {
        cases: 300,
        failure_persistence: None,
        ..Config::default()
    });
    let (refused_for_credits, refused_by_buckets, refills_seen) = (
        std::cell::Cell::new(0u32),
        std::cell::Cell::new(0u32),
        std::cell::Cell::new(0u32),
    );
    runner
        .run(&case(), |c| {
            let base = unique_key("fg:{credits}");
            let keys: Vec<String> = (0..c.buckets.len())
                .map(|i| format!("{base}:{i}"))
                .collect();
            let credit_key = format!("{base}::credits");
            let mut twins = Twins {
                buckets: Simulator::default(),
                stored: None,
            };
            let mut now = T0;
            for (step, costs, credit_cost) in &c.steps {
                now += step;
                let checks: Vec<Check> = c
                    .buckets
                    .iter()
                    .zip(&keys)
                    .zip(costs)
                    .map(|(((q, shadow), k), cost)| Check {
                        key: k,
                        quota: q,
                        cost: *cost,
                        shadow: *shadow,
                    })
                    .collect();
                let credit = CreditCheck {
                    key: &credit_key,
                    credits: &c.credits,
                    origin: T0 - c.age,
                    cost: *credit_cost,
                };
                let got = rt
                    .block_on(credited(&store, &checks, &credit, When::At(now)))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let calls: Vec<(&str, &Quota, u32, bool)> = checks
                    .iter()
                    .map(|ch| (ch.key, ch.quota, ch.cost, ch.shadow))
                    .collect();
                let before = twins.stored;
                let want = twins.step(&calls, &credit, now);
                let t = now - T0;
                prop_assert_eq!(got.verdict.admitted, want.admitted, "at {}", t);
                prop_assert_eq!(&got.verdict.decisions, &want.decisions, "at {}", t);
                prop_assert_eq!(got.credits, Some(want.credits), "at {}", t);
                if !want.admitted {
                    if got.credits_refused() {
                        refused_for_credits.set(refused_for_credits.get() + 1);
                    } else {
                        refused_by_buckets.set(refused_by_buckets.get() + 1);
                    }
                }
                if want.credits.state.as_of > before.map_or(credit.origin, |s| s.as_of) {
                    refills_seen.set(refills_seen.get() + 1);
                }
                // the live count in Redis is the model's, and expires as documented
                let raw: Option<String> = redis::cmd("GET")
                    .arg(&credit_key)
                    .query(&mut *conn.borrow_mut())
                    .unwrap();
                prop_assert_eq!(
                    raw.as_deref().and_then(CreditState::parse_stored),
                    twins.stored
                );
                if twins.stored != before {
                    let pttl: i64 = redis::cmd("PTTL")
                        .arg(&credit_key)
                        .query(&mut *conn.borrow_mut())
                        .unwrap();
                    match c.credits.refill {
                        None => {
                            prop_assert_eq!(pttl, -1, "no refill: the live count never expires")
                        }
                        Some(r) => {
                            let ttl = r.live_ttl_ms(now);
                            prop_assert!(
                                (ttl - 5_000..=ttl).contains(&pttl),
                                "{} of {}",
                                pttl,
                                ttl
                            );
                        }
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    // the generated cases exercise every branch
    assert!(
        refused_for_credits.get() > 100,
        "{}",
        refused_for_credits.get()
    );
    assert!(
        refused_by_buckets.get() > 100,
        "{}",
        refused_by_buckets.get()
    );
    assert!(refills_seen.get() > 100, "{}", refills_seen.get());
}

fn eval(
    conn: &mut redis::Connection,
    keys: &[&str],
    args: &[&str],
) -> redis::RedisResult<Vec<i64>> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(LIMITER.source).arg(keys.len()).arg(keys).arg(args);
    cmd.query(conn)
}

#[test]
fn a_monthly_quota_resets_at_midnight_utc_on_the_first_whatever_the_month() {
    let redis = RedisServer::start();
    let rt = runtime();
    let store = rt
        .block_on(RespStore::connect(
            &redis.url(),
            std::time::Duration::from_secs(2),
        ))
        .unwrap();
    let q = Quota::calendar_quota(2, CalendarPeriod::Month).unwrap();
    // the last second of a leap February, of December (into the next year), of April
    for (now, reset) in [
        (at(2028, 3, 1) - MICROS_PER_SEC, at(2028, 3, 1)),
        (at(2027, 1, 1) - 1, at(2027, 1, 1)),
        (at(2026, 4, 17) + 5 * HOUR, at(2026, 5, 1)),
    ] {
        let key = unique_key("fg:{month}");
        let check = [Check::new(&key, &q, 1)];
        for _ in 0..2 {
            let v = rt.block_on(store.check(&check, Some(now))).unwrap();
            assert!(v.admitted);
            assert_eq!(v.headline().reset_unix_secs(), reset / MICROS_PER_SEC);
        }
        let denied = rt.block_on(store.check(&check, Some(now))).unwrap();
        assert!(!denied.admitted);
        let d = denied.headline();
        assert_eq!(
            d.reset_unix_secs(),
            reset / MICROS_PER_SEC,
            "the 1st, 00:00 UTC"
        );
        assert_eq!(
            d.retry_after_secs(),
            Some((reset - now + 999_999) / MICROS_PER_SEC)
        );
        assert_eq!(month_window(now).reset, reset);
        // the first microsecond of the next month admits again
        assert!(
            rt.block_on(store.check(&check, Some(reset)))
                .unwrap()
                .admitted
        );
        let day = Quota::calendar_quota(1, CalendarPeriod::Day).unwrap();
        let dkey = unique_key("fg:{day}");
        let dcheck = [Check::new(&dkey, &day, 1)];
        assert!(
            rt.block_on(store.check(&dcheck, Some(reset - 1)))
                .unwrap()
                .admitted
        );
        assert!(
            !rt.block_on(store.check(&dcheck, Some(reset - 1)))
                .unwrap()
                .admitted
        );
        assert!(
            rt.block_on(store.check(&dcheck, Some(reset)))
                .unwrap()
                .admitted
        );
    }
}

#[test]
fn a_refund_gives_back_exactly_the_credits_and_calendar_counts_a_call_spent() {
    let redis = RedisServer::start();
    let rt = runtime();
    let store = rt
        .block_on(RespStore::connect(
            &redis.url(),
            std::time::Duration::from_secs(2),
        ))
        .unwrap();
    let mut conn = redis.connection();
    let credits = Credits {
        remaining: 3,
        refill: Some(Refill {
            amount: 3,
            interval: Interval::Monthly,
            day: Some(31),
        }),
    };
    let base = unique_key("fg:{refund}");
    let (ck, mk, dk) = (
        format!("{base}::credits"),
        format!("{base}:m"),
        format!("{base}:d"),
    );
    let month = Quota::calendar_quota(10, CalendarPeriod::Month).unwrap();
    let day = Quota::calendar_quota(10, CalendarPeriod::Day).unwrap();
    let checks = [Check::new(&mk, &month, 2), Check::new(&dk, &day, 1)];
    let credit = CreditCheck {
        key: &ck,
        credits: &credits,
        origin: 0,
        cost: 1,
    };
    // Redis' own clock: the refund script decides by TIME
    let got = rt
        .block_on(credited(&store, &checks, &credit, When::Redis))
        .unwrap();
    assert!(got.verdict.admitted);
    let spent = got.credits.unwrap();
    assert_eq!(spent.state.remaining, 2);
    rt.block_on(store.refund(&checks, Some(&credit), &got))
        .unwrap();
    let raw: String = redis::cmd("GET").arg(&ck).query(&mut conn).unwrap();
    let back = CreditState::parse_stored(&raw).unwrap();
    assert_eq!((back.remaining, back.as_of), (3, spent.state.as_of));
    for key in [&mk, &dk] {
        let raw: String = redis::cmd("GET").arg(key).query(&mut conn).unwrap();
        assert!(raw.ends_with(":0"), "{key}: {raw}");
    }
    // a refund after a refill replaced the count changes nothing
    let stale = floodgate_shared::script::Credited {
        credits: Some(CreditDecision {
            state: CreditState {
                as_of: spent.state.as_of - 1,
                ..spent.state
            },
            ..spent
        }),
        ..got.clone()
    };
    rt.block_on(store.refund(&[], Some(&credit), &stale))
        .unwrap();
    let raw: String = redis::cmd("GET").arg(&ck).query(&mut conn).unwrap();
    assert_eq!(CreditState::parse_stored(&raw).unwrap().remaining, 3);
}

#[test]
fn malformed_credit_and_calendar_entries_are_refused_with_a_clear_error() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let k = unique_key("fg:{bad}");
    for (args, want) in [
        (["1", "kx:5", "1", "0", "1"], "bad refill"),
        (["1", "kd:0", "1", "0", "1"], "bad refill"),
        (["1", "km32:5", "1", "0", "1"], "bad refill"),
        (["1", "km0:5", "1", "0", "1"], "bad refill"),
        (["1", "kd:5", "-1", "0", "1"], "bad credits"),
        (["1", "k", "1000000000001", "0", "1"], "bad credits"),
        (["1", "k", "1", "0", "1.5"], "bad credits"),
        (["1", "sk", "1", "0", "1"], "unknown algorithm"),
        (["1", "m", "60", "5", "1"], "bad limit"),
        (["1", "d", "0", "0", "1"], "bad limit"),
    ] {
        let err = eval(&mut conn, &[&k], &args).expect_err(want);
        assert!(err.to_string().contains(want), "{args:?}: {err}");
    }
    // two credit entries in one call: the second is not a credit entry
    let err = eval(
        &mut conn,
        &[&k, &format!("{k}2")],
        &["1", "k", "1", "0", "1", "k", "1", "0", "1"],
    )
    .expect_err("one credits entry per call");
    assert!(err.to_string().contains("unknown algorithm"), "{err}");
    // nothing was written by any refused call
    let n: i64 = redis::cmd("EXISTS").arg(&k).query(&mut conn).unwrap();
    assert_eq!(n, 0);
}

/// On a real Redis Cluster (3 masters), a key's credits and its buckets, with and
/// without an identity, are one call in one slot: 3 credits admit 3 requests
/// beside a calendar quota and an identity bucket, and the live count sits on the
/// master owning the buckets' slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credits_share_the_slot_of_the_keys_buckets_on_a_cluster() {
    use floodgate_edge::store::cluster::ClusterStore;
    use floodgate_shared::keys::{Subject, credits_key, hash_tag, identity_bucket_key};
    use floodgate_shared::policy::Policy;
    use floodgate_shared::slot::key_slot;
    let cluster = floodgate_tests::cluster::RedisCluster::start(3, 0);
    let store = ClusterStore::connect(&cluster.url(), std::time::Duration::from_secs(2))
        .await
        .unwrap();
    let month = Policy::from_json(
        r#"{"name":"month","dimensions":["identity"],"quota":{"capacity":100,"period":"month"},"failure_mode":"fail_closed"}"#,
    )
    .unwrap();
    let credits = Credits {
        remaining: 3,
        refill: None,
    };
    for identity in [None, Some("cus_42")] {
        let subject = Subject {
            api_key_id: Some("Ab3dE5gH1j"),
            ..Subject::default()
        };
        let bucket = identity_bucket_key(&month, &subject, identity).unwrap();
        let ck = credits_key("Ab3dE5gH1j", identity);
        assert_eq!(hash_tag(&bucket), hash_tag(&ck));
        let checks = [Check::new(&bucket, month.quota(), 1)];
        let credit = CreditCheck {
            key: &ck,
            credits: &credits,
            origin: 0,
            cost: 1,
        };
        let mut admitted = 0;
        for _ in 0..5 {
            let got = credited(&store, &checks, &credit, When::Redis)
                .await
                .unwrap();
            admitted += u32::from(got.verdict.admitted);
        }
        assert_eq!(admitted, 3, "identity {identity:?}");
        let owner = cluster
            .nodes
            .iter()
            .find(|n| {
                let keys: i64 = redis::cmd("CLUSTER")
                    .arg("COUNTKEYSINSLOT")
                    .arg(key_slot(&ck))
                    .query(&mut n.connection())
                    .unwrap_or(0);
                keys > 0
            })
            .expect("a master holds the slot's keys");
        let raw: String = redis::cmd("GET")
            .arg(&ck)
            .query(&mut owner.connection())
            .unwrap();
        assert_eq!(CreditState::parse_stored(&raw).unwrap().remaining, 0);
        let count: String = redis::cmd("GET")
            .arg(&bucket)
            .query(&mut owner.connection())
            .unwrap();
        assert!(
            count.ends_with(":3"),
            "{count}: the bucket spent 3, the refusals none"
        );
    }
}
