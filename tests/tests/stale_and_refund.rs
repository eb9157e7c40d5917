//! The two script features that let a refused request cost no quota, on a real
//! redis-server: a call Redis runs after the instant its caller stopped waiting
//! changes nothing (`When::RedisUntil`), and a refund gives back exactly what an
//! admitted call consumed, for every algorithm, whatever was consumed since.

use std::time::Duration;

use floodgate_edge::store::resp::RespStore;
use floodgate_edge::store::{Store, StoreErrorKind};
use floodgate_shared::policy::{Algorithm, Quota};
use floodgate_shared::script::{Check, REFUND, When};
use floodgate_tests::{RedisServer, unique_key};

async fn store(server: &RedisServer) -> RespStore {
    RespStore::connect(&server.url(), Duration::from_secs(5))
        .await
        .unwrap()
}

/// Redis' clock, in µs.
fn redis_now(server: &RedisServer) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(&mut server.connection()).unwrap();
    s * 1_000_000 + us
}

/// A quota of `capacity` per hour with the given algorithm (no refill while a test
/// runs, so every remaining count is exact).
fn hourly(algorithm: Algorithm, capacity: u64) -> Quota {
    Quota::new(capacity, capacity, 3_600_000_000)
        .unwrap()
        .with_algorithm(algorithm)
        .unwrap()
}

const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingLog,
    Algorithm::SlidingCounter,
];

#[tokio::test]
async fn a_call_redis_runs_after_its_deadline_changes_nothing() {
    let server = RedisServer::start();
    let store = store(&server).await;
    for algorithm in ALGORITHMS {
        let q = hourly(algorithm, 5);
        let key = unique_key(algorithm.name());
        let checks = [Check::new(&key, &q, 1)];
        let past = redis_now(&server) - 1;
        let e = store
            .check(&checks, When::RedisUntil(past))
            .await
            .expect_err("too late");
        assert_eq!(e.kind, StoreErrorKind::Stale, "{algorithm:?}: {e}");
        let exists: bool = redis::cmd("EXISTS")
            .arg(&key)
            .query(&mut server.connection())
            .unwrap();
        assert!(!exists, "{algorithm:?}: a stale call wrote nothing");
        let future = redis_now(&server) + 5_000_000;
        let v = store
            .check(&checks, When::RedisUntil(future))
            .await
            .unwrap();
        assert!(v.admitted);
        assert_eq!(v.decisions[0].remaining, 4, "{algorithm:?}");
    }
    // the in-flight script too
    let slots = unique_key("slots");
    let past = redis_now(&server) - 1;
    let e = store
        .acquire_slot(&slots, "a", 2, 1_000, Some(past))
        .await
        .expect_err("too late");
    assert_eq!(e.kind, StoreErrorKind::Stale);
    let held: u64 = redis::cmd("ZCARD")
        .arg(&slots)
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(held, 0);
    let future = redis_now(&server) + 5_000_000;
    assert!(
        store
            .acquire_slot(&slots, "a", 2, 1_000, Some(future))
            .await
            .unwrap()
    );
}

/// Remaining tokens of one bucket, by a peek (cost 0).
async fn remaining(store: &RespStore, key: &str, q: &Quota) -> u64 {
    let v = store.check(&[Check::new(key, q, 0)], None).await.unwrap();
    v.decisions[0].remaining
}

#[tokio::test]
async fn a_refund_gives_back_exactly_what_an_admission_took_for_every_algorithm() {
    let server = RedisServer::start();
    let store = store(&server).await;
    for algorithm in ALGORITHMS {
        for cost in [1u32, 3] {
            let q = hourly(algorithm, 10);
            let (a, b) = (unique_key("a"), unique_key("b"));
            let first = [Check::new(&a, &q, cost), Check::new(&b, &q, 1)];
            let refunded = store.check(&first, None).await.unwrap();
            assert!(refunded.admitted);
            // other requests consume meanwhile: refunds commute with them
            let other = store.check(&[Check::new(&a, &q, 2)], None).await.unwrap();
            assert!(other.admitted);
            assert_eq!(remaining(&store, &a, &q).await, 10 - u64::from(cost) - 2);
            store
                .refund(&first, None, &refunded.clone().into())
                .await
                .unwrap();
            assert_eq!(
                remaining(&store, &a, &q).await,
                8,
                "{algorithm:?} cost {cost}: only the other request's 2 remain taken"
            );
            assert_eq!(remaining(&store, &b, &q).await, 10, "{algorithm:?}");
        }
    }
}

