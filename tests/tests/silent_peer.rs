//! A Redis that stops answering without closing anything (behind a TCP proxy
//! that goes silent, `floodgate_tests::silent`): every call reports a timeout
//! within its deadline, the store leaves the frozen connection behind and
//! reconnects when the peer is back. A server that is merely slow keeps its
//! connection.

use std::time::{Duration, Instant};

use floodgate_edge::store::resp::RespStore;
use floodgate_edge::store::{Store, StoreErrorKind, StoreOptions};
use floodgate_shared::policy::Quota;
use floodgate_shared::script::Check;
use floodgate_tests::silent::SilentProxy;
use floodgate_tests::{RedisServer, unique_key};

const DEADLINE: Duration = Duration::from_millis(50);
/// Far longer than any call that honours its deadline takes, even on a loaded
/// machine: what waiting without a deadline would look like.
const HANG: Duration = Duration::from_secs(2);
/// The slow server's silence limit: over three times its busy spell (0.3 s). At
/// the default (250 ms) the probe sent after a ping's 50 ms timeout waited up to
/// 250 ms less the gap between the spell's start and the ping: no margin at all.
const SLOW_SILENCE: Duration = Duration::from_secs(1);

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
    // timed out (50 ms), probed (the silence limit, 250 ms), given up and
    // replaced before the next call: within the 15 silent calls, which wait out
    // at least 15 deadlines and 15 pauses (over 1 s of timers, four times the
    // deadline and the silence limit together), however slow the machine
    let given_up =
        replaced_after.expect("the frozen connection was replaced while the peer was silent");

    // the peer is back (for new connections; the frozen one stays dead)
    proxy.restore();
    let back = Instant::now();
    let mut attempts = 0;
    let recovered = wait_until(Duration::from_secs(10), async || {
        attempts += 1;
        store.check(&checks, None).await.is_ok()
    })
    .await;
    let recovered = recovered.expect("the store reconnected once the peer was back");
    eprintln!(
        "silent peer: slowest timed-out call {slowest:?} (deadline {DEADLINE:?}); new connection after {given_up:?} of silence; served again {recovered:?} after the peer came back (call {attempts}); {} connections opened",
        proxy.accepted()
    );
    // a connection opened while the peer was silent is frozen too: at worst one
    // more round of timeout (a call), probe (the silence limit, over three more
    // calls' deadlines and pauses) and a new connection, so the store serves again
    // within a bounded number of calls — counted, not timed: ten
    assert!(
        attempts <= 10,
        "served again only at call {attempts} after the peer came back ({recovered:?})"
    );
    assert!(back.elapsed() < Duration::from_secs(10));
    store.ping().await.unwrap();
}

/// A server that answers late (a long command ahead of ours) is not a silent
/// one: the call times out, the probe gets its answer, the connection stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_server_keeps_its_connection() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let proxy = SilentProxy::start(redis.port());
    // a silence limit far longer than the busy spell: the probe after the timeout
    // gets its answer with time to spare, however loaded the machine
    let options = StoreOptions {
        silence: Some(SLOW_SILENCE),
        ..StoreOptions::new(format!("redis://127.0.0.1:{}/", proxy.port()), DEADLINE)
    };
    let store = RespStore::connect_with(&options).await.unwrap();
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
    // past the silence limit, the probe's fate is sealed: answered, so the
    // connection stays
    tokio::time::sleep(SLOW_SILENCE + Duration::from_millis(100)).await;
    store.ping().await.unwrap();
    assert_eq!(proxy.accepted(), 1, "no reconnection for a slow answer");
}
