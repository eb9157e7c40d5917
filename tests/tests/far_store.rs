//! A global Redis further away than the RESP deadline's ceiling (100 ms) is far,
//! not down (issue 22): with the native host's default deadlines, a store 60 ms
//! away one way (a 120 ms round trip) answered 503 to every request, its breaker
//! never closing. Its replies, all after the ceiling, now raise the ceiling, and
//! a dead store still never does.

use std::time::Duration;

use floodgate_edge::deadline::DeadlineSettings;
use floodgate_edge::native_host::{HostConfig, NativeStore};
use floodgate_edge::pipeline::{Pipeline, PipelineConfig, store_deadline};
use floodgate_edge::store::resp::RespStore;
use floodgate_tests::scale::LatencyProxy;
use floodgate_tests::upstream::RawUpstream;
use floodgate_tests::{RedisServer, seed, serve_native};

const CONFIG: &str = r#"{"policies":[{"name":"default","dimensions":["api_key"],
    "quota":{"capacity":1000,"refill":1000,"period":"1m"},"failure_mode":"fail_closed"}],
    "plans":{"free":["default"]}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_global_store_is_waited_for_with_default_deadlines() {
    let redis = RedisServer::start();
    let secret = seed(&redis, CONFIG).await.secret;
    let far = LatencyProxy::start(redis.port(), Duration::from_millis(60)).await;
    let deadline = DeadlineSettings::RESP;
    let transport = store_deadline(Duration::from_micros(deadline.ceiling as u64));
    let store = RespStore::connect(&far.url(), transport)
        .await
        .expect("connect");
    let settings = PipelineConfig {
        deadline,
        ..PipelineConfig::default()
    };
    let pipeline = Pipeline::new(
        NativeStore::Resp(store),
        floodgate_shared::time::SystemClock,
        settings,
    );
    let upstream = RawUpstream::start().await;
    let (url, _stop) = serve_native(pipeline, HostConfig::new(&upstream.url)).await;
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut statuses = vec![];
    for _ in 0..30 {
        let r = c
            .get(format!("{url}/far"))
            .bearer_auth(&secret)
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    // the first requests meet a deadline still learning the store; then it is
    // waited for
    assert!(
        statuses[10..].iter().all(|s| *s == 200),
        "statuses: {statuses:?}"
    );
    let health: serde_json::Value = c
        .get(format!("{url}/__floodgate/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ceiling = health["deadlines"]["global"]["ceiling_ms"]
        .as_f64()
        .unwrap();
    assert!(
        ceiling > 120.0,
        "the ceiling rose above the round trip: {health}"
    );
}