#[tokio::test]
async fn a_refund_of_a_full_bucket_or_a_denial_mints_nothing() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let q = hourly(Algorithm::TokenBucket, 3);
    let key = unique_key("full");
    let checks = [Check::new(&key, &q, 1)];
    let admitted = store.check(&checks, None).await.unwrap();
    // the key expired (or was deleted) meanwhile: nothing to give back
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query(&mut server.connection())
        .unwrap();
    store
        .refund(&checks, None, &admitted.clone().into())
        .await
        .unwrap();
    assert_eq!(remaining(&store, &key, &q).await, 3);
    // a denied verdict consumed nothing and refunds nothing
    for _ in 0..3 {
        store.check(&checks, None).await.unwrap();
    }
    let denied = store.check(&checks, None).await.unwrap();
    assert!(!denied.admitted);
    store
        .refund(&checks, None, &denied.clone().into())
        .await
        .unwrap();
    assert_eq!(remaining(&store, &key, &q).await, 0);
}

#[test]
fn malformed_refunds_get_a_clear_error_and_foreign_values_are_left_alone() {
    let server = RedisServer::start();
    let mut c = server.connection();
    let eval = |c: &mut redis::Connection, keys: &[&str], args: &[&str]| {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(REFUND.source).arg(keys.len()).arg(keys).arg(args);
        cmd.query::<Vec<i64>>(c)
    };
    for (keys, args) in [
        (&["k"][..], &["1"][..]),
        (&["k"], &["x", "t", "1", "0", "0"]),
        (&["k"], &["1", "z", "1", "0", "0"]),
        (&["k"], &["1", "t", "-5", "0", "0"]),
        (&["k"], &["1", "f", "0", "1", "0"]),
    ] {
        let e = eval(&mut c, keys, args).expect_err("refused");
        assert!(e.to_string().contains("floodgate:"), "{args:?}: {e}");
    }
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("not a bucket")
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("h")
        .arg("tokens")
        .arg("5")
        .query(&mut c)
        .unwrap();
    assert_eq!(
        eval(
            &mut c,
            &["k", "h"],
            &["1", "t", "60", "0", "0", "f", "60", "1", "0"]
        )
        .unwrap(),
        [0]
    );
    let v: String = redis::cmd("GET").arg("k").query(&mut c).unwrap();
    assert_eq!(v, "not a bucket");
}

/// Issue 39, smell 6: a refund never gives back the refill a bucket would have
/// wasted. A call consumes a full bucket's one token (a token every 2 s); the
/// bucket refills; another call consumes it again; then the first call is
/// refunded. Without the first call the bucket would have been full (wasting
/// its refill) until the second, which would still have taken the token: the
/// refund owes nothing. (Before: it moved full_at back by a whole token and
/// deleted the bucket — two admissions for the one token the bucket held.)
#[tokio::test]
async fn a_refund_never_gives_back_refill_the_bucket_would_have_wasted() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let q = Quota::new(1, 1, 2_000_000).unwrap();
    let key = unique_key("wasted");
    let checks = [Check::new(&key, &q, 1)];
    let refunded = store.check(&checks, None).await.unwrap();
    assert!(refunded.admitted);
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    let second = store.check(&checks, None).await.unwrap();
    assert!(second.admitted, "refilled after 2 s");
    store
        .refund(&checks, None, &refunded.clone().into())
        .await
        .unwrap();
    assert_eq!(
        remaining(&store, &key, &q).await,
        0,
        "the second call's token stays taken"
    );
}
