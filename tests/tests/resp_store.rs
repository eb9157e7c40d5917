//! The native RESP store's connection: pipelining under concurrency, reconnecting
//! after the server restarts, database selection and unix sockets.

use std::sync::Arc;
use std::time::Duration;

use floodgate_edge::store::resp::RespStore;
use floodgate_edge::store::{Store, StoreErrorKind, Value};
use floodgate_shared::policy::Quota;
use floodgate_shared::script::Check;
use floodgate_tests::{RedisServer, unique_key};

/// 300 concurrent calls on one connection each get their own reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_share_one_connection_and_get_their_own_replies() {
    let server = RedisServer::start();
    let store = RespStore::connect(&server.url(), Duration::from_secs(5))
        .await
        .unwrap();
    let q = Arc::new(Quota::per_minute(10).unwrap());
    let mut tasks = vec![];
    for i in 0..300u32 {
        let (store, q) = (store.clone(), q.clone());
        tasks.push(tokio::spawn(async move {
            let key = unique_key("pipe");
            let cost = 1 + i % 5;
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
            (cost, v.decisions[0].remaining)
        }));
    }
    for t in tasks {
        let (cost, remaining) = t.await.unwrap();
        assert_eq!(remaining, 10 - u64::from(cost));
    }
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(
        clients.lines().count(),
        2,
        "one store connection plus this one:\n{clients}"
    );
}

/// When the server goes away, calls fail fast as retryable; once it is back, the
/// store reconnects by itself.
#[tokio::test]
async fn the_store_reconnects_after_a_server_restart() {
    let server = RedisServer::start();
    let port = server.port();
    let store = RespStore::connect(&server.url(), Duration::from_millis(500))
        .await
        .unwrap();
    let q = Quota::per_minute(10).unwrap();
    let key = unique_key("restart");
    let checks = [Check {
        key: &key,
        quota: &q,
        cost: 1,
        shadow: false,
    }];
    assert!(store.check(&checks, None).await.unwrap().admitted);
    drop(server);
    let e = store.check(&checks, None).await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    let e = store.check(&checks, None).await.unwrap_err();
    assert_eq!(e.kind, StoreErrorKind::Connect, "{e}");
    let _server = RedisServer::start_on(port, &[]);
    let v = store.check(&checks, None).await.unwrap();
    assert!(v.admitted);
    assert_eq!(
        v.decisions[0].remaining, 9,
        "a fresh server has a fresh bucket"
    );
}

/// A server restarted while the store had nothing to ask it: the first call
/// after finds the old connection closed, opens another and is answered — not
/// failed (issue 41 item 4: the REST endpoint's first calls after such a
/// restart were refused, and the Worker behind it answered 503s).
#[tokio::test]
async fn a_connection_closed_while_idle_is_replaced_within_the_first_call() {
    let mut server = RedisServer::start();
    let store = RespStore::connect(&server.url(), Duration::from_millis(500))
        .await
        .unwrap();
    store.ping().await.unwrap();
    server.signal("KILL");
    server.restart();
    // the client's connection closes while it is idle
    tokio::time::sleep(Duration::from_millis(200)).await;
    store
        .ping()
        .await
        .expect("the first call after the restart");
    let q = Quota::per_minute(10).unwrap();
    let key = unique_key("idle-restart");
    let checks = [Check::new(&key, &q, 1)];
    assert!(store.check(&checks, None).await.unwrap().admitted);
}

#[tokio::test]
async fn the_url_selects_the_database() {
    let server = RedisServer::start();
    let store = RespStore::connect(&format!("{}5", server.url()), Duration::from_secs(2))
        .await
        .unwrap();
    let reply = store.command(&[b"SET", b"where", b"db5"]).await.unwrap();
    assert_eq!(reply, Value::Status("OK".into()));
    let mut conn = server.connection();
    let _: () = redis::cmd("SELECT").arg(5).query(&mut conn).unwrap();
    let v: String = redis::cmd("GET").arg("where").query(&mut conn).unwrap();
    assert_eq!(v, "db5");
    for bad in [
        "http://127.0.0.1:1/",
        "redis://",
        "not a url",
        "rediss://127.0.0.1:1/",
    ] {
        let e = RespStore::connect(bad, Duration::from_millis(200))
            .await
            .err()
            .expect(bad);
        assert!(
            matches!(e.kind, StoreErrorKind::Protocol | StoreErrorKind::Connect),
            "{bad}: {e}"
        );
    }
}

#[tokio::test]
async fn a_unix_socket_works_like_tcp() {
    let dir = tempdir();
    let socket = dir.join("redis.sock");
    let _server = RedisServer::start_with(&["--unixsocket", socket.to_str().unwrap()]);
    let store = RespStore::connect(
        &format!("redis+unix://{}", socket.display()),
        Duration::from_secs(2),
    )
    .await
    .unwrap();
    let q = Quota::per_minute(3).unwrap();
    let v = store
        .check(
            &[Check {
                key: "fg:{k:unix}:p",
                quota: &q,
                cost: 1,
                shadow: false,
            }],
            None,
        )
        .await
        .unwrap();
    assert_eq!(v.decisions[0].remaining, 2);
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("floodgate-unix-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
