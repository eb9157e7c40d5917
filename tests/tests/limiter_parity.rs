//! `lua/limiter.lua` ↔ its pure twins, on a real redis-server: generated sequences
//! over 1-3 buckets of any algorithm (some in shadow mode) run through the script
//! (explicit instants) and through the twins; admission, every decision and the
//! consumption must be identical step by step. Plus the properties each algorithm
//! is chosen for, measured on Redis: the fixed window's boundary burst, the log's
//! memory per entry, and the counter's error against the log on bursty traffic.

use floodgate_edge::store::Store;
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::policy::{Algorithm, Quota};
use floodgate_shared::script::{Check, LIMITER, needs_limiter};
use floodgate_shared::simulate::Simulator;
use floodgate_shared::time::{MICROS_PER_SEC, Micros};
use floodgate_tests::{RedisServer, unique_key};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rand::{Rng, SeedableRng};

const T0: Micros = 1_764_000_000_000_000;

fn quota() -> impl Strategy<Value = Quota> {
    (
        prop::sample::select(vec![
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingLog,
            Algorithm::SlidingCounter,
        ]),
        1u64..=12,
        prop::sample::select(vec![2i64, 7, 60]),
    )
        .prop_map(|(a, cap, period_s)| {
            Quota::new(cap, cap, period_s * MICROS_PER_SEC)
                .unwrap()
                .with_algorithm(a)
                .unwrap()
        })
}

#[derive(Debug, Clone)]
struct Case {
    buckets: Vec<(Quota, bool)>,
    /// (forward clock step µs, cost per bucket)
    steps: Vec<(Micros, Vec<u32>)>,
}

fn case() -> impl Strategy<Value = Case> {
    prop::collection::vec((quota(), prop::bool::weighted(0.25)), 1..=3).prop_flat_map(|buckets| {
        let n = buckets.len();
        let step = (
            prop_oneof![0i64..2_000, 0i64..3 * MICROS_PER_SEC, Just(0)],
            prop::collection::vec(0u32..=4, n),
        );
        (Just(buckets), prop::collection::vec(step, 1..40))
            .prop_map(|(buckets, steps)| Case { buckets, steps })
    })
}

#[test]
fn the_limiter_script_and_its_twins_agree_step_by_step() {
    let redis = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = rt
        .block_on(RespStore::connect(
            &redis.url(),
            std::time::Duration::from_secs(2),
        ))
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 250,
        failure_persistence: None,
        ..Config::default()
    });
    let limiter_calls = std::cell::Cell::new(0u32);
    runner
        .run(&case(), |c| {
            let keys: Vec<String> = (0..c.buckets.len())
                .map(|i| format!("{}:{i}", unique_key("fg:{parity}")))
                .collect();
            // the twins of every bucket (shared::simulate runs exactly what the
            // script decides, from the same pure transitions)
            let mut twins = Simulator::default();
            let mut now = T0;
            for (step, costs) in &c.steps {
                now += step;
                let checks: Vec<Check> = c
                    .buckets
                    .iter()
                    .zip(&keys)
                    .zip(costs)
                    .map(|(((q, shadow), k), cost)| Check {
                        key: k,
                        quota: q,
                        cost: (*cost).min(q.capacity() as u32 + 1),
                        shadow: *shadow,
                    })
                    .collect();
                let verdict = rt
                    .block_on(store.check(&checks, Some(now)))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                limiter_calls.set(limiter_calls.get() + u32::from(needs_limiter(&checks)));
                let calls: Vec<(&str, &Quota, u32, bool)> = checks
                    .iter()
                    .map(|ch| (ch.key, ch.quota, ch.cost, ch.shadow))
                    .collect();
                let twin = twins.check(&calls, now);
                prop_assert_eq!(verdict.admitted, twin.admitted, "at {}", now - T0);
                prop_assert_eq!(&verdict.decisions, &twin.decisions, "at {}", now - T0);
                prop_assert_eq!(verdict.shadow_denied(), twin.shadow_denied);
            }
            Ok(())
        })
        .unwrap();
    assert!(
        limiter_calls.get() > 1_000,
        "the generated cases exercise the limiter script"
    );
}

