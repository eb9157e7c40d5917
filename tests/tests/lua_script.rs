//! The token-bucket script in a real redis-server: its SHA-1, the NOSCRIPT
//! fallback, corrupt state, the cleanup TTL and bad arguments.

use std::time::Duration;

use floodgate_edge::store::resp::RespStore;
use floodgate_edge::store::{Store, StoreErrorKind};
use floodgate_shared::policy::Quota;
use floodgate_shared::script::{Check, TOKEN_BUCKET};
use floodgate_shared::time::{MICROS_PER_MS, MICROS_PER_SEC};
use floodgate_tests::scale::calls_of as calls;
use floodgate_tests::{RedisServer, unique_key};
use redis::Commands;

const NOW: i64 = 1_764_000_000_000_000;

async fn store(server: &RedisServer) -> RespStore {
    RespStore::connect(&server.url(), Duration::from_secs(5))
        .await
        .unwrap()
}

#[test]
fn script_load_returns_the_embedded_sha1() {
    let server = RedisServer::start();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(TOKEN_BUCKET.source)
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(sha, TOKEN_BUCKET.sha1);
}

#[tokio::test]
async fn evalsha_falls_back_to_eval_within_the_same_call_after_script_flush() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let mut conn = server.connection();
    let q = Quota::per_minute(10).unwrap();
    let key = unique_key("flush");
    let checks = [Check {
        key: &key,
        quota: &q,
        cost: 1,
        shadow: false,
    }];

    // a fresh store has not seen the script answered: its first call goes by
    // source, one EVAL and no NOSCRIPT round trip (issue 38, cold start)
    let v = store.check(&checks, None).await.unwrap();
    assert!(v.admitted);
    assert_eq!(
        (calls(&mut conn, "evalsha"), calls(&mut conn, "eval")),
        (0, 1)
    );
    // now known to be loaded: EVALSHA only
    assert_eq!(
        store.check(&checks, None).await.unwrap().decisions[0].remaining,
        8
    );
    assert_eq!(
        (calls(&mut conn, "evalsha"), calls(&mut conn, "eval")),
        (1, 1)
    );
    // flushed again: the call still succeeds and state was kept
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
    assert_eq!(
        store.check(&checks, None).await.unwrap().decisions[0].remaining,
        7
    );
    assert_eq!(
        (calls(&mut conn, "evalsha"), calls(&mut conn, "eval")),
        (2, 2)
    );
}

/// Unreadable state of every kind is a full bucket, never a script error, and the
/// next admission repairs it.
#[tokio::test]
async fn corrupt_state_is_a_fresh_bucket_and_is_repaired() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let mut conn = server.connection();
    let q = Quota::new(5, 5, 60_000 * MICROS_PER_MS).unwrap();
    let far_future = (NOW + 401 * 86_400_000_000).to_string();
    type Setup = Box<dyn Fn(&mut redis::Connection, &str)>;
    let setups: Vec<(&str, Setup)> = vec![
        (
            "garbage",
            Box::new(|c, k| c.set(k, "not a number").unwrap()),
        ),
        ("empty", Box::new(|c, k| c.set(k, "").unwrap())),
        ("negative", Box::new(|c, k| c.set(k, "-5").unwrap())),
        (
            "float",
            Box::new(|c, k| c.set(k, "1764000000000000.5").unwrap()),
        ),
        ("exponent", Box::new(|c, k| c.set(k, "1e15").unwrap())),
        ("hex", Box::new(|c, k| c.set(k, "0x10").unwrap())),
        (
            "17 digits",
            Box::new(|c, k| c.set(k, "17640000000000000").unwrap()),
        ),
        (
            "binary",
            Box::new(|c, k| c.set(k, &[0xffu8, 0, 1, 2][..]).unwrap()),
        ),
        (
            "far future",
            Box::new(move |c, k| c.set(k, far_future.as_str()).unwrap()),
        ),
        ("hash", Box::new(|c, k| c.hset(k, "tokens", "3").unwrap())),
        ("list", Box::new(|c, k| c.rpush(k, "x").unwrap())),
        ("set", Box::new(|c, k| c.sadd(k, "x").unwrap())),
        ("zset", Box::new(|c, k| c.zadd(k, "x", 1).unwrap())),
        (
            "stream",
            Box::new(|c, k| {
                let _: String = redis::cmd("XADD")
                    .arg(k)
                    .arg("*")
                    .arg("f")
                    .arg("v")
                    .query(c)
                    .unwrap();
            }),
        ),
    ];
    for (what, setup) in setups {
        let key = unique_key(what);
        setup(&mut conn, &key);
        let checks = [Check {
            key: &key,
            quota: &q,
            cost: 2,
            shadow: false,
        }];
        let v = store
            .check(&checks, Some(NOW))
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(v.admitted, "{what}");
        assert_eq!(
            v.decisions[0].remaining, 3,
            "{what}: treated as a full bucket"
        );
        let stored: String = conn.get(&key).unwrap();
        assert_eq!(
            stored,
            (NOW + 2 * 12_000_000).to_string(),
            "{what}: repaired"
        );
    }
    // a denial does not repair (it writes nothing): the hash survives
    let key = unique_key("hash-denied");
    let _: () = conn.hset(&key, "tokens", "3").unwrap();
    let v = store
        .check(
            &[Check {
                key: &key,
                quota: &q,
                cost: 6,
                shadow: false,
            }],
            Some(NOW),
        )
        .await
        .unwrap();
    assert!(!v.admitted);
    let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn).unwrap();
    assert_eq!(kind, "hash");
}

