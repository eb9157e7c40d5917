//! Sentinel with passwords on both sides: the Redis servers require one (the
//! store authenticates to whichever primary Sentinel names) and the Sentinel
//! requires its own (`?sentinel_password=`). The store follows a failover; wrong
//! or missing credentials on either side fail clearly.

use std::time::{Duration, Instant};

use floodgate_edge::store::resp::RespStore;
use floodgate_edge::store::{SetOptions, Store, StoreErrorKind};
use floodgate_tests::{RedisServer, Sentinel};

const DATA_PW: &str = "data-s3cret";
const SENTINEL_PW: &str = "sentinel-s3cret";

fn info(server: &RedisServer, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query(&mut server.connection())
        .unwrap()
}

/// INFO from a server Sentinel may be reconfiguring: Sentinel ends the
/// server's client connections (CLIENT KILL TYPE normal) when it demotes it, so
/// a reset connection is "not yet", not a failure.
fn info_while_reconfigured(server: &RedisServer, section: &str) -> String {
    redis::Client::open(server.url())
        .and_then(|client| client.get_connection())
        .and_then(|mut conn| redis::cmd("INFO").arg(section).query(&mut conn))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_authenticates_to_sentinel_and_to_the_primary_it_names_across_a_failover() {
    let primary = RedisServer::start_with_password(DATA_PW, &[]);
    let port = primary.port().to_string();
    let replica = RedisServer::start_with_password(DATA_PW, &["--replicaof", "127.0.0.1", &port]);
    let started = Instant::now();
    while !info(&replica, "replication").contains("master_link_status:up") {
        assert!(started.elapsed() < Duration::from_secs(10), "never synced");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sentinel = Sentinel::start_with_auth(
        "fgauth",
        primary.port(),
        5_000,
        Some(DATA_PW),
        Some(SENTINEL_PW),
    );
    while sentinel.replicas("fgauth") == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "Sentinel never saw the replica:\n{}",
            sentinel.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let url = |data: &str, own: Option<&str>| {
        format!(
            "redis+sentinel://:{data}@127.0.0.1:{}/fgauth{}",
            sentinel.port(),
            own.map(|p| format!("?sentinel_password={p}"))
                .unwrap_or_default()
        )
    };

    // wrong or missing credentials, on either side
    for (bad, what) in [
        (url(DATA_PW, None), "no Sentinel password"),
        (url(DATA_PW, Some("wrong")), "a wrong Sentinel password"),
        (url("wrong", Some(SENTINEL_PW)), "a wrong data password"),
    ] {
        let e = RespStore::connect(&bad, Duration::from_millis(500))
            .await
            .err()
            .unwrap_or_else(|| panic!("{what} was accepted"));
        assert_eq!(e.kind, StoreErrorKind::Auth, "{what}: {e}");
    }

    let store = RespStore::connect(&url(DATA_PW, Some(SENTINEL_PW)), Duration::from_millis(500))
        .await
        .unwrap();
    assert!(
        store
            .set("fg:before", b"1", SetOptions::default())
            .await
            .unwrap()
    );

    // a failover Sentinel runs (the replica becomes the primary, the old primary
    // its replica): the store's writes reach the new primary
    let mut c = redis::Client::open(format!(
        "redis://:{SENTINEL_PW}@127.0.0.1:{}/",
        sentinel.port()
    ))
    .unwrap()
    .get_connection()
    .unwrap();
    // (until Sentinel has heard from the replica itself, it has no good one)
    loop {
        let asked: redis::RedisResult<()> = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg("fgauth")
            .query(&mut c);
        match asked {
            Ok(()) => break,
            Err(e) => assert!(
                e.to_string().contains("NOGOODSLAVE")
                    && started.elapsed() < Duration::from_secs(30),
                "{e}:\n{}",
                sentinel.log()
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    while sentinel.primary_port("fgauth") != Some(replica.port()) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no failover:\n{}",
            sentinel.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // once the old primary is a replica, the store's connection to it answers
    // READONLY: it is dropped and Sentinel asked again (writes that reached the
    // old primary before its demotion are Redis' own loss in a failover)
    while !info_while_reconfigured(&primary, "replication").contains("role:slave") {
        assert!(started.elapsed() < Duration::from_secs(30), "never demoted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let written = Instant::now();
    loop {
        match store.set("fg:after", b"2", SetOptions::default()).await {
            Ok(true) => break,
            Ok(false) => unreachable!("no condition"),
            Err(e) => {
                assert!(e.is_retryable(), "a failover is passing: {e}");
                assert!(
                    written.elapsed() < Duration::from_secs(15),
                    "the store never reached the new primary: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let v: Option<String> = redis::cmd("GET")
        .arg("fg:after")
        .query(&mut replica.connection())
        .unwrap();
    assert_eq!(v.as_deref(), Some("2"), "written on the promoted replica");
    assert!(info(&replica, "replication").contains("role:master"));
}
