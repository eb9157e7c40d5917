//! Lua ↔ Rust parity: the same generated (state, quota, time, cost) sequences run
//! through the script in a real redis-server and through the pure `decide`; the
//! decisions and the stored state must be identical, step by step.

use floodgate_edge::store::Store;
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::bucket::{BucketState, decide};
use floodgate_shared::policy::{MAX_WINDOW, Quota};
use floodgate_shared::script::Check;
use floodgate_shared::time::{MICROS_PER_SEC, Micros};
use floodgate_tests::{RedisServer, unique_key};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use redis::Commands;

const T0: Micros = 1_764_000_000_000_000;

/// What a bucket's key holds before the sequence starts.
#[derive(Debug, Clone)]
enum Initial {
    Absent,
    /// A stored `full_at` at this offset from T0 (possibly far in the past or future).
    Stored(Micros),
    /// A string the script must treat as a full bucket.
    Junk(String),
    /// A value of another type.
    Hash,
}

fn initial() -> impl Strategy<Value = Initial> {
    prop_oneof![
        Just(Initial::Absent),
        (-(10 * 86_400 * MICROS_PER_SEC)..(10 * 86_400 * MICROS_PER_SEC)).prop_map(Initial::Stored),
        (-(100 * MICROS_PER_SEC)..(100 * MICROS_PER_SEC)).prop_map(Initial::Stored),
        // around the bound beyond which a stored instant counts as corrupt
        prop_oneof![
            (MAX_WINDOW - 30 * MICROS_PER_SEC..MAX_WINDOW + 30 * MICROS_PER_SEC),
            Just(MAX_WINDOW),
            Just(MAX_WINDOW + 1),
        ]
        .prop_map(Initial::Stored),
        prop_oneof![
            Just("".to_string()),
            Just("-1".to_string()),
            Just("1e15".to_string()),
            Just(" 5".to_string()),
            Just("99999999999999999".to_string()),
            Just("4503599627370497".to_string()),
            "[a-z0-9.]{1,12}",
        ]
        .prop_map(Initial::Junk),
        Just(Initial::Hash),
    ]
}

/// Quotas whose emission interval is at least 1 s, so every key the script writes
/// lives (in real time) far longer than one generated case takes; odd ratios keep
/// the rounding of `T` in play.
fn quota() -> impl Strategy<Value = Quota> {
    (
        1u64..=40,
        1u64..=7,
        prop::sample::select(vec![7, 60, 3_600, 86_400]),
    )
        .prop_map(|(cap, refill, period_s)| {
            Quota::new(cap, refill.min(period_s as u64), period_s * MICROS_PER_SEC).unwrap()
        })
}

#[derive(Debug, Clone)]
struct Case {
    buckets: Vec<(Quota, Initial)>,
    /// (clock step in µs, possibly backwards; cost per bucket)
    steps: Vec<(Micros, Vec<u32>)>,
}

fn case() -> impl Strategy<Value = Case> {
    prop::collection::vec((quota(), initial()), 1..=3).prop_flat_map(|buckets| {
        let n = buckets.len();
        let step = (
            prop_oneof![
                3 => 0..(20 * MICROS_PER_SEC),
                1 => Just(0),
                1 => -(5 * MICROS_PER_SEC)..0,
                1 => 0..(2 * 86_400 * MICROS_PER_SEC),
            ],
            prop::collection::vec(
                prop_oneof![4 => 1u32..=3, 1 => Just(0u32), 1 => 0u32..=45],
                n,
            ),
        );
        (Just(buckets), prop::collection::vec(step, 1..25))
            .prop_map(|(buckets, steps)| Case { buckets, steps })
    })
}

/// The raw bytes of a key, or None when absent or not a string.
fn raw(conn: &mut redis::Connection, key: &str) -> Option<Vec<u8>> {
    let kind: String = redis::cmd("TYPE").arg(key).query(conn).unwrap();
    (kind == "string").then(|| conn.get(key).unwrap())
}

#[test]
fn script_and_decide_agree_on_every_step() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = rt
        .block_on(RespStore::connect(
            &server.url(),
            std::time::Duration::from_secs(5),
        ))
        .unwrap();
    let conn = std::cell::RefCell::new(server.connection());
    let cases = std::env::var("PARITY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    let steps_run = std::cell::Cell::new(0usize);
    runner
        .run(&case(), |case| {
            let conn = &mut *conn.borrow_mut();
            let keys: Vec<String> = case.buckets.iter().map(|_| unique_key("parity")).collect();
            // the Rust twin's view of each key: its raw bytes (None: absent / not a string)
            let mut twin: Vec<Option<Vec<u8>>> = vec![];
            for ((_, init), key) in case.buckets.iter().zip(&keys) {
                match init {
                    Initial::Absent => twin.push(None),
                    Initial::Stored(off) => {
                        let v = (T0 + off).to_string();
                        let _: () = conn.set(key, &v).unwrap();
                        twin.push(Some(v.into_bytes()));
                    }
                    Initial::Junk(s) => {
                        let _: () = conn.set(key, s).unwrap();
                        twin.push(Some(s.clone().into_bytes()));
                    }
                    Initial::Hash => {
                        let _: () = conn.hset(key, "tokens", "1").unwrap();
                        twin.push(None);
                    }
                }
            }
            let mut now = T0;
            for (dt, costs) in &case.steps {
                now = (now + dt).max(0);
                let checks: Vec<Check> = case
                    .buckets
                    .iter()
                    .zip(&keys)
                    .zip(costs)
                    .map(|(((q, _), key), &cost)| Check {
                        key,
                        quota: q,
                        cost,
                        shadow: false,
                    })
                    .collect();
                let verdict = rt
                    .block_on(store.check(&checks, Some(now)))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(verdict.now, now);

                // the twin: decode with the script's rules, decide, write only if all admit
                let transitions: Vec<_> = checks
                    .iter()
                    .zip(&twin)
                    .map(|(c, raw)| {
                        decide(
                            raw.as_deref().and_then(|r| BucketState::decode(r, now)),
                            c.quota,
                            now,
                            c.cost,
                        )
                    })
                    .collect();
                let admitted = transitions.iter().all(|t| t.decision.allowed());
                prop_assert_eq!(verdict.admitted, admitted);
                for (i, t) in transitions.iter().enumerate() {
                    if admitted {
                        prop_assert_eq!(verdict.decisions[i], t.decision);
                        if let Some(w) = t.write {
                            twin[i] = Some(w.encode().into_bytes());
                        }
                    } else if !t.decision.allowed() {
                        prop_assert_eq!(verdict.decisions[i], t.decision);
                    }
                    prop_assert_eq!(
                        raw(conn, &keys[i]),
                        twin[i].clone(),
                        "stored state of bucket {}",
                        i
                    );
                }
                steps_run.set(steps_run.get() + 1);
            }
            Ok(())
        })
        .unwrap();
    assert!(steps_run.get() > 1000, "only {} steps ran", steps_run.get());
}