/// A key expires once its bucket is full again: never before (that would mint
/// tokens), at most one second after (idle buckets cost nothing).
#[tokio::test]
async fn idle_buckets_expire_once_full_again() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let mut conn = server.connection();
    // 2 tokens, one every 150 ms: after two requests the bucket is full in 300 ms.
    let q = Quota::new(2, 1, 150 * MICROS_PER_MS).unwrap();
    let key = unique_key("ttl");
    let checks = [Check {
        key: &key,
        quota: &q,
        cost: 1,
        shadow: false,
    }];
    store.check(&checks, None).await.unwrap();
    let v = store.check(&checks, None).await.unwrap();
    let full_at = v.decisions[0].full_at;
    let expires_ms: i64 = redis::cmd("PEXPIRETIME")
        .arg(&key)
        .query(&mut conn)
        .unwrap();
    assert!(
        expires_ms * 1000 >= full_at,
        "expires at {expires_ms} ms, before the bucket is full at {full_at} µs"
    );
    assert!(
        expires_ms * 1000 <= full_at + 1_000_000,
        "lingers more than a second after full"
    );
    assert_eq!(
        redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(&key)
            .query::<String>(&mut conn)
            .unwrap(),
        "int"
    );
    let wait_ms = (expires_ms * 1000 - v.now) / 1000 + 50;
    tokio::time::sleep(Duration::from_millis(wait_ms as u64)).await;
    let exists: bool = conn.exists(&key).unwrap();
    assert!(!exists, "the key outlived its expiry");
    assert_eq!(
        store.check(&checks, None).await.unwrap().decisions[0].remaining,
        1,
        "absent = full"
    );
}