fn eval(conn: &mut redis::Connection, keys: &[&str], args: &[String]) -> Vec<i64> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(LIMITER.source).arg(keys.len()).arg(keys).arg(args);
    cmd.query(conn).expect("the script runs")
}

#[test]
fn a_fixed_window_lets_twice_its_limit_through_within_two_seconds_across_its_edge() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let key = unique_key("fg:{fw}");
    let limit = 100;
    // windows of one minute; the edge at T0 (a whole minute)
    let edge = T0 - T0 % (60 * MICROS_PER_SEC);
    let mut admitted = vec![];
    for i in 0..(3 * limit) {
        // 300 requests spread over the 2 s around the edge
        let now = edge - MICROS_PER_SEC + i as i64 * (2 * MICROS_PER_SEC) / (3 * limit) as i64;
        let args = vec![
            now.to_string(),
            "f".into(),
            (60 * MICROS_PER_SEC).to_string(),
            limit.to_string(),
            "1".into(),
        ];
        if eval(&mut conn, &[&key], &args)[0] == 1 {
            admitted.push(now);
        }
    }
    let span = admitted.last().unwrap() - admitted.first().unwrap();
    assert_eq!(admitted.len(), 2 * limit as usize, "2× the limit");
    assert!(span < 2 * MICROS_PER_SEC, "within two seconds: {span} µs");
    // the sliding log over the same requests admits the limit only
    let log_key = unique_key("fg:{sl}");
    let log_admitted = (0..(3 * limit))
        .filter(|i| {
            let now = edge - MICROS_PER_SEC + *i as i64 * (2 * MICROS_PER_SEC) / (3 * limit) as i64;
            let args = vec![
                now.to_string(),
                "l".into(),
                (60 * MICROS_PER_SEC).to_string(),
                limit.to_string(),
                "1".into(),
            ];
            eval(&mut conn, &[&log_key], &args)[0] == 1
        })
        .count();
    assert_eq!(log_admitted, limit as usize);
}

#[test]
fn malformed_limiter_calls_are_refused_with_a_clear_error() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let key = unique_key("fg:{bad}");
    let cases: Vec<Vec<String>> = vec![
        vec!["".into(), "x".into(), "1".into(), "1".into(), "1".into()],
        vec!["".into(), "f".into(), "0".into(), "1".into(), "1".into()],
        vec!["".into(), "l".into(), "1000".into(), "0".into(), "1".into()],
        vec![
            "".into(),
            "c".into(),
            "1000".into(),
            "1".into(),
            "1.5".into(),
        ],
        vec!["".into(), "t".into(), "-1".into(), "1".into(), "0".into()],
        vec![
            "-5".into(),
            "f".into(),
            "1000".into(),
            "1".into(),
            "1".into(),
        ],
        vec!["".into(), "f".into(), "1000".into()],
    ];
    for args in cases {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(LIMITER.source).arg(1).arg(&key).arg(&args);
        let e = cmd.query::<Vec<i64>>(&mut conn).expect_err("refused");
        assert!(e.to_string().contains("floodgate"), "{args:?}: {e}");
    }
    // hostile stored values are an empty window, never an error
    for junk in ["x", "1:2:3:4", "99999999999999999999:1", ":", "5:-1"] {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(junk)
            .query(&mut conn)
            .unwrap();
        for code in ["f", "c"] {
            let r = eval(
                &mut conn,
                &[&key],
                &[
                    "".into(),
                    code.into(),
                    "60000000".into(),
                    "5".into(),
                    "1".into(),
                ],
            );
            assert_eq!(r[0], 1, "{junk} under {code}");
            let _: () = redis::cmd("SET")
                .arg(&key)
                .arg(junk)
                .query(&mut conn)
                .unwrap();
        }
        let r = eval(
            &mut conn,
            &[&key],
            &[
                "".into(),
                "l".into(),
                "60000000".into(),
                "5".into(),
                "1".into(),
            ],
        );
        assert_eq!(r[0], 1, "{junk} under l: replaced by a log");
        let t: String = redis::cmd("TYPE").arg(&key).query(&mut conn).unwrap();
        assert_eq!(t, "zset");
        let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    }
}

