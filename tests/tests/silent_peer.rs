//! A Redis that stops answering without closing anything (behind a TCP proxy
//! that goes silent, `floodgate_tests::silent`): every call reports a timeout
//! within its deadline, the store leaves the frozen connection behind and
//! reconnects when the peer is back. A server that is merely slow keeps its
//! connection.

use std::time::{Duration, Instant};

use floodgate_edge::store::resp::RespStore;
use floodgate_edge::store::{Store, StoreErrorKind};
use floodgate_shared::policy::Quota;
use floodgate_shared::script::Check;
use floodgate_tests::silent::SilentProxy;
use floodgate_tests::{RedisServer, unique_key};

const DEADLINE: Duration = Duration::from_millis(50);
/// Far longer than any call that honours its deadline takes, even on a loaded
/// machine: what waiting without a deadline would look like.
const HANG: Duration = Duration::from_secs(2);

async fn wait_until(limit: Duration, mut ok: impl AsyncFnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if ok().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_peer_times_out_within_the_deadline_and_is_replaced_when_back() {
    let redis = RedisServer::start();
    let proxy = SilentProxy::start(redis.port());
    let store = RespStore::connect(&format!("redis://127.0.0.1:{}/", proxy.port()), DEADLINE)
        .await
        .unwrap();
    let q = Quota::per_minute(1_000).unwrap();
    let key = unique_key("silent");
    let checks = [Check::new(&key, &q, 1)];
    assert!(store.check(&checks, None).await.unwrap().admitted);
    assert_eq!(proxy.accepted(), 1);

    proxy.blackhole();
    // every call ends within its deadline, as a retryable timeout
    let silent_since = Instant::now();
    let mut replaced_after: Option<Duration> = None;
    let mut slowest = Duration::ZERO;
    for _ in 0..15 {
        let started = Instant::now();
        let e = store.check(&checks, None).await.unwrap_err();
        let took = started.elapsed();
        assert!(e.is_retryable(), "{e}");
        assert!(
            matches!(e.kind, StoreErrorKind::Timeout),
            "a silent peer is a timeout: {e}"
        );
        // the call ended at its deadline, not at the peer's whim (how much later
        // than 50 ms it came back is the machine's scheduling, a figure, printed
        // below)
        assert!(
            took < HANG,
            "took {took:?}: waited as if there were no deadline"
        );
        slowest = slowest.max(took);
        if replaced_after.is_none() && proxy.accepted() >= 2 {
            replaced_after = Some(silent_since.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // the frozen connection was given up: the store is opening new ones
    let left = wait_until(Duration::from_secs(5), async || proxy.accepted() >= 2).await;
    assert!(
        left.is_some(),
        "the store kept waiting on its frozen connection"
    );
    let given_up = replaced_after.unwrap_or_else(|| silent_since.elapsed());
    // deadline + silence limit (250 ms) + the next call: well under 2 s
    assert!(given_up < Duration::from_secs(2), "{given_up:?}");

    // the peer is back (for new connections; the frozen one stays dead)
    proxy.restore();
    let back = Instant::now();
    let recovered = wait_until(Duration::from_secs(10), async || {
        store.check(&checks, None).await.is_ok()
    })
    .await;
    let recovered = recovered.expect("the store reconnected once the peer was back");
    eprintln!(
        "silent peer: slowest timed-out call {slowest:?} (deadline {DEADLINE:?}); new connection after {given_up:?} of silence; served again {recovered:?} after the peer came back; {} connections opened",
        proxy.accepted()
    );
    assert!(recovered < Duration::from_secs(3), "{recovered:?}");
    assert!(back.elapsed() < Duration::from_secs(10));
    store.ping().await.unwrap();
}

/// A server that answers late (a long command ahead of ours) is not a silent
/// one: the call times out, the probe gets its answer, the connection stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_server_keeps_its_connection() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let proxy = SilentProxy::start(redis.port());
    let store = RespStore::connect(&format!("redis://127.0.0.1:{}/", proxy.port()), DEADLINE)
        .await
        .unwrap();
    store.ping().await.unwrap();
    // the server is made busy, then pinged: a ping that came first is answered
    // (the sleep had not begun), so the busy spell is tried again until a ping
    // meets it — whatever the machine's scheduling
    let mut timed_out = None;
    for _ in 0..10 {
        let mut c = redis.connection();
        let sleeper = std::thread::spawn(move || {
            let _: () = redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg("0.3")
                .query(&mut c)
                .unwrap();
        });
        std::thread::sleep(Duration::from_millis(20));
        let pinged = store.ping().await;
        sleeper.join().unwrap();
        if let Err(e) = pinged {
            timed_out = Some(e);
            break;
        }
    }
    let e = timed_out.expect("a ping met the busy server");
    assert!(matches!(e.kind, StoreErrorKind::Timeout), "{e}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    store.ping().await.unwrap();
    assert_eq!(proxy.accepted(), 1, "no reconnection for a slow answer");
}