/// Writes within the same second keep the expiry in force (KEEPTTL); every write
/// leaves the key expiring no earlier than its bucket is full, and at most a
/// second later, across many writes that cross second boundaries.
#[tokio::test]
async fn the_expiry_always_covers_the_debt() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let mut conn = server.connection();
    let q = Quota::new(200, 100, MICROS_PER_SEC).unwrap(); // 100/s, burst 200
    let key = unique_key("keepttl");
    let mut admitted = 0;
    for i in 0..400 {
        let cost = 1 + (i % 3);
        let v = store
            .check(
                &[Check {
                    key: &key,
                    quota: &q,
                    cost,
                    shadow: false,
                }],
                None,
            )
            .await
            .unwrap();
        if v.admitted {
            admitted += 1;
            let full_at = v.decisions[0].full_at;
            let expires_ms: i64 = redis::cmd("PEXPIRETIME")
                .arg(&key)
                .query(&mut conn)
                .unwrap();
            assert!(
                expires_ms * 1000 >= full_at,
                "write {i}: expiry {expires_ms} ms < full_at {full_at} µs"
            );
            assert!(
                expires_ms * 1000 < full_at + 1_001_000,
                "write {i}: expiry {expires_ms} ms ≫ full_at {full_at} µs"
            );
        }
        if i % 50 == 49 {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    assert!(admitted > 100, "only {admitted} admitted");
}

/// The script refuses malformed arguments with a clear error (callers never send
/// them: the client validates first); the server keeps serving.
#[test]
fn malformed_arguments_get_a_clear_error() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let eval = |conn: &mut redis::Connection,
                keys: &[&str],
                args: &[&str]|
     -> redis::RedisResult<Vec<i64>> {
        redis::cmd("EVAL")
            .arg(TOKEN_BUCKET.source)
            .arg(keys.len())
            .arg(keys)
            .arg(args)
            .query(conn)
    };
    let cases: &[(&[&str], &[&str])] = &[
        (&[], &[""]),
        (&["k"], &[""]),
        (&["k"], &["", "10"]),
        (&["k"], &["", "10", "1", "extra"]),
        (&["k"], &["soon", "10", "1"]),
        (&["k"], &["-1", "10", "1"]),
        (&["k"], &["1.5", "10", "1"]),
        (&["k"], &["1e300", "10", "1"]),
        (&["k"], &["", "0", "1"]),
        (&["k"], &["", "-10", "1"]),
        (&["k"], &["", "nan", "1"]),
        (&["k"], &["", "inf", "1"]),
        (&["k"], &["", "10", "-1"]),
        (&["k"], &["", "10", "0.5"]),
        (&["k"], &["", "99999999999999999999", "1"]),
    ];
    for (keys, args) in cases {
        let e = eval(&mut conn, keys, args).expect_err(&format!("{keys:?} {args:?}"));
        assert!(
            e.to_string().contains("floodgate"),
            "{keys:?} {args:?}: {e}"
        );
    }
    let exists: bool = conn.exists("k").unwrap();
    assert!(!exists, "a refused call wrote nothing");
    assert_eq!(eval(&mut conn, &["k"], &["", "10", "1"]).unwrap()[0], 1);
}

#[tokio::test]
async fn store_errors_say_whether_retrying_helps() {
    let server = RedisServer::start();
    let url = server.url();
    let store = RespStore::connect(&url, Duration::from_millis(200))
        .await
        .unwrap();
    let q = Quota::per_minute(10).unwrap();
    let key = unique_key("err");
    // a malformed call is refused before any I/O and is not retryable
    let e = store.check(&[], None).await.unwrap_err();
    assert_eq!(e.kind, StoreErrorKind::Protocol);
    assert!(!e.is_retryable());
    // a server that hangs (SIGSTOP) makes the call time out, retryably
    let pid = server.pid().to_string();
    std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap();
    let e = store
        .check(
            &[Check {
                key: &key,
                quota: &q,
                cost: 1,
                shadow: false,
            }],
            None,
        )
        .await
        .unwrap_err();
    std::process::Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap();
    assert_eq!(e.kind, StoreErrorKind::Timeout, "{e}");
    assert!(e.is_retryable());
    // a server that is gone: connect errors are retryable
    drop(server);
    let e = RespStore::connect(&url, Duration::from_millis(200))
        .await
        .err()
        .expect("nothing listens");
    assert_eq!(e.kind, StoreErrorKind::Connect, "{e}");
    assert!(e.is_retryable());
}

#[tokio::test]
async fn a_password_protected_server_reports_auth_errors() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let q = Quota::per_minute(10).unwrap();
    let key = unique_key("auth");
    let checks = [Check {
        key: &key,
        quota: &q,
        cost: 1,
        shadow: false,
    }];
    let url = format!("redis://:wrong@127.0.0.1:{}/", server.port());
    let e = RespStore::connect(&url, Duration::from_secs(2))
        .await
        .err()
        .expect("wrong password");
    assert_eq!(e.kind, StoreErrorKind::Auth, "{e}");
    assert!(!e.is_retryable());
    let good = RespStore::connect(
        &format!("redis://:s3cret@127.0.0.1:{}/", server.port()),
        Duration::from_secs(2),
    )
    .await
    .unwrap();
    assert!(good.check(&checks, None).await.unwrap().admitted);
}