/// Bursty traffic from a seeded generator (on/off periods, a few clients).
fn bursty_trace(seed: u64, secs: i64) -> Vec<Micros> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = vec![];
    let mut t = T0;
    let end = T0 + secs * MICROS_PER_SEC;
    while t < end {
        // a burst of 5-60 requests at 1-20 ms spacing, then 0.2-4 s of quiet
        for _ in 0..rng.random_range(5..60) {
            t += rng.random_range(1_000..20_000);
            out.push(t);
        }
        t += rng.random_range(200_000..4_000_000);
    }
    out
}

/// Measures the sliding counter's error against the exact log on recorded bursty
/// traffic, and the log's memory per entry, on Redis; prints both (docs/algorithms.md
/// quotes them) and asserts the bounds they must respect.
#[test]
fn the_counter_is_measured_against_the_log_and_the_log_costs_bounded_memory() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let (limit, period) = (50u64, 10 * MICROS_PER_SEC);
    // The counter's own run, judged by the exact rule over what it admitted: a
    // request it admitted while the last period already held `limit` admissions
    // is an overshoot; one it denied while there was room is a false denial.
    let (mut total, mut over, mut under, mut worst) = (0usize, 0usize, 0usize, 0u64);
    for seed in 0..4 {
        let trace = bursty_trace(seed, 120);
        let key = unique_key("fg:{err}");
        let mut admitted: Vec<Micros> = vec![];
        for &now in &trace {
            let args = vec![
                now.to_string(),
                "c".into(),
                period.to_string(),
                limit.to_string(),
                "1".into(),
            ];
            let c = eval(&mut conn, &[&key], &args)[0] == 1;
            let in_window = admitted
                .iter()
                .rev()
                .take_while(|t| **t > now - period)
                .count() as u64;
            total += 1;
            over += usize::from(c && in_window >= limit);
            under += usize::from(!c && in_window < limit);
            if c {
                admitted.push(now);
                worst = worst.max(in_window + 1);
            }
        }
    }
    let over_pct = 100.0 * over as f64 / total as f64;
    let under_pct = 100.0 * under as f64 / total as f64;
    println!(
        "sliding counter on bursty traffic ({total} requests, limit {limit} per 10 s): \
         admitted over the exact limit {over} ({over_pct:.2}%), denied with room {under} \
         ({under_pct:.2}%), worst window {worst} = {:.2}× the limit",
        worst as f64 / limit as f64
    );
    assert!(total > 2_000);
    assert!(worst <= 2 * limit, "never above 2× the limit in any period");
    assert!(over_pct < 15.0, "overshoots stay the exception");
    assert!(under_pct < 50.0, "false denials stay a minority");
    // memory of a full log: limit entries
    let key = unique_key("fg:{mem}");
    for n in [100u64, 1_000] {
        let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
        for i in 0..n {
            let now = T0 + i as i64;
            eval(
                &mut conn,
                &[&key],
                &[
                    now.to_string(),
                    "l".into(),
                    (3600 * MICROS_PER_SEC).to_string(),
                    "10000".into(),
                    "1".into(),
                ],
            );
        }
        let bytes: u64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&key)
            .arg("SAMPLES")
            .arg(0)
            .query(&mut conn)
            .unwrap();
        let per = bytes as f64 / n as f64;
        println!("sliding log: {n} entries use {bytes} bytes, {per:.1} B/entry");
        assert!(per < 150.0, "{per} B per entry");
    }
}
